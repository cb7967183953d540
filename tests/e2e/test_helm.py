"""`helm install` of charts/coroner into the dev cluster, the way a platform team installs it: into
a namespace of its own choosing with a name prefix, so the admission policies must follow the
release's identities; with monitoring on (against the Prometheus Operator's real CRDs); granted and
revoked through values; and `helm uninstall` keeping the CRD and every registration. Every pod-level
value lands on the objects the API server stores, and the schema refuses a value it does not know.
`helm test` passes while doctor is green and fails when it is red, its Pod run by a stand-in for the
kubelet this cluster lacks (the real kubelet runs it in tests/node/test_2b_helm.py)."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import subprocess
import threading
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
    """No kustomize install (its cluster-scoped objects carry the chart's names), no Node an earlier
    test made (this control plane has no kubelet, so such a Node stays Ready with no agent, which the
    release's DaemonSet would be expected on), the Prometheus Operator's CRDs present; afterwards the
    release is gone and the kustomize API is back for the tests that follow in this session."""
    production = kube.kubectl(cluster, "kustomize", str(kube.MANIFESTS / "overlays" / "production")).stdout
    kube.kubectl(cluster, "delete", "--ignore-not-found", "--wait=true", "-f", "-", stdin=production)
    if not cluster.nodes:
        kube.kubectl(cluster, "delete", "nodes", "--all", "--wait=true")
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


PRIORITY_CLASS = "coroner-e2e-high"
POD_VALUES = {
    "priorityClassName": PRIORITY_CLASS,
    "nodeSelector": {"pool": "system"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "system", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}]
            }
        }
    },
    "imagePullSecrets": [{"name": "registry-credentials"}],
    "extraArgs": ["--log-format=json"],
    "podAnnotations": {"example.com/owner": "platform"},
    "podLabels": {"example.com/team": "platform"},
    "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "1Gi"}},
}


@pytest.fixture
def priority_class(admin: k8s.ApiClient) -> Iterator[str]:
    """A PriorityClass of the cluster's own, as a platform team names one for the operator."""
    scheduling = k8s.SchedulingV1Api(admin)
    scheduling.create_priority_class({"metadata": {"name": PRIORITY_CLASS}, "value": 1_000_000})
    try:
        yield PRIORITY_CLASS
    finally:
        scheduling.delete_priority_class(PRIORITY_CLASS)


def test_every_pod_value_lands_on_the_stored_objects_and_unknown_keys_are_refused(
    clean_slate: Cluster, priority_class: str, tmp_path: pathlib.Path
) -> None:
    cluster = clean_slate
    refused = helm_cmd(
        cluster, "install", RELEASE, str(helm.CHART), "--namespace", NAMESPACE, "--create-namespace",
        "--set=operator.nodeSelectr.pool=system", check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "additional properties 'nodeSelectr' not allowed" in refused.stderr
    assert helm_cmd(cluster, "status", RELEASE, "--namespace", NAMESPACE, check=False).returncode != 0
    clash = helm_cmd(
        cluster, "install", RELEASE, str(helm.CHART), "--namespace", NAMESPACE, "--create-namespace",
        "--set=agent.podLabels.app\\.kubernetes\\.io/name=mine", check=False,
    )  # fmt: skip
    assert 'agent.podLabels sets "app.kubernetes.io/name", which the chart sets itself' in clash.stderr

    values = tmp_path / "values.yaml"
    agent_values = {**POD_VALUES, "priorityClassName": "system-node-critical", "affinity": {"nodeAffinity": None}}
    monitoring = {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}
    values.write_text(json.dumps({"operator": POD_VALUES, "agent": agent_values, "monitoring": monitoring}))
    helm_cmd(
        cluster, "install", RELEASE, str(helm.CHART), "--namespace", NAMESPACE, "--create-namespace",
        f"--set=namePrefix={PREFIX}", f"--values={values}",
    )  # fmt: skip
    for kind, expected in (("deployment", POD_VALUES), ("daemonset", agent_values)):
        name = f"{PREFIX}coroner-{'operator' if kind == 'deployment' else 'agent'}"
        stored = json.loads(kube.kubectl(cluster, "get", kind, name, "-n", NAMESPACE, "-o", "json").stdout)
        template = stored["spec"]["template"]
        pod, container = template["spec"], template["spec"]["containers"][0]
        assert pod["priorityClassName"] == expected["priorityClassName"], kind
        assert pod["nodeSelector"] == POD_VALUES["nodeSelector"], kind
        assert pod["tolerations"] == POD_VALUES["tolerations"], kind
        assert pod["imagePullSecrets"] == POD_VALUES["imagePullSecrets"], kind
        assert container["args"][-1] == "--log-format=json" and container["resources"] == POD_VALUES["resources"]
        assert template["metadata"]["annotations"]["example.com/owner"] == "platform", kind
        assert template["metadata"]["labels"] == {"app.kubernetes.io/name": name.removeprefix(PREFIX),
                                                  "example.com/team": "platform"}  # fmt: skip
        if kind == "deployment":  # a map value replaces the default's keys it names, and keeps the rest
            assert pod["affinity"]["nodeAffinity"] == POD_VALUES["affinity"]["nodeAffinity"]
            assert pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        else:  # null drops the default: the agent may run on control-plane nodes too
            assert "affinity" not in pod
            assert template["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/enable-ds-eviction"] == "false"
            (installer,) = pod["initContainers"]
            assert installer["image"] == container["image"]
    for kind, name in (
        ("podmonitor", "coroner-operator"),
        ("podmonitor", "coroner-agent"),
        ("prometheusrule", "coroner"),
    ):
        labels = json.loads(
            kube.kubectl(cluster, "get", kind, f"{PREFIX}{name}", "-n", NAMESPACE, "-o", "jsonpath={.metadata.labels}").stdout
        )  # fmt: skip
        assert labels["release"] == "kube-prometheus-stack" and labels["app.kubernetes.io/part-of"] == "coroner"


TEST_POD = f"{PREFIX}coroner-doctor-test"


@contextlib.contextmanager
def kubelet_for_the_test_pod(
    cluster: Cluster, admin: k8s.ApiClient
) -> Iterator[list[subprocess.CompletedProcess[str]]]:
    """Stands in for the kubelet this cluster lacks, for the one Pod `helm test` creates: runs the
    Pod's own command and arguments (the CLI installed here, as the operator image carries it) as the
    Pod's ServiceAccount, then writes the Pod's phase from the exit code, as a kubelet would. So the
    release's test RBAC, the command and `helm test`'s verdict are all real; only the container runtime
    is not. Yields each run, in order."""
    runs: list[subprocess.CompletedProcess[str]] = []
    done = threading.Event()

    def run_each_new_pod() -> None:
        core = k8s.CoreV1Api(admin)
        seen: set[str] = set()
        while not done.wait(0.2):
            try:
                pod = core.read_namespaced_pod(TEST_POD, NAMESPACE)
            except ApiException:
                continue
            if pod.metadata.uid in seen or pod.metadata.deletion_timestamp or pod.status.phase != "Pending":
                continue
            seen.add(pod.metadata.uid)
            (container,) = pod.spec.containers
            kubeconfig = mint_token(cluster, service_account=f"{NAMESPACE}/{pod.spec.service_account_name}")
            env = {key: value for key, value in os.environ.items() if not key.startswith("KUBERNETES_")}
            env["KUBECONFIG"] = str(kubeconfig)
            ran = subprocess.run(
                [str(components.BIN / container.command[0]), *container.args],
                capture_output=True, text=True, env=env, timeout=120, check=False,
            )  # fmt: skip
            runs.append(ran)
            phase = "Succeeded" if ran.returncode == 0 else "Failed"
            core.patch_namespaced_pod_status(TEST_POD, NAMESPACE, {"status": {"phase": phase}})

    thread = threading.Thread(target=run_each_new_pod, name="test-pod-kubelet", daemon=True)
    thread.start()
    try:
        yield runs
    finally:
        done.set()
        thread.join(timeout=30)


def test_helm_test_passes_while_doctor_is_green_and_fails_when_it_is_red(
    clean_slate: Cluster, admin: k8s.ApiClient, tmp_path: pathlib.Path
) -> None:
    cluster = clean_slate
    helm_cmd(
        cluster, "install", RELEASE, str(helm.CHART), "--namespace", NAMESPACE, "--create-namespace",
        f"--set=namePrefix={PREFIX}", "--set=operator.imagePullSecrets[0].name=registry-credentials",
    )  # fmt: skip
    kube.wait_for_crd(cluster)
    operator_config = mint_token(cluster, service_account=f"{NAMESPACE}/{PREFIX}coroner-operator")
    argv = components.operator_argv(operator_config, f"--system-namespace={NAMESPACE}", "--all-namespaces")
    with (
        components.process(argv, log=tmp_path / "operator.log"),
        kubelet_for_the_test_pod(cluster, admin) as runs,
    ):
        kube.wait_for(lambda: _swept(admin), timeout=120, what="the operator's first sweep recorded on its Lease")
        # Green to begin with, as the cluster's admin sees it (registrations an earlier test left in a
        # namespace being deleted would be doctor's business too).
        failing: list[str] = []

        def green() -> bool:
            failing[:] = _failing(_doctor(cluster))
            return not failing

        try:
            kube.wait_for(green, timeout=120, interval=2, what="doctor green")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; doctor's FAILs: {failing}") from None
        green = helm_cmd(cluster, "test", RELEASE, "--namespace", NAMESPACE, check=False)
        assert green.returncode == 0, f"{green.stdout}{green.stderr}\n{runs[-1].stdout if runs else ''}"
        assert f"TEST SUITE:     {TEST_POD}" in green.stdout and "Phase:          Succeeded" in green.stdout
        (ran,) = runs
        checks = ran.stdout
        assert "FAIL" not in checks and "--expect-plan-only" in " ".join(ran.args), checks
        # A success leaves nothing behind, the cluster-wide binding included.
        for kind in ("pod", "serviceaccount", "role", "rolebinding", "clusterrolebinding"):
            gone = kube.kubectl(cluster, "get", kind, TEST_POD, "-n", NAMESPACE, check=False)
            assert gone.returncode != 0 and "NotFound" in gone.stderr, kind

        # Red: an admission policy binding deleted (admission-policies FAILs).
        kube.kubectl(cluster, "delete", "validatingadmissionpolicybinding", "coroner-registrant-recorded")
        red = helm_cmd(cluster, "test", RELEASE, "--namespace", NAMESPACE, check=False)
        assert red.returncode != 0, red.stdout
        assert runs[-1].returncode == 1 and "admission-policies" in runs[-1].stderr, runs[-1].stdout
        stored = json.loads(kube.kubectl(cluster, "get", "pod", TEST_POD, "-n", NAMESPACE, "-o", "json").stdout)
        assert stored["status"]["phase"] == "Failed"  # kept for `kubectl logs`
        assert stored["spec"]["imagePullSecrets"] == [{"name": "registry-credentials"}]
        assert stored["spec"]["containers"][0]["image"].startswith("ghcr.io/coroner-dev/coroner-operator:")

        # The binding restored by an upgrade: green again, the failed Pod replaced.
        helm_cmd(cluster, "upgrade", RELEASE, str(helm.CHART), "--namespace", NAMESPACE, "--reuse-values")
        again = helm_cmd(cluster, "test", RELEASE, "--namespace", NAMESPACE, check=False)
        assert again.returncode == 0, f"{again.stdout}{again.stderr}\n{runs[-1].stdout}"
        assert len(runs) == 3


def _doctor(cluster: Cluster) -> subprocess.CompletedProcess[str]:
    """`kubectl coroner doctor` of the release, plan-only, as the cluster's admin."""
    return subprocess.run(
        [str(components.BIN / "kubectl-coroner"), "doctor", f"--system-namespace={NAMESPACE}", "--expect-plan-only",
         f"--kubeconfig={cluster.kubeconfig}"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _failing(doctor: subprocess.CompletedProcess[str]) -> list[str]:
    """The checks doctor FAILs, each with its summary ([] when it exits 0), for a wait's message."""
    if doctor.returncode == 0:
        return []
    return [line for line in doctor.stdout.splitlines() if "FAIL" in line] or [doctor.stdout + doctor.stderr]


def _swept(admin: k8s.ApiClient) -> bool:
    try:
        lease = k8s.CoordinationV1Api(admin).read_namespaced_lease(api.OPERATOR_LEASE, NAMESPACE)
    except ApiException:
        return False
    return api.LAST_SWEEP_ANNOTATION in (lease.metadata.annotations or {})
