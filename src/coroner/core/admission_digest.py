"""The admission policies as content, not names: what a cluster must have for Coroner to be safe.

With them, the WorkerRegistration CRD's status subresource, spec rule and bounds (`CRD`).

Every rule the API server enforces for Coroner (manifests/base/admission-policies.yaml) is one
policy object and one binding. Deleting either, or narrowing it (a weaker expression, a
`failurePolicy: Ignore`, a match rule that misses a resource or operation, a binding that only
`Warn`s or is scoped to some namespaces), silently removes the rule. This module reduces each
object to its *essence* — exactly the fields that decide what is admitted: expressions
(validations, match conditions, variables, mutations), failurePolicy, match rules, binding actions
and binding scope, and not the wording of messages — with the API server's defaults filled in, and
hashes it (SHA-256 of canonical JSON, the release's own identities and namespace marked where they
stand: `canonical`). `compare` says, per expected object, whether the cluster has it with that
content.

`EXPECTED` holds the digests of the shipped manifests (tests/unit/test_admission_digest.py
recomputes them from the YAML, so they cannot drift). `NODE_LOSS_ALTERNATES` holds the one variant
components/node-loss makes: the evidence policy with the operator's node-evidence opt-in on.

Pure: no I/O. The operator retires nothing unless `compare(...).intact` with the alternates its
policy accepts (`accepted_alternates`; AdmissionPoliciesUnverified), and `kubectl coroner doctor`
compares the same objects the same way (docs/security.md).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import marshal
from collections.abc import Iterable, Mapping
from typing import Any, Final, cast

from coroner.core import api
from coroner.core.decision import Policy

#: The kinds whose objects are admission rules, and which part of `spec` decides what is admitted.
_ESSENTIAL_SPEC: Final[Mapping[str, tuple[str, ...]]] = {
    "ValidatingAdmissionPolicy": (
        "failurePolicy",
        "paramKind",
        "matchConstraints",
        "matchConditions",
        "variables",
        "validations",
        "auditAnnotations",
    ),
    "ValidatingAdmissionPolicyBinding": ("policyName", "paramRef", "matchResources", "validationActions"),
}
#: The admission kinds Coroner ships, and so verifies (with the CRD): no mutating policy is needed,
#: so an API server that does not serve that API is no reason to stop retiring.
KINDS: Final = tuple(_ESSENTIAL_SPEC)

#: The WorkerRegistration CRD is verified with the policies: without its status subresource a
#: main-resource writer sets status past policy 4, and its `self == oldSelf` spec rule and its bounds
#: are rules the policies rely on. Its essence: per version, served/storage, the subresources and the
#: schema with descriptions and messages left out.
CRD_KIND: Final = "CustomResourceDefinition"
CRD: Final = (CRD_KIND, "workerregistrations.coroner.dev")
#: What a schema node says that does not decide admission.
_CRD_WORDING: Final = frozenset({"description", "message", "messageExpression"})

#: The shipped operator and agent identities, written into the expressions in this namespace.
SHIPPED_NAMESPACE: Final = api.SYSTEM_NAMESPACE
#: The label by which the Leases' policy selects the system namespace.
_NAMESPACE_LABEL: Final = "kubernetes.io/metadata.name"

#: (kind, name) -> digest of the shipped manifests/base/admission-policies.yaml and crd.yaml.
EXPECTED: Final[Mapping[tuple[str, str], str]] = {
    (
        "CustomResourceDefinition",
        "workerregistrations.coroner.dev",
    ): "7965bed802faabc5b2b3b791eabbc3309ecb2d7d0c5fba204d2f7d51b96652af",
    (
        "ValidatingAdmissionPolicy",
        "coroner-agent-attests-own-node-only",
    ): "56b5bd31c4b214bce68fa341fb3aa6ae2090274de2b98d4ff290df124c4b1829",
    (
        "ValidatingAdmissionPolicy",
        "coroner-agent-renews-own-lease-only",
    ): "a0743659170e64d204741450b248626a2fbb56cd00460641959798a457c79da5",
    (
        "ValidatingAdmissionPolicy",
        "coroner-delete-only-terminal",
    ): "691b65cf9ce82c52f46bd14fb10267a8a0c2a69ec97f908ee63b1a1054e09364",
    (
        "ValidatingAdmissionPolicy",
        "coroner-node-label-matches-spec",
    ): "937b3d7f7f4a3896bdd29c9d1f04c9ee21bd95ae2f56703cab27b001539fc2a8",
    (
        "ValidatingAdmissionPolicy",
        "coroner-registrant-recorded",
    ): "8811d9e220336f95ac903b0cda3509bd7dce31922d53187845e6310f0e20d188",
    (
        "ValidatingAdmissionPolicy",
        "coroner-retire-requires-capability",
    ): "a40349298ee79c891e4623a975930d1920300a175b8f7ed150dfc00a943527ba",
    (
        "ValidatingAdmissionPolicy",
        "coroner-retire-requires-evidence",
    ): "634119069d0d88e53e0e56b02a6d26a214098da8b252f89301f4acc6c44cccc7",
    (
        "ValidatingAdmissionPolicy",
        "coroner-status-fields-by-identity",
    ): "047e8e98ed2251239aa18714e7e2d909d63d0376e1db98c075a42c68ab955b0e",
    (
        "ValidatingAdmissionPolicy",
        "coroner-system-leases-by-owner",
    ): "567598e2a821789d4ce665c5e62eec58f3f06328f8da6d6846d06e1022219211",
    (
        "ValidatingAdmissionPolicy",
        "coroner-system-tokens-by-kubelet",
    ): "1e8aec3bd64f721f08f72b36e1c00b6792b93feb9a3edf263c4ab019317b5a17",
    (
        "ValidatingAdmissionPolicyBinding",
        "coroner-agent-attests-own-node-only",
    ): "8f41c3fec8e92c12881dd6bb60745f1a0442effe1fbbd9576bde16763597b796",
    (
        "ValidatingAdmissionPolicyBinding",
        "coroner-agent-renews-own-lease-only",
    ): "966d1dc1588351469ff5a7f7b6cc23c244c89b25cfaff6cf7250461bc4615ef5",
    (
        "ValidatingAdmissionPolicyBinding",
        "coroner-delete-only-terminal",
    ): "5eadd1b20d9763ab02449f3058b501c5fe979957d2bfaf75878d39b393855ee5",
    (
        "ValidatingAdmissionPolicyBinding",
        "coroner-node-label-matches-spec",
    ): "109f0d38a2a5ed59702198435d408b377a2065be00d1e6d7221d17481bfd84b4",
    (
        "ValidatingAdmissionPolicyBinding",
        "coroner-registrant-recorded",
    ): "dcc84224ec55c9d1d6b45eee14e910349a6b8fd8b69240b8d982ad31e9dc733a",
    (
        "ValidatingAdmissionPolicyBinding",
        "coroner-retire-requires-capability",
    ): "646dca1cc8edf5e143b5345b69426dd1abc29e1fc5818a7271952fd2fd75ccac",
    (
        "ValidatingAdmissionPolicyBinding",
        "coroner-retire-requires-evidence",
    ): "59001dc0afcad93344a32bd678793a30d0ab59510dbc96bf58f1356c451b0e6c",
    (
        "ValidatingAdmissionPolicyBinding",
        "coroner-status-fields-by-identity",
    ): "6a3071177018679a835b5d4fa105e7777f60c38fb8cd0113a7bf459225e343e0",
    (
        "ValidatingAdmissionPolicyBinding",
        "coroner-system-leases-by-owner",
    ): "7c0cc19d11aa510d6238b06a6c34e0ee1ae66bbcff53312f35cfbb3ffe7c6756",
    (
        "ValidatingAdmissionPolicyBinding",
        "coroner-system-tokens-by-kubelet",
    ): "ad2ae9cf3e83bb4bd61fedf672d7ff08960764399e1587cb1b46a47c9bed395e",
}

#: The variants components/node-loss installs instead of the base object: (kind, name) -> digest.
NODE_LOSS_ALTERNATES: Final[Mapping[tuple[str, str], str]] = {
    (
        "ValidatingAdmissionPolicy",
        "coroner-retire-requires-evidence",
    ): "5a607c7c8c443231db90edcdf6f94752d8217fda6422d3c1f5d72286f0ff82bd",
}

#: The variables of the evidence policy that components/node-loss turns to "true".
NODE_LOSS_VARIABLES: Final = ("operatorMayUseNodeDeleted", "operatorMayUseNodeOutOfService")
EVIDENCE_POLICY: Final = ("ValidatingAdmissionPolicy", "coroner-retire-requires-evidence")
#: The policy that checks the `retire` verb on a retirement write (its refusal: the verb is missing).
CAPABILITY_POLICY: Final = ("ValidatingAdmissionPolicy", "coroner-retire-requires-capability")


def uses_node_evidence(policy: Policy) -> bool:
    """Whether an operator running with `policy` retires on node evidence (a Node deleted, or the
    out-of-service taint): then components/node-loss's evidence policy is the one it needs."""
    return policy.node_deletion_evidence or policy.node_out_of_service_evidence


def accepted_alternates(*, node_evidence: bool) -> Mapping[tuple[str, str], str]:
    """The variants accepted in place of the base objects (`compare`'s `alternates`): the node-loss
    evidence policy only for an operator that uses node evidence (`uses_node_evidence`); for one
    that does not, it admits more than that operator needs, so it differs. The operator verifies
    its policies with these, and ``kubectl coroner doctor`` with the operator's published policy."""
    return NODE_LOSS_ALTERNATES if node_evidence else {}


def _with_match_defaults(match: Any) -> Any:
    """A matchConstraints / matchResources with the API server's defaults filled in."""
    if not isinstance(match, Mapping):
        return match
    filled = dict(match)
    filled.setdefault("matchPolicy", "Equivalent")
    filled.setdefault("namespaceSelector", {})
    filled.setdefault("objectSelector", {})
    for key in ("resourceRules", "excludeResourceRules"):
        rules = filled.get(key)
        if isinstance(rules, list):
            filled[key] = [{**rule, "scope": rule.get("scope", "*")} if isinstance(rule, Mapping) else rule
                           for rule in rules]  # fmt: skip
    return filled


def normalize_expression(expression: str) -> str:
    """A CEL expression with each run of whitespace outside string literals made one space.

    CEL ignores that whitespace, and YAML parsers disagree on it (a folded scalar's more-indented
    lines keep one newline in PyYAML and two in the API server's parser); string literals keep
    theirs exactly."""
    out: list[str] = []
    quote: str | None = None
    escaped = False
    pending_space = False
    for char in expression:
        if quote is not None:
            out.append(char)
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = None
            continue
        if char.isspace():
            pending_space = bool(out)
            continue
        if pending_space:
            out.append(" ")
            pending_space = False
        out.append(char)
        if char in "'\"":
            quote = char
    return "".join(out)


def _normalize_expressions(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {
            k: normalize_expression(v) if k == "expression" and isinstance(v, str) else _normalize_expressions(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_normalize_expressions(item) for item in value]
    return value


def _without_wording(value: Any) -> Any:
    """A schema without its wording, each CEL rule's whitespace made one space (`normalize_expression`)."""
    if isinstance(value, Mapping):
        return {
            k: normalize_expression(v) if k == "rule" and isinstance(v, str) else _without_wording(v)
            for k, v in value.items()
            if k not in _CRD_WORDING
        }
    if isinstance(value, list):
        return [_without_wording(item) for item in value]
    return value


def _crd_essence(document: Mapping[str, Any]) -> dict[str, Any]:
    """What of the CRD the policies rely on: group and scope, and per version whether it is served
    and stored, its subresources (status) and its schema (rules, bounds, types), wording left out."""
    spec = document.get("spec") or {}
    versions = [
        {
            "name": version.get("name"),
            "served": version.get("served"),
            "storage": version.get("storage"),
            "subresources": version.get("subresources") or {},
            "schema": _without_wording(version.get("schema") or {}),
        }
        for version in spec.get("versions") or []
    ]
    return {"group": spec.get("group"), "scope": spec.get("scope"), "versions": versions}


def essence(document: Mapping[str, Any]) -> dict[str, Any]:
    """What decides admission in one policy or binding, defaults filled, messages left out: the
    objects' own text, the identities in it as written (`canonical` marks the release's)."""
    kind = str(document.get("kind") or "")
    if kind == CRD_KIND:
        return _crd_essence(document)
    fields = _ESSENTIAL_SPEC.get(kind)
    if fields is None:
        raise ValueError(f"not an admission policy or binding: kind {kind!r}")
    spec = document.get("spec") or {}
    kept: dict[str, Any] = {key: copy.deepcopy(spec[key]) for key in fields if key in spec}
    for key in ("matchConstraints", "matchResources"):
        if key in kept:
            kept[key] = _with_match_defaults(kept[key])
    if kind.startswith("Validating") and not kind.endswith("Binding"):
        kept.setdefault("failurePolicy", "Fail")
        kept["validations"] = [{"expression": v.get("expression")} for v in kept.get("validations") or []]
    if kind.startswith("Mutating") and not kind.endswith("Binding"):
        kept.setdefault("failurePolicy", "Fail")
        kept.setdefault("reinvocationPolicy", "Never")
    result: dict[str, Any] = _normalize_expressions(kept)
    return result


#: The release's own names as the policies write them, each with the mark `canonical` puts in its
#: place: a control character, which JSON text never holds raw (`json.dumps` escapes every one in a
#: string), so no object's content can read as a mark.
_AGENT_MARK: Final = "\x01"
_OPERATOR_MARK: Final = "\x02"
_NAMESPACE_MARK: Final = "\x03"


def canonical(document: Mapping[str, Any], *, system_namespace: str = SHIPPED_NAMESPACE, name_prefix: str = "") -> str:
    """The canonical JSON of `essence(document)`, with the release's own names marked.

    A release names its own operator and agent (`system:serviceaccount:<namespace>:<namePrefix>
    coroner-operator`, `-agent`) and its namespace (the Leases' namespaceSelector) where the
    manifests name the shipped ones; exactly those are replaced by a mark, and the shipped
    manifests' digests are taken with theirs marked. Any other name stays as written: a policy of a
    prefixed or namespaced release that names the shipped agent (which is not that release's agent,
    so the rule no longer holds it) differs. The marks cannot occur in the text, so two objects
    with one canonical text are one object with the release's names in the same places."""
    text = json.dumps(essence(document), sort_keys=True, separators=(",", ":"))
    identity = f"system:serviceaccount:{system_namespace}:{name_prefix}"
    for written, mark in (
        (f"'{identity}coroner-agent'", f"'{_AGENT_MARK}'"),
        (f"'{identity}{api.OPERATOR_SERVICE_ACCOUNT}'", f"'{_OPERATOR_MARK}'"),
        (f'"{_NAMESPACE_LABEL}":"{system_namespace}"', f'"{_NAMESPACE_LABEL}":"{_NAMESPACE_MARK}"'),
    ):
        text = text.replace(written, mark)
    return text


#: How many objects a process remembers the digests of (`digest`), and how many versions of each:
#: a listing is about twenty objects, and a refresh that finds one changed adds a version of it.
DIGEST_MEMO_SIZE: Final = 64
DIGEST_MEMO_VERSIONS: Final = 4
#: (kind, name, system_namespace, name_prefix) -> [(the object's marshal serialization, its digest)],
#: the newest first.
_DIGESTS: dict[tuple[str, str, str, str], list[tuple[bytes, str]]] = {}


def digest(document: Mapping[str, Any], *, system_namespace: str = SHIPPED_NAMESPACE, name_prefix: str = "") -> str:
    """SHA-256 of `canonical(document)`: its essence, the release's own names marked.

    Remembered in the process by the whole object's value, never by its name or resourceVersion
    alone: a restarted operator, a refresh that found one object changed, and `doctor` digest
    objects this process has digested before, and the essence costs about a hundred times the
    comparison. The value compared is the object's `marshal` serialization (format 2: no
    back-references, so it depends on nothing but the value): every type exact (1, 1.0 and True, a
    list and a tuple are different bytes; a subclass of a builtin type cannot be written and is
    digested without the memo), so equal bytes are an equal object and the same digest. The bytes
    are compared whole (filed under the object's kind and name, not hashed: hashing them costs more
    than comparing them). Dict order is in the bytes: the same object listed in another key order
    is digested again, to the same digest."""
    try:
        value = marshal.dumps(cast(Any, document), 2)
    except ValueError:  # not plain data (a Mapping that is no dict, a subclass, too deep)
        return _digest(document, system_namespace=system_namespace, name_prefix=name_prefix)
    kind, name = key(document)
    versions = _DIGESTS.get((kind, name, system_namespace, name_prefix))
    if versions is None:
        if len(_DIGESTS) >= DIGEST_MEMO_SIZE:
            _DIGESTS.clear()
        versions = _DIGESTS[(kind, name, system_namespace, name_prefix)] = []
    for remembered, answer in versions:
        if remembered == value:
            return answer
    answer = _digest(document, system_namespace=system_namespace, name_prefix=name_prefix)
    versions.insert(0, (value, answer))
    del versions[DIGEST_MEMO_VERSIONS:]
    return answer


def _digest(document: Mapping[str, Any], *, system_namespace: str, name_prefix: str) -> str:
    text = canonical(document, system_namespace=system_namespace, name_prefix=name_prefix)
    return hashlib.sha256(text.encode()).hexdigest()


def key(document: Mapping[str, Any]) -> tuple[str, str]:
    return str(document.get("kind") or ""), str((document.get("metadata") or {}).get("name") or "")


def digests(
    documents: Iterable[Mapping[str, Any]], *, system_namespace: str = SHIPPED_NAMESPACE, name_prefix: str = ""
) -> dict[tuple[str, str], str]:
    """(kind, name) -> digest of every admission policy and binding among `documents`."""
    return {
        key(document): digest(document, system_namespace=system_namespace, name_prefix=name_prefix)
        for document in documents
        if isinstance(document, Mapping) and (document.get("kind") in _ESSENTIAL_SPEC or key(document) == CRD)
    }


def with_node_loss(document: Mapping[str, Any]) -> dict[str, Any]:
    """The evidence policy as components/node-loss patches it (the operator's opt-in variables true)."""
    patched = copy.deepcopy(dict(document))
    for variable in (patched.get("spec") or {}).get("variables") or []:
        if variable.get("name") in NODE_LOSS_VARIABLES:
            variable["expression"] = "true"
    return patched


@dataclasses.dataclass(frozen=True, kw_only=True)
class Comparison:
    """How the cluster's admission objects compare with the expected ones."""

    missing: tuple[tuple[str, str], ...]
    """Expected and absent."""
    differing: tuple[tuple[str, str], ...]
    """Present with other content (weaker or not: any change is reported)."""
    node_loss: bool
    """The evidence policy is the node-loss variant (the operator may retire on node evidence)."""

    @property
    def intact(self) -> bool:
        return not self.missing and not self.differing

    def names(self) -> list[str]:
        return [f"{kind}/{name} ({'missing' if (kind, name) in self.missing else 'differs'})"
                for kind, name in sorted((*self.missing, *self.differing))]  # fmt: skip


def compare(
    actual: Iterable[Mapping[str, Any]],
    *,
    expected: Mapping[tuple[str, str], str] = EXPECTED,
    alternates: Mapping[tuple[str, str], str] = NODE_LOSS_ALTERNATES,
    system_namespace: str = SHIPPED_NAMESPACE,
    name_prefix: str = "",
) -> Comparison:
    """Every expected object present with its expected digest (or its node-loss alternate)."""
    found = digests(actual, system_namespace=system_namespace, name_prefix=name_prefix)
    missing = tuple(sorted(k for k in expected if k not in found))
    differing = tuple(sorted(k for k in expected if k in found and found[k] not in (expected[k], alternates.get(k))))
    node_loss = EVIDENCE_POLICY in alternates and found.get(EVIDENCE_POLICY) == alternates[EVIDENCE_POLICY]
    return Comparison(missing=missing, differing=differing, node_loss=node_loss)
