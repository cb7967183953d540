"""The agent, assembled: one `Agent` per process wires the parts and lists their engines, in the
operator's shape (`coroner_operator.app`).

```
watch thread, pidfd readable ──> inputs.AgentInputs ──> AgentCache (bodies, first looks)
                                             └─────────> runtime.Controller (keyed queue, timers,
resync.Resync (every resync_seconds) ───────────────────>   backoff, `workers` at once)
Controller ──> AgentReconciler.reconcile(key):
                 1. gather   the cached body, a probe (ProcProber), boot/host ids, the first look, now
                 2. decide   step.attest(...) -> AgentEffects   (pure)
                 3. execute  AgentExecutor.run(effects)        (the only writer; also the Lease)
lease.LeaseLoop (every renew_seconds) ──> AgentExecutor.renew_lease
drain.Drain (after SIGTERM): the wait for this node's live incarnations, then a final sweep
```

Event-driven: a watched worker's pidfd becoming readable re-probes that registration at once; a
periodic resync re-probes everything as a safety net (and is the only path for incarnations the
agent could not pin). Up to `workers` registrations are attested at once (a mass death is probed
and written concurrently, as the operator's workers reconcile); one key is never attested twice at
once. An API error delays an attestation; it never invents one.

Time comes from `clock` (UTC; default the wall clock): every attestation's observedTime, the
confirmation window and the Lease's renewTime read it, and the runtime's timers fire by it. The
process around it (`coroner.runtime.manager.Manager`) runs its engines, and on SIGTERM its
shutdown (`coroner_agent.drain`) before it cancels them.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from coroner.core.model import Key
from coroner.runtime.blocking import ThreadPool
from coroner.runtime.controller import Controller, utcnow
from coroner.runtime.manager import Manager
from coroner_agent import step
from coroner_agent.cache import AgentCache
from coroner_agent.drain import Drain, DrainReport
from coroner_agent.executor import AgentExecutor, AgentPort
from coroner_agent.health import AgentMetrics, HealthState
from coroner_agent.inputs import AgentInputs
from coroner_agent.kube import AgentApi, ApiPort
from coroner_agent.lease import LeaseLoop
from coroner_agent.reconciler import AgentReconciler, Prober
from coroner_agent.resync import Resync
from coroner_agent.settings import AgentSettings

logger = logging.getLogger("coroner.agent")

__all__ = ["Agent", "AgentSettings", "DrainReport", "Prober"]

#: Retry delays of a failed attest (decorrelated jitter between the first and the last).
ATTEST_BACKOFF = (0.5, 30.0)


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
        # Unserved (unit tests, the simulation): counted, never exported.
        self.metrics = metrics if metrics is not None else AgentMetrics(process_collectors=False)
        self.health = health if health is not None else HealthState(lease_duration=settings.lease_duration_seconds)
        self.prober = prober
        self.settings = settings
        self.identity = identity
        self.clock = clock
        rng = rng if rng is not None else random.Random()
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
            self.reconciler.reconcile, backoff=ATTEST_BACKOFF, on_failure=self._failed, clock=clock, rng=rng
        )
        self.inputs = AgentInputs(
            kube=kube, cache=self.cache, enqueue=self.enqueue, metrics=self.metrics, health=self.health
        )
        self.lease = LeaseLoop(
            executor=self.executor,
            prober=prober,
            metrics=self.metrics,
            health=self.health,
            node_name=settings.node_name,
            holder=settings.pod_name or identity,
            duration=settings.lease_duration_seconds,
            renew_seconds=settings.renew_seconds,
            clock=clock,
            rng=rng,
        )
        self.resync = Resync(
            cache=self.cache,
            prober=prober,
            enqueue=self.enqueue,
            interval_seconds=settings.resync_seconds,
            offload=offload,
        )
        self.drain = Drain(
            cache=self.cache,
            controller=self.controller,
            executor=self.executor,
            synced=self.inputs.synced,
            resync=self.resync.once,
            stop_watch=self.inputs.stop_watch,
            node_name=settings.node_name,
            resync_seconds=settings.shutdown_resync_seconds,
        )
        # The watch's handlers, where the simulation's watches and the tests deliver events.
        self.on_event = self.inputs.on_event
        self.on_relist = self.inputs.on_relist
        self.on_pidfd = self.inputs.on_pidfd

    def enqueue(self, key: Key) -> None:
        self.controller.enqueue(key)

    def _failed(self, key: Key, exc: Exception, delay: float) -> None:
        logger.warning("attest failed workerregistration=%s/%s error=%r retry_in=%.1fs", key[0], key[1], exc, delay)

    def scrape(self) -> None:
        """Brings the gauges read from state up to date (the metrics server calls it before a scrape)."""
        self.metrics.registrations.set(len(self.cache.bodies))
        self.metrics.pidfds.set(self.prober.pidfds_held())

    def loops(self) -> list[Coroutine[Any, Any, None]]:
        """Everything the agent runs besides its watch: the Lease renewal, the periodic resync, the
        runtime's timers and `settings.workers` attest workers (not started)."""
        return [self.lease.run(), self.resync.run(), *self._controller_loops()]

    def workers(self) -> list[asyncio.Task[None]]:
        """The runtime's timers and `settings.workers` attest workers, started."""
        return [asyncio.create_task(loop) for loop in self._controller_loops()]

    def _controller_loops(self) -> list[Coroutine[Any, Any, None]]:
        return [self.controller.run_timers(), *(self.controller.run_worker() for _ in range(self.settings.workers))]

    def host(self, manager: Manager) -> None:
        """Hands the agent to its process: its watch (started now), its engines, its shutdown (the
        wait for this node's live incarnations, then the sweep) and what it closes."""
        self.inputs.start_watch(asyncio.get_running_loop())
        manager.add(*self.loops())
        manager.on_shutdown(
            lambda: self.drain.shutdown(
                grace=self.settings.shutdown_grace_seconds, sweep_seconds=self.settings.shutdown_sweep_seconds
            )
        )
        manager.closing(self.close)

    def close(self) -> None:
        self.inputs.stop_watch()
        if self._owned_port is not None:
            self._owned_port.close()

    async def run(self, *, stop: asyncio.Event) -> None:
        manager = Manager(name="agent")
        self.host(manager)
        await manager.run(stop=stop)
