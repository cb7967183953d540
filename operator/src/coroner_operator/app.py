"""The operator, assembled: one `Operator` per process wires the parts and lists their loops.

watch events ─▶ inputs ─▶ World (the cache)          runtime (coroner.runtime.controller):
                     └──▶ controller.enqueue ─────▶ keyed queue, timers, backoff, requeue-at
                                                          │ reconcile(key)
                     reconciler: gather facts ─▶ step (pure) ─▶ Effects ─▶ executor ─▶ API
                                                                           └─ retire protocol
services: sweeper (periodic re-decision + the operator Lease), permission refresher (the retire
          verb and the admission policies),
          Event poster (correlated, off the reconcile path), leader elector (with --leader-elect)

Under leader election every replica watches and keeps its cache (World), queue and permission
answers warm; only the leader's workers reconcile (the runtime's gate) and only the leader sweeps,
so retirements, deletions, condition writes and Events come from one replica at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import fnmatch
import logging
import random
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from coroner.client.rest import Rest, registrations_path
from coroner.core import admission_digest, api, model
from coroner.core.decision import Policy
from coroner.core.model import Key
from coroner.core.world import World, trimmed
from coroner.runtime.controller import Controller, Result, utcnow
from coroner.runtime.leader import LeaderElector
from coroner.runtime.watch import Handoff, reflect
from coroner_operator.collector import ListingPause
from coroner_operator.events import EventPoster
from coroner_operator.executor import Executor
from coroner_operator.inputs import WatchInputs
from coroner_operator.kubeapi import KubeApi
from coroner_operator.metrics import DecisionGauge, Metrics
from coroner_operator.permissions import PermissionRefresher
from coroner_operator.reconciler import Reconciler
from coroner_operator.settings import OperatorSettings
from coroner_operator.sweeper import Sweeper

logger = logging.getLogger("coroner.operator")


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
        self.elector: LeaderElector | None = None
        if settings.leader_election is not None:
            self.elector = LeaderElector(
                store=kube,
                namespace=settings.system_namespace,
                name=api.OPERATOR_LEASE,
                identity=settings.leader_identity or identity,
                config=settings.leader_election,
                on_change=self._leading,
            )
            metrics.leader.set(0)
        else:
            metrics.leader.set(1)
        self.controller: Controller[Key] = Controller(
            self._reconcile,
            backoff=settings.error_backoff,
            on_failure=self._failed,
            clock=clock,
            rng=rng,
            gate=None if self.elector is None else self.elector.wait_leader,
        )
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
            enqueue=self.controller.enqueue,
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
            enqueue=self.controller.enqueue,
            identity=identity,
            clock=clock,
            monotonic=monotonic,
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
            enqueue=self.controller.enqueue,
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
            on_deleted=self.observe_deletion,
        )

    @property
    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader

    def _leading(self, leading: bool) -> None:
        self.metrics.leader.set(1 if leading else 0)
        if not leading:
            # The decision gauges are the leader's: a replica that stopped leading stops reporting
            # them, so `sum(coroner_registrations)` over both replicas counts each registration once.
            self.gauge.clear()
            for state in ("active", "terminal"):
                self.metrics.registration_objects.labels(state).set(0)

    async def _reconcile(self, key: Key) -> Result:
        return await self.reconciler.reconcile(key)

    def observe_deletion(self, registration: model.Registration) -> None:
        """A registration deleted while active is counted and logged: its retention deletes only
        terminal ones, and admission lets only a cluster admin, the namespace controller or the
        garbage collector delete an active one; the record of a possibly live worker is gone."""
        if registration.terminal:
            return
        logger.warning(
            "active registration deleted namespace=%s name=%s registered-by=%s: not by Coroner (its retention "
            "deletes only terminal ones); by a cluster admin, the namespace controller or the garbage collector",
            registration.namespace,
            registration.name,
            registration.registered_by or "(unrecorded)",
        )
        self.metrics.active_deletions.inc()  # after the line: whoever sees the count finds it logged

    def _failed(self, key: Key, exc: Exception, delay: float) -> None:
        self.metrics.reconcile_errors.inc()
        self.sweeper.record_failure(key, exc)
        logger.warning("reconcile failed workerregistration=%s/%s error=%r retry_in=%ss", key[0], key[1], exc, delay)

    @property
    def last_sweep(self) -> dict[str, Any] | None:
        return self.sweeper.last_sweep

    def loops(self) -> list[Coroutine[Any, Any, None]]:
        """Every loop the operator runs (each forever; one ending is a bug)."""
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
        """List-then-watch the served registrations (`coroner.runtime.watch.reflect`; one watch per
        namespace named by `settings.namespaces`, else one of every namespace), each in a thread of
        its own, each page and event handed to `inputs` on this loop, until cancelled (a thread
        stops at its next event or the end of its stream). The operator's own watch, not kopf's:
        kopf keeps a memory record per object and starts a task per object on every event, which at
        150,000 registrations cost several GB during the initial list."""
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        ended: asyncio.Future[None] = loop.create_future()
        handoff = Handoff(loop, stop=stop)
        pause = ListingPause()
        patterns = self.settings.namespaces

        def end(error: BaseException | None) -> None:
            if ended.done():
                return
            if error is None:
                ended.set_result(None)
            else:
                ended.set_exception(error)

        def run(namespace: str | None) -> None:
            # Only a watch of every namespace serving a glob sees what it does not serve.
            filtered = namespace is None and bool(patterns)

            def on_page(items: list[dict[str, Any]], first: bool, last: bool, resource_version: str) -> None:
                if filtered:
                    items = [body for body in items if serves(patterns, body["metadata"]["namespace"])]

                def ingest() -> None:
                    if first:
                        pause.begin(namespace)
                    self.inputs.on_list_page(
                        items, first=first, last=last, resource_version=resource_version, namespace=namespace
                    )
                    if last:
                        pause.end(namespace)

                handoff(ingest)

            def on_event(event_type: str, body: dict[str, Any]) -> None:
                if not filtered or serves(patterns, body["metadata"]["namespace"]):
                    handoff(lambda: self.inputs.on_registration(body, deleted=event_type == "DELETED"))

            error: BaseException | None = None
            try:
                reflect(
                    rest, registrations_path(namespace), stop=stop, on_page=on_page, on_event=on_event,
                    what=f"registrations in {namespace}" if namespace else "registrations", keep=trimmed,
                )  # fmt: skip
            except BaseException as exc:  # a bug: the loop's failure stops the operator
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop is closed: the process is stopping
                loop.call_soon_threadsafe(end, error)

        for namespace in watch_scopes(patterns):
            threading.Thread(
                target=run, args=(namespace,), name=f"watch-registrations-{namespace or 'all'}", daemon=True
            ).start()
        try:
            await ended
        finally:
            stop.set()
            pause.close()

    async def drain(self) -> None:
        """Waits until the queue is empty and nothing is being reconciled (tests)."""
        await self.controller.drain()

    async def drain_events(self) -> None:
        """Waits until every Event of a retirement so far is posted (tests and shutdown)."""
        await self.events.drain()

    async def release(self) -> None:
        """A clean shutdown gives the leader Lease up, so a standby takes over at its next retry."""
        if self.elector is not None:
            await self.elector.release()

    def close(self) -> None:
        self.kube.close()


def watch_scopes(patterns: tuple[str, ...]) -> tuple[str | None, ...]:
    """The registration watches that serve `patterns`: one per namespace when every pattern names
    one exactly (a namespaced operator needs no cluster-wide read), else one of every namespace
    (None), filtered by `serves`: a glob can match a namespace created later."""
    if not patterns or any(ch in p for p in patterns for ch in "*?["):
        return (None,)
    return tuple(sorted(set(patterns)))


def serves(patterns: tuple[str, ...], namespace: str) -> bool:
    """Whether an operator serving `patterns` (exact names or globs; none: all) serves `namespace`."""
    return not patterns or any(fnmatch.fnmatchcase(namespace, p) for p in patterns)
