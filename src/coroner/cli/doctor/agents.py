"""Doctor's agents check: every node that needs an agent has a live one, on the Node's boot."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any, Final

from coroner.cli.doctor.outcome import Check, condition_status, failed, object_name, passed, unknown
from coroner.cli.plan import Unreadable, names_text
from coroner.core import api, model
from coroner.core.decision import AgentFacts, lease_expiry
from coroner.core.fingerprint import Plan
from coroner.core.world import agent_facts_from_lease, node_facts

#: How many object names a table line shows before "and N more" (JSON always has them all).
_SHOWN_NAMES: Final = 10


def check_agents(
    *,
    nodes: Sequence[Mapping[str, Any]] | Unreadable,
    leases: Sequence[Mapping[str, Any]] | Unreadable,
    system_namespace: str,
    now: datetime.datetime,
    plan: Plan | Unreadable | None = None,
) -> Check:
    """Every Ready node the agent DaemonSet runs on (all but control-plane nodes), and every node with
    active registrations (whether or not its Node still exists), has a live agent Lease whose boot id
    is the Node's (where the Node publishes one). The line names the nodes checked, and every other
    Node with why it needs no agent (control-plane, not Ready).

    `plan` gives the registrations; Unreadable (or None) means the nodes holding registrations are
    unknown, so a clean result for the Ready nodes alone is UNKNOWN, not PASS.
    """
    name = "agents"
    if isinstance(nodes, Unreadable):
        return unknown(name, f"Nodes could not be listed: {nodes.reason}")
    if isinstance(leases, Unreadable):
        return unknown(name, f"agent Leases could not be listed: {leases.reason}")
    agents = _agent_leases(leases, system_namespace=system_namespace)
    by_name = {object_name(node): node for node in nodes}
    # Why a Node needs no agent of the DaemonSet's: not Ready, or kept off it by the affinity.
    left_out = {node_name: _left_out(node) for node_name, node in by_name.items()}
    ready = sorted(node_name for node_name, why in left_out.items() if not why)
    holding: dict[str, int] = {}
    if isinstance(plan, Plan):
        for entry in plan.entries:
            if not entry.registration.terminal and entry.registration.node_name:
                holding[entry.registration.node_name] = holding.get(entry.registration.node_name, 0) + 1
    checked = sorted(set(ready) | set(holding))
    excluded = {
        node_name: "; ".join(why) for node_name, why in sorted(left_out.items()) if why and node_name not in holding
    }
    problems: dict[str, str] = {}
    for node_name in checked:
        agent = agents.get(node_name)
        lease_ref = f"Lease {system_namespace}/{api.AGENT_LEASE_PREFIX}{node_name}"
        node = by_name.get(node_name)
        where = (
            ""
            if node_name not in holding
            else f" ({holding[node_name]} active registration(s)" + (", no Node object)" if node is None else ")")
        )
        if agent is None:
            problems[node_name] = f"no agent ({lease_ref} not found){where}"
            continue
        until = lease_expiry(agent.renew_time, agent.lease_duration_seconds)
        if until is None or now >= until:
            state = "has no computable expiry" if until is None else f"expired at {model.format_time(until)}"
            problems[node_name] = f"agent not live ({lease_ref} {state}){where}"
            continue
        node_boot = None if node is None else node_facts(node).boot_id
        if agent.boot_id is None:
            problems[node_name] = f"agent publishes no boot id ({lease_ref}){where}"
        elif node_boot is not None and node_boot != agent.boot_id:
            problems[node_name] = f"agent boot id {agent.boot_id} differs from the Node's bootID {node_boot}{where}"
    facts: dict[str, Any] = {
        "readyNodes": ready,
        "nodesWithRegistrations": dict(sorted(holding.items())),
        "expectedNodes": checked,
        "notExpected": excluded,
        "problems": problems,
    }
    which = (
        f"Ready and run by the agent DaemonSet: {names_text(ready) or 'none'}; "
        f"holding active registrations: {names_text(sorted(holding)) or 'none'}"
    )
    left = (
        f"; no agent expected on {names_text([f'{node} ({why})' for node, why in excluded.items()])}"
        if excluded
        else ""
    )
    if problems:
        described = "; ".join(f"{node}: {problem}" for node, problem in sorted(problems.items())[:_SHOWN_NAMES])
        more = len(problems) - _SHOWN_NAMES
        return failed(
            name,
            f"{len(problems)} of the {len(checked)} node(s) that need an agent ({which}) lack a healthy agent: "
            f"{described}{f'; and {more} more' if more > 0 else ''}{left}. Check the coroner-agent DaemonSet "
            f"pods on them (and, for a node that is gone, the node-loss check).",
            objects=tuple(f"node/{node}" for node in sorted(problems)),
            facts=facts,
        )
    if not isinstance(plan, Plan):
        why = plan.reason if isinstance(plan, Unreadable) else "not read"
        return unknown(
            name,
            f"the {len(ready)} Ready node(s) the agent DaemonSet runs on ({names_text(ready) or 'none'}) have a "
            f"live agent on the Node's boot, but the nodes holding registrations are unknown (registrations: "
            f"{why}){left}.",
            facts=facts,
        )
    return passed(
        name,
        f"each of the {len(checked)} node(s) that need an agent ({which}) has a live agent on the Node's boot{left}.",
        facts=facts,
    )


def _left_out(node: Mapping[str, Any]) -> list[str]:
    """Why the agent DaemonSet runs no agent on `node` (none: it should): the shipped DaemonSet's node
    affinity avoids control-plane nodes, and a node that is not Ready runs nothing new."""
    why = []
    if api.CONTROL_PLANE_LABEL in ((node.get("metadata") or {}).get("labels") or {}):
        why.append(f"control-plane: the agent DaemonSet's node affinity avoids {api.CONTROL_PLANE_LABEL}")
    if condition_status(node.get("status"), "Ready") != "True":
        why.append("not Ready")
    return why


def _agent_leases(leases: Sequence[Mapping[str, Any]], *, system_namespace: str) -> dict[str, AgentFacts]:
    agents = {}
    for lease in leases:
        meta = lease.get("metadata") or {}
        lease_name = str(meta.get("name") or "")
        if meta.get("namespace") == system_namespace and lease_name.startswith(api.AGENT_LEASE_PREFIX):
            agents[lease_name[len(api.AGENT_LEASE_PREFIX) :]] = agent_facts_from_lease(lease)
    return agents
