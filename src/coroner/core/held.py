"""Registrations held Active past a bound: the reasons that can hold one for ever without another of
`kubectl coroner doctor`'s checks naming it, and since when one has been held.

Unknown is never dead, so a registration whose death cannot be established is preserved, rightly,
for as long as that lasts; for some reasons that is for ever (the process that took a dead worker's
pid number may live as long as its container). None of them is left silent: past the bound
(`HELD_GRACE_SECONDS`, doctor's and the operator's ``--held-grace-seconds``) doctor's `held` check
names each registration and the operator counts them (``coroner_registrations_held{reason}``, alert
CoronerRegistrationsHeld), both with the two functions here.

Every other reason that preserves an active registration is named elsewhere, each with an alert:
AttestationMissing by `unattested`, AgentUnavailable by `node-loss`; DeathUnconfirmed,
ClientInstanceConflict, ConflictingIdentity, ProtectedLeaseHolder and RetireRefusedByAdmission by
`blocked`; AdmissionPoliciesUnverified by `admission-content`; RetirePermissionMissing by
`retire-grant`. HeartbeatNotExpired ends by the clock, and PidAlive is a live worker.
"""

from __future__ import annotations

import datetime
from typing import Final

from coroner.core.model import Registration
from coroner.core.reasons import Reason

#: The bound: a registration held longer than this by a reason of `HELD_REASONS` is reported.
HELD_GRACE_SECONDS: Final = 600.0

HELD_REASONS: Final = frozenset(
    {
        # The agent's word: nothing but a new attestation changes them.
        Reason.PID_REUSE_DETECTED,  # another process holds the pid number, for as long as it lives
        Reason.LIVENESS_UNKNOWN,  # the agent cannot read what would prove it (hidepid, a child pid namespace)
        Reason.ATTESTATION_STALE,
        Reason.ATTESTATION_MISMATCH,
        Reason.HOST_BINDING_UNPROVEN,
        Reason.HEARTBEAT_AFTER_ATTESTATION,
        Reason.BOOT_IDENTITY_UNKNOWN,  # the agents check names the node; this names its registrations
        # The registration's own record: a dead worker never writes it again.
        Reason.INCOMPLETE_IDENTITY,
        Reason.UNTRUSTED_IDENTITY_PROVENANCE,
        Reason.UNPARSABLE_HEARTBEAT,
    }
)


def held_since(registration: Registration) -> datetime.datetime | None:
    """Since when `registration` has been held as it is: the latest of its creation, its agent's
    attestation (``observedTime``) and its worker's last heartbeat; None when it carries none.

    Not the Retirable condition's ``lastTransitionTime``: metav1 moves it only when the status flips,
    and Retirable is False under every reason that preserves, so it dates the first decision (a
    worker alive for a week whose pid number was taken a minute ago would read a week), and the
    reason itself carries no time. The attestation does: the agent writes one only when what it says
    changes (verdict, evidence, boot, host, incarnation: `coroner_agent.step.needs_write`), never
    to refresh it, so an unchanged Reused keeps the time it was first said. A heartbeat is the
    worker heard from (not left behind); without either, it has been held since it was created.
    Every input of the decision that the registration carries is one of these, so a reason cannot
    have held longer than ``now - held_since``; one that followed from the agent's Lease or the
    Node (AttestationStale after a reboot, BootIdentityUnknown) is counted from the registration's
    last time before that, so it is reported early rather than late.
    """
    times = [registration.creation_time, registration.last_heartbeat_time]
    if registration.attestation is not None:
        times.append(registration.attestation.observed_time)
    known = [moment for moment in times if moment is not None]
    return max(known) if known else None


def held_past(reason: Reason, registration: Registration, *, now: datetime.datetime, grace_seconds: float) -> bool:
    """`reason` is one of `HELD_REASONS` and has held `registration` (active) for `grace_seconds` or
    longer. A registration that carries no time at all is held (unknown is never recent)."""
    if reason not in HELD_REASONS or registration.terminal:
        return False
    since = held_since(registration)
    return since is None or now - since >= datetime.timedelta(seconds=grace_seconds)
