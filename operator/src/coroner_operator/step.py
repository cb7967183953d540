"""The reconcile step: `(registration, facts, policy, now) -> Effects`. Pure.

No I/O, no clock, no logging: everything it needs is passed in, everything it wants done is
returned (`coroner_operator.effects`). The facts were gathered before it (from the cache, plus the
live reads the gathering does: the namespace's retire capability the first time, and a Node GET
once its quarantine ended); the executor runs what it returns.

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

import datetime
from collections.abc import Mapping
from typing import Any

from coroner.core import conditions as cond
from coroner.core import model, wire
from coroner.core.decision import Decision, Facts, Policy, decide
from coroner.core.reasons import Reason
from coroner.retire import RetireIntent
from coroner_operator.effects import Delete, Effects, WriteConditions
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
