"""The decision: one reason per registration, in the conjunction's order; unknown is never dead.

Tables first (one case per reason at least, then every clock boundary), then properties that must
hold for any object and any facts: what eligibility implies, that losing knowledge or gaining
evidence of life never makes a registration retirable, that the scheduled re-evaluation is never
late, and that no input makes `decide` raise.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coroner.core.decision import AgentFacts, Decision, Facts, NodeFacts, Policy, decide, lease_expiry
from coroner.core.model import Registration, parse_registration
from coroner.core.reasons import Evidence, Reason
from unit.builders import (
    CLIENT_INSTANCE,
    DELETE,
    NAME,
    NODE,
    NOW,
    OTHER_BOOT,
    REGISTRANT,
    SESSION,
    SILENCE,
    SQUATTER,
    TICK,
    TTL,
    condition,
    decide_raw,
    make_agent,
    make_facts,
    make_lease,
    make_node,
    make_peer,
    make_registration,
    set_path,
    stamp,
)

pytestmark = pytest.mark.unit

S = datetime.timedelta(seconds=1)
NODE_DELETION = Policy(node_deletion_evidence=True)
#: The node went away long enough ago for the quarantine to have passed; no agent is left.
GONE = make_node(exists=False, uid=None, boot_id=None, missing_since=NOW - 60 * S)
GONE_FACTS = make_facts(agent=None, node=GONE)
SHUT_DOWN_FACTS = make_facts(agent=None, node=make_node(out_of_service=True))
#: A worker that did not opt into heartbeats (the default of `coroner run`: writes grow with nodes).
NO_HEARTBEAT: dict[str, Any] = {"heartbeat": False}
ALIVE: dict[str, Any] = {"verdict": "Alive", "evidence": "PidfdPinned"}
#: The agent's Lease ran out 60 s ago: it died (with its node, perhaps) and speaks for nothing now.
EXPIRED_AGENT = make_agent(renewed_at=NOW - 100 * S)
#: Abrupt node loss: workers and agent killed at once, the Node deleted past the quarantine.
LOST_FACTS = make_facts(agent=EXPIRED_AGENT, node=GONE)
#: What the operator records when its admission policies are not as shipped (Comparison.names()).
MISSING_BINDING = "ValidatingAdmissionPolicyBinding/coroner-retire-requires-evidence (missing)"
DIFFERING_POLICY = "ValidatingAdmissionPolicy/coroner-status-fields-by-identity (differs)"
UNREADABLE = "the admission policies could not be read (403 Forbidden: no list)"


def case(
    expected: Reason,
    id: str,  # noqa: A002 -- pytest.param's own word
    *,
    registration: dict[str, Any] | None = None,
    paths: dict[str, object] | None = None,
    obj: object = None,
    facts: Facts | None = None,
    policy: Policy | None = None,
    now: datetime.datetime = NOW,
) -> Any:
    """One row: a raw object (the baseline changed by `registration` keywords and `paths`)."""
    if obj is None:
        obj = make_registration(**(registration or {}), paths=paths)
    return pytest.param(obj, facts or make_facts(), policy or Policy(), now, expected, id=id)


alive_peer = make_peer(verdict="Alive", evidence="PidfdPinned")
dead_peer = make_peer(pid=5000)
unattested_peer = make_peer(attested=False)

REASON_CASES = [
    # --- eligible ------------------------------------------------------------------------------
    case(Reason.ELIGIBLE_STALE_ORPHAN, "eligible-pidfd-exited"),
    # Without heartbeats: the kernel's pidfd at once; /proc reads once seen twice.
    case(Reason.ELIGIBLE_STALE_ORPHAN, "eligible-no-heartbeat-pidfd-exited", registration=NO_HEARTBEAT),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "eligible-no-heartbeat-pidfd-exited-just-now",
        registration={**NO_HEARTBEAT, "observed_at": NOW, "created_at": NOW - S},
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "eligible-no-heartbeat-proc-absent-confirmed",
        registration={**NO_HEARTBEAT, "evidence": "ProcAbsent", "first_observed_at": NOW - 30 * S},
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "eligible-no-heartbeat-boot-boundary-confirmed",
        registration={
            **NO_HEARTBEAT,
            "evidence": "BootBoundary",
            "agent_boot_id": OTHER_BOOT,
            "first_observed_at": NOW - 30 * S,
        },
        facts=make_facts(agent=make_agent(boot_id=OTHER_BOOT), node=make_node(boot_id=OTHER_BOOT)),
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "eligible-no-heartbeat-node-deleted",
        registration={**NO_HEARTBEAT, "attested": False, "created_at": NOW - 5 * S},
        facts=GONE_FACTS,
        policy=NODE_DELETION,
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "eligible-no-heartbeat-out-of-service-after-alive",
        registration={**NO_HEARTBEAT, **ALIVE},
        facts=make_facts(agent=EXPIRED_AGENT, node=make_node(out_of_service=True)),
    ),
    case(Reason.ELIGIBLE_STALE_ORPHAN, "eligible-proc-absent", registration={"evidence": "ProcAbsent"}),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "eligible-pid-namespace-recreated",
        registration={"evidence": "PidNamespaceRecreated"},
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "eligible-boot-boundary",
        registration={"evidence": "BootBoundary", "agent_boot_id": OTHER_BOOT},
        facts=make_facts(agent=make_agent(boot_id=OTHER_BOOT), node=make_node(boot_id=OTHER_BOOT)),
    ),
    case(Reason.ELIGIBLE_STALE_ORPHAN, "eligible-never-heartbeaten", registration={"heartbeat_at": None}),
    case(Reason.ELIGIBLE_STALE_ORPHAN, "eligible-spec-pid-as-digits", paths={"spec.incarnation.pid": "4242"}),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "eligible-attested-pid-as-float",
        paths={"status.attestation.incarnation.pid": 4242.0},
    ),
    case(Reason.ELIGIBLE_STALE_ORPHAN, "eligible-node-unknown", facts=make_facts(node=None)),
    case(Reason.ELIGIBLE_STALE_ORPHAN, "eligible-empty-node-uid", paths={"spec.nodeUID": ""}),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN, "eligible-node-boot-unpublished", facts=make_facts(node=make_node(boot_id=None))
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "eligible-node-deleted-after-quarantine",
        registration={"attested": False},
        facts=GONE_FACTS,
        policy=NODE_DELETION,
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "eligible-node-replaced-new-uid",
        registration={"attested": False},
        facts=make_facts(agent=None, node=make_node(uid="new-uid", boot_id=OTHER_BOOT)),
        policy=NODE_DELETION,
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "eligible-node-out-of-service",
        registration={"attested": False},
        facts=SHUT_DOWN_FACTS,
    ),
    # Node loss after the agent attested Alive: what the agent said before it died
    # does not block node-level evidence once no agent on the incarnation's boot can speak.
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "eligible-node-deleted-after-an-alive-attestation",
        registration=ALIVE,
        facts=LOST_FACTS,
        policy=NODE_DELETION,
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "eligible-node-deleted-after-alive-no-agent-lease",
        registration=ALIVE,
        facts=GONE_FACTS,
        policy=NODE_DELETION,
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "eligible-out-of-service-after-an-alive-attestation",
        registration=ALIVE,
        facts=make_facts(agent=EXPIRED_AGENT, node=make_node(out_of_service=True)),
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "eligible-node-deleted-after-a-reused-attestation",
        registration={"verdict": "Reused", "evidence": "StartTimeDiffers"},
        facts=LOST_FACTS,
        policy=NODE_DELETION,
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "eligible-node-deleted-after-a-dead-attestation-agent-gone",
        facts=LOST_FACTS,
        policy=NODE_DELETION,
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "eligible-node-replaced-after-alive-agent-on-the-new-boot",
        registration=ALIVE,
        facts=make_facts(agent=make_agent(boot_id=OTHER_BOOT), node=make_node(uid="new-uid", boot_id=OTHER_BOOT)),
        policy=NODE_DELETION,
    ),
    case(Reason.ELIGIBLE_STALE_ORPHAN, "eligible-peer-same-instance-dead", facts=make_facts(peers=[dead_peer])),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "eligible-peer-same-instance-retired",
        facts=make_facts(peers=[make_peer(verdict="Alive", conditions=[condition("Retired", "True")])]),
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "eligible-peer-in-other-namespace",
        facts=make_facts(peers=[make_peer(namespace="other", verdict="Alive")]),
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "eligible-itself-among-peers",
        facts=make_facts(peers=[parse_registration(make_registration())]),
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "eligible-lease-expired",
        facts=make_facts(leases=[make_lease(renewed_at=NOW - 30 * S)]),
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "eligible-lease-other-holder",
        facts=make_facts(leases=[make_lease(holder="someone")]),
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "eligible-lease-other-namespace",
        facts=make_facts(leases=[make_lease(namespace="x")]),
    ),
    # --- 1. already terminal -------------------------------------------------------------------
    case(Reason.ALREADY_TERMINAL, "retired-condition", registration={"conditions": [condition("Retired", "True")]}),
    case(Reason.ALREADY_TERMINAL, "retirement-recorded", paths={"status.retirement": {"reason": "PidfdExited"}}),
    case(Reason.ALREADY_TERMINAL, "retirement-of-any-shape", paths={"status.retirement": "yes"}),
    case(Reason.ALREADY_TERMINAL, "released", registration={"conditions": [condition("Released", "True")]}),
    case(
        Reason.ALREADY_TERMINAL,
        "retired-and-otherwise-garbage",
        paths={"spec": DELETE, "status.conditions": [condition("Retired", "True")]},
    ),
    # --- 2. incomplete identity ----------------------------------------------------------------
    case(Reason.INCOMPLETE_IDENTITY, "no-node-name", paths={"spec.nodeName": DELETE}),
    case(Reason.INCOMPLETE_IDENTITY, "empty-node-name", paths={"spec.nodeName": ""}),
    case(Reason.INCOMPLETE_IDENTITY, "no-pid", paths={"spec.incarnation.pid": DELETE}),
    case(Reason.INCOMPLETE_IDENTITY, "pid-fraction", paths={"spec.incarnation.pid": 4242.5}),
    case(Reason.INCOMPLETE_IDENTITY, "pid-bool", paths={"spec.incarnation.pid": True}),
    case(Reason.INCOMPLETE_IDENTITY, "pid-above-limit", paths={"spec.incarnation.pid": 4194305}),
    case(Reason.INCOMPLETE_IDENTITY, "no-boot-id", paths={"spec.incarnation.bootId": DELETE}),
    case(
        Reason.INCOMPLETE_IDENTITY,
        "pid-namespace-decorated",
        paths={"spec.incarnation.pidNamespace": "pid:[4026531836]"},
    ),
    case(Reason.INCOMPLETE_IDENTITY, "start-time-number", paths={"spec.incarnation.startTime": 123456789}),
    case(Reason.INCOMPLETE_IDENTITY, "no-host-id", paths={"spec.incarnation.hostId": DELETE}),
    case(Reason.INCOMPLETE_IDENTITY, "no-incarnation", paths={"spec.incarnation": DELETE}),
    case(Reason.INCOMPLETE_IDENTITY, "no-client-instance-id", paths={"spec.clientInstanceId": DELETE}),
    # An invalid TTL (the CRD allows 1..604800) is no TTL at all: the registration is preserved.
    case(Reason.INCOMPLETE_IDENTITY, "ttl-negative", paths={"spec.heartbeat.ttlSeconds": -30}),
    case(Reason.INCOMPLETE_IDENTITY, "ttl-above-the-crd-maximum", paths={"spec.heartbeat.ttlSeconds": 604801}),
    case(
        Reason.INCOMPLETE_IDENTITY,
        "no-heartbeat-no-creation",
        registration={"heartbeat_at": None},
        paths={"metadata.creationTimestamp": DELETE},
    ),
    case(Reason.INCOMPLETE_IDENTITY, "session-id-not-a-string", paths={"spec.sessionId": 7}),
    case(Reason.INCOMPLETE_IDENTITY, "node-uid-not-a-string", paths={"spec.nodeUID": ["x"]}),
    case(Reason.INCOMPLETE_IDENTITY, "no-name", paths={"metadata.name": DELETE}),
    case(Reason.INCOMPLETE_IDENTITY, "no-spec", paths={"spec": DELETE}),
    case(Reason.INCOMPLETE_IDENTITY, "not-an-object", obj=["not", "a", "registration"]),
    # --- 3. untrusted identity provenance ------------------------------------------------------
    case(
        Reason.UNTRUSTED_IDENTITY_PROVENANCE, "instance-id-not-minted", registration={"client_instance_id": "worker-1"}
    ),
    case(Reason.UNTRUSTED_IDENTITY_PROVENANCE, "instance-id-bare-prefix", registration={"client_instance_id": "inst-"}),
    case(Reason.UNTRUSTED_IDENTITY_PROVENANCE, "instance-id-uppercase", registration={"client_instance_id": "INST-1"}),
    # --- 4. unparsable heartbeat ---------------------------------------------------------------
    case(Reason.UNPARSABLE_HEARTBEAT, "heartbeat-words", registration={"heartbeat_at": "yesterday"}),
    case(Reason.UNPARSABLE_HEARTBEAT, "heartbeat-empty", registration={"heartbeat_at": ""}),
    case(Reason.UNPARSABLE_HEARTBEAT, "heartbeat-without-zone", registration={"heartbeat_at": "2026-11-30T17:59:00"}),
    case(Reason.UNPARSABLE_HEARTBEAT, "heartbeat-leap-second", registration={"heartbeat_at": "2026-11-30T17:59:60Z"}),
    case(Reason.UNPARSABLE_HEARTBEAT, "heartbeat-number", paths={"status.lastHeartbeatTime": 1764525540}),
    case(
        Reason.UNPARSABLE_HEARTBEAT,
        "no-heartbeat-creation-garbage",
        registration={"heartbeat_at": None},
        paths={"metadata.creationTimestamp": "garbage"},
    ),
    # --- 5. attestation missing (and the node-disappearance path) ------------------------------
    case(Reason.ATTESTATION_MISSING, "no-attestation", registration={"attested": False}),
    case(Reason.ATTESTATION_MISSING, "attested-by-another-node", paths={"status.attestation.agent.nodeName": "node-b"}),
    case(Reason.ATTESTATION_MISSING, "attestation-agent-unnamed", paths={"status.attestation.agent": DELETE}),
    case(Reason.ATTESTATION_MISSING, "attestation-not-an-object", paths={"status.attestation": "Dead"}),
    case(
        Reason.ATTESTATION_MISSING,
        "foreign-attestation-on-a-deleted-node",
        paths={"status.attestation.agent.nodeName": "node-b"},
        facts=GONE_FACTS,
        policy=NODE_DELETION,
    ),
    case(
        Reason.ATTESTATION_MISSING,
        "node-deleted-but-agent-live-on-the-same-boot",
        registration={"attested": False},
        facts=make_facts(node=GONE),
        policy=NODE_DELETION,
    ),
    case(
        Reason.ATTESTATION_MISSING,
        "node-out-of-service-but-agent-live-on-the-same-boot",
        registration={"attested": False},
        facts=make_facts(node=make_node(out_of_service=True)),
    ),
    case(
        Reason.AGENT_UNAVAILABLE,
        "node-recreated-on-the-same-boot",
        registration={"attested": False},
        facts=make_facts(agent=None, node=make_node(uid="new-uid")),
        policy=NODE_DELETION,
    ),
    case(
        Reason.ATTESTATION_MISSING,
        "node-recreated-on-the-same-boot-agent-live",
        registration={"attested": False},
        facts=make_facts(node=make_node(uid="new-uid")),
        policy=NODE_DELETION,
    ),
    case(
        Reason.AGENT_UNAVAILABLE,
        "node-not-seen-is-not-deleted",
        registration={"attested": False},
        facts=make_facts(agent=None, node=make_node(exists=None, missing_since=NOW - 3600 * S)),
        policy=NODE_DELETION,
    ),
    case(
        Reason.AGENT_UNAVAILABLE,
        "vanished-node-by-default",
        registration={"attested": False},
        facts=GONE_FACTS,
    ),
    case(
        Reason.AGENT_UNAVAILABLE,
        "vanished-node-in-quarantine",
        registration={"attested": False},
        facts=make_facts(agent=None, node=dataclasses.replace(GONE, missing_since=NOW - 39 * S)),
        policy=NODE_DELETION,
    ),
    case(
        Reason.AGENT_UNAVAILABLE,
        "vanished-node-missing-since-unknown",
        registration={"attested": False},
        facts=make_facts(agent=None, node=dataclasses.replace(GONE, missing_since=None)),
        policy=NODE_DELETION,
    ),
    case(
        Reason.AGENT_UNAVAILABLE,
        "node-replaced-by-default",
        registration={"attested": False},
        facts=make_facts(agent=None, node=make_node(uid="new-uid", boot_id=OTHER_BOOT)),
    ),
    case(
        Reason.AGENT_UNAVAILABLE,
        "out-of-service-not-accepted",
        registration={"attested": False},
        facts=SHUT_DOWN_FACTS,
        policy=Policy(node_out_of_service_evidence=False),
    ),
    # --- 6. attestation mismatch / host binding ------------------------------------------------
    case(Reason.ATTESTATION_MISMATCH, "attested-other-pid", paths={"status.attestation.incarnation.pid": 4243}),
    case(Reason.ATTESTATION_MISMATCH, "attested-other-start", paths={"status.attestation.incarnation.startTime": "1"}),
    case(
        Reason.ATTESTATION_MISMATCH, "attested-other-boot", paths={"status.attestation.incarnation.bootId": OTHER_BOOT}
    ),
    case(
        Reason.ATTESTATION_MISMATCH, "attested-other-pidns", paths={"status.attestation.incarnation.pidNamespace": "1"}
    ),
    case(Reason.ATTESTATION_MISMATCH, "attested-pid-missing", paths={"status.attestation.incarnation.pid": DELETE}),
    case(Reason.ATTESTATION_MISMATCH, "attested-incarnation-missing", paths={"status.attestation.incarnation": DELETE}),
    # A worker in a container cannot read its host's /etc/machine-id (the launcher registers its node's
    # name instead); the agent, which mounts the host's, attests with that: the host is bound by the
    # boot id and the agent of the node, and a node-name claim is not a second host to prove.
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "eligible-container-worker-node-name-host-id",
        paths={"spec.incarnation.hostId": NODE, "status.attestation.incarnation.hostId": NODE},
    ),
    case(
        Reason.HOST_BINDING_UNPROVEN,
        "container-worker-attested-incarnation-other-host",
        paths={"spec.incarnation.hostId": NODE, "status.attestation.incarnation.hostId": "x"},
    ),
    case(Reason.HOST_BINDING_UNPROVEN, "attestation-other-host", paths={"status.attestation.hostId": "other-host"}),
    case(Reason.HOST_BINDING_UNPROVEN, "attestation-host-missing", paths={"status.attestation.hostId": DELETE}),
    case(
        Reason.HOST_BINDING_UNPROVEN,
        "attested-incarnation-other-host",
        paths={"status.attestation.incarnation.hostId": "x"},
    ),
    case(
        Reason.HOST_BINDING_UNPROVEN, "agent-lease-other-host", facts=make_facts(agent=make_agent(host_id="other-host"))
    ),
    case(
        Reason.HOST_BINDING_UNPROVEN, "agent-lease-host-unpublished", facts=make_facts(agent=make_agent(host_id=None))
    ),
    # --- 7. attestation stale / heartbeat after attestation ------------------------------------
    case(Reason.ATTESTATION_STALE, "observed-time-garbage", registration={"observed_at": "recently"}),
    case(Reason.ATTESTATION_STALE, "observed-time-missing", paths={"status.attestation.observedTime": DELETE}),
    case(Reason.ATTESTATION_STALE, "attestation-boot-missing", paths={"status.attestation.bootId": DELETE}),
    case(Reason.ATTESTATION_STALE, "heartbeat-seen-missing", paths={"status.attestation.heartbeatSeen": DELETE}),
    case(
        Reason.ATTESTATION_STALE,
        "agent-rebooted-since-attesting",
        facts=make_facts(agent=make_agent(boot_id=OTHER_BOOT), node=make_node(boot_id=OTHER_BOOT)),
    ),
    # Found by test_a_silent_agent_is_never_said_to_attest: an Alive that does not say its boot,
    # from an agent now on another boot, read PidAlive.
    case(
        Reason.ATTESTATION_STALE,
        "alive-without-boot-agent-now-on-another-boot",
        registration=ALIVE,
        paths={"status.attestation.bootId": DELETE},
        facts=make_facts(agent=make_agent(boot_id=OTHER_BOOT), node=GONE),
    ),
    case(
        Reason.ATTESTATION_STALE,
        "alive-agent-rebooted-since-attesting",
        registration=ALIVE,
        facts=make_facts(agent=make_agent(boot_id=OTHER_BOOT), node=make_node(boot_id=OTHER_BOOT)),
    ),
    case(
        Reason.HEARTBEAT_AFTER_ATTESTATION,
        "heartbeat-one-tick-after-attestation",
        paths={"status.lastHeartbeatTime": stamp(NOW - SILENCE + TICK)},
    ),
    case(
        Reason.HEARTBEAT_AFTER_ATTESTATION,
        "same-instant-spelled-differently",
        paths={"status.lastHeartbeatTime": "2026-11-30T17:59:00Z"},
    ),
    case(
        Reason.HEARTBEAT_AFTER_ATTESTATION,
        "first-heartbeat-after-attestation",
        paths={"status.attestation.heartbeatSeen": ""},
    ),
    # --- 8. verdict ----------------------------------------------------------------------------
    case(Reason.PID_ALIVE, "alive", registration={"verdict": "Alive", "evidence": "PidfdPinned"}),
    case(
        Reason.PID_ALIVE,
        "alive-node-deleted-but-agent-live-on-the-same-boot",
        registration=ALIVE,
        facts=make_facts(node=GONE),
        policy=NODE_DELETION,
    ),
    case(
        Reason.PID_ALIVE,
        "alive-out-of-service-but-agent-live-on-the-same-boot",
        registration=ALIVE,
        facts=make_facts(node=make_node(out_of_service=True)),
    ),
    # A live agent that does not publish its boot may be on the incarnation's: it blocks node evidence.
    case(
        Reason.BOOT_IDENTITY_UNKNOWN,
        "alive-node-deleted-agent-boot-unpublished",
        registration=ALIVE,
        facts=make_facts(agent=make_agent(boot_id=None), node=GONE),
        policy=NODE_DELETION,
    ),
    case(Reason.PID_REUSE_DETECTED, "reused", registration={"verdict": "Reused", "evidence": "StartTimeDiffers"}),
    case(Reason.LIVENESS_UNKNOWN, "unknown", registration={"verdict": "Unknown", "evidence": "ProcUnreadable"}),
    case(Reason.LIVENESS_UNKNOWN, "verdict-lowercase", registration={"verdict": "dead"}),
    case(Reason.LIVENESS_UNKNOWN, "verdict-missing", paths={"status.attestation.verdict": DELETE}),
    case(Reason.LIVENESS_UNKNOWN, "verdict-not-a-string", paths={"status.attestation.verdict": 1}),
    case(Reason.LIVENESS_UNKNOWN, "dead-start-time-differs", registration={"evidence": "StartTimeDiffers"}),
    case(Reason.LIVENESS_UNKNOWN, "dead-zombie-state-only", registration={"evidence": "ZombieThreadGroupAlive"}),
    case(Reason.LIVENESS_UNKNOWN, "dead-citing-node-deleted", registration={"evidence": "NodeDeleted"}),
    case(Reason.LIVENESS_UNKNOWN, "dead-without-evidence", paths={"status.attestation.evidence": DELETE}),
    case(Reason.LIVENESS_UNKNOWN, "dead-unrecognised-evidence", registration={"evidence": "Vibes"}),
    case(
        Reason.LIVENESS_UNKNOWN,
        "proc-absent-claimed-from-another-boot",
        registration={"evidence": "ProcAbsent", "agent_boot_id": OTHER_BOOT},
        facts=make_facts(agent=make_agent(boot_id=OTHER_BOOT), node=make_node(boot_id=OTHER_BOOT)),
    ),
    case(Reason.LIVENESS_UNKNOWN, "boot-boundary-claimed-on-the-same-boot", registration={"evidence": "BootBoundary"}),
    case(
        Reason.LIVENESS_UNKNOWN,
        "pid-namespace-recreated-claimed-from-another-boot",
        registration={"evidence": "PidNamespaceRecreated", "agent_boot_id": OTHER_BOOT},
        facts=make_facts(agent=make_agent(boot_id=OTHER_BOOT), node=make_node(boot_id=OTHER_BOOT)),
    ),
    # --- 9. agent unavailable / boot identity unknown ------------------------------------------
    case(Reason.AGENT_UNAVAILABLE, "no-agent-lease", facts=make_facts(agent=None)),
    # A stale Alive is not alive: the reason names the agent, never "attests alive".
    case(
        Reason.AGENT_UNAVAILABLE, "alive-agent-lease-expired", registration=ALIVE, facts=make_facts(agent=EXPIRED_AGENT)
    ),
    case(Reason.AGENT_UNAVAILABLE, "alive-no-agent-lease", registration=ALIVE, facts=make_facts(agent=None)),
    case(Reason.AGENT_UNAVAILABLE, "alive-node-lost-by-default", registration=ALIVE, facts=LOST_FACTS),
    case(
        Reason.AGENT_UNAVAILABLE,
        "alive-node-lost-in-quarantine",
        registration=ALIVE,
        facts=make_facts(agent=EXPIRED_AGENT, node=dataclasses.replace(GONE, missing_since=NOW - 10 * S)),
        policy=NODE_DELETION,
    ),
    case(
        Reason.AGENT_UNAVAILABLE,
        "alive-node-lost-agent-expiry-unknown",
        registration=ALIVE,
        facts=make_facts(agent=make_agent(renewed_at=None), node=GONE),
        policy=NODE_DELETION,
    ),
    case(
        Reason.AGENT_UNAVAILABLE,
        "reused-agent-lease-expired",
        registration={"verdict": "Reused", "evidence": "StartTimeDiffers"},
        facts=make_facts(agent=EXPIRED_AGENT),
    ),
    case(
        Reason.AGENT_UNAVAILABLE,
        "unknown-agent-lease-expired",
        registration={"verdict": "Unknown", "evidence": "ProcUnreadable"},
        facts=make_facts(agent=EXPIRED_AGENT),
    ),
    case(Reason.AGENT_UNAVAILABLE, "agent-lease-expired", facts=make_facts(agent=make_agent(renewed_at=NOW - 41 * S))),
    case(
        Reason.AGENT_UNAVAILABLE, "agent-lease-without-renew-time", facts=make_facts(agent=make_agent(renewed_at=None))
    ),
    case(
        Reason.AGENT_UNAVAILABLE,
        "agent-lease-without-duration",
        facts=make_facts(agent=make_agent(lease_duration_seconds=None)),
    ),
    case(Reason.BOOT_IDENTITY_UNKNOWN, "agent-boot-unpublished", facts=make_facts(agent=make_agent(boot_id=None))),
    case(
        Reason.BOOT_IDENTITY_UNKNOWN,
        "node-and-agent-disagree-on-boot",
        facts=make_facts(node=make_node(boot_id=OTHER_BOOT)),
    ),
    # --- 10. heartbeat not expired -------------------------------------------------------------
    case(
        Reason.HEARTBEAT_NOT_EXPIRED,
        "proc-absent-inside-window",
        registration={"evidence": "ProcAbsent", "heartbeat_at": NOW - 19 * S},
    ),
    case(
        Reason.HEARTBEAT_NOT_EXPIRED, "clock-skew-heartbeat-in-the-future", registration={"heartbeat_at": NOW + 5 * S}
    ),
    case(
        Reason.HEARTBEAT_NOT_EXPIRED,
        "node-deleted-inside-ttl-no-fast-path",
        registration={"attested": False, "heartbeat_at": NOW - 29 * S},
        facts=GONE_FACTS,
        policy=NODE_DELETION,
    ),
    # --- 10b. death unconfirmed (no heartbeats: the agent must have seen it twice) ------------
    case(
        Reason.DEATH_UNCONFIRMED,
        "no-heartbeat-proc-absent-seen-once",
        registration={**NO_HEARTBEAT, "evidence": "ProcAbsent"},
    ),
    case(
        Reason.DEATH_UNCONFIRMED,
        "no-heartbeat-proc-absent-first-seen-garbage",
        registration={**NO_HEARTBEAT, "evidence": "ProcAbsent", "first_observed_at": "earlier"},
    ),
    case(
        Reason.DEATH_UNCONFIRMED,
        "no-heartbeat-proc-absent-first-seen-after-last",
        registration={**NO_HEARTBEAT, "evidence": "ProcAbsent", "first_observed_at": NOW},
    ),
    case(
        Reason.DEATH_UNCONFIRMED,
        "no-heartbeat-pid-namespace-recreated-seen-once",
        registration={**NO_HEARTBEAT, "evidence": "PidNamespaceRecreated"},
    ),
    case(
        Reason.DEATH_UNCONFIRMED,
        "no-heartbeat-boot-boundary-seen-once",
        registration={**NO_HEARTBEAT, "evidence": "BootBoundary", "agent_boot_id": OTHER_BOOT},
        facts=make_facts(agent=make_agent(boot_id=OTHER_BOOT), node=make_node(boot_id=OTHER_BOOT)),
    ),
    case(
        Reason.DEATH_UNCONFIRMED,
        "no-heartbeat-confirmation-shorter-than-policy",
        registration={**NO_HEARTBEAT, "evidence": "ProcAbsent", "first_observed_at": NOW - 30 * S},
        policy=Policy(absence_confirm_seconds=60),
    ),
    case(Reason.PID_ALIVE, "no-heartbeat-alive", registration={**NO_HEARTBEAT, **ALIVE}),
    case(Reason.INCOMPLETE_IDENTITY, "heartbeat-declared-but-empty", paths={"spec.heartbeat": {}}),
    case(Reason.INCOMPLETE_IDENTITY, "heartbeat-declared-not-an-object", paths={"spec.heartbeat": "yes"}),
    case(
        Reason.HEARTBEAT_AFTER_ATTESTATION,
        "no-heartbeat-but-a-heartbeat-written-after-the-attestation",
        registration=NO_HEARTBEAT,
        paths={"status.lastHeartbeatTime": stamp(NOW)},
    ),
    # --- 11. client instance conflict ----------------------------------------------------------
    case(Reason.CLIENT_INSTANCE_CONFLICT, "peer-same-instance-alive", facts=make_facts(peers=[alive_peer])),
    case(Reason.CLIENT_INSTANCE_CONFLICT, "peer-same-instance-unattested", facts=make_facts(peers=[unattested_peer])),
    case(
        Reason.CLIENT_INSTANCE_CONFLICT,
        "peer-same-instance-dead-then-heartbeat",
        facts=make_facts(peers=[make_peer(pid=5000, paths={"status.lastHeartbeatTime": stamp(NOW)})]),
    ),
    case(
        Reason.CLIENT_INSTANCE_CONFLICT,
        "peer-same-instance-dead-for-another-incarnation",
        facts=make_facts(peers=[make_peer(pid=5000, paths={"status.attestation.incarnation.pid": 5001})]),
    ),
    # --- 12. conflicting identity --------------------------------------------------------------
    case(
        Reason.CONFLICTING_IDENTITY,
        "peer-same-incarnation-unattested",
        facts=make_facts(peers=[make_peer(client_instance_id="inst-other", attested=False)]),
    ),
    case(
        Reason.CONFLICTING_IDENTITY,
        "peer-same-session-generation-alive",
        facts=make_facts(peers=[make_peer(client_instance_id="inst-other", pid=5000, verdict="Alive")]),
    ),
    # --- 12/13. squatting: claims bind only between registrations of one registrant -----------
    # A peer created by another identity (admission records and freezes coroner.dev/registered-by)
    # cannot be the same worker, whatever it copied: it blocks nothing (doctor names it).
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "squatter-same-instance-on-a-node-without-agent",
        facts=make_facts(peers=[make_peer(node_name="node-z", attested=False, registered_by=SQUATTER)]),
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "squatter-same-instance-alive",
        facts=make_facts(peers=[make_peer(pid=5000, verdict="Alive", registered_by=SQUATTER)]),
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "squatter-same-session-generation",
        facts=make_facts(
            peers=[make_peer(client_instance_id="inst-other", pid=5000, attested=False, registered_by=SQUATTER)]
        ),
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "squatter-same-incarnation",
        facts=make_facts(
            peers=[make_peer(client_instance_id="inst-other", session_id="s-9", attested=False, registered_by=SQUATTER)]
        ),
    ),
    # Unknown is never another worker: a registrant missing on either side keeps the conflict.
    case(
        Reason.CLIENT_INSTANCE_CONFLICT,
        "peer-same-instance-registrant-unrecorded",
        facts=make_facts(peers=[make_peer(node_name="node-z", attested=False, registered_by=None)]),
    ),
    case(
        Reason.CLIENT_INSTANCE_CONFLICT,
        "registrant-unrecorded-peer-same-instance",
        registration={"registered_by": None},
        facts=make_facts(peers=[make_peer(node_name="node-z", attested=False, registered_by=SQUATTER)]),
    ),
    case(
        Reason.CLIENT_INSTANCE_CONFLICT,
        "peer-same-instance-registrant-empty",
        facts=make_facts(peers=[make_peer(node_name="node-z", attested=False, registered_by="")]),
    ),
    case(
        Reason.CONFLICTING_IDENTITY,
        "peer-same-session-registrant-unrecorded",
        facts=make_facts(
            peers=[make_peer(client_instance_id="inst-other", pid=5000, attested=False, registered_by=None)]
        ),
    ),
    case(
        Reason.CLIENT_INSTANCE_CONFLICT,
        "peer-same-instance-same-registrant",
        facts=make_facts(peers=[make_peer(node_name="node-z", attested=False, registered_by=REGISTRANT)]),
    ),
    # --- 13. protected lease holder ------------------------------------------------------------
    case(Reason.PROTECTED_LEASE_HOLDER, "lease-held-by-name", facts=make_facts(leases=[make_lease(holder=NAME)])),
    case(Reason.PROTECTED_LEASE_HOLDER, "lease-held-by-session", facts=make_facts(leases=[make_lease(holder=SESSION)])),
    case(
        Reason.PROTECTED_LEASE_HOLDER,
        "lease-held-by-instance",
        facts=make_facts(leases=[make_lease(holder=CLIENT_INSTANCE)]),
    ),
    case(
        Reason.PROTECTED_LEASE_HOLDER,
        "lease-renew-time-unknown",
        facts=make_facts(leases=[make_lease(renewed_at=None)]),
    ),
    case(
        Reason.PROTECTED_LEASE_HOLDER,
        "lease-duration-unknown",
        facts=make_facts(leases=[make_lease(lease_duration_seconds=None)]),
    ),
    # --- 15. admission policies verified (the operator fails closed) --------------------------
    case(
        Reason.ADMISSION_POLICIES_UNVERIFIED,
        "admission-binding-missing",
        facts=make_facts(admission_unverified=[MISSING_BINDING]),
    ),
    case(
        Reason.ADMISSION_POLICIES_UNVERIFIED,
        "admission-policy-differs",
        facts=make_facts(admission_unverified=[DIFFERING_POLICY, MISSING_BINDING]),
    ),
    case(
        Reason.ADMISSION_POLICIES_UNVERIFIED,
        "admission-unreadable",
        facts=make_facts(admission_unverified=[UNREADABLE]),
    ),
    case(
        Reason.ADMISSION_POLICIES_UNVERIFIED,
        "admission-unverified-ahead-of-the-permission",
        facts=make_facts(admission_unverified=[MISSING_BINDING], retire_permission=None),
    ),
    case(
        Reason.ADMISSION_POLICIES_UNVERIFIED,
        "admission-unverified-node-deleted",
        registration={"attested": False},
        facts=dataclasses.replace(GONE_FACTS, admission_unverified=(MISSING_BINDING,)),
        policy=NODE_DELETION,
    ),
    # --- 16. retire permission -----------------------------------------------------------------
    case(Reason.RETIRE_PERMISSION_MISSING, "permission-unknown", facts=make_facts(retire_permission=None)),
    case(Reason.RETIRE_PERMISSION_MISSING, "permission-denied", facts=make_facts(retire_permission=False)),
    case(
        Reason.RETIRE_PERMISSION_MISSING,
        "node-deleted-plan-only",
        registration={"attested": False},
        facts=dataclasses.replace(GONE_FACTS, retire_permission=None),
        policy=NODE_DELETION,
    ),
]


def test_every_reason_has_a_case() -> None:
    covered = {param.values[-1] for param in REASON_CASES}
    decided = {reason for reason in Reason if reason.decided}  # RetireRefusedByAdmission is the write's answer
    assert covered == decided, f"reasons without a case: {decided - covered}"


@pytest.mark.parametrize(("obj", "facts", "policy", "now", "expected"), REASON_CASES)
def test_detail_is_still_while_only_the_clock_moves(
    obj: object, facts: Facts, policy: Policy, now: datetime.datetime, expected: Reason
) -> None:
    # The detail becomes the Retirable condition's message: if it moved with the clock, every
    # reconcile would rewrite the status and its own watch event would reconcile again.
    registration = parse_registration(obj)
    before = decide(registration=registration, facts=facts, policy=policy, now=now)
    later = decide(registration=registration, facts=facts, policy=policy, now=now + datetime.timedelta(seconds=1))
    if later.reason is before.reason:
        assert later.detail == before.detail


@pytest.mark.parametrize(("obj", "facts", "policy", "now", "expected"), REASON_CASES)
def test_reason(obj: object, facts: Facts, policy: Policy, now: datetime.datetime, expected: Reason) -> None:
    decision = decide(registration=parse_registration(obj), facts=facts, policy=policy, now=now)
    assert decision.reason is expected, decision.detail
    assert decision.retirable is (expected is Reason.ELIGIBLE_STALE_ORPHAN)
    assert decision.detail and "\n" not in decision.detail
    json.dumps(decision.evidence, allow_nan=False)
    if decision.retirable:
        assert decision.death_evidence is not None and decision.death_evidence.proves_death


# --- clock boundaries ------------------------------------------------------------------------------

PROC_ABSENT_WINDOW = 20 * S  # 2 x the default 10 s interval
BOUNDARY_CASES = [
    case(
        Reason.HEARTBEAT_NOT_EXPIRED,
        "proc-absent-one-tick-inside-window",
        registration={"evidence": "ProcAbsent", "heartbeat_at": NOW - PROC_ABSENT_WINDOW + TICK},
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "proc-absent-exactly-at-window",
        registration={"evidence": "ProcAbsent", "heartbeat_at": NOW - PROC_ABSENT_WINDOW},
    ),
    case(
        Reason.HEARTBEAT_NOT_EXPIRED,
        "boot-boundary-one-tick-inside-window",
        registration={
            "evidence": "BootBoundary",
            "agent_boot_id": OTHER_BOOT,
            "heartbeat_at": NOW - PROC_ABSENT_WINDOW + TICK,
        },
        facts=make_facts(agent=make_agent(boot_id=OTHER_BOOT), node=make_node(boot_id=OTHER_BOOT)),
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "boot-boundary-exactly-at-window",
        registration={
            "evidence": "BootBoundary",
            "agent_boot_id": OTHER_BOOT,
            "heartbeat_at": NOW - PROC_ABSENT_WINDOW,
        },
        facts=make_facts(agent=make_agent(boot_id=OTHER_BOOT), node=make_node(boot_id=OTHER_BOOT)),
    ),
    case(Reason.ELIGIBLE_STALE_ORPHAN, "pidfd-exited-zero-silence", registration={"heartbeat_at": NOW}),
    case(
        Reason.HEARTBEAT_NOT_EXPIRED, "pidfd-exited-heartbeat-one-tick-ahead", registration={"heartbeat_at": NOW + TICK}
    ),
    # The ProcAbsent window (2 x 10 s) is longer than a 15 s TTL: the TTL decides, exactly at it.
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "heartbeat-exactly-at-ttl",
        registration={"evidence": "ProcAbsent", "ttl_seconds": 15, "heartbeat_at": NOW - 15 * S},
    ),
    case(
        Reason.HEARTBEAT_NOT_EXPIRED,
        "heartbeat-one-tick-inside-ttl",
        registration={"evidence": "ProcAbsent", "ttl_seconds": 15, "heartbeat_at": NOW - 15 * S + TICK},
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "node-path-exactly-at-ttl",
        registration={"attested": False, "heartbeat_at": NOW - TTL * S},
        facts=GONE_FACTS,
        policy=NODE_DELETION,
    ),
    case(
        Reason.HEARTBEAT_NOT_EXPIRED,
        "node-path-one-tick-inside-ttl",
        registration={"attested": False, "heartbeat_at": NOW - TTL * S + TICK},
        facts=GONE_FACTS,
        policy=NODE_DELETION,
    ),
    case(
        Reason.DEATH_UNCONFIRMED,
        "no-heartbeat-proc-absent-confirmed-one-tick-early",
        registration={**NO_HEARTBEAT, "evidence": "ProcAbsent", "first_observed_at": NOW - 20 * S + TICK},
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "no-heartbeat-proc-absent-confirmed-exactly-at-the-window",
        registration={**NO_HEARTBEAT, "evidence": "ProcAbsent", "first_observed_at": NOW - 20 * S},
    ),
    case(
        Reason.DEATH_UNCONFIRMED,
        "no-heartbeat-pid-namespace-recreated-confirmed-one-tick-early",
        registration={**NO_HEARTBEAT, "evidence": "PidNamespaceRecreated", "first_observed_at": NOW - 20 * S + TICK},
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "no-heartbeat-pid-namespace-recreated-confirmed-exactly-at-the-window",
        registration={**NO_HEARTBEAT, "evidence": "PidNamespaceRecreated", "first_observed_at": NOW - 20 * S},
    ),
    case(
        Reason.HEARTBEAT_NOT_EXPIRED,
        "pid-namespace-recreated-one-tick-inside-window",
        registration={"evidence": "PidNamespaceRecreated", "heartbeat_at": NOW - PROC_ABSENT_WINDOW + TICK},
    ),
    case(Reason.ELIGIBLE_STALE_ORPHAN, "attestation-from-the-future", registration={"observed_at": NOW + 60 * S}),
    case(
        Reason.AGENT_UNAVAILABLE,
        "agent-lease-expires-exactly-now",
        facts=make_facts(agent=make_agent(renewed_at=NOW - 40 * S)),
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "agent-lease-one-tick-before-expiry",
        facts=make_facts(agent=make_agent(renewed_at=NOW - 40 * S + TICK)),
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "quarantine-ends-exactly-now",
        registration={"attested": False},
        facts=make_facts(agent=None, node=dataclasses.replace(GONE, missing_since=NOW - 40 * S)),
        policy=NODE_DELETION,
    ),
    case(
        Reason.AGENT_UNAVAILABLE,
        "quarantine-one-tick-left",
        registration={"attested": False},
        facts=make_facts(agent=None, node=dataclasses.replace(GONE, missing_since=NOW - 40 * S + TICK)),
        policy=NODE_DELETION,
    ),
    case(
        Reason.ELIGIBLE_STALE_ORPHAN,
        "protecting-lease-expires-exactly-now",
        facts=make_facts(leases=[make_lease(renewed_at=NOW - 30 * S)]),
    ),
    case(
        Reason.PROTECTED_LEASE_HOLDER,
        "protecting-lease-one-tick-left",
        facts=make_facts(leases=[make_lease(renewed_at=NOW - 30 * S + TICK)]),
    ),
]


@pytest.mark.parametrize(("obj", "facts", "policy", "now", "expected"), BOUNDARY_CASES)
def test_boundary(obj: object, facts: Facts, policy: Policy, now: datetime.datetime, expected: Reason) -> None:
    decision = decide(registration=parse_registration(obj), facts=facts, policy=policy, now=now)
    assert decision.reason is expected, decision.detail


# --- what a decision carries -----------------------------------------------------------------------


class TestDecisionContents:
    def test_eligible_relies_on_the_attestation(self) -> None:
        registration = parse_registration(make_registration())
        decision = decide(registration=registration, facts=make_facts(), policy=Policy(), now=NOW)
        assert decision.death_evidence is Evidence.PIDFD_EXITED
        assert decision.relied_on == registration.attestation
        assert NAME in decision.detail

    def test_node_path_relies_on_no_attestation(self) -> None:
        decision = decide_raw(make_registration(attested=False), facts=GONE_FACTS, policy=NODE_DELETION)
        assert decision.retirable
        assert decision.death_evidence is Evidence.NODE_DELETED
        assert decision.relied_on is None

    def test_out_of_service_evidence(self) -> None:
        decision = decide_raw(make_registration(attested=False), facts=SHUT_DOWN_FACTS)
        assert decision.death_evidence is Evidence.NODE_OUT_OF_SERVICE

    def test_plan_only_still_names_the_death_path(self) -> None:
        decision = decide_raw(make_registration(evidence="ProcAbsent"), facts=make_facts(retire_permission=None))
        assert decision.reason is Reason.RETIRE_PERMISSION_MISSING
        assert decision.death_evidence is Evidence.PROC_ABSENT

    def test_unverified_admission_names_the_objects_and_the_death_path(self) -> None:
        facts = make_facts(admission_unverified=[DIFFERING_POLICY, MISSING_BINDING])
        decision = decide_raw(make_registration(evidence="ProcAbsent"), facts=facts)
        assert decision.reason is Reason.ADMISSION_POLICIES_UNVERIFIED
        assert not decision.retirable
        assert decision.death_evidence is Evidence.PROC_ABSENT
        assert DIFFERING_POLICY in decision.detail and MISSING_BINDING in decision.detail
        assert "plan-only" in decision.detail and "ProcAbsent" in decision.detail
        assert decision.evidence["admissionUnverified"] == [DIFFERING_POLICY, MISSING_BINDING]

    def test_verified_admission_is_not_in_the_evidence(self) -> None:
        assert "admissionUnverified" not in decide_raw(make_registration()).evidence

    def test_preserve_detail_says_what_would_change_it(self) -> None:
        decision = decide_raw(make_registration(verdict="Alive", evidence="PidfdPinned"))
        assert "alive" in decision.detail and "Dead" in decision.detail

    def test_evidence_records_the_facts_used(self) -> None:
        decision = decide_raw(make_registration())
        evidence: dict[str, Any] = json.loads(json.dumps(decision.evidence))
        assert evidence["nodeName"] == NODE
        assert evidence["attestation"]["verdict"] == "Dead"
        assert evidence["heartbeat"]["silenceSeconds"] == SILENCE.total_seconds()
        assert evidence["retirePermission"] is True

    def test_a_stale_alive_names_the_expired_lease(self) -> None:
        decision = decide_raw(make_registration(**ALIVE), facts=LOST_FACTS)
        assert decision.reason is Reason.AGENT_UNAVAILABLE
        assert "attests the process is alive" not in decision.detail
        assert "coroner-agent-node-a expired at 2026-11-30T17:59:00" in decision.detail
        assert "no longer speaks for the process" in decision.detail
        # Node gone, no opt-in: the detail names what would release it.
        assert "node-loss component" in decision.detail and "kubectl coroner plan/apply" in decision.detail
        assert "--node-quarantine-seconds=0" in decision.detail
        assert "out-of-service" not in decision.detail, "a deleted Node cannot be tainted"
        assert decision.relied_on is not None and decision.death_evidence is None

    def test_node_evidence_after_an_attestation_does_not_rely_on_it(self) -> None:
        decision = decide_raw(make_registration(**ALIVE), facts=LOST_FACTS, policy=NODE_DELETION)
        assert decision.retirable and decision.death_evidence is Evidence.NODE_DELETED
        assert decision.relied_on is None
        assert decision.evidence["attestation"]["verdict"] == "Alive"  # type: ignore[index]

    def test_naive_now_is_utc(self) -> None:
        decision = decide_raw(make_registration(), now=NOW.replace(tzinfo=None))
        assert decision.retirable


class TestNextEvaluation:
    def test_fast_path_window_end(self) -> None:
        decision = decide_raw(make_registration(evidence="ProcAbsent", heartbeat_at=NOW - 5 * S))
        assert decision.reason is Reason.HEARTBEAT_NOT_EXPIRED
        assert decision.next_evaluation_at == NOW + 15 * S

    def test_ttl_end_without_fast_path(self) -> None:
        decision = decide_raw(
            make_registration(attested=False, heartbeat_at=NOW - 5 * S), facts=GONE_FACTS, policy=NODE_DELETION
        )
        assert decision.next_evaluation_at == NOW + 25 * S

    def test_a_dead_attestation_never_ages(self) -> None:
        # Attestations are written on change only (no periodic write per worker): a death stays a death while its agent
        # is live on the boot it saw it from; only that agent's Lease expiry can change this.
        decision = decide_raw(make_registration(observed_at=NOW - 86400 * S))
        assert decision.retirable
        assert decision.next_evaluation_at is None and decision.agent_expires_at == NOW + 35 * S

    def test_agent_lease_expiry(self) -> None:
        # Watched once per node by the runtime, not per registration: never in next_evaluation_at.
        decision = decide_raw(make_registration())
        assert decision.agent_expires_at == NOW + 35 * S
        assert decision.next_evaluation_at is None

    def test_a_live_verdict_changes_when_its_agent_lease_expires(self) -> None:
        decision = decide_raw(make_registration(verdict="Alive", evidence="PidfdPinned"))
        assert decision.reason is Reason.PID_ALIVE
        assert decision.agent_expires_at == NOW + 35 * S
        assert decide_raw(make_registration(verdict="Alive"), now=NOW + 35 * S).reason is Reason.AGENT_UNAVAILABLE

    def test_a_live_agent_blocking_node_evidence_is_watched(self) -> None:
        decision = decide_raw(make_registration(attested=False), facts=make_facts(node=GONE), policy=NODE_DELETION)
        assert decision.reason is Reason.ATTESTATION_MISSING
        assert decision.agent_expires_at == NOW + 35 * S

    def test_quarantine_end(self) -> None:
        facts = make_facts(agent=None, node=dataclasses.replace(GONE, missing_since=NOW - 10 * S))
        decision = decide_raw(make_registration(attested=False), facts=facts, policy=NODE_DELETION)
        assert decision.reason is Reason.AGENT_UNAVAILABLE
        assert decision.next_evaluation_at == NOW + 30 * S

    def test_protecting_lease_expiry_is_the_last_one(self) -> None:
        leases = [make_lease(name="a", renewed_at=NOW - 20 * S), make_lease(name="b", renewed_at=NOW - 10 * S)]
        decision = decide_raw(make_registration(), facts=make_facts(agent=make_agent(renewed_at=NOW), leases=leases))
        assert decision.reason is Reason.PROTECTED_LEASE_HOLDER
        assert decision.next_evaluation_at == NOW + 20 * S

    def test_nothing_changes_by_the_clock(self) -> None:
        # A live verdict preserves at any age: only its agent's Lease expiry or a new attestation changes it.
        assert decide_raw(make_registration(verdict="Alive")).next_evaluation_at is None
        assert decide_raw(make_registration(client_instance_id="worker")).next_evaluation_at is None
        assert decide_raw(make_registration(conditions=[condition("Released", "True")])).next_evaluation_at is None


# --- the fixed order ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Fault:
    """One failing line, changing fields no other fault touches."""

    reason: Reason
    paths: dict[str, object] = dataclasses.field(default_factory=dict)
    facts: Callable[[dict[str, Any]], None] = lambda parts: None


def _drop_agent(parts: dict[str, Any]) -> None:
    parts["agent"] = None


def _node_other_boot(parts: dict[str, Any]) -> None:
    parts["node"] = make_node(boot_id=OTHER_BOOT)


def _add_peer(peer: Registration) -> Callable[[dict[str, Any]], None]:
    return lambda parts: parts["peers"].append(peer)


def _add_lease(parts: dict[str, Any]) -> None:
    parts["leases"].append(make_lease())


def _no_permission(parts: dict[str, Any]) -> None:
    parts["retire_permission"] = None


def _admission_unverified(parts: dict[str, Any]) -> None:
    parts["admission_unverified"] = (MISSING_BINDING,)


#: In conjunction order; when several are combined, the first must win.
FAULTS = [
    Fault(Reason.ALREADY_TERMINAL, {"status.conditions": [condition("Released", "True")]}),
    Fault(Reason.INCOMPLETE_IDENTITY, {"spec.incarnation.startTime": DELETE}),
    Fault(Reason.UNTRUSTED_IDENTITY_PROVENANCE, {"spec.clientInstanceId": "worker-1"}),
    Fault(Reason.UNPARSABLE_HEARTBEAT, {"status.lastHeartbeatTime": "garbage"}),
    Fault(Reason.ATTESTATION_MISSING, {"status.attestation.agent.nodeName": "node-b"}),
    Fault(Reason.ATTESTATION_MISMATCH, {"status.attestation.incarnation.pid": 4243}),
    Fault(Reason.HOST_BINDING_UNPROVEN, {"status.attestation.hostId": "other-host"}),
    Fault(Reason.AGENT_UNAVAILABLE, facts=_drop_agent),
    Fault(Reason.BOOT_IDENTITY_UNKNOWN, facts=_node_other_boot),
    Fault(Reason.PID_ALIVE, {"status.attestation.verdict": "Alive"}),
    Fault(Reason.ATTESTATION_STALE, {"status.attestation.observedTime": DELETE}),
    Fault(Reason.HEARTBEAT_AFTER_ATTESTATION, {"status.attestation.heartbeatSeen": "another"}),
    Fault(
        Reason.HEARTBEAT_NOT_EXPIRED,
        {
            "status.attestation.evidence": "ProcAbsent",
            "spec.heartbeat.intervalSeconds": 1000,
            "spec.heartbeat.ttlSeconds": 1000,
        },
    ),
    Fault(Reason.CLIENT_INSTANCE_CONFLICT, facts=_add_peer(make_peer(pid=5000, session_id="s-9", verdict="Alive"))),
    Fault(
        Reason.CONFLICTING_IDENTITY,
        facts=_add_peer(make_peer(name="session-twin", client_instance_id="inst-twin", pid=5001, verdict="Alive")),
    ),
    Fault(Reason.PROTECTED_LEASE_HOLDER, facts=_add_lease),
    Fault(Reason.ADMISSION_POLICIES_UNVERIFIED, facts=_admission_unverified),
    Fault(Reason.RETIRE_PERMISSION_MISSING, facts=_no_permission),
]


def _with_faults(faults: list[Fault]) -> Decision:
    paths: dict[str, object] = {}
    parts: dict[str, Any] = {"peers": [], "leases": [], "retire_permission": True}
    for fault in faults:
        paths |= fault.paths
        fault.facts(parts)
    registration = parse_registration(make_registration(paths=paths))
    return decide(registration=registration, facts=make_facts(**parts), policy=Policy(), now=NOW)


@pytest.mark.parametrize("fault", [pytest.param(f, id=f.reason.value) for f in FAULTS])
def test_each_fault_alone(fault: Fault) -> None:
    assert _with_faults([fault]).reason is fault.reason


@given(chosen=st.sets(st.integers(0, len(FAULTS) - 1), min_size=1))
@settings(deadline=None)
def test_first_failing_line_wins(chosen: set[int]) -> None:
    faults = [FAULTS[index] for index in sorted(chosen)]
    assert _with_faults(faults).reason is faults[0].reason


# --- properties -------------------------------------------------------------------------------------

#: Variants per path, near the baseline, so that random states reach every line (and eligibility).
VARIANTS: dict[str, list[object]] = {
    "spec.nodeName": [DELETE, "node-b"],
    "spec.incarnation.pid": [DELETE, 4243, 4242.0, "4242", 4242.5],
    "spec.incarnation.bootId": [DELETE, OTHER_BOOT],
    "spec.incarnation.hostId": [DELETE, "other-host"],
    "spec.clientInstanceId": [DELETE, "worker-1", "inst-other"],
    "spec.sessionId": [DELETE, "s-9", 7],
    "spec.heartbeat.intervalSeconds": [1, 100, DELETE],
    "spec.heartbeat.ttlSeconds": [1, 15, 1000, DELETE],
    "status.lastHeartbeatTime": [DELETE, stamp(NOW), stamp(NOW + 5 * S), stamp(NOW - 1000 * S), "garbage"],
    "metadata.creationTimestamp": [DELETE, "garbage"],
    "status.attestation": [DELETE, "Dead"],
    "status.attestation.verdict": ["Alive", "Reused", "Unknown", "dead", DELETE],
    "status.attestation.evidence": ["ProcAbsent", "BootBoundary", "StartTimeDiffers", "NodeDeleted", DELETE],
    "status.attestation.observedTime": [DELETE, stamp(NOW - 1000 * S), stamp(NOW - 599 * S), "soon"],
    "status.attestation.heartbeatSeen": [DELETE, "", stamp(NOW)],
    "status.attestation.bootId": [DELETE, OTHER_BOOT],
    "status.attestation.hostId": [DELETE, "other-host"],
    "status.attestation.agent.nodeName": [DELETE, "node-b"],
    "status.attestation.incarnation.pid": [DELETE, 4243, "4242"],
    "status.attestation.incarnation.startTime": [DELETE, "1"],
    "status.conditions": [
        [condition("Retired", "True")],
        [condition("Released", "True")],
        [condition("Retired", "False")],
    ],
    "status.retirement": [{"reason": "PidfdExited"}],
}

AGENTS = st.sampled_from(
    [
        make_agent(),
        None,
        make_agent(renewed_at=NOW - 100 * S),
        make_agent(renewed_at=NOW + 20 * S),
        make_agent(boot_id=None),
        make_agent(boot_id=OTHER_BOOT),
        make_agent(host_id=None),
        make_agent(renewed_at=None),
        make_agent(lease_duration_seconds=1e30),
    ]
)
NODES = st.sampled_from(
    [
        make_node(),
        None,
        make_node(boot_id=None),
        make_node(boot_id=OTHER_BOOT),
        make_node(exists=None),
        GONE,
        dataclasses.replace(GONE, missing_since=NOW - 10 * S),
        dataclasses.replace(GONE, missing_since=None),
        make_node(out_of_service=True),
        make_node(uid="new-uid"),
        make_node(uid="new-uid", boot_id=OTHER_BOOT),
    ]
)
LEASES = st.lists(
    st.builds(
        make_lease,
        holder=st.sampled_from([NAME, SESSION, CLIENT_INSTANCE, "someone", None]),
        namespace=st.sampled_from(["jobs", "other"]),
        renewed_at=st.sampled_from([NOW, NOW - 29 * S, NOW - 31 * S, None]),
        lease_duration_seconds=st.sampled_from([30, None]),
    ),
    max_size=2,
)
PEERS = st.lists(
    st.sampled_from(
        [
            alive_peer,
            dead_peer,
            unattested_peer,
            make_peer(client_instance_id="inst-other", attested=False),
            make_peer(client_instance_id="inst-other", pid=5000, verdict="Alive"),
            make_peer(client_instance_id="inst-other", pid=5000, session_id="s-9"),
            make_peer(verdict="Alive", conditions=[condition("Retired", "True")]),
            make_peer(namespace="other", verdict="Alive"),
            make_peer(verdict="Alive", registered_by=SQUATTER),
            make_peer(node_name="node-z", attested=False, registered_by=None),
            make_peer(client_instance_id="inst-other", pid=5000, attested=False, registered_by=SQUATTER),
        ]
    ),
    max_size=2,
)
POLICIES = st.sampled_from(
    [
        Policy(),
        NODE_DELETION,
        Policy(node_out_of_service_evidence=False),
        Policy(absence_confirm_seconds=30, proc_absent_window_intervals=0),
    ]
)
OFFSETS = st.one_of(
    st.sampled_from([datetime.timedelta(0), TICK, -TICK, 5 * S, 20 * S, 100 * S, 1000 * S, -1000 * S]),
    st.integers(-(10**9), 10**9).map(lambda micros: datetime.timedelta(microseconds=micros)),
)


@dataclasses.dataclass(frozen=True)
class State:
    obj: dict[str, Any]
    facts: Facts
    policy: Policy
    now: datetime.datetime

    def decide(self) -> Decision:
        return decide(registration=parse_registration(self.obj), facts=self.facts, policy=self.policy, now=self.now)


@st.composite
def states(draw: st.DrawFn) -> State:
    """Near a retirable baseline: each part stays as the baseline has it half of the time."""
    baseline = draw(
        st.sampled_from(
            [
                "pidfd",
                "proc-absent",
                "ns-recreated",
                "boot-boundary",
                "node-deleted",
                "out-of-service",
                "lost-after-alive",
            ]
        )
    )
    keep = st.booleans()
    baselines: dict[str, dict[str, Any]] = {
        "pidfd": {},
        "proc-absent": {"evidence": "ProcAbsent"},
        "ns-recreated": {"evidence": "PidNamespaceRecreated"},
        "boot-boundary": {"evidence": "BootBoundary", "agent_boot_id": OTHER_BOOT},
        "node-deleted": {"attested": False},
        "out-of-service": {"attested": False},
        "lost-after-alive": ALIVE,
    }
    keywords = dict(baselines[baseline])
    if not draw(keep):
        keywords["heartbeat_at"] = NOW - draw(st.sampled_from([60, 25, 19, 0, -5])) * S
    obj = make_registration(**keywords)
    if not draw(keep):
        for path in draw(st.lists(st.sampled_from(sorted(VARIANTS)), min_size=1, max_size=3, unique=True)):
            set_path(obj, path, draw(st.sampled_from(VARIANTS[path])))
    parts: dict[str, tuple[AgentFacts | None, NodeFacts | None, Policy]] = {
        "pidfd": (make_agent(), make_node(), Policy()),
        "proc-absent": (make_agent(), make_node(), Policy()),
        "ns-recreated": (make_agent(), make_node(), Policy()),
        "boot-boundary": (make_agent(boot_id=OTHER_BOOT), make_node(boot_id=OTHER_BOOT), Policy()),
        "node-deleted": (None, GONE, NODE_DELETION),
        "out-of-service": (None, make_node(out_of_service=True), Policy()),
        "lost-after-alive": (EXPIRED_AGENT, GONE, NODE_DELETION),
    }
    agent, node, policy = parts[baseline]
    agent = agent if draw(keep) else draw(AGENTS)
    node = node if draw(keep) else draw(NODES)
    facts = Facts(
        agents={} if agent is None else {NODE: agent},
        nodes={} if node is None else {NODE: node},
        protecting_leases=() if draw(keep) else tuple(draw(LEASES)),
        peers=() if draw(keep) else tuple(draw(PEERS)),
        retire_permission=True if draw(keep) else draw(st.sampled_from([True, False, None])),
        admission_unverified=() if draw(keep) else draw(st.sampled_from([(), (MISSING_BINDING,), (UNREADABLE,)])),
    )
    policy = policy if draw(keep) else draw(POLICIES)
    now = NOW if draw(keep) else NOW + draw(OFFSETS)
    return State(obj=obj, facts=facts, policy=policy, now=now)


PROPERTY_SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@given(state=states())
@PROPERTY_SETTINGS
def test_eligibility_implies_every_requirement(state: State) -> None:
    decision = state.decide()
    if not decision.retirable:
        return
    r = parse_registration(state.obj)
    now = state.now
    assert not r.retired and not r.released
    assert r.node_name and r.client_instance_id and r.client_instance_id.startswith("inst-")
    assert r.incarnation.complete
    assert not r.heartbeat.declared or (r.heartbeat.interval_seconds and r.heartbeat.ttl_seconds)
    assert r.last_heartbeat_time is not None and not r.heartbeat_unparsable
    silence = now - r.last_heartbeat_time
    # A heartbeating worker is silent (never a heartbeat from the future); one without heartbeats
    # has no silence to wait for.
    assert not r.heartbeat.declared or silence >= datetime.timedelta(0)
    assert state.facts.retire_permission is True
    assert not state.facts.admission_unverified
    assert decision.death_evidence is not None and decision.death_evidence.proves_death
    holders = {r.name, r.client_instance_id, r.session_id} - {None}
    for lease in state.facts.protecting_leases:
        if lease.namespace == r.namespace and lease.holder_identity in holders:
            assert lease.renew_time is not None and lease.lease_duration_seconds is not None
            assert lease.lease_duration_seconds <= (now - lease.renew_time).total_seconds()
    for peer in state.facts.peers:
        # Only a peer whose registrant is known to differ may share a claim with a retirable one.
        may_be_same_worker = not (r.registered_by and peer.registered_by and r.registered_by != peer.registered_by)
        if peer.namespace == r.namespace and not peer.terminal and peer.name != r.name and may_be_same_worker:
            assert peer.client_instance_id != r.client_instance_id or (
                peer.attestation is not None and peer.attestation.verdict == "Dead"
            )
    attestation = r.attestation
    if decision.death_evidence in (Evidence.NODE_DELETED, Evidence.NODE_OUT_OF_SERVICE):
        # Nothing attested, or only by the node's own agent, which can no longer speak.
        if attestation is None:
            assert "status.attestation" not in {path for path, _ in r.problems}
        else:
            assert attestation.agent_node == r.node_name
        assert not _agent_may_speak(state)
        assert not r.heartbeat.declared or silence >= datetime.timedelta(seconds=r.heartbeat.ttl_seconds or 0)
        node = state.facts.nodes[r.node_name]
        if decision.death_evidence is Evidence.NODE_DELETED:
            assert state.policy.node_deletion_evidence
            assert node.exists is False or node.uid != r.node_uid
        else:
            assert node.out_of_service and state.policy.node_out_of_service_evidence
        return
    assert attestation is not None and decision.relied_on == attestation
    assert attestation.agent_node == r.node_name
    assert attestation.verdict == "Dead"
    assert attestation.evidence == decision.death_evidence
    assert attestation.incarnation.key == r.incarnation.key
    assert attestation.host_id == r.incarnation.host_id == attestation.incarnation.host_id
    assert attestation.heartbeat_seen == (r.last_heartbeat_raw or "")
    assert attestation.observed_time is not None
    if not r.heartbeat.declared and decision.death_evidence.read_from_proc:
        # No worker-side witness: the agent saw it twice, far enough apart.
        assert attestation.first_observed_time is not None
        span = attestation.observed_time - attestation.first_observed_time
        assert span >= datetime.timedelta(seconds=state.policy.absence_confirm_seconds)
    agent = state.facts.agents[r.node_name]
    assert agent.renew_time is not None and agent.lease_duration_seconds is not None
    assert agent.lease_duration_seconds > (now - agent.renew_time).total_seconds()
    assert agent.boot_id == attestation.boot_id and agent.host_id == r.incarnation.host_id
    node_facts = state.facts.nodes.get(r.node_name)
    assert node_facts is None or node_facts.boot_id in (None, agent.boot_id)


# Losing knowledge. Each entry turns one positive fact — one the conjunction needs to be present
# and right — to unknown. Deliberately not here: the attestation as a whole and the heartbeat as a
# whole (their absence is defined, not unknown: "nothing attested" enables the node path, "no
# heartbeat yet" means birth), and facts that only ever add doubt when present (peers, protecting
# leases, sessionId, the Node's boot id): losing doubt may of course make a registration retirable.
UNKNOWING_PATHS = [
    "spec.nodeName",
    "spec.incarnation.bootId",
    "spec.incarnation.pidNamespace",
    "spec.incarnation.pid",
    "spec.incarnation.startTime",
    "spec.incarnation.hostId",
    "spec.clientInstanceId",
    "spec.heartbeat.intervalSeconds",
    "spec.heartbeat.ttlSeconds",
    "status.attestation.verdict",
    "status.attestation.evidence",
    "status.attestation.incarnation",
    "status.attestation.incarnation.pid",
    "status.attestation.incarnation.hostId",
    "status.attestation.bootId",
    "status.attestation.hostId",
    "status.attestation.observedTime",
    "status.attestation.heartbeatSeen",
    "status.attestation.agent.nodeName",
]


def _unknowings(state: State) -> Iterator[tuple[str, State]]:
    for path in UNKNOWING_PATHS:
        for value in (DELETE, {"garbage": True}):
            obj = json.loads(json.dumps(state.obj))
            set_path(obj, path, value)
            yield f"{path}={value!r}", dataclasses.replace(state, obj=obj)
    # Unknown as the design defines it for these: present but unreadable.
    for path, unreadable in (
        ("status.lastHeartbeatTime", "garbage"),
        ("metadata.creationTimestamp", "garbage"),
        ("spec.sessionId", 7),
        ("spec.generationId", 7),
        ("spec.nodeUID", 7),
    ):
        obj = json.loads(json.dumps(state.obj))
        set_path(obj, path, unreadable)
        yield f"{path} unreadable", dataclasses.replace(state, obj=obj)
    obj = json.loads(json.dumps(state.obj))
    obj["metadata"].pop("annotations", None)
    yield "registrant unrecorded", dataclasses.replace(state, obj=obj)
    facts = state.facts
    peers = tuple(_unrecorded(peer) for peer in facts.peers)
    yield "peers' registrants unrecorded", dataclasses.replace(state, facts=dataclasses.replace(facts, peers=peers))
    yield "permission unknown", dataclasses.replace(state, facts=dataclasses.replace(facts, retire_permission=None))
    unread = dataclasses.replace(facts, admission_unverified=(UNREADABLE,))
    yield "admission policies unread", dataclasses.replace(state, facts=unread)
    if "attestation" in state.obj.get("status", {}):
        # On the attested path the agent Lease is positive evidence (on the node path it is doubt).
        # Its absence is also what lets node-level evidence speak, so it goes with the Node's facts.
        yield "agent lease gone", dataclasses.replace(state, facts=dataclasses.replace(facts, agents={}, nodes={}))
        for field in ("boot_id", "host_id", "renew_time", "lease_duration_seconds"):
            agents = {name: dataclasses.replace(agent, **{field: None}) for name, agent in facts.agents.items()}
            yield f"agent {field} unknown", dataclasses.replace(state, facts=dataclasses.replace(facts, agents=agents))
    else:
        yield "node unknown", dataclasses.replace(state, facts=dataclasses.replace(facts, nodes={}))
        for change in ({"exists": None}, {"missing_since": None}, {"out_of_service": False}, {"uid": None}):
            nodes = {name: dataclasses.replace(node, **change) for name, node in facts.nodes.items()}
            yield f"node {change}", dataclasses.replace(state, facts=dataclasses.replace(facts, nodes=nodes))


@given(state=states())
@PROPERTY_SETTINGS
def test_losing_knowledge_never_makes_retirable(state: State) -> None:
    before = state.decide()
    for what, after_state in _unknowings(state):
        after = after_state.decide()
        if after.retirable:
            assert before.retirable, f"{what} turned {before.reason} into {after.reason}"


def _unrecorded(peer: Registration) -> Registration:
    """`peer` as a registration whose registrant annotation is missing."""
    return dataclasses.replace(peer, registered_by=None)


def _squatters(state: State) -> Iterator[tuple[str, Registration]]:
    """Peers made by another identity that copy the registration's claims, each in another way."""
    r = parse_registration(state.obj)
    copied = {
        "clientInstanceId": {"client_instance_id": r.client_instance_id, "session_id": "s-squat"},
        "session and generation": {"client_instance_id": "inst-squat", "pid": 9999},
        "incarnation": {"client_instance_id": "inst-squat", "session_id": "s-squat"},
    }
    for what, claims in copied.items():
        for liveness in ({"attested": False, "heartbeat_at": state.now}, ALIVE):
            keywords: dict[str, Any] = {"name": "squatter", "registered_by": SQUATTER, **liveness}
            yield what, make_peer(**{**keywords, **{k: v for k, v in claims.items() if v is not None}})


@given(state=states())
@PROPERTY_SETTINGS
def test_a_squatter_of_another_registrant_changes_nothing(state: State) -> None:
    """A registration with a recorded registrant decides the same whatever another identity copies;
    without one, a copy never makes it retirable (unknown is never another worker)."""
    before = state.decide()
    recorded = bool(parse_registration(state.obj).registered_by)
    for what, squatter in _squatters(state):
        facts = dataclasses.replace(state.facts, peers=(*state.facts.peers, squatter))
        after = dataclasses.replace(state, facts=facts).decide()
        if recorded:
            assert (after.reason, after.retirable) == (before.reason, before.retirable), what
        elif after.retirable:
            assert before.retirable, f"a squatter copying the {what} turned {before.reason} into {after.reason}"


def _life_evidence(state: State) -> Iterator[tuple[str, State, bool]]:
    """(what, state with that evidence of life added, whether it alone must preserve)."""
    last = parse_registration(state.obj).last_heartbeat_time
    newer = [(max(state.now, last or state.now) + TICK, True)]
    if last is not None and last < state.now - 10 * S:
        newer.append((state.now - 10 * S, False))  # newer, but maybe still past the TTL
    for at, decisive in newer:
        obj = json.loads(json.dumps(state.obj))
        set_path(obj, "status.lastHeartbeatTime", stamp(at))
        yield f"heartbeat at {at}", dataclasses.replace(state, obj=obj), decisive
    # An Alive verdict is evidence of life only while an agent on the incarnation's boot may speak
    # for it: from an agent whose Lease is gone it is evidence of nothing.
    if _agent_may_speak(state):
        obj = json.loads(json.dumps(state.obj))
        status = obj.setdefault("status", {})
        if isinstance(status.get("attestation"), dict):
            status["attestation"]["verdict"] = "Alive"
        else:
            status["attestation"] = make_registration(verdict="Alive", evidence="PidfdPinned")["status"]["attestation"]
        yield "verdict Alive", dataclasses.replace(state, obj=obj), True
    facts = state.facts
    lease = make_lease(renewed_at=state.now)
    yield (
        "protecting lease",
        dataclasses.replace(
            state, facts=dataclasses.replace(facts, protecting_leases=(*facts.protecting_leases, lease))
        ),
        True,
    )
    peer = make_peer(name="live-twin", attested=False, heartbeat_at=state.now)
    yield "live peer", dataclasses.replace(state, facts=dataclasses.replace(facts, peers=(*facts.peers, peer))), True


@given(state=states())
@PROPERTY_SETTINGS
def test_evidence_of_life_never_makes_retirable(state: State) -> None:
    before = state.decide()
    for what, after_state, decisive in _life_evidence(state):
        after = after_state.decide()
        if after.retirable:
            assert before.retirable, f"{what} turned {before.reason} into {after.reason}"
        if decisive and before.retirable:
            assert not after.retirable, f"{what} left {before.reason}"


def _agent_may_speak(state: State) -> bool:
    """An agent Lease for the node that may be live on the incarnation's boot (unknown counts as may)."""
    r = parse_registration(state.obj)
    agent = state.facts.agents.get(r.node_name or "")
    if agent is None or agent.boot_id not in (None, r.incarnation.boot_id):
        return False
    until = lease_expiry(agent.renew_time, agent.lease_duration_seconds)
    return until is None or state.now < until


@given(state=states())
@PROPERTY_SETTINGS
def test_node_evidence_never_applies_while_an_agent_on_the_same_boot_is_live(state: State) -> None:
    decision = state.decide()
    if decision.death_evidence in (Evidence.NODE_DELETED, Evidence.NODE_OUT_OF_SERVICE):
        assert not _agent_may_speak(state), decision.detail


@given(state=states())
@PROPERTY_SETTINGS
def test_a_silent_agent_is_never_said_to_attest(state: State) -> None:
    # Every reason tells the truth: "attests the process is alive" only from a live agent.
    decision = state.decide()
    if decision.reason in (Reason.PID_ALIVE, Reason.PID_REUSE_DETECTED):
        assert _agent_may_speak(state)
        agent = state.facts.agents[parse_registration(state.obj).node_name or ""]
        assert agent.renew_time is not None and agent.lease_duration_seconds is not None


@given(state=states(), fraction=st.floats(0, 1, exclude_max=True))
@PROPERTY_SETTINGS
def test_nothing_changes_before_the_next_evaluation(state: State, fraction: float) -> None:
    decision = state.decide()
    deadlines = [d for d in (decision.next_evaluation_at, decision.agent_expires_at) if d is not None]
    nearest = min(deadlines, default=None)
    if nearest is None:
        later = [state.now + datetime.timedelta(days=30)]
    else:
        assert nearest > state.now
        span = nearest - state.now
        # timedelta * float rounds to the microsecond: keep strictly before the announced instant.
        later = [state.now + min(span * fraction, span - TICK), nearest - TICK]
    for moment in later:
        assert dataclasses.replace(state, now=moment).decide().reason is decision.reason


class TestRemovingOneFactFromAnEligibleBaseline:
    """From each retirable baseline, removing any single fact it needs yields a preserve."""

    ATTESTED_OPTIONAL = {
        "apiVersion", "kind", "metadata.uid", "metadata.resourceVersion", "metadata.generation",
        "metadata.creationTimestamp", "metadata.labels", "metadata.labels.coroner.dev/node", "spec.nodeUID",
        "spec.sessionId", "spec.generationId", "spec.role", "status.attestation.detail",
        "status.attestation.agent.podName", "status.attestation.agent.identity",
        # Heartbeats are the worker's opt-in second witness: without them a pidfd death
        # needs nothing more, and the node path no TTL.
        "spec.heartbeat",
        # The registrant matters only against peers that share a claim (none here).
        "metadata.annotations", "metadata.annotations.coroner.dev/registered-by",
    }  # fmt: skip
    # Without an attestation the heartbeat falls back to birth (older still), and nodeUID is only
    # one of two ways to see a node is gone.
    NODE_PATH_OPTIONAL = ATTESTED_OPTIONAL | {"status", "status.lastHeartbeatTime"}

    @staticmethod
    def _paths(obj: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
        for key, value in obj.items():
            yield (*prefix, key)
            if isinstance(value, dict):
                yield from TestRemovingOneFactFromAnEligibleBaseline._paths(value, (*prefix, key))

    @staticmethod
    def _without(obj: Any, path: tuple[str, ...]) -> Any:
        copy = json.loads(json.dumps(obj))
        node = copy
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]
        return copy

    @pytest.mark.parametrize(
        ("obj", "facts", "policy", "optional"),
        [
            pytest.param(make_registration(), make_facts(), Policy(), "ATTESTED_OPTIONAL", id="pidfd"),
            pytest.param(
                make_registration(attested=False), GONE_FACTS, NODE_DELETION, "NODE_PATH_OPTIONAL", id="node-deleted"
            ),
        ],
    )
    def test_registration_fields(self, obj: Any, facts: Facts, policy: Policy, optional: str) -> None:
        assert decide_raw(obj, facts=facts, policy=policy).retirable
        optional_paths = getattr(self, optional)
        for path in self._paths(obj):
            decision = decide_raw(self._without(obj, path), facts=facts, policy=policy)
            dotted = ".".join(path)
            assert decision.retirable is (dotted in optional_paths), f"without {dotted}: {decision.reason}"

    @pytest.mark.parametrize(
        ("facts", "retirable"),
        [
            pytest.param(make_facts(agent=None), False, id="agent-lease"),
            pytest.param(make_facts(agent=make_agent(boot_id=None)), False, id="agent-boot"),
            pytest.param(make_facts(agent=make_agent(host_id=None)), False, id="agent-host"),
            pytest.param(make_facts(agent=make_agent(renewed_at=None)), False, id="agent-renew-time"),
            pytest.param(make_facts(agent=make_agent(lease_duration_seconds=None)), False, id="agent-duration"),
            pytest.param(make_facts(retire_permission=None), False, id="permission"),
            # The Node is a cross-check where present, never a requirement (design: "where present").
            pytest.param(make_facts(node=None), True, id="node"),
            pytest.param(make_facts(node=make_node(boot_id=None)), True, id="node-boot"),
        ],
    )
    def test_attested_facts(self, facts: Facts, retirable: bool) -> None:
        assert decide_raw(make_registration(), facts=facts).retirable is retirable

    @pytest.mark.parametrize(
        ("facts", "policy"),
        [
            pytest.param(make_facts(agent=None, node=None), NODE_DELETION, id="node"),
            pytest.param(
                make_facts(agent=None, node=dataclasses.replace(GONE, exists=None)), NODE_DELETION, id="exists"
            ),
            pytest.param(
                make_facts(agent=None, node=dataclasses.replace(GONE, missing_since=None)),
                NODE_DELETION,
                id="missing-since",
            ),
            pytest.param(GONE_FACTS, Policy(), id="policy"),
            pytest.param(dataclasses.replace(GONE_FACTS, retire_permission=None), NODE_DELETION, id="permission"),
        ],
    )
    def test_node_path_facts(self, facts: Facts, policy: Policy) -> None:
        assert not decide_raw(make_registration(attested=False), facts=facts, policy=policy).retirable


# --- totality -------------------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=16),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=10), children, max_size=3),
    max_leaves=25,
)


@st.composite
def garbled_registrations(draw: st.DrawFn) -> Any:
    obj = make_registration(attested=draw(st.booleans()))
    for path in draw(st.lists(st.sampled_from(sorted(VARIANTS)), max_size=4, unique=True)):
        set_path(obj, path, draw(JSON))
    return obj


@given(
    obj=st.one_of(JSON, garbled_registrations()),
    peers=st.lists(st.one_of(JSON, garbled_registrations()), max_size=2),
    facts=st.builds(
        Facts,
        agents=st.dictionaries(st.sampled_from([NODE, "x"]), AGENTS.filter(lambda a: a is not None), max_size=1),
        nodes=st.dictionaries(st.sampled_from([NODE, "x"]), NODES.filter(lambda n: n is not None), max_size=1),
        protecting_leases=LEASES,
        retire_permission=st.sampled_from([True, False, None]),
    ),
    policy=POLICIES,
    offset=OFFSETS,
)
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_decide_never_raises(
    obj: object, peers: list[object], facts: Facts, policy: Policy, offset: datetime.timedelta
) -> None:
    facts = dataclasses.replace(facts, peers=tuple(parse_registration(peer) for peer in peers))
    decision = decide(registration=parse_registration(obj), facts=facts, policy=policy, now=NOW + offset)
    assert isinstance(decision.reason, Reason)
    assert decision.detail
    json.dumps(decision.evidence, allow_nan=False)


@pytest.mark.parametrize(
    "facts",
    [
        pytest.param(make_facts(agent=make_agent(lease_duration_seconds=float("nan"))), id="nan-duration"),
        pytest.param(make_facts(agent=make_agent(lease_duration_seconds=float("inf"))), id="infinite-duration"),
        pytest.param(
            make_facts(agent=make_agent(renewed_at=datetime.datetime.max.replace(tzinfo=datetime.UTC))),
            id="renewed-at-max",
        ),
        pytest.param(make_facts(leases=[make_lease(lease_duration_seconds=1e300)]), id="huge-lease"),
        pytest.param(
            make_facts(node=NodeFacts(exists=False, missing_since=datetime.datetime.max.replace(tzinfo=datetime.UTC))),
            id="missing-since-max",
        ),
    ],
)
def test_extreme_facts_never_raise(facts: Facts) -> None:
    for attested in (True, False):
        decision = decide_raw(make_registration(attested=attested), facts=facts, policy=NODE_DELETION)
        json.dumps(decision.evidence, allow_nan=False)


def test_heartbeat_at_the_end_of_time_never_raises() -> None:
    end = "9999-12-31T23:59:59.999999Z"
    attested = make_registration(heartbeat_at=end, ttl_seconds=604800)
    assert decide_raw(attested).reason is Reason.HEARTBEAT_NOT_EXPIRED
    unattested = make_registration(attested=False, heartbeat_at=end)
    assert decide_raw(unattested, facts=GONE_FACTS, policy=NODE_DELETION).reason is Reason.HEARTBEAT_NOT_EXPIRED


def test_policy_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        Policy(absence_confirm_seconds=float("nan"))
    with pytest.raises(ValueError):
        Policy(proc_absent_window_intervals=-1)


def test_heartbeat_fields_are_required_for_the_window() -> None:
    # A baseline with no attestation-era constants left implicit: the window is 2 x interval.
    decision = decide_raw(make_registration(evidence="ProcAbsent", interval_seconds=3, heartbeat_at=NOW - 6 * S))
    assert decision.retirable
    assert decide_raw(
        make_registration(evidence="ProcAbsent", interval_seconds=3, heartbeat_at=NOW - 6 * S + TICK)
    ).reason is (Reason.HEARTBEAT_NOT_EXPIRED)
