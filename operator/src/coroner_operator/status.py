"""What the operator writes: conditions that mirror the decision, and the JSON patches that carry them.

Pure functions: the reconciler compares the desired conditions with the stored ones and writes only
when they differ (level-based: an unchanged decision is never written twice).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from coroner.core import conditions as cond
from coroner.core import model
from coroner.core import wire as retirement
from coroner.core.decision import Decision
from coroner.core.reasons import ConditionType, Reason, Verdict

#: Reason of the Retired condition while a registration is active.
ACTIVE = "Active"
#: Reason of the Retired condition once the worker released its registration.
RELEASED = "Released"


def attested_condition(registration: model.Registration) -> tuple[bool, str, str]:
    """(status, reason, message) of the Attested condition: reason is the verdict."""
    attestation = registration.attestation
    if attestation is None:
        return (
            False,
            Reason.ATTESTATION_MISSING.value,
            f"no attestation yet from the agent of node {registration.node_name or '?'}",
        )
    verdict = attestation.verdict if isinstance(attestation.verdict, Verdict) else Verdict.UNKNOWN
    # No observedTime here: the agent refreshes an unchanged verdict periodically, and a message
    # that moved with it would cost a status write per refresh (the time is in status.attestation).
    message = (
        f"{attestation.verdict or '?'} ({attestation.evidence or 'no evidence'}) by the agent of node "
        f"{attestation.agent_node or '?'}: {attestation.detail or ''}"
    )
    return True, verdict.value, message.rstrip(": ")


def desired_conditions(
    registration: model.Registration, decision: Decision, *, now: datetime.datetime
) -> list[model.Condition]:
    """Attested, Retirable and Retired (False/Active, or False/Released) for a registration.

    A retired registration's Retired condition is its history (whoever wrote it, the operator or a
    human's ``kubectl coroner apply``) and is left exactly as stored."""
    generation = registration.generation
    current = list(registration.conditions)
    status, reason, message = attested_condition(registration)
    current = cond.set_condition(
        current,
        type=ConditionType.ATTESTED,
        status=status,
        reason=reason,
        message=message,
        observed_generation=generation,
        now=now,
    )
    current = cond.set_condition(
        current,
        type=ConditionType.RETIRABLE,
        status=decision.retirable,
        reason=decision.reason.value,
        message=decision.detail,
        observed_generation=generation,
        now=now,
    )
    if registration.retired:
        return current
    return cond.set_condition(
        current,
        type=ConditionType.RETIRED,
        status=False,
        reason=RELEASED if registration.released else ACTIVE,
        message=(
            "released by the worker; nothing to retire"
            if registration.released
            else "active; the Retirable condition says why it is or is not retirable"
        ),
        observed_generation=generation,
        now=now,
    )


def retired_conditions(
    registration: model.Registration, decision: Decision, *, now: datetime.datetime
) -> list[model.Condition]:
    """The conditions written together with status.retirement, in one compare-and-swap patch.

    Retirable reads AlreadyTerminal at once, as it will for ever after: a retired registration
    reads terminal everywhere (the printer column included), and no second write is needed to say so.
    """
    current = desired_conditions(registration, decision, now=now)
    evidence = decision.death_evidence.value if decision.death_evidence else "Unknown"
    current = cond.set_condition(
        current,
        type=ConditionType.RETIRABLE,
        status=False,
        reason=Reason.ALREADY_TERMINAL.value,
        message=f"retired ({evidence}); terminal registrations are history and are not decided again",
        observed_generation=registration.generation,
        now=now,
    )
    return cond.set_condition(
        current,
        type=ConditionType.RETIRED,
        status=True,
        reason=evidence,
        message=f"retired: {decision.detail}",
        observed_generation=registration.generation,
        now=now,
    )


def conditions_ops(
    body: Mapping[str, Any], conditions: list[model.Condition], *, resource_version: str
) -> list[dict[str, Any]]:
    """A compare-and-swap JSON patch that sets status.conditions (see coroner.core.wire)."""
    return retirement.status_ops(
        body=body, resource_version=resource_version, conditions=cond.render_conditions(conditions)
    )


def retirement_ops(
    body: Mapping[str, Any],
    registration: model.Registration,
    decision: Decision,
    *,
    retired_by: str,
    now: datetime.datetime,
) -> list[dict[str, Any]]:
    """The compare-and-swap retirement: test resourceVersion and the relied-on attestation, then write."""
    status = body.get("status")
    attestation = status.get("attestation") if isinstance(status, Mapping) else None
    return retirement.status_ops(
        body=body,
        resource_version=str(registration.resource_version),
        conditions=cond.render_conditions(retired_conditions(registration, decision, now=now)),
        retirement=retirement.retirement_record(
            decision=decision, retired_by=retired_by, now=now, attestation=attestation
        ),
    )


def conditions_changed(registration: model.Registration, desired: list[model.Condition]) -> bool:
    return cond.render_conditions(list(registration.conditions)) != cond.render_conditions(desired)


def reads_terminal(registration: model.Registration) -> bool:
    """The Retirable condition already says AlreadyTerminal (whatever its message)."""
    retirable = cond.find_condition(registration.conditions, type=ConditionType.RETIRABLE)
    return retirable is not None and retirable.reason == Reason.ALREADY_TERMINAL.value
