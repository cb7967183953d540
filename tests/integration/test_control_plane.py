"""The local control plane is real and has what Coroner relies on.

Each test here is a property of kube-apiserver itself that a Coroner safety rule stands on:
compare-and-swap (409/422), RBAC with a custom verb, CEL authorizer checks in admission policies,
node-bound token identities, and watches.
"""

from __future__ import annotations

import json
import threading
import uuid

import pytest
from kubernetes import client as k8s
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from coroner.client.kube import api_client
from coroner.core import api
from coroner_dev.devcluster.binaries import K8S_VERSION
from coroner_dev.devcluster.cluster import Cluster
from coroner_dev.devcluster.identities import mint_token
from support import kube

pytestmark = pytest.mark.integration


def test_server_reports_the_version_it_was_built_as(cluster: Cluster) -> None:
    versions = json.loads(kube.kubectl(cluster, "version", "-o", "json").stdout)
    assert versions["serverVersion"]["gitVersion"] == K8S_VERSION
    assert versions["clientVersion"]["gitVersion"] == K8S_VERSION


def test_crd_with_status_subresource_is_served(coroner_api: Cluster, admin: k8s.ApiClient, namespace: str) -> None:
    kube.create_registration(admin, namespace, kube.registration_body(name="w1"))
    patched = kube.patch_status(admin, namespace, "w1", {"status": {"lastHeartbeatTime": "2026-01-01T00:00:00Z"}})
    assert patched["status"]["lastHeartbeatTime"] == "2026-01-01T00:00:00Z"


def test_json_patch_with_failing_resource_version_test_is_rejected_and_changes_nothing(
    coroner_api: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    created = kube.create_registration(admin, namespace, kube.registration_body(name="w1"))
    stale = created["metadata"]["resourceVersion"]
    kube.patch_status(admin, namespace, "w1", {"status": {"lastHeartbeatTime": "2026-01-01T00:00:01Z"}})
    with pytest.raises(ApiException) as raised:
        kube.patch_status(
            admin,
            namespace,
            "w1",
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": stale},
                {"op": "add", "path": "/status/lastHeartbeatTime", "value": "2026-01-01T00:00:02Z"},
            ],
        )
    assert raised.value.status == 422
    assert kube.get_registration(admin, namespace, "w1")["status"]["lastHeartbeatTime"] == "2026-01-01T00:00:01Z"


def test_update_with_stale_resource_version_conflicts(
    coroner_api: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    created = kube.create_registration(admin, namespace, kube.registration_body(name="w1"))
    kube.patch_status(admin, namespace, "w1", {"status": {"lastHeartbeatTime": "2026-01-01T00:00:01Z"}})
    created["status"] = {"lastHeartbeatTime": "2026-01-01T00:00:09Z"}
    with pytest.raises(ApiException) as raised:
        kube.custom(admin).replace_namespaced_custom_object_status(
            api.GROUP, api.VERSION, namespace, api.PLURAL, "w1", created
        )
    assert raised.value.status == 409


def _self_can(client: k8s.ApiClient, *, verb: str, namespace: str, subresource: str = "") -> bool:
    review = k8s.V1SelfSubjectAccessReview(
        spec=k8s.V1SelfSubjectAccessReviewSpec(
            resource_attributes=k8s.V1ResourceAttributes(
                group=api.GROUP, resource=api.PLURAL, verb=verb, namespace=namespace, subresource=subresource
            )
        )
    )
    return bool(k8s.AuthorizationV1Api(client).create_self_subject_access_review(review).status.allowed)


def _bind(admin: k8s.ApiClient, namespace: str, *, sa: str, verbs: list[str], resources: list[str]) -> str:
    rbac = k8s.RbacAuthorizationV1Api(admin)
    name = f"r-{uuid.uuid4().hex[:8]}"
    rbac.create_namespaced_role(
        namespace,
        k8s.V1Role(
            metadata=k8s.V1ObjectMeta(name=name),
            rules=[k8s.V1PolicyRule(api_groups=[api.GROUP], resources=resources, verbs=verbs)],
        ),
    )
    rbac.create_namespaced_role_binding(
        namespace,
        k8s.V1RoleBinding(
            metadata=k8s.V1ObjectMeta(name=name),
            role_ref=k8s.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=name),
            subjects=[k8s.RbacV1Subject(kind="ServiceAccount", name=sa, namespace=namespace)],
        ),
    )
    return name


def test_rbac_denies_without_grant_and_allows_a_custom_verb_after_binding(
    coroner_api: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    kubeconfig = mint_token(coroner_api, service_account=f"{namespace}/someone")
    with api_client(kubeconfig) as client:
        with pytest.raises(ApiException) as raised:
            kube.custom(client).list_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL)
        assert raised.value.status == 403
        assert not _self_can(client, verb=api.RETIRE_VERB, namespace=namespace)
        _bind(admin, namespace, sa="someone", verbs=["list", api.RETIRE_VERB], resources=[api.PLURAL])
        kube.wait_for(lambda: _self_can(client, verb=api.RETIRE_VERB, namespace=namespace), what="RBAC to allow retire")
        kube.custom(client).list_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL)
    can_i = kube.kubectl(
        coroner_api,
        "auth",
        "can-i",
        api.RETIRE_VERB,
        f"{api.PLURAL}.{api.GROUP}",
        "-n",
        namespace,
        f"--as=system:serviceaccount:{namespace}:someone",
        check=False,
    )
    assert can_i.stdout.strip() == "yes"


def test_admission_policy_with_authorizer_check_denies_until_the_verb_is_granted(
    coroner_api: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    kube.create_registration(admin, namespace, kube.registration_body(name="w1"))
    kubeconfig = mint_token(coroner_api, service_account=f"{namespace}/retirer")
    _bind(admin, namespace, sa="retirer", verbs=["get", "patch"], resources=[api.PLURAL, f"{api.PLURAL}/status"])
    retire = {
        "status": {
            "retirement": {"retiredBy": "test", "reason": "ProcAbsent"},
            "conditions": [
                {
                    "type": "Retired",
                    "status": "True",
                    "reason": "ProcAbsent",
                    "message": "test",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
            "state": "Retired",
        }
    }
    with api_client(kubeconfig) as client:
        kube.wait_for(lambda: _self_can(client, verb="patch", namespace=namespace, subresource="status"), what="rbac")
        with pytest.raises(ApiException) as raised:
            kube.patch_status(client, namespace, "w1", retire)
        assert raised.value.status in (403, 422)
        # Two policies refuse this write (no retire verb, no evidence); the server names one of them.
        refused_by = kube.api_error_body(raised.value)["message"]
        assert "requires the retire verb" in refused_by or "coroner-retire-requires-evidence" in refused_by
        _bind(admin, namespace, sa="retirer", verbs=[api.RETIRE_VERB], resources=[api.PLURAL])
        kube.wait_for(lambda: _self_can(client, verb=api.RETIRE_VERB, namespace=namespace), what="retire grant")
        # With the verb the authorizer check passes; what refuses this write now is the evidence
        # policy (a retirement needs its Dead attestation: tests/integration/test_admission_evidence.py).
        with pytest.raises(ApiException) as raised:
            kube.patch_status(client, namespace, "w1", retire)
    message = kube.api_error_body(raised.value)["message"]
    assert "requires the retire verb" not in message
    assert "coroner-retire-requires-evidence" in message, message


def test_node_bound_token_carries_the_node_name(coroner_api: Cluster, admin: k8s.ApiClient, namespace: str) -> None:
    kubeconfig = mint_token(coroner_api, service_account=f"{namespace}/agent", node="node-bound-1")
    with api_client(kubeconfig) as client:
        review = k8s.AuthenticationV1Api(client).create_self_subject_review(k8s.V1SelfSubjectReview())
    extra = review.status.user_info.extra
    assert extra["authentication.kubernetes.io/node-name"] == ["node-bound-1"]
    assert review.status.user_info.username == f"system:serviceaccount:{namespace}:agent"
    whoami = kube.kubectl(coroner_api, "auth", "whoami", "-o", "json", kubeconfig=kubeconfig).stdout
    assert "node-bound-1" in whoami


def test_watch_reports_changes(coroner_api: Cluster, admin: k8s.ApiClient, namespace: str) -> None:
    created = kube.create_registration(admin, namespace, kube.registration_body(name="w1"))
    seen: list[tuple[str, str]] = []
    ready = threading.Event()

    def consume() -> None:
        stream = watch.Watch()
        ready.set()
        for event in stream.stream(
            kube.custom(admin).list_namespaced_custom_object,
            api.GROUP,
            api.VERSION,
            namespace,
            api.PLURAL,
            resource_version=created["metadata"]["resourceVersion"],
            timeout_seconds=20,
        ):
            obj = event["object"]
            seen.append((event["type"], obj.get("status", {}).get("lastHeartbeatTime", "")))
            if len(seen) >= 3:
                stream.stop()

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    ready.wait()
    for second in range(3):
        kube.patch_status(admin, namespace, "w1", {"status": {"lastHeartbeatTime": f"2026-01-01T00:00:0{second}Z"}})
    thread.join(timeout=25)
    assert seen == [("MODIFIED", f"2026-01-01T00:00:0{s}Z") for s in range(3)]
