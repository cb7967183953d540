"""Runs a reconcile's `Effects` against the API server, and says what came of each.

The only code of the reconcile path that writes: conditions (compare-and-swap JSON patch), the
retirement (the retire protocol, `coroner.retire`, over `OperatorPort`), and the deletion of a
terminal registration. Outcomes, one mapping each:

* conditions write: 200 → the answer is cached (it is newer than the watch's copy); 404/409/422
  (gone, or moved since it was read) → read it again: gone is forgotten, moved is reconciled again,
  and not moved at all (the write itself was refused: a 422 for the CRD's limits) raises
  `WriteRefused`; anything else raises too (the runtime's capped backoff retries, never a hot loop).
* retirement: `RetireOutcome` → RETIRED is counted, logged and cached; PERMISSION_MISSING (the write
  refused for the missing `retire` verb, or the cached capability already revoked) records the
  namespace as not granted and reconciles again; REFUSED_BY_ADMISSION (a policy other than the
  verb's refused the write: the grant stands) is counted and logged under its reason, written into
  Retirable (level-based: once per wording), and raises (`RetireFailed`, retried with backoff: the
  same write would be refused again now); LEASE_FENCE_MOVED and ABANDONED take the live Leases into
  the cache and reconcile again; CONFLICT reads it again (as a conditions
  write's 404/409/422 does, with the same `WriteRefused` when it did not move); UNREACHABLE and FAILED raise
  (`RetireFailed`, retried with backoff).
* delete: 200 counted; 404 (already gone: its watch event forgets it) and 409 (changed since the
  read: left alone, its own watch event brings it back) are not errors; anything else raises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import urllib3

from coroner.client.rest import ApiError
from coroner.core import model
from coroner.core.reasons import Reason
from coroner.core.world import World
from coroner.retire import PortError, RetireIntent, RetireOutcome, RetirePort, Retirer, RetireResult, retire
from coroner_operator import step
from coroner_operator.effects import Delete, Effects, Key, WriteConditions
from coroner_operator.events import EventPoster
from coroner_operator.freshread import FreshRead
from coroner_operator.kubeapi import KubeApi, describe
from coroner_operator.metrics import DecisionGauge, Metrics

logger = logging.getLogger("coroner.operator")


#: A namespace's Leases as a live read found them, or what kept the read from answering.
Fence = Sequence[Mapping[str, Any]] | PortError


class RetireFailed(Exception):
    """A retirement that neither landed nor was refused for a reason that a re-decision answers."""

    def __init__(self, result: RetireResult) -> None:
        super().__init__(result.detail)
        self.result = result


class WriteRefused(Exception):
    """A write answered 404/409/422 although the object, read again, is exactly the one it tested:
    nothing moved, so the answer was a refusal (a schema limit, say), not a conflict. Raised for
    the runtime's capped exponential backoff; reconciling again at once would only repeat it."""


async def _port_call(call: Any) -> Any:
    """Awaits one KubeApi call, turning what the API server said (or did not) into a PortError."""
    try:
        return await call
    except ApiError as exc:
        raise PortError(exc.status, exc.message, reason=exc.reason) from exc
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise PortError(None, f"{type(exc).__name__}: {exc}") from exc


class OperatorPort(RetirePort):
    """The retire protocol's port for the operator.

    The `retire` verb costs no request here: admission enforces it on the retirement write itself
    (policy coroner-retire-requires-capability, and RBAC), so a review before the write would only
    repeat it. `can_retire` answers from the namespace's cached capability (asked at the first
    decision there and every `--permission-refresh-seconds` since); a revocation the cache has not
    seen yet bites at the write, whose refusal is PERMISSION_MISSING.

    The Lease fence is `fence`: the live read `Executor.fence` took for this retirement (sent with
    the admission read, both after the decision), or what kept it from answering; it is held in
    `holds` with the admission read until the write is answered (`FreshRead.hold`).
    Events go to the poster (aggregated under bursts)."""

    def __init__(
        self,
        *,
        kube: KubeApi,
        granted: Callable[[str], bool | None],
        fence: Fence,
        events: EventPoster,
        holds: contextlib.AsyncExitStack,
    ) -> None:
        self.kube = kube
        self.granted = granted
        self.fence = fence
        self.events = events
        self.holds = holds
        """The reads this retirement acts on, held until its write is answered."""

    async def can_retire(self, *, namespace: str, name: str) -> bool | None:
        return self.granted(namespace)

    async def list_leases(self, *, namespace: str) -> Sequence[Mapping[str, Any]]:
        if isinstance(self.fence, PortError):
            raise self.fence
        return self.fence

    async def patch_status(self, *, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        try:
            result: dict[str, Any] = await _port_call(self.kube.patch_status(namespace=namespace, name=name, ops=ops))
        finally:
            # The write is answered: the reads it acted on may serve the next batch now, not after
            # this retirement's Event (which waits while the Event backlog is full).
            await self.holds.aclose()
        return result

    async def post_event(self, *, involved: Mapping[str, Any], reason: str, evidence: str, message: str) -> None:
        await self.events.record(involved=involved, reason=reason, evidence=evidence, message=message)


class Executor:
    def __init__(
        self,
        *,
        world: World,
        kube: KubeApi,
        metrics: Metrics,
        gauge: DecisionGauge,
        events: EventPoster,
        enqueue: Callable[[Key], None],
        identity: str,
        clock: Callable[[], datetime.datetime],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.world = world
        self.kube = kube
        self.metrics = metrics
        self.gauge = gauge
        self.events = events
        self.enqueue = enqueue
        self.retirer = Retirer(name=identity)
        self.clock = clock
        # Right before a retirement: the Lease fence, read once for every retirement in the namespace
        # decided before the read started (and held by each until its write is answered).
        self.lease_reads: FreshRead[str, list[dict[str, Any]]] = FreshRead(
            lambda ns: self.kube.list_leases(namespace=ns), clock=monotonic
        )
        # Terminal registrations kept for lack of a parsable time, by the resourceVersion last logged.
        self._kept_logged: dict[Key, str | None] = {}

    def forget(self, key: Key) -> None:
        """`key` is gone (deleted): nothing more to say about it."""
        self._kept_logged.pop(key, None)

    async def fence(self, namespace: str, *, decided_at: float, holds: contextlib.AsyncExitStack) -> Fence:
        """The Leases of `namespace` from a read sent no earlier than `decided_at` (a
        `time.monotonic()` reading taken before the cache was read), held in `holds` (the next read
        of the namespace waits until the retirement lets go of it); or what the API server said
        instead (the retire protocol's FAILED)."""
        held = self.lease_reads.hold(namespace, decided_at=decided_at)
        try:
            result: list[dict[str, Any]] = await _port_call(holds.enter_async_context(held))
        except PortError as error:
            return error
        return result

    async def run(
        self, effects: Effects, *, holds: contextlib.AsyncExitStack | None = None, fence: Fence | None = None
    ) -> None:
        """Runs `effects` (at most one write); raises what the runtime should retry with backoff.
        A retirement acts on `fence` (`Executor.fence`) and lets go of `holds` (the reads it acted
        on, the fence's too) once its write is answered."""
        key = effects.key
        if effects.kept is not None:
            self._log_kept(key, effects.kept)
        if effects.delete is not None:
            await self._delete(key, effects.delete)
        if effects.write_conditions is not None:
            await self._write_conditions(key, effects.write_conditions)
        if effects.retire is not None:
            if fence is None or holds is None:
                raise ValueError("a retirement acts on a Lease fence read for it, held until its write is answered")
            port = OperatorPort(
                kube=self.kube, granted=self.world.retire_permission.get, fence=fence, events=self.events, holds=holds
            )
            async with port.holds:
                result = await retire(port, effects.retire, retirer=self.retirer, clock=self.clock)
            await self._retired(key, effects.retire, result)

    # --- conditions ----------------------------------------------------------------------------

    async def _write_conditions(self, key: Key, write: WriteConditions) -> None:
        try:
            patched = await self.kube.patch_status(namespace=key[0], name=key[1], ops=[dict(op) for op in write.ops])
        except ApiError as exc:
            if exc.status in (404, 409, 422):
                await self.reread(key, tested=write.resource_version, refusal=exc)
                return
            raise
        self.metrics.status_writes.labels("conditions").inc()
        self.world.observe_registration(patched)

    async def reread(self, key: Key, *, tested: str | None = None, refusal: Exception | None = None) -> None:
        """After a write refused for moving: the object as it is now, reconciled again (or forgotten).

        If it did not move (still at `tested`, the resourceVersion the write tested), the write was
        refused for what it said, not for a conflict — a 422 for the CRD's limits (conditions at
        maxItems), say: the same write would be refused again, so `WriteRefused` is raised for the
        runtime's capped backoff (logged and counted as a reconcile failure) instead of a hot loop."""
        fresh = await self.kube.get_registration(namespace=key[0], name=key[1])
        if fresh is None:
            self.world.forget_registration(key)
            self.gauge.set(key, None)
            return
        self.world.observe_registration(fresh)
        if tested is not None and str((fresh.get("metadata") or {}).get("resourceVersion")) == tested:
            raise WriteRefused(
                f"the write to workerregistration {key[0]}/{key[1]} at resourceVersion {tested} was refused "
                f"though it had not moved: {describe(refusal) if refusal is not None else 'no answer'}"
            )
        self.enqueue(key)

    # --- the retirement ------------------------------------------------------------------------

    async def _retired(self, key: Key, intent: RetireIntent, result: RetireResult) -> None:
        namespace, name = key
        registration = intent.registration
        outcome = result.outcome
        if outcome is RetireOutcome.RETIRED:
            assert result.patched is not None
            self._count_retirement(key, registration, result)
            return
        if outcome is RetireOutcome.PERMISSION_MISSING:
            # Revoked since the namespace was last checked: admission refused the write (its policy
            # for the verb, or RBAC's 403), or the periodic refresh saw it first.
            self.world.set_retire_permission(namespace, False)
            self.metrics.retire_abandoned.labels(outcome.value).inc()
            logger.info(
                "retire abandoned workerregistration=%s/%s cause=%s: %s", namespace, name, outcome.value, result.detail
            )
            self.enqueue(key)
        elif outcome is RetireOutcome.REFUSED_BY_ADMISSION:
            await self._refused_by_admission(key, intent, result)
        elif outcome in (RetireOutcome.LEASE_FENCE_MOVED, RetireOutcome.ABANDONED):
            assert result.leases is not None
            self.world.replace_leases(namespace, result.leases)
            if outcome is RetireOutcome.LEASE_FENCE_MOVED:
                self.metrics.retire_abandoned.labels(outcome.value).inc()
                logger.info("retire abandoned workerregistration=%s/%s cause=%s", namespace, name, outcome.value)
            self.enqueue(key)
        elif outcome is RetireOutcome.CONFLICT:
            logger.info(
                "retire conflict workerregistration=%s/%s status=%s resourceVersion=%s: re-reading",
                namespace, name, result.error.status if result.error else None, registration.resource_version,
            )  # fmt: skip
            await self.reread(key, tested=registration.resource_version, refusal=result.error)
            self.metrics.cas_conflicts.inc()  # it moved (reread raises when it did not)
        else:  # UNREACHABLE, FAILED: retried with backoff
            raise RetireFailed(result)

    async def _refused_by_admission(self, key: Key, intent: RetireIntent, result: RetireResult) -> None:
        """Admission refused the write though the verb is held: the namespace's permission stays as
        it is; Retirable says RetireRefusedByAdmission (the policy, what it said); retried with backoff."""
        outcome, refusal = result.outcome, result.refusal
        self.metrics.retire_abandoned.labels(outcome.value).inc()
        logger.warning(
            "retire refused workerregistration=%s/%s cause=%s policy=%s: %s",
            key[0], key[1], outcome.value, refusal.name if refusal else None, result.detail,
        )  # fmt: skip
        decided = result.decision or intent.decision
        refused = dataclasses.replace(decided, reason=Reason.RETIRE_REFUSED_BY_ADMISSION, detail=result.detail)
        write = step.conditions_write(intent.body, intent.registration, refused, now=self.clock())
        if write is not None:
            await self._write_conditions(key, write)
        raise RetireFailed(result)

    def _count_retirement(self, key: Key, registration: model.Registration, result: RetireResult) -> None:
        assert result.patched is not None
        self.metrics.status_writes.labels("retirement").inc()
        self.world.observe_registration(result.patched)
        evidence = result.evidence or "Unknown"
        self.metrics.retirements.labels(evidence).inc()
        attestation = registration.attestation
        if attestation is not None and attestation.observed_time is not None:
            waited = (self.clock() - attestation.observed_time).total_seconds()
            self.metrics.death_to_retirement.observe(max(0.0, waited))
        logger.info(
            "retired workerregistration=%s/%s evidence=%s node=%s pid=%s resourceVersion=%s retiredBy=%s",
            key[0], key[1], evidence, registration.node_name, registration.incarnation.pid,
            registration.resource_version, self.retirer.name,
        )  # fmt: skip

    # --- retention -----------------------------------------------------------------------------

    def _log_kept(self, key: Key, why: str) -> None:
        registration = self.world.parsed.get(key)
        version = registration.resource_version if registration is not None else None
        if self._kept_logged.get(key, "") != version:
            self._kept_logged[key] = version
            logger.warning(
                "terminal workerregistration kept namespace=%s name=%s resourceVersion=%s: %s",
                key[0], key[1], version, why,
            )  # fmt: skip

    async def _delete(self, key: Key, delete: Delete) -> None:
        try:
            await self.kube.delete_registration(
                namespace=key[0], name=key[1], uid=delete.uid, resource_version=delete.resource_version
            )
        except ApiError as exc:
            if exc.status == 404:
                return  # already gone; its watch event forgets it
            if exc.status == 409:
                # Changed (or replaced) since it was read: left alone. The change's own watch event
                # brings the new version back here, decided again from what it says.
                logger.info(
                    "terminal workerregistration not deleted namespace=%s name=%s resourceVersion=%s: it changed "
                    "since it was read (%s)",
                    key[0], key[1], delete.resource_version, exc.message,
                )  # fmt: skip
                return
            raise
        self.metrics.terminal_deletions.labels(delete.terminal).inc()
        logger.info(
            "deleted terminal workerregistration=%s/%s terminal=%s since=%s retentionSeconds=%g uid=%s resourceVersion=%s",
            key[0], key[1], delete.terminal, model.format_time(delete.since) if delete.since else None,
            delete.retention_seconds, delete.uid, delete.resource_version,
        )  # fmt: skip
