"""The agent's loop: watch this node's registrations, probe each incarnation, attest what it finds.

Event-driven: a watched worker's pidfd becoming readable re-probes that registration at once; a
periodic resync re-probes everything as a safety net (and is the only path for incarnations the
agent could not pin). An API error delays an attestation; it never invents one.

On SIGTERM (the node is draining or shutting down, or the pod is replaced) the agent does not stop
at once: it keeps serving exactly as before — registration watch, pidfd events, Lease renewal,
attest workers, plus a faster resync of what it waits for — until every registration of its node
that is neither attested Dead nor terminal has been resolved, or `shutdown_grace_seconds` have
passed, whichever is first. Each exit is attested as it happens. Then one final sweep re-probes
everything and the agent exits. Nothing alive: it goes straight to the sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import random
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol

from coroner.client.rest import ApiError
from coroner.core import api, model, wire
from coroner.core.model import Key
from coroner.core.reasons import Evidence, Verdict
from coroner.core.world import slim
from coroner.runtime.controller import decorrelated_jitter
from coroner.runtime.workqueue import KeyedQueue
from coroner_agent.health import AgentMetrics, HealthState
from coroner_agent.kube import AgentApi
from coroner_agent.verdict import ProbeResult

logger = logging.getLogger("coroner.agent")


class Prober(Protocol):
    """The probes, injected so every branch of the loop is testable without real processes."""

    def boot_id(self) -> str | None: ...
    def host_id(self) -> str: ...
    def rescan(self) -> None: ...
    def probe(self, *, key: Key, registration: model.Registration) -> ProbeResult: ...
    def forget(self, *, key: Key) -> None: ...
    def pidfds_held(self) -> int: ...


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AgentSettings:
    node_name: str
    pod_name: str = ""
    lease_duration_seconds: int = 30
    """How long the node Lease stays valid without renewal (the operator's AgentUnavailable bound)."""
    renew_seconds: float = 10.0
    resync_seconds: float = 30.0
    """Full re-probe of every registration of this node (the safety net under pidfd events)."""
    absence_confirm_seconds: float = 10.0
    """A death read from /proc (ProcAbsent, BootBoundary) is attested only once it is seen again this
    long after it was first seen; the attestation records both looks (firstObservedTime,
    observedTime). Must be at least the operator's Policy.absence_confirm_seconds."""
    workers: int = 4
    shutdown_grace_seconds: float = 40.0
    """On SIGTERM, how long to keep serving while waiting for this node's registrations that are not
    attested Dead (nor terminal) to be resolved. With `shutdown_sweep_seconds` it must fit in the
    pod's terminationGracePeriodSeconds (manifests/base/agent.yaml: 60 = 40 + 15 + 5 to spare)."""
    shutdown_sweep_seconds: float = 15.0
    """Bound of the final sweep after the wait."""
    shutdown_resync_seconds: float = 2.0
    """While waiting, re-probe what is waited for this often: the deaths of incarnations the agent
    could not pin are otherwise found only by the (30 s) resync."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DrainReport:
    """What the wait after SIGTERM saw (one log line)."""

    waited: int
    """Registrations of this node waited for: not attested Dead and not terminal, at any time."""
    attested: int
    """Of those, attested Dead by the time the wait ended."""
    resolved_otherwise: int
    """Of those, terminal without a Dead attestation (Released, retired) or deleted."""
    still_alive: int
    """Of those, still neither attested Dead nor terminal when the wait ended (grace ran out)."""
    seconds: float


#: Deaths read from /proc: attested only once seen twice, `absence_confirm_seconds` apart.
CONFIRMED_EVIDENCE = frozenset({Evidence.PROC_ABSENT.value, Evidence.BOOT_BOUNDARY.value})
#: What each look says of the incarnation: a pid number held by another process (StartTimeDiffers)
#: and a number held by nobody (ProcAbsent) are both looks at an incarnation that is not there.
_ABSENCE = {
    Evidence.PROC_ABSENT.value: "absent",
    Evidence.START_TIME_DIFFERS.value: "absent",
    Evidence.BOOT_BOUNDARY.value: "boot-over",
}


def needs_write(current: model.Attestation | None, new: dict[str, Any], *, last_heartbeat_raw: str | None) -> bool:
    """Level-based: write only what changes the record — never a periodic refresh (a write per worker
    per period would make the cost grow with workers, not nodes).

    A verdict is current while the agent's Lease is live on the boot it attested from, so nothing
    is rewritten to keep it fresh: an Alive is written once when the incarnation is pinned, a Dead
    once when it is seen."""
    if current is None:
        return True
    if (
        str(current.verdict) != new["verdict"]
        or str(current.evidence) != new["evidence"]
        or current.boot_id != new["bootId"]
        or current.host_id != new["hostId"]
        or current.agent_node != new["agent"]["nodeName"]
        or _recorded_incarnation(current) != new["incarnation"]
    ):
        return True
    if new["verdict"] == Verdict.DEAD.value and current.heartbeat_seen != (last_heartbeat_raw or ""):
        return True  # an opted-in heartbeat landed after the Dead attestation: confirm with what is seen now
    # A confirmed death over one recorded without its first look (an older agent's): say both.
    return "firstObservedTime" in new and current.first_observed_time is None


def _recorded_incarnation(attestation: model.Attestation) -> dict[str, object]:
    """The incarnation an attestation recorded, exactly as stored."""
    recorded = attestation.raw.get("incarnation")
    return dict(recorded) if isinstance(recorded, Mapping) else {}


class Agent:
    """One node's agent."""

    def __init__(
        self,
        *,
        kube: AgentApi,
        prober: Prober,
        settings: AgentSettings,
        identity: str,
        metrics: AgentMetrics | None = None,
        health: HealthState | None = None,
    ) -> None:
        self.kube = kube
        self.metrics = metrics if metrics is not None else _unexported_metrics()
        self.health = health if health is not None else HealthState(lease_duration=settings.lease_duration_seconds)
        self.prober = prober
        self.settings = settings
        self.identity = identity
        self.bodies: dict[Key, dict[str, Any]] = {}
        self._queue: KeyedQueue[Key] = KeyedQueue()
        self._failures: dict[Key, int] = {}
        self._stop_watch = threading.Event()
        self.attestations_written = 0
        self.synced = asyncio.Event()
        self._changed = asyncio.Event()
        """Set whenever a registration body changes or goes: what the shutdown wait waits on."""
        self._dirty: set[Key] | None = None
        """During the shutdown wait: the keys changed since it last looked (None: not waiting)."""
        self._first_seen: dict[Key, tuple[str, datetime.datetime]] = {}
        """Deaths read from /proc awaiting their confirming look: key -> (evidence, first seen)."""
        self._built: dict[Key, dict[str, Any]] = {}
        """What `attestation_for` built a key's attestation from, until `_confirmed` (called right after
        it) takes it to rebuild the attestation with its first look (wire.attestation_body(first_observed=))."""
        self._rng = random.Random()

    # --- inputs --------------------------------------------------------------------------------

    def enqueue(self, key: Key) -> None:
        self._queue.put(key)

    def on_pidfd(self, key: Key) -> None:
        """A watched incarnation's pidfd became readable: its whole thread group exited."""
        self.enqueue(key)

    def on_relist(self, items: list[dict[str, Any]]) -> None:
        seen = set()
        for body in items:
            key = model.key_of(body)
            seen.add(key)
            self.bodies[key] = slim(body)
            self.enqueue(key)
        for key in set(self.bodies) - seen:
            self._forget(key)
        self.synced.set()
        self.health.synced = True
        self._touched(*seen)

    def on_event(self, event_type: str, body: dict[str, Any]) -> None:
        key = model.key_of(body)
        if event_type == "DELETED":
            self._forget(key)
            return
        self.bodies[key] = slim(body)
        self.enqueue(key)
        self._touched(key)

    def _forget(self, key: Key) -> None:
        self.bodies.pop(key, None)
        self._first_seen.pop(key, None)
        self._built.pop(key, None)
        self.prober.forget(key=key)
        self._touched(key)

    def _touched(self, *keys: Key) -> None:
        if self._dirty is not None:
            self._dirty.update(keys)
        self._changed.set()

    # --- the attest step -----------------------------------------------------------------------

    def attestation_for(self, key: Key, body: dict[str, Any]) -> tuple[model.Registration, dict[str, Any]] | None:
        registration = model.parse_registration(body)
        if registration.terminal:
            self.prober.forget(key=key)
            self._first_seen.pop(key, None)
            return None
        if registration.node_name != self.settings.node_name:
            # The label selector said this node; the spec disagrees. Never speak for another node.
            outcome = ProbeResult(
                verdict=Verdict.UNKNOWN,
                evidence=Evidence.FOREIGN_NODE,
                detail=f"spec.nodeName is {registration.node_name!r}, this agent serves {self.settings.node_name!r}",
            )
        else:
            started = time.perf_counter()
            outcome = self.prober.probe(key=key, registration=registration)
            self.metrics.probe_seconds.observe(time.perf_counter() - started)
        built: dict[str, Any] = {
            "registration": registration,
            "verdict": outcome.verdict,
            "evidence": outcome.evidence,
            "detail": outcome.detail,
            "boot_id": self.prober.boot_id(),
            "host_id": self.prober.host_id(),
            "now": datetime.datetime.now(datetime.UTC),
            "agent_node": self.settings.node_name,
            "agent_pod": self.settings.pod_name,
            "agent_identity": self.identity,
        }
        self._built[key] = built
        return registration, wire.attestation_body(**built)

    async def attest(self, key: Key) -> None:
        body = self.bodies.get(key)
        if body is None:
            return
        prepared = self.attestation_for(key, body)
        if prepared is None:
            return
        registration, attestation = prepared
        if not self._confirmed(key, attestation):
            return
        if not needs_write(registration.attestation, attestation, last_heartbeat_raw=registration.last_heartbeat_raw):
            return
        try:
            written = await asyncio.to_thread(self.kube.write_attestation, body, attestation)
        except Exception as exc:
            self.metrics.api_error("attestation", exc)
            if not isinstance(exc, ApiError):
                raise
            if exc.status in (409, 422):
                # What the probe relied on moved (a heartbeat landed): read again, probe again.
                try:
                    fresh = await asyncio.to_thread(self.kube.get_registration, key[0], key[1])
                except Exception as read_exc:
                    self.metrics.api_error("read", read_exc)
                    raise
                if fresh is None:
                    self._forget(key)
                else:
                    self.bodies[key] = slim(fresh)
                    self.enqueue(key)
                return
            if exc.status == 404:
                self._forget(key)
                return
            raise
        self.bodies[key] = slim(written)
        self.attestations_written += 1
        self.metrics.attestations.labels(attestation["verdict"], attestation["evidence"]).inc()
        self._touched(key)
        logger.info(
            "attested workerregistration=%s/%s verdict=%s evidence=%s pid=%s node=%s",
            key[0],
            key[1],
            attestation["verdict"],
            attestation["evidence"],
            registration.incarnation.pid,
            self.settings.node_name,
        )

    def _confirmed(self, key: Key, attestation: dict[str, Any]) -> bool:
        """Whether `attestation` may be written now; a death read from /proc needs a second look.

        The first sighting is only remembered and the registration re-probed after the window; if
        it is still Dead by the same evidence then, the attestation carries both looks. A Reused
        sighting counts as a first look at the same absence (the number was held by another
        process, so this incarnation was already gone), which keeps a reuser's exit as fast as a
        death. Anything else seen in between starts over. A pidfd's readability is the kernel's
        word: no wait."""
        built = self._built.pop(key, None)
        evidence = attestation["evidence"]
        look = _ABSENCE.get(evidence) if attestation["verdict"] in (Verdict.DEAD.value, Verdict.REUSED.value) else None
        if look is None:
            self._first_seen.pop(key, None)
            return True
        now = model.parse_time(attestation["observedTime"])
        assert now is not None
        seen = self._first_seen.get(key)
        if seen is None or seen[0] != look:
            seen = self._first_seen[key] = (look, now)
        if evidence not in CONFIRMED_EVIDENCE:
            return True  # Reused is written as it is seen; it is only the first look at an absence
        window = datetime.timedelta(seconds=self.settings.absence_confirm_seconds)
        remaining = (seen[1] + window - now).total_seconds()
        if remaining > 0:
            asyncio.get_running_loop().call_later(remaining, self.enqueue, key)
            return False
        if built is None:
            raise RuntimeError("_confirmed follows attestation_for of the same key")
        attestation.update(wire.attestation_body(**built, first_observed=seen[1]))
        return True

    async def run_worker(self) -> None:
        while True:
            key = await self._queue.get()
            try:
                await self.attest(key)
                self._failures.pop(key, None)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                attempt = self._failures.get(key, 0)
                self._failures[key] = attempt + 1
                delay = min(30.0, 0.5 * 2**attempt)
                logger.warning(
                    "attest failed workerregistration=%s/%s error=%r retry_in=%.1fs", key[0], key[1], exc, delay
                )
                asyncio.get_running_loop().call_later(delay, self.enqueue, key)
            finally:
                self._queue.done(key)

    # --- background loops ----------------------------------------------------------------------

    def scrape(self) -> None:
        """Brings the gauges read from state up to date (the metrics server calls it before a scrape)."""
        self.metrics.registrations.set(len(self.bodies))
        self.metrics.pidfds.set(self.prober.pidfds_held())

    async def run_lease(self) -> None:
        backoff: float | None = None
        while True:
            boot_id = self.prober.boot_id()
            annotations = {
                api.AGENT_LEASE_BOOT_ID: boot_id or "",
                api.AGENT_LEASE_HOST_ID: self.prober.host_id(),
            }
            try:
                await asyncio.to_thread(
                    self.kube.renew_lease,
                    holder=self.settings.pod_name or self.identity,
                    duration=self.settings.lease_duration_seconds,
                    annotations=annotations,
                )
            except Exception as exc:
                self.metrics.lease_renewal_failures.inc()
                self.metrics.api_error("lease", exc)
                # Jittered (decorrelated, 1 s up to the renew period): after an API server restart the
                # agents of a cluster do not retry in lockstep.
                backoff = decorrelated_jitter(
                    self._rng,
                    base=min(1.0, self.settings.renew_seconds),
                    cap=self.settings.renew_seconds,
                    previous=backoff,
                )
                if isinstance(exc, ApiError):
                    logger.warning("lease renewal failed node=%s status=%s", self.settings.node_name, exc.status)
                else:
                    logger.warning("lease renewal failed node=%s error=%r", self.settings.node_name, exc)
                await asyncio.sleep(backoff)
                continue
            backoff = None
            self.metrics.lease_renewals.inc()
            self.metrics.lease_renewed.set(time.time())
            self.health.renewed()
            await asyncio.sleep(self.settings.renew_seconds)

    async def run_resync(self) -> None:
        while True:
            await asyncio.sleep(self.settings.resync_seconds)
            await asyncio.to_thread(self.prober.rescan)
            for key in list(self.bodies):
                self.enqueue(key)

    def start_watch(self, loop: asyncio.AbstractEventLoop) -> threading.Thread:
        thread = threading.Thread(
            target=self.kube.watch_registrations,
            kwargs={
                "loop": loop,
                "on_event": self.on_event,
                "on_relist": self.on_relist,
                "stop": self._stop_watch,
                "on_error": self.metrics.api_error,
            },
            name="watch-registrations",
            daemon=True,
        )
        thread.start()
        return thread

    # --- shutdown ------------------------------------------------------------------------------

    def awaited(self) -> set[Key]:
        """This node's registrations that are neither terminal nor attested Dead: what a shutdown
        waits for. An unattested one counts (its first probe may be Dead or Alive); a registration
        whose spec names another node does not (this agent never speaks for it)."""
        return {key for key in self.bodies if self._is_awaited(key)}

    def _is_awaited(self, key: Key) -> bool:
        body = self.bodies.get(key)
        if body is None:
            return False
        registration = model.parse_registration(body)
        if registration.terminal or registration.node_name != self.settings.node_name:
            return False
        attestation = registration.attestation
        return attestation is None or attestation.verdict != Verdict.DEAD

    def _attested_dead(self, key: Key) -> bool:
        body = self.bodies.get(key)
        if body is None:
            return False
        attestation = model.parse_registration(body).attestation
        return attestation is not None and attestation.verdict == Verdict.DEAD

    async def drain(self, *, grace: float) -> DrainReport:
        """After SIGTERM: keep serving until nothing is awaited or `grace` seconds have passed.

        Everything else keeps running meanwhile (watch, pidfd events, workers, Lease); this only
        watches the outcome — incrementally, re-reading only the registrations that changed, so a
        mass death on a large node costs O(changes), not O(registrations) per change — and
        re-probes what it waits for every `shutdown_resync_seconds`.
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + max(0.0, grace)
        if not self.synced.is_set():
            # Not listed yet: nothing is known to wait for. Wait for the list within the grace.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.synced.wait(), timeout=max(0.0, deadline - loop.time()))
        self._dirty = set()
        try:
            pending = self.awaited()
            waited = set(pending)
            next_resync = loop.time() + self.settings.shutdown_resync_seconds
            while True:
                now = loop.time()
                if not pending or now >= deadline:
                    break
                if now >= next_resync:
                    await asyncio.to_thread(self.prober.rescan)
                    for key in pending:
                        self.enqueue(key)
                    next_resync = loop.time() + self.settings.shutdown_resync_seconds
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), timeout=min(deadline, next_resync) - now)
                self._changed.clear()
                dirty, self._dirty = self._dirty, set()
                for key in dirty:
                    if self._is_awaited(key):
                        pending.add(key)
                        waited.add(key)
                    else:
                        pending.discard(key)
        finally:
            self._dirty = None
        attested = sum(1 for key in waited - pending if self._attested_dead(key))
        return DrainReport(
            waited=len(waited),
            attested=attested,
            resolved_otherwise=len(waited - pending) - attested,
            still_alive=len(pending),
            seconds=loop.time() - started,
        )

    async def shutdown_sweep(self, *, timeout: float) -> int:
        """Before the node goes: re-probe everything and attest what can be confirmed."""
        self._stop_watch.set()
        await asyncio.to_thread(self.prober.rescan)
        before = self.attestations_written
        for key in list(self.bodies):
            self.enqueue(key)
        try:
            await asyncio.wait_for(self._queue.join(), timeout=timeout)
        except TimeoutError:
            logger.warning("shutdown sweep timed out node=%s pending=%s", self.settings.node_name, self._queue.pending)
        return self.attestations_written - before

    async def run(self, *, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        self.start_watch(loop)
        tasks = [asyncio.create_task(self.run_lease()), asyncio.create_task(self.run_resync())]
        tasks += [asyncio.create_task(self.run_worker()) for _ in range(self.settings.workers)]
        await stop.wait()
        # Everything keeps running through the wait and the sweep; the lease is renewed until the end.
        logger.info(
            "shutdown: waiting for this node's live incarnations node=%s grace=%.1fs",
            self.settings.node_name,
            self.settings.shutdown_grace_seconds,
        )
        report = await self.drain(grace=self.settings.shutdown_grace_seconds)
        logger.info(
            "shutdown wait done node=%s waited=%d attested=%d resolvedOtherwise=%d stillAlive=%d seconds=%.2f",
            self.settings.node_name,
            report.waited,
            report.attested,
            report.resolved_otherwise,
            report.still_alive,
            report.seconds,
        )
        written = await self.shutdown_sweep(timeout=self.settings.shutdown_sweep_seconds)
        logger.info("shutdown sweep done node=%s attestations=%s", self.settings.node_name, written)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


_UNEXPORTED: list[AgentMetrics] = []


def _unexported_metrics() -> AgentMetrics:
    """One shared registry for agents built without one (unit tests, the simulation): counted,
    never served."""
    if not _UNEXPORTED:
        _UNEXPORTED.append(AgentMetrics(process_collectors=False))
    return _UNEXPORTED[0]
