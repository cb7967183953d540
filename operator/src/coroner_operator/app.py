"""The operator, assembled: one `Operator` per process wires the parts and lists their engines.

watch events ─▶ inputs ─▶ World (the cache)          runtime (coroner.runtime.controller):
                     └──▶ controller.enqueue ─────▶ keyed queue, timers, backoff, requeue-at
                                                          │ reconcile(key)
                     reconciler: gather facts ─▶ step (pure) ─▶ Effects ─▶ executor ─▶ API
                                                                           └─ retire protocol

The engines, one module each: `watches` (the registration watch; kopf's handlers feed the Node and
Lease watches, `handlers`), `sweeper` (periodic re-decision + the operator Lease), `permissions`
(the retire verb and the admission policies), `events` (correlated Event posting, off the reconcile
path), `leadership` (the leader elector, with --leader-elect) and `health` (/metrics, /healthz,
/readyz). `host` hands them to the process's `coroner.runtime.manager.Manager`.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import logging
import random
import time
from collections.abc import Callable, Coroutine
from typing import Any

from coroner.client.rest import Rest
from coroner.core import admission_digest
from coroner.core.decision import Policy
from coroner.core.model import Key
from coroner.core.world import World
from coroner.runtime.controller import Controller, Result, utcnow
from coroner.runtime.manager import Manager
from coroner_operator.events import EventPoster
from coroner_operator.executor import Executor
from coroner_operator.inputs import WatchInputs, report_active_deletion
from coroner_operator.kubeapi import KubeApi
from coroner_operator.leadership import Leadership
from coroner_operator.metrics import DecisionGauge, Metrics
from coroner_operator.permissions import PermissionRefresher
from coroner_operator.reconciler import Reconciler
from coroner_operator.settings import OperatorSettings
from coroner_operator.sweeper import Sweeper
from coroner_operator.watches import watch_registrations

logger = logging.getLogger("coroner.operator")

#: How long a clean shutdown waits for the Events of the retirements already written.
EVENTS_DRAIN_SECONDS = 5.0


class Operator:
    def __init__(
        self,
        *,
        world: World,
        kube: KubeApi,
        policy: Policy,
        metrics: Metrics,
        settings: OperatorSettings,
        identity: str = "unknown",
        clock: Callable[[], datetime.datetime] = utcnow,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.world = world
        self.kube = kube
        self.policy = policy
        self.metrics = metrics
        self.settings = settings
        self.identity = identity
        self.gauge = DecisionGauge(metrics)
        self.leadership = Leadership(kube=kube, settings=settings, identity=identity, metrics=metrics, gauge=self.gauge)
        self.elector = self.leadership.elector
        self.controller: Controller[Key] = Controller(
            self._reconcile,
            backoff=settings.error_backoff,
            on_failure=self._failed,
            clock=clock,
            rng=rng,
            gate=None if self.elector is None else self.elector.wait_leader,
        )
        enqueue = self.controller.enqueue
        self.events = EventPoster(
            kube=kube,
            metrics=metrics,
            burst=settings.event_burst,
            window_seconds=settings.event_window_seconds,
            backlog=settings.event_backlog,
            clock=clock,
        )
        self.permissions = PermissionRefresher(
            kube=kube,
            world=world,
            enqueue=enqueue,
            interval_seconds=settings.permission_refresh_seconds,
            system_namespace=settings.system_namespace,
            node_evidence=admission_digest.uses_node_evidence(policy),
            identity=identity,
            verified=lambda verified: metrics.admission_verified.set(1 if verified else 0),
            monotonic=monotonic,
        )
        self.executor = Executor(
            world=world,
            kube=kube,
            metrics=metrics,
            gauge=self.gauge,
            events=self.events,
            enqueue=enqueue,
            identity=identity,
            clock=clock,
        )
        self.reconciler = Reconciler(
            world=world,
            kube=kube,
            policy=policy,
            retention_seconds=settings.terminal_retention_seconds,
            executor=self.executor,
            permissions=self.permissions,
            gauge=self.gauge,
            clock=clock,
            monotonic=monotonic,
        )
        self.sweeper = Sweeper(
            world=world,
            kube=kube,
            metrics=metrics,
            gauge=self.gauge,
            policy=policy,
            enqueue=enqueue,
            drain=self.controller.drain,
            system_namespace=settings.system_namespace,
            identity=identity,
            resync_seconds=settings.resync_seconds,
            clock=clock,
            elector=self.elector,
            held_grace_seconds=settings.held_grace_seconds,
        )
        self.inputs = WatchInputs(
            world=world,
            controller=self.controller,
            executor=self.executor,
            gauge=self.gauge,
            clock=clock,
            on_deleted=functools.partial(report_active_deletion, metrics),
        )

    @property
    def is_leader(self) -> bool:
        return self.leadership.is_leader

    async def _reconcile(self, key: Key) -> Result:
        return await self.reconciler.reconcile(key)

    def _failed(self, key: Key, exc: Exception, delay: float) -> None:
        self.metrics.reconcile_errors.inc()
        self.sweeper.record_failure(key, exc)
        logger.warning("reconcile failed workerregistration=%s/%s error=%r retry_in=%ss", key[0], key[1], exc, delay)

    @property
    def last_sweep(self) -> dict[str, Any] | None:
        return self.sweeper.last_sweep

    def loops(self) -> list[Coroutine[Any, Any, None]]:
        """Every loop the operator runs but its registration watch (each forever; one ending is a bug)."""
        loops = [
            self.controller.run_timers(),
            self.permissions.run(elector=self.elector),
            self.sweeper.run(),
            self.events.run_aggregation(),
        ]
        loops += [self.controller.run_worker() for _ in range(self.settings.workers)]
        loops += [self.events.run_poster() for _ in range(self.settings.event_posters)]
        if self.elector is not None:
            loops.append(self.elector.run())
        return loops

    async def watch_registrations(self, rest: Rest) -> None:
        """The registration watch of `coroner_operator.watches`, into `inputs`, until cancelled."""
        await watch_registrations(rest, inputs=self.inputs, patterns=self.settings.namespaces)

    def host(self, manager: Manager, *, indexed: asyncio.Event) -> None:
        """Hands the operator to its process: its loops, its registration watch once `indexed` (kopf's
        Node and Lease indexes are populated), its shutdown (the Events of retirements already
        written, then the leader Lease given up) and what it closes."""
        manager.add(*self.loops())
        manager.add(self.watch_registrations(self.kube.rest), after=indexed)
        manager.on_shutdown(self.drain_events, timeout=EVENTS_DRAIN_SECONDS)
        manager.on_shutdown(self.release)
        manager.closing(self.close)

    async def drain(self) -> None:
        """Waits until the queue is empty and nothing is being reconciled (tests)."""
        await self.controller.drain()

    async def drain_events(self) -> None:
        """Waits until every Event of a retirement so far is posted (tests and shutdown)."""
        await self.events.drain()

    async def release(self) -> None:
        """A clean shutdown gives the leader Lease up, so a standby takes over at its next retry."""
        await self.leadership.release()

    def close(self) -> None:
        self.kube.close()
