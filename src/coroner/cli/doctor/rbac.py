"""Who RBAC lets do a thing: the subjects of the bindings whose roles grant it, resolved by doctor itself.

Read from the ClusterRoles, ClusterRoleBindings, Roles and RoleBindings as the API returned them. A
ClusterRole's `aggregationRule` is resolved here from the labels of the ClusterRoles it selects (as
the aggregation controller would, whether or not it runs), together with the rules it already holds;
wildcards (`*` verbs, API groups and resources, `*/subresource`) and `resourceNames` are matched
the way the RBAC authorizer matches them. A rule with `resourceNames` matches an ask about a named
object only when it names one of `Ask.names` (or `Ask.names` is None: any object of the namespace).

This resolves RBAC only: what another authorizer (a webhook, the Node authorizer) allows, and who could
grant themselves these rights (`bind`, `escalate`, a binding they may create), is not followed;
`UNRESOLVED` says so in each check that uses it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

#: What this resolution does not see, said by every check that relies on it.
UNRESOLVED: Final = (
    "authorizers other than RBAC (a webhook authorizer, and the Node authorizer, which lets each node's "
    "kubelet mint tokens for the Pods on its node) are not read",
    "who could grant themselves these rights (bind, escalate, or create a binding) is not followed",
    "members of groups are not known: a group is named as a group",
)

#: The label Kubernetes' own default roles and bindings carry (the API server's bootstrap policy).
BOOTSTRAP_LABEL: Final = ("kubernetes.io/bootstrapping", "rbac-defaults")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ask:
    """One request, as the RBAC authorizer sees it: verb on group/resource[/subresource] in a namespace."""

    verb: str
    group: str
    resource: str
    subresource: str = ""
    names: frozenset[str] | None = frozenset()
    """The objects asked about: empty for a request without a name (create); None for any object."""

    def describe(self) -> str:
        sub = f"/{self.subresource}" if self.subresource else ""
        group = f".{self.group}" if self.group else ""
        return f"{self.verb} {self.resource}{group}{sub}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Grant:
    """A subject that may do `ask` in a namespace, and the binding through which it may."""

    subject: str
    """``User/NAME``, ``Group/NAME`` or ``ServiceAccount/NAMESPACE/NAME``."""
    ask: Ask
    binding: str
    """``ClusterRoleBinding/NAME`` or ``RoleBinding/NAMESPACE/NAME``."""
    role: str
    bootstrap: bool
    """The binding is one of Kubernetes' own defaults (`BOOTSTRAP_LABEL`)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rbac:
    """The RBAC objects of the cluster, as the API returned them."""

    cluster_roles: Sequence[Mapping[str, Any]]
    cluster_role_bindings: Sequence[Mapping[str, Any]]
    roles: Sequence[Mapping[str, Any]]
    role_bindings: Sequence[Mapping[str, Any]]


def _meta(body: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = body.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _labels(body: Mapping[str, Any]) -> Mapping[str, Any]:
    labels = _meta(body).get("labels")
    return labels if isinstance(labels, Mapping) else {}


def _selects(selector: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    """A label selector (matchLabels and matchExpressions) against labels."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression.get("key"), expression.get("operator")
        values = set(expression.get("values") or [])
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True


def cluster_role_rules(rbac: Rbac) -> dict[str, list[Mapping[str, Any]]]:
    """Each ClusterRole's rules by name, an aggregated one's with those of every role it selects."""
    by_name = {str(_meta(role).get("name") or ""): role for role in rbac.cluster_roles}
    resolved: dict[str, list[Mapping[str, Any]]] = {}

    def rules_of(name: str, visiting: frozenset[str]) -> list[Mapping[str, Any]]:
        if name in resolved:
            return resolved[name]
        role = by_name[name]
        rules = [rule for rule in role.get("rules") or [] if isinstance(rule, Mapping)]
        selectors = (role.get("aggregationRule") or {}).get("clusterRoleSelectors") or []
        for other, body in by_name.items():
            if other in visiting or other == name:
                continue
            if any(_selects(selector, _labels(body)) for selector in selectors):
                rules.extend(rules_of(other, visiting | {name}))
        resolved[name] = rules
        return rules

    for name in by_name:
        rules_of(name, frozenset())
    return resolved


def _has(values: Iterable[Any], wanted: str) -> bool:
    listed = set(values or [])
    return "*" in listed or wanted in listed


def rule_allows(rule: Mapping[str, Any], ask: Ask) -> bool:
    """Whether one PolicyRule grants `ask`, as the RBAC authorizer matches it."""
    if not _has(rule.get("verbs") or [], ask.verb) or not _has(rule.get("apiGroups") or [], ask.group):
        return False
    resources = set(rule.get("resources") or [])
    combined = f"{ask.resource}/{ask.subresource}" if ask.subresource else ask.resource
    if not ("*" in resources or combined in resources or (ask.subresource and f"*/{ask.subresource}" in resources)):
        return False
    names = set(rule.get("resourceNames") or [])
    if not names:
        return True
    return ask.names is None or bool(names & ask.names)


def _subjects(binding: Mapping[str, Any]) -> list[str]:
    namespace = str(_meta(binding).get("namespace") or "")
    named: list[str] = []
    for subject in binding.get("subjects") or []:
        kind, name = subject.get("kind"), subject.get("name")
        if kind == "ServiceAccount":
            named.append(f"ServiceAccount/{subject.get('namespace') or namespace}/{name}")
        elif kind in ("User", "Group"):
            named.append(f"{kind}/{name}")
    return named


def grants(rbac: Rbac, asks: Sequence[Ask], *, namespace: str) -> list[Grant]:
    """Every (subject, ask, binding) by which RBAC lets a subject do one of `asks` in `namespace`:
    ClusterRoleBindings everywhere, RoleBindings of `namespace` (to a Role of it or a ClusterRole)."""
    cluster_rules = cluster_role_rules(rbac)
    roles = {
        str(_meta(role).get("name") or ""): [rule for rule in role.get("rules") or [] if isinstance(rule, Mapping)]
        for role in rbac.roles
        if _meta(role).get("namespace") == namespace
    }
    bindings: list[tuple[str, Mapping[str, Any], list[Mapping[str, Any]], str]] = []
    for binding in rbac.cluster_role_bindings:
        ref = binding.get("roleRef") or {}
        rules = cluster_rules.get(str(ref.get("name") or ""), [])
        bindings.append(
            (f"ClusterRoleBinding/{_meta(binding).get('name')}", binding, rules, f"ClusterRole/{ref.get('name')}")
        )
    for binding in rbac.role_bindings:
        if _meta(binding).get("namespace") != namespace:
            continue
        ref = binding.get("roleRef") or {}
        kind, role_name = str(ref.get("kind") or ""), str(ref.get("name") or "")
        rules = cluster_rules.get(role_name, []) if kind == "ClusterRole" else roles.get(role_name, [])
        where = f"RoleBinding/{namespace}/{_meta(binding).get('name')}"
        bindings.append((where, binding, rules, f"{kind}/{role_name}"))
    found: list[Grant] = []
    for where, binding, rules, role in bindings:
        bootstrap = _labels(binding).get(BOOTSTRAP_LABEL[0]) == BOOTSTRAP_LABEL[1]
        for ask in asks:
            if any(rule_allows(rule, ask) for rule in rules):
                found.extend(
                    Grant(subject=subject, ask=ask, binding=where, role=role, bootstrap=bootstrap)
                    for subject in _subjects(binding)
                )
    return found
