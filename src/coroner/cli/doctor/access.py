"""Doctor's access checks: who, outside `system:masters` and the control plane, can act as Coroner's
agents or as a worker's Pod, resolved from RBAC (`coroner.cli.doctor.rbac`).

- `system-namespace-access`: whoever can mint a token for a ServiceAccount of the system namespace, exec
  into its Pods, create Pods in it or impersonate its ServiceAccounts can speak as a node's agent (an
  agent Pod's token carries its node) or as the operator.
- `node-taint-access`: whoever can patch or update Nodes can set the `node.kubernetes.io/out-of-service`
  taint, which the decision takes as a person's statement that the node is gone (NodeOutOfService).
- `worker-namespace-access`: whoever can mint a token for a worker's ServiceAccount bound to the
  worker's Pod, exec into it, or impersonate it is that worker's registrant to the admission policies:
  they can release or heartbeat for it (docs/security.md).

Each names the subjects with what they can do and through which binding: WARN, as what a person should
look at that may be right (a namespace's own administrators), never a pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from coroner.cli.doctor.outcome import Check, kubectl_name, passed, unknown, warned
from coroner.cli.doctor.rbac import UNRESOLVED, Ask, Grant, Rbac, grants
from coroner.cli.plan import Unreadable
from coroner.core.world import World

TOKEN: Final = Ask(verb="create", group="", resource="serviceaccounts", subresource="token", names=None)
EXEC: Final = Ask(verb="create", group="", resource="pods", subresource="exec", names=None)
CREATE_PODS: Final = Ask(verb="create", group="", resource="pods")
IMPERSONATE: Final = Ask(verb="impersonate", group="", resource="serviceaccounts", names=None)

PATCH_NODES: Final = Ask(verb="patch", group="", resource="nodes", names=None)
UPDATE_NODES: Final = Ask(verb="update", group="", resource="nodes", names=None)

#: The asks of each check: a Pod created in a worker's namespace has its own name and uid, so its token
#: is no worker's registrant; in the system namespace it is an agent wherever it is scheduled.
SYSTEM_ASKS: Final = (TOKEN, EXEC, CREATE_PODS, IMPERSONATE)
WORKER_ASKS: Final = (TOKEN, EXEC, IMPERSONATE)

#: How many subjects a summary names before "and N more" (-o json has them all).
_SHOWN: Final = 8


def _control_plane(grant: Grant) -> bool:
    """Cluster admins, and Kubernetes' own controllers through its own default bindings: the DaemonSet
    controller creates the agent's Pods, the kube-controller-manager mints its controllers' tokens."""
    if grant.subject == "Group/system:masters":
        return True
    if not grant.bootstrap:
        return False
    kind, _, name = grant.subject.partition("/")
    return name.startswith("system:") if kind in ("User", "Group") else name.startswith("kube-system/")


def _subjects(found: Iterable[Grant]) -> list[dict[str, Any]]:
    """One row per subject: what it can do, through which bindings (sorted, for a stable line)."""
    rows: dict[str, dict[str, set[str]]] = {}
    for grant in found:
        if _control_plane(grant):
            continue
        row = rows.setdefault(grant.subject, {"can": set(), "via": set()})
        row["can"].add(grant.ask.describe())
        row["via"].add(f"{grant.binding} ({grant.role})")
    return [
        {"subject": subject, "can": sorted(row["can"]), "via": sorted(row["via"])}
        for subject, row in sorted(rows.items())
    ]


def _object_names(subjects: Iterable[str]) -> list[str]:
    """The ServiceAccounts among `subjects`, as `kubectl get -o name` names them (users and groups are no objects)."""
    return [
        kubectl_name("ServiceAccount", subject.rsplit("/", 1)[1])
        for subject in subjects
        if subject.startswith("ServiceAccount/")
    ]


def _named(name: str, summary: str, subjects: Sequence[str], facts: dict[str, Any]) -> Check:
    """The WARN line naming `subjects` (the ServiceAccounts among them as `-o name` prints them)."""
    return warned(name, summary, objects=subjects, facts=facts, names=_object_names(subjects))


def _listed(rows: Sequence[dict[str, Any]]) -> str:
    shown = "; ".join(f"{row['subject']} ({', '.join(row['can'])})" for row in rows[:_SHOWN])
    more = len(rows) - _SHOWN
    return shown + (f"; and {more} more (-o json)" if more > 0 else "")


def check_system_namespace_access(*, rbac: Rbac | Unreadable, system_namespace: str) -> Check:
    """Subjects outside system:masters and the control plane that can mint tokens for, exec into, create
    Pods in or impersonate ServiceAccounts of the system namespace (RBAC only: `UNRESOLVED`)."""
    name = "system-namespace-access"
    if isinstance(rbac, Unreadable):
        return unknown(name, f"RBAC could not be read: {rbac.reason}")
    rows = _subjects(grants(rbac, SYSTEM_ASKS, namespace=system_namespace))
    facts = {"namespace": system_namespace, "subjects": rows, "notResolved": list(UNRESOLVED)}
    if not rows:
        return passed(
            name,
            f"only system:masters and the control plane may mint tokens for, exec into, create Pods in or "
            f"impersonate ServiceAccounts of namespace {system_namespace} (RBAC; not resolved: {UNRESOLVED[0]}).",
            facts=facts,
        )
    return _named(
        name,
        f"{len(rows)} subject(s) can act as Coroner's agent of a node, or as its operator, in namespace "
        f"{system_namespace} (a token they mint is refused while policy coroner-system-tokens-by-kubelet is in "
        f"place; exec, a Pod of their own or impersonation is not): {_listed(rows)}. Remove these grants unless "
        f"each is a cluster administrator (docs/security.md, threat 3a).",
        [row["subject"] for row in rows],
        facts,
    )


def check_worker_namespace_access(*, rbac: Rbac | Unreadable, world: World | Unreadable) -> Check:
    """Per namespace holding registrations, the subjects outside system:masters and the control plane that
    can mint a token for, exec into or impersonate its ServiceAccounts: each can release a live worker."""
    name = "worker-namespace-access"
    if isinstance(rbac, Unreadable) or isinstance(world, Unreadable):
        missing = rbac if isinstance(rbac, Unreadable) else world
        assert isinstance(missing, Unreadable)
        return unknown(name, f"could not be decided: {missing.reason}")
    per_namespace: dict[str, list[dict[str, Any]]] = {}
    for namespace in sorted(world.namespaces()):
        rows = _subjects(grants(rbac, WORKER_ASKS, namespace=namespace))
        if rows:
            per_namespace[namespace] = rows
    facts = {"namespaces": per_namespace, "notResolved": list(UNRESOLVED)}
    if not per_namespace:
        return passed(
            name,
            "in no namespace holding registrations may anyone outside system:masters and the control plane mint "
            "tokens for, exec into or impersonate its ServiceAccounts (RBAC).",
            facts=facts,
        )
    subjects = sorted({row["subject"] for rows in per_namespace.values() for row in rows})
    described = "; ".join(f"namespace {ns}: {_listed(rows)}" for ns, rows in per_namespace.items())
    return _named(
        name,
        f"{len(subjects)} subject(s) can speak as a worker's own Pod, and so release or heartbeat for it: "
        f"{described}. A release by them is indistinguishable from the worker's (docs/security.md).",
        subjects,
        facts,
    )


def check_node_taint_access(*, rbac: Rbac | Unreadable, out_of_service_evidence: bool) -> Check:
    """Subjects outside system:masters and the control plane that can patch or update Nodes, and so set the
    out-of-service taint that the policy (`out_of_service_evidence`) takes as a person's statement."""
    name = "node-taint-access"
    if not out_of_service_evidence:
        return passed(
            name, "the policy does not take the out-of-service taint as evidence (nodeOutOfServiceEvidence=false)."
        )
    if isinstance(rbac, Unreadable):
        return unknown(name, f"RBAC could not be read: {rbac.reason}")
    rows = _subjects(grants(rbac, (PATCH_NODES, UPDATE_NODES), namespace=""))
    facts = {"subjects": rows, "notResolved": list(UNRESOLVED)}
    if not rows:
        return passed(
            name,
            "only system:masters and the control plane may patch or update Nodes, so set the out-of-service taint "
            "(RBAC; each kubelet may change its own Node through the Node authorizer, which is not read).",
            facts=facts,
        )
    return _named(
        name,
        f"{len(rows)} subject(s) can set the node.kubernetes.io/out-of-service taint, which retires every "
        f"registration on that node as NodeOutOfService once its agent is gone, as if a person had said the node "
        f"is down: {_listed(rows)}. Make sure each is a person or a tool that sets it only for a node that is "
        f"shut down (docs/security.md).",
        [row["subject"] for row in rows],
        facts,
    )
