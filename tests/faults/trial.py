"""One seeded trial: workers on simulated nodes, a mix of faults, then the invariant in both directions.

A trial runs in phases on a shared `Plane`:

1. plan     workers on 2-3 nodes (survivors and victims), plus what each fault needs;
2. setup    spawn, register as the worker identity, wait until every one is attested Alive;
3. arm      each fault's pre-death part (stop an agent, revoke the grant, stall a proxy, ...);
4. strike   the victims die (SIGKILL; fault-specific deaths: forced pid reuse, zombies, 500 at once);
5. after    each fault's post-death part (API server restart, operator SIGKILL mid-write, ...);
6. observe  while the faults hold: a dead worker a fault blocks must stay active with a reason that
            fault explains; every other dead worker must be Retired within BOUND;
7. heal     each fault undone (agents healthy, grant restored, one operator, proxies passing);
8. settle   every dead worker is Retired within BOUND of the heal, unless something that is still
            true explains it (a pid still reused, a heartbeat from the future, a malformed object);
9. verify   Events and operator log lines per object, fault-specific proof that it was injected.

Throughout, an observer thread lists and then watches the trial's namespace and checks safety on
every version of every registration it is shown. The faults are in `faults.catalogue` (one module
per family), the oracles in `faults.invariants`; this module is the trial: its phases and the
helpers faults use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException

from coroner.core import api
from coroner_dev import fleet
from coroner_dev.fleet import PidNamespace, wait_child
from faults import invariants
from faults.catalogue import FAULTS, Fault
from faults.invariants import BOUND, COUNTERS, MASS_BOUND, SAFETY, provenance_problems
from faults.plane import Plane, proxied_kubeconfig
from faults.workers import Heartbeater, Worker, read_stat, register, spawn
from support import kube

MASS_COUNT = 500


@dataclasses.dataclass
class TrialResult:
    seed: int
    faults: list[str]
    labels: list[str]
    namespace: str
    seconds: float = 0.0
    counts: Counter[str] = dataclasses.field(default_factory=Counter)
    reasons: dict[str, Counter[str]] = dataclasses.field(default_factory=dict)
    evidence: dict[str, Counter[str]] = dataclasses.field(default_factory=dict)
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)
    violations: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    workers: int = 0
    deaths: int = 0
    latencies: list[float] = dataclasses.field(default_factory=list)
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    """Seconds spent in each phase (where a trial's time goes, for the long run's throughput)."""
    timeline: list[str] = dataclasses.field(default_factory=list)
    """The trial's notes, the newest last (what a failed self-test prints: a passing mutant trial
    writes no log)."""

    @property
    def ok(self) -> bool:
        return not any(self.counts[c] for c in COUNTERS)

    def summary(self) -> str:
        bad = {c: self.counts[c] for c in COUNTERS if self.counts[c]}
        return f"seed={self.seed} faults={self.labels} {self.seconds:.1f}s workers={self.workers} {bad or 'ok'}"


class Trial:
    def __init__(
        self,
        plane: Plane,
        *,
        seed: int,
        faults: list[str],
        index: int = 0,
        mass_count: int = MASS_COUNT,
        pool: list[str] | None = None,
        bound: float = BOUND,
        mass_bound: float = MASS_BOUND,
        shared_round: Any = None,
    ) -> None:
        self.plane = plane
        self.shared_round = shared_round
        """A `runner.Round` when this trial shares its cluster-wide fault with other lanes' trials."""
        self.bound = bound
        self.mass_bound = mass_bound
        self.seed = seed
        self.rng = random.Random(seed)
        self.namespace = f"ft{index}-{seed % 100000}-{os.urandom(2).hex()}"
        self.mass_count = mass_count
        self.workers: list[Worker] = []
        self.by_name: dict[str, Worker] = {}
        self.pidns: dict[str, PidNamespace] = {}
        self.rogue_pods: set[str] = set()
        self.grant_revoked: tuple[float, float | None] | None = None
        self.timeline: list[str] = []
        self.started = time.monotonic()
        self.armed_at = 0.0
        self._latest: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._stale_seen: set[tuple[str, str]] = set()
        self.cleanups: list[Callable[[], None]] = []
        """Undone when the trial ends however it ends (proxy gates, taps, rewrites)."""
        node_names = list(pool or plane.agents)
        self.pool = node_names
        unknown = [f for f in faults if f.partition(":")[0] not in FAULTS]
        if unknown:
            raise ValueError(f"unknown faults {unknown}; known: {sorted(FAULTS)}")
        local = [f for f in faults if FAULTS[f.partition(":")[0]].node_local]
        count = max(len(local), self.rng.choice([2, 3]) if len(node_names) >= 3 else 2)
        if len(local) > len(node_names):
            raise ValueError(f"{len(local)} node-local faults need as many nodes; the plane has {len(node_names)}")
        self.nodes = self.rng.sample(node_names, k=min(count, len(node_names)))
        free = list(self.nodes)
        self.rng.shuffle(free)
        self.faults: list[Fault] = []
        for spec in faults:
            name, _, variant = spec.partition(":")
            node = free.pop() if FAULTS[name].node_local else None
            self.faults.append(FAULTS[name](self, random.Random(self.rng.getrandbits(32)), node, variant or None))
        self.result = TrialResult(seed=seed, faults=list(faults), labels=[], namespace=self.namespace)

    # --- helpers used by faults ------------------------------------------------------------------

    def note(self, text: str) -> None:
        self.timeline.append(f"{time.monotonic() - self.started:7.2f}s {text}")

    def add(
        self,
        node: str | None,
        kind: str,
        *,
        victim: bool,
        tag: str,
        generic: bool = True,
        interval: int | None = None,
        ttl: int | None = None,
        heartbeating: bool = True,
        client_instance_id: str | None = None,
    ) -> Worker:
        node = node or self.rng.choice(self.nodes)
        interval = interval or self.interval
        w = Worker(
            name=f"{tag}-{len(self.workers)}".replace("_", "-").lower(),
            node=node,
            kind=kind,
            victim=victim,
            interval=interval,
            ttl=ttl or 3 * interval,
            heartbeating=heartbeating,
        )
        w.tags.add(tag)
        w.generic = generic
        w.client_instance_id = client_instance_id
        self.workers.append(w)
        self.by_name[w.name] = w
        return w

    def dead_on(self, node: str) -> list[Worker]:
        return [w for w in self.tracked() if w.node == node and w.dead]

    def together(self, key: str, contribution: Any, action: Callable[[list[Any]], Any]) -> Any:
        """`action(contributions)` once for the whole shared round (every trial's contribution), or
        for this trial alone when it is in no round; returns its result to each."""
        if self.shared_round is None:
            return action([contribution])
        self.note(f"round: waiting for the other trials at {key}")
        return self.shared_round.together(key, contribution, action)

    def tracked(self) -> list[Worker]:
        """The workers whose registrations the trial judges (not those a fault deleted)."""
        return [w for w in self.workers if not w.forgotten]

    def get(self, name: str) -> dict[str, Any] | None:
        """The registration now, by the admin (None: not found)."""
        try:
            return kube.get_registration(self.plane.admin, self.namespace, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def reregister(self, old: Worker, *, victim: bool, tag: str) -> Worker:
        """Deletes `old`'s registration and registers a new `sleep` on the same node under the same
        name (a new incarnation, a new uid): from now on the name is the new worker's."""
        plane = self.plane
        custom = kube.custom(plane.admin)
        plane.retry(
            lambda: custom.delete_namespaced_custom_object(api.GROUP, api.VERSION, self.namespace, api.PLURAL, old.name)
        )
        if not self.wait(lambda: self.get(old.name) is None, 30):
            raise RuntimeError(f"{old.name} was not deleted within 30 s")
        new = Worker(name=old.name, node=old.node, kind="sleep", victim=victim, interval=old.interval, ttl=old.ttl)
        new.generic = False
        new.tags.add(tag)
        spawn(new)
        new.registered_boot = plane.agents[new.node].boot_id
        with self._lock:
            old.forgotten = True
            old.heartbeating = False
            self.workers.append(new)
            self.by_name[new.name] = new
            self._latest.pop(new.name, None)
        plane.retry(
            lambda: register(
                new, client=plane.worker_client, namespace=self.namespace, boot_id_file=plane.agents[new.node].boot_file
            ),
            attempts=5,
        )
        self.note(f"{old.name} deleted and registered again: pid {new.host_pid} (was {old.host_pid})")
        return new

    def latest(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._latest.get(name)

    def refusals(
        self, attempts: list[tuple[str, Callable[[], Any]]], *, statuses: tuple[int, ...] = (403,)
    ) -> tuple[int, list[str]]:
        """Runs writes that admission must refuse; any that succeeds is an admission breach."""
        refused, accepted = 0, []
        for what, call in attempts:
            try:
                call()
            except ApiException as exc:
                if exc.status in statuses:
                    refused += 1
                    continue
                accepted.append(f"{what}: unexpected status {exc.status}")
                continue
            accepted.append(what)
            self.violation("admission_breaches", None, f"admission accepted: {what}")
        return refused, accepted

    def violation(self, counter: str, w: Worker | None, detail: str) -> None:
        self.result.counts[counter] += 1
        self.note(f"VIOLATION {counter}: {detail}")
        if len(self.result.violations) < 50:
            self.result.violations.append(
                {
                    "counter": counter,
                    "worker": w.name if w else None,
                    "detail": detail,
                    "seed": self.seed,
                    "faults": self.result.labels,
                }
            )

    # --- the observer: safety on every retirement it sees ----------------------------------------

    def refresh(self) -> None:
        self.plane.retry(lambda: invariants.observe_once(self), attempts=20)

    def reason(self, w: Worker) -> str | None:
        obj = self.latest(w.name) or {}
        for c in (obj.get("status") or {}).get("conditions") or []:
            if c.get("type") == "Retirable":
                return str(c.get("reason"))
        return None

    def attested(self, w: Worker) -> dict[str, Any]:
        return dict(((self.latest(w.name) or {}).get("status") or {}).get("attestation") or {})

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.1)
        return predicate()

    # --- phases ----------------------------------------------------------------------------------

    def run(self) -> TrialResult:
        started = time.monotonic()
        self.interval = self.rng.choice([1, 2])
        heartbeater: Heartbeater | None = None
        observer = threading.Thread(
            target=invariants.observer, args=(self,), name=f"observe-{self.namespace}", daemon=True
        )
        mark = [started]

        def phase(name: str) -> None:
            now = time.monotonic()
            self.result.phases[name] = self.result.phases.get(name, 0.0) + now - mark[0]
            mark[0] = now

        try:
            self.plane.create_trial_namespace(self.namespace)
            self._plan()
            self.result.labels = [f.label or f.name for f in self.faults] or ["none"]
            self.note(f"plan: nodes={self.nodes} faults={self.result.labels} workers={len(self.workers)}")
            phase("namespace+plan")
            self._setup()
            phase("setup")
            heartbeater = Heartbeater(client=self.plane.worker_client, namespace=self.namespace, workers=self.workers)
            heartbeater.start()
            observer.start()
            self._wait_alive()
            phase("wait_alive")
            self.armed_at = time.time()
            for f in self.faults:
                self.note(f"arm {f.label}")
                f.arm()
            self.note("strike")
            for f in self.faults:
                f.strike()
            for w in self.workers:
                if w.victim and w.generic and not w.dead:
                    w.kill()
            for f in self.faults:
                self.note(f"after {f.label}")
                f.after()
            phase("arm+strike+after")
            invariants.observe_phase(self)
            phase("observe")
            for f in reversed(self.faults):
                self.note(f"heal {f.label}")
                f.heal()
            self._heal_plane()
            phase("heal")
            invariants.settle(self)
            phase("settle")
            for f in self.faults:
                f.verify()
                if f.failures:
                    for failure in f.failures:
                        self.violation("not_injected", None, f"{f.label}: {failure}")
                self.result.facts[f.label] = f.facts
            invariants.verify_history(self)
            phase("verify")
        finally:
            self._stop.set()
            if heartbeater is not None:
                heartbeater.stop()
            for cleanup in self.cleanups:
                with contextlib.suppress(Exception):
                    cleanup()
            if self.shared_round is not None:
                self.shared_round.leave()
            with contextlib.suppress(Exception):
                self._heal_plane()
            self.plane.delete_trial_namespace(self.namespace)
            for w in self.workers:
                w.close()
            for ns in self.pidns.values():
                ns.close()
            if observer.is_alive():
                observer.join(timeout=30)
            phase("cleanup")
            self.result.seconds = time.monotonic() - started
            self.result.workers = len(self.workers)
            self.result.deaths = sum(1 for w in self.workers if w.dead)
            self.result.timeline = self.timeline[-60:]
            if not self.result.ok:
                log = self.plane.work / f"trial-{self.namespace}.log"
                log.write_text("\n".join(self.timeline) + "\n" + json.dumps(self.result.violations, indent=1) + "\n")
                self.result.facts["timeline"] = str(log)
        return self.result

    def _plan(self) -> None:
        for node in self.nodes:
            for _ in range(self.rng.randint(1, 2)):
                self.add(node, self.rng.choice(["sleep", "sleep", "pidns"]), victim=False, tag="live")
            for _ in range(self.rng.randint(1, 2)):
                self.add(node, self.rng.choice(["sleep", "sleep", "pidns"]), victim=True, tag="victim")
        for f in self.faults:
            f.plan()

    def _setup(self) -> None:
        plane = self.plane
        for w in self.workers:
            agent = plane.agents[w.node]
            w.registered_boot = agent.boot_id
            if w.kind == "launcher":
                self._launch(w)
                continue
            pidns = None
            if w.kind == "pidns":
                pidns = self.pidns.get(w.node) or self.pidns.setdefault(w.node, PidNamespace())
            spawn(w, pidns=pidns)
        bulk = [w for w in self.workers if w.kind != "launcher"]

        def reg(w: Worker) -> None:
            plane.retry(
                lambda: register(
                    w,
                    client=plane.worker_client,
                    namespace=self.namespace,
                    boot_id_file=plane.agents[w.node].boot_file,
                    client_instance_id=w.client_instance_id,
                ),
                attempts=5,
            )
            if not w.heartbeating:
                return  # mass workers: no heartbeat history to check, and 500 fewer reads
            body = kube.get_registration(plane.admin, self.namespace, w.name)
            beat = (body.get("status") or {}).get("lastHeartbeatTime")
            if beat:
                w.heartbeats.append((beat, int(body["metadata"]["resourceVersion"])))

        if len(bulk) > 40:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=6) as pool:
                list(pool.map(reg, bulk))
        else:
            for w in bulk:
                reg(w)

    def _launch(self, w: Worker) -> None:
        plane = self.plane
        w.proc = fleet.run_worker(
            namespace=self.namespace,
            node=plane.agents[w.node].node,
            name=w.name,
            kubeconfig=plane.worker_kubeconfig,
            log=plane.work / f"launcher-{self.namespace}-{w.name}.log",
            command=("sleep", "3600"),
            heartbeat=(w.interval, w.ttl),
        )
        w.host_pid = wait_child(w.proc.pid, timeout=60)
        stat = read_stat(w.host_pid)
        assert stat is not None
        w.start_time = stat[1]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(ApiException):
                body = kube.get_registration(plane.admin, self.namespace, w.name)
                w.incarnation = body["spec"]["incarnation"]
                if int(w.incarnation["pid"]) != w.host_pid or int(w.incarnation["startTime"]) != w.start_time:
                    raise RuntimeError(f"launcher registered {w.incarnation}, not pid {w.host_pid}")
                w.registered = True
                w.pin()
                return
            time.sleep(0.1)
        raise RuntimeError(f"the launcher of {w.name} did not register within 60 s")

    def _wait_alive(self) -> None:
        timeout = 60.0 + len(self.workers) * 0.2

        def all_alive() -> bool:
            for w in self.workers:
                a = self.attested(w)
                if a.get("verdict") != "Alive" or (a.get("agent") or {}).get("nodeName") != w.node:
                    return False
            return True

        if not self.wait(all_alive, timeout):
            missing = [w.name for w in self.workers if self.attested(w).get("verdict") != "Alive"]
            raise RuntimeError(f"workers not attested Alive within {timeout:.0f} s: {missing[:10]}")
        self.note("all workers attested Alive")

    def _heal_plane(self) -> None:
        plane = self.plane
        for name in self.pool:  # only this trial's nodes: other lanes' trials own theirs
            plane.agents[name].ensure_healthy()
        plane.operator_proxy.set_mode("pass")
        plane.ensure_one_operator()
        if self.grant_revoked is not None and self.grant_revoked[1] is None:
            self.grant_revoked = (self.grant_revoked[0], time.time())
        plane.restore_grant()


__all__ = [
    "BOUND",
    "COUNTERS",
    "FAULTS",
    "MASS_BOUND",
    "MASS_COUNT",
    "SAFETY",
    "Trial",
    "TrialResult",
    "provenance_problems",
    "proxied_kubeconfig",
]
