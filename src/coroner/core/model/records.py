"""Typed, immutable records of a `WorkerRegistration`, and their renderings back to the wire."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any, Final, TypeAlias

from coroner.core.model.scalars import format_time
from coroner.core.reasons import Evidence, Verdict

#: One parse problem: the field path (dotted, as in docs/api.md) and what is wrong with it.
Problem: TypeAlias = tuple[str, str]


#: An object's (namespace, name): how every cache and queue names a registration.
Key: TypeAlias = tuple[str, str]


#: The CRD's bounds (manifests/base/crd.yaml), in their one Python place (the parser, `coroner run`
#: and tests/unit/test_crd_bounds.py, which checks the CRD agrees); values outside them are invalid,
#: not clamped.
HEARTBEAT_INTERVAL_MAX: Final = 86400


HEARTBEAT_TTL_MAX: Final = 604800


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Incarnation:
    """One run of one process on one node; a pid number is reused, an incarnation never is."""

    boot_id: str | None = None
    pid_namespace: str | None = None
    pid: int | None = None
    start_time: str | None = None
    host_id: str | None = None
    pidfd_inode: str | None = None
    """Optional: the process's pidfd inode (`coroner.pidfs`), which lets an agent without ptrace
    access find it. Not part of `key`: the five fields above name the process; this locates it."""

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
    #: ``metadata.annotations["coroner.dev/registered-by"]``: who created it: admission admits
    #: a CREATE only when it names the requester, and then freezes it. None when absent, empty or not a string (unknown).
    registered_by: str | None = None
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
        ("pidfdInode", incarnation.pidfd_inode),
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
