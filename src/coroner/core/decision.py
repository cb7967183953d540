"""The decision: may this registration be retired, and if not, exactly why not.

One pure function, `decide`, is shared by the operator and by ``kubectl coroner plan`` so that a
human's plan and the operator's action can never disagree. It evaluates the conjunction of the
design (docs/architecture.md, "The one function that decides") line by line in its fixed order; the first line that
fails names the one `Reason` the registration lands in. Every way a fact can be missing, stale,
unparsable or contradictory fails some line: unknown is never dead.

The I/O shells gather `Facts` (agent and node facts, protecting Leases, peer registrations, the
retire permission) and pass the clock in as `now`; nothing here reads a clock, a file or the API.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Mapping, Sequence
from typing import Final, TypeAlias

from coroner.core import api
from coroner.core.model import Attestation, Registration, format_time, render_attestation
from coroner.core.reasons import Evidence, Reason, Verdict

JSONValue: TypeAlias = "str | int | float | bool | list[JSONValue] | dict[str, JSONValue] | None"

#: Evidence an agent may cite for `Dead` (node-level evidence is the operator's own, never an agent's).
AGENT_DEATH_EVIDENCE: Final = frozenset({Evidence.PIDFD_EXITED, Evidence.PROC_ABSENT, Evidence.BOOT_BOUNDARY})
# A pidfd never outlives a boot and /proc only shows the current one: these two are claims about
# the boot the agent is on, so they hold only when that is the incarnation's boot. BootBoundary is
# the converse claim. An attestation contradicting its own evidence proves nothing.
_SAME_BOOT_EVIDENCE: Final = frozenset({Evidence.PIDFD_EXITED, Evidence.PROC_ABSENT})

_UTC: Final = datetime.UTC
_END_OF_TIME: Final = datetime.datetime.max.replace(tzinfo=_UTC)
_START_OF_TIME: Final = datetime.datetime.min.replace(tzinfo=_UTC)


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
    ``ProcAbsent`` or ``BootBoundary`` must be (``firstObservedTime`` → ``observedTime``). The
    agent's ``--absence-confirm-seconds`` must be at least this; ``PidfdExited`` needs none."""
    pidfd_exited_window_intervals: float = 0.0
    """Fast-path corroboration window for ``PidfdExited``, in heartbeat intervals: the kernel said so."""
    proc_absent_window_intervals: float = 2.0
    """Window for ``ProcAbsent``, in heartbeat intervals: a missing /proc entry is weaker than a pidfd."""
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
            Evidence.BOOT_BOUNDARY.value: self.boot_boundary_window_intervals,
        }.get(str(evidence))
        if intervals is None:
            return None
        return datetime.timedelta(seconds=intervals * interval_seconds)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """The outcome of `decide` for one registration at one instant."""

    reason: Reason
    detail: str
    """One sentence naming the object's facts and, for a preserve, what would change it."""
    evidence: Mapping[str, JSONValue]
    """The structured facts the decision used (JSON-serialisable, camelCase keys)."""
    death_evidence: Evidence | None = None
    """The path a retirement records (PidfdExited, ProcAbsent, BootBoundary, NodeDeleted, NodeOutOfService)."""
    relied_on: Attestation | None = None
    """The attestation the decision read; a retirement's write tests it is unchanged."""
    next_evaluation_at: datetime.datetime | None = None
    """The earliest instant the decision could change by the clock alone, or None — except for the
    expiry of the agent Lease, which is `agent_expires_at`."""
    agent_expires_at: datetime.datetime | None = None
    """When the node's agent Lease expires, where the decision relied on that agent being live (or on
    it blocking node-level evidence); the decision may change then. Kept apart from
    `next_evaluation_at` because every agent renews every few seconds: the runtime watches it once
    per node, not once per registration."""

    @property
    def retirable(self) -> bool:
        """Only EligibleStaleOrphan authorizes a retirement."""
        return self.reason.eligible


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Known:
    """The fields the conjunction reads, once line 2 has shown they are all present."""

    namespace: str
    name: str
    node_name: str
    boot_id: str
    pid_namespace: str
    pid: int
    start_time: str
    host_id: str
    client_instance_id: str
    heartbeat: bool
    """The worker opted into heartbeats (``spec.heartbeat``): its silence is a second witness."""
    interval_seconds: int | None
    ttl_seconds: int | None
    last_heartbeat: datetime.datetime

    @property
    def key(self) -> tuple[str, str, int, str]:
        return (self.boot_id, self.pid_namespace, self.pid, self.start_time)


# Optional fields the conjunction still reads when present: present but invalid is not "absent".
_READ_OPTIONAL_PATHS: Final = frozenset({"spec.nodeUID", "spec.sessionId", "spec.generationId"})


class _Trail:
    """What the decision has looked at so far: the facts it used and the instants they change."""

    def __init__(self, *, registration: Registration, now: datetime.datetime) -> None:
        self.now = now
        self.obj = registration.display_name
        self.evidence: dict[str, JSONValue] = {
            "registration": {
                "namespace": registration.namespace,
                "name": registration.name,
                "uid": registration.uid,
            },
            "now": _stamp(now),
        }
        self.deadlines: list[datetime.datetime] = []
        self.relied_on: Attestation | None = None
        self.death_evidence: Evidence | None = None
        self.agent_expiry: datetime.datetime | None = None

    def changes_at(self, moment: datetime.datetime | None) -> None:
        """A fact already read flips at `moment` by the clock alone."""
        if moment is not None and self.now < moment < _END_OF_TIME:
            self.deadlines.append(moment)

    def conclude(self, reason: Reason, detail: str) -> Decision:
        return Decision(
            reason=reason,
            detail=detail,
            evidence=self.evidence,
            death_evidence=self.death_evidence,
            relied_on=self.relied_on,
            next_evaluation_at=min(self.deadlines, default=None),
            agent_expires_at=self.agent_expiry,
        )


# The conjunction table, one guarded line after another in its fixed order (docs/architecture.md):
# splitting it would hide the order that is its meaning, so it is the one exemption from the limit.
def decide(*, registration: Registration, facts: Facts, policy: Policy, now: datetime.datetime) -> Decision:  # noqa: C901
    """Decide one registration; a purely computational function with no side effects.

    Exactly one `Reason` results: the first failing line of the conjunction, in the design's order.
    `now` must be aware (a naive one is taken as UTC), as must the datetimes in `facts`.
    """
    now = _aware(now)
    trail = _Trail(registration=registration, now=now)
    r = registration

    # 1. Terminal objects are history; deciding them again could only retire something twice.
    if r.terminal:
        trail.evidence |= {"retired": r.retired, "released": r.released}
        state = "retired" if r.retired else "released"
        return trail.conclude(
            Reason.ALREADY_TERMINAL,
            f"{trail.obj} is already {state}; terminal registrations are history and are not decided again.",
        )

    # 2. Every field the conjunction reads.
    known, missing = _known(r)
    if known is None:
        trail.evidence["missing"] = list(missing)
        trail.evidence["problems"] = [[path, message] for path, message in r.problems]
        return trail.conclude(
            Reason.INCOMPLETE_IDENTITY,
            f"{trail.obj} lacks valid {', '.join(missing)}; it can be decided once its launcher "
            f"records a complete identity (re-register the worker).",
        )
    trail.evidence |= {
        "nodeName": known.node_name,
        "nodeUID": r.node_uid,
        "incarnation": _incarnation_json(known),
        "clientInstanceId": known.client_instance_id,
    }
    what = f"{trail.obj} (pid {known.pid} on {known.node_name})"

    # 3. Only a launcher-minted identity is ever retired: anything else may be a hand-made object
    #    whose incarnation fields were never probed from a real process.
    if not _launcher_minted(known.client_instance_id):
        return trail.conclude(
            Reason.UNTRUSTED_IDENTITY_PROVENANCE,
            f"{what} has clientInstanceId {known.client_instance_id!r}, not minted by the launcher "
            f"(prefix {api.CLIENT_INSTANCE_PREFIX}); only launcher-minted registrations are retired.",
        )

    # 4. The heartbeat time parses.
    if r.heartbeat_unparsable:
        trail.evidence["lastHeartbeatTime"] = r.last_heartbeat_raw
        return trail.conclude(
            Reason.UNPARSABLE_HEARTBEAT,
            f"{what} has a heartbeat time that is not RFC 3339 ({r.last_heartbeat_raw!r}); it is "
            f"decided once the worker writes a valid status.lastHeartbeatTime.",
        )

    agent = facts.agents.get(known.node_name)
    node = facts.nodes.get(known.node_name)
    attestation = r.attestation
    by_node_agent = attestation is not None and attestation.agent_node == known.node_name
    if agent is not None:
        trail.evidence["agent"] = _agent_json(agent, now=now)
    if node is not None:
        trail.evidence["node"] = _node_json(node)
    if attestation is not None:
        trail.relied_on = attestation
        trail.evidence["attestation"] = _attestation_json(attestation, now=now)

    # 5. Node-level evidence the policy accepts, wherever no agent on the incarnation's boot can
    #    speak any more: whatever that node's agent attested before (an Alive from an agent whose
    #    Lease expired is evidence of nothing). A foreign or unparsable attestation is a
    #    contradiction, and is never overridden.
    if by_node_agent or _nothing_attested(r):
        node_evidence = _node_evidence(trail, known=known, registration=r, node=node, agent=agent, policy=policy)
        if node_evidence is not None:
            trail.death_evidence = node_evidence
            trail.relied_on = None
            # Node evidence replaces the attestation lines and the agent line (the agent went with
            # the node), but never takes a fast path: a heartbeating worker must have been silent
            # past its whole TTL.
            return _remaining_lines(trail, known=known, registration=r, facts=facts, window=None)

    # 6. An attestation from the agent of spec.nodeName.
    if attestation is None or not by_node_agent:
        if not _nothing_attested(r):
            # Something was attested, by another node's agent or in a shape that does not parse:
            # a contradiction, never a stand-in for "nothing was attested".
            agent_node = None if attestation is None else attestation.agent_node
            return trail.conclude(
                Reason.ATTESTATION_MISSING,
                f"{what} carries an attestation that is not from the agent of {known.node_name} (agent "
                f"{agent_node!r}); it is decided once that agent attests this incarnation.",
            )
        silent = _agent_silence(agent, node_name=known.node_name, now=now)
        if silent is None and agent is not None:
            trail.agent_expiry = lease_expiry(agent.renew_time, agent.lease_duration_seconds)
        if (
            silent is None
            and agent is not None
            and agent.boot_id not in (None, known.boot_id)
            and _vanished(known=known, registration=r, node=node)
        ):
            silent = f"its agent Lease {_agent_lease(known.node_name)} is live on another boot ({agent.boot_id})"
        if silent is not None:
            releases = _what_releases(known=known, registration=r, node=node, policy=policy)
            return trail.conclude(Reason.AGENT_UNAVAILABLE, f"{what} has no attestation, and {silent}; {releases}")
        return trail.conclude(
            Reason.ATTESTATION_MISSING,
            f"{what} has no attestation from the agent of {known.node_name}; it is decided once that "
            f"agent attests this incarnation.",
        )

    by_agent = f"the agent of {known.node_name}"

    # 7. About exactly this incarnation, on exactly this host.
    differing = [
        field
        for field, attested, registered in zip(
            ("bootId", "pidNamespace", "pid", "startTime"), attestation.incarnation.key, known.key, strict=True
        )
        if attested != registered
    ]
    if differing:
        return trail.conclude(
            Reason.ATTESTATION_MISMATCH,
            f"{what}: {by_agent} attested a different incarnation ({', '.join(differing)} differ); it is "
            f"decided once the agent attests this exact incarnation.",
        )
    host_claims = {
        "attestation.hostId": attestation.host_id,
        "attestation.incarnation.hostId": attestation.incarnation.host_id,
    }
    if agent is not None:
        # The lease is where the agent publishes the host it runs on; an agent whose lease does not
        # say so cannot bind its statement to the registration's host.
        host_claims["agentLease.hostId"] = agent.host_id
    unbound = [source for source, host in host_claims.items() if host != known.host_id]
    if unbound:
        return trail.conclude(
            Reason.HOST_BINDING_UNPROVEN,
            f"{what}: {', '.join(unbound)} do not equal the registration's hostId {known.host_id!r}; it "
            f"is decided once the agent on that host attests it.",
        )

    # 8. The agent that attested still speaks for what it saw: its Lease is live, it publishes its
    #    boot, the Node agrees, and that boot is the one it attested on. Checked before the verdict
    #    whatever it is: a verdict is only as current as the agent behind it, so a worker whose
    #    agent died with its node reads AgentUnavailable, never PidAlive.
    verdict, cited = attestation.verdict, attestation.evidence
    said = f"its last attestation ({verdict or '?'} by {cited or '?'}) no longer speaks for the process"
    silent = _agent_silence(agent, node_name=known.node_name, now=now)
    if agent is None or silent is not None:
        return trail.conclude(
            Reason.AGENT_UNAVAILABLE,
            f"{what}: {silent}, so {said}; {_what_releases(known=known, registration=r, node=node, policy=policy)}",
        )
    agent_until = lease_expiry(agent.renew_time, agent.lease_duration_seconds)
    trail.agent_expiry = agent_until
    if agent.boot_id is None:
        return trail.conclude(
            Reason.BOOT_IDENTITY_UNKNOWN,
            f"{what}: the agent Lease of {known.node_name} does not publish a boot id; it is decided "
            f"once the agent publishes one.",
        )
    if node is not None and node.boot_id is not None and node.boot_id != agent.boot_id:
        trail.evidence["nodeBootId"] = node.boot_id
        return trail.conclude(
            Reason.BOOT_IDENTITY_UNKNOWN,
            f"{what}: the Node reports boot {node.boot_id} but its agent reports {agent.boot_id}; it is "
            f"decided once they agree.",
        )
    if attestation.boot_id is not None and agent.boot_id != attestation.boot_id:
        # The agent rebooted since it attested: what it saw belongs to a boot that is over.
        return trail.conclude(
            Reason.ATTESTATION_STALE,
            f"{what}: the attestation was made on boot {attestation.boot_id} but the agent now runs on "
            f"boot {agent.boot_id}; it is decided once the agent attests again.",
        )
    if verdict in (Verdict.ALIVE, Verdict.REUSED) and agent.boot_id != known.boot_id:
        # What is alive, or holds the pid, is on the agent's boot; this incarnation was on another.
        return trail.conclude(
            Reason.ATTESTATION_STALE,
            f"{what}: the attestation ({verdict}) is about boot {known.boot_id} but the agent now runs "
            f"on boot {agent.boot_id}; it is decided once the agent attests again.",
        )

    # 9. The verdict is Dead, for a reason that proves it. Checked before freshness: a live or
    # unknown verdict preserves whatever its age, and saying PidAlive rather than
    # HeartbeatAfterAttestation for every heartbeat of a live worker keeps the reason (and the
    # status) still while nothing changes.
    if verdict == Verdict.ALIVE:
        return trail.conclude(
            Reason.PID_ALIVE,
            f"{what}: {by_agent} attests the process is alive ({cited}); it becomes retirable only "
            f"after the agent attests it Dead.",
        )
    if verdict == Verdict.REUSED:
        return trail.conclude(
            Reason.PID_REUSE_DETECTED,
            f"{what}: {by_agent} finds pid {known.pid} held by another process ({cited}); it becomes "
            f"retirable once the agent can attest this incarnation Dead.",
        )
    if verdict != Verdict.DEAD:
        return trail.conclude(
            Reason.LIVENESS_UNKNOWN,
            f"{what}: {by_agent} could not establish liveness (verdict {verdict!r}, evidence {cited!r}); "
            f"it becomes retirable only after a Dead attestation.",
        )
    death = _agent_death_evidence(cited)
    if death is None:
        return trail.conclude(
            Reason.LIVENESS_UNKNOWN,
            f"{what}: {by_agent} attests Dead citing {cited!r}, which does not prove death; it becomes "
            f"retirable after a Dead attestation by pidfd, /proc absence or boot boundary.",
        )

    # 10. Complete, and no heartbeat arrived after it (what a Dead verdict relies on).
    if attestation.observed_time is None:
        return trail.conclude(
            Reason.ATTESTATION_STALE,
            f"{what}: the attestation's observedTime is missing or unparsable; it is decided once the "
            f"agent attests again.",
        )
    # No age limit: the death of an exact incarnation is final, and the agent that saw it is
    # still live on the boot it saw it from (line 8). Attestations are written on change only.
    if attestation.boot_id is None:
        return trail.conclude(
            Reason.ATTESTATION_STALE,
            f"{what}: the attestation does not say which boot its agent was on; it is decided once the "
            f"agent attests again.",
        )
    heartbeat_now = r.last_heartbeat_raw or ""
    if attestation.heartbeat_seen is None:
        return trail.conclude(
            Reason.ATTESTATION_STALE,
            f"{what}: the attestation does not record which heartbeat it saw, so a later heartbeat "
            f"cannot be ruled out; it is decided once the agent attests again.",
        )
    if heartbeat_now != attestation.heartbeat_seen:
        # Compared as stored strings, never through clocks: any change means the worker wrote after
        # the agent looked.
        trail.evidence["lastHeartbeatTime"] = heartbeat_now
        return trail.conclude(
            Reason.HEARTBEAT_AFTER_ATTESTATION,
            f"{what} heartbeat at {heartbeat_now!r} after the agent attested having seen "
            f"{attestation.heartbeat_seen!r}; it is decided once the agent attests again.",
        )

    same_boot = attestation.boot_id == known.boot_id
    if (death in _SAME_BOOT_EVIDENCE) != same_boot:
        return trail.conclude(
            Reason.LIVENESS_UNKNOWN,
            f"{what}: {by_agent} attests Dead by {death} from boot {attestation.boot_id}, which "
            f"contradicts the incarnation's boot {known.boot_id}; it is decided once the agent attests again.",
        )
    trail.death_evidence = death

    if not known.heartbeat:
        # No worker-side witness: the agent's own repeated observation corroborates a death read
        # from /proc (seen first, then seen again after the window). The kernel's pidfd needs none.
        unconfirmed = _unconfirmed(trail, attestation=attestation, death=death, policy=policy, what=what)
        if unconfirmed is not None:
            return unconfirmed
        return _remaining_lines(trail, known=known, registration=r, facts=facts, window=None)
    assert known.interval_seconds is not None
    window = policy.corroboration_window(evidence=death, interval_seconds=known.interval_seconds)
    return _remaining_lines(trail, known=known, registration=r, facts=facts, window=window)


def _unconfirmed(
    trail: _Trail, *, attestation: Attestation, death: Evidence, policy: Policy, what: str
) -> Decision | None:
    """Without heartbeats: the preserve when a /proc-read death was not seen twice far enough apart."""
    if death not in (Evidence.PROC_ABSENT, Evidence.BOOT_BOUNDARY):
        return None
    first, last = attestation.first_observed_time, attestation.observed_time
    needed = datetime.timedelta(seconds=policy.absence_confirm_seconds)
    span = None if first is None or last is None else last - first
    trail.evidence["confirmation"] = {
        "firstObservedTime": None if first is None else _stamp(first),
        "spanSeconds": None if span is None else span.total_seconds(),
        "neededSeconds": policy.absence_confirm_seconds,
    }
    if span is not None and span >= needed:
        return None
    seen = "once" if span is None else f"over {span.total_seconds():g}s"
    return trail.conclude(
        Reason.DEATH_UNCONFIRMED,
        f"{what}: the agent saw {death} {seen}, and without heartbeats a death read from /proc "
        f"must be seen again at least {policy.absence_confirm_seconds:g}s after it was first seen; "
        f"it is decided once the agent confirms it (its --absence-confirm-seconds must be at "
        f"least the operator's).",
    )


def _remaining_lines(
    trail: _Trail,
    *,
    known: _Known,
    registration: Registration,
    facts: Facts,
    window: datetime.timedelta | None,
) -> Decision:
    """Lines 11 to 15, shared by the attested path and the node-disappearance path."""
    # 11. A heartbeating worker is silent past its TTL, or past the corroboration window of the
    #     evidence. Negative silence (a heartbeat from the future: clock skew) is never expiry,
    #     whatever the window. A worker without heartbeats has no silence to wait for.
    if known.heartbeat:
        silent = _silent(trail, known=known, registration=registration, window=window)
        if silent is not None:
            return silent
    return _identity_lines(trail, known=known, registration=registration, facts=facts)


def _silent(
    trail: _Trail, *, known: _Known, registration: Registration, window: datetime.timedelta | None
) -> Decision | None:
    now = trail.now
    what = f"{trail.obj} (pid {known.pid} on {known.node_name})"
    assert known.ttl_seconds is not None and known.interval_seconds is not None
    ttl = datetime.timedelta(seconds=known.ttl_seconds)
    expires_at = _after(known.last_heartbeat, ttl)
    fast_at = None if window is None else _after(known.last_heartbeat, max(window, datetime.timedelta(0)))
    silence = now - known.last_heartbeat
    trail.evidence["heartbeat"] = {
        "lastHeartbeatTime": _stamp(known.last_heartbeat),
        "fromCreation": registration.last_heartbeat_raw is None,
        "silenceSeconds": silence.total_seconds(),
        "intervalSeconds": known.interval_seconds,
        "ttlSeconds": known.ttl_seconds,
        "windowSeconds": None if window is None else window.total_seconds(),
    }
    passed = [moment for moment in (expires_at, fast_at) if moment is not None and now >= moment]
    if not passed:
        trail.changes_at(expires_at)
        trail.changes_at(fast_at)
        deadline = min((m for m in (expires_at, fast_at) if m is not None), default=None)
        corroboration = "" if window is None else f" and its {window.total_seconds():g}s corroboration window"
        return trail.conclude(
            Reason.HEARTBEAT_NOT_EXPIRED,
            f"{what} was last heard from at {_stamp(known.last_heartbeat)}, within its "
            f"{known.ttl_seconds}s heartbeat TTL{corroboration}; it becomes retirable "
            f"at {_stamp(deadline) if deadline else 'no known time'} if it stays silent.",
        )
    return None


def _identity_lines(trail: _Trail, *, known: _Known, registration: Registration, facts: Facts) -> Decision:
    """Lines 12 to 15: nothing else claims this identity, no Lease protects it, the grant holds."""
    now = trail.now
    what = f"{trail.obj} (pid {known.pid} on {known.node_name})"
    peers = [
        peer
        for peer in facts.peers
        if peer.namespace == known.namespace and not peer.terminal and not _is_self(registration, peer)
    ]

    # 12. No other active registration claims the same launcher-minted instance while it may be live.
    for peer in peers:
        if peer.client_instance_id == known.client_instance_id and not _attested_dead(peer):
            trail.evidence["conflict"] = _peer_json(peer)
            return trail.conclude(
                Reason.CLIENT_INSTANCE_CONFLICT,
                f"{what}: {peer.display_name} claims the same clientInstanceId "
                f"{known.client_instance_id!r} and may be live; it is decided once that one is "
                f"attested Dead or becomes terminal.",
            )

    # 13. No identity evidence shared with a live or unknown registration.
    session = (registration.session_id, registration.generation_id)
    for peer in peers:
        same_incarnation = peer.node_name == known.node_name and peer.incarnation.key == known.key
        same_session = all(session) and (peer.session_id, peer.generation_id) == session
        if (same_incarnation or same_session) and not _attested_dead(peer):
            shared = "incarnation" if same_incarnation else "sessionId and generationId"
            trail.evidence["conflict"] = _peer_json(peer)
            return trail.conclude(
                Reason.CONFLICTING_IDENTITY,
                f"{what} shares its {shared} with {peer.display_name}, which may be live; it is "
                f"decided once that one is attested Dead or becomes terminal.",
            )

    # 14. Not the holder of an unexpired Lease in its namespace. A Lease whose expiry cannot be
    #     computed protects: unknown is never expired.
    holders = {known.name, known.client_instance_id, registration.session_id} - {None, ""}
    protecting = []
    for lease in facts.protecting_leases:
        if lease.namespace != known.namespace or lease.holder_identity not in holders:
            continue
        until = lease_expiry(lease.renew_time, lease.lease_duration_seconds)
        if until is None or now < until:
            protecting.append((lease, until))
    if protecting:
        lease = protecting[0][0]
        ends = [until for _, until in protecting]
        # Protection ends when the last protecting lease expires (never, if one cannot expire).
        trail.changes_at(None if None in ends else max(until for until in ends if until is not None))
        trail.evidence["protectingLeases"] = [
            {
                "namespace": held.namespace,
                "name": held.name,
                "holderIdentity": held.holder_identity,
                "expiresAt": None if until is None else _stamp(until),
            }
            for held, until in protecting
        ]
        return trail.conclude(
            Reason.PROTECTED_LEASE_HOLDER,
            f"{what} holds Lease {lease.namespace}/{lease.name} (holderIdentity "
            f"{lease.holder_identity!r}), unexpired; it is decided once the Lease expires or changes holder.",
        )

    # 15. The admission policies are verified as shipped: while one is missing, weakened or
    #     unreadable, the operator stays plan-only (it fails closed; unknown is never intact).
    path = trail.death_evidence
    if facts.admission_unverified:
        trail.evidence["admissionUnverified"] = list(facts.admission_unverified)
        return trail.conclude(
            Reason.ADMISSION_POLICIES_UNVERIFIED,
            f"{what} is a stale orphan ({path}), but Coroner's admission policies are not verified as "
            f"shipped: {'; '.join(facts.admission_unverified)}; nothing is retired (plan-only) until they "
            f"are restored (re-apply the manifests; `kubectl coroner doctor` checks their content).",
        )

    # 16. The retire capability is granted (None, unknown, is not a grant).
    trail.evidence["retirePermission"] = facts.retire_permission
    if facts.retire_permission is not True:
        return trail.conclude(
            Reason.RETIRE_PERMISSION_MISSING,
            f"{what} is a stale orphan ({path}), but this identity does not hold the "
            f"{api.RETIRE_VERB} verb (plan-only); granting it makes the registration retirable.",
        )

    silence = f" and silent since {_stamp(known.last_heartbeat)}" if known.heartbeat else ""
    return trail.conclude(Reason.ELIGIBLE_STALE_ORPHAN, f"{what} is dead by {path}{silence}; retirable.")


def _node_evidence(
    trail: _Trail,
    *,
    known: _Known,
    registration: Registration,
    node: NodeFacts | None,
    agent: AgentFacts | None,
    policy: Policy,
) -> Evidence | None:
    """Node-level death evidence the policy accepts, or None.

    Never while an agent that may still run on the incarnation's boot is live: that agent can and
    must attest, whatever the Node object says (a stray taint, a deleted-and-recreated Node). An
    agent Lease whose expiry or boot cannot be read may be that agent: unknown is never gone.
    """
    now = trail.now
    if node is None:
        return None
    if agent is not None and agent.boot_id in (None, known.boot_id):
        until = lease_expiry(agent.renew_time, agent.lease_duration_seconds)
        if until is None or now < until:
            trail.agent_expiry = until
            return None
    if node.out_of_service and policy.node_out_of_service_evidence:
        return Evidence.NODE_OUT_OF_SERVICE
    if not policy.node_deletion_evidence:
        return None
    if node.exists is False and node.missing_since is not None:
        quarantine_end = _after(
            _aware(node.missing_since), datetime.timedelta(seconds=policy.node_deletion_quarantine_seconds)
        )
        if quarantine_end is not None and now >= quarantine_end:
            return Evidence.NODE_DELETED
        trail.changes_at(quarantine_end)
        return None
    if _replaced(known=known, registration=registration, node=node):
        return Evidence.NODE_DELETED
    return None


def _replaced(*, known: _Known, registration: Registration, node: NodeFacts) -> bool:
    """A Node of this name exists under another UID, and not as the same machine on the same boot.

    `kubectl delete node` makes a running kubelet register its Node again under a new UID: a new
    UID reporting the incarnation's boot is the same machine, not a replacement. (For a Node that
    is down, nodeInfo.bootID is stale, so it proves nothing and is not consulted otherwise.)
    """
    return (
        node.exists is True
        and node.uid is not None
        and registration.node_uid is not None
        and node.uid != registration.node_uid
        and node.boot_id != known.boot_id
    )


def _vanished(*, known: _Known, registration: Registration, node: NodeFacts | None) -> bool:
    """The Node is gone, replaced, or declared out of service by a human."""
    return node is not None and (
        node.exists is False or node.out_of_service or _replaced(known=known, registration=registration, node=node)
    )


def _agent_lease(node_name: str) -> str:
    return f"{api.AGENT_LEASE_PREFIX}{node_name}"


def _agent_silence(agent: AgentFacts | None, *, node_name: str, now: datetime.datetime) -> str | None:
    """Why the node's agent cannot speak now (its Lease is missing, expired or unreadable), or None."""
    if agent is None:
        return f"no agent Lease {_agent_lease(node_name)} was seen"
    until = lease_expiry(agent.renew_time, agent.lease_duration_seconds)
    if until is None:
        return f"the agent Lease {_agent_lease(node_name)} does not say when it expires"
    if now >= until:
        return f"the agent Lease {_agent_lease(node_name)} expired at {_stamp(until)}"
    return None


def _what_releases(*, known: _Known, registration: Registration, node: NodeFacts | None, policy: Policy) -> str:
    """The end of an AgentUnavailable detail: what would let this registration be decided."""
    name = known.node_name
    human = f"or `kubectl coroner apply --node-deletion-evidence` by a holder of the {api.RETIRE_VERB} verb"
    if node is not None and node.exists is False:
        # The CLI counts the quarantine from its own live GET: a human states "gone for good" with 0.
        human = (
            f"or `kubectl coroner plan/apply --node-deletion-evidence --node-quarantine-seconds=0` by a holder "
            f"of the {api.RETIRE_VERB} verb"
        )
    if node is not None and node.out_of_service and not policy.node_out_of_service_evidence:
        return (
            f"node {name} is tainted out-of-service, but this policy does not accept NodeOutOfService; "
            f"the agent attesting again, {human}, decides it."
        )
    if node is not None and _vanished(known=known, registration=registration, node=node):
        gone = "is gone" if node.exists is False else "was replaced by a Node with another UID"
        if not policy.node_deletion_evidence:
            # A deleted Node cannot be tainted; a replacement Node of the same name can.
            taint = "" if node.exists is False else f"the {api.OUT_OF_SERVICE_TAINT} taint, "
            return (
                f"node {name} {gone}: the node-loss component (--node-deletion-evidence), {taint}{human}, releases it."
            )
        if node.missing_since is not None:
            end = _after(
                _aware(node.missing_since), datetime.timedelta(seconds=policy.node_deletion_quarantine_seconds)
            )
            return f"node {name} {gone}; NodeDeleted applies when its quarantine ends at {_stamp(end or node.missing_since)}."
        return f"node {name} {gone}; NodeDeleted applies once a live GET confirms it after the quarantine."
    return (
        f"it is decided once the agent renews its Lease and attests again (if node {name} is gone for "
        f"good: the node-loss component, the {api.OUT_OF_SERVICE_TAINT} taint, {human})."
    )


def _known(r: Registration) -> tuple[_Known | None, tuple[str, ...]]:
    """The conjunction's fields, or the dotted paths of those missing or invalid."""
    inc, beat = r.incarnation, r.heartbeat
    # An unparsable heartbeat is present (line 4 reports it); only an absent one is missing here,
    # and a placeholder instant stands in for it that line 4 keeps from ever being compared.
    last_heartbeat = _START_OF_TIME if r.heartbeat_unparsable else r.last_heartbeat_time
    heartbeat_fields: dict[str, object] = (
        {"spec.heartbeat.intervalSeconds": beat.interval_seconds, "spec.heartbeat.ttlSeconds": beat.ttl_seconds}
        if beat.declared
        else {}
    )
    fields: dict[str, object] = {
        "metadata.namespace": r.namespace,
        "metadata.name": r.name,
        "spec.nodeName": r.node_name,
        "spec.incarnation.bootId": inc.boot_id,
        "spec.incarnation.pidNamespace": inc.pid_namespace,
        "spec.incarnation.pid": inc.pid,
        "spec.incarnation.startTime": inc.start_time,
        "spec.incarnation.hostId": inc.host_id,
        "spec.clientInstanceId": r.client_instance_id,
        **heartbeat_fields,
        "status.lastHeartbeatTime or metadata.creationTimestamp": last_heartbeat,
    }
    missing = [path for path, value in fields.items() if value is None]
    missing += sorted({path for path, _ in r.problems if path in _READ_OPTIONAL_PATHS})
    if (
        missing
        or r.namespace is None
        or r.name is None
        or r.node_name is None
        or inc.boot_id is None
        or inc.pid_namespace is None
        or inc.pid is None
        or inc.start_time is None
        or inc.host_id is None
        or r.client_instance_id is None
        or last_heartbeat is None
    ):
        return None, tuple(missing)
    known = _Known(
        namespace=r.namespace,
        name=r.name,
        node_name=r.node_name,
        boot_id=inc.boot_id,
        pid_namespace=inc.pid_namespace,
        pid=inc.pid,
        start_time=inc.start_time,
        host_id=inc.host_id,
        client_instance_id=r.client_instance_id,
        heartbeat=beat.declared,
        interval_seconds=beat.interval_seconds,
        ttl_seconds=beat.ttl_seconds,
        last_heartbeat=_aware(last_heartbeat),
    )
    return known, ()


def _nothing_attested(r: Registration) -> bool:
    """No ``status.attestation`` at all: not even one that failed to parse."""
    return r.attestation is None and not any(path == "status.attestation" for path, _ in r.problems)


def _launcher_minted(client_instance_id: str) -> bool:
    prefix = api.CLIENT_INSTANCE_PREFIX
    return client_instance_id.startswith(prefix) and len(client_instance_id) > len(prefix)


def _agent_death_evidence(cited: Evidence | str | None) -> Evidence | None:
    for evidence in AGENT_DEATH_EVIDENCE:
        if cited == evidence.value:
            return evidence
    return None


def _attested_dead(peer: Registration) -> bool:
    """The peer carries its own Dead attestation for exactly its incarnation, unchallenged by a heartbeat."""
    attestation = peer.attestation
    return (
        attestation is not None
        and attestation.verdict == Verdict.DEAD
        and _agent_death_evidence(attestation.evidence) is not None
        and peer.incarnation.complete
        and attestation.incarnation.key == peer.incarnation.key
        and peer.node_name is not None
        and attestation.agent_node == peer.node_name
        and attestation.heartbeat_seen == (peer.last_heartbeat_raw or "")
    )


def _is_self(registration: Registration, peer: Registration) -> bool:
    if registration.uid is not None and peer.uid == registration.uid:
        return True
    return peer.namespace == registration.namespace and peer.name == registration.name


def lease_expiry(renew_time: datetime.datetime | None, duration_seconds: float | None) -> datetime.datetime | None:
    """renewTime + leaseDurationSeconds, or None where either is unknown."""
    if renew_time is None or duration_seconds is None:
        return None
    try:
        span = datetime.timedelta(seconds=duration_seconds)
    except (OverflowError, ValueError):
        if math.isnan(duration_seconds):
            return None
        return _END_OF_TIME if duration_seconds > 0 else _START_OF_TIME
    return _after(_aware(renew_time), span)


def _after(start: datetime.datetime | None, span: datetime.timedelta) -> datetime.datetime | None:
    """start + span, saturating at the ends of datetime's range instead of raising."""
    if start is None:
        return None
    try:
        return start + span
    except OverflowError:
        return _END_OF_TIME if span > datetime.timedelta(0) else _START_OF_TIME


def _aware(moment: datetime.datetime) -> datetime.datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=_UTC)


def _stamp(moment: datetime.datetime) -> str:
    try:
        return format_time(moment, fraction=True)
    except OverflowError:
        return moment.isoformat()


def _incarnation_json(known: _Known) -> dict[str, JSONValue]:
    return {
        "bootId": known.boot_id,
        "pidNamespace": known.pid_namespace,
        "pid": known.pid,
        "startTime": known.start_time,
        "hostId": known.host_id,
    }


def _attestation_json(attestation: Attestation, *, now: datetime.datetime) -> dict[str, JSONValue]:
    """The attestation relied on, as stored (`coroner.core.model.render_attestation`), and its age."""
    observed = attestation.observed_time
    return {
        **render_attestation(attestation),
        "ageSeconds": None if observed is None else (now - observed).total_seconds(),
    }


def _agent_json(agent: AgentFacts, *, now: datetime.datetime) -> dict[str, JSONValue]:
    until = lease_expiry(agent.renew_time, agent.lease_duration_seconds)
    duration = agent.lease_duration_seconds
    return {
        "bootId": agent.boot_id,
        "hostId": agent.host_id,
        "renewTime": None if agent.renew_time is None else _stamp(agent.renew_time),
        "leaseDurationSeconds": duration if duration is None or math.isfinite(duration) else str(duration),
        "live": until is not None and now < until,
    }


def _node_json(node: NodeFacts) -> dict[str, JSONValue]:
    return {
        "exists": node.exists,
        "uid": node.uid,
        "bootId": node.boot_id,
        "outOfService": node.out_of_service,
        "missingSince": None if node.missing_since is None else _stamp(node.missing_since),
    }


def _peer_json(peer: Registration) -> dict[str, JSONValue]:
    verdict = None if peer.attestation is None else peer.attestation.verdict
    return {
        "namespace": peer.namespace,
        "name": peer.name,
        "uid": peer.uid,
        "clientInstanceId": peer.client_instance_id,
        "verdict": None if verdict is None else str(verdict),
    }
