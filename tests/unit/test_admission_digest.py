"""coroner.core.admission_digest: the content of the admission policies, not their names.

A change that weakens a rule (an expression, failurePolicy, a match rule, a binding's actions or
scope, a deletion) is reported; what the API server adds by itself (defaults, metadata) and the
wording of messages are not.
"""

from __future__ import annotations

import copy
import enum
import hashlib
import json
import pathlib
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from coroner.cli import doctor, plan
from coroner.core import admission_digest as ad
from coroner.core.decision import Policy

REPO = pathlib.Path(__file__).resolve().parents[2]
SHIPPED = [
    d
    for file in ("admission-policies.yaml", "crd.yaml")
    for d in yaml.safe_load_all((REPO / "manifests" / "base" / file).read_text())
    if d
]


def shipped() -> list[dict[str, Any]]:
    return copy.deepcopy(SHIPPED)


def find(documents: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in documents if ad.key(d) == (kind, name)]
    return found


def test_the_expected_digests_are_the_manifests() -> None:
    # Fails after any edit of admission-policies.yaml until EXPECTED is regenerated: the content a
    # cluster is checked against is always the content that ships.
    assert dict(ad.EXPECTED) == ad.digests(SHIPPED)
    evidence = find(shipped(), *ad.EVIDENCE_POLICY)
    assert dict(ad.NODE_LOSS_ALTERNATES) == {ad.EVIDENCE_POLICY: ad.digest(ad.with_node_loss(evidence))}
    assert ad.compare(SHIPPED).intact


def as_served(document: dict[str, Any]) -> dict[str, Any]:
    """What the API server returns for a shipped object: defaults filled, metadata added."""
    served = copy.deepcopy(document)
    served["metadata"].update(uid="u", resourceVersion="42", generation=1, managedFields=[{"manager": "kubectl"}])
    spec = served["spec"]
    for key in ("matchConstraints", "matchResources"):
        if key in spec:
            spec[key].setdefault("matchPolicy", "Equivalent")
            spec[key].setdefault("namespaceSelector", {})
            spec[key].setdefault("objectSelector", {})
            for rule in spec[key].get("resourceRules", []):
                rule.setdefault("scope", "*")
    served["status"] = {"observedGeneration": 1}
    return served


def test_what_the_server_adds_and_message_wording_change_nothing() -> None:
    served = [as_served(d) for d in shipped()]
    for document in served:
        for validation in document["spec"].get("validations", []):
            validation["message"] = "reworded"
            validation.pop("messageExpression", None)
    assert ad.compare(served).intact


Mutation = Callable[[list[dict[str, Any]]], None]


def _set(kind: str, name: str, edit: Callable[[dict[str, Any]], None]) -> Mutation:
    return lambda docs: edit(find(docs, kind, name)["spec"])


VAP, VAPB = "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"
EVIDENCE = "coroner-retire-requires-evidence"
WEAKENINGS: dict[str, tuple[Mutation, tuple[str, str], str]] = {
    "failure-policy-ignore": (
        _set(VAP, EVIDENCE, lambda s: s.update(failurePolicy="Ignore")),
        (VAP, EVIDENCE),
        "differs",
    ),
    "expression-true": (
        _set(VAP, EVIDENCE, lambda s: s["validations"][5].update(expression="true")),
        (VAP, EVIDENCE),
        "differs",
    ),
    "operation-dropped": (
        _set(VAP, EVIDENCE, lambda s: s["matchConstraints"]["resourceRules"][0].update(operations=["CREATE"])),
        (VAP, EVIDENCE),
        "differs",
    ),
    "match-condition-dropped": (
        _set(VAP, "coroner-agent-attests-own-node-only", lambda s: s.pop("matchConditions")),
        (VAP, "coroner-agent-attests-own-node-only"),
        "differs",
    ),
    "variable-changed": (
        _set(VAP, "coroner-status-fields-by-identity", lambda s: s["variables"][0].update(expression="true")),
        (VAP, "coroner-status-fields-by-identity"),
        "differs",
    ),
    "binding-warns-only": (
        _set(VAPB, EVIDENCE, lambda s: s.update(validationActions=["Warn"])),
        (VAPB, EVIDENCE),
        "differs",
    ),
    "binding-narrowed": (
        _set(VAPB, EVIDENCE, lambda s: s.update(matchResources={"namespaceSelector": {"matchLabels": {"x": "y"}}})),
        (VAPB, EVIDENCE),
        "differs",
    ),
    "binding-of-another-policy": (
        _set(VAPB, EVIDENCE, lambda s: s.update(policyName="coroner-node-label-matches-spec")),
        (VAPB, EVIDENCE),
        "differs",
    ),
    "crd-without-status-subresource": (
        lambda docs: find(docs, *ad.CRD)["spec"]["versions"][0].pop("subresources"),
        ad.CRD,
        "differs",
    ),
    "crd-spec-rule-dropped": (
        lambda docs: find(docs, *ad.CRD)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].pop(
            "x-kubernetes-validations"
        ),
        ad.CRD,
        "differs",
    ),
    "crd-bound-widened": (
        lambda docs: find(docs, *ad.CRD)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"][
            "properties"
        ]["conditions"].update(maxItems=1000),
        ad.CRD,
        "differs",
    ),
    "crd-deleted": (lambda docs: docs.remove(find(docs, *ad.CRD)), ad.CRD, "missing"),
    "policy-deleted": (
        lambda docs: docs.remove(find(docs, VAP, "coroner-delete-only-terminal")),
        (VAP, "coroner-delete-only-terminal"),
        "missing",
    ),
    "binding-deleted": (
        lambda docs: docs.remove(find(docs, VAPB, "coroner-retire-requires-capability")),
        (VAPB, "coroner-retire-requires-capability"),
        "missing",
    ),
}


@pytest.mark.parametrize("case", sorted(WEAKENINGS))
def test_every_weakening_is_reported_by_name(case: str) -> None:
    mutate, which, how = WEAKENINGS[case]
    documents = shipped()
    mutate(documents)
    comparison = ad.compare(documents)
    assert not comparison.intact
    assert (comparison.missing if how == "missing" else comparison.differing) == (which,)
    assert comparison.names() == [f"{which[0]}/{which[1]} ({how})"]


def test_the_node_loss_variant_is_accepted_and_said() -> None:
    documents = shipped()
    index = documents.index(find(documents, *ad.EVIDENCE_POLICY))
    documents[index] = ad.with_node_loss(documents[index])
    comparison = ad.compare(documents)
    assert comparison.intact and comparison.node_loss
    assert not ad.compare(SHIPPED).node_loss


def test_an_install_in_another_namespace_compares_with_its_identities() -> None:
    text = yaml.safe_dump_all(SHIPPED).replace("serviceaccount:coroner-system:", "serviceaccount:tenant-a:")
    text = text.replace("kubernetes.io/metadata.name: coroner-system", "kubernetes.io/metadata.name: tenant-a")
    assert "tenant-a" in text
    moved = [d for d in yaml.safe_load_all(text) if d]
    assert not ad.compare(moved).intact
    assert ad.compare(moved, system_namespace="tenant-a").intact


AGENT_POLICY = (VAP, "coroner-agent-attests-own-node-only")
SHIPPED_AGENT = "system:serviceaccount:coroner-system:coroner-agent"


def as_released(namespace: str, prefix: str) -> list[dict[str, Any]]:
    """The manifests as the Helm chart renders them for a release (coroner_dev.chart: in every
    string the identities take the release's namespace and namePrefix, then every other
    coroner-system its namespace; the objects keep their names)."""
    identity = f"system:serviceaccount:{namespace}:{prefix}coroner-"
    released = []
    for document in shipped():
        text = json.dumps(document["spec"]).replace("system:serviceaccount:coroner-system:coroner-", identity)
        released.append({**document, "spec": json.loads(text.replace("coroner-system", namespace))})
        if document["kind"] == VAPB:  # the binding names its policy, which keeps its name
            released[-1]["spec"]["policyName"] = document["spec"]["policyName"]
    return released


@pytest.mark.parametrize(
    ("namespace", "prefix"),
    [
        pytest.param("coroner-system", "acme-", id="name-prefix"),
        pytest.param("acme-coroner", "", id="other-namespace"),
        pytest.param("acme-coroner", "acme-", id="both"),
    ],
)
def test_a_policy_naming_the_shipped_identity_differs_in_a_release_with_other_names(
    namespace: str, prefix: str
) -> None:
    # Policy 3 edited to name the shipped agent: it no longer matches the release's own (prefixed or
    # namespaced) agent, while policy 4 still exempts that agent, which may then write any status.
    # The release's identities are what its policies must name; the shipped ones are other users.
    released = as_released(namespace, prefix)
    assert ad.compare(released, system_namespace=namespace, name_prefix=prefix).intact
    condition = find(released, *AGENT_POLICY)["spec"]["matchConditions"][0]
    assert (
        condition["expression"]
        == f"request.userInfo.username == 'system:serviceaccount:{namespace}:{prefix}coroner-agent'"
    )
    condition["expression"] = f"request.userInfo.username == '{SHIPPED_AGENT}'"
    comparison = ad.compare(released, system_namespace=namespace, name_prefix=prefix)
    assert comparison.differing == (AGENT_POLICY,), comparison.names()


def test_the_release_names_are_not_read_into_other_text() -> None:
    # The release's names are marked where they stand; text that merely resembles them is content.
    released = as_released("acme-coroner", "acme-")
    variables = find(released, VAP, "coroner-status-fields-by-identity")["spec"]["variables"]
    variables[0]["expression"] = variables[0]["expression"].replace("acme-coroner-operator", "acme-coroner-operatorx")
    assert not ad.compare(released, system_namespace="acme-coroner", name_prefix="acme-").intact


@given(st.text(min_size=1, max_size=40))
def test_any_other_expression_is_another_digest(text: str) -> None:
    documents = shipped()
    policy = find(documents, VAP, "coroner-node-label-matches-spec")
    original = policy["spec"]["validations"][0]["expression"]
    policy["spec"]["validations"][0]["expression"] = text
    changed = ad.digest(policy) != ad.EXPECTED[(VAP, "coroner-node-label-matches-spec")]
    assert changed == (text != original)


def test_doctor_compares_content_and_names_what_differs() -> None:
    documents = shipped()
    admission = {kind: [d for d in documents if d["kind"] == kind] for kind in (*ad.KINDS, *doctor.LEFTOVER_KINDS)}
    choice = plan.choose_policy(published=Policy(), flags={}, system_namespace=ad.SHIPPED_NAMESPACE)
    crd = find(documents, *ad.CRD)
    check = doctor.check_admission_content(admission=admission, crd=crd, policy=choice)
    assert check.status == doctor.CheckStatus.PASS, check.summary
    # The names-only check passes a binding narrowed to one namespace; the content check does not.
    find(documents, VAPB, EVIDENCE)["spec"]["matchResources"] = {"namespaceSelector": {"matchLabels": {"a": "b"}}}
    assert doctor.check_admission_policies(admission=admission).status == doctor.CheckStatus.PASS
    check = doctor.check_admission_content(admission=admission, crd=crd, policy=choice)
    assert check.status == doctor.CheckStatus.FAIL
    assert check.objects == (f"{VAPB}/{EVIDENCE}",)
    assert "differs" in check.summary
    unreadable = doctor.check_admission_content(
        admission={**admission, VAP: doctor.Unreadable(reason="forbidden")}, crd=crd, policy=choice
    )
    assert unreadable.status == doctor.CheckStatus.UNKNOWN
    assert unreadable.summary == "ValidatingAdmissionPolicies could not be read: forbidden."


@pytest.mark.parametrize(
    ("policy", "node_evidence"),
    [
        pytest.param(Policy(), True, id="defaults-out-of-service-evidence"),
        pytest.param(Policy(node_out_of_service_evidence=False), False, id="none"),
        pytest.param(Policy(node_deletion_evidence=True, node_out_of_service_evidence=False), True, id="deletion"),
    ],
)
def test_the_node_loss_variant_is_accepted_only_for_an_operator_using_node_evidence(
    policy: Policy, node_evidence: bool
) -> None:
    assert ad.uses_node_evidence(policy) is node_evidence
    alternates = ad.accepted_alternates(node_evidence=node_evidence)
    variant = [ad.with_node_loss(d) if ad.key(d) == ad.EVIDENCE_POLICY else d for d in shipped()]
    assert ad.compare(variant, alternates=alternates).intact is node_evidence
    assert ad.compare(shipped(), alternates=alternates).intact


@pytest.mark.parametrize(
    ("written", "normal"),
    [
        ("a ==\n\n  b", "a == b"),
        ("  a\t&&\n b  ", "a && b"),
        ("x == 'two  spaces\n kept'", "x == 'two  spaces\n kept'"),
        ('x == "it\'s  \\"q\\"  "  &&  y', 'x == "it\'s  \\"q\\"  " && y'),
    ],
)
def test_whitespace_outside_literals_is_not_content(written: str, normal: str) -> None:
    assert ad.normalize_expression(written) == normal


@given(st.text(alphabet=" \n\tab=&'", max_size=30))
def test_normalizing_is_idempotent(expression: str) -> None:
    once = ad.normalize_expression(expression)
    assert ad.normalize_expression(once) == once


def _counting_essence(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    original = ad.essence

    def counted(*args: Any, **kwargs: Any) -> dict[str, Any]:
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(ad, "essence", counted)
    return calls


def test_an_object_digested_before_is_not_digested_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # A restarted operator (and every refresh whose listing changed) compares objects this process
    # has digested before: the answer is remembered by the object's exact JSON.
    documents = shipped()
    ad.compare(documents)
    calls = _counting_essence(monkeypatch)
    assert ad.compare(copy.deepcopy(documents)).intact
    assert calls[0] == 0
    reordered = [dict(reversed(list(d.items()))) for d in documents]  # key order is not content
    assert ad.compare(reordered).intact


def _evidence_binding(documents: list[dict[str, Any]]) -> dict[str, Any]:
    return find(documents, VAPB, EVIDENCE)


def _rules(policy: dict[str, Any]) -> list[Any]:
    return policy["spec"]["matchConstraints"]["resourceRules"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda p: p["spec"].update(failurePolicy="Ignore"), id="edited-in-place"),
        pytest.param(lambda p: _rules(p).append({"apiGroups": ["*"]}), id="a-list-grown-in-place"),
    ],
)
def test_a_changed_object_is_digested_as_changed_after_its_original_was_remembered(
    change: Callable[[dict[str, Any]], None],
) -> None:
    policy = find(shipped(), *ad.EVIDENCE_POLICY)
    expected = ad.EXPECTED[ad.EVIDENCE_POLICY]
    assert ad.digest(policy) == expected  # remembered
    fresh = copy.deepcopy(policy)
    change(policy)  # the very object remembered, changed afterwards
    change(fresh)
    assert ad.digest(policy) == ad.digest(fresh) == _uncached(fresh) != expected
    assert ad.digest(find(shipped(), *ad.EVIDENCE_POLICY)) == expected


def test_a_tuple_is_not_taken_for_the_list_of_the_same_json() -> None:
    # JSON writes a tuple as a list: the same text, and another digest (the scope default is filled
    # in lists only). The manifests state `scope: "*"`; without it, as the API server's default.
    policy = find(shipped(), *ad.EVIDENCE_POLICY)
    expected = ad.EXPECTED[ad.EVIDENCE_POLICY]
    for rule in _rules(policy):
        assert rule.pop("scope") == "*"
    assert ad.digest(policy) == expected  # remembered by its JSON
    policy["spec"]["matchConstraints"]["resourceRules"] = tuple(_rules(policy))
    assert ad.digest(policy) == _uncached(policy) != expected


class _Name(enum.StrEnum):
    EVIDENCE = EVIDENCE


def test_the_memo_tells_apart_what_python_calls_equal() -> None:
    # 1, 1.0 and True are equal in Python and three different JSON values (and digests).
    numbers = [{**_evidence_binding(shipped()), "spec": {"policyName": EVIDENCE, "paramRef": value}}
               for value in (1, 1.0, True, "1")]  # fmt: skip
    for _ in range(2):
        found = [ad.digest(d) for d in numbers]
        assert found == [_uncached(d) for d in numbers]
        assert len(set(found)) == 4
    # A subclass of a builtin type is digested, not remembered.
    named = {**numbers[0], "spec": {**numbers[0]["spec"], "policyName": _Name.EVIDENCE}}
    assert ad.digest(named) == _uncached(named) == found[0]
    # A namespace or prefix is part of the question.
    moved = ad.digest(numbers[0], system_namespace="tenant-a")
    assert moved == _uncached(numbers[0], system_namespace="tenant-a")


def _uncached(document: dict[str, Any], *, system_namespace: str = ad.SHIPPED_NAMESPACE) -> str:
    """The digest computed without the memo: the SHA-256 of the essence's canonical JSON."""
    return hashlib.sha256(ad.canonical(document, system_namespace=system_namespace).encode()).hexdigest()


def test_the_memo_is_bounded() -> None:
    binding = _evidence_binding(shipped())
    for index in range(ad.DIGEST_MEMO_VERSIONS + 3):  # versions of one object
        ad.digest({**binding, "spec": {"policyName": f"p{index}"}})
    assert len(ad._DIGESTS[(VAPB, EVIDENCE, ad.SHIPPED_NAMESPACE, "")]) == ad.DIGEST_MEMO_VERSIONS
    for index in range(ad.DIGEST_MEMO_SIZE + 10):  # objects
        ad.digest({**binding, "metadata": {"name": f"b{index}"}})
    assert len(ad._DIGESTS) <= ad.DIGEST_MEMO_SIZE
