"""The admission policies of a Helm release compare as what they name: the release's own identities.

A release with a namePrefix, or in another namespace than coroner-system, names its own operator
and agent in every policy. Policy 3 (`coroner-agent-attests-own-node-only`) edited to name the
shipped agent instead no longer matches the release's agent, while policy 4 still exempts it: that
agent may then write any status. Against the real API server, with the chart installed by helm and
the operator run as the release's ServiceAccount: unmodified, the operator retires and `kubectl
coroner doctor` passes `admission-content`; edited so, the operator retires nothing
(AdmissionPoliciesUnverified, naming the policy) and doctor FAILs naming it.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from coroner.client.kube import api_client
from coroner.core import api
from coroner.core.reasons import Reason
from coroner_dev.devcluster.cluster import Cluster
from coroner_dev.devcluster.identities import mint_token
from support import components, helm, kube, plugin

pytestmark = pytest.mark.e2e

RELEASE = "coroner"
AGENT_POLICY = "coroner-agent-attests-own-node-only"
SHIPPED_AGENT = f"system:serviceaccount:{api.SYSTEM_NAMESPACE}:coroner-agent"
WORKERS = "identity-workers"


def _helm(cluster: Cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return helm.run("helm", f"--kubeconfig={cluster.kubeconfig}", *args, check=check)


@pytest.fixture
def release_slate(cluster: Cluster) -> Iterator[Cluster]:
    """No kustomize install (the chart's cluster-scoped objects have its names); afterwards the
    release is gone and the kustomize install is back for the tests that follow."""
    production = kube.kubectl(cluster, "kustomize", str(kube.MANIFESTS / "overlays" / "production")).stdout
    kube.kubectl(cluster, "delete", "--ignore-not-found", "--wait=true", "-f", "-", stdin=production)
    try:
        yield cluster
    finally:
        for namespace in (api.SYSTEM_NAMESPACE, "acme-coroner"):
            _helm(cluster, "uninstall", RELEASE, "--namespace", namespace, "--ignore-not-found", check=False)
        kube.kubectl(cluster, "delete", "namespace", "acme-coroner", WORKERS, "--ignore-not-found", "--wait=false")
        kube.install_api(cluster)
        components.install(cluster, grant=False)


def _dead(admin: k8s.ApiClient, agent: k8s.ApiClient, name: str) -> None:
    kube.create_registration(admin, WORKERS, kube.registration_body(name=name, interval=None))
    components.attest(agent, WORKERS, name, evidence="PidfdExited")


def _admission_content(cluster: Cluster, namespace: str) -> dict[str, Any]:
    result = plugin.in_process(
        "doctor", "-o", "json", f"--system-namespace={namespace}", kubeconfig=cluster.kubeconfig,
        env={"COLUMNS": "200"},
    )  # fmt: skip
    checks = {check["name"]: check for check in json.loads(result.stdout)["checks"]}
    return checks["admission-content"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("namespace", "prefix"),
    [
        pytest.param(api.SYSTEM_NAMESPACE, "acme-", id="name-prefix"),
        pytest.param("acme-coroner", "", id="other-namespace"),
    ],
)
def test_a_policy_naming_the_shipped_agent_is_not_intact_for_a_release_with_its_own_names(
    release_slate: Cluster, admin: k8s.ApiClient, tmp_path: pathlib.Path, namespace: str, prefix: str
) -> None:
    cluster = release_slate
    _helm(
        cluster, "install", RELEASE, str(helm.CHART), "--namespace", namespace, "--create-namespace",
        f"--set=namePrefix={prefix}", "--set=retireGrant.enabled=true",
    )  # fmt: skip
    kube.wait_for_crd(cluster)
    agent_user = f"system:serviceaccount:{namespace}:{prefix}coroner-agent"
    condition = json.loads(
        kube.kubectl(cluster, "get", "validatingadmissionpolicy", AGENT_POLICY, "-o", "json").stdout
    )["spec"]["matchConditions"][0]
    assert condition["expression"] == f"request.userInfo.username == '{agent_user}'"
    kube.kubectl(cluster, "create", "namespace", WORKERS)
    agent_config = mint_token(cluster, service_account=f"{namespace}/{prefix}coroner-agent", node="node-a")
    operator_config = mint_token(cluster, service_account=f"{namespace}/{prefix}coroner-operator")
    argv = components.operator_argv(operator_config, f"--system-namespace={namespace}", f"--namespace={WORKERS}")
    with api_client(agent_config) as agent, components.process(argv, log=tmp_path / "operator.log"):
        components.put_agent_lease(
            admin, node="node-a", boot_id=kube.BOOT_ID, host_id=kube.HOST_ID, duration=300, namespace=namespace
        )
        # Unmodified: intact for the release's own operator and for doctor.
        _dead(admin, agent, "before")
        kube.wait_for(lambda: components.retired(admin, WORKERS, "before"), timeout=120, what="retired, intact")
        content = _admission_content(cluster, namespace)
        assert content["status"] == "PASS", content["summary"]

        # Policy 3 names the shipped agent: the release's agent is no longer held to its own node.
        patch = [{"op": "replace", "path": "/spec/matchConditions/0/expression",
                  "value": f"request.userInfo.username == '{SHIPPED_AGENT}'"}]  # fmt: skip
        kube.kubectl(
            cluster, "patch", "validatingadmissionpolicy", AGENT_POLICY, "--type=json", "-p", json.dumps(patch)
        )
        _dead(admin, agent, "after")
        unverified = Reason.ADMISSION_POLICIES_UNVERIFIED.value
        kube.wait_for(
            lambda: components.reason(admin, WORKERS, "after") == unverified, timeout=60, what=f"{unverified}"
        )
        retirable = components.condition(kube.get_registration(admin, WORKERS, "after"), "Retirable")
        assert retirable is not None
        assert f"ValidatingAdmissionPolicy/{AGENT_POLICY} (differs)" in retirable["message"], retirable
        assert not components.retired(admin, WORKERS, "after")
        content = _admission_content(cluster, namespace)
        assert content["status"] == "FAIL", content["summary"]
        assert content["objects"] == [f"ValidatingAdmissionPolicy/{AGENT_POLICY}"], content["summary"]
