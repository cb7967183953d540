"""Doctor's `admission-mutation` check: mutating webhooks and MutatingAdmissionPolicies that can touch
registrations.

Mutating admission runs before every validation: a mutation of a registration's status rewrites what
its writer sent (an agent's `Alive` stored as `Dead`), and the validating policies then admit the
result as that writer's. None of Coroner's rules need one (its own registrar injection mutates Pods,
never registrations), and the admission digest covers only the validating policies, so any that
matches a registration is a FAIL by name.

Matched by their rules as the API server matches them: `*` is every resource but no subresource,
`*/*` every resource and subresource, `workerregistrations/*` its subresources, `*/status` every
status; a policy's `excludeResourceRules` are honoured. Selectors (namespace, object, match
conditions) are not evaluated: one that matches some registrations is named.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from coroner.cli.doctor.outcome import Check, failed, kubectl_name, object_name, passed, unknown
from coroner.cli.plan import Unreadable
from coroner.core import api

#: The writes whose content a mutation could change: a registration's create and update, its status.
_WRITES: Final = (
    (api.PLURAL, "", "CREATE"),
    (api.PLURAL, "", "UPDATE"),
    (api.PLURAL, "status", "UPDATE"),
)


def _resource_matches(pattern: str, resource: str, subresource: str) -> bool:
    if pattern == "*/*":
        return True
    if pattern == "*":
        return not subresource
    head, _, tail = pattern.partition("/")
    if not tail:
        return head == resource and not subresource
    return (head in ("*", resource)) and (tail in ("*", subresource)) and bool(subresource)


def rule_matches(rule: Mapping[str, Any], *, resource: str, subresource: str, operation: str) -> bool:
    """Whether one admission rule (`RuleWithOperations`, or a policy's `NamedRuleWithOperations`) matches
    a write of a registration."""
    groups = rule.get("apiGroups") or []
    operations = rule.get("operations") or []
    if "*" not in groups and api.GROUP not in groups:
        return False
    if "*" not in operations and operation not in operations:
        return False
    if rule.get("scope") == "Cluster":
        return False
    return any(_resource_matches(str(pattern), resource, subresource) for pattern in rule.get("resources") or [])


def _touches(rules: Sequence[Mapping[str, Any]], excluded: Sequence[Mapping[str, Any]] = ()) -> list[str]:
    """The registration writes (``workerregistrations[/status] OPERATION``) that `rules` match."""
    touched = []
    for resource, subresource, operation in _WRITES:
        where = {"resource": resource, "subresource": subresource, "operation": operation}
        if any(rule_matches(rule, **where) for rule in rules) and not any(
            rule_matches(rule, **where) for rule in excluded
        ):
            touched.append(f"{resource}{'/' + subresource if subresource else ''} {operation}")
    return touched


def check_admission_mutation(
    *,
    webhooks: Sequence[Mapping[str, Any]] | Unreadable,
    policies: Sequence[Mapping[str, Any]] | Unreadable,
) -> Check:
    """FAIL naming every MutatingWebhookConfiguration (by its webhooks) and MutatingAdmissionPolicy whose
    rules match a write of a WorkerRegistration; UNKNOWN where either list could not be read."""
    name = "admission-mutation"
    for listed, kind in ((webhooks, "MutatingWebhookConfigurations"), (policies, "MutatingAdmissionPolicies")):
        if isinstance(listed, Unreadable):
            return unknown(name, f"the {kind} could not be read: {listed.reason}")
    assert not isinstance(webhooks, Unreadable) and not isinstance(policies, Unreadable)
    found: dict[str, list[str]] = {}
    for configuration in webhooks:
        for webhook in configuration.get("webhooks") or []:
            touched = _touches(webhook.get("rules") or [])
            if touched:
                found[f"MutatingWebhookConfiguration/{object_name(configuration)}"] = [
                    f"webhook {webhook.get('name')}: {', '.join(touched)}"
                ]
    for policy in policies:
        constraints = (policy.get("spec") or {}).get("matchConstraints") or {}
        touched = _touches(constraints.get("resourceRules") or [], constraints.get("excludeResourceRules") or [])
        if touched:
            found[f"MutatingAdmissionPolicy/{object_name(policy)}"] = touched
    if not found:
        return passed(
            name,
            "no mutating webhook or MutatingAdmissionPolicy matches WorkerRegistrations.",
            facts={"mutators": {}},
        )
    described = "; ".join(f"{where} ({', '.join(what)})" for where, what in sorted(found.items()))
    return failed(
        name,
        f"{len(found)} mutating admission object(s) can rewrite WorkerRegistrations before the validating "
        f"policies see them (an agent's Alive stored as Dead, admitted as the agent's): {described}. Delete them, "
        f"or exclude {api.PLURAL}.{api.GROUP} from their rules; Coroner needs none.",
        objects=sorted(found),
        facts={"mutators": found},
        names=[kubectl_name(*where.split("/", 1)) for where in sorted(found)],
    )
