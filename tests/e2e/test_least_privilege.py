"""Least privilege: what each identity of the manifests can no longer do.

RBAC answers are the API server's own (`kubectl auth can-i` as the ServiceAccount); the admission
answers come from real writes with tokens from the TokenRequest API.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.client.kube import api_client
from coroner.core import api
from coroner_dev.devcluster.cluster import Cluster
from coroner_dev.devcluster.identities import mint_token
from coroner_operator.kubeapi import ADMISSION_RESOURCES
from support import components, kube

pytestmark = pytest.mark.e2e

SYSTEM = api.SYSTEM_NAMESPACE
OPERATOR = f"system:serviceaccount:{SYSTEM}:coroner-operator"
AGENT = f"system:serviceaccount:{SYSTEM}:coroner-agent"
RESOURCE = f"{api.PLURAL}.{api.GROUP}"


@pytest.fixture(scope="module")
def plan_only(cluster: Cluster) -> Cluster:
    components.install(cluster, grant=False)
    return cluster


@pytest.fixture
def operator(plan_only: Cluster) -> Iterator[k8s.ApiClient]:
    with api_client(mint_token(plan_only, service_account=f"{SYSTEM}/coroner-operator")) as client:
        yield client


def can_i(cluster: Cluster, verb: str, resource: str, *, who: str, namespace: str = "default") -> str:
    result = kube.kubectl(cluster, "auth", "can-i", verb, resource, "-n", namespace, f"--as={who}", check=False)
    return result.stdout.strip()


def test_rbac_grants_only_what_the_code_uses(plan_only: Cluster) -> None:
    # No main-resource patch: it was unused, and enough to set ownerReferences for the garbage collector.
    assert can_i(plan_only, "patch", RESOURCE, who=OPERATOR) == "no"
    assert can_i(plan_only, "update", RESOURCE, who=OPERATOR) == "no"
    # Its own Lease by name; no other Lease in coroner-system (create is narrowed by admission).
    assert can_i(plan_only, "update", "leases/coroner-operator", who=OPERATOR, namespace=SYSTEM) == "yes"
    assert can_i(plan_only, "update", "leases/coroner-agent-node-a", who=OPERATOR, namespace=SYSTEM) == "no"
    assert can_i(plan_only, "delete", "leases/coroner-operator", who=OPERATOR, namespace=SYSTEM) == "no"
    # core/v1 Events, created, never patched; nothing in events.k8s.io.
    assert can_i(plan_only, "create", "events", who=OPERATOR) == "yes"
    assert can_i(plan_only, "patch", "events", who=OPERATOR) == "no"
    assert can_i(plan_only, "create", "events.events.k8s.io", who=OPERATOR) == "no"
    assert can_i(plan_only, "create", "events", who=AGENT) == "no"
    # Its admission policies and bindings, read (it fails closed on them), never written.
    for resource in ADMISSION_RESOURCES.values():
        kind = f"{resource}.admissionregistration.k8s.io"
        assert can_i(plan_only, "list", kind, who=OPERATOR) == "yes", kind
        for verb in ("create", "update", "patch", "delete"):
            assert can_i(plan_only, verb, kind, who=OPERATOR) == "no", (verb, kind)
        assert can_i(plan_only, "list", kind, who=AGENT) == "no", kind


def test_the_operator_cannot_create_an_agents_lease(plan_only: Cluster, operator: k8s.ApiClient) -> None:
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "coroner-agent-never-ran", "namespace": SYSTEM},
        "spec": {"holderIdentity": "forged", "leaseDurationSeconds": 3600},
    }
    with pytest.raises(ApiException) as raised:
        k8s.CoordinationV1Api(operator).create_namespaced_lease(SYSTEM, lease)
    message = kube.api_error_body(raised.value)["message"]
    assert 'belongs to the coroner agent of node "never-ran"' in message, message


RELEASED = {"type": "Released", "status": "True", "reason": "CleanExit", "message": "bye",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip


def kubectl_as(cluster: Cluster, who: str, *args: str) -> subprocess.CompletedProcess[str]:
    """kubectl as the cluster admin impersonating `who`, as an attacker holding `who`'s token would."""
    return kube.kubectl(cluster, *args, f"--as={who}", check=False)


def test_only_terminal_registrations_are_deleted_and_retire_is_not_enough(
    plan_only: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    """A stolen operator token (or anyone who may impersonate it) deletes a live registration, or
    forges its goodbye and then deletes it: refused even where the operator holds `retire` (the
    production grant), since a delete needs no evidence. Its retention still deletes terminal ones."""
    components.install(plan_only, grant=True)
    try:
        kube.wait_for(lambda: can_i(plan_only, "retire", RESOURCE, who=OPERATOR, namespace=namespace) == "yes",
                      what="the retire grant")  # fmt: skip
        kube.create_registration(admin, namespace, kube.registration_body(name="live"))
        kube.create_registration(admin, namespace, kube.registration_body(name="gone"))
        kube.patch_status(admin, namespace, "gone", {"status": {"conditions": [RELEASED], "state": "Released"}})
        deleted = kubectl_as(plan_only, OPERATOR, "delete", "wreg", "live", "-n", namespace)
        assert deleted.returncode != 0, deleted.stdout
        assert f"may not delete WorkerRegistration {namespace}/live: it is Active" in deleted.stderr, deleted.stderr
        forged = json.dumps({"status": {"conditions": [RELEASED], "state": "Released"}})
        released = kubectl_as(plan_only, OPERATOR, "patch", "wreg", "live", "-n", namespace, "--subresource=status",
                              "--type=merge", "-p", forged)  # fmt: skip
        assert released.returncode != 0, released.stdout
        assert "may not change the heartbeat or the Released condition" in released.stderr, released.stderr
        again = kubectl_as(plan_only, OPERATOR, "delete", "wreg", "live", "-n", namespace)
        assert again.returncode != 0 and "it is Active" in again.stderr, again.stderr
        assert kube.exists(admin, namespace, "live")
        # Retention's delete of a terminal registration (released by its own registrant) is admitted.
        gone = kubectl_as(plan_only, OPERATOR, "delete", "wreg", "gone", "-n", namespace)
        assert gone.returncode == 0, gone.stderr
        assert not kube.exists(admin, namespace, "gone")
    finally:
        components.install(plan_only, grant=False)
    # A cluster admin still can (it could remove the policy too): documented, and counted by the
    # operator (coroner_active_registration_deletions, alert CoronerActiveRegistrationDeleted).
    kube.kubectl(plan_only, "delete", "wreg", "live", "-n", namespace)
    assert not kube.exists(admin, namespace, "live")


def render(cluster: Cluster, directory: pathlib.Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(kube.kubectl(cluster, "kustomize", str(directory)).stdout) if d]


def one(documents: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in documents if d["kind"] == kind and d["metadata"]["name"].startswith(name)]
    return found


@pytest.mark.parametrize("overlay", ["plan-only", "production"])
def test_the_rendered_agent_is_confined(cluster: Cluster, overlay: str) -> None:
    documents = render(cluster, kube.MANIFESTS / "overlays" / overlay)
    pod = one(documents, "DaemonSet", "coroner-agent")["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    (installer,) = pod["initContainers"]
    # The agent container runs under the Localhost seccomp profile the init container installs...
    assert agent["securityContext"]["seccompProfile"] == {
        "type": "Localhost",
        "localhostProfile": "coroner/agent-seccomp.json",
    }
    assert "/host-seccomp/coroner/agent-seccomp.json" in installer["command"][-1]
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_map = one(documents, "ConfigMap", volumes["seccomp-profile"]["configMap"]["name"])
    # ...which is byte for byte the file the local confinement test loads.
    assert config_map["data"]["agent-seccomp.json"] == (kube.MANIFESTS / "base" / "agent-seccomp.json").read_text()
    assert volumes["kubelet-seccomp"]["hostPath"]["path"] == "/var/lib/kubelet/seccomp"
    assert installer["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # No root, no capability: it can read no other Pod's files (components/agent-ptrace undoes this).
    assert agent["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert (agent["securityContext"]["runAsUser"], agent["securityContext"]["runAsNonRoot"]) == (64242, True)
    # Off control-plane nodes, the real machine id or nothing, no Service environment.
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [
        {"matchExpressions": [{"key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist"}]}
    ]
    assert volumes["machine-id"]["hostPath"] == {"path": "/etc/machine-id", "type": "File"}
    assert pod["enableServiceLinks"] is False
    labels = one(documents, "Namespace", api.SYSTEM_NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["pod-security.kubernetes.io/audit"] == "restricted"
    # The operator's and the agent's metrics ports are reachable only from labelled namespaces, and
    # nothing else of theirs is (docs/security.md, threat 13).
    for name, app in (("coroner-operator", "coroner-operator"), ("coroner-agent", "coroner-agent")):
        policy = one(documents, "NetworkPolicy", name)["spec"]
        assert policy["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": app}}
        assert policy["policyTypes"] == ["Ingress"]
        assert policy["ingress"] == [
            {
                "from": [{"namespaceSelector": {"matchLabels": {"coroner.dev/metrics-scraper": "true"}}}],
                "ports": [{"port": "metrics", "protocol": "TCP"}],
            }
        ]
    assert {p["name"]: p["containerPort"] for p in agent["ports"]} == {"metrics": 9102}


def test_the_apparmor_component_confines_the_agent_and_the_server_accepts_it(
    cluster: Cluster, tmp_path: pathlib.Path
) -> None:
    overlay = tmp_path / "apparmor"
    overlay.mkdir()
    up = pathlib.Path(os.path.relpath(kube.MANIFESTS, overlay))
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [str(up / "overlays" / "production")],
                "components": [str(up / "components" / "agent-apparmor")],
            }
        )
    )
    pod = one(render(cluster, overlay), "DaemonSet", "coroner-agent")["spec"]["template"]["spec"]
    assert pod["containers"][0]["securityContext"]["appArmorProfile"] == {
        "type": "Localhost",
        "localhostProfile": "coroner-agent",
    }
    components.install(cluster, grant=False)  # the namespace and CRD exist for the dry run
    dry = kube.kubectl(cluster, "apply", "-k", str(overlay), "--dry-run=server").stdout
    assert "daemonset.apps/coroner-agent" in dry and "(server dry run)" in dry
