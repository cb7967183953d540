"""Admission content as the API server serves it: the objects `kubectl apply -k` installs, and the
CRD, compare intact with coroner.core.admission_digest (the server's defaults and its YAML reading do
not count as changes), and `kubectl coroner doctor` fails on a binding that only warns — which the
names-only check passes — and on a CRD without its status subresource."""

from __future__ import annotations

import json
from typing import Any

import pytest

from coroner.core import admission_digest as ad
from coroner.core import api
from coroner_dev.devcluster.cluster import Cluster
from support import components, kube, plugin

pytestmark = pytest.mark.e2e

KINDS = (
    "validatingadmissionpolicy,validatingadmissionpolicybinding,mutatingadmissionpolicy,mutatingadmissionpolicybinding"
)


def served(cluster: Cluster) -> list[dict[str, Any]]:
    """The admission objects and the CRD, as the API server serves them."""
    items: list[dict[str, Any]] = json.loads(kube.kubectl(cluster, "get", KINDS, "-o", "json").stdout)["items"]
    crd = json.loads(kube.kubectl(cluster, "get", "crd", api.CRD_NAME, "-o", "json").stdout)
    return [*items, crd]


def doctor_checks(cluster: Cluster) -> dict[str, dict[str, Any]]:
    # In-process (`support.plugin`): what doctor concludes is the subject here, not kubectl's plugin path.
    result = plugin.in_process("doctor", "-o", "json", kubeconfig=cluster.kubeconfig, env={"COLUMNS": "200"})
    return {check["name"]: check for check in json.loads(result.stdout)["checks"]}


def test_what_the_server_serves_is_what_ships_and_a_warn_only_binding_is_not(cluster: Cluster) -> None:
    components.install(cluster, grant=False)
    comparison = ad.compare(served(cluster))
    assert comparison.intact, comparison.names()
    assert not comparison.node_loss
    assert doctor_checks(cluster)["admission-content"]["status"] == "PASS"
    binding = "coroner-retire-requires-evidence"
    kube.kubectl(cluster, "patch", "validatingadmissionpolicybinding", binding, "--type=merge",
                 "-p", '{"spec":{"validationActions":["Warn"]}}')  # fmt: skip
    try:
        assert ad.compare(served(cluster)).differing == (("ValidatingAdmissionPolicyBinding", binding),)
        checks = doctor_checks(cluster)
        assert checks["admission-policies"]["status"] == "FAIL"  # no Deny: the names-only check sees it too
        assert checks["admission-content"]["status"] == "FAIL"
        assert checks["admission-content"]["objects"] == [f"ValidatingAdmissionPolicyBinding/{binding}"]
        kube.kubectl(cluster, "patch", "validatingadmissionpolicybinding", binding, "--type=merge",
                     "-p", '{"spec":{"validationActions":["Deny"],"matchResources":{"namespaceSelector":'
                     '{"matchLabels":{"only":"here"}}}}}')  # fmt: skip
        checks = doctor_checks(cluster)
        assert checks["admission-policies"]["status"] == "PASS"  # the names-only check is fooled
        assert checks["admission-content"]["status"] == "FAIL"
    finally:
        # Re-applying does not undo a patch (kubectl apply keeps fields it never set): replace it.
        kube.kubectl(cluster, "delete", "validatingadmissionpolicybinding", binding)
        components.install(cluster, grant=False)
    assert ad.compare(served(cluster)).intact
    components.install(cluster, grant=True, node_loss=True)
    try:
        comparison = ad.compare(served(cluster))
        assert comparison.intact and comparison.node_loss
    finally:
        components.install(cluster, grant=False)


def test_a_crd_without_its_status_subresource_fails_doctor_by_name(cluster: Cluster) -> None:
    """Without the status subresource a main-resource writer sets status past the status policies:
    the CRD is verified with them, and doctor names it and says how to restore it."""
    components.install(cluster, grant=False)
    assert doctor_checks(cluster)["admission-content"]["status"] == "PASS"
    kube.kubectl(cluster, "patch", "crd", api.CRD_NAME, "--type=json",
                 "-p", '[{"op":"remove","path":"/spec/versions/0/subresources"}]')  # fmt: skip
    try:
        assert ad.compare(served(cluster)).differing == (ad.CRD,)
        check = doctor_checks(cluster)["admission-content"]
        assert check["status"] == "FAIL", check
        assert check["objects"] == [f"CustomResourceDefinition/{api.CRD_NAME}"]
        assert f"CustomResourceDefinition/{api.CRD_NAME} (differs)" in check["summary"], check["summary"]
        assert "AdmissionPoliciesUnverified" in check["summary"] and "re-apply the manifests" in check["summary"]
    finally:
        components.install(cluster, grant=False)
    assert ad.compare(served(cluster)).intact
    assert doctor_checks(cluster)["admission-content"]["status"] == "PASS"


#: The status-path mutating policy releases before 2026-12 shipped (with the CRD), as they shipped it.
OLD_STATE_POLICY = """
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: coroner-registration-state}
spec:
  failurePolicy: Ignore
  reinvocationPolicy: IfNeeded
  matchConstraints:
    resourceRules:
      - {apiGroups: [coroner.dev], apiVersions: ["*"], resources: [workerregistrations/status], operations: [UPDATE]}
  mutations:
    - patchType: JSONPatch
      jsonPatch:
        expression: 'has(object.status) ? [JSONPatch{op: "add", path: "/status/state", value: "Active"}] : []'
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: coroner-registration-state}
spec: {policyName: coroner-registration-state}
"""


def test_an_upgrade_that_kept_the_old_status_policy_fails_doctor_until_it_is_deleted(cluster: Cluster) -> None:
    """`kubectl apply -k` prunes nothing, so an upgraded install keeps the old status-path mutating
    policy, which holds every status write up with 503 after an API server restart (finding 7)."""
    components.install(cluster, grant=False)
    kube.kubectl(cluster, "apply", "-f", "-", stdin=OLD_STATE_POLICY)
    try:
        check = doctor_checks(cluster)["admission-policies"]
        assert check["status"] == "FAIL", check
        assert check["objects"] == [
            "MutatingAdmissionPolicy/coroner-registration-state",
            "MutatingAdmissionPolicyBinding/coroner-registration-state",
        ]
        assert "kubectl delete mutatingadmissionpolicy coroner-registration-state" in check["summary"]
    finally:
        kube.kubectl(cluster, "delete", "mutatingadmissionpolicy,mutatingadmissionpolicybinding",
                     "coroner-registration-state", "--ignore-not-found")  # fmt: skip
    assert doctor_checks(cluster)["admission-policies"]["status"] == "PASS"
