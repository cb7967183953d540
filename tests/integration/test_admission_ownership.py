"""Workers own only their own registration (a stolen worker token reaches no other), with the tokens pods really get.

Two workers in one namespace share one ServiceAccount, each in its own Pod with a Pod-bound token
(what the kubelet projects). The API server records who registered each registration
(coroner.dev/registered-by, which the launcher writes and policy coroner-registrant-recorded admits
only as the requester: the username and the pod) and policy coroner-status-fields-by-identity lets
only that registrant change the heartbeat or write Released, and nobody add a condition of another
type. The real `coroner run` registers and releases under such a token.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.client.kube import api_client
from coroner.core import api
from coroner_dev import fleet
from coroner_dev.devcluster.cluster import Cluster
from coroner_dev.devcluster.identities import mint_token, user_kubeconfig
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


def _create_refused(client: k8s.ApiClient, namespace: str, body: dict[str, Any]) -> str | None:
    """The refusal's message, once the RoleBinding is in the authorizer's cache."""
    try:
        kube.custom(client).create_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, body)
    except ApiException as exc:
        message = str(kube.api_error_body(exc).get("message"))
        return None if "cannot create resource" in message else message
    raise AssertionError(f"created {body['metadata']['name']} with {body['metadata'].get('annotations')}")


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
    # A registrant cannot claim someone else's name: the API server refuses any but the requester.
    body = kube.registration_body(name="a", node=NODE)
    body["metadata"]["annotations"] = {REGISTERED_BY: "system:serviceaccount:elsewhere:somebody"}
    uid_a = pods.pod_uid(admin, namespace, "worker-a")
    expected = f"system:serviceaccount:{namespace}:worker pod/worker-a/{uid_a}"
    message = kube.wait_for(lambda: _create_refused(a, namespace, body), what="worker RBAC")
    assert f'annotation coroner.dev/registered-by must be the requester, "{expected}"' in message, message
    created = kube.create_registration(a, namespace, kube.registration_body(name="a", node=NODE))
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
    # Its own registrant may, and no one else: not a holder of retire (the admin here).
    kube.patch_status(a, namespace, "a", heartbeat())
    with pytest.raises(ApiException) as raised:
        kube.patch_status(admin, namespace, "a", heartbeat())
    assert "only its registrant may" in kube.api_error_body(raised.value)["message"]
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


def test_coroner_run_registers_and_releases_under_a_pod_bound_token(
    installed: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    """coroner-registrant-recorded admits only an annotation that is exactly the requester: the
    launcher's own (it asks who it is), with no mutating policy to wait for."""
    kube.kubectl(installed, "create", "rolebinding", "worker", "--clusterrole=coroner-worker",
                 f"--serviceaccount={namespace}:worker", "-n", namespace)  # fmt: skip
    pod = f"run-{uuid.uuid4().hex[:6]}"
    config = pods.pod_token(installed, namespace=namespace, service_account="worker", pod=pod, node=NODE)
    try:
        argv = fleet.run_argv(namespace=namespace, node=NODE, name="job", kubeconfig=config, boot_id_file=None,
                              command=("sleep", "2"), heartbeat=(1, 30))  # fmt: skip
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


def _ran(argv: list[str]) -> subprocess.CompletedProcess[str] | None:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0 and "not allowed to create" in result.stderr + result.stdout:
        return None
    return result


OPERATOR = f"system:serviceaccount:{api.SYSTEM_NAMESPACE}:coroner-operator"


def kubectl_as(cluster: Cluster, who: str, *args: str) -> subprocess.CompletedProcess[str]:
    """kubectl as the cluster admin impersonating `who`, as an attacker holding `who`'s token would."""
    return kube.kubectl(cluster, *args, f"--as={who}", check=False)


def _status_refused(client: k8s.ApiClient, namespace: str, name: str, body: object) -> str | None:
    try:
        kube.patch_status(client, namespace, name, body)
    except ApiException as exc:
        message = str(kube.api_error_body(exc).get("message"))
        return message if "denied request" in message else None
    raise AssertionError(f"admitted: {body}")


def status_patch(cluster: Cluster, who: str, namespace: str, name: str, body: object, *, kind: str = "merge") -> str:
    """The refusal's message of `who`'s status patch (it must be refused)."""
    result = kubectl_as(cluster, who, "patch", "wreg", name, "-n", namespace, "--subresource=status",
                        f"--type={kind}", "-p", json.dumps(body))  # fmt: skip
    assert result.returncode != 0, f"{who} was admitted: {result.stdout}"
    return result.stderr


def test_no_one_but_its_registrant_says_goodbye_or_heartbeats_not_the_operator_nor_retire(
    installed: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    """A forged Released makes a live registration terminal, and then deletable: the operator never
    writes one (nor a heartbeat), and holding `retire` (a person bound to coroner-retirer) is no
    licence to either."""
    kube.kubectl(installed, "create", "rolebinding", "bob-retirer", "--clusterrole=coroner-retirer", "--user=bob",
                 "-n", namespace)  # fmt: skip
    kube.create_registration(admin, namespace, kube.registration_body(name="live", node=NODE))
    for forged in (released(), heartbeat()):
        message = kube.wait_for(
            lambda forged=forged: (
                (m := status_patch(installed, OPERATOR, namespace, "live", forged)) and "denied request" in m and m
            ),
            what="the operator's RBAC",
        )
        assert "may not change the heartbeat or the Released condition" in message, message
        assert "registered by admin; only its registrant may" in message, message
    # bob's coroner-retirer role cannot read the status kubectl reads first: his own client patches.
    with api_client(user_kubeconfig(installed, user="bob")) as bob:
        for forged in (released(), heartbeat()):
            message = kube.wait_for(
                lambda forged=forged: _status_refused(bob, namespace, "live", forged),
                what="bob's RBAC",
            )
            assert "registered by admin; only its registrant may" in message, message
    status = kube.get_registration(admin, namespace, "live").get("status") or {}
    assert not status.get("conditions") and "lastHeartbeatTime" not in status


JUNK = [
    {
        "type": f"Junk{i}",
        "status": "True",
        "reason": "Stuffed",
        "message": "x",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    for i in range(14)
]


def test_a_peer_cannot_add_remove_or_change_conditions(
    installed: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    """A peer in the namespace stuffs a worker's registration with 14 junk conditions (the CRD's
    maxItems is 16), or removes or changes the operator's: refused. Not even its own registrant adds
    a condition of another type: a worker's status write is its heartbeat and its goodbye."""
    for sa in ("victim", "peer"):
        kube.kubectl(installed, "create", "rolebinding", sa, "--clusterrole=coroner-worker",
                     f"--serviceaccount={namespace}:{sa}", "-n", namespace)  # fmt: skip
    victim, peer = (f"system:serviceaccount:{namespace}:{sa}" for sa in ("victim", "peer"))
    with api_client(mint_token(installed, service_account=f"{namespace}/victim")) as client:
        kube.wait_for(lambda: _create(client, namespace, kube.registration_body(name="v", node=NODE)), what="RBAC")
    retirable = {"type": "Retirable", "status": "False", "reason": "PidAlive", "message": "alive",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
    kube.kubectl(installed, "patch", "wreg", "v", "-n", namespace, "--subresource=status", "--type=merge",
                 "-p", json.dumps({"status": {"conditions": [retirable]}}), f"--as={OPERATOR}")  # fmt: skip
    before = kube.get_registration(admin, namespace, "v")["status"]["conditions"]
    stuffed = {"status": {"conditions": [*before, *JUNK]}}
    message = kube.wait_for(
        lambda: (m := status_patch(installed, peer, namespace, "v", stuffed)) and "denied request" in m and m,
        what="the peer's RBAC",
    )
    assert "may not add, remove or change the condition Junk0" in message, message
    one = [{"op": "add", "path": "/status/conditions/-", "value": JUNK[0]}]
    for who in (peer, victim):
        assert "may not add, remove or change the condition Junk0" in status_patch(
            installed, who, namespace, "v", one, kind="json"
        )
    removed = [{"op": "remove", "path": "/status/conditions/0"}]
    changed = [{"op": "replace", "path": "/status/conditions/0/reason", "value": "EligibleStaleOrphan"}]
    for ops in (removed, changed):
        assert "may not change the Attested or Retirable conditions" in status_patch(
            installed, peer, namespace, "v", ops, kind="json"
        )
    assert kube.get_registration(admin, namespace, "v")["status"]["conditions"] == before


def test_a_hand_made_registration_without_its_registrant_is_refused_clearly(
    installed: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    """No mutating policy records the registrant (it answered 503 for minutes after the CRD was
    re-created): a create that does not name its requester is refused, saying what to write."""
    assert "coroner" not in kube.kubectl(installed, "get", "mutatingadmissionpolicies", "-o", "name").stdout
    body = kube.registration_body(name="hand-made", node=NODE)
    result = kube.kubectl(installed, "create", "-n", namespace, "-f", "-", stdin=json.dumps(body), check=False)
    assert result.returncode != 0, result.stdout
    assert 'annotation coroner.dev/registered-by must be the requester, "admin"' in result.stderr, result.stderr
    assert "coroner run" in result.stderr, result.stderr
