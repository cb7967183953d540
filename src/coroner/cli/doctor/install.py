"""Doctor's install checks: the CRD, and the admission policies present, bound and as shipped."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from coroner.cli.doctor.grant import operator_identity
from coroner.cli.doctor.outcome import Check, condition_status, failed, object_name, passed, unknown
from coroner.cli.plan import Unreadable, names_text
from coroner.core import admission_digest, api

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
    established = condition_status(crd.get("status"), "Established")
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
    present = {object_name(policy) for policy in policies}
    bound: dict[str, list[str]] = {}
    for binding in bindings:
        spec = binding.get("spec") or {}
        actions = spec.get("validationActions") or []
        if "Deny" in actions:
            bound.setdefault(str(spec.get("policyName") or ""), []).append(object_name(binding))
    missing = [f"ValidatingAdmissionPolicy/{policy}" for policy in ADMISSION_POLICIES if policy not in present]
    missing += [f"ValidatingAdmissionPolicyBinding/{policy}" for policy in ADMISSION_POLICIES if policy not in bound]
    facts = {"policies": sorted(p for p in present if p in ADMISSION_POLICIES), "boundPolicies": sorted(bound)}
    if missing:
        return failed(
            name,
            f"missing (or not bound with Deny): {names_text(missing)}; re-apply the manifests "
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
    operator_deployments: Sequence[Mapping[str, Any]] | Unreadable = (),
) -> Check:
    """Each ValidatingAdmissionPolicy and binding has the content the manifests ship (a digest of
    expressions, failurePolicy, match rules, actions and binding scope; coroner.core.admission_digest):
    a policy narrowed or a binding that only warns or misses namespaces is as good as missing. The
    identities in them are the release's: its namespace, and the namePrefix of its operator
    (`operator_identity` of `operator_deployments`)."""
    name = "admission-content"
    for listed in (policies, bindings):
        if isinstance(listed, Unreadable):
            return unknown(name, f"admission policies could not be read: {listed.reason}")
    assert not isinstance(policies, Unreadable) and not isinstance(bindings, Unreadable)
    validating = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    expected = {k: v for k, v in admission_digest.EXPECTED.items() if k[0] in validating}
    documents = [{"kind": "ValidatingAdmissionPolicy", **p} for p in policies]
    documents += [{"kind": "ValidatingAdmissionPolicyBinding", **b} for b in bindings]
    prefix = operator_identity(operator_deployments, system_namespace=system_namespace).name_prefix
    comparison = admission_digest.compare(
        documents, expected=expected, system_namespace=system_namespace, name_prefix=prefix
    )
    node_evidence = "admitted" if comparison.node_loss else "refused"
    facts = {"compared": len(expected), "operatorNodeEvidence": node_evidence, "namePrefix": prefix}
    if not comparison.intact:
        shown = [f"{kind}/{policy}" for kind, policy in sorted((*comparison.missing, *comparison.differing))]
        return failed(
            name,
            f"not as the manifests ship them: {names_text(comparison.names())}; re-apply the manifests "
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
