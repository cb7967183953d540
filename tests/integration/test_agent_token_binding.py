"""Who may speak as a node's agent: only the agent's own Pod on that node.

A token bound to a Node object carries that node's name as `authentication.kubernetes.io/node-name`,
as a Pod-bound one does, and Kubernetes' own `edit` and `admin` roles may create
`serviceaccounts/token`: whoever was bound to them in the system namespace could mint a token of the
agent for any Node, one whose agent is down included. Two rules close it: only the kubelet mints
tokens of the system namespace's ServiceAccounts (policy 10, cluster admins exempt), and the agent's
token must be bound to a Pod (policies 3 and 5), which the API server mints only for a Pod of that
ServiceAccount, writing the Pod's node into it.

Real API server, real admission, tokens from the real TokenRequest API, one asked for by a person bound
to `edit` in the system namespace; `kubectl coroner doctor` names that person.
"""

from __future__ import annotations

import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.client.kube import api_client
from coroner.core import api
from coroner_dev.devcluster.cluster import Cluster, write_kubeconfig
from coroner_dev.devcluster.identities import ensure_node, user_kubeconfig
from integration.test_kubectl_plugin import as_json, coroner
from support import components, kube, pods

pytestmark = [pytest.mark.integration]

SYSTEM = api.SYSTEM_NAMESPACE
AGENT = "coroner-agent"
EDITOR = "system-namespace-editor"


@pytest.fixture
def editor(granted: Cluster, admin: k8s.ApiClient) -> Iterator[k8s.ApiClient]:
    """A person bound to Kubernetes' own `edit` role in the system namespace."""
    rbac = k8s.RbacAuthorizationV1Api(admin)
    binding = k8s.V1RoleBinding(
        metadata=k8s.V1ObjectMeta(name=EDITOR),
        role_ref=k8s.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="edit"),
        subjects=[k8s.RbacV1Subject(kind="User", name=EDITOR, api_group="rbac.authorization.k8s.io")],
    )
    try:
        rbac.create_namespaced_role_binding(SYSTEM, binding)
    except ApiException as exc:
        if exc.status != 409:
            raise
    try:
        with api_client(user_kubeconfig(granted, user=EDITOR)) as client:
            yield client
    finally:
        rbac.delete_namespaced_role_binding(EDITOR, SYSTEM)


def node_bound(cluster: Cluster, node: str) -> k8s.AuthenticationV1TokenRequest:
    uid = ensure_node(cluster, name=node).metadata.uid  # type: ignore[union-attr]
    return k8s.AuthenticationV1TokenRequest(
        spec=k8s.V1TokenRequestSpec(
            audiences=[],
            expiration_seconds=600,
            bound_object_ref=k8s.V1BoundObjectReference(api_version="v1", kind="Node", name=node, uid=uid),
        )
    )


def mint(cluster: Cluster, client: k8s.ApiClient, node: str) -> pathlib.Path | ApiException:
    """`client`'s own TokenRequest for the agent's ServiceAccount bound to Node `node`: a kubeconfig for the
    token, or admission's refusal (RBAC's, while the editor's RoleBinding is not yet in its cache, is retried)."""

    def attempt() -> str | ApiException | None:
        try:
            answer = k8s.CoreV1Api(client).create_namespaced_service_account_token(
                AGENT, SYSTEM, node_bound(cluster, node)
            )
        except ApiException as exc:
            if exc.status == 403 and "ValidatingAdmissionPolicy" in str(exc.body):
                return exc
            if exc.status == 403:
                return None
            raise
        return str(answer.status.token)  # type: ignore[union-attr]

    token = kube.wait_for(attempt, what="the TokenRequest for the agent admitted or refused by admission")
    if isinstance(token, ApiException):
        return token
    user = f"{SYSTEM}.{AGENT}.minted-{node}"
    path = cluster.directory / "tokens" / f"{user}.kubeconfig"
    return write_kubeconfig(path, server=cluster.server, ca=cluster.pki.ca_cert, user=user, token=token)


def refused(call: object) -> ApiException | None:
    try:
        call()  # type: ignore[operator]
    except ApiException as exc:
        if exc.status in (403, 422):
            return exc
        raise
    return None


def lease_body(node: str) -> Any:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": f"{api.AGENT_LEASE_PREFIX}{node}", "namespace": SYSTEM},
        "spec": {"holderIdentity": "minted", "leaseDurationSeconds": 60, "renewTime": components.now_text()},
    }


def test_an_editor_of_the_system_namespace_cannot_mint_an_agents_token(granted: Cluster, editor: k8s.ApiClient) -> None:
    minted = mint(granted, editor, f"node-minted-{uuid.uuid4().hex[:6]}")
    assert isinstance(minted, ApiException), "an editor of the system namespace minted a token of the agent"
    message = kube.api_error_body(minted).get("message", "")
    assert "coroner-system-tokens-by-kubelet" in message, message
    assert "only the kubelet mints the tokens" in message


def test_a_node_bound_agent_token_neither_attests_nor_renews_a_lease(
    granted: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    node = f"node-minted-{uuid.uuid4().hex[:6]}"
    kube.create_registration(admin, namespace, kube.registration_body(name="live", node=node))
    minted = mint(granted, admin, node)  # a cluster admin may mint it: the token itself must not speak
    assert not isinstance(minted, ApiException), minted.body

    with api_client(minted) as agent:
        attested = refused(lambda: components.attest(agent, namespace, "live", verdict="Dead", evidence="ProcAbsent"))
        assert attested is not None, "a Node-bound agent token attested: it speaks for the node"
        assert "bound to a Pod" in kube.api_error_body(attested).get("message", ""), attested.body
        renewed = refused(lambda: k8s.CoordinationV1Api(agent).create_namespaced_lease(SYSTEM, lease_body(node)))
        assert renewed is not None, "a Node-bound agent token created the node's agent Lease"
        assert "bound to a Pod" in kube.api_error_body(renewed).get("message", ""), renewed.body
    assert "attestation" not in (kube.get_registration(admin, namespace, "live").get("status") or {})


def test_a_token_of_an_agent_pod_on_the_node_attests_and_renews_its_lease(
    granted: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    node = f"node-pod-{uuid.uuid4().hex[:6]}"
    kube.create_registration(admin, namespace, kube.registration_body(name="dead", node=node))
    pod = f"{AGENT}-{uuid.uuid4().hex[:5]}"
    config = pods.pod_token(granted, namespace=SYSTEM, service_account=AGENT, pod=pod, node=node)
    try:
        with api_client(config) as agent:
            written = components.attest(agent, namespace, "dead", verdict="Dead", evidence="ProcAbsent")
            assert written["status"]["attestation"]["verdict"] == "Dead"
            k8s.CoordinationV1Api(agent).create_namespaced_lease(SYSTEM, lease_body(node))
    finally:
        pods.delete_pod(admin, namespace=SYSTEM, pod=pod)
        k8s.CoordinationV1Api(admin).delete_namespaced_lease(f"{api.AGENT_LEASE_PREFIX}{node}", SYSTEM)


def test_doctor_names_who_can_mint_agent_tokens(granted: Cluster, editor: k8s.ApiClient) -> None:
    del editor  # bound for the duration of the test
    result = coroner(granted, "doctor", "-o", "json", kubeconfig=granted.kubeconfig)
    checks = {check["name"]: check for check in as_json(result)["checks"]}
    check = checks["system-namespace-access"]
    assert check["status"] == "WARN", check
    assert f"User/{EDITOR}" in check["objects"], check
    assert f"User/{EDITOR}" in check["summary"]
    rows = [row for row in check["facts"]["subjects"] if row["subject"] == f"User/{EDITOR}"]
    assert rows and {"create serviceaccounts/token", "create pods/exec", "create pods"} <= set(rows[0]["can"])
    assert rows[0]["via"] == [f"RoleBinding/{SYSTEM}/{EDITOR} (ClusterRole/edit)"]
