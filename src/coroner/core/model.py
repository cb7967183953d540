"""Typed, immutable records of a `WorkerRegistration`, parsed from what the API server returns.

The decision must be able to read any object the API server can hold — including ones a buggy
launcher, a hostile worker or a hand edit produced — without ever raising: an exception in the
reconcile loop is a hot loop, not a decision. So parsing here is total: a missing or invalid field
becomes ``None`` and is listed in ``Registration.problems`` as ``(field_path, message)``, and the
decision turns those into preserve reasons (unknown is never dead).

Sub-records whose absence is not itself a fact (the incarnation, the heartbeat settings) are always
present, with ``None`` fields when absent; records whose absence *is* a fact (the attestation, the
retirement) are ``None`` when absent.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import re
import types
from collections.abc import Mapping, Sequence
from typing import Any, Final, TypeAlias, TypeVar

from coroner.core import api
from coroner.core.reasons import ConditionType, Evidence, Verdict

#: One parse problem: the field path (dotted, as in docs/api.md) and what is wrong with it.
Problem: TypeAlias = tuple[str, str]
#: An object's (namespace, name): how every cache and queue names a registration.
Key: TypeAlias = tuple[str, str]

UTC: Final = datetime.UTC

#: The CRD's bounds (manifests/base/crd.yaml), in their one Python place (the parser, `coroner run`
#: and tests/unit/test_crd_bounds.py, which checks the CRD agrees); values outside them are invalid,
#: not clamped.
HEARTBEAT_INTERVAL_MAX: Final = 86400
HEARTBEAT_TTL_MAX: Final = 604800

# Deeper than any object the API server accepts; beyond it a copy is cut off instead of recursing
# until Python's stack gives out (parse_registration must never raise).
_MAX_COPY_DEPTH: Final = 64

# RFC 3339 (section 5.6): full-date "T" full-time, fraction optional, "Z" or a numeric offset.
# re.ASCII so that \d never accepts non-ASCII digits such as "٣".
_RFC3339: Final = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,32}))?(?:([Zz])|([+-])(\d{2}):(\d{2}))",
    re.ASCII,
)
# Bounded so that int() never meets a string long enough to raise (Python limits int digits).
_DIGITS: Final = re.compile(r"[0-9]{1,20}", re.ASCII)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Incarnation:
    """One run of one process on one node; a pid number is reused, an incarnation never is."""

    boot_id: str | None = None
    pid_namespace: str | None = None
    pid: int | None = None
    start_time: str | None = None
    host_id: str | None = None

    @property
    def key(self) -> tuple[str | None, str | None, int | None, str | None]:
        """What names the process: (bootId, pidNamespace, pid, startTime); hostId binds it to a host."""
        return (self.boot_id, self.pid_namespace, self.pid, self.start_time)

    @property
    def complete(self) -> bool:
        """Every field present (and therefore valid: invalid fields are parsed as None)."""
        return None not in (*self.key, self.host_id)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    """The worker's opt-in promise: a heartbeat every `interval_seconds`, silence past `ttl_seconds`
    is expiry. Without ``spec.heartbeat`` (the default) the agent's pidfd and Lease are liveness."""

    declared: bool = False
    """``spec.heartbeat`` is present (its fields are then required)."""
    interval_seconds: int | None = None
    ttl_seconds: int | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Attestation:
    """The same-node agent's statement about one incarnation (``status.attestation``).

    Unknown verdict or evidence strings are kept as the raw ``str`` (and reported as problems) so
    that the decision can name exactly what it refused to trust.
    """

    verdict: Verdict | str | None = None
    evidence: Evidence | str | None = None
    detail: str | None = None
    incarnation: Incarnation = dataclasses.field(default_factory=Incarnation)
    boot_id: str | None = None
    host_id: str | None = None
    observed_time: datetime.datetime | None = None
    #: When the agent first saw the evidence it cites; ``observed_time`` is its last look. A
    #: ProcAbsent or BootBoundary is corroborated by the span between them (the agent's own
    #: repeated observations). None when absent or unparsable.
    first_observed_time: datetime.datetime | None = None
    #: ``status.lastHeartbeatTime`` exactly as the agent read it when probing ("" if there was none).
    heartbeat_seen: str | None = None
    agent_node: str | None = None
    agent_pod: str | None = None
    agent_identity: str | None = None
    #: A copy of the attestation exactly as stored, so a compare-and-swap write can ``test`` it verbatim.
    raw: Mapping[str, object] = dataclasses.field(default_factory=dict, compare=False, repr=False)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Condition:
    """A ``metav1.Condition``; fields that were missing or invalid in the stored object are None."""

    type: str
    status: str | None = None
    reason: str | None = None
    message: str | None = None
    last_transition_time: datetime.datetime | None = None
    observed_generation: int | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Retirement:
    """``status.retirement``: terminal history, written once under compare-and-swap."""

    retired_time: datetime.datetime | None = None
    retired_by: str | None = None
    reason: str | None = None
    decision: str | None = None
    statement: str | None = None
    """``Human``: a person stated the (node-level) evidence with ``kubectl coroner apply``; else None."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Registration:
    """A ``WorkerRegistration`` as the decision reads it. Built by `parse_registration` only."""

    namespace: str | None
    name: str | None
    uid: str | None
    resource_version: str | None
    generation: int | None
    creation_time: datetime.datetime | None
    labels: Mapping[str, str]
    node_name: str | None
    node_uid: str | None
    incarnation: Incarnation
    client_instance_id: str | None
    session_id: str | None
    generation_id: str | None
    role: str | None
    heartbeat: Heartbeat
    #: The last sign of life: ``status.lastHeartbeatTime``, or ``metadata.creationTimestamp`` when
    #: the worker has not heartbeaten yet (birth is the first sign of life). None if neither parses.
    last_heartbeat_time: datetime.datetime | None
    #: ``status.lastHeartbeatTime`` exactly as stored (None when absent or not a string); compared
    #: verbatim with ``attestation.heartbeatSeen``, never through clocks.
    last_heartbeat_raw: str | None
    #: A heartbeat time was recorded (or, in its absence, the creation time) but does not parse.
    heartbeat_unparsable: bool
    attestation: Attestation | None
    conditions: tuple[Condition, ...]
    retirement: Retirement | None
    #: ``Released=True``: the worker said goodbye.
    released: bool
    #: ``Retired=True`` or a ``status.retirement`` of any shape: someone already retired it.
    retired: bool
    problems: tuple[Problem, ...]

    @property
    def display_name(self) -> str:
        """``namespace/name`` for humans, with ``?`` for what is unknown."""
        return f"{self.namespace or '?'}/{self.name or '?'}"

    @property
    def terminal(self) -> bool:
        """Retired or released: history, never decided again."""
        return self.retired or self.released


def render_incarnation(incarnation: Incarnation) -> dict[str, Any]:
    """An incarnation as the API stores it (``spec.incarnation``, ``status.attestation.incarnation``);
    absent and invalid fields are left out. The inverse of the parser's incarnation."""
    fields = (
        ("bootId", incarnation.boot_id),
        ("pidNamespace", incarnation.pid_namespace),
        ("pid", incarnation.pid),
        ("startTime", incarnation.start_time),
        ("hostId", incarnation.host_id),
    )
    return {field: value for field, value in fields if value is not None}


def render_attestation(attestation: Attestation) -> dict[str, Any]:
    """``status.attestation`` as the API stores it: the one rendering of the shape `_attestation`
    parses, used by the agent that writes it (`coroner.core.wire.attestation_body`) and by the
    decision's evidence. Absent and invalid fields are left out (parse(render(a)) == a for every
    attestation the parser can return, `raw` aside)."""
    rendered: dict[str, Any] = {}
    for field, value in (
        ("verdict", None if attestation.verdict is None else str(attestation.verdict)),
        ("evidence", None if attestation.evidence is None else str(attestation.evidence)),
        ("detail", attestation.detail),
    ):
        if value is not None:
            rendered[field] = value
    rendered["incarnation"] = render_incarnation(attestation.incarnation)
    for field, value in (
        ("bootId", attestation.boot_id),
        ("hostId", attestation.host_id),
        (
            "observedTime",
            None if attestation.observed_time is None else format_time(attestation.observed_time, fraction=True),
        ),
        (
            "firstObservedTime",
            None
            if attestation.first_observed_time is None
            else format_time(attestation.first_observed_time, fraction=True),
        ),
        ("heartbeatSeen", attestation.heartbeat_seen),
    ):
        if value is not None:
            rendered[field] = value
    agent = {
        field: value
        for field, value in (
            ("nodeName", attestation.agent_node),
            ("podName", attestation.agent_pod),
            ("identity", attestation.agent_identity),
        )
        if value is not None
    }
    if agent:
        rendered["agent"] = agent
    return rendered


def key_of(obj: Registration | Mapping[str, object]) -> Key:
    """(namespace, name) of a parsed registration or of a raw object ("" for what is missing)."""
    if isinstance(obj, Registration):
        return (obj.namespace or "", obj.name or "")
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return ("", "")
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def parse_time(value: object) -> datetime.datetime | None:
    """An RFC 3339 timestamp (``Z`` or a numeric offset, optional fraction) as an aware UTC datetime.

    Fractions beyond microseconds are truncated. Anything else — including leap seconds, which
    `datetime` cannot represent, and instants that leave its range once moved to UTC — is None.
    """
    if not isinstance(value, str):
        return None
    match = _RFC3339.fullmatch(value)
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, zulu, sign, off_h, off_m = match.groups()
    try:
        if zulu:
            tz: datetime.tzinfo = UTC
        else:
            if int(off_h) > 23 or int(off_m) > 59:
                return None
            offset = datetime.timedelta(hours=int(off_h), minutes=int(off_m))
            tz = datetime.timezone(-offset if sign == "-" else offset)
        micros = int((fraction or "0")[:6].ljust(6, "0"))
        parsed = datetime.datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second), micros, tzinfo=tz
        )
        return parsed.astimezone(UTC)
    except (ValueError, OverflowError):
        return None


def format_time(value: datetime.datetime, *, fraction: bool = False) -> str:
    """RFC 3339 in UTC ending in ``Z``; seconds precision unless `fraction` (then microseconds).

    A naive datetime is taken to be UTC already.
    """
    moment = value.astimezone(UTC) if value.tzinfo is not None else value
    text = (
        f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}"
        f"T{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}"
    )
    if fraction:
        text += f".{moment.microsecond:06d}"
    return text + "Z"


def parse_pid(value: object) -> int | None:
    """A pid as the API may carry it: an int, an integral float (``900.0``) or digits (``"900"``).

    Booleans, fractions, signs, whitespace and values outside 1..PID_MAX_LIMIT are None: a pid the
    kernel could not have issued names no process.
    """
    number = _integer(value)
    if number is None or not 1 <= number <= api.PID_MAX_LIMIT:
        return None
    return number


def _integer(value: object) -> int | None:
    # bool is an int subclass; True is not the pid 1.
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else None
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        return int(value)
    return None


class _Reader:
    """Reads fields out of untrusted JSON, collecting problems instead of raising."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def flag(self, path: str, message: str) -> None:
        self.problems.append((path, message))

    def mapping(self, parent: Mapping[str, object] | None, key: str, path: str) -> Mapping[str, object] | None:
        if parent is None or parent.get(key) is None:
            return None
        value = parent.get(key)
        if isinstance(value, Mapping):
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
        number = _integer(value)
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
        if pid is None and (required or pid_value is not None):
            self.flag(f"{path}.pid", "missing" if pid_value is None else f"invalid pid {_shown(pid_value)}")
        return Incarnation(
            boot_id=self.string(parent, "bootId", f"{path}.bootId", required=required, empty_ok=False),
            pid_namespace=self.string(
                parent, "pidNamespace", f"{path}.pidNamespace", required=required, pattern=_DIGITS
            ),
            pid=pid,
            start_time=self.string(parent, "startTime", f"{path}.startTime", required=required, pattern=_DIGITS),
            host_id=self.string(parent, "hostId", f"{path}.hostId", required=required, empty_ok=False),
        )


def parse_registration(obj: object) -> Registration:
    """A `Registration` from a raw API object; never raises, whatever `obj` is.

    Missing or invalid fields become None and are listed in ``problems``. A registration without
    ``status.lastHeartbeatTime`` takes ``metadata.creationTimestamp`` as its last heartbeat: birth
    is the first sign of life, so a worker that died before its first heartbeat still expires.
    """
    reader = _Reader()
    root: Mapping[str, object] | None = obj if isinstance(obj, Mapping) else None
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
        attestation=_attestation(reader, status),
        conditions=conditions,
        retirement=retirement,
        released=released,
        retired=retired,
        problems=tuple(reader.problems),
    )


def _attestation(reader: _Reader, status: Mapping[str, object] | None) -> Attestation | None:
    path = "status.attestation"
    body = reader.mapping(status, "attestation", path)
    if body is None:
        return None
    agent = reader.mapping(body, "agent", f"{path}.agent")
    return Attestation(
        verdict=_member(reader, body, "verdict", f"{path}.verdict", Verdict),
        evidence=_member(reader, body, "evidence", f"{path}.evidence", Evidence),
        detail=reader.string(body, "detail", f"{path}.detail"),
        incarnation=reader.incarnation(
            reader.mapping(body, "incarnation", f"{path}.incarnation"), f"{path}.incarnation", required=True
        ),
        boot_id=reader.string(body, "bootId", f"{path}.bootId", required=True, empty_ok=False),
        host_id=reader.string(body, "hostId", f"{path}.hostId", required=True, empty_ok=False),
        observed_time=reader.time(body, "observedTime", f"{path}.observedTime", required=True)[0],
        first_observed_time=reader.time(body, "firstObservedTime", f"{path}.firstObservedTime")[0],
        heartbeat_seen=reader.string(body, "heartbeatSeen", f"{path}.heartbeatSeen", required=True),
        agent_node=reader.string(agent, "nodeName", f"{path}.agent.nodeName", required=True, empty_ok=False),
        agent_pod=reader.string(agent, "podName", f"{path}.agent.podName"),
        agent_identity=reader.string(agent, "identity", f"{path}.agent.identity"),
        raw=_json_copy(body, depth=0),
    )


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
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        reader.flag("status.conditions", f"expected a list, got {_kind(value)}")
        return ()
    parsed: list[Condition] = []
    for index, item in enumerate(value):
        path = f"status.conditions[{index}]"
        if not isinstance(item, Mapping):
            reader.flag(path, f"expected an object, got {_kind(item)}")
            continue
        condition_type = reader.string(item, "type", f"{path}.type", required=True, empty_ok=False)
        if condition_type is None:
            continue
        parsed.append(
            Condition(
                type=condition_type,
                status=reader.string(item, "status", f"{path}.status", required=True),
                reason=reader.string(item, "reason", f"{path}.reason", required=True),
                message=reader.string(item, "message", f"{path}.message"),
                last_transition_time=reader.time(
                    item, "lastTransitionTime", f"{path}.lastTransitionTime", required=True
                )[0],
                observed_generation=reader.integer(item, "observedGeneration", f"{path}.observedGeneration", minimum=0),
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
    path = "status.retirement"
    return Retirement(
        retired_time=reader.time(value, "retiredTime", f"{path}.retiredTime")[0],
        retired_by=reader.string(value, "retiredBy", f"{path}.retiredBy"),
        reason=reader.string(value, "reason", f"{path}.reason"),
        decision=reader.string(value, "decision", f"{path}.decision"),
        statement=reader.string(value, "statement", f"{path}.statement"),
    )


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


def _json_copy(value: Mapping[str, object], *, depth: int) -> dict[str, object]:
    # A plain dict (not a read-only view): it goes into JSON patches, which must serialise it.
    return {str(key): _json_value(item, depth=depth + 1) for key, item in value.items()}


def _json_value(value: object, *, depth: int) -> object:
    if depth > _MAX_COPY_DEPTH:
        return None
    if isinstance(value, Mapping):
        return _json_copy(value, depth=depth)
    if isinstance(value, list | tuple):
        return [_json_value(item, depth=depth + 1) for item in value]
    return value


def _kind(value: object) -> str:
    return type(value).__name__


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 64 else text[:61] + "..."
