"""``metav1.Condition`` bookkeeping with apimachinery's ``meta.SetStatusCondition`` semantics.

Conditions are how a person (``kubectl get registrations``) and every other component read what
Coroner concluded. The rules are Kubernetes' own, so tools that understand conditions understand
ours: ``lastTransitionTime`` moves only when ``status`` flips, ``observedGeneration`` is always
set, reason and message follow the newest decision. Functions return new lists and never modify
their input, so "nothing changed, write nothing" is a plain equality test on the result.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Sequence

from coroner.core import memo
from coroner.core.model import Condition, format_time
from coroner.core.reasons import ConditionType, Reason


class ConditionStatus(enum.StrEnum):
    """The three values ``metav1.ConditionStatus`` allows."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


def find_condition(conditions: Sequence[Condition], *, type: ConditionType | str) -> Condition | None:  # noqa: A002 -- metav1 field name
    """The condition of this type, or None."""
    return next((condition for condition in conditions if condition.type == type), None)


def refused_by_admission(conditions: Sequence[Condition], *, retirable: bool) -> bool:
    """Retirable by the decision, but the operator's last retirement of it was refused by the API
    server's admission: its stored Retirable condition says RetireRefusedByAdmission. The decision
    cannot see that, and it stays until someone changes the policy that refuses it; what reports a
    registration's reason (the operator's gauge, doctor) reports that one."""
    stored = find_condition(conditions, type=ConditionType.RETIRABLE)
    return retirable and stored is not None and stored.reason == Reason.RETIRE_REFUSED_BY_ADMISSION.value


def set_condition(
    conditions: Sequence[Condition],
    *,
    type: ConditionType | str,  # noqa: A002 -- metav1 field name; callers read like the API
    status: ConditionStatus | str | bool,
    reason: str,
    message: str,
    observed_generation: int | None,
    now: datetime.datetime,
) -> list[Condition]:
    """A new list with the condition of `type` set; the input is left untouched.

    `now` becomes ``lastTransitionTime`` only for a new condition or a flipped status. It is cut to
    whole seconds, the precision ``metav1.Time`` serialises, so a condition that went to the API
    and back compares equal to the one set here.
    """
    status_text = _status(status)
    updated: list[Condition] = []
    found = False
    for condition in conditions:
        if condition.type != type or found:
            updated.append(condition)
            continue
        found = True
        flipped = condition.status != status_text
        # A stored condition without a transition time is repaired: the field is required.
        if flipped or condition.last_transition_time is None:
            transition = _whole_seconds(now)
        elif (condition.reason, condition.message, condition.observed_generation) == (
            reason,
            message,
            observed_generation,
        ):
            updated.append(condition)  # says it already (the common case): the same value
            continue
        else:
            transition = condition.last_transition_time
        updated.append(
            dataclasses.replace(
                condition,
                status=status_text,
                reason=reason,
                message=message,
                observed_generation=observed_generation,
                last_transition_time=transition,
            )
        )
    if not found:
        updated.append(
            Condition(
                type=str(type),
                status=status_text,
                reason=reason,
                message=message,
                last_transition_time=_whole_seconds(now),
                observed_generation=observed_generation,
            )
        )
    return updated


def render_condition(condition: Condition) -> dict[str, object]:
    """The condition as the API stores it: camelCase keys, RFC 3339 UTC times ending in ``Z``."""
    rendered: dict[str, object] = {
        "type": condition.type,
        "status": condition.status or ConditionStatus.UNKNOWN.value,
        "reason": condition.reason or "Unknown",
        "message": condition.message or "",
    }
    if condition.last_transition_time is not None:
        rendered["lastTransitionTime"] = format_time(condition.last_transition_time)
    if condition.observed_generation is not None:
        rendered["observedGeneration"] = condition.observed_generation
    return rendered


def render_conditions(conditions: Sequence[Condition]) -> list[dict[str, object]]:
    """Every condition rendered, in order."""
    return [render_condition(condition) for condition in conditions]


def _status(status: ConditionStatus | str | bool) -> str:
    if isinstance(status, bool):
        return ConditionStatus.TRUE.value if status else ConditionStatus.FALSE.value
    return ConditionStatus(status).value


@memo.by_instant
def _whole_seconds(moment: datetime.datetime) -> datetime.datetime:
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=datetime.UTC)
    return aware.astimezone(datetime.UTC).replace(microsecond=0)
