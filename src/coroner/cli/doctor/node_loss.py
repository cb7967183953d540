"""Doctor's node-loss check: registrations stranded on a lost node, since when, and what releases them.

Each release is decided by `decide` itself on the facts as they would be, so doctor never promises
what the decision would not do.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from typing import Any, Final

from coroner.cli.doctor.outcome import Check, duration, failed, kubectl_name, passed, stamp, unknown
from coroner.cli.plan import PolicyChoice, Unreadable, display
from coroner.core import api, model
from coroner.core.decision import Decision, NodeFacts, Policy, decide, lease_expiry
from coroner.core.fingerprint import Plan
from coroner.core.model import Key
from coroner.core.reasons import Evidence, Reason
from coroner.core.world import World

#: The taint a person sets on a Node that is shut down for good (KEP-2268); the operator accepts it
#: as death evidence where its policy says nodeOutOfServiceEvidence=true (components/node-loss).
OUT_OF_SERVICE_TAINT_COMMAND: Final = (
    "kubectl taint node {node} node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"
)
#: The kustomize component that turns on --node-deletion-evidence for the operator.
NODE_LOSS_COMPONENT: Final = "manifests/components/node-loss"


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Lost:
    """One node whose active registrations no live agent can speak for any more."""

    node: str
    keys: tuple[Key, ...]
    node_state: str
    """``deleted`` (no Node object), ``replaced`` (another UID), ``present``."""
    agent_state: str
    """``missing``, ``expired``, ``no-expiry``, ``another-boot``."""
    agent_expired: datetime.datetime | None


def check_node_loss(
    *,
    world: World | Unreadable,
    plan: Plan | Unreadable,
    policy: PolicyChoice,
    system_namespace: str,
    now: datetime.datetime,
) -> Check:
    """Active registrations stranded by a lost node: their Node is gone (no Node object, or one with
    another UID than their spec.nodeUID) or their agent Lease is missing or expired.

    Nothing but node-level evidence or a person can ever decide them. For each node this says
    since when (the agent Lease's expiry), what the decision says now, and what would release
    them — each release computed by `decide` itself on the facts as they would be (the Node gone
    past the quarantine, the out-of-service taint, a human's retire), so it never promises what
    the decision would not do. `world` is the complete LIST of Nodes and Leases and the
    registrations; `plan` its decisions with `policy`.
    """
    name = "node-loss"
    if isinstance(world, Unreadable) or isinstance(plan, Unreadable):
        missing = world if isinstance(world, Unreadable) else plan
        assert isinstance(missing, Unreadable)
        return unknown(name, f"could not be decided: {missing.reason}")
    decisions = {model.key_of(entry.registration): entry.decision for entry in plan.entries}
    lost = _lost_nodes(world, now=now)
    if not lost:
        active = sum(1 for r in world.parsed.values() if not r.terminal)
        return passed(
            name,
            f"no active registration is on a lost node or a node without a live agent ({active} active).",
            facts={"count": 0, "nodes": {}},
        )
    operator = policy.published
    described: list[str] = []
    per_node: dict[str, Any] = {}
    objects: list[str] = []
    names: list[str] = []
    for item in lost:
        reasons: dict[str, int] = {}
        for key in item.keys:
            decision = decisions.get(key)
            reason = decision.reason.value if decision is not None else "?"
            reasons[reason] = reasons.get(reason, 0) + 1
        beats = [world.parsed[key].last_heartbeat_time for key in item.keys]
        last_beat = max((beat for beat in beats if beat is not None), default=None)
        releases = _releases(world, item, policy=policy, operator=operator, now=now)
        state = {
            "deleted": f"Node {item.node} is deleted (no Node object)",
            "replaced": f"Node {item.node} was replaced (its UID is not the registrations' spec.nodeUID)",
            "present": f"Node {item.node} exists",
        }[item.node_state]
        lease_ref = f"Lease {system_namespace}/{api.AGENT_LEASE_PREFIX}{item.node}"
        agent = {
            "missing": f"its agent {lease_ref} does not exist (since an unknown time)",
            "expired": f"its agent {lease_ref} expired at {stamp(item.agent_expired)} "
            f"({duration(now - item.agent_expired) if item.agent_expired else '?'} ago)",
            "no-expiry": f"its agent {lease_ref} has no computable expiry",
            "another-boot": f"its agent {lease_ref} is live on another boot, which cannot speak for them",
        }[item.agent_state]
        heard = f"; last heartbeat {stamp(last_beat)}" if last_beat is not None else ""
        now_says = ", ".join(f"{reason} {count}" for reason, count in sorted(reasons.items()))
        described.append(
            f"{item.node}: {len(item.keys)} registration(s); {state}; {agent}{heard}; decided now: {now_says}. "
            f"Released by: {' Or '.join(releases['sentences'])}"
        )
        named = [display(key) for key in item.keys]
        objects.append(f"node/{item.node}")
        objects.extend(f"workerregistration/{n}" for n in named)
        names.append(kubectl_name("Node", item.node))
        names.extend(kubectl_name(api.KIND, key[1]) for key in item.keys)
        per_node[item.node] = {
            "count": len(item.keys),
            "registrations": named,
            "node": item.node_state,
            "agentLease": item.agent_state,
            "agentLeaseExpired": stamp(item.agent_expired),
            "lostSeconds": None if item.agent_expired is None else (now - item.agent_expired).total_seconds(),
            "lastHeartbeat": stamp(last_beat),
            "reasons": reasons,
            "release": releases["counts"],
            "fixes": releases["sentences"],
        }
    total = sum(len(item.keys) for item in lost)
    return failed(
        name,
        f"{total} active registration(s) on {len(lost)} lost node(s) or node(s) without a live agent, "
        f"which no agent will ever attest: {' | '.join(described)}",
        objects=tuple(objects),
        names=names,
        facts={"count": total, "nodes": per_node},
    )


def _lost_nodes(world: World, *, now: datetime.datetime) -> list[_Lost]:
    """The stranded registrations of `world`, by node (a complete Node LIST: absent means deleted)."""
    found: dict[tuple[str, str, str], list[Key]] = {}
    expiries: dict[str, datetime.datetime | None] = {}
    for key, registration in sorted(world.parsed.items()):
        node_name = registration.node_name
        if registration.terminal or not node_name:
            continue
        node = world.nodes.get(node_name)
        if node is None:
            node_state = "deleted"
        elif node.uid is not None and registration.node_uid is not None and node.uid != registration.node_uid:
            node_state = "replaced"
        else:
            node_state = "present"
        agent = world.agents.get(node_name)
        until = None if agent is None else lease_expiry(agent.renew_time, agent.lease_duration_seconds)
        if agent is None:
            agent_state = "missing"
        elif until is None:
            agent_state = "no-expiry"
        elif now >= until:
            agent_state = "expired"
        elif node_state != "present" and agent.boot_id != registration.incarnation.boot_id:
            # A live agent on another boot of a Node that is gone or replaced: another machine.
            agent_state = "another-boot"
        else:
            continue  # a live agent can attest them: not stranded (other checks say what else is wrong)
        expiries[node_name] = until
        found.setdefault((node_name, node_state, agent_state), []).append(key)
    lost: dict[str, _Lost] = {}
    for (node_name, node_state, agent_state), keys in sorted(found.items()):
        if node_name in lost:  # one node, registrations in several states: the first state names it
            previous = lost[node_name]
            lost[node_name] = dataclasses.replace(previous, keys=(*previous.keys, *keys))
            continue
        lost[node_name] = _Lost(
            node=node_name,
            keys=tuple(keys),
            node_state=node_state,
            agent_state=agent_state,
            agent_expired=expiries[node_name] if agent_state == "expired" else None,
        )
    return list(lost.values())


def _releases(
    world: World, item: _Lost, *, policy: PolicyChoice, operator: Policy | None, now: datetime.datetime
) -> dict[str, Any]:
    """What would release `item`'s registrations: each option decided by `decide` on the facts as
    they would be, with the operator's policy (or, where it could not be read, the policy used)."""
    base = operator if operator is not None else policy.policy
    n = len(item.keys)
    sentences: list[str] = []
    counts: dict[str, int | None] = {"nodeDeletion": None, "outOfServiceTaint": None, "applyNow": None}
    if item.node_state != "present":
        quarantine = base.node_deletion_quarantine_seconds
        gone = (
            NodeFacts(exists=False, missing_since=now - datetime.timedelta(seconds=quarantine + 1))
            if item.node_state == "deleted"
            else world.nodes[item.node]
        )
        deleted_policy = dataclasses.replace(base, node_deletion_evidence=True)
        proven = _proven(world, item.keys, node=gone, policy=deleted_policy, now=now, evidence=Evidence.NODE_DELETED)
        counts["nodeDeletion"] = proven
        if operator is not None and operator.node_deletion_evidence:
            when = (
                f"its {quarantine:g}s quarantine ends {quarantine:g}s after it saw Node {item.node} gone (by "
                f"{stamp(now + datetime.timedelta(seconds=quarantine))} at the latest, if it is running now)"
                if item.node_state == "deleted"
                else "a replaced Node counts at once"
            )
            sentences.append(
                f"the operator runs with node-deletion evidence: {when}, and then it counts {proven} of {n} dead "
                f"(NodeDeleted)."
            )
        else:
            caveat = "" if operator is not None else "if the operator runs without --node-deletion-evidence (its "
            caveat += "" if operator is not None else "policy could not be read), "
            sentences.append(
                f"{caveat}add the {NODE_LOSS_COMPONENT} component to the operator's overlay (--node-deletion-"
                f"evidence): once Node {item.node} has been gone for the quarantine ({quarantine:g}s) it counts "
                f"{proven} of {n} dead (NodeDeleted)."
            )
    else:
        tainted = dataclasses.replace(world.nodes[item.node], out_of_service=True)
        proven = _proven(world, item.keys, node=tainted, policy=base, now=now, evidence=Evidence.NODE_OUT_OF_SERVICE)
        counts["outOfServiceTaint"] = proven
        command = OUT_OF_SERVICE_TAINT_COMMAND.format(node=item.node)
        if not base.node_out_of_service_evidence:
            sentences.append(
                f"restarting the agent on {item.node} (the coroner-agent DaemonSet pod); the out-of-service taint "
                f"does not help: the operator's policy has nodeOutOfServiceEvidence=false (the {NODE_LOSS_COMPONENT} "
                f"component turns it on)."
            )
        else:
            sentences.append(
                f"restarting the agent on {item.node} (the coroner-agent DaemonSet pod) if the node runs; if it is "
                f"shut down for good, `{command}` makes the operator count {proven} of {n} dead (NodeOutOfService)."
            )
    retirable = sum(1 for key in item.keys if _decide(world, key, policy=policy.policy, now=now).retirable)
    counts["applyNow"] = retirable
    stated = ""
    if item.node_state == "deleted":
        # The CLI counts the quarantine from its own live GET of the Node: 0 is the human's statement.
        stated = " --node-deletion-evidence --node-quarantine-seconds=0"
    sentences.append(
        f"a human holding {api.RETIRE_VERB}: `kubectl coroner plan{stated}` then `kubectl coroner apply{stated}` "
        f"retires the rows the plan shows {Reason.ELIGIBLE_STALE_ORPHAN} ({retirable} of {n} now)."
    )
    return {"sentences": sentences, "counts": counts}


def _proven(
    world: World, keys: Sequence[Key], *, node: NodeFacts, policy: Policy, now: datetime.datetime, evidence: Evidence
) -> int:
    return sum(1 for key in keys if _decide(world, key, policy=policy, now=now, node=node).death_evidence == evidence)


def _decide(
    world: World, key: Key, *, policy: Policy, now: datetime.datetime, node: NodeFacts | None = None
) -> Decision:
    """`key` decided as someone holding retire would, with `node` standing in for its Node."""
    facts = dataclasses.replace(world.facts_for(key, now=now, node=node), retire_permission=True)
    return decide(registration=world.parsed[key], facts=facts, policy=policy, now=now)
