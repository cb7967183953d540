"""The decision `Policy` as JSON: the one shape the operator publishes and the CLI reads.

The operator publishes the policy it decides with on its own Lease (annotation
``coroner.dev/policy``, `coroner.core.api.POLICY_ANNOTATION`), so that ``kubectl coroner plan``,
``apply`` and ``doctor`` decide with exactly that policy instead of asking a person to repeat the
operator's flags. The shape is one JSON object holding every field of `coroner.core.decision.Policy`
under its camelCase name (``node_deletion_quarantine_seconds`` → ``nodeDeletionQuarantineSeconds``),
with nothing else.

Parsing is total and strict: anything but exactly that object — not JSON, a missing or unknown
field, a wrong type, a value the Policy refuses — is `PolicyUnreadable` with one sentence saying
why, never a policy silently filled with defaults. A reader that decided with defaults where the
operator runs with something else would show a plan the operator does not follow.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any, Final

from coroner.core.decision import Policy


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyUnreadable:
    """The published policy could not be used; `reason` says why, in one sentence fragment."""

    reason: str


def camel(name: str) -> str:
    """``node_deletion_evidence`` → ``nodeDeletionEvidence``."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _fields() -> dict[str, dataclasses.Field[Any]]:
    return {camel(field.name): field for field in dataclasses.fields(Policy)}


#: camelCase key → Policy field name, for every field of Policy.
FIELD_NAMES: Final = {key: field.name for key, field in _fields().items()}


def policy_document(policy: Policy) -> dict[str, Any]:
    """Every field of `policy` under its camelCase name, in field order; numbers as floats, so that
    ``Policy(x=300)`` and ``Policy(x=300.0)`` (equal policies) publish the same bytes."""
    return {key: _plain(getattr(policy, name)) for key, name in FIELD_NAMES.items()}


def _plain(value: object) -> object:
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def dump_policy(policy: Policy) -> str:
    """The annotation value: `policy_document` as compact JSON with sorted keys (stable bytes)."""
    return json.dumps(policy_document(policy), sort_keys=True, separators=(",", ":"), allow_nan=False)


def parse_policy(raw: object) -> Policy | PolicyUnreadable:
    """The Policy `dump_policy` wrote, or why `raw` is not one. Never raises."""
    if not isinstance(raw, str):
        return PolicyUnreadable(reason=f"it is not a string ({type(raw).__name__})")
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError):
        return PolicyUnreadable(reason=f"it is not JSON ({_clip(raw)!r})")
    if not isinstance(document, Mapping):
        return PolicyUnreadable(reason=f"it is not a JSON object ({_clip(raw)!r})")
    fields = _fields()
    unknown = sorted(str(key) for key in document if key not in fields)
    if unknown:
        return PolicyUnreadable(
            reason=f"it names field(s) this kubectl-coroner does not know ({', '.join(unknown)}); if the "
            f"operator is newer, upgrade the coroner package"
        )
    missing = [key for key in fields if key not in document]
    if missing:
        return PolicyUnreadable(reason=f"it lacks field(s) {', '.join(missing)}")
    values: dict[str, Any] = {}
    for key, field in fields.items():
        value = document[key]
        problem = _type_problem(value, default=field.default)
        if problem:
            return PolicyUnreadable(reason=f"its {key} is {_clip(json.dumps(value))}, {problem}")
        values[field.name] = _plain(value)
    try:
        return Policy(**values)
    except (ValueError, TypeError, OverflowError) as exc:
        return PolicyUnreadable(reason=f"the Policy refuses it ({exc})")


def _type_problem(value: object, *, default: object) -> str:
    """Empty when `value` has the JSON type of the field whose default is `default`."""
    if isinstance(default, bool):
        return "" if isinstance(value, bool) else "not true or false"
    if isinstance(default, int | float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return "not a number"
        try:
            finite = math.isfinite(float(value))
        except OverflowError:
            finite = False
        return "" if finite else "not a finite number"
    if default is dataclasses.MISSING or isinstance(value, type(default)):
        return ""
    return f"not a {type(default).__name__}"


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
