"""`helm install` of charts/coroner into the dev cluster, the way a platform team installs it: into
a namespace of its own choosing with a name prefix, so the admission policies must follow the
release's identities; with monitoring on (against the Prometheus Operator's real CRDs); granted and
revoked through values; and `helm uninstall` keeping the CRD and every registration."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.client.kube import api_client
from coroner.core import api
from coroner_dev.devcluster import tools
from coroner_dev.devcluster.cluster import Cluster
from coroner_dev.devcluster.identities import mint_token
from support import components, helm, kube

pytestmark = pytest.mark.e2e

RELEASE = "coroner"
NAMESPACE = "acme-coroner"
PREFIX = "acme-"
OPERATOR = f"system:serviceaccount:{NAMESPACE}:{PREFIX}coroner-operator"
RESOURCE = f"{api.PLURAL}.{api.GROUP}"


def helm_cmd(cluster: Cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return helm.run("helm", f"--kubeconfig={cluster.kubeconfig}", *args, check=check)


def can_i(cluster: Cluster, verb: str, who: str) -> str:
    answer = kube.kubectl(cluster, "auth", "can-i", verb, RESOURCE, "-n", "default", f"--as={who}", check=False)
    return answer.stdout.strip()


@pytest.fixture
def clean_slate(cluster: Cluster) -> Iterator[Cluster]:
    """No kustomize install (its cluster-scoped objects carry the chart's names), the Prometheus
    Operator's CRDs present; afterwards the release is gone and the kustomize API is back for the
    tests that follow in this session."""
    production = kube.kubectl(cluster, "kustomize", str(kube.MANIFESTS / "overlays" / "production")).stdout
    kube.kubectl(cluster, "delete", "--ignore-not-found", "--wait=true", "-f", "-", stdin=production)
    for crd in tools.prometheus_operator_crds().values():
        kube.kubectl(cluster, "apply", "--server-side", "-f", str(crd))
    try:
        yield cluster
    finally:
        helm_cmd(cluster, "uninstall", RELEASE, "--namespace", NAMESPACE, "--ignore-not-found", check=False)
        kube.kubectl(cluster, "delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false")
        kube.install_api(cluster)
        components.install(cluster, grant=False)


def _agent_lease(registration: dict[str, Any]) -> dict[str, Any]:
    """The Lease the agent of the registration's node renews, on the registration's boot."""
    incarnation = registration["spec"]["incarnation"]
    node = registration["spec"]["nodeName"]
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": f"{api.AGENT_LEASE_PREFIX}{node}",
            "namespace": NAMESPACE,
            "annotations": {
                api.AGENT_LEASE_BOOT_ID: incarnation["bootId"],
                api.AGENT_LEASE_HOST_ID: incarnation["hostId"],
            },
        },
        "spec": {"holderIdentity": f"agent-{node}", "leaseDurationSeconds": 300, "renewTime": components.now_text()},
    }


def _doctor_as_a_planner_knows_the_prefix(cluster: Cluster, admin: k8s.ApiClient) -> None:
    """`kubectl coroner doctor` as someone with only the release's coroner-planner, which may not
    list Deployments: the operator states its user on its Lease, so doctor reviews the release's
    operator and compares the admission policies with the release's names (no false FAIL)."""

    def stated() -> str | None:
        lease = k8s.CoordinationV1Api(admin).read_namespaced_lease(api.OPERATOR_LEASE, NAMESPACE)
        return (lease.metadata.annotations or {}).get(api.OPERATOR_USER_ANNOTATION)

    assert kube.wait_for(stated, what="the operator's user on its Lease") == OPERATOR
    planner = f"{PREFIX}planner-user"
    rbac = k8s.RbacAuthorizationV1Api(admin)
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": planner},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": f"{PREFIX}coroner-planner",
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": planner}],
        }
    )
    try:
        assert kube.kubectl(cluster, "auth", "can-i", "list", "deployments", "-n", NAMESPACE, f"--as={planner}",
                            check=False).stdout.strip() == "no"  # fmt: skip
        env = {key: value for key, value in os.environ.items() if key != "KUBECONFIG"}
        env["PATH"] = f"{components.BIN}{os.pathsep}{env.get('PATH', '')}"
        ran = subprocess.run(
            [str(cluster.binary("kubectl")), "coroner", "doctor", "-o", "json", f"--system-namespace={NAMESPACE}",
             "--as", planner, f"--kubeconfig={cluster.kubeconfig}"],
            capture_output=True, text=True, env=env, timeout=120, check=False,
        )  # fmt: skip
        checks = {check["name"]: check for check in json.loads(ran.stdout)["checks"]}
        grant = checks["retire-grant"]
        assert grant["facts"]["user"] == OPERATOR and grant["status"] == "PASS", grant["summary"]
        assert f"Lease {NAMESPACE}/{api.OPERATOR_LEASE}" in grant["facts"]["userFrom"], grant["summary"]
        content = checks["admission-content"]
        assert content["status"] == "PASS" and content["facts"]["namePrefix"] == PREFIX, content["summary"]
    finally:
        rbac.delete_cluster_role_binding(planner)


def test_helm_install_upgrade_and_uninstall_keeping_the_crd(
    clean_slate: Cluster, admin: k8s.ApiClient, tmp_path: pathlib.Path
) -> None:
    cluster = clean_slate
    installed = helm_cmd(
        cluster, "install", RELEASE, str(helm.CHART), "--namespace", NAMESPACE, "--create-namespace",
        f"--set=namePrefix={PREFIX}", "--set=retireGrant.enabled=true", "--set=monitoring.enabled=true",
    )  # fmt: skip
    assert "STATUS: deployed" in installed.stdout and "GRANTED" in installed.stdout
    kube.wait_for_crd(cluster)
    # The release's objects, in its namespace, under its prefix; monitoring validated by the real CRDs.
    for kind, name in (
        ("deployment", f"{PREFIX}coroner-operator"),
        ("daemonset", f"{PREFIX}coroner-agent"),
        ("podmonitor", f"{PREFIX}coroner-operator"),
        ("prometheusrule", f"{PREFIX}coroner"),
        ("configmap", f"{PREFIX}coroner-dashboard"),
    ):
        kube.kubectl(cluster, "get", kind, name, "-n", NAMESPACE)
    args = kube.kubectl(
        cluster, "get", "deployment", f"{PREFIX}coroner-operator", "-n", NAMESPACE,
        "-o", "jsonpath={.spec.template.spec.containers[0].args}",
    ).stdout  # fmt: skip
    assert f"--system-namespace={NAMESPACE}" in args
    assert can_i(cluster, "retire", OPERATOR) == "yes"
    assert can_i(cluster, "retire", f"system:serviceaccount:{api.SYSTEM_NAMESPACE}:coroner-operator") == "no"

    # The admission policies follow the release's identities: its agent attests its own node only.
    ns = "helm-workers"
    kube.kubectl(cluster, "create", "namespace", ns)
    try:
        mine = kube.create_registration(admin, ns, kube.registration_body(name="on-a", node="node-a", interval=None))
        theirs = kube.create_registration(admin, ns, kube.registration_body(name="on-b", node="node-b", pid=7))
        agent_config = mint_token(cluster, service_account=f"{NAMESPACE}/{PREFIX}coroner-agent", node="node-a")
        with api_client(agent_config) as agent:
            kube.patch_status(agent, ns, "on-a", {"status": {"attestation": components.attestation(mine)}})
            forged = {"status": {"attestation": components.attestation(theirs, node="node-a")}}

            def refused() -> bool:
                # A dry run, until the release's policies are enforced (the API server loads a new
                # policy and binding a moment after they are created): nothing is stored meanwhile.
                try:
                    k8s.CustomObjectsApi(agent).patch_namespaced_custom_object_status(
                        api.GROUP, api.VERSION, ns, api.PLURAL, "on-b", forged, dry_run="All"
                    )
                except ApiException:
                    return True
                return False

            kube.wait_for(refused, timeout=60, what="the release's admission policies enforced")
            with pytest.raises(ApiException) as raised:
                kube.patch_status(agent, ns, "on-b", forged)
        assert 'the agent of node "node-a" may not attest' in kube.api_error_body(raised.value)["message"]
        assert kube.kubectl(cluster, "get", "registration", "on-a", "-n", ns, "-o", "name").stdout.strip()

        # The release's operator identity retires (every policy names it), and its agent's Lease
        # lives in the release namespace: a real operator run as that ServiceAccount retires on-a.
        with api_client(agent_config) as agent:
            k8s.CoordinationV1Api(agent).create_namespaced_lease(NAMESPACE, _agent_lease(mine))
        operator_config = mint_token(cluster, service_account=f"{NAMESPACE}/{PREFIX}coroner-operator")
        argv = components.operator_argv(operator_config, f"--system-namespace={NAMESPACE}", f"--namespace={ns}")
        with components.process(argv, log=tmp_path / "operator.log"):
            kube.wait_for(lambda: components.retired(admin, ns, "on-a"), timeout=120, what="on-a retired")
            _doctor_as_a_planner_knows_the_prefix(cluster, admin)
        assert kube.get_registration(admin, ns, "on-a")["status"]["retirement"]["retiredBy"] == OPERATOR
        assert kube.get_registration(admin, ns, "on-a")["status"]["state"] == "Retired"

        # Revoking is a values change, effective at once.
        upgraded = helm_cmd(
            cluster, "upgrade", RELEASE, str(helm.CHART), "--namespace", NAMESPACE, "--reuse-values",
            "--set=retireGrant.enabled=false",
        )  # fmt: skip
        assert "PLAN-ONLY" in upgraded.stdout
        assert can_i(cluster, "retire", OPERATOR) == "no"

        uninstalled = helm_cmd(cluster, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
        assert "uninstalled" in uninstalled.stdout
        # The CRD, every registration and the namespace stay; the release's other objects are gone.
        kube.kubectl(cluster, "get", "crd", api.CRD_NAME)
        kube.kubectl(cluster, "get", "namespace", NAMESPACE)
        listed = kube.kubectl(cluster, "get", "registrations", "-n", ns, "-o", "name").stdout.split()
        assert sorted(listed) == [f"workerregistration.coroner.dev/{n}" for n in ("on-a", "on-b")]
        for kind, name in (
            ("clusterrole", f"{PREFIX}coroner-operator"),
            ("validatingadmissionpolicy", "coroner-agent-attests-own-node-only"),
            ("validatingadmissionpolicy", "coroner-registrant-recorded"),
            ("deployment", f"{PREFIX}coroner-operator"),
        ):
            gone = kube.kubectl(cluster, "get", kind, name, "-n", NAMESPACE, check=False)
            assert gone.returncode != 0 and "NotFound" in gone.stderr, (kind, name)
    finally:
        kube.kubectl(cluster, "delete", "namespace", ns, "--ignore-not-found", "--wait=false")
