"""Workers own only their own registration (a stolen worker token reaches no other), with the tokens pods really get.

Two workers in one namespace share one ServiceAccount, each in its own Pod with a Pod-bound token
(what the kubelet projects). The API server records who registered each registration
(coroner.dev/registered-by, set by the mutating policy coroner-record-registrant: the username and
the pod) and policy coroner-status-fields-by-identity lets only that registrant, the operator or a
holder of `retire` change the heartbeat or write Released. The real `coroner run` registers and
releases under such a token.
"""

from __future__ import annotations

import datetime
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.client.kube import api_client
from coroner.core import api
from coroner_dev.devcluster.cluster import Cluster
from coroner_dev.devcluster.identities import mint_token
from support import components, kube, pods

pytestmark = pytest.mark.integration

NODE = "node-owners"
REGISTERED_BY = "coroner.dev/registered-by"


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Cluster:
    components.install(cluster, grant=False)
    return cluster


@pytest.fixture
def workers(installed: Cluster, admin: k8s.ApiClient, namespace: str) -> Iterator[dict[str, k8s.ApiClient]]:
    """Two worker pods of one ServiceAccount `worker`, bound to coroner-worker in the namespace."""
    kube.kubectl(installed, "create", "rolebinding", "worker", "--clusterrole=coroner-worker",
                 f"--serviceaccount={namespace}:worker", "-n", namespace)  # fmt: skip
    names = ("worker-a", "worker-b")
    configs = {
        pod: pods.pod_token(installed, namespace=namespace, service_account="worker", pod=pod, node=NODE)
        for pod in names
    }
    try:
        with api_client(configs["worker-a"]) as a, api_client(configs["worker-b"]) as b:
            yield {"worker-a": a, "worker-b": b}
    finally:
        for pod in names:
            pods.delete_pod(admin, namespace=namespace, pod=pod)


def _create(client: k8s.ApiClient, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return kube.create_registration(client, namespace, body)
    except ApiException as exc:
        if exc.status == 403:
            return None  # the RoleBinding is not in the authorizer's cache yet
        raise


def released() -> dict[str, Any]:
    return {
        "status": {
            "conditions": [
                {
                    "type": "Released",
                    "status": "True",
                    "reason": "CleanExit",
                    "message": "bye",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
            "state": "Released",
        }
    }


def heartbeat() -> dict[str, Any]:
    return {"status": {"lastHeartbeatTime": components.now_text()}}


def test_a_worker_cannot_heartbeat_or_release_its_peers_registration(
    workers: dict[str, k8s.ApiClient], admin: k8s.ApiClient, namespace: str
) -> None:
    a, b = workers["worker-a"], workers["worker-b"]
    # A registrant cannot claim someone else's name: the API server writes the annotation.
    body = kube.registration_body(name="a", node=NODE)
    body["metadata"]["annotations"] = {REGISTERED_BY: "system:serviceaccount:elsewhere:somebody"}
    created = kube.wait_for(lambda: _create(a, namespace, body), what="worker RBAC")
    uid_a = pods.pod_uid(admin, namespace, "worker-a")
    expected = f"system:serviceaccount:{namespace}:worker pod/worker-a/{uid_a}"
    assert created["metadata"]["annotations"][REGISTERED_BY] == expected
    for forged in (heartbeat(), released()):
        with pytest.raises(ApiException) as raised:
            kube.patch_status(b, namespace, "a", forged)
        message = kube.api_error_body(raised.value)["message"]
        assert "may not change the heartbeat or the Released condition" in message, message
        assert f"registered by {expected}" in message and "pod/worker-b/" in message, message
    assert "status" not in kube.get_registration(admin, namespace, "a") or not kube.get_registration(
        admin, namespace, "a"
    )["status"].get("conditions")
    # Its own registrant may; so may a holder of retire (the admin here).
    kube.patch_status(a, namespace, "a", heartbeat())
    kube.patch_status(admin, namespace, "a", heartbeat())
    kube.patch_status(a, namespace, "a", released())
    assert components.condition(kube.get_registration(admin, namespace, "a"), "Released") is not None


def test_the_registrant_annotation_cannot_change(
    workers: dict[str, k8s.ApiClient], admin: k8s.ApiClient, namespace: str
) -> None:
    kube.wait_for(
        lambda: _create(workers["worker-a"], namespace, kube.registration_body(name="a", node=NODE)),
        what="worker RBAC",
    )
    with pytest.raises(ApiException) as raised:
        kube.custom(admin).patch_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.PLURAL, "a", {"metadata": {"annotations": {REGISTERED_BY: "admin"}}}
        )
    assert "records who registered it and cannot change" in kube.api_error_body(raised.value)["message"]


def test_registrations_of_plain_serviceaccount_tokens_are_owned_by_the_serviceaccount(
    installed: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    for sa in ("one", "two"):
        kube.kubectl(installed, "create", "rolebinding", sa, "--clusterrole=coroner-worker",
                     f"--serviceaccount={namespace}:{sa}", "-n", namespace)  # fmt: skip
    with (
        api_client(mint_token(installed, service_account=f"{namespace}/one")) as one,
        api_client(mint_token(installed, service_account=f"{namespace}/two")) as two,
    ):
        created = kube.wait_for(
            lambda: _create(one, namespace, kube.registration_body(name="one", node=NODE)), what="worker RBAC"
        )
        assert created["metadata"]["annotations"][REGISTERED_BY] == f"system:serviceaccount:{namespace}:one"
        kube.wait_for(lambda: _create(two, namespace, kube.registration_body(name="two", node=NODE)), what="RBAC")
        with pytest.raises(ApiException) as raised:
            kube.patch_status(two, namespace, "one", released())
        assert "may not change the heartbeat or the Released condition" in kube.api_error_body(raised.value)["message"]


@pytest.mark.parametrize("mutating", [True, False], ids=["with-the-mutating-policy", "launcher-alone"])
def test_coroner_run_registers_and_releases_under_a_pod_bound_token(
    installed: Cluster, admin: k8s.ApiClient, namespace: str, tmp_path: Any, mutating: bool
) -> None:
    """`launcher-alone`: without the mutating policy's binding, coroner-registrant-recorded admits
    only an annotation that is exactly the requester — the launcher's own (it asks who it is), which
    is what spares its creates the mutating policy (finding 7)."""
    kube.kubectl(installed, "create", "rolebinding", "worker", "--clusterrole=coroner-worker",
                 f"--serviceaccount={namespace}:worker", "-n", namespace)  # fmt: skip
    pod = f"run-{uuid.uuid4().hex[:6]}"
    config = pods.pod_token(installed, namespace=namespace, service_account="worker", pod=pod, node=NODE)
    try:
        if not mutating:
            kube.kubectl(installed, "delete", "mutatingadmissionpolicybinding", "coroner-record-registrant")
            unnamed = kube.registration_body(name="unnamed", node=NODE)
            kube.wait_for(lambda: _refused_in_a_dry_run(admin, namespace, unnamed), what="the binding's removal")
        argv = [str(components.BIN / "coroner"), "run", "-n", namespace, f"--node-name={NODE}", "--name=job",
                f"--kubeconfig={config}", "--interval-seconds=1", "--ttl-seconds=30", "--", "sleep", "2"]  # fmt: skip
        result = kube.wait_for(lambda: _ran(argv), timeout=60, what="coroner run under the pod's token (RBAC cache)")
        assert result.returncode == 0, result.stdout + result.stderr
        body = kube.get_registration(admin, namespace, "job")
        assert body["metadata"]["annotations"][REGISTERED_BY].startswith(
            f"system:serviceaccount:{namespace}:worker pod/{pod}/"
        )
        assert components.condition(body, "Released") is not None
        beat = datetime.datetime.fromisoformat(body["status"]["lastHeartbeatTime"].replace("Z", "+00:00"))
        assert beat.tzinfo is not None
    finally:
        pods.delete_pod(admin, namespace=namespace, pod=pod)
        if not mutating:
            components.install(installed, grant=False)


def _refused_in_a_dry_run(client: k8s.ApiClient, namespace: str, body: dict[str, Any]) -> bool:
    try:
        kube.custom(client).create_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.PLURAL, body, dry_run="All"
        )
    except ApiException as exc:
        if exc.status == 403:
            return True
        raise
    return False


def _ran(argv: list[str]) -> subprocess.CompletedProcess[str] | None:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0 and "not allowed to create" in result.stderr + result.stdout:
        return None
    return result
