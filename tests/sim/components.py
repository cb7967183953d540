"""The simulated components: agents, operators, launchers (workers) and a human's `kubectl coroner apply`.

Each runs production code for everything it decides and every shape it writes, and owns only the
I/O around it — which in the simulation is a call on the model API server, delayed by the API
latency, and dropped if the component crashed meanwhile.

- `SimOperator`: the production operator, whole (`coroner_operator.app.Operator`), on the trial's
  virtual-time loop (`sim.loop`), its `KubeApi` over the model API server (`sim.transport`); a
  crash ends its `Owner`, and nothing of that life runs again.
- `SimAgent`: the production `coroner_agent.service.Agent` (its watch handlers, its reconciler's
  gather and pure step, its executor over `SimAgentPort`, its clock injected), the production probe
  (`coroner_agent.probe.probe`, `PidIndex`, `PidfdTable`, `LocalNode.read`) over a `SimProcReader`.
  What is the sim's own: the scheduling (the API latency between the step and the executor; each
  agent has an `epoch`, a crash bumps it, and every callback scheduled by an older epoch is a
  no-op), the prober's bookkeeping (`ProcProber` opens a real /proc), and its port's Lease upsert
  (the transport of `coroner.client.rest.upsert_lease`).
- `Worker`: records its incarnation with the production `procfs.incarnation_from` over its own
  /proc texts, says goodbye with the production `wire.release_apply`.
- `Human`: `kubectl coroner apply`'s production `plan.build_world`, `fingerprint.decide_all`, `candidates`
  and the one retire protocol (a task on the trial's loop).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import random
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sim import kernel
from sim.apiserver import SimApiError, Watcher
from sim.clock import dt, run_now
from sim.loop import Owner
from sim.prod import (
    AgentEffects,
    ApiError,
    Policy,
    World,
    agent_probe,
    agent_service,
    api,
    cli_plan,
    fingerprint,
    model,
    operator_app,
    operator_kubeapi,
    operator_metrics,
    operator_settings,
    procfs,
    retire_protocol,
    wire,
)
from sim.transport import Latency, SimRest

if TYPE_CHECKING:
    from sim.trial import Trial

AGENT_IDENTITY = "system:serviceaccount:coroner-system:coroner-agent"
LEASE_SECONDS = 30
RENEW_SECONDS = 10.0
RESYNC_SECONDS = 30.0
CONFIRM_SECONDS = 10.0

_FILES: dict[str, str] = {}
_NODE_FACTS: dict[tuple[str, str, str, int], agent_probe.LocalNode] = {}
_DIR: list[str] = []


def _file(name: str, content: str, *, link: bool = False) -> str:
    """A small file (or symlink) for `LocalNode.read`, cached by content for the life of the process."""
    path = _FILES.get(name)
    if path is None:
        if not _DIR:
            _DIR.append(tempfile.mkdtemp(prefix=f"coroner-sim-{os.getpid()}-"))
        path = os.path.join(_DIR[0], name)
        if not os.path.lexists(path):
            if link:
                os.symlink(content, path)
            else:
                with open(path, "w") as out:
                    out.write(content)
        _FILES[name] = path
    return path


def _key(body: dict[str, Any]) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


# --- the agent ---------------------------------------------------------------------------------


class _Window:
    """The trial's random source, but only inside a window of virtual time (never outside it)."""

    def __init__(self, trial: Trial, window: tuple[float, float], rng: Any) -> None:
        self.trial, self.window, self.rng = trial, window, rng

    def active(self) -> bool:
        return self.window[0] <= self.trial.now < self.window[1]

    def random(self) -> float:
        return self.rng.random() if self.active() else 1.0

    def choice(self, options: Any) -> Any:
        return self.rng.choice(options)


class SimProber:
    """`coroner_agent.service.Prober` over the simulated /proc, with the production probe."""

    def __init__(self, agent: SimAgent) -> None:
        self.agent = agent
        self.reader = agent.reader
        self.index = agent_probe.PidIndex()
        self.pidfds = agent_probe.PidfdTable(max_pinned=agent.max_pinned, close=self.reader.close_pidfd)
        self.incarnation_of: dict[tuple[str, str], procfs.IncarnationKey] = {}
        self.reuser_of: dict[tuple[str, str], procfs.IncarnationKey] = {}
        self.node = self._read_node()

    def _read_node(self) -> agent_probe.LocalNode:
        node = self.agent.node
        view = self.reader.view_ns
        flaky = self.reader.flaky
        if flaky is not None and flaky.active():
            return self._read_node_files(node, view)  # its reads may fail (and draw from the seed): not cached
        key = (node.name, node.boot_id, node.host_id, view)
        facts = _NODE_FACTS.get(key)
        if facts is None:
            facts = _NODE_FACTS[key] = self._read_node_files(node, view)
        return facts

    def _read_node_files(self, node: kernel.SimNode, view: int) -> agent_probe.LocalNode:
        """The production `LocalNode.read` over files holding this boot's facts (read once per
        boot and pid-namespace view in a process: the files, and so the facts, never change)."""
        return agent_probe.LocalNode.read(
            node_name=node.name,
            reader=self.reader,
            boot_id_file=_file(f"boot-{node.boot_id}", node.boot_id + "\n"),
            machine_id_file=_file(f"machine-{node.host_id}", node.host_id + "\n"),
            self_pid_namespace_link=_file(f"ns-{view}", f"pid:[{view}]", link=True),
        )

    def boot_id(self) -> str | None:
        return self.node.boot_id

    def host_id(self) -> str:
        return self.node.host_id

    def rescan(self) -> None:
        self.node = self._read_node()  # as ProcProber.rescan: fresh node facts every resync
        self.index.refresh(reader=self.reader, proc_pid_namespace=self.node.proc_pid_namespace)

    def probe(self, *, key: tuple[str, str], registration: model.Registration) -> agent_probe.ProbeResult:
        result = agent_probe.probe(
            incarnation=registration.incarnation,
            registration_node=registration.node_name,
            node=self.node,
            reader=self.reader,
            index=self.index,
            pidfds=self.pidfds,
        )
        self.agent.trial.on_probe(self.agent, key, result)
        try:
            inc = registration.incarnation
            self.incarnation_of[key] = procfs.recorded_incarnation(
                boot_id=inc.boot_id, pid_namespace=inc.pid_namespace, pid=inc.pid, start_time=inc.start_time
            )
        except procfs.ParseError:
            pass
        if result.reuser is not None:
            self.reuser_of[key] = result.reuser
        else:
            self.reuser_of.pop(key, None)
        if result.reuser_exited:
            self.agent.later(0.05, lambda: self.agent.enqueue(key))
        return result

    def forget(self, *, key: tuple[str, str]) -> None:
        inc = self.incarnation_of.pop(key, None)
        self.reuser_of.pop(key, None)
        if inc is not None and inc not in self.incarnation_of.values() and inc not in self.reuser_of.values():
            self.pidfds.release(inc)

    def keys_pinned_to(self, proc: kernel.SimProcess) -> list[tuple[str, str]]:
        """Registrations whose (or whose reuser's) pinned pidfd refers to `proc`: its exit fires them."""
        fds = {fd for fd, p in self.reader.pinned() if p is proc}
        if not fds:
            return []
        fired = set()
        for inc in self.pidfds.incarnations():
            held = self.pidfds.get(inc)
            if held is not None and held.fd in fds:
                fired.add(inc)
        return sorted(k for k, inc in [*self.incarnation_of.items(), *self.reuser_of.items()] if inc in fired)


class SimAgentPort:
    """`coroner_agent.executor.AgentPort` on the model API server: answers at once (the latency is
    the SimAgent's scheduling), refusals as the production client raises them."""

    def __init__(self, agent: SimAgent) -> None:
        self.agent = agent

    async def patch_status(self, *, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        try:
            return self.agent.trial.server.patch(self.agent.identity, "wreg", namespace, name, ops)
        except SimApiError as exc:
            raise ApiError(exc.status, exc.reason, exc.message) from exc

    async def get_registration(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.agent.trial.server.get("wreg", namespace, name)
        except SimApiError as exc:
            if exc.status == 404:
                return None
            raise ApiError(exc.status, exc.reason, exc.message) from exc

    async def renew_lease(
        self, *, holder: str, duration: int, annotations: dict[str, str], now: datetime.datetime
    ) -> None:
        """As `coroner.client.rest.upsert_lease`: create it, or the Lease as read renewed now."""
        server, name = self.agent.trial.server, f"{api.AGENT_LEASE_PREFIX}{self.agent.node.name}"
        current = server.objects.get(("lease", api.SYSTEM_NAMESPACE, name))
        if current is None:
            body = wire.lease_body(
                namespace=api.SYSTEM_NAMESPACE, name=name, holder=holder, duration=duration,
                annotations=annotations, now=now,
            )  # fmt: skip
        else:
            body = wire.lease_renewal(current, holder=holder, duration=duration, annotations=annotations, now=now)
        server.upsert(self.agent.identity, "lease", body)


class SimAgent:
    def __init__(self, trial: Trial, node: kernel.SimNode, *, skew: float = 0.0, lag: float = 0.05) -> None:
        self.trial = trial
        self.node = node
        self.skew = skew
        self.lag = lag
        self.identity = f"agent:{node.name}"
        self.epoch = 0
        self.up = False
        self.confined = False
        self.max_pinned = 20000
        self.flake = 0.0
        self.writes = 0
        self.crash_after_write: int | None = None
        self.watch: Watcher | None = None

    def now(self) -> float:
        return self.trial.now + self.skew

    def later(self, delay: float, fn: Callable[[], None]) -> None:
        epoch = self.epoch

        def run() -> None:
            if self.up and self.epoch == epoch:
                fn()

        self.trial.at(self.trial.now + delay, run)

    def clock(self) -> datetime.datetime:
        """The agent's injected clock: virtual time through this agent's skew."""
        return dt(self.now())

    def start(self, *, cap: int | None = None) -> None:
        self.epoch += 1
        self.up = True
        ns = kernel.CHILD_NS_POOL[-1] if self.confined else kernel.ROOT_NS
        self.process = self.node.spawn(now=self.trial.now, ns=ns)
        self.process.comm = "coroner-agent"
        self.reader = kernel.SimProcReader(self.node, agent=self.process, view_ns=ns)
        if self.flake:
            window = self.trial.flaky_window
            self.reader.flaky = _Window(self.trial, window, self.trial.rng)
            self.reader.flake = self.flake
        self.prober = SimProber(self)
        settings = agent_service.AgentSettings(
            node_name=self.node.name,
            pod_name=f"coroner-agent-{self.node.name}-{self.epoch}",
            lease_duration_seconds=LEASE_SECONDS,
            renew_seconds=RENEW_SECONDS,
            resync_seconds=RESYNC_SECONDS,
            absence_confirm_seconds=CONFIRM_SECONDS,
        )
        self.agent = agent_service.Agent(
            kube=None,  # type: ignore[arg-type]  # the watch is the sim's Watcher below
            prober=self.prober,
            settings=settings,
            identity=AGENT_IDENTITY,
            clock=self.clock,
            port=SimAgentPort(self),
        )
        self.agent.enqueue = self.enqueue  # type: ignore[method-assign]
        self.queued: set[tuple[str, str]] = set()
        node = self.node.name
        self.watch = Watcher(
            self.trial.server,
            name=f"agent-{node}",
            kind="wreg",
            selector=lambda b: ((b.get("metadata") or {}).get("labels") or {}).get(api.NODE_LABEL) == node,
            lag=self.lag,
            on_event=self._on_event,
            on_relist=lambda items: self.agent.on_relist(items),
        )
        self.watch.cap = cap
        self.trial.server.watchers.append(self.watch)
        self.watch.start()
        self.renew()
        self.later(RESYNC_SECONDS, self.resync)

    @property
    def watches(self) -> list[Watcher]:
        return [] if self.watch is None else [self.watch]

    def _on_event(self, etype: str, body: dict[str, Any]) -> None:
        travel = self.trial.travel
        rv = _rv(body)
        if travel is not None and travel[0] is self and self.trial.labels.get(rv) == travel[1]:
            self.trial.at(self.trial.now, lambda: self.trial.time_travel(rv))
        self.agent.on_event(etype, body)

    def crash(self) -> None:
        if not self.up:
            return
        self.up = False
        self.epoch += 1
        if self.watch is not None:
            self.watch.stop()
        if self.process.alive:
            self.node.exit(self.process)

    def enqueue(self, key: tuple[str, str]) -> None:
        if key in self.queued:
            return
        self.queued.add(key)

        def run() -> None:
            self.queued.discard(key)
            self.attest(key)

        self.later(0.001, run)

    def renew(self) -> None:
        """The production Lease renewal (`Agent.renew_lease_once`: holder, duration, this boot's and
        host's ids, `clock()`), through `SimAgentPort.renew_lease`, unless the agent is cut off."""
        if not self.trial.partitioned(self):
            run_now(self.agent.renew_lease_once())
        self.later(RENEW_SECONDS, self.renew)

    def resync(self) -> None:
        self.prober.rescan()
        for key in list(self.agent.bodies):
            self.enqueue(key)
        self.later(RESYNC_SECONDS, self.resync)

    def on_exit(self, proc: kernel.SimProcess) -> None:
        """The kernel side of a pidfd becoming readable (or a reuser's number being freed)."""
        if not self.up:
            return
        for key in self.prober.keys_pinned_to(proc):
            self.later(0.0005, lambda key=key: self.agent.on_pidfd(key))

    def attest(self, key: tuple[str, str]) -> None:
        """The production gather and step now; the production executor after the API latency."""
        effects = self.agent.reconciler.effects(key)
        if effects is None:
            return
        if effects.requeue_at is not None:
            self.later((effects.requeue_at - self.clock()).total_seconds(), lambda: self.enqueue(key))
        if effects.write is None:
            return
        self.trial.stats["attest_sent"] += 1
        self.later(self.trial.latency(), lambda: self._write(effects))

    def _write(self, effects: AgentEffects) -> None:
        if self.trial.partitioned(self):
            self.later(1.0, lambda: self.enqueue(effects.key))
            return
        executor = self.agent.executor
        before = executor.attestations_written
        try:
            run_now(executor.run(effects))
        except ApiError:
            self.trial.stats["agent_refused"] += 1  # production retries it with backoff; a resync does here
            return
        if executor.attestations_written == before:
            return  # refused for moving (re-read, attested again) or gone
        self.writes += 1
        if self.crash_after_write is not None and self.writes == self.crash_after_write:
            self.trial.sieve_crash(self)


# --- the operator ------------------------------------------------------------------------------


#: The operator's settings in every trial (the shipped defaults but where a trial is too short for
#: them: terminal registrations are kept, so the oracles see every one to the end).
OPERATOR_SETTINGS = operator_settings.OperatorSettings(
    resync_seconds=60.0, permission_refresh_seconds=5.0, terminal_retention_seconds=0
)


class SimOperator:
    """The production operator (`coroner_operator.app.Operator`: its runtime, watch inputs,
    reconciler, step, executor, retire protocol, permission refresher, sweeper and Event poster),
    run on the trial's loop with the ports the simulation owns: its `KubeApi` talks to the model API
    server through `SimRest` and `Latency`, its clock is the trial's plus its skew, its backoff
    draws from the seed, and the model watches feed its `WatchInputs` as kopf's handlers do."""

    def __init__(self, trial: Trial, name: str, *, skew: float = 0.0, lag: float = 0.05) -> None:
        self.trial = trial
        self.name = name
        self.identity = name
        self.skew = skew
        self.lag = lag
        self.epoch = 0
        self.up = False
        self.writes = 0
        self.crash_after_write: int | None = None
        self.watches: list[Watcher] = []
        self.owner: Owner | None = None

    def now(self) -> float:
        return self.trial.now + self.skew

    def clock(self) -> datetime.datetime:
        return dt(self.trial.now + self.skew)

    def start(self, *, cap: int | None = None) -> None:
        self.epoch += 1
        self.up = True
        trial = self.trial
        self.owner = owner = Owner(self.name)
        self.context = owner.context()
        self.rest = SimRest(trial.server, identity=self.identity, wrote=self._wrote)
        kube = operator_kubeapi.KubeApi(
            self.rest,  # type: ignore[arg-type]
            blocking=Latency(trial.loop, self.rest, latency=trial.latency),
            clock=self.clock,
        )
        self.operator = operator_app.Operator(
            world=World(),
            kube=kube,
            policy=Policy(),
            metrics=operator_metrics.Metrics(process_collectors=False),
            settings=OPERATOR_SETTINGS,
            identity=self.identity,
            clock=self.clock,
            monotonic=trial.loop.time,
            rng=random.Random(trial.rng.random()),
        )
        self.inputs = self.operator.inputs
        self.watches = [
            Watcher(trial.server, name=f"{self.name}-wreg", kind="wreg", selector=lambda b: True, lag=self.lag,
                    on_event=self.on_registration, on_relist=self.on_relist),
            Watcher(trial.server, name=f"{self.name}-lease", kind="lease", selector=lambda b: True, lag=self.lag,
                    on_event=self.on_lease, on_relist=self.on_lease_relist),
        ]  # fmt: skip
        for watch in self.watches:
            watch.cap = cap
            trial.server.watchers.append(watch)
            watch.start()
        for loop in self.operator.loops():
            trial.loop.start(owner, loop)

    def crash(self) -> None:
        if not self.up:
            return
        self.up = False
        self.epoch += 1
        self.harvest()
        assert self.owner is not None
        self.owner.alive = False  # its tasks, timers and requests in flight never run again
        for watch in self.watches:
            watch.stop()

    def harvest(self) -> None:
        """This life's counts of what the production executor did, into the trial's stats."""
        stats = self.trial.stats
        metrics = self.operator.metrics
        for counter in (metrics.retirements, metrics.retire_abandoned, metrics.cas_conflicts,
                        metrics.reconcile_errors, metrics.status_writes):  # fmt: skip
            for family in counter.collect():
                for sample in family.samples:
                    if sample.name.endswith("_total") and sample.value:
                        label = next(iter(sample.labels.values()), "")
                        stats[f"operator:{family.name}" + (f":{label}" if label else "")] += int(sample.value)
        stats["events"] += self.rest.events

    # --- the watches: what kopf's handlers hand to WatchInputs (plus Sieve's time-travel trigger) ---

    def on_relist(self, items: list[dict[str, Any]]) -> None:
        self.context.run(self._relist, items)

    def _relist(self, items: list[dict[str, Any]]) -> None:
        listed = {_key(body) for body in items}
        for key, body in list(self.operator.world.bodies.items()):
            if key not in listed:
                self.inputs.on_registration(body, deleted=True)
        for body in items:
            self.inputs.on_registration(body, deleted=False)

    def on_registration(self, etype: str, body: dict[str, Any]) -> None:
        travel = self.trial.travel
        rv = _rv(body)
        if travel is not None and travel[0] is self and self.trial.labels.get(rv) == travel[1]:
            self.trial.at(self.trial.now, lambda: self.trial.time_travel(rv))
        self.context.run(self.inputs.on_registration, body, deleted=etype == "DELETED")

    def on_lease_relist(self, items: list[dict[str, Any]]) -> None:
        for body in items:
            self.context.run(self.inputs.on_lease, body, deleted=False)

    def on_lease(self, etype: str, body: dict[str, Any]) -> None:
        self.context.run(self.inputs.on_lease, body, deleted=etype == "DELETED")

    def _wrote(self) -> None:
        self.writes += 1
        if self.crash_after_write is not None and self.writes == self.crash_after_write:
            self.trial.sieve_crash(self)


class _RetirePort:
    """`coroner.retire.RetirePort` over the model API server, as one identity (the operator's, a person's)."""

    def __init__(self, trial: Trial, identity: str, *, view_rv: int) -> None:
        self.trial = trial
        self.identity = identity
        self.view_rv = view_rv

    async def can_retire(self, *, namespace: str, name: str) -> bool | None:
        return self.trial.server.holds_retire(self.identity)

    async def list_leases(self, *, namespace: str) -> list[dict[str, Any]]:
        items, _ = self.trial.server.list("lease", lambda b: (b.get("metadata") or {}).get("namespace") == namespace)
        return items

    async def patch_status(self, *, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        try:
            return self.trial.server.patch(self.identity, "wreg", namespace, name, ops, view_rv=self.view_rv)
        except SimApiError as exc:
            raise retire_protocol.PortError(exc.status, exc.message, reason=exc.reason) from exc

    async def post_event(self, *, involved: Any, reason: str, evidence: str, message: str) -> None:
        self.trial.stats["events"] += 1


def _rv(body: dict[str, Any]) -> int:
    try:
        return int(body["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return -1


# --- the worker and its launcher ---------------------------------------------------------------


class Worker:
    """One `coroner run`: a process on a node, its registration, opt-in heartbeats, its goodbye."""

    def __init__(
        self, trial: Trial, node: kernel.SimNode, index: int, *, ns: int, heartbeat: tuple[int, int] | None,
        skew: float = 0.0,
    ) -> None:  # fmt: skip
        self.trial = trial
        self.node = node
        self.name = f"w{index}"
        self.namespace = "jobs"
        self.ns = ns
        self.heartbeat = heartbeat
        self.skew = skew
        self.proc: kernel.SimProcess | None = None
        self.registered = False
        self.boot_id = ""
        self.died_at: float | None = None
        self.said_goodbye = False
        self.spec_incarnation: dict[str, Any] = {}
        self.fate = "live"
        self.reuser: kernel.SimProcess | None = None

    def now(self) -> float:
        return self.trial.now + self.skew

    def start(self, *, force_ns_pid: int | None = None, force_host_pid: int | None = None) -> None:
        node = self.node
        self.proc = node.spawn(now=self.trial.now, ns=self.ns, ns_pid=force_ns_pid, host_pid=force_host_pid)
        self.boot_id = node.boot_id
        view = self.proc.ns  # the launcher reads its child from inside the worker's own namespace
        incarnation = procfs.incarnation_from(
            stat=self.proc.stat(view),
            status=self.proc.status(view),
            pid_namespace_link=f"pid:[{self.proc.ns}]",
            boot_id=node.boot_id + "\n",
            machine_id=node.host_id + "\n",
            node_name=node.name,
        )
        self.spec_incarnation = incarnation.spec()
        body = wire.registration_body(
            name=self.name,
            namespace=self.namespace,
            node_name=node.name,
            incarnation=self.spec_incarnation,
            client_instance_id=f"{api.CLIENT_INSTANCE_PREFIX}{self.trial.seed}-{self.name}",
            heartbeat=self.heartbeat,
        )
        self.trial.server.create("launcher", "wreg", body)
        self.registered = True
        if self.heartbeat is not None:
            self.beat()

    def beat(self) -> None:
        if self.proc is None or not self.proc.alive or self.said_goodbye or self.node.boot_id != self.boot_id:
            return
        with contextlib.suppress(SimApiError):  # a missed heartbeat is not fatal
            self.trial.server.merge_status(
                "launcher", "wreg", self.namespace, self.name, wire.heartbeat_patch(dt(self.now()))
            )
        assert self.heartbeat is not None
        self.trial.at(self.trial.now + self.heartbeat[0], self.beat)

    def goodbye(self) -> None:
        """The launcher's release after its child exited: one server-side apply of Released."""
        self.said_goodbye = True
        condition = wire.released_condition(message="the worker exited cleanly", now=dt(self.now()), generation=1)
        body = wire.release_apply(name=self.name, namespace=self.namespace, condition=condition)
        try:
            self.trial.server.apply_status("launcher", "wreg", body)
            self.trial.stats["goodbyes"] += 1
        except SimApiError as exc:
            if exc.status == 422:
                self.trial.stats["goodbye_after_retired"] += 1
                return
            raise


# --- the human -----------------------------------------------------------------------------------


class Human:
    """`kubectl coroner apply`: plan from one LIST of each kind, retire each candidate with the one
    retire protocol as a person (`Writer.PERSON`), as `cli/commands/apply.py` does."""

    def __init__(self, trial: Trial) -> None:
        self.trial = trial

    def apply(self) -> None:
        server = self.trial.server
        registrations, _ = server.list("wreg", lambda b: True)
        leases, _ = server.list("lease", lambda b: True)
        listing = cli_plan.Listing(
            registrations=registrations,
            leases=leases,
            nodes=[],
            retire_permission={"jobs": server.holds_retire("human")},
        )
        world = cli_plan.build_world(listing)
        now = dt(self.trial.now)
        policy = Policy()
        plan = fingerprint.decide_all(world=world, policy=policy, now=now)
        for entry in cli_plan.candidates(plan):
            registration = entry.registration
            key = (registration.namespace or "", registration.name or "")
            intent = retire_protocol.RetireIntent(
                body=world.bodies[key],
                registration=registration,
                decision=entry.decision,
                facts=world.facts_for(key, now=now),
                policy=policy,
            )
            retirer = retire_protocol.Retirer(name="human", writer=wire.Writer.PERSON, via="kubectl coroner apply")
            port = _RetirePort(self.trial, "human", view_rv=int(registration.resource_version or 0))
            self.trial.loop.start(None, self._retire(port, intent, retirer))

    async def _retire(self, port: _RetirePort, intent: Any, retirer: Any) -> None:
        result = await retire_protocol.retire(port, intent, retirer=retirer, clock=lambda: dt(self.trial.now))
        self.trial.stats[f"human:{result.outcome.value}"] += 1
