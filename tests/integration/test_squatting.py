"""Squatting: a peer that may create registrations copies a live worker's clientInstanceId onto a
node with no agent, as another ServiceAccount (kubectl --as, the way the attack was tried). The
worker is SIGKILLed: it must still be retired, because a claim binds only between registrations of
one registrant (coroner.dev/registered-by, which admission admits only as the requester), and
`kubectl coroner doctor` must name the copy and who made it.

Real worker (`coroner run`), real agent, real operator, real API server and admission, real kubectl.
"""

from __future__ import annotations

import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from coroner.core import api
from coroner_dev.devcluster.cluster import Cluster
from integration.test_kubectl_plugin import as_json, coroner
from support import components, kube
from support.fleet import Node, attestation, launch, worker_kubeconfig

pytestmark = [pytest.mark.integration, pytest.mark.procs]

REAL_BOOT = pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip()


@pytest.fixture
def node(plane: Cluster, tmp_path: pathlib.Path) -> Iterator[Node]:
    made = Node(plane, tmp_path, f"node-squat-{uuid.uuid4().hex[:6]}", REAL_BOOT)
    try:
        yield made
    finally:
        made.stop_agent()


def squat_body(victim: dict[str, Any], *, name: str, node_name: str, registrant: str) -> dict[str, Any]:
    """The victim's claims on another node, as the attacker writes them: admission admits the create
    only when it names its real requester as the registrant."""
    spec = dict(victim["spec"])
    spec["nodeName"] = node_name
    spec.pop("nodeUID", None)
    return {
        "apiVersion": f"{api.GROUP}/{api.VERSION}",
        "kind": "WorkerRegistration",
        "metadata": {
            "name": name,
            "namespace": victim["metadata"]["namespace"],
            "labels": {api.NODE_LABEL: node_name},
            "annotations": {api.REGISTERED_BY_ANNOTATION: registrant},
        },
        "spec": spec,
    }


def test_a_squatter_of_another_identity_keeps_no_dead_worker_and_doctor_names_it(
    plane: Cluster, node: Node, admin: k8s.ApiClient, namespace: str, tmp_path: pathlib.Path
) -> None:
    node.start_agent()
    worker = launch(
        namespace=namespace,
        kubeconfig=worker_kubeconfig(plane, namespace),
        directory=tmp_path,
        name="victim",
        node=node,
    )
    kube.wait_for(lambda: attestation(admin, namespace, "victim").get("verdict") == "Alive", what="victim Alive")
    victim = kube.get_registration(admin, namespace, "victim")

    # The attack: another ServiceAccount of the namespace, allowed to register workers, copies the
    # victim's clientInstanceId onto a node that has no agent.
    # Impersonated as a Pod of that ServiceAccount would be (a Pod-bound token carries these extras).
    pod_uid = str(uuid.uuid4())
    squatter_user = f"system:serviceaccount:{namespace}:squatter"
    squatter = f"{squatter_user} pod/squatter-0/{pod_uid}"
    impersonation = (
        f"--as={squatter_user}",
        "--as-user-extra=authentication.kubernetes.io/pod-name=squatter-0",
        f"--as-user-extra=authentication.kubernetes.io/pod-uid={pod_uid}",
    )
    kube.kubectl(plane, "-n", namespace, "create", "serviceaccount", "squatter")
    kube.kubectl(plane, "-n", namespace, "create", "rolebinding", "squatter", "--clusterrole=coroner-worker",
                 f"--serviceaccount={namespace}:squatter")  # fmt: skip
    body = yaml.safe_dump(squat_body(victim, name="squat", node_name="node-without-agent", registrant=squatter))
    answers: list[str] = []

    def create() -> bool:
        result = kube.kubectl(plane, "create", "-f", "-", *impersonation, stdin=body, check=False)
        answers.append(result.stderr)
        return result.returncode == 0

    try:
        kube.wait_for(create, what="the squatter's create admitted (its RoleBinding in the authorizer's cache)")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the API server said: {answers[-1]}") from None
    squat = kube.get_registration(admin, namespace, "squat")
    assert squat["spec"]["clientInstanceId"] == victim["spec"]["clientInstanceId"]
    assert squat["metadata"]["annotations"][api.REGISTERED_BY_ANNOTATION] == squatter
    assert victim["metadata"]["annotations"][api.REGISTERED_BY_ANNOTATION] != squatter

    worker.kill()
    kube.wait_for(lambda: components.retired(admin, namespace, "victim"), timeout=30, what="the victim retired")
    assert kube.get_registration(admin, namespace, "victim")["status"]["retirement"]["reason"] == "PidfdExited"
    assert not components.retired(admin, namespace, "squat")  # nothing attests it: it stays, and is named

    result = coroner(plane, "doctor", "-o", "json", kubeconfig=plane.kubeconfig)
    checks = {check["name"]: check for check in as_json(result)["checks"]}
    check = checks["squatting"]
    assert check["status"] == "FAIL", check
    assert f"workerregistration/{namespace}/squat" in check["objects"]
    assert squatter in check["summary"]
    found = [item for item in check["facts"]["squatters"] if item["registration"] == f"{namespace}/squat"]
    assert found and found[0]["registeredBy"] == squatter and found[0]["claims"] == ["clientInstanceId"]
