"""The agent's process: watch this node's registrations, attest each incarnation, renew the Lease,
and drain on SIGTERM — around the controller runtime, in the operator's shape.

```
watch thread ──> Agent.on_event / on_relist ──> AgentCache (bodies, first looks)
pidfd readable ──> Agent.on_pidfd ─┐                 └──> runtime.Controller (keyed queue, timers,
resync (every resync_seconds) ─────┴────────────────────>   backoff, `workers` at once)
Controller ──> AgentReconciler.reconcile(key):
                 1. gather   the cached body, a probe (ProcProber), boot/host ids, the first look, now
                 2. decide   step.attest(...) -> AgentEffects   (pure)
                 3. execute  AgentExecutor.run(effects)        (the only writer; also the Lease)
```

Event-driven: a watched worker's pidfd becoming readable re-probes that registration at once; a
periodic resync re-probes everything as a safety net (and is the only path for incarnations the
agent could not pin). Up to `workers` registrations are attested at once (a mass death is probed
and written concurrently, as the operator's workers reconcile); one key is never attested twice at
once. An API error delays an attestation; it never invents one.

Time comes from `clock` (UTC; default the wall clock): every attestation's observedTime, the
confirmation window and the Lease's renewTime read it, and the runtime's timers fire by it.

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
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from coroner.client.rest import ApiError
from coroner.core import model
from coroner.core.model import Key
from coroner.core.reasons import Verdict
from coroner.runtime.blocking import ThreadPool
from coroner.runtime.controller import Controller, decorrelated_jitter, utcnow
from coroner_agent import step
from coroner_agent.cache import AgentCache
from coroner_agent.executor import AgentExecutor, AgentPort
from coroner_agent.health import AgentMetrics, HealthState
from coroner_agent.kube import AgentApi, ApiPort
from coroner_agent.reconciler import AgentReconciler, Prober

logger = logging.getLogger("coroner.agent")

__all__ = ["Agent", "AgentSettings", "DrainReport", "Prober"]

#: Retry delays of a failed attest (decorrelated jitter between the first and the last).
ATTEST_BACKOFF = (0.5, 30.0)


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
    """A death read from /proc (ProcAbsent, PidNamespaceRecreated, BootBoundary) is attested only once it is seen again this
    long after it was first seen; the attestation records both looks (firstObservedTime,
    observedTime). Must be at least the operator's Policy.absence_confirm_seconds."""
    workers: int = 8
    """Registrations attested at once (probe + attestation write): a mass death on this node costs
    about one API round-trip per `workers` deaths, not one per death."""
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


class Agent:
    """One node's agent.

    `kube` is the watch's source (its thread runs `kube.watch_registrations`); the writes go through
    `port` (default: `kube`'s calls in a thread pool, `ApiPort`). `clock` is the one source of
    time of the attestations, the confirmation window, the Lease and the runtime's timers;
    `offload` runs the prober's rescan (a listing of the whole proc root) off the event loop.
    These are the ports the simulation (tests/sim) replaces; everything else runs as shipped."""

    def __init__(
        self,
        *,
        kube: AgentApi,
        prober: Prober,
        settings: AgentSettings,
        identity: str,
        metrics: AgentMetrics | None = None,
        health: HealthState | None = None,
        clock: Callable[[], datetime.datetime] = utcnow,
        port: AgentPort | None = None,
        rng: random.Random | None = None,
        offload: Callable[[Callable[[], None]], Awaitable[None]] = asyncio.to_thread,
    ) -> None:
        if settings.workers < 1:
            raise ValueError("the agent needs at least one worker")
        self.kube = kube
        self.metrics = metrics if metrics is not None else _unexported_metrics()
        self.health = health if health is not None else HealthState(lease_duration=settings.lease_duration_seconds)
        self.prober = prober
        self.settings = settings
        self.identity = identity
        self.clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._offload = offload
        self._owned_port = (
            ApiPort(kube, blocking=ThreadPool(workers=settings.workers + 1, name="coroner-agent-api"))
            if port is None
            else None
        )
        self.port: AgentPort = port if port is not None else self._owned_port  # type: ignore[assignment]
        self.cache = AgentCache(release=lambda key: prober.forget(key=key))
        self.executor = AgentExecutor(
            port=self.port,
            cache=self.cache,
            metrics=self.metrics,
            enqueue=lambda key: self.enqueue(key),
            clock=clock,
            node_name=settings.node_name,
        )
        self.reconciler = AgentReconciler(
            cache=self.cache,
            prober=prober,
            attester=step.Attester(
                node_name=settings.node_name,
                pod_name=settings.pod_name,
                identity=identity,
                absence_confirm_seconds=settings.absence_confirm_seconds,
            ),
            executor=self.executor,
            metrics=self.metrics,
            clock=clock,
        )
        self.controller: Controller[Key] = Controller(
            self.reconciler.reconcile, backoff=ATTEST_BACKOFF, on_failure=self._failed, clock=clock, rng=self._rng
        )
        self._stop_watch = threading.Event()
        self.synced = asyncio.Event()

    @property
    def bodies(self) -> dict[Key, dict[str, Any]]:
        """This node's registrations as last seen."""
        return self.cache.bodies

    @property
    def attestations_written(self) -> int:
        return self.executor.attestations_written

    # --- inputs --------------------------------------------------------------------------------

    def enqueue(self, key: Key) -> None:
        self.controller.enqueue(key)

    def on_pidfd(self, key: Key) -> None:
        """A watched incarnation's pidfd became readable: its whole thread group exited."""
        self.enqueue(key)

    def on_relist(self, items: list[dict[str, Any]]) -> None:
        seen = set()
        for body in items:
            key = model.key_of(body)
            seen.add(key)
            self.cache.observe(key, body)
            self.enqueue(key)
        for key in set(self.cache.bodies) - seen:
            self.cache.forget(key)
        self.synced.set()
        self.health.synced = True

    def on_event(self, event_type: str, body: dict[str, Any]) -> None:
        key = model.key_of(body)
        if event_type == "DELETED":
            self.cache.forget(key)
            return
        self.cache.observe(key, body)
        self.enqueue(key)

    def _failed(self, key: Key, exc: Exception, delay: float) -> None:
        logger.warning("attest failed workerregistration=%s/%s error=%r retry_in=%.1fs", key[0], key[1], exc, delay)

    # --- background loops ----------------------------------------------------------------------

    def scrape(self) -> None:
        """Brings the gauges read from state up to date (the metrics server calls it before a scrape)."""
        self.metrics.registrations.set(len(self.cache.bodies))
        self.metrics.pidfds.set(self.prober.pidfds_held())

    async def renew_lease_once(self) -> None:
        """One renewal of the node's Lease, with this boot's and host's ids (raises on failure)."""
        await self.executor.renew_lease(
            holder=self.settings.pod_name or self.identity,
            duration=self.settings.lease_duration_seconds,
            boot_id=self.prober.boot_id(),
            host_id=self.prober.host_id(),
        )

    async def run_lease(self) -> None:
        backoff: float | None = None
        while True:
            try:
                await self.renew_lease_once()
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
            self.metrics.lease_renewed.set(self.clock().timestamp())
            self.health.renewed()
            await asyncio.sleep(self.settings.renew_seconds)

    async def resync(self, keys: set[Key] | None = None) -> None:
        """A fresh look at the node (one /proc listing, its boot id) and a re-probe of `keys` (all)."""
        await self._offload(self.prober.rescan)
        for key in list(self.cache.bodies) if keys is None else keys:
            self.enqueue(key)

    async def run_resync(self) -> None:
        while True:
            await asyncio.sleep(self.settings.resync_seconds)
            await self.resync()

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

    def loops(self) -> list[Coroutine[Any, Any, None]]:
        """Everything the agent runs besides its watch: the Lease renewal, the periodic resync, the
        runtime's timers and `settings.workers` attest workers (not started)."""
        return [self.run_lease(), self.run_resync(), *self._controller_loops()]

    def workers(self) -> list[asyncio.Task[None]]:
        """The runtime's timers and `settings.workers` attest workers, started."""
        return [asyncio.create_task(loop) for loop in self._controller_loops()]

    def _controller_loops(self) -> list[Coroutine[Any, Any, None]]:
        return [self.controller.run_timers(), *(self.controller.run_worker() for _ in range(self.settings.workers))]

    # --- shutdown ------------------------------------------------------------------------------

    def awaited(self) -> set[Key]:
        """This node's registrations that are neither terminal nor attested Dead: what a shutdown
        waits for. An unattested one counts (its first probe may be Dead or Alive); a registration
        whose spec names another node does not (this agent never speaks for it)."""
        return {key for key in self.cache.bodies if self._is_awaited(key)}

    def _is_awaited(self, key: Key) -> bool:
        body = self.cache.bodies.get(key)
        if body is None:
            return False
        registration = model.parse_registration(body)
        if registration.terminal or registration.node_name != self.settings.node_name:
            return False
        attestation = registration.attestation
        return attestation is None or attestation.verdict != Verdict.DEAD

    def _attested_dead(self, key: Key) -> bool:
        body = self.cache.bodies.get(key)
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
        cache = self.cache
        cache.dirty = set()
        try:
            pending = self.awaited()
            waited = set(pending)
            next_resync = loop.time() + self.settings.shutdown_resync_seconds
            while True:
                now = loop.time()
                if not pending or now >= deadline:
                    break
                if now >= next_resync:
                    await self.resync(set(pending))
                    next_resync = loop.time() + self.settings.shutdown_resync_seconds
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(cache.changed.wait(), timeout=min(deadline, next_resync) - now)
                cache.changed.clear()
                dirty, cache.dirty = cache.dirty, set()
                for key in dirty:
                    if self._is_awaited(key):
                        pending.add(key)
                        waited.add(key)
                    else:
                        pending.discard(key)
        finally:
            cache.dirty = None
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
        before = self.attestations_written
        await self.resync()
        try:
            await asyncio.wait_for(self.controller.drain(), timeout=timeout)
        except TimeoutError:
            logger.warning(
                "shutdown sweep timed out node=%s pending=%s", self.settings.node_name, self.controller.queue.pending
            )
        return self.attestations_written - before

    async def run(self, *, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        self.start_watch(loop)
        tasks = [asyncio.create_task(coroutine) for coroutine in self.loops()]
        try:
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
        finally:
            self._stop_watch.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._owned_port is not None:
                self._owned_port.close()


_UNEXPORTED: list[AgentMetrics] = []


def _unexported_metrics() -> AgentMetrics:
    """One shared registry for agents built without one (unit tests, the simulation): counted,
    never served."""
    if not _UNEXPORTED:
        _UNEXPORTED.append(AgentMetrics(process_collectors=False))
    return _UNEXPORTED[0]
