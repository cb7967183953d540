"""`parse_registration`: any object the API server can hold, read totally into a `Registration`."""

from __future__ import annotations

import datetime
import re
import types
from collections.abc import Mapping, Sequence
from typing import Final, TypeVar

from coroner.core import memo
from coroner.core.api import REGISTERED_BY_ANNOTATION
from coroner.core.model.records import (
    HEARTBEAT_INTERVAL_MAX,
    HEARTBEAT_TTL_MAX,
    Attestation,
    Condition,
    Heartbeat,
    Incarnation,
    Problem,
    Registration,
    Retirement,
)
from coroner.core.model.scalars import DIGITS, integer, parse_pid, parse_time
from coroner.core.reasons import ConditionType, Evidence, Verdict

# Deeper than any object the API server accepts; beyond it a copy is cut off instead of recursing
# until Python's stack gives out (parse_registration must never raise).
_MAX_COPY_DEPTH: Final = 64


class _Reader:
    """Reads fields out of untrusted JSON, collecting problems instead of raising."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def flag(self, path: str, message: str) -> None:
        self.problems.append((path, message))

    def mapping(self, parent: Mapping[str, object] | None, key: str, path: str) -> Mapping[str, object] | None:
        value = None if parent is None else parent.get(key)
        if value is None:
            return None
        # `type(...) is dict` first: the same answer for what JSON decodes to, without the ABC check.
        if type(value) is dict or isinstance(value, Mapping):
            return value
        self.flag(path, f"expected an object, got {_kind(value)}")
        return None

    def string(
        self,
        parent: Mapping[str, object] | None,
        key: str,
        path: str,
        *,
        required: bool = False,
        empty_ok: bool = True,
        pattern: re.Pattern[str] | None = None,
    ) -> str | None:
        value = None if parent is None else parent.get(key)
        if type(value) is str and pattern is None and (empty_ok or value):
            return value  # the common case, decided as below would decide it
        if value is None:
            if required:
                self.flag(path, "missing")
            return None
        if not isinstance(value, str):
            self.flag(path, f"expected a string, got {_kind(value)}")
            return None
        if not value and not empty_ok:
            self.flag(path, "empty")
            return None
        if pattern is not None and not pattern.fullmatch(value):
            self.flag(path, f"invalid value {value[:64]!r}")
            return None
        return value

    def integer(
        self,
        parent: Mapping[str, object] | None,
        key: str,
        path: str,
        *,
        required: bool = False,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> int | None:
        value = None if parent is None else parent.get(key)
        if value is None:
            if required:
                self.flag(path, "missing")
            return None
        number = integer(value)
        if number is None:
            self.flag(path, f"expected an integer, got {_kind(value)}")
            return None
        if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
            self.flag(path, f"{number} is outside {minimum}..{maximum}")
            return None
        return number

    def time(
        self, parent: Mapping[str, object] | None, key: str, path: str, *, required: bool = False
    ) -> tuple[datetime.datetime | None, bool]:
        """The parsed time and whether a value was present at all."""
        value = None if parent is None else parent.get(key)
        if value is None:
            if required:
                self.flag(path, "missing")
            return None, False
        parsed = parse_time(value)
        if parsed is None:
            shown = value[:64] if isinstance(value, str) else _kind(value)
            self.flag(path, f"not an RFC 3339 timestamp: {shown!r}")
        return parsed, True

    def incarnation(self, parent: Mapping[str, object] | None, path: str, *, required: bool) -> Incarnation:
        pid_value = None if parent is None else parent.get("pid")
        pid = parse_pid(pid_value)
        pid_path, boot_id_path, pid_namespace_path, start_time_path, host_id_path, inode_path = _incarnation_paths(path)
        if pid is None and (required or pid_value is not None):
            self.flag(pid_path, "missing" if pid_value is None else f"invalid pid {_shown(pid_value)}")
        return Incarnation(
            boot_id=self.string(parent, "bootId", boot_id_path, required=required, empty_ok=False),
            pid_namespace=self.string(parent, "pidNamespace", pid_namespace_path, required=required, pattern=DIGITS),
            pid=pid,
            start_time=self.string(parent, "startTime", start_time_path, required=required, pattern=DIGITS),
            host_id=self.string(parent, "hostId", host_id_path, required=required, empty_ok=False),
            pidfd_inode=self.string(parent, "pidfdInode", inode_path, pattern=DIGITS),
        )


def _spelled_incarnation_paths(path: str) -> tuple[str, str, str, str, str, str]:
    fields = ("pid", "bootId", "pidNamespace", "startTime", "hostId", "pidfdInode")
    return tuple(f"{path}.{field}" for field in fields)  # type: ignore[return-value]


def _spelled_condition_paths(index: int) -> tuple[str, str, str, str, str, str, str]:
    path = f"status.conditions[{index}]"
    fields = ("type", "status", "reason", "message", "lastTransitionTime", "observedGeneration")
    return (path, *(f"{path}.{field}" for field in fields))  # type: ignore[return-value]


# The problem paths the reader names, built once for the common prefixes and indexes (others when met).
_INCARNATION_PATHS: Final = {
    prefix: _spelled_incarnation_paths(prefix) for prefix in ("spec.incarnation", "status.attestation.incarnation")
}
_CONDITION_PATHS: Final = tuple(_spelled_condition_paths(index) for index in range(8))


def _incarnation_paths(path: str) -> tuple[str, str, str, str, str, str]:
    """The paths of an incarnation's fields under `path` (pid, bootId, pidNamespace, startTime, hostId,
    pidfdInode)."""
    return _INCARNATION_PATHS.get(path) or _spelled_incarnation_paths(path)


def _condition_paths(index: int) -> tuple[str, str, str, str, str, str, str]:
    """The paths of the condition at `index`: itself, then its type, status, reason, message,
    lastTransitionTime and observedGeneration."""
    return _CONDITION_PATHS[index] if index < len(_CONDITION_PATHS) else _spelled_condition_paths(index)


@memo.by_identity
def parse_registration(obj: object, *, raw_attestation: bool = True) -> Registration:
    """A `Registration` from a raw API object; never raises, whatever `obj` is.

    Missing or invalid fields become None and are listed in ``problems``. A registration without
    ``status.lastHeartbeatTime`` takes ``metadata.creationTimestamp`` as its last heartbeat: birth
    is the first sign of life, so a worker that died before its first heartbeat still expires.
    Without `raw_attestation` the attestation's `raw` copy is left empty (a cache that keeps the
    stored status itself, and holds 150,000 of these, need not keep it twice).
    """
    reader = _Reader()
    root: Mapping[str, object] | None = obj if type(obj) is dict or isinstance(obj, Mapping) else None
    if root is None:
        reader.flag("", f"expected an object, got {_kind(obj)}")
    metadata = reader.mapping(root, "metadata", "metadata")
    spec = reader.mapping(root, "spec", "spec")
    status = reader.mapping(root, "status", "status")

    creation_time, _ = reader.time(metadata, "creationTimestamp", "metadata.creationTimestamp", required=True)
    raw_heartbeat = None if status is None else status.get("lastHeartbeatTime")
    heartbeat_time, heartbeat_present = reader.time(status, "lastHeartbeatTime", "status.lastHeartbeatTime")
    if heartbeat_present:
        heartbeat_unparsable = heartbeat_time is None
    else:
        # No heartbeat yet: the object's birth is the worker's first sign of life.
        creation_raw = None if metadata is None else metadata.get("creationTimestamp")
        heartbeat_time = creation_time
        heartbeat_unparsable = creation_raw is not None and creation_time is None

    conditions = _conditions(reader, status)
    retirement = _retirement(reader, status)
    retired = retirement is not None or any(c.type == ConditionType.RETIRED and c.status == "True" for c in conditions)
    released = any(c.type == ConditionType.RELEASED and c.status == "True" for c in conditions)
    heartbeat = reader.mapping(spec, "heartbeat", "spec.heartbeat")

    return Registration(
        namespace=reader.string(metadata, "namespace", "metadata.namespace", required=True, empty_ok=False),
        name=reader.string(metadata, "name", "metadata.name", required=True, empty_ok=False),
        uid=reader.string(metadata, "uid", "metadata.uid", required=True, empty_ok=False),
        resource_version=reader.string(
            metadata, "resourceVersion", "metadata.resourceVersion", required=True, empty_ok=False
        ),
        generation=reader.integer(metadata, "generation", "metadata.generation", minimum=0),
        creation_time=creation_time,
        labels=_labels(reader, metadata),
        registered_by=_registrant(metadata),
        node_name=reader.string(spec, "nodeName", "spec.nodeName", required=True, empty_ok=False),
        # An empty nodeUID is a launcher that did not know the Node's UID: absent, not invalid.
        node_uid=reader.string(spec, "nodeUID", "spec.nodeUID") or None,
        incarnation=reader.incarnation(
            reader.mapping(spec, "incarnation", "spec.incarnation"), "spec.incarnation", required=True
        ),
        client_instance_id=reader.string(
            spec, "clientInstanceId", "spec.clientInstanceId", required=True, empty_ok=False
        ),
        session_id=reader.string(spec, "sessionId", "spec.sessionId"),
        generation_id=reader.string(spec, "generationId", "spec.generationId"),
        role=reader.string(spec, "role", "spec.role"),
        heartbeat=Heartbeat(
            declared=heartbeat is not None or (spec is not None and spec.get("heartbeat") is not None),
            interval_seconds=reader.integer(
                heartbeat,
                "intervalSeconds",
                "spec.heartbeat.intervalSeconds",
                required=heartbeat is not None,
                minimum=1,
                maximum=HEARTBEAT_INTERVAL_MAX,
            ),
            ttl_seconds=reader.integer(
                heartbeat,
                "ttlSeconds",
                "spec.heartbeat.ttlSeconds",
                required=heartbeat is not None,
                minimum=1,
                maximum=HEARTBEAT_TTL_MAX,
            ),
        ),
        last_heartbeat_time=heartbeat_time,
        last_heartbeat_raw=raw_heartbeat if isinstance(raw_heartbeat, str) else None,
        heartbeat_unparsable=heartbeat_unparsable,
        attestation=_attestation(reader, status, raw=raw_attestation),
        conditions=conditions,
        retirement=retirement,
        released=released,
        retired=retired,
        problems=tuple(reader.problems),
    )


def _attestation(reader: _Reader, status: Mapping[str, object] | None, *, raw: bool) -> Attestation | None:
    path = "status.attestation"
    body = reader.mapping(status, "attestation", path)
    if body is None:
        return None
    agent = reader.mapping(body, "agent", "status.attestation.agent")
    return Attestation(
        verdict=_member(reader, body, "verdict", "status.attestation.verdict", Verdict),
        evidence=_member(reader, body, "evidence", "status.attestation.evidence", Evidence),
        detail=reader.string(body, "detail", "status.attestation.detail"),
        incarnation=reader.incarnation(
            reader.mapping(body, "incarnation", "status.attestation.incarnation"),
            "status.attestation.incarnation",
            required=True,
        ),
        boot_id=reader.string(body, "bootId", "status.attestation.bootId", required=True, empty_ok=False),
        host_id=reader.string(body, "hostId", "status.attestation.hostId", required=True, empty_ok=False),
        observed_time=reader.time(body, "observedTime", "status.attestation.observedTime", required=True)[0],
        first_observed_time=reader.time(body, "firstObservedTime", "status.attestation.firstObservedTime")[0],
        heartbeat_seen=reader.string(body, "heartbeatSeen", "status.attestation.heartbeatSeen", required=True),
        agent_node=reader.string(agent, "nodeName", "status.attestation.agent.nodeName", required=True, empty_ok=False),
        agent_pod=reader.string(agent, "podName", "status.attestation.agent.podName"),
        agent_identity=reader.string(agent, "identity", "status.attestation.agent.identity"),
        raw=_json_copy(body, depth=0) if raw else _NO_RAW,
    )


_NO_RAW: Mapping[str, object] = types.MappingProxyType({})


_Member = TypeVar("_Member", Verdict, Evidence)


def _member(
    reader: _Reader, body: Mapping[str, object], key: str, path: str, enum_type: type[_Member]
) -> _Member | str | None:
    value = reader.string(body, key, path, required=True)
    if value is None:
        return None
    try:
        return enum_type(value)
    except ValueError:
        # Kept verbatim so the decision can say what it refused to guess at.
        reader.flag(path, f"unrecognised {key} {value[:64]!r}")
        return value


def _conditions(reader: _Reader, status: Mapping[str, object] | None) -> tuple[Condition, ...]:
    value = None if status is None else status.get("conditions")
    if value is None:
        return ()
    if type(value) is not list and (not isinstance(value, Sequence) or isinstance(value, str | bytes)):
        reader.flag("status.conditions", f"expected a list, got {_kind(value)}")
        return ()
    parsed: list[Condition] = []
    for index, item in enumerate(value):
        path, type_path, status_path, reason_path, message_path, time_path, generation_path = _condition_paths(index)
        if type(item) is not dict and not isinstance(item, Mapping):
            reader.flag(path, f"expected an object, got {_kind(item)}")
            continue
        condition_type = reader.string(item, "type", type_path, required=True, empty_ok=False)
        if condition_type is None:
            continue
        parsed.append(
            Condition(
                type=condition_type,
                status=reader.string(item, "status", status_path, required=True),
                reason=reader.string(item, "reason", reason_path, required=True),
                message=reader.string(item, "message", message_path),
                last_transition_time=reader.time(item, "lastTransitionTime", time_path, required=True)[0],
                observed_generation=reader.integer(item, "observedGeneration", generation_path, minimum=0),
            )
        )
    return tuple(parsed)


def _retirement(reader: _Reader, status: Mapping[str, object] | None) -> Retirement | None:
    value = None if status is None else status.get("retirement")
    if value is None:
        return None
    if not isinstance(value, Mapping):
        # Whatever shape it has, someone wrote a retirement: treat the object as terminal rather
        # than risk a second retirement of it.
        reader.flag("status.retirement", f"expected an object, got {_kind(value)}")
        return Retirement()
    return Retirement(
        retired_time=reader.time(value, "retiredTime", "status.retirement.retiredTime")[0],
        retired_by=reader.string(value, "retiredBy", "status.retirement.retiredBy"),
        reason=reader.string(value, "reason", "status.retirement.reason"),
        decision=reader.string(value, "decision", "status.retirement.decision"),
        statement=reader.string(value, "statement", "status.retirement.statement"),
    )


def _registrant(metadata: Mapping[str, object] | None) -> str | None:
    """The registrant annotation; anything but a non-empty string is unknown (not a problem of the
    registration: registrations made before admission recorded it have none)."""
    annotations = None if metadata is None else metadata.get("annotations")
    value = annotations.get(REGISTERED_BY_ANNOTATION) if isinstance(annotations, Mapping) else None
    return value if isinstance(value, str) and value else None


def _labels(reader: _Reader, metadata: Mapping[str, object] | None) -> Mapping[str, str]:
    value = reader.mapping(metadata, "labels", "metadata.labels")
    if value is None:
        return types.MappingProxyType({})
    labels: dict[str, str] = {}
    for key, label in value.items():
        if isinstance(key, str) and isinstance(label, str):
            labels[key] = label
        else:
            reader.flag(f"metadata.labels.{key}", f"expected a string, got {_kind(label)}")
    return types.MappingProxyType(labels)


# The JSON scalars: `_json_value` returns each of them as it is (within the depth), so the copy
# skips the call for them; anything else (a subclass included) takes the general path.
_SCALARS: Final = frozenset({str, int, float, bool, type(None)})


def _json_copy(value: Mapping[str, object], *, depth: int) -> dict[str, object]:
    # A plain dict (not a read-only view): it goes into JSON patches, which must serialise it.
    child = depth + 1
    if child > _MAX_COPY_DEPTH:
        return {str(key): None for key, _ in value.items()}
    return {str(key): item if type(item) in _SCALARS else _json_value(item, depth=child) for key, item in value.items()}


def _json_value(value: object, *, depth: int) -> object:
    if depth > _MAX_COPY_DEPTH:
        return None
    if type(value) is dict or isinstance(value, Mapping):
        return _json_copy(value, depth=depth)
    if isinstance(value, list | tuple):
        return [_json_value(item, depth=depth + 1) for item in value]
    return value


def _kind(value: object) -> str:
    return type(value).__name__


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 64 else text[:61] + "..."
