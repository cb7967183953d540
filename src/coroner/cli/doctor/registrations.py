"""Doctor's registration checks: registrations stuck unattested, held past a bound by a reason that
may last for ever, dead ones blocked by a fixable cause, and registrations of one identity that copy
another's claims (squatting)."""

from __future__ import annotations

import datetime
from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Any, Final

from coroner.cli.doctor.outcome import Check, duration, failed, kubectl_name, passed, stamp, unknown, warned
from coroner.cli.plan import Unreadable, display, names_text
from coroner.core import api, model
from coroner.core import conditions as cond
from coroner.core.decision import squatters
from coroner.core.fingerprint import Plan, PlanEntry
from coroner.core.held import held_past, held_since
from coroner.core.model import Registration
from coroner.core.reasons import Reason


def blocked(entry: PlanEntry) -> bool:
    """Dead by evidence the decision accepted, yet preserved by a line where time alone will not help.

    Death evidence is established before the agent, heartbeat, conflict, Lease and permission lines
    of the conjunction; of those, only HeartbeatNotExpired resolves by the clock. The others need
    someone to act (grant retire, repair an agent, release a Lease, resolve a conflict).
    """
    decision = entry.decision
    return (
        decision.death_evidence is not None
        and not decision.retirable
        and decision.reason not in (Reason.HEARTBEAT_NOT_EXPIRED, Reason.ALREADY_TERMINAL)
    )


def refused_by_admission(entry: PlanEntry) -> bool:
    """`coroner.core.conditions.refused_by_admission` of a plan entry."""
    return cond.refused_by_admission(entry.registration.conditions, retirable=entry.decision.retirable)


def _blocking_reason(entry: PlanEntry) -> Reason | None:
    if blocked(entry):
        return entry.decision.reason
    return Reason.RETIRE_REFUSED_BY_ADMISSION if refused_by_admission(entry) else None


def registration_names(shown: Sequence[str]) -> tuple[str, ...]:
    """Registrations shown as ``namespace/name`` (`display`), as `kubectl get -o name` prints them."""
    return tuple(kubectl_name(api.KIND, entry.partition("/")[2]) for entry in shown)


def check_unattested(*, plan: Plan | Unreadable, now: datetime.datetime, grace_seconds: float) -> Check:
    """Active registrations still without their agent's attestation after a grace period."""
    name = "unattested"
    if isinstance(plan, Unreadable):
        return unknown(name, f"registrations could not be read: {plan.reason}")
    grace = datetime.timedelta(seconds=grace_seconds)
    stuck = [
        entry
        for entry in plan.entries
        if entry.decision.reason == Reason.ATTESTATION_MISSING
        and (entry.registration.creation_time is None or now - entry.registration.creation_time >= grace)
    ]
    named = [display(model.key_of(entry.registration)) for entry in stuck]
    facts = {"count": len(stuck), "graceSeconds": grace_seconds, "registrations": named}
    if stuck:
        nodes = sorted({entry.registration.node_name or "?" for entry in stuck})
        return failed(
            name,
            f"{len(stuck)} registration(s) unattested for over {grace_seconds:g}s: {names_text(named)} "
            f"(node(s) {names_text(nodes)}); check the agents of those nodes.",
            objects=tuple(f"workerregistration/{n}" for n in named),
            facts=facts,
            names=registration_names(named),
        )
    return passed(
        name, f"0 of {len(plan.entries)} registration(s) unattested for over {grace_seconds:g}s.", facts=facts
    )


_AGENT_AGAIN: Final = "its node's agent has not attested it again: check the coroner-agent pod on that node and its log"
_NOT_THE_LAUNCHERS: Final = (
    "not made by Coroner's launcher, or not kept by it: find who created it (annotation "
    "coroner.dev/registered-by); its registrant may release it"
)
#: What a person can do about a registration `held` names, by its reason (one for each of HELD_REASONS).
HELD_FIXES: Final[dict[Reason, str]] = {
    Reason.PID_REUSE_DETECTED: (
        "another process holds its pid number (named above): it is retired once that process exits, "
        "which its agent watches; where the worker is gone and that process stays, only its registrant "
        "(Released) or a cluster admin (a delete, counted and alerted) ends it"
    ),
    Reason.LIVENESS_UNKNOWN: (
        "its agent cannot establish liveness, for the reason above: fix that on the node (a /proc "
        "without hidepid, the agent in the host's pid namespace as the DaemonSet ships it)"
    ),
    Reason.ATTESTATION_STALE: _AGENT_AGAIN,
    Reason.ATTESTATION_MISMATCH: _AGENT_AGAIN,
    Reason.HEARTBEAT_AFTER_ATTESTATION: _AGENT_AGAIN,
    Reason.HOST_BINDING_UNPROVEN: (
        "the host its agent attests from is not the registration's hostId: compare the agent Lease's "
        "host id with the worker's /etc/machine-id"
    ),
    Reason.BOOT_IDENTITY_UNKNOWN: (
        "its node's agent publishes no boot id, or one that is not the Node's (the agents check names the node)"
    ),
    Reason.INCOMPLETE_IDENTITY: _NOT_THE_LAUNCHERS,
    Reason.UNTRUSTED_IDENTITY_PROVENANCE: _NOT_THE_LAUNCHERS,
    Reason.UNPARSABLE_HEARTBEAT: _NOT_THE_LAUNCHERS,
}
#: Reasons that are the agent's verdict: its attestation's detail says why (the holder of the pid,
#: what could not be read); for the others the decision's detail does.
_AGENT_SAYS_WHY: Final = frozenset({Reason.PID_REUSE_DETECTED, Reason.LIVENESS_UNKNOWN})
_SHOWN_PER_REASON: Final = 10


def check_held(*, plan: Plan | Unreadable, now: datetime.datetime, grace_seconds: float) -> Check:
    """Active registrations a reason of `coroner.core.held.HELD_REASONS` has held for longer than
    `grace_seconds` (since `coroner.core.held.held_since`): each named with its node, pid, since when
    and why, and what to do about its reason. WARN, not FAIL: preserving them is right (unknown is
    never dead, and one may be a live worker's), but nothing held is left silent."""
    name = "held"
    if isinstance(plan, Unreadable):
        return unknown(name, f"registrations could not be read: {plan.reason}")
    found: dict[Reason, list[dict[str, Any]]] = {}
    for entry in plan.entries:
        registration, reason = entry.registration, entry.decision.reason
        if not held_past(reason, registration, now=now, grace_seconds=grace_seconds):
            continue
        since = held_since(registration)
        attestation = registration.attestation
        named = display(model.key_of(registration))
        why = (
            attestation.detail
            if reason in _AGENT_SAYS_WHY and attestation is not None and attestation.detail
            else entry.decision.detail.removeprefix(
                f"{named} (pid {registration.incarnation.pid} on {registration.node_name}): "
            )
        ).rstrip(".")
        found.setdefault(reason, []).append(
            {
                "registration": named,
                "node": registration.node_name,
                "pid": registration.incarnation.pid,
                "reason": reason.value,
                "since": stamp(since),
                "heldSeconds": None if since is None else (now - since).total_seconds(),
                "detail": why,
            }
        )
    items = [item for reason in sorted(found) for item in found[reason]]
    active = sum(1 for entry in plan.entries if not entry.registration.terminal)
    facts = {
        "count": len(items),
        "graceSeconds": grace_seconds,
        "byReason": {reason.value: [item["registration"] for item in found[reason]] for reason in sorted(found)},
        "registrations": items,
    }
    bound = f"held Active for over {grace_seconds:g}s by a reason that may last for ever"
    if not items:
        return passed(name, f"0 of {active} active registration(s) {bound}.", facts=facts)
    described = " | ".join(_held_text(reason, found[reason]) for reason in sorted(found))
    objects = [f"workerregistration/{entry}" for entry in sorted(item["registration"] for item in items)]
    return warned(
        name,
        f"{len(items)} registration(s) {bound}: {described}",
        objects=objects,
        facts=facts,
        names=registration_names(sorted(item["registration"] for item in items)),
    )


def _held_text(reason: Reason, items: list[dict[str, Any]]) -> str:
    def one(item: dict[str, Any]) -> str:
        held = (
            "since an unknown time"
            if item["since"] is None
            else (f"since {item['since']}, {duration(datetime.timedelta(seconds=item['heldSeconds']))}")
        )
        return (
            f"{item['registration']} (node {item['node'] or '?'}, pid {item['pid'] or '?'}, {held}: {item['detail']})"
        )

    shown = "; ".join(one(item) for item in items[:_SHOWN_PER_REASON])
    more = len(items) - _SHOWN_PER_REASON
    return (
        f"{reason} {len(items)}: {shown}{f'; and {more} more' if more > 0 else ''}. What to do: {HELD_FIXES[reason]}."
    )


def check_blocked(*, plan: Plan | Unreadable, expect_plan_only: bool, permission_known: bool = True) -> Check:
    """Registrations the operator would retire but for something a person must fix (including a
    retirement the API server's admission refused, as the operator's stored condition says).

    `plan` must be decided with the operator's retire permission; where that permission could not
    be reviewed (`permission_known` False), RetirePermissionMissing rows are unknown, not blocked.
    """
    name = "blocked"
    if isinstance(plan, Unreadable):
        return unknown(name, f"registrations could not be read: {plan.reason}")
    by_reason: dict[str, list[str]] = {}
    for entry in plan.entries:
        reason = _blocking_reason(entry)
        if reason is not None:
            by_reason.setdefault(reason.value, []).append(display(model.key_of(entry.registration)))
    waiting = (
        by_reason.pop(Reason.RETIRE_PERMISSION_MISSING.value, []) if expect_plan_only or not permission_known else []
    )
    expected = waiting if permission_known else []
    unreviewed = [] if permission_known else waiting
    facts = {
        "count": sum(len(names) for names in by_reason.values()),
        "byReason": by_reason,
        "expectedPlanOnly": expected,
        "operatorPermissionUnknown": unreviewed,
    }
    if by_reason:
        described = "; ".join(
            f"{reason} {len(names)}: {names_text(names)}" for reason, names in sorted(by_reason.items())
        )
        return failed(
            name,
            f"{facts['count']} dead registration(s) preserved by a fixable cause: {described}. "
            f"`kubectl coroner plan` explains each"
            + (
                f"; for {Reason.RETIRE_REFUSED_BY_ADMISSION}, the registration's Retirable condition "
                f"names the policy that refused the operator's retirement (`kubectl describe`)."
                if Reason.RETIRE_REFUSED_BY_ADMISSION.value in by_reason
                else "."
            ),
            objects=tuple(f"workerregistration/{n}" for names in by_reason.values() for n in names),
            facts=facts,
            names=registration_names([n for names in by_reason.values() for n in names]),
        )
    if unreviewed:
        return unknown(
            name,
            f"{len(unreviewed)} dead registration(s) wait for the retire verb, and whether the operator "
            f"holds it could not be reviewed: {names_text(unreviewed)}.",
            objects=tuple(f"workerregistration/{n}" for n in unreviewed),
            facts=facts,
            names=registration_names(unreviewed),
        )
    tail = f" ({len(expected)} waiting for retire, plan-only as expected)" if expected else ""
    return passed(name, f"0 of {len(plan.entries)} registration(s) retirable-but-blocked{tail}.", facts=facts)


def _claim_keys(registration: Registration) -> list[Hashable]:
    """What a registration claims that another could copy (the decision's lines 12 and 13)."""
    r = registration
    keys: list[Hashable] = [("clientInstanceId", r.namespace, r.client_instance_id)]
    if r.incarnation.complete:
        keys.append(("incarnation", r.namespace, r.node_name, r.incarnation.key))
    if r.session_id and r.generation_id:
        keys.append(("session", r.namespace, r.session_id, r.generation_id))
    return keys


def check_squatting(*, plan: Plan | Unreadable) -> Check:
    """Active registrations that claim another's clientInstanceId, incarnation or session while
    another identity created them (``coroner.dev/registered-by``). The decision ignores them (they
    cannot be the same worker), so they block nothing; a person should know who made them. Where a
    registrant is not recorded, the decision keeps the conflict, and this lists the registration."""
    name = "squatting"
    if isinstance(plan, Unreadable):
        return unknown(name, f"registrations could not be read: {plan.reason}")
    active = [entry.registration for entry in plan.entries if not entry.registration.terminal]
    by_claim: defaultdict[Hashable, list[Registration]] = defaultdict(list)
    for registration in active:
        for key in _claim_keys(registration):
            by_claim[key].append(registration)
    copies: list[tuple[Registration, Registration, tuple[str, ...]]] = []
    unrecorded: set[str] = set()
    # A copy outlives what it copied: an active squatter is named even once its original is retired.
    for registration in (entry.registration for entry in plan.entries):
        candidates = {id(peer): peer for key in _claim_keys(registration) for peer in by_claim[key]}
        if len(candidates) > 1 and registration.registered_by is None and not registration.terminal:
            unrecorded.add(display(model.key_of(registration)))
        copies.extend(
            (peer, registration, claims)
            for peer, claims in squatters(registration, list(candidates.values()))
            if _later(peer, registration)
        )
    copies.sort(key=lambda copy: (display(model.key_of(copy[0])), display(model.key_of(copy[1]))))
    found = [
        {
            "registration": display(model.key_of(copy)),
            "registeredBy": copy.registered_by,
            "claimsOf": display(model.key_of(original)),
            "victimRegisteredBy": original.registered_by,
            "claims": list(claims),
        }
        for copy, original, claims in copies
    ]
    facts = {"count": len(found), "squatters": found, "unrecordedRegistrants": sorted(unrecorded)}
    if copies:
        described = "; ".join(
            f"{display(model.key_of(copy))} (registered by {copy.registered_by}) claims the "
            f"{' and '.join(claims)} of {display(model.key_of(original))} (registered by {original.registered_by})"
            for copy, original, claims in copies
        )
        return failed(
            name,
            f"{len(copies)} registration(s) copy another identity's claims: {described}. They block "
            f"nothing (claims bind only within one registrant); find who holds create on "
            f"workerregistrations there, and delete them.",
            objects=tuple(f"workerregistration/{display(model.key_of(copy))}" for copy, _, _ in copies),
            facts=facts,
            names=tuple(kubectl_name(api.KIND, model.key_of(copy)[1]) for copy, _, _ in copies),
        )
    return passed(name, f"0 of {len(active)} active registration(s) copy another identity's claims.", facts=facts)


def _later(copy: Registration, original: Registration) -> bool:
    """Each pair is found from both sides: the later-created registration is the copy. Where the
    creation times are equal or unknown, both are named (neither is known to be the original)."""
    mine, theirs = copy.creation_time, original.creation_time
    return mine is None or theirs is None or mine >= theirs
