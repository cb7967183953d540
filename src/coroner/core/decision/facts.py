"""What a decision is given besides the registration: the facts the I/O shells gathered (agent
Leases, Nodes, protecting Leases, peers, the grant, the admission policies' state) and the
cluster's Policy; and the one Lease-expiry arithmetic every reader of a Lease uses."""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Mapping, Sequence
from typing import Final

from coroner.core import memo
from coroner.core.model import Registration
from coroner.core.reasons import Evidence

UTC: Final = datetime.UTC


END_OF_TIME: Final = datetime.datetime.max.replace(tzinfo=UTC)


START_OF_TIME: Final = datetime.datetime.min.replace(tzinfo=UTC)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AgentFacts:
    """What the per-node agent Lease publishes; liveness is computed from it against `now`."""

    boot_id: str | None = None
    host_id: str | None = None
    renew_time: datetime.datetime | None = None
    lease_duration_seconds: float | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NodeFacts:
    """What a live GET of the Node said."""

    exists: bool | None = None
    """True: found; False: NotFound; None: unknown (not asked, or the GET failed)."""
    uid: str | None = None
    boot_id: str | None = None
    """``Node.status.nodeInfo.bootID``, or None where the kubelet does not publish it."""
    out_of_service: bool = False
    """The ``node.kubernetes.io/out-of-service`` taint is present: a human said the node is gone."""
    missing_since: datetime.datetime | None = None
    """The first time a live GET returned NotFound; the node-deletion quarantine counts from here."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LeaseFacts:
    """A ``coordination.k8s.io`` Lease that may protect a registration from retirement."""

    namespace: str
    name: str
    holder_identity: str | None = None
    renew_time: datetime.datetime | None = None
    lease_duration_seconds: float | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Facts:
    """Everything the I/O shell gathered for one decision besides the registration itself."""

    agents: Mapping[str, AgentFacts] = dataclasses.field(default_factory=dict)
    """Agent Lease facts by node name; an absent node means no agent Lease was seen."""
    nodes: Mapping[str, NodeFacts] = dataclasses.field(default_factory=dict)
    """Node facts by node name; an absent node means nothing is known about it."""
    protecting_leases: Sequence[LeaseFacts] = ()
    """Leases in the registration's namespace (others are ignored)."""
    peers: Sequence[Registration] = ()
    """The other registrations of the namespace; the registration itself is skipped if present."""
    retire_permission: bool | None = None
    """Whether this identity holds the ``retire`` verb; None (unknown) counts as not granted."""
    admission_unverified: Sequence[str] = ()
    """Why the admission policies and bindings are not verified as shipped: each one missing or
    differing (`coroner.core.admission_digest.Comparison.names`), or that they could not be read.
    Empty: verified — or not checked by this caller. The operator checks (and retires nothing while
    this is not empty); ``kubectl coroner plan/apply`` do not (a person's own verb and the API
    server's admission decide there; ``doctor`` reports the policies' content)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """The cluster's tunables. Defaults are the design's; every one can only slow retirement down."""

    absence_confirm_seconds: float = 10.0
    """Without ``spec.heartbeat``: how long apart the agent's first and its confirming look at a
    death read from /proc (``ProcAbsent``, ``BootBoundary``, ``PidNamespaceRecreated``) must be
    (``firstObservedTime`` → ``observedTime``). The agent's ``--absence-confirm-seconds`` must be at
    least this; ``PidfdExited`` needs none."""
    pidfd_exited_window_intervals: float = 0.0
    """Fast-path corroboration window for ``PidfdExited``, in heartbeat intervals: the kernel said so."""
    proc_absent_window_intervals: float = 2.0
    """Window for ``ProcAbsent`` (and ``PidNamespaceRecreated``, also read from /proc), in heartbeat
    intervals: a death read from /proc is weaker than a pidfd."""
    boot_boundary_window_intervals: float = 2.0
    """Window for ``BootBoundary``, in heartbeat intervals."""
    node_deletion_evidence: bool = False
    """Opt-in: count a Node gone (NotFound past the quarantine, or a new UID) as ``NodeDeleted``."""
    node_deletion_quarantine_seconds: float = 40.0
    """How long a Node must have been NotFound before it counts, like the pod garbage collector's."""
    node_out_of_service_evidence: bool = True
    """Count the ``node.kubernetes.io/out-of-service`` taint (a human's statement) as evidence."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            numeric = isinstance(value, float | int) and not isinstance(value, bool)
            if numeric and (not math.isfinite(value) or value < 0):
                raise ValueError(f"Policy.{field.name} must be finite and >= 0, got {value!r}")

    def corroboration_window(
        self, *, evidence: Evidence | str | None, interval_seconds: int
    ) -> datetime.timedelta | None:
        """With ``spec.heartbeat``: how long a `Dead` verdict with this evidence must be corroborated
        by the worker's silence; None: no fast path (only the TTL)."""
        intervals = {
            Evidence.PIDFD_EXITED.value: self.pidfd_exited_window_intervals,
            Evidence.PROC_ABSENT.value: self.proc_absent_window_intervals,
            Evidence.PID_NAMESPACE_RECREATED.value: self.proc_absent_window_intervals,
            Evidence.BOOT_BOUNDARY.value: self.boot_boundary_window_intervals,
        }.get(str(evidence))
        if intervals is None:
            return None
        return datetime.timedelta(seconds=intervals * interval_seconds)


@memo.by_key(memo.instant_and_number)
def lease_expiry(renew_time: datetime.datetime | None, duration_seconds: float | None) -> datetime.datetime | None:
    """renewTime + leaseDurationSeconds, or None where either is unknown."""
    if renew_time is None or duration_seconds is None:
        return None
    try:
        span = datetime.timedelta(seconds=duration_seconds)
    except (OverflowError, ValueError):
        if math.isnan(duration_seconds):
            return None
        return END_OF_TIME if duration_seconds > 0 else START_OF_TIME
    return after(aware(renew_time), span)


def after(start: datetime.datetime | None, span: datetime.timedelta) -> datetime.datetime | None:
    """start + span, saturating at the ends of datetime's range instead of raising."""
    if start is None:
        return None
    try:
        return start + span
    except OverflowError:
        return END_OF_TIME if span > datetime.timedelta(0) else START_OF_TIME


def aware(moment: datetime.datetime) -> datetime.datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
