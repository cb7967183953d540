"""What Coroner takes as a person's word without knowing who said it (accepted risks, docs/security.md).

- The `node.kubernetes.io/out-of-service` taint is a person's statement that a node is shut down
  (NodeOutOfService), but any identity that may patch Nodes can set it: a robot's taint decides the same.
  Doctor's `node-taint-access` names who can.
- The policy the operator publishes on its Lease (`coroner.dev/policy`) is adopted by a person's `plan`
  and `apply`. Only the operator's identity and cluster admins may write that Lease (policy 9): an editor
  of the system namespace is refused; who can get the operator's token is `system-namespace-access`'s.

Real API server and admission; `kubectl coroner plan` and `doctor` in-process.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.client.kube import api_client
from coroner.core import api, policy_json
from coroner.core.decision import Policy
from coroner_dev.devcluster.cluster import Cluster
from coroner_dev.devcluster.identities import ensure_node, mint_token, user_kubeconfig
from integration.test_kubectl_plugin import as_json, coroner
from support import kube

pytestmark = [pytest.mark.integration]

SYSTEM = api.SYSTEM_NAMESPACE
TAINT = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}
PATCHER = "node-patcher-robot"


@pytest.fixture
def robot(granted: Cluster, admin: k8s.ApiClient, namespace: str) -> Iterator[k8s.ApiClient]:
    """A ServiceAccount that may patch Nodes, as a network plugin's or an autoscaler's may."""
    rbac = k8s.RbacAuthorizationV1Api(admin)
    rule = k8s.V1PolicyRule(api_groups=[""], resources=["nodes"], verbs=["get", "patch"])
    rbac.create_cluster_role(k8s.V1ClusterRole(metadata=k8s.V1ObjectMeta(name=PATCHER), rules=[rule]))
    rbac.create_cluster_role_binding(
        k8s.V1ClusterRoleBinding(
            metadata=k8s.V1ObjectMeta(name=PATCHER),
            role_ref=k8s.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=PATCHER),
            subjects=[k8s.RbacV1Subject(kind="ServiceAccount", name=PATCHER, namespace=namespace)],
        )
    )
    try:
        with api_client(mint_token(granted, service_account=f"{namespace}/{PATCHER}")) as client:
            yield client
    finally:
        rbac.delete_cluster_role_binding(PATCHER)
        rbac.delete_cluster_role(PATCHER)


def test_a_robots_out_of_service_taint_decides_as_a_persons_and_doctor_names_the_robot(
    granted: Cluster, admin: k8s.ApiClient, namespace: str, robot: k8s.ApiClient, operator_lease: str
) -> None:
    # The operator's policy as components/node-loss sets it (whatever an operator an earlier test ran published).
    taken = policy_json.dump_policy(Policy(node_out_of_service_evidence=True))
    k8s.CoordinationV1Api(admin).patch_namespaced_lease(
        operator_lease, SYSTEM, {"metadata": {"annotations": {api.POLICY_ANNOTATION: taken}}}
    )
    node = f"node-taint-{uuid.uuid4().hex[:6]}"
    ensure_node(granted, name=node)
    kube.create_registration(admin, namespace, kube.registration_body(name="stranded", node=node))
    try:

        def tainted() -> bool:
            try:
                k8s.CoreV1Api(robot).patch_node(node, {"spec": {"taints": [TAINT]}})
            except ApiException as exc:
                if exc.status == 403:  # its ClusterRoleBinding not yet in the authorizer's cache
                    return False
                raise
            return True

        kube.wait_for(tainted, what="the robot's taint admitted")
        result = coroner(granted, "plan", "-n", namespace, "-o", "json", kubeconfig=granted.kubeconfig)
        (row,) = [row for row in as_json(result)["registrations"] if row["name"] == "stranded"]
        # As it stands: the robot's taint is the evidence a person's statement would be.
        assert "NodeOutOfService" in json.dumps(row), row

        result = coroner(granted, "doctor", "-o", "json", kubeconfig=granted.kubeconfig)
        check = {check["name"]: check for check in as_json(result)["checks"]}["node-taint-access"]
        assert check["status"] == "WARN", check
        assert f"ServiceAccount/{namespace}/{PATCHER}" in check["objects"]
        assert PATCHER in check["summary"]
    finally:
        k8s.CoreV1Api(admin).delete_node(node)


@pytest.fixture
def operator_lease(granted: Cluster, admin: k8s.ApiClient) -> Iterator[str]:
    """The operator's Lease, as it is or made for the test (then deleted)."""
    coordination = k8s.CoordinationV1Api(admin)
    made = False
    try:
        body = k8s.V1Lease(
            metadata=k8s.V1ObjectMeta(name=api.OPERATOR_LEASE), spec=k8s.V1LeaseSpec(holder_identity="test")
        )
        coordination.create_namespaced_lease(SYSTEM, body)
        made = True
    except ApiException as exc:
        if exc.status != 409:
            raise
    before = coordination.read_namespaced_lease(api.OPERATOR_LEASE, SYSTEM).metadata.annotations or {}  # type: ignore[union-attr]
    try:
        yield api.OPERATOR_LEASE
    finally:
        if made:
            coordination.delete_namespaced_lease(api.OPERATOR_LEASE, SYSTEM)
        else:
            restored = {api.POLICY_ANNOTATION: before.get(api.POLICY_ANNOTATION)}
            coordination.patch_namespaced_lease(api.OPERATOR_LEASE, SYSTEM, {"metadata": {"annotations": restored}})


def test_the_policy_on_the_operators_lease_is_adopted_and_only_the_operator_or_an_admin_writes_it(
    granted: Cluster, admin: k8s.ApiClient, namespace: str, operator_lease: str
) -> None:
    loose = policy_json.dump_policy(Policy(node_deletion_evidence=True, node_deletion_quarantine_seconds=0))
    patch = {"metadata": {"annotations": {api.POLICY_ANNOTATION: loose}}}
    editor = f"lease-editor-{uuid.uuid4().hex[:6]}"
    k8s.RbacAuthorizationV1Api(admin).create_namespaced_role_binding(
        SYSTEM,
        k8s.V1RoleBinding(
            metadata=k8s.V1ObjectMeta(name=editor),
            role_ref=k8s.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="edit"),
            subjects=[k8s.RbacV1Subject(kind="User", name=editor, api_group="rbac.authorization.k8s.io")],
        ),
    )
    try:
        with api_client(user_kubeconfig(granted, user=editor)) as client:

            def refused_by_admission() -> str | None:
                try:
                    k8s.CoordinationV1Api(client).patch_namespaced_lease(operator_lease, SYSTEM, patch)
                except ApiException as exc:
                    message = kube.api_error_body(exc).get("message", "")
                    return message if "ValidatingAdmissionPolicy" in message else None
                raise AssertionError("an editor of the system namespace rewrote the operator's published policy")

            message = kube.wait_for(refused_by_admission, what="the editor's write refused by admission")
            assert "coroner-system-leases-by-owner" in message, message
    finally:
        k8s.RbacAuthorizationV1Api(admin).delete_namespaced_role_binding(editor, SYSTEM)

    # A cluster admin (or the operator's own token) may; a person's plan then decides with it.
    k8s.CoordinationV1Api(admin).patch_namespaced_lease(operator_lease, SYSTEM, patch)
    result = coroner(granted, "plan", "-n", namespace, "-o", "json", kubeconfig=granted.kubeconfig)
    policy = as_json(result)["policy"]
    assert policy["source"] == "operator", policy
    assert policy["values"]["nodeDeletionEvidence"] is True
    assert policy["values"]["nodeDeletionQuarantineSeconds"] == 0
