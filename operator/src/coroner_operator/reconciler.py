"""The reconcile loop: gather facts from the cache, call the pure `decide`, apply its effects.

Level-based and idempotent: each reconcile recomputes the decision from current state, and writes
only when the stored conditions differ from the desired ones. Work is keyed by (namespace, name)
and deduplicated, so a burst of watch events for one registration is one reconcile. Time-driven
re-evaluation is scheduled for exactly the instant the decision says it can change by clock alone
(TTL expiry, corroboration window, staleness, agent Lease expiry), not by a per-object timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import heapq
import itertools
import json
import logging
import time
from collections import Counter
from typing import Any

from coroner.client.rest import ApiError
from coroner.core import api, model, policy_json
from coroner.core.decision import Decision, NodeFacts, Policy, decide, lease_expiry
from coroner.core.reasons import EventReason, Reason
from coroner.core.world import Key, World, lease_facts
from coroner.runtime.workqueue import KeyedQueue
from coroner_operator import retention as retention_mod
from coroner_operator import status as status_mod
from coroner_operator.eventcorrelator import DEFAULT_BURST, DEFAULT_WINDOW_SECONDS, EventCorrelator, Outgoing
from coroner_operator.freshread import FreshRead
from coroner_operator.kubeapi import KubeApi
from coroner_operator.metrics import Metrics

logger = logging.getLogger("coroner.operator")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class OperatorSettings:
    """How the operator runs; the decision's own knobs live in `coroner.core.decision.Policy`."""

    workers: int = 8
    """Concurrent reconciles (distinct registrations; one registration is never reconciled twice at once)."""
    resync_seconds: float = 60.0
    """A full re-decision of every cached registration (no API reads) as a safety net."""
    permission_refresh_seconds: float = 5.0
    """How often the `retire` capability is re-checked per namespace; a flip re-queues the namespace."""
    terminal_retention_seconds: float = retention_mod.DEFAULT_TERMINAL_RETENTION_SECONDS
    """Delete terminal (Retired or Released) registrations this long after they became terminal, at
    the first reconcile after that (the sweep, within `resync_seconds`); 0 keeps them forever.
    See `coroner_operator.retention` for the rule."""
    error_backoff: tuple[float, ...] = (1, 2, 4, 8, 16, 30, 60)
    """Delays before retrying a registration whose reconcile failed unexpectedly (never a hot loop)."""
    system_namespace: str = api.SYSTEM_NAMESPACE
    event_posters: int = 2
    """Concurrent Event writers; Events are posted off the reconcile path (a retirement's worker
    moves on once the compare-and-swap write has landed)."""
    event_backlog: int = 10000
    """Events waiting to be posted before reconciles that retire wait for room (never dropped)."""
    event_burst: int = DEFAULT_BURST
    """Events posted one by one per namespace per window; past it similar ones are combined."""
    event_window_seconds: float = DEFAULT_WINDOW_SECONDS
    """The aggregation window (see `coroner_operator.eventcorrelator`)."""


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class Reconciler:
    """Owns the work queue, the timers and the effects. One per operator process."""

    def __init__(
        self,
        *,
        world: World,
        kube: KubeApi,
        policy: Policy,
        metrics: Metrics,
        settings: OperatorSettings,
        identity: str = "unknown",
    ) -> None:
        self.world = world
        self.kube = kube
        self.policy = policy
        self.metrics = metrics
        self.settings = settings
        self.identity = identity
        self._queue: KeyedQueue[Key] = KeyedQueue()
        self._timers: list[tuple[datetime.datetime, int, Key]] = []
        self._timer_due: dict[Key, datetime.datetime] = {}
        # One timer per node at its agent Lease's expiry (see `watch_agent_expiry`).
        self._agent_timers: list[tuple[datetime.datetime, int, str]] = []
        self._agent_due: dict[str, datetime.datetime] = {}
        self._timer_wakeup = asyncio.Event()
        self._seq = itertools.count()
        self._reasons: dict[Key, Reason] = {}
        self._failures: dict[Key, int] = {}
        self._sweep_failures: Counter[str] = Counter()
        self._sweep_errors: dict[str, str] = {}
        self.last_sweep: dict[str, Any] | None = None
        self._events: asyncio.Queue[Outgoing] = asyncio.Queue(settings.event_backlog)
        self.correlator = EventCorrelator(burst=settings.event_burst, window_seconds=settings.event_window_seconds)
        # Terminal registrations kept for lack of a parsable time, by the resourceVersion last logged.
        self._kept_logged: dict[Key, str | None] = {}
        # Right before a retirement: the namespace-wide capability and the Lease fence, each read
        # once for every retirement in the namespace decided before the read started.
        self.permission_reads: FreshRead[str, bool] = FreshRead(lambda ns: self.kube.can_retire(namespace=ns))
        self.lease_reads: FreshRead[str, list[dict[str, Any]]] = FreshRead(
            lambda ns: self.kube.list_leases(namespace=ns)
        )

    # --- queueing ------------------------------------------------------------------------------

    def enqueue(self, key: Key) -> None:
        """Asks for a reconcile of `key`; duplicates collapse into one."""
        self._queue.put(key)

    def schedule(self, key: Key, when: datetime.datetime) -> None:
        """Reconcile `key` at `when` (the earliest of several requests wins)."""
        due = self._timer_due.get(key)
        if due is not None and due <= when:
            return
        self._timer_due[key] = when
        heapq.heappush(self._timers, (when, next(self._seq), key))
        self._timer_wakeup.set()

    def watch_agent_expiry(self, node: str) -> None:
        """Re-decide `node`'s registrations when its agent Lease expires, unless renewed before.

        Every decision that relied on the agent being live (a PidAlive, a Dead verdict's agent
        line, a live agent blocking node-level evidence) changes when it expires (`Decision.
        agent_expires_at`); one timer per node, moved by each renewal, stands for all of them.
        """
        facts = self.world.agents.get(node)
        until = None if facts is None else lease_expiry(facts.renew_time, facts.lease_duration_seconds)
        if until is None or until <= utcnow():
            # Unknown or already past: the Lease event that brought it re-decides the node itself.
            self._agent_due.pop(node, None)
            return
        if self._agent_due.get(node) == until:
            return
        self._agent_due[node] = until
        heapq.heappush(self._agent_timers, (until, next(self._seq), node))
        self._timer_wakeup.set()

    def _fire_timers(self, now: datetime.datetime) -> None:
        while self._timers and self._timers[0][0] <= now:
            when, _, key = heapq.heappop(self._timers)
            if self._timer_due.get(key) == when:
                del self._timer_due[key]
                self.enqueue(key)
        while self._agent_timers and self._agent_timers[0][0] <= now:
            when, _, node = heapq.heappop(self._agent_timers)
            if self._agent_due.get(node) == when:  # otherwise renewed (or gone) since
                del self._agent_due[node]
                logger.info("agent lease expired node=%s expiredAt=%s", node, model.format_time(when))
                for key in self.world.keys_on_node(node):
                    self.enqueue(key)

    async def run_scheduler(self) -> None:
        while True:
            now = utcnow()
            self._fire_timers(now)
            heads = [heap[0][0] for heap in (self._timers, self._agent_timers) if heap]
            timeout = (min(heads) - now).total_seconds() if heads else 3600.0
            self._timer_wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._timer_wakeup.wait(), timeout=max(timeout, 0.0) + 0.001)

    async def run_worker(self) -> None:
        while True:
            key = await self._queue.get()
            try:
                await self.reconcile(key)
                self._failures.pop(key, None)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._on_failure(key, exc)
            finally:
                self._queue.done(key)

    def _on_failure(self, key: Key, exc: Exception) -> None:
        attempt = self._failures.get(key, 0)
        self._failures[key] = attempt + 1
        delay = self.settings.error_backoff[min(attempt, len(self.settings.error_backoff) - 1)]
        self.metrics.reconcile_errors.inc()
        self._sweep_failures[key[0]] += 1
        self._sweep_errors[key[0]] = describe(exc)[:300]
        logger.warning("reconcile failed workerregistration=%s/%s error=%r retry_in=%ss", key[0], key[1], exc, delay)
        self.schedule(key, utcnow() + datetime.timedelta(seconds=delay))

    async def drain(self) -> None:
        """Waits until the queue is empty and nothing is running (tests and sweeps)."""
        await self._queue.join()

    async def drain_events(self) -> None:
        """Waits until every Event of a retirement so far is posted (or failed and logged),
        aggregates whose window has not ended included (tests and shutdown)."""
        for outgoing in self.correlator.flush():
            await self._events.put(outgoing)
        await self._events.join()

    # --- the reconcile -------------------------------------------------------------------------

    async def reconcile(self, key: Key) -> Decision | None:
        decided_at = time.monotonic()  # before the cache is read: fences must be fetched after this
        body = self.world.bodies.get(key)
        if body is None:
            self._set_reason(key, None)
            return None
        registration = self.world.parsed[key]
        now = utcnow()
        if registration.terminal:
            self._set_reason(key, None)
            if await self._collect_garbage(key, registration, now=now):
                return None  # deleted (or tried and refused): no condition write for it
            if not status_mod.reads_terminal(registration):
                # Released by the worker, or retired by a human's `kubectl coroner apply` (which may
                # not write Retirable): say so once in Retirable (AlreadyTerminal), so the printer
                # column stops showing the last live decision. The operator's own retirements
                # wrote it already; the Retired condition stays as written, as history.
                facts = self.world.facts_for(key, now=now)
                final = decide(registration=registration, facts=facts, policy=self.policy, now=now)
                await self._write_conditions(key, body, registration, final, now=now)
            return None
        namespace = key[0]
        if namespace not in self.world.retire_permission:
            self.world.retire_permission[namespace] = await self.kube.can_retire(namespace=namespace)
        node_override = await self._confirm_node_gone(registration, now=now)
        facts = self.world.facts_for(key, now=now, node_override=node_override)
        decision = decide(registration=registration, facts=facts, policy=self.policy, now=now)
        self._set_reason(key, decision.reason)
        if decision.retirable:
            await self._retire(
                key, body, registration, decision, now=now, node_override=node_override, decided_at=decided_at
            )
        else:
            await self._write_conditions(key, body, registration, decision, now=now)
        if decision.next_evaluation_at is not None:
            self.schedule(key, decision.next_evaluation_at)
        return decision

    async def _confirm_node_gone(self, registration: model.Registration, *, now: datetime.datetime) -> NodeFacts | None:
        """Like the pod garbage collector: after a quarantine, only a live GET's 404 (or another
        UID) counts as the node being gone, and only where policy opts into node-deletion evidence."""
        node = registration.node_name
        if not node or not self.policy.node_deletion_evidence or node in self.world.nodes:
            return None
        view = self.world.node_view(node, now=now)
        if view.missing_since is None:
            return None
        if now < view.missing_since + datetime.timedelta(seconds=self.policy.node_deletion_quarantine_seconds):
            self.schedule(
                (registration.namespace or "", registration.name or ""),
                view.missing_since + datetime.timedelta(seconds=self.policy.node_deletion_quarantine_seconds),
            )
            return None
        live = await self.kube.get_node(name=node)
        if live is not None:
            self.world.put_node(live)
            return None
        return dataclasses.replace(view, exists=False)

    async def _write_conditions(
        self,
        key: Key,
        body: dict[str, Any],
        registration: model.Registration,
        decision: Decision,
        *,
        now: datetime.datetime,
    ) -> None:
        desired = status_mod.desired_conditions(registration, decision, now=now)
        if not status_mod.conditions_changed(registration, desired):
            return  # level-based: nothing changed, write nothing
        ops = status_mod.conditions_ops(body, desired, resource_version=str(registration.resource_version))
        try:
            patched = await self.kube.patch_status(namespace=key[0], name=key[1], ops=ops)
        except ApiError as exc:
            if exc.status in (404, 409, 422):
                await self._reread(key)
                return
            raise
        self.metrics.status_writes.labels("conditions").inc()
        self._observe(patched)

    async def _retire(
        self,
        key: Key,
        body: dict[str, Any],
        registration: model.Registration,
        decision: Decision,
        *,
        now: datetime.datetime,
        node_override: NodeFacts | None,
        decided_at: float,
    ) -> None:
        namespace, name = key
        # Step 2, right before the write, both read by requests sent after this decision (each
        # shared by every retirement of the namespace decided before it was sent, see FreshRead):
        # 2a, the capability (revocation takes effect here): the namespace-wide review implies this
        # name; only a "no" asks again for this name, for grants scoped by resourceNames;
        # 2b, the Lease fence: if the holder set of the protecting Leases moved since the decision,
        # this attempt is abandoned and the registration decided again.
        granted, leases = await asyncio.gather(
            self.permission_reads.get(namespace, decided_at=decided_at),
            self.lease_reads.get(namespace, decided_at=decided_at),
        )
        if not granted:
            granted = await self.kube.can_retire(namespace=namespace, name=name)
        if not granted:
            self.world.retire_permission[namespace] = False
            self.metrics.retire_abandoned.labels(Reason.RETIRE_PERMISSION_MISSING.value).inc()
            logger.info(
                "retire abandoned workerregistration=%s/%s cause=%s", namespace, name, "RetirePermissionMissing"
            )
            self.enqueue(key)
            return
        live = {}
        for lease in leases:
            facts = lease_facts(lease)
            live[facts.name] = facts
        cached = self.world.leases.get(namespace, {})
        if _holders(live) != _holders(cached):
            self.world.leases[namespace] = live
            self.metrics.retire_abandoned.labels("LeaseFenceMoved").inc()
            logger.info("retire abandoned workerregistration=%s/%s cause=LeaseFenceMoved", namespace, name)
            self.enqueue(key)
            return
        # Decide once more with the live Leases and the fresh permission: renewals since the cache
        # was filled must not be missed.
        fenced = decide(
            registration=registration,
            facts=self.world.facts_for(
                key,
                now=now,
                node_override=node_override,
                leases_override=live,
                permission_override=True,
                use_permission_override=True,
            ),
            policy=self.policy,
            now=now,
        )
        if not fenced.retirable:
            self.world.leases[namespace] = live
            self.enqueue(key)
            return
        # Step 3: compare-and-swap.
        ops = status_mod.retirement_ops(body, registration, fenced, retired_by=self.identity, now=utcnow())
        try:
            patched = await self.kube.patch_status(namespace=namespace, name=name, ops=ops)
        except ApiError as exc:
            if exc.status in (404, 409, 422):
                self.metrics.cas_conflicts.inc()
                logger.info(
                    "retire conflict workerregistration=%s/%s status=%s resourceVersion=%s: re-reading",
                    namespace,
                    name,
                    exc.status,
                    registration.resource_version,
                )
                await self._reread(key)
                return
            if exc.status == 403:
                # The admission policy refused: the grant was revoked between the check and the write.
                self.world.retire_permission[namespace] = False
                self.metrics.retire_abandoned.labels(Reason.RETIRE_PERMISSION_MISSING.value).inc()
                self.enqueue(key)
                return
            raise
        self.metrics.status_writes.labels("retirement").inc()
        self._observe(patched)
        # Step 4: Event, metric, one structured log line.
        evidence = fenced.death_evidence.value if fenced.death_evidence else "Unknown"
        self.metrics.retirements.labels(evidence).inc()
        attestation = registration.attestation
        if attestation is not None and attestation.observed_time is not None:
            self.metrics.death_to_retirement.observe(max(0.0, (utcnow() - attestation.observed_time).total_seconds()))
        logger.info(
            "retired workerregistration=%s/%s evidence=%s node=%s pid=%s resourceVersion=%s retiredBy=%s",
            namespace,
            name,
            evidence,
            registration.node_name,
            registration.incarnation.pid,
            registration.resource_version,
            self.identity,
        )
        for outgoing in self.correlator.observe(
            involved=patched,
            reason=EventReason.RETIRED.value,
            evidence=evidence,
            message=f"{evidence}: {fenced.detail}",
            now=utcnow(),
        ):
            await self._events.put(outgoing)

    async def _reread(self, key: Key) -> None:
        fresh = await self.kube.get_registration(namespace=key[0], name=key[1])
        if fresh is None:
            self.world.forget_registration(key)
            self._set_reason(key, None)
        else:
            self._observe(fresh)
            self.enqueue(key)

    def _observe(self, body: dict[str, Any]) -> None:
        """A body we wrote or read is at least as new as the cache's; keep the newer one."""
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        cached = self.world.bodies.get(key)
        if cached is None or _rv(body) >= _rv(cached):
            self.world.put_registration(body)

    async def _collect_garbage(self, key: Key, registration: model.Registration, *, now: datetime.datetime) -> bool:
        """Deletes a terminal registration whose retention has ended; True if a delete was sent.

        Called only from the reconcile of a terminal registration, on the object as read (cache):
        the delete's preconditions (uid and resourceVersion) make the server refuse it if the
        object changed since, so only what was read terminal is ever deleted. Not yet due: nothing
        is scheduled; the periodic sweep reconciles every registration and brings it back."""
        seconds = self.settings.terminal_retention_seconds
        verdict = retention_mod.deletion_due(registration, retention_seconds=seconds)
        if verdict.due is None:
            unreadable = seconds > 0 and verdict.terminal is not None and verdict.since is None
            if unreadable and self._kept_logged.get(key, "") != registration.resource_version:
                self._kept_logged[key] = registration.resource_version
                logger.warning(
                    "terminal workerregistration kept namespace=%s name=%s resourceVersion=%s: %s",
                    key[0], key[1], registration.resource_version, verdict.why,
                )  # fmt: skip
            return False
        if verdict.due > now or not registration.terminal:
            return False
        if registration.uid is None or registration.resource_version is None:
            return False  # the API always sets both; without them there is no precondition to send
        try:
            await self.kube.delete_registration(
                namespace=key[0], name=key[1], uid=registration.uid, resource_version=registration.resource_version
            )
        except ApiError as exc:
            if exc.status == 404:
                return True  # already gone; its watch event forgets it
            if exc.status == 409:
                # Changed (or replaced) since it was read: left alone. The change's own watch event
                # brings the new version back here, decided again from what it says.
                logger.info(
                    "terminal workerregistration not deleted namespace=%s name=%s resourceVersion=%s: it changed "
                    "since it was read (%s)",
                    key[0], key[1], registration.resource_version, exc.message,
                )  # fmt: skip
                return True
            raise
        self.metrics.terminal_deletions.labels(verdict.terminal).inc()
        logger.info(
            "deleted terminal workerregistration=%s/%s terminal=%s since=%s retentionSeconds=%g uid=%s resourceVersion=%s",
            key[0], key[1], verdict.terminal, model.format_time(verdict.since) if verdict.since else None, seconds,
            registration.uid, registration.resource_version,
        )  # fmt: skip
        return True

    def _set_reason(self, key: Key, reason: Reason | None) -> None:
        old = self._reasons.pop(key, None)
        if old is not None:
            self.metrics.registrations.labels(old.value).dec()
        if reason is not None:
            self._reasons[key] = reason
            self.metrics.registrations.labels(reason.value).inc()

    # --- background loops ----------------------------------------------------------------------

    async def run_event_poster(self) -> None:
        """Posts the Events of retirements (a few posters: about, not exactly, in the order they landed)."""
        while True:
            outgoing = await self._events.get()
            kind = "aggregate" if outgoing.aggregated else "individual"
            if outgoing.aggregated:
                self.metrics.events_aggregated.labels(outgoing.reason).inc(outgoing.count)
            try:
                await self.kube.post_event(
                    body=dict(outgoing.involved),
                    reason=outgoing.reason,
                    message=outgoing.message,
                    count=outgoing.count,
                    first_time=outgoing.first_time if outgoing.aggregated else None,
                )
                self.metrics.events_posted.labels(outgoing.reason, kind).inc()
            except Exception as exc:  # the retirement stands; its Event is best effort, and said so
                self.metrics.event_failures.labels(outgoing.reason).inc()
                meta = outgoing.involved.get("metadata") or {}
                logger.warning(
                    "event not posted workerregistration=%s/%s reason=%s kind=%s count=%s error=%s",
                    meta.get("namespace"),
                    meta.get("name"),
                    outgoing.reason,
                    kind,
                    outgoing.count,
                    describe(exc),
                )
            finally:
                self._events.task_done()

    async def run_event_aggregation(self, *, tick_seconds: float = 1.0) -> None:
        """Hands the aggregates of ended windows to the posters (one check a second: cheap, and
        an aggregate is posted at most a tick after its window ends)."""
        while True:
            await asyncio.sleep(min(tick_seconds, self.settings.event_window_seconds))
            for outgoing in self.correlator.flush(now=utcnow()):
                await self._events.put(outgoing)

    async def run_permission_refresh(self) -> None:
        """Re-checks `retire` per namespace; a flip re-queues that namespace (grant or revoke)."""
        while True:
            await asyncio.sleep(self.settings.permission_refresh_seconds)
            for namespace in self.world.namespaces():
                allowed = await self.kube.can_retire(namespace=namespace)
                if self.world.retire_permission.get(namespace) != allowed:
                    self.world.retire_permission[namespace] = allowed
                    logger.info("retire capability namespace=%s granted=%s", namespace, allowed)
                    for key in self.world.keys_in_namespace(namespace):
                        self.enqueue(key)

    async def run_sweeps(self) -> None:
        """Periodic full re-decision; records the outcome per namespace on the operator's Lease.

        The Lease also carries the decision policy this operator runs with (api.POLICY_ANNOTATION),
        published once before the first sweep (which may take a while on a large registry) and with
        every sweep after it, so `kubectl coroner plan|apply|doctor` decide as the operator does."""
        await self._write_operator_lease({})
        while True:
            started = utcnow()
            self._sweep_failures.clear()
            self._sweep_errors.clear()
            keys = list(self.world.bodies)
            for key in keys:
                self.enqueue(key)
            await self.drain()
            by_reason = Counter(r.value for r in self._reasons.values())
            terminal = sum(1 for r in self.world.parsed.values() if r.terminal)
            self.metrics.registration_objects.labels("terminal").set(terminal)
            self.metrics.registration_objects.labels("active").set(len(self.world.parsed) - terminal)
            self.last_sweep = {
                "time": model.format_time(utcnow()),
                "startedTime": model.format_time(started),
                "registrations": len(keys),
                "namespaces": len({k[0] for k in keys}),
                "failures": dict(self._sweep_failures),
                "errors": dict(self._sweep_errors),
                "byReason": dict(by_reason),
                "retirePermission": {ns: v for ns, v in self.world.retire_permission.items()},
            }
            await self._write_operator_lease({api.LAST_SWEEP_ANNOTATION: json.dumps(self.last_sweep, sort_keys=True)})
            await asyncio.sleep(self.settings.resync_seconds)

    async def _write_operator_lease(self, annotations: dict[str, str]) -> None:
        """Renews the operator's Lease with `annotations` and the policy (other annotations are kept)."""
        try:
            await self.kube.upsert_lease(
                namespace=self.settings.system_namespace,
                name=api.OPERATOR_LEASE,
                holder=self.identity,
                duration=int(self.settings.resync_seconds * 3),
                annotations={**annotations, api.POLICY_ANNOTATION: policy_json.dump_policy(self.policy)},
            )
        except Exception as exc:  # an API outage must not end the sweeps (nor /healthz's evidence)
            logger.warning(
                "operator lease not written namespace=%s error=%s", self.settings.system_namespace, describe(exc)
            )

    # --- watch inputs --------------------------------------------------------------------------

    def on_registration(self, body: dict[str, Any], *, deleted: bool) -> None:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        # Peers' decisions depend on this one (ClientInstanceConflict, ConflictingIdentity), both
        # the peers it had and the peers it has now.
        peers = {(p.namespace or "", p.name or "") for p in self.world.peers_of(key)}
        if deleted:
            self.world.forget_registration(key)
            self._set_reason(key, None)
            self._kept_logged.pop(key, None)
        else:
            cached = self.world.bodies.get(key)
            # Numeric resourceVersion order is only an optimisation here (skip an event older than
            # a body we wrote ourselves); correctness comes from the compare-and-swap writes.
            if cached is not None and _rv(body) < _rv(cached):
                return
            self.world.put_registration(body)
            self.enqueue(key)
            peers |= {(p.namespace or "", p.name or "") for p in self.world.peers_of(key)}
        for peer in sorted(peers):
            self.enqueue(peer)

    def on_lease(self, body: dict[str, Any], *, deleted: bool) -> None:
        if not deleted and self.world.is_routine_agent_renewal(body, now=utcnow()):
            # Every agent renews every few seconds: re-deciding its whole node each time would be
            # O(registrations) of work per renewal for decisions that cannot change. Only the
            # node's expiry timer moves.
            _, node = self.world.put_lease(body)
            if node is not None:
                self.watch_agent_expiry(node)
            return
        kind, subject = self.world.forget_lease(body) if deleted else self.world.put_lease(body)
        if kind == "agent" and subject is not None:
            self.watch_agent_expiry(subject)
            for key in self.world.keys_on_node(subject):
                self.enqueue(key)
        elif kind == "lease" and subject is not None:
            holder = (body.get("spec") or {}).get("holderIdentity")
            for key in self.world.keys_in_namespace(subject):
                r = self.world.parsed.get(key)
                if r is not None and holder in (r.name, r.session_id, r.client_instance_id):
                    self.enqueue(key)

    def on_node(self, body: dict[str, Any], *, deleted: bool) -> None:
        name = str(body["metadata"]["name"])
        if deleted:
            self.world.forget_node(name, now=utcnow())
        else:
            self.world.put_node(body)
        for key in self.world.keys_on_node(name):
            self.enqueue(key)


def describe(exc: BaseException) -> str:
    """One line naming an error; for API errors, the server's own message (it names the fix)."""
    if isinstance(exc, ApiError):
        return f"{exc.status} {exc.reason}: {exc.message}"
    return f"{type(exc).__name__}: {exc}"


def _holders(leases: dict[str, Any]) -> set[tuple[str, str | None]]:
    return {(name, facts.holder_identity) for name, facts in leases.items()}


def _rv(body: dict[str, Any]) -> int:
    try:
        return int(body["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return -1
