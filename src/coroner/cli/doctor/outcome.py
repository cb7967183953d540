"""What a doctor check says: PASS, WARN, FAIL or UNKNOWN in one line, the objects it names, its facts.

Every check module builds its `Check` with `passed`, `warned`, `failed` or `unknown`; the small readers of raw
API objects they share are here too, so that each is written once.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Mapping, Sequence
from typing import Any, Final

from coroner.core import api, model


class CheckStatus(enum.StrEnum):
    """A doctor check's outcome; UNKNOWN is a fact that could not be read, never a pass. WARN names
    what a person should look at that may still be right (a registration held past a bound may be
    a live worker's): never a pass, and not a failure of the installation."""

    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    UNKNOWN = "UNKNOWN"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Check:
    """One doctor check: its status, one line for a person, the objects it names, its facts."""

    name: str
    status: CheckStatus
    summary: str
    objects: tuple[str, ...] = ()
    """What the line names, as `-o wide` and `-o json` show it (a namespace, a user where it is one)."""
    facts: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    names: tuple[str, ...] | None = None
    """The API objects among `objects` as `kubectl get -o name` prints them (`kubectl_name`), for `-o name`;
    None: `objects` already are."""

    def kubectl_names(self) -> tuple[str, ...]:
        """What `-o name` prints for this check."""
        return self.objects if self.names is None else self.names


#: The API group of each kind a check names ("" for the core group).
_GROUPS: Final = {
    "Namespace": "",
    "Node": "",
    "Pod": "",
    "ServiceAccount": "",
    "Lease": "coordination.k8s.io",
    "CustomResourceDefinition": "apiextensions.k8s.io",
    "ValidatingAdmissionPolicy": "admissionregistration.k8s.io",
    "ValidatingAdmissionPolicyBinding": "admissionregistration.k8s.io",
    "MutatingAdmissionPolicy": "admissionregistration.k8s.io",
    "MutatingAdmissionPolicyBinding": "admissionregistration.k8s.io",
    "MutatingWebhookConfiguration": "admissionregistration.k8s.io",
    "ConfigMap": "",
    "DaemonSet": "apps",
    api.KIND: api.GROUP,
}


_SERVICE_ACCOUNT_USER: Final = "system:serviceaccount:"


def kubectl_name(kind: str, name: str) -> str:
    """`name` of `kind` as `kubectl get -o name` prints it: ``kind[.group]/name``, the kind in lower case,
    the group for all but the core API, no namespace (``lease.coordination.k8s.io/coroner-operator``)."""
    group = _GROUPS[kind]
    return f"{kind.lower()}{'.' + group if group else ''}/{name}"


def user_object_names(user: str) -> tuple[str, ...]:
    """A user as `-o name` names it: its ServiceAccount where it is one (``system:serviceaccount:NS:NAME``);
    any other user is no API object, so nothing."""
    if not user.startswith(_SERVICE_ACCOUNT_USER):
        return ()
    namespace, _, account = user.removeprefix(_SERVICE_ACCOUNT_USER).partition(":")
    return (kubectl_name("ServiceAccount", account),) if namespace and account else ()


def passed(name: str, summary: str, *, facts: Mapping[str, Any] | None = None) -> Check:
    """A PASS line."""
    return Check(name=name, status=CheckStatus.PASS, summary=summary, facts=facts or {})


def _named(
    status: CheckStatus,
    name: str,
    summary: str,
    objects: Sequence[str],
    facts: Mapping[str, Any] | None,
    names: Sequence[str] | None,
) -> Check:
    return Check(
        name=name,
        status=status,
        summary=summary,
        objects=tuple(objects),
        facts=facts or {},
        names=None if names is None else tuple(names),
    )


def warned(
    name: str,
    summary: str,
    *,
    objects: Sequence[str] = (),
    facts: Mapping[str, Any] | None = None,
    names: Sequence[str] | None = None,
) -> Check:
    """A WARN line naming the `objects` a person should look at (`names`: as `Check.names`)."""
    return _named(CheckStatus.WARN, name, summary, objects, facts, names)


def failed(
    name: str,
    summary: str,
    *,
    objects: Sequence[str] = (),
    facts: Mapping[str, Any] | None = None,
    names: Sequence[str] | None = None,
) -> Check:
    """A FAIL line naming the failing `objects` (`names`: as `Check.names`)."""
    return _named(CheckStatus.FAIL, name, summary, objects, facts, names)


def unknown(
    name: str,
    summary: str,
    *,
    objects: Sequence[str] = (),
    facts: Mapping[str, Any] | None = None,
    names: Sequence[str] | None = None,
) -> Check:
    """An UNKNOWN line: a fact that could not be read (never a pass, never zero)."""
    return _named(CheckStatus.UNKNOWN, name, summary, objects, facts, names)


def doctor_exit_code(checks: Sequence[Check]) -> int:
    """1 when any check FAILs; UNKNOWN and WARN alone do not fail (they are reported: the command
    says so on stderr, and the alert of a WARN is the automation's signal)."""
    return 1 if any(check.status == CheckStatus.FAIL for check in checks) else 0


def condition_status(status: object, condition_type: str) -> str | None:
    """The status of the condition `condition_type` in an object's raw status; None if absent."""
    if not isinstance(status, Mapping):
        return None
    for item in status.get("conditions") or []:
        if isinstance(item, Mapping) and item.get("type") == condition_type:
            value = item.get("status")
            return value if isinstance(value, str) else None
    return None


def object_name(body: Mapping[str, Any]) -> str:
    """metadata.name of a raw object ("" when absent)."""
    return str((body.get("metadata") or {}).get("name") or "")


def stamp(moment: datetime.datetime | None) -> str | None:
    """`moment` as the API writes times; None stays None (unknown, never a made-up time)."""
    return None if moment is None else model.format_time(moment)


def duration(span: datetime.timedelta) -> str:
    """A span as a person reads it: ``45s``, ``3m05s``, ``2h07m``, ``3d4h`` (negative: ``0s``)."""
    seconds = max(0, int(span.total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"
