"""Runs a reconcile's `Effects` against the API server, and says what came of each, as a value.

The only code of the reconcile path that writes: conditions (compare-and-swap JSON patch), the
retirement's compare-and-swap (the patch `coroner.retire.retirement` built), and the deletion of a
terminal registration; and what the step asks after an outcome: a re-read, the
``Retired`` Event (to the poster), what the outcome tells the cache, the metrics and the log, a
reconcile again. It decides nothing that follows: `run` returns the outcome (`effects.Outcome`)
and the step's next call (`coroner_operator.step.after`) says what comes of it:

* conditions write: 200 → the answer is cached (it is newer than the watch's copy) and counted;
  an API error → `Refusal` (anything else raises, for the runtime's capped backoff);
* retirement: `RetireAnswer`, the object as written or what the API server said (`PortError`),
  which the step maps with `coroner.retire.written` (the one mapping of the write's answers);
* re-read: `ReadBack`, the object cached as it is now, or forgotten when it is gone;
* delete: 200 counted; 404 (already gone: its watch event forgets it) and 409 (changed since the
  read: left alone, its own watch event brings it back) are not errors; anything else raises.
  Nothing follows a delete.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
from collections.abc import Callable
from typing import Any

import urllib3

from coroner.client.rest import ApiError
from coroner.core import model
from coroner.core.world import World
from coroner.retire import PortError, RetireOutcome, Retirer, RetireResult, RetireWrite
from coroner_operator.effects import (
    Delete,
    Effects,
    Key,
    Outcome,
    ReadBack,
    Refusal,
    Reread,
    RetireAnswer,
    RetireRecord,
    WriteConditions,
)
from coroner_operator.events import EventPoster
from coroner_operator.kubeapi import KubeApi, describe
from coroner_operator.metrics import DecisionGauge, Metrics

logger = logging.getLogger("coroner.operator")


async def port_call(call: Any) -> Any:
    """Awaits one KubeApi call, turning what the API server said (or did not) into a PortError."""
    try:
        return await call
    except ApiError as exc:
        raise PortError(exc.status, exc.message, reason=exc.reason) from exc
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise PortError(None, f"{type(exc).__name__}: {exc}") from exc


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
    ) -> None:
        self.world = world
        self.kube = kube
        self.metrics = metrics
        self.gauge = gauge
        self.events = events
        self.enqueue = enqueue
        self.retirer = Retirer(name=identity)
        """Who the operator's retirements are written as."""
        self.clock = clock
        # Terminal registrations kept for lack of a parsable time, by the resourceVersion last logged.
        self._kept_logged: dict[Key, str | None] = {}

    def forget(self, key: Key) -> None:
        """`key` is gone (deleted): nothing more to say about it."""
        self._kept_logged.pop(key, None)

    async def run(self, effects: Effects, *, holds: contextlib.AsyncExitStack | None = None) -> Outcome:
        """Runs `effects` (at most one write) and returns what came of it. A retirement's write lets
        go of `holds` (the reads it acted on) once it is answered."""
        key = effects.key
        if effects.retire is not None:
            raise ValueError("a retirement is decided on the facts read for it (step.retire) before anything is sent")
        if effects.kept is not None:
            self._log_kept(key, effects.kept)
        if effects.event is not None:
            event = effects.event
            await self.events.record(
                involved=event.involved, reason=event.reason, evidence=event.evidence, message=event.message
            )
        if effects.record is not None:
            self._record(key, effects.record)
        if effects.conflict:
            self.metrics.cas_conflicts.inc()
        if effects.requeue:
            self.enqueue(key)
        if effects.delete is not None:
            await self._delete(key, effects.delete)
        if effects.write_conditions is not None:
            return await self._write_conditions(key, effects.write_conditions)
        if effects.retire_write is not None:
            if holds is None:
                raise ValueError("a retirement's write is sent holding the reads it was decided on")
            return await self._retire(key, effects.retire_write, holds=holds)
        if effects.reread is not None:
            return await self._reread(key, effects.reread)
        return None

    # --- conditions ----------------------------------------------------------------------------

    async def _write_conditions(self, key: Key, write: WriteConditions) -> Refusal | None:
        try:
            patched = await self.kube.patch_status(namespace=key[0], name=key[1], ops=[dict(op) for op in write.ops])
        except ApiError as exc:
            return Refusal(status=exc.status, said=describe(exc), error=exc)
        self.metrics.status_writes.labels("conditions").inc()
        self.world.observe_registration(patched)
        return None

    async def _reread(self, key: Key, reread: Reread) -> ReadBack:
        """The object as it is now, cached (or forgotten: it is gone)."""
        if reread.conflict:
            logger.info(
                "retire conflict workerregistration=%s/%s resourceVersion=%s: %s: re-reading",
                key[0], key[1], reread.tested, reread.said,
            )  # fmt: skip
        fresh = await self.kube.get_registration(namespace=key[0], name=key[1])
        if fresh is None:
            self.world.forget_registration(key)
            self.gauge.set(key, None)
            return ReadBack(resource_version=None)
        self.world.observe_registration(fresh)
        return ReadBack(resource_version=str((fresh.get("metadata") or {}).get("resourceVersion")))

    # --- the retirement ------------------------------------------------------------------------

    async def _retire(self, key: Key, request: RetireWrite, *, holds: contextlib.AsyncExitStack) -> RetireAnswer:
        """The retirement's compare-and-swap, and the API server's answer to it: the object as
        written, or what it said (or that it did not answer). `holds` (the reads it was decided on)
        is let go of once it is answered: they may serve the next batch now, not after this
        retirement's Event (which waits while the Event backlog is full)."""
        try:
            answer: dict[str, Any] | PortError = await port_call(
                self.kube.patch_status(
                    namespace=key[0], name=key[1], ops=request.ops, decided_on=request.intent.resource_version
                )
            )
        except PortError as error:
            answer = error
        finally:
            await holds.aclose()
        return RetireAnswer(answer=answer)

    def _record(self, key: Key, record: RetireRecord) -> None:
        """What a retirement's outcome tells the cache, the metrics and the log."""
        namespace, name = key
        result = record.result
        outcome = result.outcome
        if record.retired:
            self._count_retirement(key, record.registration, result)
        if record.revoked:
            self.world.set_retire_permission(namespace, False)
        if record.leases is not None:
            self.world.replace_leases(namespace, record.leases)
        if not record.abandoned:
            return
        self.metrics.retire_abandoned.labels(outcome.value).inc()
        if outcome is RetireOutcome.REFUSED_BY_ADMISSION:
            logger.warning(
                "retire refused workerregistration=%s/%s cause=%s policy=%s: %s",
                namespace, name, outcome.value, result.refusal.name if result.refusal else None, result.detail,
            )  # fmt: skip
        elif record.revoked:
            logger.info(
                "retire abandoned workerregistration=%s/%s cause=%s: %s", namespace, name, outcome.value, result.detail
            )
        else:
            logger.info("retire abandoned workerregistration=%s/%s cause=%s", namespace, name, outcome.value)

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
