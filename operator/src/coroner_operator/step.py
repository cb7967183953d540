"""The reconcile step: `(registration, facts, policy, now) -> Effects`, and what follows each
outcome. Pure.

No I/O, no clock, no logging: everything it needs is passed in, everything it wants done is
returned (`coroner_operator.effects`). The facts were gathered before it (from the cache, plus the
live reads the gathering does: the namespace's retire capability the first time, and a Node GET
once its quarantine ended); the executor runs what it returns and says what came of it, and
`after` decides what follows from that (the reconciler calls it until nothing does).

Three calls, one decision each:

* `reconcile`: the decision from the cache; a retirable registration asks for the facts a
  retirement needs, read after that decision (`Effects.retire`);
* `retire`: on those facts (the capability, the live Lease fence), the retire protocol's pure
  steps (`coroner.retire.retirement`): the compare-and-swap patch as an effect
  (`Effects.retire_write`), or what follows a retirement that writes nothing;
* `after`: what follows an outcome — the answer to the compare-and-swap read by the protocol's
  one mapping (`coroner.retire.written`); the Event and the cache's record of a retirement that
  landed; Retirable rewritten (RetireRefusedByAdmission) after a refusal by admission, and a
  retry; a re-read after a conflict; the namespace's grant recorded as revoked; the live Leases
  taken in; a retry with backoff.

For one registration:

* **active**: decide; retirable → `retire` (the retire protocol re-checks the capability, fences on
  the Leases, decides again and writes by compare-and-swap); otherwise `write_conditions` when the
  conditions would say something new (level-based: an unchanged decision is never written again).
  `requeue_at` is the earliest instant the decision can change by the clock alone, or the end of
  a missing Node's quarantine (when node-deletion evidence is on), whichever comes first.
* **terminal** (Retired or Released): `delete` once its retention ended (`coroner_operator.
  retention`); otherwise, until Retirable says AlreadyTerminal, a `write_conditions` that says so
  (once: the printer column stops showing the last live decision). Terminal registrations are not
  counted in the decision gauge and never requeued by time (the periodic sweep brings them back).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from coroner.core import conditions as cond
from coroner.core import model, wire
from coroner.core.decision import Decision, Facts, Policy, decide
from coroner.core.reasons import Reason
from coroner.retire import (
    PortError,
    RetireIntent,
    RetireOutcome,
    Retirer,
    RetireResult,
    retired_event,
    retirement,
    written,
)
from coroner_operator.effects import (
    Delete,
    Effects,
    Outcome,
    ReadBack,
    Refusal,
    Reread,
    RetireAnswer,
    RetireFailed,
    RetireRecord,
    WriteConditions,
    WriteRefused,
)
from coroner_operator.retention import deletion_due


def reconcile(
    *,
    body: Mapping[str, Any],
    registration: model.Registration,
    facts: Facts,
    policy: Policy,
    now: datetime.datetime,
    retention_seconds: float,
) -> Effects:
    key = (registration.namespace or "", registration.name or "")
    if registration.terminal:
        return _terminal(key, body, registration, facts=facts, policy=policy, now=now, retention=retention_seconds)
    decision = decide(registration=registration, facts=facts, policy=policy, now=now)
    requeue_at = _earliest(
        decision.next_evaluation_at, quarantine_end(registration, facts=facts, policy=policy, now=now)
    )
    if decision.retirable:
        intent = RetireIntent(body=body, registration=registration, decision=decision, facts=facts, policy=policy)
        refused = cond.refused_by_admission(registration.conditions, retirable=True)
        reason = Reason.RETIRE_REFUSED_BY_ADMISSION if refused else decision.reason
        return Effects(key=key, reason=reason, retire=intent, requeue_at=requeue_at)
    return Effects(
        key=key,
        reason=decision.reason,
        write_conditions=conditions_write(body, registration, decision, now=now),
        requeue_at=requeue_at,
    )


def conditions_write(
    body: Mapping[str, Any], registration: model.Registration, decision: Decision, *, now: datetime.datetime
) -> WriteConditions | None:
    """The compare-and-swap write of the conditions `decision` implies, or None if they say it already."""
    desired = wire.desired_conditions(registration, decision, now=now)
    if not wire.conditions_changed(registration, desired):
        return None
    resource_version = str(registration.resource_version)
    return WriteConditions(
        ops=tuple(wire.conditions_ops(body, desired, resource_version=resource_version)),
        resource_version=resource_version,
    )


def retire(
    effects: Effects,
    *,
    granted: bool | None,
    fence: Sequence[Mapping[str, Any]] | PortError,
    retirer: Retirer,
    now: datetime.datetime,
) -> Effects:
    """The retirement `effects` asked for (`Effects.retire`), decided on the facts read after its
    decision: the namespace's capability and the live Leases of its fence (or what kept them from
    being read). The compare-and-swap as `retire_write`, or what follows a retirement that writes
    nothing (`after`)."""
    intent = effects.retire
    if intent is None:
        raise ValueError("only a retirable registration's effects ask for a retirement")
    decided = retirement(intent, granted=granted, listed=fence, retirer=retirer, now=now)
    if isinstance(decided, RetireResult):
        return _retired(effects.key, intent, decided, retirer=retirer, now=now)
    return Effects(key=effects.key, reason=effects.reason, retire_write=decided, requeue_at=effects.requeue_at)


def after(effects: Effects, outcome: Outcome, *, retirer: Retirer, now: datetime.datetime) -> Effects | None:
    """What follows `outcome`, what came of running `effects`: None when nothing does (the
    reconciler then raises `effects.fail`, if any). A failure still pending is carried into what
    follows, unless that fails first."""
    follow: Effects | None = None
    if isinstance(outcome, RetireAnswer) and effects.retire_write is not None:
        result = written(effects.retire_write, outcome.answer)
        follow = _retired(effects.key, effects.retire_write.intent, result, retirer=retirer, now=now)
    elif isinstance(outcome, Refusal) and effects.write_conditions is not None:
        if outcome.status in (404, 409, 422):
            follow = Effects(
                key=effects.key, reread=Reread(tested=effects.write_conditions.resource_version, said=outcome.said)
            )
        else:
            follow = Effects(key=effects.key, fail=outcome.error)
    elif isinstance(outcome, ReadBack) and effects.reread is not None:
        follow = _read_back(effects.key, effects.reread, outcome)
    if follow is not None and follow.fail is None and effects.fail is not None:
        follow = dataclasses.replace(follow, fail=effects.fail)
    return follow


def _retired(
    key: tuple[str, str], intent: RetireIntent, result: RetireResult, *, retirer: Retirer, now: datetime.datetime
) -> Effects:
    """What follows a retirement's outcome (`coroner.retire.RetireOutcome`)."""
    registration = intent.registration
    outcome = result.outcome
    if outcome is RetireOutcome.RETIRED:
        return Effects(
            key=key,
            event=retired_event(result, retirer=retirer),
            record=RetireRecord(registration=registration, result=result, retired=True),
        )
    if outcome is RetireOutcome.PERMISSION_MISSING:
        # Revoked since the namespace was last checked: admission refused the write (its policy
        # for the verb, or RBAC's 403), or the periodic refresh saw it first.
        record = RetireRecord(registration=registration, result=result, abandoned=True, revoked=True)
        return Effects(key=key, record=record, requeue=True)
    if outcome is RetireOutcome.REFUSED_BY_ADMISSION:
        # Admission refused the write though the verb is held: the namespace's grant stays as it
        # is; Retirable says RetireRefusedByAdmission (the policy, what it said); retried with
        # backoff (the same write would be refused again now).
        decided = result.decision or intent.decision
        refused = dataclasses.replace(decided, reason=Reason.RETIRE_REFUSED_BY_ADMISSION, detail=result.detail)
        return Effects(
            key=key,
            record=RetireRecord(registration=registration, result=result, abandoned=True),
            write_conditions=conditions_write(intent.body, registration, refused, now=now),
            fail=RetireFailed(result),
        )
    if outcome in (RetireOutcome.LEASE_FENCE_MOVED, RetireOutcome.ABANDONED):
        abandoned = outcome is RetireOutcome.LEASE_FENCE_MOVED
        record = RetireRecord(registration=registration, result=result, abandoned=abandoned, leases=result.leases)
        return Effects(key=key, record=record, requeue=True)
    if outcome is RetireOutcome.CONFLICT:
        error = result.error
        said = f"{error.status} {error.reason}: {error.message}" if error is not None else "no answer"
        return Effects(key=key, reread=Reread(tested=registration.resource_version, said=said, conflict=True))
    return Effects(key=key, fail=RetireFailed(result))  # UNREACHABLE, FAILED: retried with backoff


def _read_back(key: tuple[str, str], reread: Reread, found: ReadBack) -> Effects:
    """After a write refused for moving: gone is forgotten (the executor did), moved is reconciled
    again; not moved at all (still at the version the write tested) means the write was refused
    for what it said, not for a conflict — a 422 for the CRD's limits (conditions at maxItems),
    say: the same write would be refused again, so it fails for the runtime's capped backoff
    instead of a hot loop."""
    if found.resource_version is None:
        return Effects(key=key, conflict=reread.conflict)
    if reread.tested is not None and found.resource_version == reread.tested:
        return Effects(
            key=key,
            fail=WriteRefused(
                f"the write to workerregistration {key[0]}/{key[1]} at resourceVersion {reread.tested} was refused "
                f"though it had not moved: {reread.said}"
            ),
        )
    return Effects(key=key, requeue=True, conflict=reread.conflict)


def quarantine_end(
    registration: model.Registration, *, facts: Facts, policy: Policy, now: datetime.datetime
) -> datetime.datetime | None:
    """When a Node the cache no longer sees may be confirmed gone (a live GET), if that is still ahead.

    Only where policy accepts node-deletion evidence; before then the decision cannot use it, and
    nothing else would bring the registration back at that instant."""
    node = facts.nodes.get(registration.node_name or "")
    if not policy.node_deletion_evidence or node is None or node.exists is not None or node.missing_since is None:
        return None
    end = node.missing_since + datetime.timedelta(seconds=policy.node_deletion_quarantine_seconds)
    return end if now < end else None


def _terminal(
    key: tuple[str, str],
    body: Mapping[str, Any],
    registration: model.Registration,
    *,
    facts: Facts,
    policy: Policy,
    now: datetime.datetime,
    retention: float,
) -> Effects:
    verdict = deletion_due(registration, retention_seconds=retention)
    kept = verdict.why if retention > 0 and verdict.terminal is not None and verdict.since is None else None
    if (
        verdict.due is not None
        and verdict.terminal is not None
        and verdict.due <= now
        and registration.uid is not None
        and registration.resource_version is not None
    ):
        # The preconditions make the server refuse the delete if the object changed since this read:
        # only what was read terminal is ever deleted. (The API always sets uid and resourceVersion.)
        delete = Delete(
            uid=registration.uid,
            resource_version=registration.resource_version,
            terminal=verdict.terminal,
            since=verdict.since,
            retention_seconds=retention,
        )
        return Effects(key=key, delete=delete)
    if wire.reads_terminal(registration):
        return Effects(key=key, kept=kept)
    # Released by the worker, or retired by a person's `kubectl coroner apply` (which may not write
    # Retirable): say so once in Retirable (AlreadyTerminal). The operator's own retirements wrote
    # it already; the Retired condition stays as written, as history.
    final = decide(registration=registration, facts=facts, policy=policy, now=now)
    return Effects(key=key, write_conditions=conditions_write(body, registration, final, now=now), kept=kept)


def _earliest(*moments: datetime.datetime | None) -> datetime.datetime | None:
    present = [m for m in moments if m is not None]
    return min(present) if present else None
