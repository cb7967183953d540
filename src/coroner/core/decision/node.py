"""Node-level evidence (NodeDeleted, NodeOutOfService) and what an unavailable agent's registration
is waiting for: read only where the node's own agent cannot speak."""

from __future__ import annotations

import datetime

from coroner.core import api
from coroner.core.decision.facts import AgentFacts, NodeFacts, Policy, after, aware, lease_expiry
from coroner.core.decision.known import Known
from coroner.core.decision.trail import Trail, stamp
from coroner.core.model import Registration
from coroner.core.reasons import Evidence


def node_death_evidence(
    trail: Trail,
    *,
    known: Known,
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
        quarantine_end = after(
            aware(node.missing_since), datetime.timedelta(seconds=policy.node_deletion_quarantine_seconds)
        )
        if quarantine_end is not None and now >= quarantine_end:
            return Evidence.NODE_DELETED
        trail.changes_at(quarantine_end)
        return None
    if _replaced(known=known, registration=registration, node=node):
        return Evidence.NODE_DELETED
    return None


def _replaced(*, known: Known, registration: Registration, node: NodeFacts) -> bool:
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


def vanished(*, known: Known, registration: Registration, node: NodeFacts | None) -> bool:
    """The Node is gone, replaced, or declared out of service by a human."""
    return node is not None and (
        node.exists is False or node.out_of_service or _replaced(known=known, registration=registration, node=node)
    )


def agent_lease(node_name: str) -> str:
    return f"{api.AGENT_LEASE_PREFIX}{node_name}"


def agent_silence(agent: AgentFacts | None, *, node_name: str, now: datetime.datetime) -> str | None:
    """Why the node's agent cannot speak now (its Lease is missing, expired or unreadable), or None."""
    if agent is None:
        return f"no agent Lease {agent_lease(node_name)} was seen"
    until = lease_expiry(agent.renew_time, agent.lease_duration_seconds)
    if until is None:
        return f"the agent Lease {agent_lease(node_name)} does not say when it expires"
    if now >= until:
        return f"the agent Lease {agent_lease(node_name)} expired at {stamp(until)}"
    return None


def what_releases(*, known: Known, registration: Registration, node: NodeFacts | None, policy: Policy) -> str:
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
    if node is not None and vanished(known=known, registration=registration, node=node):
        gone = "is gone" if node.exists is False else "was replaced by a Node with another UID"
        if not policy.node_deletion_evidence:
            # A deleted Node cannot be tainted; a replacement Node of the same name can.
            taint = "" if node.exists is False else f"the {api.OUT_OF_SERVICE_TAINT} taint, "
            return (
                f"node {name} {gone}: the node-loss component (--node-deletion-evidence), {taint}{human}, releases it."
            )
        if node.missing_since is not None:
            end = after(aware(node.missing_since), datetime.timedelta(seconds=policy.node_deletion_quarantine_seconds))
            return f"node {name} {gone}; NodeDeleted applies when its quarantine ends at {stamp(end or node.missing_since)}."
        return f"node {name} {gone}; NodeDeleted applies once a live GET confirms it after the quarantine."
    return (
        f"it is decided once the agent renews its Lease and attests again (if node {name} is gone for "
        f"good: the node-loss component, the {api.OUT_OF_SERVICE_TAINT} taint, {human})."
    )
