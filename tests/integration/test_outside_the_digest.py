"""What the admission digest does not cover, and `kubectl coroner doctor` must still see.

- A MutatingAdmissionPolicy (or a mutating webhook) that matches registrations runs before every
  validation: it rewrites an agent's `Alive` to `Dead` in the agent's own write, which policy 3 then
  admits as the agent's. Only a cluster administrator can install one; doctor's `admission-mutation`
  FAILs naming it.
- The agent's seccomp profile comes from a ConfigMap that its init container installs on each node: a
  rewritten ConfigMap unconfines every agent at its next restart. Doctor's `agent-seccomp` FAILs naming
  it.

Real API server and admission; the real `kubectl coroner doctor` (in-process).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.client.kube import api_client
from coroner.core import api
from coroner_dev.devcluster.cluster import Cluster
from integration.test_kubectl_plugin import as_json, coroner
from support import components, kube

pytestmark = [pytest.mark.integration]

SYSTEM = api.SYSTEM_NAMESPACE
REWRITER = "rewrites-alive-to-dead"


def doctor_checks(cluster: Cluster) -> dict[str, dict[str, Any]]:
    result = coroner(cluster, "doctor", "-o", "json", kubeconfig=cluster.kubeconfig)
    return {check["name"]: check for check in as_json(result)["checks"]}


@pytest.fixture
def rewriter(granted: Cluster, namespace: str) -> Iterator[str]:
    """A MutatingAdmissionPolicy that turns the agent's Alive into Dead, in `namespace` only."""
    documents = [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingAdmissionPolicy",
            "metadata": {"name": REWRITER},
            "spec": {
                "failurePolicy": "Fail",
                "reinvocationPolicy": "Never",
                "matchConstraints": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                    "resourceRules": [
                        {
                            "apiGroups": [api.GROUP],
                            "apiVersions": ["*"],
                            "resources": ["workerregistrations/status"],
                            "operations": ["UPDATE"],
                        }
                    ],
                },
                "matchConditions": [
                    {
                        "name": "the-agent-says-alive",
                        "expression": "request.userInfo.username == "
                        f"'system:serviceaccount:{SYSTEM}:coroner-agent' && "
                        "object.?status.?attestation.?verdict.orValue('') == 'Alive'",
                    }
                ],
                "mutations": [
                    {
                        "patchType": "JSONPatch",
                        "jsonPatch": {
                            "expression": '[JSONPatch{op: "replace", path: "/status/attestation/verdict", value: "Dead"}, '
                            'JSONPatch{op: "replace", path: "/status/attestation/evidence", value: "ProcAbsent"}]'
                        },
                    }
                ],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingAdmissionPolicyBinding",
            "metadata": {"name": REWRITER},
            "spec": {"policyName": REWRITER},
        },
    ]
    kube.kubectl(granted, "apply", "-f", "-", stdin=yaml.safe_dump_all(documents))
    try:
        yield REWRITER
    finally:
        kube.kubectl(granted, "delete", "mutatingadmissionpolicybinding,mutatingadmissionpolicy", REWRITER,
                     "--ignore-not-found")  # fmt: skip


def test_a_mutating_policy_rewrites_the_agents_alive_and_doctor_fails_naming_it(
    granted: Cluster, admin: k8s.ApiClient, namespace: str, rewriter: str
) -> None:
    node = f"node-mut-{uuid.uuid4().hex[:6]}"
    kube.create_registration(admin, namespace, kube.registration_body(name="live", node=node))

    def rewritten() -> bool:
        with api_client(components.agent_kubeconfig(granted, node)) as agent:
            try:
                written = components.attest(agent, namespace, "live", verdict="Alive", evidence="PidfdPinned")
            except ApiException as exc:
                if exc.status == 503:  # a new mutating policy on a custom resource: not yet served
                    return False
                raise
        return bool(written["status"]["attestation"]["verdict"] == "Dead")

    # The hole as it stands: what the agent said Alive is stored Dead, admitted as the agent's.
    kube.wait_for(rewritten, timeout=150, interval=1.0, what="the agent's Alive rewritten by the mutating policy")

    check = doctor_checks(granted)["admission-mutation"]
    assert check["status"] == "FAIL", check
    assert f"MutatingAdmissionPolicy/{rewriter}" in check["objects"]
    assert rewriter in check["summary"]
    # Coroner's own registrar injection mutates Pods only: never named.
    assert not any("registrar-injection" in name for name in check["objects"])


def test_a_rewritten_seccomp_configmap_fails_doctor_naming_it(granted: Cluster, admin: k8s.ApiClient) -> None:
    core = k8s.CoreV1Api(admin)
    listed = admin.sanitize_for_serialization(core.list_namespaced_config_map(SYSTEM))["items"]  # type: ignore[no-untyped-call]
    (configmap,) = [item for item in listed if item["metadata"]["name"].startswith("coroner-agent-seccomp")]
    name: str = configmap["metadata"]["name"]
    shipped = dict(configmap["data"])
    assert doctor_checks(granted)["agent-seccomp"]["status"] == "PASS"
    unconfined = json.dumps({"defaultAction": "SCMP_ACT_ALLOW"})
    core.patch_namespaced_config_map(name, SYSTEM, {"data": {"agent-seccomp.json": unconfined}})
    try:
        check = doctor_checks(granted)["agent-seccomp"]
        assert check["status"] == "FAIL", check
        assert f"ConfigMap/{SYSTEM}/{name}" in check["objects"]
        assert name in check["summary"]
    finally:
        core.patch_namespaced_config_map(name, SYSTEM, {"data": shipped})
    assert doctor_checks(granted)["agent-seccomp"]["status"] == "PASS"
