"""Doctor's install checks: the CRD and the admission policies present, bound and as shipped (as the
operator verifies them), and none of an older release left acting."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from coroner.cli.doctor.grant import operator_identity
from coroner.cli.doctor.outcome import Check, condition_status, failed, kubectl_name, object_name, passed, unknown
from coroner.cli.plan import PolicyChoice, Unreadable, names_text
from coroner.core import admission_digest, api

#: The lists doctor reads, by kind (`coroner.core.admission_digest.KINDS` and `LEFTOVER_KINDS`): the
#: items of each LIST as the API returns them, or `Unreadable` where that LIST failed.
Admission = Mapping[str, Sequence[Mapping[str, Any]] | Unreadable]

#: The ValidatingAdmissionPolicies of manifests/base/admission-policies.yaml, each bound by a
#: binding of the same name; doctor names the missing ones.
ADMISSION_POLICIES: Final = tuple(
    name for kind, name in admission_digest.EXPECTED if kind == "ValidatingAdmissionPolicy"
)
#: Admission objects an older release installed and this one does not. `kubectl apply` prunes
#: nothing, and left in place they still act: `coroner-registration-state` held every status write up
#: with 503 for minutes after an API server restart, and `coroner-record-registrant` every create
#: that did not name its registrant (docs/faults.md, finding 7).
RETIRED_ADMISSION_OBJECTS: Final = (
    ("MutatingAdmissionPolicy", "coroner-registration-state"),
    ("MutatingAdmissionPolicyBinding", "coroner-registration-state"),
    ("MutatingAdmissionPolicy", "coroner-record-registrant"),
    ("MutatingAdmissionPolicyBinding", "coroner-record-registrant"),
)
#: The kinds doctor lists only to find those objects.
LEFTOVER_KINDS: Final = tuple(dict.fromkeys(kind for kind, _ in RETIRED_ADMISSION_OBJECTS))


def plural_of(kind: str) -> str:
    """``ValidatingAdmissionPolicy`` → ``ValidatingAdmissionPolicies``, for doctor's lines."""
    return f"{kind}s" if not kind.endswith("y") else f"{kind[:-1]}ies"


def _unread(admission: Admission, kinds: Sequence[str] = admission_digest.KINDS) -> str | None:
    """Which of the lists of `kinds` could not be read, and why (None: all were)."""
    reasons = [
        f"{plural_of(kind)} could not be read: {listed.reason}" if isinstance(listed, Unreadable)
        else f"{plural_of(kind)} were not read"
        for kind in kinds
        if isinstance(listed := admission.get(kind), Unreadable) or listed is None
    ]  # fmt: skip
    return "; ".join(reasons) or None


def _items(admission: Admission, kind: str) -> Sequence[Mapping[str, Any]]:
    listed = admission.get(kind)
    assert listed is not None and not isinstance(listed, Unreadable)
    return listed


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
            names=(kubectl_name("CustomResourceDefinition", api.CRD_NAME),),
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
            names=(kubectl_name("CustomResourceDefinition", api.CRD_NAME),),
            facts={"established": established, "servedVersions": served},
        )
    if api.VERSION not in served:
        return failed(
            name,
            f"{subject} does not serve {api.VERSION} (serves {', '.join(map(str, served)) or 'nothing'}); re-apply the manifests.",
            objects=(subject,),
            names=(kubectl_name("CustomResourceDefinition", api.CRD_NAME),),
            facts={"established": established, "servedVersions": served},
        )
    return passed(
        name,
        f"{subject} is Established and serves {api.VERSION}.",
        facts={"established": established, "servedVersions": served},
    )


def check_admission_policies(*, admission: Admission) -> Check:
    """The admission policies exist, each bound with validationActions Deny, and no policy of an
    older release is left acting."""
    name = "admission-policies"
    unread = _unread(admission, (*admission_digest.KINDS, *LEFTOVER_KINDS))
    if unread is not None:
        return unknown(name, f"{unread}.")
    present = {object_name(policy) for policy in _items(admission, "ValidatingAdmissionPolicy")}
    bound: dict[str, list[str]] = {}
    for binding in _items(admission, "ValidatingAdmissionPolicyBinding"):
        spec = binding.get("spec") or {}
        actions = spec.get("validationActions") or []
        if "Deny" in actions:
            bound.setdefault(str(spec.get("policyName") or ""), []).append(object_name(binding))
    missing_keys = [("ValidatingAdmissionPolicy", policy) for policy in ADMISSION_POLICIES if policy not in present]
    missing_keys += [
        ("ValidatingAdmissionPolicyBinding", policy) for policy in ADMISSION_POLICIES if policy not in bound
    ]
    missing = [f"{kind}/{policy}" for kind, policy in missing_keys]
    leftover = [
        (kind, policy)
        for kind, policy in RETIRED_ADMISSION_OBJECTS
        if policy in {object_name(item) for item in _items(admission, kind)}
    ]
    facts = {
        "policies": sorted(p for p in present if p in ADMISSION_POLICIES),
        "boundPolicies": sorted(bound),
        "leftFromOlderReleases": [f"{kind}/{policy}" for kind, policy in leftover],
    }
    problems = []
    if missing:
        problems.append(
            f"missing (or not bound with Deny): {names_text(missing)}; re-apply the manifests "
            f"(`kubectl apply -k manifests/overlays/plan-only`)"
        )
    if leftover:
        deletes = "; ".join(f"kubectl delete {kind.lower()} {policy}" for kind, policy in leftover)
        problems.append(
            f"left from an older release, and still acting: {names_text([f'{k}/{p}' for k, p in leftover])}; "
            f"delete them (`{deletes}`)"
        )
    if problems:
        return failed(
            name,
            "; ".join(problems) + ".",
            objects=(*missing, *(f"{kind}/{policy}" for kind, policy in leftover)),
            facts=facts,
            names=[kubectl_name(kind, policy) for kind, policy in (*missing_keys, *leftover)],
        )
    return passed(
        name,
        f"all {len(ADMISSION_POLICIES)} validating policies present and bound with Deny.",
        facts=facts,
    )


def check_admission_content(
    *,
    admission: Admission,
    crd: Mapping[str, Any] | Unreadable | None,
    policy: PolicyChoice,
    system_namespace: str = api.SYSTEM_NAMESPACE,
    operator_deployments: Sequence[Mapping[str, Any]] | Unreadable = (),
    operator_lease: Mapping[str, Any] | Unreadable | None = None,
) -> Check:
    """Each admission policy and binding has the content the manifests ship (a
    digest of expressions, failurePolicy, match rules, actions and binding scope;
    coroner.core.admission_digest), and so has the WorkerRegistration CRD (its status subresource,
    rules and bounds: `crd`, as read for check_crd): a policy narrowed or a binding that only warns or misses
    namespaces is as good as missing. Compared as the operator compares them (it retires nothing
    otherwise: AdmissionPoliciesUnverified): components/node-loss's evidence policy is accepted
    only where the operator's published `policy` uses node evidence (`accepted_alternates`). The
    identities in them are the release's: its namespace, and the namePrefix of its operator
    (`operator_identity`: as it states it on `operator_lease`, else from `operator_deployments`)."""
    name = "admission-content"
    unread = _unread(admission)
    if unread is not None:
        return unknown(name, f"{unread}.")
    if isinstance(crd, Unreadable):
        return unknown(name, f"{admission_digest.CRD[0]}/{admission_digest.CRD[1]} could not be read: {crd.reason}.")
    documents = [{"kind": kind, **item} for kind in admission_digest.KINDS for item in _items(admission, kind)]
    if crd is not None:
        documents.append({**crd, "kind": admission_digest.CRD_KIND})
    identity = operator_identity(operator_deployments, system_namespace=system_namespace, lease=operator_lease)
    prefix = identity.name_prefix
    operator = policy.published
    # Where the operator's policy is not known, the variant is accepted here and said below.
    node_evidence = operator is None or admission_digest.uses_node_evidence(operator)
    expected = admission_digest.EXPECTED
    comparison = admission_digest.compare(
        documents,
        expected=expected,
        alternates=admission_digest.accepted_alternates(node_evidence=node_evidence),
        system_namespace=system_namespace,
        name_prefix=prefix,
    )
    variant = admission_digest.compare(
        documents, expected=expected, system_namespace=system_namespace, name_prefix=prefix
    ).node_loss
    admitted = "admitted" if variant else "refused"
    facts = {
        "compared": len(expected),
        "operatorNodeEvidence": admitted,
        "operatorUsesNodeEvidence": None if operator is None else node_evidence,
        "namePrefix": prefix,
        "namePrefixFrom": f"the operator's user {identity.user or '(not known)'} {identity.source}",
    }
    # How the release's names were learned, in the line (the manifests' names go without saying).
    learned = f" (namePrefix {prefix}: the operator's user {identity.user} {identity.source})" if prefix else ""
    if not comparison.intact:
        not_as_shipped = sorted((*comparison.missing, *comparison.differing))
        shown = [f"{kind}/{policy}" for kind, policy in not_as_shipped]
        why = (
            f" ({admission_digest.EVIDENCE_POLICY[1]} is components/node-loss's, which admits node evidence "
            f"this operator does not use: nodeDeletionEvidence and nodeOutOfServiceEvidence are false)"
            if variant and not node_evidence
            else ""
        )
        if isinstance(operator_deployments, Unreadable) and not identity.stated:
            why += (
                f" (compared with the manifests' ServiceAccount names: the operator's Lease does not state its "
                f"{api.OPERATOR_USER_ANNOTATION} and the Deployments of {system_namespace} could not be read, so a "
                f"Helm release's namePrefix is not known: {operator_deployments.reason})"
            )
        return failed(
            name,
            f"not as the manifests ship them: {names_text(comparison.names())}{why}{learned}; the operator retires "
            f"nothing until they are (AdmissionPoliciesUnverified): re-apply the manifests (`kubectl apply -k` "
            f"your overlay, or `kubectl apply --server-side -f` the chart's crds/ for a Helm release, which never upgrades "
            f"its CRDs) and find out who changed them.",
            objects=tuple(shown),
            facts=facts,
            names=[kubectl_name(kind, policy) for kind, policy in not_as_shipped],
        )
    if operator is None and variant:
        return unknown(
            name,
            f"the {len(expected)} policies and bindings are as shipped, but the evidence policy is "
            f"components/node-loss's, which the operator accepts only if it uses node evidence, and its "
            f"policy could not be read ({policy.unreadable}).",
            facts=facts,
        )
    return passed(
        name,
        f"all {len(expected)} policies and bindings have the manifests' content (the operator's node "
        f"evidence is {admitted}){learned}.",
        facts=facts,
    )
