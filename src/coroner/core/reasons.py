"""The vocabulary of Coroner's outcomes.

A reason code reads the same in a condition, an Event, a log line, a metric label, the CLI and the
docs: this module is the only place those words are spelled.
"""

from __future__ import annotations

import enum


class Reason(enum.StrEnum):
    """Why a registration is, or is not, retirable: exactly one per registration per decision."""

    ELIGIBLE_STALE_ORPHAN = "EligibleStaleOrphan"
    ALREADY_TERMINAL = "AlreadyTerminal"
    INCOMPLETE_IDENTITY = "IncompleteIdentity"
    UNTRUSTED_IDENTITY_PROVENANCE = "UntrustedIdentityProvenance"
    UNPARSABLE_HEARTBEAT = "UnparsableHeartbeat"
    ATTESTATION_MISSING = "AttestationMissing"
    ATTESTATION_MISMATCH = "AttestationMismatch"
    HOST_BINDING_UNPROVEN = "HostBindingUnproven"
    ATTESTATION_STALE = "AttestationStale"
    HEARTBEAT_AFTER_ATTESTATION = "HeartbeatAfterAttestation"
    PID_ALIVE = "PidAlive"
    PID_REUSE_DETECTED = "PidReuseDetected"
    LIVENESS_UNKNOWN = "LivenessUnknown"
    AGENT_UNAVAILABLE = "AgentUnavailable"
    BOOT_IDENTITY_UNKNOWN = "BootIdentityUnknown"
    HEARTBEAT_NOT_EXPIRED = "HeartbeatNotExpired"
    DEATH_UNCONFIRMED = "DeathUnconfirmed"
    CLIENT_INSTANCE_CONFLICT = "ClientInstanceConflict"
    CONFLICTING_IDENTITY = "ConflictingIdentity"
    PROTECTED_LEASE_HOLDER = "ProtectedLeaseHolder"
    #: The operator could not verify its admission policies and bindings as shipped (one missing,
    #: differing, or unreadable): it retires nothing until they are (coroner.core.admission_digest).
    ADMISSION_POLICIES_UNVERIFIED = "AdmissionPoliciesUnverified"
    RETIRE_PERMISSION_MISSING = "RetirePermissionMissing"
    #: Not a decision: the API server's admission (a policy other than the `retire` verb's) refused
    #: the retirement write of a registration decided EligibleStaleOrphan. The operator records it in
    #: Retirable (naming the policy and what it said) and retries with backoff; `apply` prints it.
    RETIRE_REFUSED_BY_ADMISSION = "RetireRefusedByAdmission"

    @property
    def eligible(self) -> bool:
        """Only EligibleStaleOrphan authorizes a retirement."""
        return self is Reason.ELIGIBLE_STALE_ORPHAN

    @property
    def decided(self) -> bool:
        """A reason `decide` returns (all but RetireRefusedByAdmission, which the write's answer gives)."""
        return self is not Reason.RETIRE_REFUSED_BY_ADMISSION


class Verdict(enum.StrEnum):
    """What the same-node agent attests about one incarnation."""

    DEAD = "Dead"
    ALIVE = "Alive"
    REUSED = "Reused"
    UNKNOWN = "Unknown"


class Evidence(enum.StrEnum):
    """Why the agent reached its verdict; for `Dead`, also the path a retirement took."""

    # Dead
    PIDFD_EXITED = "PidfdExited"
    PROC_ABSENT = "ProcAbsent"
    BOOT_BOUNDARY = "BootBoundary"
    #: The recorded (pid namespace, pid) is held by another process, and the namespace that now
    #: carries the recorded inode number began after the incarnation did (its pid 1 started later):
    #: a new namespace with a recycled inode number, so the incarnation's own namespace, and every
    #: process in it, is gone.
    PID_NAMESPACE_RECREATED = "PidNamespaceRecreated"
    # Reused
    START_TIME_DIFFERS = "StartTimeDiffers"
    # Alive
    PIDFD_PINNED = "PidfdPinned"
    # Unknown: each names the fact that could not be established.
    PROC_UNREADABLE = "ProcUnreadable"
    START_TIME_UNREADABLE = "StartTimeUnreadable"
    PID_NAMESPACE_NOT_VISIBLE = "PidNamespaceNotVisible"
    NOT_ROOT_PID_NAMESPACE = "NotRootPidNamespace"
    #: The proc root is mounted with hidepid (or its options are unreadable): a process it does not
    #: show may still run.
    PROC_HIDES_PROCESSES = "ProcHidesProcesses"
    BOOT_ID_UNREADABLE = "BootIdUnreadable"
    FOREIGN_NODE = "ForeignNode"
    INVALID_INCARNATION = "InvalidIncarnation"
    PIDFD_UNAVAILABLE = "PidfdUnavailable"
    PROCESS_CHANGED_DURING_PROBE = "ProcessChangedDuringProbe"
    ZOMBIE_THREAD_GROUP_ALIVE = "ZombieThreadGroupAlive"
    #: /proc shows a process with the recorded start time that cannot be the recorded one (another
    #: boot id, another pid namespace, a thread): the record or the node's facts are wrong.
    INCARNATION_CONTRADICTED = "IncarnationContradicted"
    # Node-level evidence the operator may use instead of an attestation (policy opt-in only).
    NODE_DELETED = "NodeDeleted"
    NODE_OUT_OF_SERVICE = "NodeOutOfService"

    @property
    def proves_death(self) -> bool:
        """Evidence that can back a `Dead` verdict or a retirement."""
        return self in _DEATH_EVIDENCE

    @property
    def read_from_proc(self) -> bool:
        """A death read from /proc rather than told by the kernel through a pidfd: attested only once
        the agent saw it twice, `--absence-confirm-seconds` apart."""
        return self in _PROC_DEATH_EVIDENCE

    @property
    def node_level(self) -> bool:
        """Evidence about the node (NodeDeleted, NodeOutOfService), not from an agent's attestation."""
        return self in (Evidence.NODE_DELETED, Evidence.NODE_OUT_OF_SERVICE)


_PROC_DEATH_EVIDENCE = frozenset({Evidence.PROC_ABSENT, Evidence.BOOT_BOUNDARY, Evidence.PID_NAMESPACE_RECREATED})
_DEATH_EVIDENCE = frozenset(
    {
        Evidence.PIDFD_EXITED,
        *_PROC_DEATH_EVIDENCE,
        Evidence.NODE_DELETED,
        Evidence.NODE_OUT_OF_SERVICE,
    }
)


class Statement(enum.StrEnum):
    """``status.retirement.statement``: a retirement whose evidence a person stated (no agent attested it)."""

    #: A person (not the operator) retired on node-level evidence with ``kubectl coroner apply``; the
    #: admission policy coroner-retire-requires-evidence requires it there and refuses it elsewhere.
    HUMAN = "Human"


class ConditionType(enum.StrEnum):
    """The `metav1.Condition` types a registration carries."""

    ATTESTED = "Attested"
    RETIRABLE = "Retirable"
    RETIRED = "Retired"
    RELEASED = "Released"


class State(enum.StrEnum):
    """``status.state``, for display and ``--field-selector status.state=``; no decision reads it.

    Derived from status.retirement and the Retired and Released conditions (`coroner.core.wire.state_of`);
    every status write that changes it sets it, and the CRD refuses one that disagrees (a rule on
    ``status``). Retired and Released are terminal."""

    ACTIVE = "Active"
    RETIRED = "Retired"
    RELEASED = "Released"


class ApplyAbort(enum.StrEnum):
    """Why `kubectl coroner apply` refused to act: the world moved since the plan."""

    REGISTRY_MOVED = "RegistryMoved"
    CANDIDATE_SET_MOVED = "CandidateSetMoved"


class EventReason(enum.StrEnum):
    """Reasons of the Kubernetes Events Coroner posts on registrations."""

    RETIRED = "Retired"
    RETIRE_CONFLICT = "RetireConflict"
    RETIRE_ABANDONED = "RetireAbandoned"
