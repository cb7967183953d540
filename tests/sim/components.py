"""The simulated components: agents, operators, launchers (workers) and a human's `kubectl coroner apply`.

Each runs production code for everything it decides and every shape it writes, and owns only the
I/O around it — which in the simulation is a call on the model API server, delayed by the API
latency, and dropped if the component crashed meanwhile.

- `SimOperator`: the production operator, whole (`coroner_operator.app.Operator`), on the trial's
  virtual-time loop (`sim.loop`), its `KubeApi` over the model API server (`sim.transport`); a
  crash ends its `Owner`, and nothing of that life runs again.
- `SimAgent`: the production agent, whole (`coroner_agent.service.Agent`: watch handlers, runtime,
  reconciler, pure step, executor, Lease loop, resync; `AgentApi` behind `ApiPort`; `ProcProber`
  with the production probe), on the trial's loop in a life of its own, as the operator. Its
  ports: the API transport (`SimRest` behind `Latency`, cut off while partitioned), the /proc reader
  (`kernel.SimProcReader`), the pidfd table's readability (`SimPidfds`), the node's files, the
  clock and the backoff's random source.
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
from sim.clock import dt
from sim.loop import Owner
from sim.prod import (
    Policy,
    World,
    agent_kube,
    agent_pidfds,
    agent_probe,
    agent_prober,
    agent_service,
    api,
    cli_apply,
    cli_plan,
    fingerprint,
    operator_app,
    operator_metrics,
    operator_settings,
    procfs,
    retire_protocol,
    wire,
)
from sim.transport import Latency, RecordingKubeApi, SimRest

if TYPE_CHECKING:
    from sim.trial import Trial

AGENT_IDENTITY = "system:serviceaccount:coroner-system:coroner-agent"
LEASE_SECONDS = 30
RENEW_SECONDS = 10.0
RESYNC_SECONDS = 30.0
CONFIRM_SECONDS = 10.0

_FILES: dict[str, str] = {}
_NODE_FACTS: dict[tuple[str, str, str, int], agent_probe.LocalNode] = {}
#: One folder for every process of this user: the files are named by their content, so processes
#: share them, and a batch leaves one folder behind, not one per process.
_DIR = os.path.join(tempfile.gettempdir(), f"coroner-sim-files-{os.getuid()}")


def _file(name: str, content: str, *, link: bool = False) -> str:
    """A small file (or symlink) for `LocalNode.read`, named by its content (several processes may
    create it at once: each writes its own and renames it into place)."""
    path = _FILES.get(name)
    if path is None:
        os.makedirs(_DIR, exist_ok=True)
        path = os.path.join(_DIR, name)
        if not os.path.lexists(path):
            staged = f"{path}.{os.getpid()}"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staged)
            if link:
                os.symlink(content, staged)
            else:
                with open(staged, "w") as out:
                    out.write(content)
            os.replace(staged, path)
        _FILES[name] = path
    return path


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


class SimPidfds(agent_pidfds.PidfdTable):
    """The pidfd port: the production table of pinned pidfds (their numbers the model kernel's), and
    the kernel's side of their readability, as `PidfdWatcher`'s epoll: `exited(proc)` reports, half a
    millisecond later, every pinned incarnation whose pidfd refers to `proc` (a registration's own
    incarnation, or the holder of a Reused one's number), to the prober's `fired`."""

    def __init__(self, agent: SimAgent, fired: Callable[[procfs.IncarnationKey], None]) -> None:
        super().__init__(max_pinned=agent.max_pinned, close=agent.reader.close_pidfd)
        self.agent = agent
        self.fired = fired

    def exited(self, proc: kernel.SimProcess) -> None:
        fds = {fd for fd, p in self.agent.reader.pinned() if p is proc}
        if not fds:
            return
        for incarnation in self.incarnations():
            held = self.get(incarnation)
            if held is not None and held.fd in fds:
                self.agent.later(0.0005, lambda incarnation=incarnation: self.fired(incarnation))


def sim_prober(agent: SimAgent) -> agent_prober.ProcProber:
    """The production `ProcProber` over the model kernel's /proc, pidfds and node files; each probe's
    verdict is also shown to the trial's oracle (`Trial.on_probe`) against the kernel's truth."""
    return agent_prober.ProcProber(
        node_name=agent.node.name,
        loop=agent.trial.loop,
        on_exit=agent.on_pidfd,
        reader=agent.reader,
        pidfd_table=lambda fired: SimPidfds(agent, fired),
        node_facts=lambda: _node_facts_now(agent),
        observe=lambda key, result: agent.trial.on_probe(agent, key, result),
    )


def _node_facts_now(agent: SimAgent) -> agent_probe.LocalNode:
    node, reader = agent.node, agent.reader
    flaky = reader.flaky
    if flaky is not None and flaky.active():
        return _read_node_files(node, reader)  # its reads may fail (and draw from the seed): not cached
    key = (node.name, node.boot_id, node.host_id, reader.view_ns)
    facts = _NODE_FACTS.get(key)
    if facts is None:
        facts = _NODE_FACTS[key] = _read_node_files(node, reader)
    return facts


def _read_node_files(node: kernel.SimNode, reader: kernel.SimProcReader) -> agent_probe.LocalNode:
    """The production `LocalNode.read` over files holding this boot's facts (read once per boot and
    pid-namespace view in a process: the files, and so the facts, never change)."""
    return agent_probe.LocalNode.read(
        node_name=node.name,
        reader=reader,
        boot_id_file=_file(f"boot-{node.boot_id}", node.boot_id + "\n"),
        machine_id_file=_file(f"machine-{node.host_id}", node.host_id + "\n"),
        self_pid_namespace_link=_file(f"ns-{reader.view_ns}", f"pid:[{reader.view_ns}]", link=True),
    )


async def _inline(call: Callable[[], None]) -> None:
    """The agent's `offload`: the model kernel's /proc answers at once, so a rescan runs in place."""
    call()


class SimAgent:
    """One node's production agent (`coroner_agent.service.Agent`: its watch handlers, Controller,
    reconciler, pure step, executor, Lease loop and resync, over the production `AgentApi` and
    `ApiPort`), on the trial's loop in a life of its own (`Owner`). Its ports: the API transport
    (`SimRest` as this node's agent, behind `Latency`; unreachable while the trial partitions it),
    the /proc reader, the pidfds, the node's files, the clock (the trial's plus its skew) and the
    backoff's random source (from the seed)."""

    def __init__(self, trial: Trial, node: kernel.SimNode, *, skew: float = 0.0, lag: float = 0.05) -> None:
        self.trial = trial
        self.node = node
        self.skew = skew
        self.lag = lag
        self.identity = f"agent:{node.name}"
        self.epoch = 0
        self.up = False
        self.confined = False
        self.unprivileged = False
        """No ptrace access: no other process's ns links can be read (the shipped agent's uid)."""
        self.max_pinned = 20000
        self.flake = 0.0
        self.writes = 0
        self.crash_after_write: int | None = None
        self.watch: Watcher | None = None
        self.owner: Owner | None = None

    def now(self) -> float:
        return self.trial.now + self.skew

    def clock(self) -> datetime.datetime:
        """The agent's injected clock: virtual time through this agent's skew."""
        return dt(self.now())

    def later(self, delay: float, fn: Callable[[], None]) -> None:
        """Calls `fn` after `delay`, in this life (a crash drops it)."""
        self.trial.loop.call_at(self.trial.now + delay, fn, context=self.context)

    def start(self, *, cap: int | None = None) -> None:
        self.epoch += 1
        self.up = True
        trial = self.trial
        self.owner = owner = Owner(self.identity)
        self.context = owner.context()
        ns = self.node.container("coroner-agent", now=trial.now) if self.confined else kernel.ROOT_NS
        self.process = self.node.spawn(now=trial.now, ns=ns)
        self.process.comm = "coroner-agent"
        self.reader = kernel.SimProcReader(self.node, agent=self.process, view_ns=ns, unprivileged=self.unprivileged)
        if self.flake:
            self.reader.flaky = _Window(trial, trial.flaky_window, trial.rng)
            self.reader.flake = self.flake
        self.prober = sim_prober(self)
        self.rest = SimRest(
            trial.server, identity=self.identity, wrote=self._wrote, reachable=lambda: not trial.partitioned(self)
        )
        settings = agent_service.AgentSettings(
            node_name=self.node.name,
            pod_name=f"coroner-agent-{self.node.name}-{self.epoch}",
            lease_duration_seconds=LEASE_SECONDS,
            renew_seconds=RENEW_SECONDS,
            resync_seconds=RESYNC_SECONDS,
            absence_confirm_seconds=CONFIRM_SECONDS,
        )
        api_client = agent_kube.AgentApi(self.rest, node_name=self.node.name)  # type: ignore[arg-type]
        self.agent = agent_service.Agent(
            kube=api_client,  # its watch is the sim's Watcher below
            prober=self.prober,
            settings=settings,
            identity=AGENT_IDENTITY,
            clock=self.clock,
            port=agent_kube.ApiPort(api_client, blocking=Latency(trial.loop, self.rest, latency=trial.latency)),
            rng=random.Random(trial.rng.random()),
            offload=_inline,
        )
        node = self.node.name
        self.watch = Watcher(
            trial.server,
            name=f"agent-{node}",
            kind="wreg",
            selector=lambda b: ((b.get("metadata") or {}).get("labels") or {}).get(api.NODE_LABEL) == node,
            lag=self.lag,
            on_event=self._on_event,
            on_relist=lambda items: self.context.run(self.agent.on_relist, items),
        )
        self.watch.cap = cap
        trial.server.watchers.append(self.watch)
        self.watch.start()
        for loop in self.agent.loops():
            trial.loop.start(owner, loop)

    @property
    def watches(self) -> list[Watcher]:
        return [] if self.watch is None else [self.watch]

    def _on_event(self, etype: str, body: dict[str, Any]) -> None:
        travel = self.trial.travel
        rv = _rv(body)
        if travel is not None and travel[0] is self and self.trial.labels.get(rv) == travel[1]:
            self.trial.at(self.trial.now, lambda: self.trial.time_travel(rv))
        self.context.run(self.agent.on_event, etype, body)

    def crash(self) -> None:
        if not self.up:
            return
        self.up = False
        self.epoch += 1
        assert self.owner is not None
        self.owner.alive = False  # its tasks, timers and requests in flight never run again
        if self.watch is not None:
            self.watch.stop()
        if self.process.alive:
            # A confined agent's container ends with it (its pid namespace's pid 1 too).
            self.node.exit(self.node.namespaces.get(self.process.ns) or self.process)

    def on_pidfd(self, key: tuple[str, str]) -> None:
        self.agent.on_pidfd(key)

    def on_exit(self, proc: kernel.SimProcess) -> None:
        """The kernel side of a pidfd becoming readable (or a reuser's number being freed)."""
        if self.up:
            self.prober.pidfds.exited(proc)  # type: ignore[attr-defined]

    def _wrote(self) -> None:
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
        kube = RecordingKubeApi(
            self.rest, latency=Latency(trial.loop, self.rest, latency=trial.latency), clock=self.clock
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
        # One page: the model server's list is one snapshot, at the watch's position.
        self.inputs.on_list_page(items, first=True, last=True, resource_version=str(self.watches[0].pos))

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
        return self.trial.server.list_leases(namespace)

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
        self, trial: Trial, node: kernel.SimNode, name: str, *, container: str | None,
        heartbeat: tuple[int, int] | None, skew: float = 0.0,
    ) -> None:  # fmt: skip
        self.trial = trial
        self.node = node
        self.name = name
        self.namespace = "jobs"
        self.container = container
        """The container whose pid namespace the worker runs in (None: the host's)."""
        self.clock_offset = 0
        """Ticks its launcher's time namespace adds to the start times it reads (0: the host's clock)."""
        self.records_inode = False
        """Its launcher records the process's pidfd inode (`spec.incarnation.pidfdInode`)."""
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
        node, now = self.node, self.trial.now
        ns = kernel.ROOT_NS if self.container is None else node.container(self.container, now=now)
        self.proc = node.spawn(now=now, ns=ns, ns_pid=force_ns_pid, host_pid=force_host_pid)
        if self.clock_offset:
            self.proc.time_ns = kernel.OTHER_TIME_NS
        self.boot_id = node.boot_id
        view = self.proc.ns  # the launcher reads its child from inside the worker's own namespace
        incarnation = procfs.incarnation_from(
            stat=self.proc.stat(view, clock_offset=self.clock_offset),
            status=self.proc.status(view),
            pid_namespace_link=f"pid:[{self.proc.ns}]",
            boot_id=node.boot_id + "\n",
            machine_id=node.host_id + "\n",
            node_name=node.name,
            pidfd_inode=self.proc.pidfd_inode if self.records_inode else None,
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
        cache = World()
        for body in registrations:
            cache.put_registration(dict(body))
        listing = cli_plan.Listing(
            registrations=cache,
            leases=leases,
            nodes=[],
            retire_permission={"jobs": server.holds_retire("human")},
        )
        world = cli_plan.build_world(listing)
        now = dt(self.trial.now)
        policy = Policy()
        plan = fingerprint.decide_all(world=world, policy=policy, now=now)
        for entry in cli_plan.candidates(plan):
            intent, retirer = cli_plan.person_retirement(
                world=world, entry=entry, policy=policy, retired_by="human", now=now
            )
            port = _RetirePort(self.trial, "human", view_rv=int(entry.registration.resource_version or 0))
            self.trial.loop.start(None, self._retire(port, intent, retirer))

    async def _retire(self, port: _RetirePort, intent: Any, retirer: Any) -> None:
        result = await cli_apply.retire(port, intent, retirer=retirer, clock=lambda: dt(self.trial.now))
        self.trial.stats[f"human:{result.outcome.value}"] += 1
