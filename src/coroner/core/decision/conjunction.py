"""The conjunction: `decide` evaluates its lines in their fixed order (docs/architecture.md, "The one
function that decides"); the first line that fails names the one `Reason`."""

from __future__ import annotations

import datetime
from typing import Final

from coroner.core import api
from coroner.core.decision.facts import Facts, Policy, after, aware, lease_expiry
from coroner.core.decision.known import (
    Known,
    agent_death_evidence,
    attested_dead,
    is_self,
    known_fields,
    launcher_minted,
    nothing_attested,
    same_registrant,
    shared_claims,
    squatters,
)
from coroner.core.decision.node import agent_lease, agent_silence, node_death_evidence, vanished, what_releases
from coroner.core.decision.trail import (
    Decision,
    Trail,
    agent_json,
    attestation_json,
    incarnation_json,
    node_json,
    peer_json,
    stamp,
)
from coroner.core.model import Attestation, Registration
from coroner.core.reasons import Evidence, Reason, Verdict

# A pidfd never outlives a boot and /proc only shows the current one (start times count from its
# start): these are claims about the boot the agent is on, so they hold only when that is the
# incarnation's boot. BootBoundary is the converse claim. An attestation contradicting its own
# evidence proves nothing.
_SAME_BOOT_EVIDENCE: Final = frozenset({Evidence.PIDFD_EXITED, Evidence.PROC_ABSENT, Evidence.PID_NAMESPACE_RECREATED})


# The conjunction table, one guarded line after another in its fixed order (docs/architecture.md):
# splitting it would hide the order that is its meaning, so it is the one exemption from the limit.
def decide(*, registration: Registration, facts: Facts, policy: Policy, now: datetime.datetime) -> Decision:  # noqa: C901
    """Decide one registration; a purely computational function with no side effects.

    Exactly one `Reason` results: the first failing line of the conjunction, in the design's order.
    `now` must be aware (a naive one is taken as UTC), as must the datetimes in `facts`.
    """
    now = aware(now)
    trail = Trail(registration=registration, now=now)
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
    known, missing = known_fields(r)
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
        "incarnation": incarnation_json(known),
        "clientInstanceId": known.client_instance_id,
    }
    what = f"{trail.obj} (pid {known.pid} on {known.node_name})"

    # 3. Only a launcher-minted identity is ever retired: anything else may be a hand-made object
    #    whose incarnation fields were never probed from a real process.
    if not launcher_minted(known.client_instance_id):
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
        trail.evidence["agent"] = agent_json(agent, now=now)
    if node is not None:
        trail.evidence["node"] = node_json(node)
    if attestation is not None:
        trail.relied_on = attestation
        trail.evidence["attestation"] = attestation_json(attestation, now=now)

    # 5. Node-level evidence the policy accepts, wherever no agent on the incarnation's boot can
    #    speak any more: whatever that node's agent attested before (an Alive from an agent whose
    #    Lease expired is evidence of nothing). A foreign or unparsable attestation is a
    #    contradiction, and is never overridden.
    if by_node_agent or nothing_attested(r):
        node_evidence = node_death_evidence(trail, known=known, registration=r, node=node, agent=agent, policy=policy)
        if node_evidence is not None:
            trail.death_evidence = node_evidence
            trail.relied_on = None
            # Node evidence replaces the attestation lines and the agent line (the agent went with
            # the node), but never takes a fast path: a heartbeating worker must have been silent
            # past its whole TTL.
            return _remaining_lines(trail, known=known, registration=r, facts=facts, window=None)

    # 6. An attestation from the agent of spec.nodeName.
    if attestation is None or not by_node_agent:
        if not nothing_attested(r):
            # Something was attested, by another node's agent or in a shape that does not parse:
            # a contradiction, never a stand-in for "nothing was attested".
            agent_node = None if attestation is None else attestation.agent_node
            return trail.conclude(
                Reason.ATTESTATION_MISSING,
                f"{what} carries an attestation that is not from the agent of {known.node_name} (agent "
                f"{agent_node!r}); it is decided once that agent attests this incarnation.",
            )
        silent = agent_silence(agent, node_name=known.node_name, now=now)
        if silent is None and agent is not None:
            trail.agent_expiry = lease_expiry(agent.renew_time, agent.lease_duration_seconds)
        if (
            silent is None
            and agent is not None
            and agent.boot_id not in (None, known.boot_id)
            and vanished(known=known, registration=r, node=node)
        ):
            silent = f"its agent Lease {agent_lease(known.node_name)} is live on another boot ({agent.boot_id})"
        if silent is not None:
            releases = what_releases(known=known, registration=r, node=node, policy=policy)
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
    host_claims = {"attestation.incarnation.hostId": attestation.incarnation.host_id}
    # A worker in a container cannot read its host's /etc/machine-id and registers its node's name
    # as its host (coroner.launcher), while the agent, which mounts the host's, speaks with the
    # machine id. Such a registration claims no host beyond its node, which the agent of that very
    # node already proves; the host is bound by the boot id (random per boot) checked above and
    # below. Any other host id must be the one the agent attests from and publishes.
    if known.host_id != known.node_name:
        host_claims["attestation.hostId"] = attestation.host_id
        if agent is not None:
            # The lease is where the agent publishes the host it runs on; an agent whose lease does
            # not say so cannot bind its statement to the registration's host.
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
    silent = agent_silence(agent, node_name=known.node_name, now=now)
    if agent is None or silent is not None:
        return trail.conclude(
            Reason.AGENT_UNAVAILABLE,
            f"{what}: {silent}, so {said}; {what_releases(known=known, registration=r, node=node, policy=policy)}",
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
    death = agent_death_evidence(cited)
    if death is None:
        return trail.conclude(
            Reason.LIVENESS_UNKNOWN,
            f"{what}: {by_agent} attests Dead citing {cited!r}, which does not prove death; it becomes "
            f"retirable after a Dead attestation by pidfd, /proc absence, a recreated pid namespace or boot "
            f"boundary.",
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
    trail: Trail, *, attestation: Attestation, death: Evidence, policy: Policy, what: str
) -> Decision | None:
    """Without heartbeats: the preserve when a /proc-read death was not seen twice far enough apart."""
    if not death.read_from_proc:
        return None
    first, last = attestation.first_observed_time, attestation.observed_time
    needed = datetime.timedelta(seconds=policy.absence_confirm_seconds)
    span = None if first is None or last is None else last - first
    trail.evidence["confirmation"] = {
        "firstObservedTime": None if first is None else stamp(first),
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
    trail: Trail,
    *,
    known: Known,
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
    trail: Trail, *, known: Known, registration: Registration, window: datetime.timedelta | None
) -> Decision | None:
    now = trail.now
    what = f"{trail.obj} (pid {known.pid} on {known.node_name})"
    assert known.ttl_seconds is not None and known.interval_seconds is not None
    ttl = datetime.timedelta(seconds=known.ttl_seconds)
    expires_at = after(known.last_heartbeat, ttl)
    fast_at = None if window is None else after(known.last_heartbeat, max(window, datetime.timedelta(0)))
    silence = now - known.last_heartbeat
    trail.evidence["heartbeat"] = {
        "lastHeartbeatTime": stamp(known.last_heartbeat),
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
            f"{what} was last heard from at {stamp(known.last_heartbeat)}, within its "
            f"{known.ttl_seconds}s heartbeat TTL{corroboration}; it becomes retirable "
            f"at {stamp(deadline) if deadline else 'no known time'} if it stays silent.",
        )
    return None


def _registrants(registration: Registration, peer: Registration) -> str:
    """How the two registrants compare, for a conflict's detail: the same one, or unknown."""
    if same_registrant(registration, peer):
        return f" (same registrant {registration.registered_by!r})"
    unrecorded = [r.display_name for r in (registration, peer) if r.registered_by is None]
    return f" (registrant of {' and '.join(unrecorded)} not recorded, so it may be the same worker)"


def _identity_lines(trail: Trail, *, known: Known, registration: Registration, facts: Facts) -> Decision:
    """Lines 12 to 15: nothing else claims this identity, no Lease protects it, the grant holds."""
    now = trail.now
    what = f"{trail.obj} (pid {known.pid} on {known.node_name})"
    # Claims bind only between registrations one registrant made (admission admits it only as the
    # requester, and freezes it): a peer another identity created cannot be the same worker, whatever it copied, so it
    # blocks nothing; doctor names it. A registrant unrecorded on either side may be the same one.
    squatting = squatters(registration, facts.peers)
    if squatting:
        trail.evidence["squatters"] = [{**peer_json(peer), "claims": list(claims)} for peer, claims in squatting]
    peers = [
        peer
        for peer in facts.peers
        if peer.namespace == known.namespace
        and not peer.terminal
        and not is_self(registration, peer)
        and same_registrant(registration, peer) is not False
    ]

    # 12. No other active registration of its registrant claims the same launcher-minted instance
    #     while it may be live.
    for peer in peers:
        if peer.client_instance_id == known.client_instance_id and not attested_dead(peer):
            trail.evidence["conflict"] = peer_json(peer)
            return trail.conclude(
                Reason.CLIENT_INSTANCE_CONFLICT,
                f"{what}: {peer.display_name} claims the same clientInstanceId "
                f"{known.client_instance_id!r}{_registrants(registration, peer)} and may be live; it is "
                f"decided once that one is attested Dead or becomes terminal.",
            )

    # 13. No identity evidence shared with a live or unknown registration of its registrant.
    for peer in peers:
        shared = shared_claims(known, registration, peer)
        shared_identity = [claim for claim in shared if claim != "clientInstanceId"]
        if shared_identity and not attested_dead(peer):
            trail.evidence["conflict"] = peer_json(peer)
            return trail.conclude(
                Reason.CONFLICTING_IDENTITY,
                f"{what} shares its {shared_identity[0]} with {peer.display_name}"
                f"{_registrants(registration, peer)}, which may be live; it is decided once that one is "
                f"attested Dead or becomes terminal.",
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
                "expiresAt": None if until is None else stamp(until),
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

    silence = f" and silent since {stamp(known.last_heartbeat)}" if known.heartbeat else ""
    return trail.conclude(Reason.ELIGIBLE_STALE_ORPHAN, f"{what} is dead by {path}{silence}; retirable.")
