"""One seeded trial: a short scenario of a few workers, a draw of faults, and the oracles after every step.

Everything a trial does follows from its seed (`random.Random(seed)`), in virtual time, on one
thread: the same seed replays the same run, step for step. A step is one scheduled callback; the
state changes only through API writes and kernel events, and the oracles look at each of those
as it happens (so "after every step" costs one check per change, not a scan per step), plus the
liveness oracle once the tail has run.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

from sim import kernel
from sim.apiserver import Key, Server, released, retired
from sim.clock import dt
from sim.components import LEASE_SECONDS, Human, SimAgent, SimOperator, Worker
from sim.loop import ROOT, SimLoop
from sim.prod import Evidence, Policy, Verdict, memo, model

#: Every fault a trial may draw; `Trial.faults` is the list a seed drew (empty: none).
FAULTS = (
    "agent_crash",
    "agent_partition",
    "agent_confined",
    "agent_clock_skew",
    "operator_crash",
    "operator_clock_skew",
    "two_operators",
    "boot_change",
    "worker_clock_skew",
    "worker_time_namespace",
    "api_lag",
    "watch_compaction",
    "grant_revoked",
    "human_apply",
    "bystander_write",
    "proc_read_errors",
    "pidfd_exhausted",
    "sieve_crash_after_write",
    "sieve_time_travel",
    "sieve_unobserved",
    "agent_unprivileged",
)
#: The wait status of a process killed by SIGTERM: a stop honoured, a clean exit.
CLEAN_SIGTERM = 15
#: Worker fates (what happens to the process), drawn per worker.
FATES = ("kill", "zombie", "goodbye", "pthread_exit", "live", "pid_reuse", "kill_unreaped", "restart")
#: The notifications a time-travel fault can be anchored at (Sieve's stale-state pattern is
#: every (notification, destructive write) pair; the destructive write here is the retirement).
NOTIFICATIONS = (
    "created",
    "attested-alive",
    "attested-dead",
    "attested-other",
    "conditions",
    "released",
    "heartbeat",
    "retired",
)

SAFETY = (
    "live_retired",
    "live_attested_dead",
    "double_retired",
    "released_retired",
    "bad_provenance",
    "stale_view",
    "wrong_reason",
    "admission_refused",
)
COUNTERS = (*SAFETY, "dead_left_active")

FAULT_END = 25.0
"""Every fault heals by then; deaths happen before it."""
TAIL = 60.0
"""The liveness bound: after FAULT_END, every dead worker with a healthy agent is terminal by FAULT_END + TAIL."""


@dataclasses.dataclass
class Violation:
    counter: str
    detail: str
    at: float


class Trial:
    def __init__(self, seed: int, *, faults: tuple[str, ...] | None = None, trace: bool = False) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.loop = SimLoop()
        self.trace: list[str] | None = [] if trace else None
        self.stats: Counter[str] = Counter()
        self.violations: list[Violation] = []
        self.server = Server(at=self.at, clock=lambda: self.now)
        self.server.on_write = self._on_write
        self.policy = Policy()
        self.base_latency = 0.01 + self.rng.random() * 0.05
        self.lag_until = 0.0
        self.partitions: dict[str, tuple[float, float]] = {}
        self.rel_skew_exempt: set[str] = set()
        self.attested_by: dict[Key, list[tuple[Any, str]]] = {}
        """Per registration, every attestation written into it and by whom, in order."""
        self.labels: dict[int, str] = {}
        self.retired_seen: dict[Key, Any] = {}
        self.travel: tuple[SimOperator | SimAgent, str, float] | None = None
        self._draw(faults)

    # --- the scheduler -------------------------------------------------------------------------

    @property
    def now(self) -> float:
        """True virtual time (seconds since the trial's start): the loop's clock."""
        return self.loop._now

    @property
    def steps(self) -> int:
        return self.loop.steps

    def at(self, when: float, fn: Callable[[], None]) -> None:
        """Calls `fn` at `when`, as the trial's own step (no component's life ends it)."""
        self.loop.call_at(when, fn, context=ROOT)

    def run(self, until: float) -> None:
        self.loop.run_until(until)
        if self.loop.errors:
            error = self.loop.errors[0]
            raise RuntimeError(f"seed {self.seed}: {error.get('message')}") from error.get("exception")

    def latency(self) -> float:
        extra = self.rng.random() * 2.0 if self.now < self.lag_until else 0.0
        return self.base_latency * (0.5 + self.rng.random()) + extra

    def partitioned(self, component: Any) -> bool:
        window = self.partitions.get(getattr(component, "identity", ""))
        return window is not None and window[0] <= self.now < window[1]

    def log(self, text: str) -> None:
        if self.trace is not None:
            self.trace.append(f"{self.now:9.3f} {text}")

    # --- the draw ------------------------------------------------------------------------------

    def _draw(self, faults: tuple[str, ...] | None) -> None:
        rng = self.rng
        if faults is None:
            count = rng.choice((0, 1, 1, 2, 2, 3))
            faults = tuple(sorted(set(rng.sample(FAULTS, count))))
        self.faults = faults
        for fault in faults:
            self.stats[f"fault:{fault}"] += 1
        self.nodes = [kernel.SimNode(name=f"n{i}", rng=rng, now=0.0) for i in range(rng.choice((1, 1, 2)))]
        for node in self.nodes:
            node.exit_info = rng.random() < 0.8
        self.agents = {node.name: SimAgent(self, node, lag=0.01 + rng.random() ** 2 * 1.5) for node in self.nodes}
        operators = 2 if "two_operators" in faults else 1
        self.operators = [
            SimOperator(self, "operator" if i == 0 else f"operator{i + 1}", lag=0.01 + rng.random() ** 2 * 1.5)
            for i in range(operators)
        ]
        self.workers: list[Worker] = []
        self.by_name: dict[str, Worker] = {}
        for i in range(rng.choice((1, 1, 2, 2, 3))):
            node = rng.choice(self.nodes)
            container = None if rng.random() < 0.5 else rng.choice(("c0", "c1"))
            heartbeat = (10, 30) if rng.random() < 0.25 else None
            worker = Worker(self, node, f"w{i}", container=container, heartbeat=heartbeat)
            worker.fate = rng.choice(FATES)
            self.stats[f"fate:{worker.fate}"] += 1
            self.workers.append(worker)
            self.by_name[worker.name] = worker

    # --- setup and faults -----------------------------------------------------------------------

    def setup(self) -> None:
        rng = self.rng
        faults = self.faults
        for agent in self.agents.values():
            if "agent_confined" in faults and agent is self._pick_agent():
                agent.confined = True
            agent.unprivileged = "agent_unprivileged" in faults
            self.at(rng.random() * 0.5, agent.start)
        for op in self.operators:
            self.at(rng.random() * 2.0, op.start)
        if "watch_compaction" in faults:
            self.at(5.0, self._compact)
        for worker in self.workers:
            worker.records_inode = "agent_unprivileged" in faults
            start = 0.2 + rng.random() * 3.0
            self.at(start, worker.start)
            fate = worker.fate
            if fate != "live":
                self.at(start + 0.3 + rng.random() * 15.0, lambda w=worker: self._die(w))
        for fault in faults:
            getattr(self, f"_fault_{fault}")()

    def _pick_agent(self) -> SimAgent:
        if not hasattr(self, "_target"):
            self._target = self.rng.choice(list(self.agents.values()))
        return self._target

    def _window(self, low: float = 1.0, high: float = 18.0, *, longest: float = 10.0) -> tuple[float, float]:
        start = low + self.rng.random() * (high - low)
        return start, min(FAULT_END, start + 0.5 + self.rng.random() * longest)

    def _fault_agent_crash(self) -> None:
        agent = self._pick_agent()
        start, end = self._window()
        self.at(start, agent.crash)
        self.at(end, lambda: agent.up or agent.start())

    def _fault_agent_partition(self) -> None:
        agent = self._pick_agent()
        self.partitions[agent.identity] = self._window(longest=20.0)

    def _fault_agent_confined(self) -> None:
        pass  # set at setup: the agent of one node runs in a child pid namespace for the whole trial

    def _fault_agent_unprivileged(self) -> None:
        pass  # set at setup: every agent without ptrace access, every launcher recording pidfd inodes

    def _fault_agent_clock_skew(self) -> None:
        self._pick_agent().skew = self.rng.uniform(-25.0, 25.0)

    def _fault_operator_clock_skew(self) -> None:
        self.rng.choice(self.operators).skew = self.rng.uniform(-25.0, 25.0)

    def _fault_worker_clock_skew(self) -> None:
        self.rng.choice(self.workers).skew = self.rng.uniform(-30.0, 30.0)

    def _fault_worker_time_namespace(self) -> None:
        # One worker's launcher reads start times on another clock (a time namespace with a boottime
        # offset): its record never matches what the agent reads, so it reads Reused while it lives.
        worker = self.rng.choice(self.workers)
        worker.container = worker.container or "c0"
        worker.clock_offset = -(1 + self.rng.randrange(200))

    def _fault_operator_crash(self) -> None:
        op = self.rng.choice(self.operators)
        start, end = self._window()
        self.at(start, op.crash)
        self.at(end, lambda: op.up or op.start())

    def _fault_two_operators(self) -> None:
        pass  # drawn at _draw: a second operator with its own identity, both reconciling

    def _fault_boot_change(self) -> None:
        agent = self._pick_agent()
        start = 2.0 + self.rng.random() * 16.0

        def reboot() -> None:
            agent.crash()
            agent.node.boot(self.now)
            self.stats["reboots"] += 1
            self.at(self.now + 1.0 + self.rng.random() * 6.0, lambda: agent.up or agent.start())

        self.at(start, reboot)

    def _fault_api_lag(self) -> None:
        start, end = self._window(longest=15.0)
        self.at(start, lambda: setattr(self, "lag_until", end))
        for component in [*self.agents.values(), *self.operators]:
            if self.rng.random() < 0.5:
                component.lag = 0.5 + self.rng.random() * 4.0

    def _fault_watch_compaction(self) -> None:
        self.compact_keep = 2 + self.rng.randrange(8)
        start, end = self._window()

        def disconnect() -> None:
            watchers = [w for w in self.server.watchers if w.connected]
            if not watchers:
                return
            victim = self.rng.choice(watchers)
            victim.connected = False
            self.stats["watch_disconnects"] += 1

            def reconnect() -> None:
                if victim in self.server.watchers:
                    victim.connected = True
                    victim.deliver()

            self.at(end, reconnect)

        self.at(start, disconnect)

    def _fault_grant_revoked(self) -> None:
        start, end = self._window()
        self.at(start, lambda: setattr(self.server, "grant", False))
        self.at(end, lambda: setattr(self.server, "grant", True))

    def _fault_human_apply(self) -> None:
        human = Human(self)
        for _ in range(1 + self.rng.randrange(3)):
            self.at(2.0 + self.rng.random() * 30.0, human.apply)

    def _fault_bystander_write(self) -> None:
        # The stale view no watch delay is needed for: the object moves between the decision and
        # the compare-and-swap. Anchored at the retirement's Lease fence (a read sent after the
        # decision and answered before the write), so it lands inside that window whatever the
        # order of the other requests on the way.
        left = 1 + self.rng.randrange(2)

        def annotate(namespace: str) -> None:
            nonlocal left
            if left <= 0:
                return
            left -= 1
            for key, body in list(self.server.objects.items()):
                if key[0] == "wreg" and key[1] == namespace and not (retired(body) or released(body)):
                    self.stats["bystander_writes"] += 1
                    self.server.annotate("bystander", *key, {"example.com/touched": f"{self.now:.3f}"})

        self.server.on_fence = annotate

    def _fault_proc_read_errors(self) -> None:
        agent = self._pick_agent()
        agent.flake = 0.05 + self.rng.random() * 0.3
        start, end = self._window()
        self.flaky_window = (start, end)

    def _fault_pidfd_exhausted(self) -> None:
        self._pick_agent().max_pinned = self.rng.choice((0, 1))

    def _fault_sieve_crash_after_write(self) -> None:
        component = self.rng.choice([*self.operators, *self.agents.values()])
        component.crash_after_write = 1 + self.rng.randrange(6)
        kind = "operator" if isinstance(component, SimOperator) else "agent"
        self.stats[f"sieve:crash_after_write:{kind}:{component.crash_after_write}"] += 1

    def sieve_crash(self, component: SimAgent | SimOperator) -> None:
        """Sieve's intermediate state: the component dies right after the write it just made."""
        self.stats["sieve_crashes"] += 1
        component.crash()
        self.at(self.now + 0.2 + self.rng.random() * 5.0, lambda: component.up or component.start())

    def _fault_sieve_time_travel(self) -> None:
        # The destructive write each component may make on the stale view: the operator's (or a
        # second operator's) retirement, the agent's overwrite of an attestation.
        op = self.rng.choice([*self.operators, *self.agents.values()])
        label = self.rng.choice(NOTIFICATIONS)
        duration = 1.0 + self.rng.random() * 12.0
        self.travel = (op, label, duration)

    def time_travel(self, rv: int) -> None:
        """Sieve's stale state: restart the component on a replica that is behind notification `rv`."""
        if self.travel is None:
            return
        op, label, duration = self.travel
        self.travel = None
        write = "retirement" if isinstance(op, SimOperator) else "attestation"
        self.stats[f"sieve:time_travel:{label}:{write}"] += 1
        op.crash()
        op.start(cap=rv - 1)
        epoch = op.epoch

        def catch_up() -> None:
            if op.epoch != epoch:
                return
            for watch in op.watches:
                watch.cap = None
                watch.deliver()

        self.at(self.now + duration, catch_up)

    def _fault_sieve_unobserved(self) -> None:
        worker = self.rng.choice(self.workers)
        count = 1 + self.rng.randrange(3)
        start, end = self._window(longest=15.0)

        def arm() -> None:
            owners = [*self.operators, self.agents[worker.node.name]]
            owner = self.rng.choice(owners)
            watch = (owner.watches[0] if owner.watches else None) if isinstance(owner, SimOperator) else owner.watch
            if watch is None or not watch.connected:
                return
            watch.withhold[(worker.namespace, worker.name)] = count
            self.stats[f"sieve:unobserved:{'operator' if isinstance(owner, SimOperator) else 'agent'}:{count}"] += 1
            self.at(end, watch.release_withheld)

        self.at(start, arm)

    def _compact(self) -> None:
        keep = getattr(self, "compact_keep", 10000)
        self.server.compact(keep)
        self.at(self.now + 5.0, self._compact)

    # --- the workers' lives -----------------------------------------------------------------------

    def _die(self, worker: Worker) -> None:
        proc, node = worker.proc, worker.node
        if proc is None or not proc.alive or node.boot_id != worker.boot_id:
            return
        fate = worker.fate
        if fate == "pthread_exit":
            proc.leader_exited = True
            proc.threads = 2 + self.rng.randrange(3)
            # The other threads run on; the whole group exits later, or never within the trial.
            if self.rng.random() < 0.7:
                self.at(self.now + 1.0 + self.rng.random() * 10.0, lambda: self._exit(worker, reap=True))
            return
        if fate == "zombie":
            self._exit(worker, reap=False)
            if self.rng.random() < 0.6:
                self.at(self.now + self.rng.random() * 15.0, lambda: self._reap(worker))
            return
        if fate == "kill_unreaped":
            self._exit(worker, reap=False)
            self.at(self.now + 0.001 + self.rng.random() * 0.05, lambda: self._reap(worker))
            return
        if fate == "restart":
            self._restart(worker)
            return
        if fate == "goodbye":
            # A clean exit (0, or the SIGTERM of a stop honoured) and its launcher's goodbye.
            self._exit(worker, reap=True, status=self.rng.choice((0, CLEAN_SIGTERM)))
            self.at(self.now + self.latency(), worker.goodbye)
            return
        # A kill, most often; sometimes a clean exit whose launcher is gone and never says goodbye.
        self._exit(worker, reap=True, status=0 if self.rng.random() < 0.2 else kernel.SIGKILLED)
        if fate == "pid_reuse":
            self._reuse(worker)

    def _exit(self, worker: Worker, *, reap: bool, status: int = kernel.SIGKILLED) -> None:
        proc = worker.proc
        if proc is None or proc.exited or worker.node.boot_id != worker.boot_id:
            return
        self._ended(worker.node, worker.node.exit(proc, reap=reap, status=status))
        self.log(f"exit {worker.name} pid {proc.host_pid} reap={reap}")

    def _ended(self, node: kernel.SimNode, procs: list[kernel.SimProcess]) -> None:
        for proc in procs:
            for worker in self.workers:
                if worker.proc is proc:
                    worker.died_at = self.now
            self._kernel_event(node, proc)

    def _restart(self, worker: Worker) -> None:
        """The worker's container ends (its pid 1, and so every process in its pid namespace) and is
        started again at once, most often while the node's agent is away (an agent upgrade): a new
        namespace, usually under the freed inode number, with a new incarnation of the worker at the
        same pid in it, registered anew."""
        proc, node = worker.proc, worker.node
        assert proc is not None
        agent = self.agents[node.name]
        if agent.up and self.rng.random() < 0.7:
            agent.crash()
            self.at(self.now + 1.0 + self.rng.random() * 6.0, lambda: agent.up or agent.start())
        self.stats["container_restarts"] += 1
        if worker.container is None:
            self._exit(worker, reap=True)
        else:
            init = node.namespaces.get(proc.ns)
            self._ended(node, node.exit(init if init is not None and init.alive else proc, reap=True))
        again = Worker(self, node, f"{worker.name}r", container=worker.container, heartbeat=worker.heartbeat)
        again.records_inode = worker.records_inode
        again.fate = "live"
        self.workers.append(again)
        self.by_name[again.name] = again

        def start() -> None:
            if node.boot_id != worker.boot_id or again.container is None:
                again.start()
                return
            ns = node.container(again.container, now=self.now)
            again.start(force_ns_pid=proc.ns_pid if node.find(ns=ns, ns_pid=proc.ns_pid) is None else None)

        self.at(self.now + 0.05 + self.rng.random() * 0.5, start)

    def _reap(self, worker: Worker) -> None:
        proc = worker.proc
        if proc is None or proc.reaped or worker.node.boot_id != worker.boot_id:
            return
        worker.node.reap(proc)
        self._kernel_event(worker.node, proc)

    def _reuse(self, worker: Worker) -> None:
        """The dead worker's number is taken at once by another process (ns_last_pid)."""
        proc, node = worker.proc, worker.node
        assert proc is not None
        self.stats["pid_reuses"] += 1
        holder = node.spawn(
            now=self.now + 0.02,
            ns=proc.ns,
            ns_pid=proc.ns_pid,
            host_pid=proc.host_pid if proc.ns == kernel.ROOT_NS else None,
        )
        holder.comm = "reuser"
        worker.reuser = holder
        if self.rng.random() < 0.6:

            def end() -> None:
                if holder.alive and self.nodes_boot(node, holder):
                    node.exit(holder, reap=True)
                    self._kernel_event(node, holder)

            self.at(self.now + 1.0 + self.rng.random() * 15.0, end)

    @staticmethod
    def nodes_boot(node: kernel.SimNode, proc: kernel.SimProcess) -> bool:
        return node.procs.get(proc.host_pid) is proc

    def _kernel_event(self, node: kernel.SimNode, proc: kernel.SimProcess) -> None:
        agent = self.agents[node.name]
        agent.on_exit(proc)

    # --- the oracles ------------------------------------------------------------------------------

    def on_probe(self, agent: SimAgent, key: tuple[str, str], result: Any) -> None:
        """The probe's verdict against the kernel's truth, at the instant it was reached."""
        worker = self.by_name.get(key[1])
        if worker is None or worker.proc is None:
            return
        alive = worker.proc.alive and worker.node.boot_id == worker.boot_id
        label = _VERDICT_LABELS.get((result.verdict, result.evidence))
        if label is None:
            label = _VERDICT_LABELS[(result.verdict, result.evidence)] = (
                "verdict:" + result.verdict.value + "/" + result.evidence.value
            )
        self.stats[label] += 1
        if result.verdict == Verdict.DEAD and alive:
            self.violation(
                "live_attested_dead", f"{worker.name} probed Dead ({result.evidence}) while alive: {result.detail}"
            )
        elif result.verdict == Verdict.ALIVE and not alive:
            self.violation(
                "wrong_reason", f"{worker.name} probed Alive ({result.evidence}) while dead: {result.detail}"
            )

    def violation(self, counter: str, detail: str) -> None:
        self.violations.append(Violation(counter, detail, self.now))
        self.log(f"VIOLATION {counter}: {detail}")

    def _label(self, old: dict[str, Any] | None, new: dict[str, Any] | None) -> str:
        if old is None:
            return "created"
        if new is None:
            return "deleted"
        o, n = old.get("status") or {}, new.get("status") or {}
        if retired(new) and not retired(old):
            return "retired"
        if released(new) and not released(old):
            return "released"
        if o.get("attestation") != n.get("attestation"):
            verdict = (n.get("attestation") or {}).get("verdict")
            return {"Alive": "attested-alive", "Dead": "attested-dead"}.get(str(verdict), "attested-other")
        if o.get("lastHeartbeatTime") != n.get("lastHeartbeatTime"):
            return "heartbeat"
        return "conditions" if o != n else "metadata"

    def _on_write(
        self, identity: str, verb: str, key: Key, old: dict[str, Any] | None, new: dict[str, Any] | None,
        view_rv: int | None,
    ) -> None:  # fmt: skip
        if key[0] != "wreg":
            return
        label = self._label(old, new)
        self.labels[self.server.rv] = label
        self.stats[f"write:{label}"] += 1
        self.log(f"write {identity} {verb} {key[2]} {label} rv={self.server.rv}")
        if new is not None and (new.get("status") or {}).get("attestation") != ((old or {}).get("status") or {}).get(
            "attestation"
        ):
            self.attested_by.setdefault(key, []).append((new["status"]["attestation"], identity))
        if old is not None and retired(old):
            if new is None:
                return  # deletion of a terminal registration (retention)
            if not retired(new):
                self.violation("double_retired", f"{key[2]} un-retired by {identity}")
            elif (old.get("status") or {}).get("retirement") != (new.get("status") or {}).get("retirement"):
                self.violation("double_retired", f"{key[2]}: status.retirement rewritten by {identity}")
            return
        if new is None or not retired(new):
            return
        self._check_retirement(identity, key, old, new, view_rv)

    def _check_retirement(
        self, identity: str, key: Key, old: dict[str, Any] | None, new: dict[str, Any], view_rv: int | None
    ) -> None:
        name = key[2]
        self.stats["retirements"] += 1
        if key in self.retired_seen:
            self.violation("double_retired", f"{name} retired a second time by {identity}")
        self.retired_seen[key] = self.now
        worker = self.by_name.get(name)
        if worker is None or worker.proc is None:
            self.violation("bad_provenance", f"{name}: no worker behind it")
            return
        if worker.proc.alive and worker.node.boot_id == worker.boot_id:
            self.violation(
                "live_retired",
                f"{name} (pid {worker.proc.host_pid}, fate {worker.fate}) retired by {identity} while alive",
            )
        if released(old):
            self.violation("released_retired", f"{name} retired by {identity} after its goodbye")
        old_rv = int(((old or {}).get("metadata") or {}).get("resourceVersion") or 0)
        if view_rv is None or view_rv != old_rv:
            self.violation(
                "stale_view", f"{name} retired by {identity} from view rv {view_rv}, object was at rv {old_rv}"
            )
        status = new.get("status") or {}
        record = status.get("retirement") or {}
        attestation = record.get("attestation")
        stored = ((old or {}).get("status") or {}).get("attestation")
        spec = new.get("spec") or {}
        if not isinstance(attestation, dict):
            self.violation("bad_provenance", f"{name}: retirement carries no attestation")
            return
        by = self._writer_of(key, attestation)
        problems = []
        if attestation != stored:
            problems.append("the attestation copied is not the one stored when retired")
        if attestation.get("verdict") != Verdict.DEAD.value:
            problems.append(f"verdict {attestation.get('verdict')}")
        if attestation.get("incarnation") != spec.get("incarnation"):
            problems.append("the attested incarnation is not the registration's")
        if (attestation.get("agent") or {}).get("nodeName") != spec.get("nodeName"):
            problems.append("attested by another node's agent")
        if by != f"agent:{spec.get('nodeName')}":
            problems.append(f"written by {by}")
        if problems:
            self.violation("bad_provenance", f"{name}: " + "; ".join(problems))
        self._check_reasons(name, new, attestation, record)

    def _writer_of(self, key: Key, attestation: dict[str, Any]) -> str | None:
        """Who last wrote exactly this attestation (the same JSON) into the registration."""
        canon = None
        for written, identity in reversed(self.attested_by.get(key, ())):
            if written == attestation:
                canon = canon or _canon(attestation)
                if _canon(written) == canon:
                    return identity
        return None

    def _check_reasons(
        self, name: str, new: dict[str, Any], attestation: dict[str, Any], record: dict[str, Any]
    ) -> None:
        """Reasons consistent: the rules restated independently of `decide`."""
        evidence = attestation.get("evidence")
        spec = new.get("spec") or {}
        problems = []
        if record.get("reason") != evidence:
            problems.append(f"retirement.reason {record.get('reason')} is not the evidence {evidence}")
        conds = {c.get("type"): c for c in (new.get("status") or {}).get("conditions") or []}
        if (conds.get("Retired") or {}).get("reason") != evidence:
            problems.append("the Retired condition's reason is not the evidence")
        from_proc = (Evidence.PROC_ABSENT.value, Evidence.PID_NAMESPACE_RECREATED.value, Evidence.BOOT_BOUNDARY.value)
        if evidence not in (Evidence.PIDFD_EXITED.value, *from_proc):
            problems.append(f"evidence {evidence} does not prove death")
        same_boot = attestation.get("bootId") == (spec.get("incarnation") or {}).get("bootId")
        if (evidence == Evidence.BOOT_BOUNDARY.value) == same_boot:
            problems.append(f"{evidence} from boot {attestation.get('bootId')}")
        retired_at = model.parse_time(record.get("retiredTime"))
        if evidence in from_proc:
            first = model.parse_time(attestation.get("firstObservedTime"))
            last = model.parse_time(attestation.get("observedTime"))
            if first is None or last is None or (last - first).total_seconds() < self.policy.absence_confirm_seconds:
                problems.append("a /proc death not confirmed by a second look")
        beat = spec.get("heartbeat")
        if beat:
            raw = (new.get("status") or {}).get("lastHeartbeatTime")
            last_beat = (
                model.parse_time(raw) if raw else model.parse_time((new.get("metadata") or {}).get("creationTimestamp"))
            )
            window = self.policy.corroboration_window(evidence=evidence, interval_seconds=beat["intervalSeconds"])
            if last_beat is None or retired_at is None or window is None:
                problems.append("heartbeat facts unreadable")
            elif retired_at - last_beat < max(window, dt(0) - dt(0)):
                problems.append(
                    f"retired {(retired_at - last_beat).total_seconds():.1f}s after the last heartbeat, "
                    f"inside the {window.total_seconds():g}s window (a heartbeat from the future is never expiry)"
                )
            if attestation.get("heartbeatSeen") != (raw or ""):
                problems.append("a heartbeat landed after the attestation")
        if problems:
            self.violation("wrong_reason", f"{name}: " + "; ".join(problems))

    def settled(self) -> bool:
        """Nothing left to decide: every worker is terminal, or alive, or dead with its number held."""
        for worker in self.workers:
            proc = worker.proc
            if proc is None:
                return False
            body = self.server.objects.get(("wreg", worker.namespace, worker.name))
            if body is None or retired(body) or released(body):
                continue
            if proc.alive and worker.node.boot_id == worker.boot_id:
                continue
            return False
        return True

    def liveness(self) -> None:
        """Every dead worker whose agent is healthy is terminal by now (FAULT_END + TAIL)."""
        for worker in self.workers:
            proc = worker.proc
            if proc is None:
                continue
            key = ("wreg", worker.namespace, worker.name)
            body = self.server.objects.get(key)
            if body is None or retired(body) or released(body):
                continue
            dead = (not proc.alive) or worker.node.boot_id != worker.boot_id
            if not dead:
                continue
            agent = self.agents[worker.node.name]
            if agent.confined:
                self.stats["exempt:confined"] += 1
                continue
            if agent.unprivileged and worker.node.boot_id != worker.boot_id and self._unreadable_namespaces(worker):
                # Another boot's incarnation is looked up by (pid namespace, pid), not by its pidfd
                # inode (those restart with the boot): an agent without ptrace access cannot show
                # the number unoccupied while a process of an unreadable namespace has that pid.
                # Unknown (ProcUnreadable), by design: doctor's held check names it.
                self.stats["exempt:unprivileged_other_boot"] += 1
                continue
            holder = worker.node.holder(ns=proc.ns, ns_pid=proc.ns_pid)
            if holder is not None and worker.clock_offset:
                # Recorded on another clock, the incarnation never matches what the agent reads: while
                # anything (an unreaped zombie of itself included) holds its number, it reads Reused.
                self.stats["exempt:recorded_on_another_clock"] += 1
                continue
            if holder is not None and holder is not proc and not self._namespace_recreated(worker, holder):
                # Another process holds the recorded number: PidReuseDetected (or, after a reboot,
                # IncarnationContradicted) preserves it by design until that process is gone.
                self.stats["exempt:number_held"] += 1
                continue
            ops_skew = max((op.skew for op in self.operators), default=0.0)
            if ops_skew - agent.skew > LEASE_SECONDS - 12:
                self.stats["exempt:relative_skew"] += 1
                continue
            self.violation(
                "dead_left_active",
                f"{worker.name} (fate {worker.fate}, died at {worker.died_at}) still active at {self.now:.0f}s: "
                f"{_conditions_text(body)}",
            )

    @staticmethod
    def _unreadable_namespaces(worker: Worker) -> bool:
        """A process of a child pid namespace (whose ns link needs ptrace access) has the recorded
        pid in its own namespace, so it may be the one holding it."""
        assert worker.proc is not None
        return any(
            p.ns != kernel.ROOT_NS and not p.reaped and p.ns_pid == worker.proc.ns_pid
            for p in worker.node.procs.values()
        )

    @staticmethod
    def _namespace_recreated(worker: Worker, holder: kernel.SimProcess) -> bool:
        """The number is held in a namespace made after the incarnation, which the agent can show:
        same boot, the holder on the agent's clock, that namespace's pid 1 started after the
        incarnation's recorded start (a later clock tick)."""
        node, proc = worker.node, worker.proc
        assert proc is not None
        if node.boot_id != worker.boot_id or holder.ns_serial in (0, proc.ns_serial):
            return False
        init = node.namespaces.get(holder.ns)
        recorded = int(worker.spec_incarnation["startTime"])
        return holder.time_ns == kernel.ROOT_TIME_NS and init is not None and init.start_time > recorded

    # --- the run ----------------------------------------------------------------------------------

    def execute(self) -> TrialResult:
        memo.forget()
        self.setup()
        self.run(FAULT_END)
        # Heal: withheld events are delivered, partitions end, capped watches catch up, components up.
        self.partitions.clear()
        self.lag_until = 0.0
        self.server.grant = True
        for watcher in list(self.server.watchers):
            watcher.release_withheld()
            if not watcher.connected:
                watcher.connected = True
                watcher.deliver()
        for component in [*self.agents.values(), *self.operators]:
            if not component.up:
                self.at(self.now + 1.0, lambda c=component: c.up or c.start())
        end = FAULT_END + TAIL
        while self.now < end and not self.settled():
            self.run(min(end, self.now + 2.0))
        self.liveness()
        for op in self.operators:
            if op.up:
                op.harvest()
        for verb, count in self.server.counts.items():
            self.stats[f"api:{verb}"] += count
        if self.server.counts.get("refused:evidence"):
            # A retirement by production code that coroner-retire-requires-evidence refuses: the
            # writer and the policy disagree on what a retirement is.
            self.violation(
                "admission_refused",
                f"{self.server.counts['refused:evidence']} retirement(s) refused for their evidence",
            )
        return TrialResult(
            seed=self.seed,
            faults=self.faults,
            steps=self.steps,
            violations=[(v.counter, v.detail, round(v.at, 3)) for v in self.violations],
            stats=dict(self.stats),
        )


_VERDICT_LABELS: dict[tuple[Any, Any], str] = {}
_CANON = json.JSONEncoder(sort_keys=True)


def _canon(value: Any) -> str:
    return _CANON.encode(value)


def _conditions_text(body: dict[str, Any]) -> str:
    conds = (body.get("status") or {}).get("conditions") or []
    att = (body.get("status") or {}).get("attestation") or {}
    parts = [f"{c.get('type')}={c.get('reason')}" for c in conds]
    return f"attestation {att.get('verdict')}/{att.get('evidence')}; " + ", ".join(parts)


@dataclasses.dataclass
class TrialResult:
    seed: int
    faults: tuple[str, ...]
    steps: int
    violations: list[tuple[str, str, float]]
    stats: dict[str, int]


def run_trial(seed: int, *, trace: bool = False, faults: tuple[str, ...] | None = None) -> tuple[TrialResult, Trial]:
    trial = Trial(seed, faults=faults, trace=trace)
    result = trial.execute()
    return result, trial
