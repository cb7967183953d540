"""``kubectl coroner doctor`` without the I/O: one pure function per check.

Each check reads raw objects as the API returned them (or `Unreadable` where a read failed) and
the instant `now`, and says PASS, FAIL or UNKNOWN in one line that names the failing objects and
the fix. UNKNOWN is a fact that could not be read; it is never shown as zero, and never as a pass.
Registrations are decided exactly as `coroner.cli.plan` decides them, with the policy the operator
publishes. The I/O shell is `coroner.cli.kubectl`.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from coroner.cli.plan import OPERATOR_LEASE, PolicyChoice, Unreadable, display
from coroner.cli.plan import names_text as _names
from coroner.core import admission_digest, api, model
from coroner.core.decision import AgentFacts, Decision, NodeFacts, Policy, decide, lease_expiry
from coroner.core.fingerprint import Plan, PlanEntry
from coroner.core.model import Key
from coroner.core.reasons import Evidence, Reason
from coroner.core.world import World, agent_facts_from_lease, lease_facts, node_facts

__all__ = ["OPERATOR_LEASE", "Unreadable"]

#: Annotation on the operator's Lease holding the last sweep's outcome as JSON.
LAST_SWEEP_ANNOTATION: Final = api.LAST_SWEEP_ANNOTATION
#: The ServiceAccount the manifests run the operator as.
OPERATOR_SERVICE_ACCOUNT: Final = "coroner-operator"
#: The ValidatingAdmissionPolicies of manifests/base/admission-policies.yaml, each bound by a
#: binding of the same name; doctor names the missing ones.
ADMISSION_POLICIES: Final = (
    "coroner-node-label-matches-spec",
    "coroner-retire-requires-capability",
    "coroner-agent-attests-own-node-only",
    "coroner-status-fields-by-identity",
    "coroner-agent-renews-own-lease-only",
    "coroner-retire-requires-evidence",
    "coroner-registrant-recorded",
    "coroner-delete-only-terminal",
    "coroner-system-leases-by-owner",
)

#: The taint a person sets on a Node that is shut down for good (KEP-2268); the operator accepts it
#: as death evidence where its policy says nodeOutOfServiceEvidence=true (components/node-loss).
OUT_OF_SERVICE_TAINT_COMMAND: Final = (
    "kubectl taint node {node} node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"
)
#: The kustomize component that turns on --node-deletion-evidence for the operator.
NODE_LOSS_COMPONENT: Final = "manifests/components/node-loss"
#: How many object names a table line shows before "and N more" (JSON always has them all).
_SHOWN_NAMES: Final = 10


def operator_username(system_namespace: str = api.SYSTEM_NAMESPACE) -> str:
    """The operator's user name as the API server authenticates its ServiceAccount."""
    return f"system:serviceaccount:{system_namespace}:{OPERATOR_SERVICE_ACCOUNT}"


class CheckStatus(enum.StrEnum):
    """A doctor check's outcome; UNKNOWN is a fact that could not be read, never a pass."""

    PASS = "PASS"
    FAIL = "FAIL"
    UNKNOWN = "UNKNOWN"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Check:
    """One doctor check: its status, one line for a person, the objects it names, its facts."""

    name: str
    status: CheckStatus
    summary: str
    objects: tuple[str, ...] = ()
    facts: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def passed(name: str, summary: str, *, facts: Mapping[str, Any] | None = None) -> Check:
    """A PASS line."""
    return Check(name=name, status=CheckStatus.PASS, summary=summary, facts=facts or {})


def failed(name: str, summary: str, *, objects: Sequence[str] = (), facts: Mapping[str, Any] | None = None) -> Check:
    """A FAIL line naming the failing `objects`."""
    return Check(name=name, status=CheckStatus.FAIL, summary=summary, objects=tuple(objects), facts=facts or {})


def unknown(name: str, summary: str, *, objects: Sequence[str] = (), facts: Mapping[str, Any] | None = None) -> Check:
    """An UNKNOWN line: a fact that could not be read (never a pass, never zero)."""
    return Check(name=name, status=CheckStatus.UNKNOWN, summary=summary, objects=tuple(objects), facts=facts or {})


def check_crd(crd: Mapping[str, Any] | Unreadable | None) -> Check:
    """The WorkerRegistration CRD exists, is Established and serves our version."""
    name = "crd"
    subject = f"CustomResourceDefinition/{api.CRD_NAME}"
    if isinstance(crd, Unreadable):
        return unknown(name, f"{subject} could not be read: {crd.reason}")
    if crd is None:
        return failed(
            name,
            f"{subject} is not installed; install it with `kubectl apply -k manifests/overlays/plan-only`.",
            objects=(subject,),
        )
    established = _condition_status(crd.get("status"), "Established")
    served = [
        version.get("name")
        for version in (crd.get("spec") or {}).get("versions") or []
        if isinstance(version, Mapping) and version.get("served")
    ]
    if established != "True":
        return failed(
            name,
            f"{subject} is not Established (status {established or 'absent'}); see `kubectl describe crd {api.CRD_NAME}`.",
            objects=(subject,),
            facts={"established": established, "servedVersions": served},
        )
    if api.VERSION not in served:
        return failed(
            name,
            f"{subject} does not serve {api.VERSION} (serves {', '.join(map(str, served)) or 'nothing'}); re-apply the manifests.",
            objects=(subject,),
            facts={"established": established, "servedVersions": served},
        )
    return passed(
        name,
        f"{subject} is Established and serves {api.VERSION}.",
        facts={"established": established, "servedVersions": served},
    )


def check_admission_policies(
    *,
    policies: Sequence[Mapping[str, Any]] | Unreadable,
    bindings: Sequence[Mapping[str, Any]] | Unreadable,
) -> Check:
    """The ValidatingAdmissionPolicies exist, each bound with validationActions Deny."""
    name = "admission-policies"
    for listed in (policies, bindings):
        if isinstance(listed, Unreadable):
            return unknown(name, f"admission policies could not be read: {listed.reason}")
    assert not isinstance(policies, Unreadable) and not isinstance(bindings, Unreadable)
    present = {_name(policy) for policy in policies}
    bound: dict[str, list[str]] = {}
    for binding in bindings:
        spec = binding.get("spec") or {}
        actions = spec.get("validationActions") or []
        if "Deny" in actions:
            bound.setdefault(str(spec.get("policyName") or ""), []).append(_name(binding))
    missing = [f"ValidatingAdmissionPolicy/{policy}" for policy in ADMISSION_POLICIES if policy not in present]
    missing += [f"ValidatingAdmissionPolicyBinding/{policy}" for policy in ADMISSION_POLICIES if policy not in bound]
    facts = {"policies": sorted(p for p in present if p in ADMISSION_POLICIES), "boundPolicies": sorted(bound)}
    if missing:
        return failed(
            name,
            f"missing (or not bound with Deny): {_names(missing)}; re-apply the manifests "
            f"(`kubectl apply -k manifests/overlays/plan-only`).",
            objects=tuple(missing),
            facts=facts,
        )
    return passed(name, f"all {len(ADMISSION_POLICIES)} policies present and bound with Deny.", facts=facts)


def check_admission_content(
    *,
    policies: Sequence[Mapping[str, Any]] | Unreadable,
    bindings: Sequence[Mapping[str, Any]] | Unreadable,
    system_namespace: str = api.SYSTEM_NAMESPACE,
) -> Check:
    """Each ValidatingAdmissionPolicy and binding has the content the manifests ship (a digest of
    expressions, failurePolicy, match rules, actions and binding scope; coroner.core.admission_digest):
    a policy narrowed or a binding that only warns or misses namespaces is as good as missing."""
    name = "admission-content"
    for listed in (policies, bindings):
        if isinstance(listed, Unreadable):
            return unknown(name, f"admission policies could not be read: {listed.reason}")
    assert not isinstance(policies, Unreadable) and not isinstance(bindings, Unreadable)
    validating = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    expected = {k: v for k, v in admission_digest.EXPECTED.items() if k[0] in validating}
    documents = [{"kind": "ValidatingAdmissionPolicy", **p} for p in policies]
    documents += [{"kind": "ValidatingAdmissionPolicyBinding", **b} for b in bindings]
    comparison = admission_digest.compare(documents, expected=expected, system_namespace=system_namespace)
    node_evidence = "admitted" if comparison.node_loss else "refused"
    facts = {"compared": len(expected), "operatorNodeEvidence": node_evidence}
    if not comparison.intact:
        shown = [f"{kind}/{policy}" for kind, policy in sorted((*comparison.missing, *comparison.differing))]
        return failed(
            name,
            f"not as the manifests ship them: {_names(comparison.names())}; re-apply the manifests "
            f"(`kubectl apply -k` your overlay) and find out who changed them.",
            objects=tuple(shown),
            facts=facts,
        )
    return passed(
        name,
        f"all {len(expected)} policies and bindings have the manifests' content (the operator's node "
        f"evidence is {node_evidence}).",
        facts=facts,
    )


def check_operator_alive(
    *, lease: Mapping[str, Any] | Unreadable | None, system_namespace: str, now: datetime.datetime
) -> Check:
    """The operator's Lease was renewed within its own duration."""
    name = "operator-alive"
    subject = f"Lease {system_namespace}/{OPERATOR_LEASE}"
    if isinstance(lease, Unreadable):
        return unknown(name, f"{subject} could not be read: {lease.reason}")
    if lease is None:
        return failed(
            name,
            f"{subject} does not exist: the operator has never completed a sweep here; check "
            f"`kubectl -n {system_namespace} get deploy coroner-operator` and its logs.",
            objects=(subject,),
        )
    facts = lease_facts(lease)
    until = lease_expiry(facts.renew_time, facts.lease_duration_seconds)
    renewed = "never" if facts.renew_time is None else model.format_time(facts.renew_time)
    recorded = {"holderIdentity": facts.holder_identity, "renewTime": renewed, "expires": _stamp(until)}
    if until is None or now >= until:
        return failed(
            name,
            f"{subject} (holder {facts.holder_identity or '?'}) was last renewed {renewed} and has "
            f"{'no computable expiry' if until is None else 'expired at ' + model.format_time(until)}: the "
            f"operator is not running or not completing sweeps; check its pod and logs.",
            objects=(subject,),
            facts=recorded,
        )
    return passed(
        name,
        f"{subject} held by {facts.holder_identity or '?'}, renewed {renewed}, valid until {model.format_time(until)}.",
        facts=recorded,
    )


def check_last_sweep(*, lease: Mapping[str, Any] | Unreadable | None, system_namespace: str) -> Check:
    """The outcome of the operator's last sweep, per namespace, as it recorded it."""
    name = "last-sweep"
    subject = f"Lease {system_namespace}/{OPERATOR_LEASE}"
    if isinstance(lease, Unreadable):
        return unknown(name, f"{subject} could not be read: {lease.reason}")
    annotations = ((lease or {}).get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(LAST_SWEEP_ANNOTATION)
    if raw is None:
        return unknown(
            name,
            f"the last sweep's outcome was never recorded ({subject} has no {LAST_SWEEP_ANNOTATION} "
            f"annotation): unknown, not zero.",
        )
    try:
        sweep = json.loads(raw)
    except ValueError:
        sweep = None
    if not isinstance(sweep, Mapping) or not isinstance(sweep.get("failures"), Mapping):
        return unknown(name, f"the {LAST_SWEEP_ANNOTATION} annotation on {subject} is not a sweep record.")
    failures = {str(ns): count for ns, count in sweep["failures"].items() if _positive(count)}
    recorded_errors = sweep.get("errors")
    errors: Mapping[str, Any] = recorded_errors if isinstance(recorded_errors, Mapping) else {}
    facts = {
        "time": sweep.get("time"),
        "registrations": sweep.get("registrations"),
        "namespaces": sweep.get("namespaces"),
        "failures": failures,
        "errors": dict(errors),
        "byReason": sweep.get("byReason"),
    }
    at = sweep.get("time") or "an unrecorded time"
    if failures:
        named = [
            f"{namespace}: {failures[namespace]} failed ({errors.get(namespace, 'no error recorded')})"
            for namespace in sorted(failures)
        ]
        return failed(
            name,
            f"the last sweep at {at} failed in namespace(s) {'; '.join(named)}.",
            objects=tuple(f"namespace/{namespace}" for namespace in sorted(failures)),
            facts=facts,
        )
    counted = sweep.get("registrations")
    of = f"{counted} registrations" if isinstance(counted, int) else "an unrecorded number of registrations"
    return passed(name, f"the last sweep at {at} decided {of} with no failures.", facts=facts)


def check_retire_grant(
    *,
    cluster_wide: bool | None,
    per_namespace: Mapping[str, bool | None],
    expect_plan_only: bool,
    system_namespace: str,
    unknown_reason: str = "",
) -> Check:
    """Whether the operator holds ``retire`` (SubjectAccessReview), against what was expected.

    `cluster_wide` answers for every namespace; `per_namespace` for those holding registrations
    (a grant may be a RoleBinding). None means the review could not be made.
    """
    name = "retire-grant"
    user = operator_username(system_namespace)
    if cluster_wide is None:
        return unknown(
            name,
            f"could not review whether {user} holds retire{': ' + unknown_reason if unknown_reason else ''} "
            f"(needs create on subjectaccessreviews).",
        )
    lacking = sorted(ns for ns, allowed in per_namespace.items() if allowed is not True)
    unreviewed = sorted(ns for ns, allowed in per_namespace.items() if allowed is None)
    granted_everywhere = cluster_wide or not lacking
    facts = {
        "user": user,
        "clusterWide": cluster_wide,
        "namespacesWithoutGrant": lacking,
        "expectPlanOnly": expect_plan_only,
    }
    if unreviewed:
        return unknown(name, f"could not review retire for {user} in namespace(s) {_names(unreviewed)}.", facts=facts)
    if expect_plan_only:
        if cluster_wide or (per_namespace and not lacking):
            return failed(
                name,
                f"{user} holds retire but the cluster is expected to be plan-only; remove the "
                f"retire-grant component (or run doctor without --expect-plan-only).",
                objects=(user,),
                facts=facts,
            )
        return passed(name, f"{user} does not hold retire: plan-only, as expected.", facts=facts)
    if cluster_wide:
        return passed(name, f"{user} holds retire in every namespace.", facts=facts)
    if granted_everywhere and per_namespace:
        return passed(
            name, f"{user} holds retire in every namespace with registrations ({len(per_namespace)}).", facts=facts
        )
    where = f" in namespace(s) {_names(lacking)}" if lacking else ""
    return failed(
        name,
        f"{user} does not hold retire{where}: the operator runs plan-only; grant it with the "
        f"retire-grant component (`kubectl apply -k manifests/overlays/production`), or pass "
        f"--expect-plan-only if that is intended.",
        objects=(user,),
        facts=facts,
    )


def check_agents(
    *,
    nodes: Sequence[Mapping[str, Any]] | Unreadable,
    leases: Sequence[Mapping[str, Any]] | Unreadable,
    system_namespace: str,
    now: datetime.datetime,
    plan: Plan | Unreadable | None = None,
) -> Check:
    """Every Ready node, and every node with active registrations (whether or not its Node still
    exists), has a live agent Lease whose boot id is the Node's (where the Node publishes one).

    `plan` gives the registrations; Unreadable (or None) means the nodes holding registrations are
    unknown, so a clean result for the Ready nodes alone is UNKNOWN, not PASS.
    """
    name = "agents"
    if isinstance(nodes, Unreadable):
        return unknown(name, f"Nodes could not be listed: {nodes.reason}")
    if isinstance(leases, Unreadable):
        return unknown(name, f"agent Leases could not be listed: {leases.reason}")
    agents = _agent_leases(leases, system_namespace=system_namespace)
    by_name = {_name(node): node for node in nodes}
    ready = sorted(
        node_name for node_name, node in by_name.items() if _condition_status(node.get("status"), "Ready") == "True"
    )
    holding: dict[str, int] = {}
    if isinstance(plan, Plan):
        for entry in plan.entries:
            if not entry.registration.terminal and entry.registration.node_name:
                holding[entry.registration.node_name] = holding.get(entry.registration.node_name, 0) + 1
    checked = sorted(set(ready) | set(holding))
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
        "problems": problems,
    }
    scope = f"{len(checked)} node(s) Ready or holding active registrations"
    if problems:
        described = "; ".join(f"{node}: {problem}" for node, problem in sorted(problems.items())[:_SHOWN_NAMES])
        more = len(problems) - _SHOWN_NAMES
        return failed(
            name,
            f"{len(problems)} of {scope} lack a healthy agent: {described}"
            f"{f'; and {more} more' if more > 0 else ''}. Check the coroner-agent DaemonSet pods on them "
            f"(and, for a node that is gone, the node-loss check).",
            objects=tuple(f"node/{node}" for node in sorted(problems)),
            facts=facts,
        )
    if not isinstance(plan, Plan):
        why = plan.reason if isinstance(plan, Unreadable) else "not read"
        return unknown(
            name,
            f"every Ready node ({len(ready)}) has a live agent on the Node's boot, but the nodes holding "
            f"registrations are unknown (registrations: {why}).",
            facts=facts,
        )
    return passed(
        name,
        f"every Ready node ({len(ready)}) and every node with active registrations ({len(holding)}) has "
        f"a live agent on the Node's boot.",
        facts=facts,
    )


def _agent_leases(leases: Sequence[Mapping[str, Any]], *, system_namespace: str) -> dict[str, AgentFacts]:
    agents = {}
    for lease in leases:
        meta = lease.get("metadata") or {}
        lease_name = str(meta.get("name") or "")
        if meta.get("namespace") == system_namespace and lease_name.startswith(api.AGENT_LEASE_PREFIX):
            agents[lease_name[len(api.AGENT_LEASE_PREFIX) :]] = agent_facts_from_lease(lease)
    return agents


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
            "expired": f"its agent {lease_ref} expired at {_stamp(item.agent_expired)} "
            f"({_duration(now - item.agent_expired) if item.agent_expired else '?'} ago)",
            "no-expiry": f"its agent {lease_ref} has no computable expiry",
            "another-boot": f"its agent {lease_ref} is live on another boot, which cannot speak for them",
        }[item.agent_state]
        heard = f"; last heartbeat {_stamp(last_beat)}" if last_beat is not None else ""
        now_says = ", ".join(f"{reason} {count}" for reason, count in sorted(reasons.items()))
        described.append(
            f"{item.node}: {len(item.keys)} registration(s); {state}; {agent}{heard}; decided now: {now_says}. "
            f"Released by: {' Or '.join(releases['sentences'])}"
        )
        named = [display(key) for key in item.keys]
        objects.append(f"node/{item.node}")
        objects.extend(f"workerregistration/{n}" for n in named)
        per_node[item.node] = {
            "count": len(item.keys),
            "registrations": named,
            "node": item.node_state,
            "agentLease": item.agent_state,
            "agentLeaseExpired": _stamp(item.agent_expired),
            "lostSeconds": None if item.agent_expired is None else (now - item.agent_expired).total_seconds(),
            "lastHeartbeat": _stamp(last_beat),
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
                f"{_stamp(now + datetime.timedelta(seconds=quarantine))} at the latest, if it is running now)"
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


def _duration(span: datetime.timedelta) -> str:
    seconds = max(0, int(span.total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


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
            f"{len(stuck)} registration(s) unattested for over {grace_seconds:g}s: {_names(named)} "
            f"(node(s) {_names(nodes)}); check the agents of those nodes.",
            objects=tuple(f"workerregistration/{n}" for n in named),
            facts=facts,
        )
    return passed(
        name, f"0 of {len(plan.entries)} registration(s) unattested for over {grace_seconds:g}s.", facts=facts
    )


def check_blocked(*, plan: Plan | Unreadable, expect_plan_only: bool, permission_known: bool = True) -> Check:
    """Registrations the operator would retire but for something a person must fix.

    `plan` must be decided with the operator's retire permission; where that permission could not
    be reviewed (`permission_known` False), RetirePermissionMissing rows are unknown, not blocked.
    """
    name = "blocked"
    if isinstance(plan, Unreadable):
        return unknown(name, f"registrations could not be read: {plan.reason}")
    found = [entry for entry in plan.entries if blocked(entry)]
    by_reason: dict[str, list[str]] = {}
    for entry in found:
        by_reason.setdefault(entry.decision.reason.value, []).append(display(model.key_of(entry.registration)))
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
        described = "; ".join(f"{reason} {len(names)}: {_names(names)}" for reason, names in sorted(by_reason.items()))
        return failed(
            name,
            f"{facts['count']} dead registration(s) preserved by a fixable cause: {described}. "
            f"`kubectl coroner plan` explains each.",
            objects=tuple(f"workerregistration/{n}" for names in by_reason.values() for n in names),
            facts=facts,
        )
    if unreviewed:
        return unknown(
            name,
            f"{len(unreviewed)} dead registration(s) wait for the retire verb, and whether the operator "
            f"holds it could not be reviewed: {_names(unreviewed)}.",
            objects=tuple(f"workerregistration/{n}" for n in unreviewed),
            facts=facts,
        )
    tail = f" ({len(expected)} waiting for retire, plan-only as expected)" if expected else ""
    return passed(name, f"0 of {len(plan.entries)} registration(s) retirable-but-blocked{tail}.", facts=facts)


# --- the check list -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Findings:
    """Everything one doctor run read (or could not: `Unreadable`) and was asked: every check's input."""

    crd: Mapping[str, Any] | Unreadable | None
    policies: Sequence[Mapping[str, Any]] | Unreadable
    """ValidatingAdmissionPolicies."""
    bindings: Sequence[Mapping[str, Any]] | Unreadable
    """ValidatingAdmissionPolicyBindings."""
    operator_lease: Mapping[str, Any] | Unreadable | None
    nodes: Sequence[Mapping[str, Any]] | Unreadable
    leases: Sequence[Mapping[str, Any]] | Unreadable
    """Every Lease of the cluster."""
    world: World | Unreadable
    plan: Plan | Unreadable
    """Every registration decided with the operator's policy and the operator's retire permission."""
    cluster_wide: bool | None
    """Whether the operator holds retire in every namespace; None: could not be reviewed."""
    per_namespace: Mapping[str, bool | None]
    """Whether it holds retire, per namespace with registrations."""
    policy: PolicyChoice
    system_namespace: str
    expect_plan_only: bool
    attestation_grace_seconds: float
    now: datetime.datetime


#: The checks, in the order doctor shows them. A new check is one pure function of `Findings`
#: returning a `Check` (built with `passed`, `failed` or `unknown`) and one entry here.
CHECKS: Final[tuple[Callable[[Findings], Check], ...]] = (
    lambda f: check_crd(f.crd),
    lambda f: check_admission_policies(policies=f.policies, bindings=f.bindings),
    lambda f: check_admission_content(policies=f.policies, bindings=f.bindings, system_namespace=f.system_namespace),
    lambda f: check_operator_alive(lease=f.operator_lease, system_namespace=f.system_namespace, now=f.now),
    lambda f: check_last_sweep(lease=f.operator_lease, system_namespace=f.system_namespace),
    lambda f: check_retire_grant(
        cluster_wide=f.cluster_wide,
        per_namespace=f.per_namespace,
        expect_plan_only=f.expect_plan_only,
        system_namespace=f.system_namespace,
    ),
    lambda f: check_agents(nodes=f.nodes, leases=f.leases, system_namespace=f.system_namespace, now=f.now, plan=f.plan),
    lambda f: check_node_loss(
        world=f.world, plan=f.plan, policy=f.policy, system_namespace=f.system_namespace, now=f.now
    ),
    lambda f: check_unattested(plan=f.plan, now=f.now, grace_seconds=f.attestation_grace_seconds),
    lambda f: check_blocked(
        plan=f.plan, expect_plan_only=f.expect_plan_only, permission_known=f.cluster_wide is not None
    ),
)


def run_checks(findings: Findings, checks: Sequence[Callable[[Findings], Check]] = CHECKS) -> list[Check]:
    """Every check of `checks` on one doctor run's findings, in order."""
    return [check(findings) for check in checks]


def doctor_exit_code(checks: Sequence[Check]) -> int:
    """1 when any check FAILs; UNKNOWN alone does not fail (it is reported, not guessed)."""
    return 1 if any(check.status == CheckStatus.FAIL for check in checks) else 0


# --- small pure pieces --------------------------------------------------------------------------


def _condition_status(status: object, condition_type: str) -> str | None:
    if not isinstance(status, Mapping):
        return None
    for item in status.get("conditions") or []:
        if isinstance(item, Mapping) and item.get("type") == condition_type:
            value = item.get("status")
            return value if isinstance(value, str) else None
    return None


def _name(body: Mapping[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("name") or "")


def _positive(count: object) -> bool:
    return isinstance(count, int | float) and not isinstance(count, bool) and count > 0


#: One lease expiry, the decision's (so that doctor and decide never disagree on whether a Lease is live).


def _stamp(moment: datetime.datetime | None) -> str | None:
    return None if moment is None else model.format_time(moment)
