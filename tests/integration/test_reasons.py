"""Every reason code of the design, reached through a real scenario on the real API server.

The operator runs as its own ServiceAccount; attestations are written with the agent's node-bound
identity (admission accepts them from nobody else). Unit tests cover each line's boundaries; these
prove that each reason reaches a person through `kubectl get registrations` for real.
"""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.client.kube import api_client
from coroner.core import wire
from coroner.core.reasons import Reason
from coroner_dev.devcluster.cluster import Cluster
from coroner_dev.devcluster.identities import ensure_node
from support import components, kube

pytestmark = pytest.mark.integration

BOOT = "8d0a4c6e-3b1f-4c1e-9a56-0d6f0c1b2a3e"
HOST = "0f2e7a1c9d8b4e6f8a7b6c5d4e3f2a1b"


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    components.install(cluster, grant=True, node_loss=True)  # the operator's node evidence, as below
    logs = tmp_path_factory.mktemp("operator")
    argv = components.operator_argv(
        components.operator_kubeconfig(cluster),
        "--node-deletion-evidence",
        "--node-quarantine-seconds=1",
        "--node-out-of-service-evidence",
    )
    with components.process(argv, log=logs / "operator.log"):
        yield cluster


class Scene:
    """One namespace, one live agent Lease for node-a, and the agent's identity for node-a."""

    def __init__(self, cluster: Cluster, admin: k8s.ApiClient, namespace: str, agent: k8s.ApiClient) -> None:
        self.cluster, self.admin, self.namespace, self.agent = cluster, admin, namespace, agent

    def register(self, name: str, *, heartbeat_age: float = 120.0, **kwargs: Any) -> dict[str, Any]:
        kube.create_registration(self.admin, self.namespace, kube.registration_body(name=name, **kwargs))
        return kube.patch_status(
            self.admin, self.namespace, name, {"status": {"lastHeartbeatTime": components.now_text(-heartbeat_age)}}
        )

    def attest(self, name: str, *, agent: k8s.ApiClient | None = None, **overrides: Any) -> None:
        body = kube.get_registration(self.admin, self.namespace, name)
        attestation = components.attestation(body, evidence=overrides.pop("evidence", "PidfdExited"))
        for path, value in overrides.items():
            target = attestation
            *parents, leaf = path.split(".")
            for part in parents:
                target = target[part]
            target[leaf] = value
        kube.patch_status(agent or self.agent, self.namespace, name, {"status": {"attestation": attestation}})

    def reason(self, name: str) -> str | None:
        return components.reason(self.admin, self.namespace, name)


@pytest.fixture
def scene(operator: Cluster, admin: k8s.ApiClient, namespace: str) -> Iterator[Scene]:
    components.put_agent_lease(admin, node="node-a", boot_id=BOOT, host_id=HOST, duration=3600)
    ensure_node(operator, name="node-a", boot_id=BOOT)
    with api_client(components.agent_kubeconfig(operator, "node-a")) as agent:
        yield Scene(operator, admin, namespace, agent)


def _mismatch(s: Scene) -> None:
    s.register("w")
    s.attest("w", **{"incarnation.pid": 4243})


def _host(s: Scene) -> None:
    s.register("w")
    s.attest("w", hostId="another-host", **{"incarnation.hostId": "another-host"})


def _stale(s: Scene) -> None:
    # The agent now runs on another boot than the one it attested from (an attestation never ages).
    s.register("w")
    s.attest("w", bootId=str(uuid.uuid4()))


def _death_unconfirmed(s: Scene) -> None:
    # No heartbeats, and a death read from /proc that the agent saw only once.
    s.register("w", interval=None, ttl=None)
    s.attest("w", evidence="ProcAbsent")


def _heartbeat_after(s: Scene) -> None:
    s.register("w", interval=60, ttl=600, heartbeat_age=1)  # ProcAbsent must wait 120 s: no race
    s.attest("w", evidence="ProcAbsent")
    kube.patch_status(s.admin, s.namespace, "w", {"status": {"lastHeartbeatTime": components.now_text()}})


def _reused(s: Scene) -> None:
    s.register("w")
    s.attest("w", verdict="Reused", evidence="StartTimeDiffers")


def _unknown_verdict(s: Scene) -> None:
    s.register("w")
    s.attest("w", verdict="Zombie", evidence="StateZ")


def _agent_unavailable(s: Scene) -> None:
    node = f"node-{uuid.uuid4().hex[:6]}"  # a node whose agent never published a Lease
    s.register("w", node=node)
    with api_client(components.agent_kubeconfig(s.cluster, node)) as agent:
        s.attest("w", agent=agent)


def _boot_unknown(s: Scene) -> None:
    node = f"node-{uuid.uuid4().hex[:6]}"
    components.put_agent_lease(s.admin, node=node, boot_id=BOOT, host_id=HOST, duration=3600)
    ensure_node(s.cluster, name=node, boot_id=str(uuid.uuid4()))  # the Node disagrees with the agent
    s.register("w", node=node)
    with api_client(components.agent_kubeconfig(s.cluster, node)) as agent:
        s.attest("w", agent=agent)


def _instance_conflict(s: Scene) -> None:
    s.register("w", client_instance_id="inst-shared")
    s.register("twin", client_instance_id="inst-shared", pid=5000)
    s.attest("w")
    s.attest("twin", verdict="Alive", evidence="PidfdPinned")


def _conflicting_identity(s: Scene) -> None:
    s.register("w")
    s.register("twin", client_instance_id="inst-twin")  # the same incarnation, registered twice
    s.attest("w")
    s.attest("twin", verdict="Alive", evidence="PidfdPinned")


def _already_terminal(s: Scene) -> None:
    """The worker's goodbye as the launcher says it: a server-side apply of Released alone. (A merge
    patch of the whole conditions list raced the operator: once its Attested and Retirable were
    there, the patch removed them, and admission refused the admin that.)"""
    s.register("w")
    condition = wire.released_condition(message="bye", now=datetime.datetime.now(datetime.UTC), generation=1)
    body = wire.release_apply(name="w", namespace=s.namespace, condition=condition)
    kube.kubectl(
        s.cluster, "apply", "--server-side", "--subresource=status", f"--field-manager={wire.RELEASE_FIELD_MANAGER}",
        "--force-conflicts", "-f", "-", stdin=json.dumps(body),
    )  # fmt: skip


SCENARIOS: list[Any] = [
    pytest.param(_mismatch, Reason.ATTESTATION_MISMATCH, id="AttestationMismatch"),
    pytest.param(_host, Reason.HOST_BINDING_UNPROVEN, id="HostBindingUnproven"),
    pytest.param(_stale, Reason.ATTESTATION_STALE, id="AttestationStale"),
    pytest.param(_death_unconfirmed, Reason.DEATH_UNCONFIRMED, id="DeathUnconfirmed"),
    pytest.param(_heartbeat_after, Reason.HEARTBEAT_AFTER_ATTESTATION, id="HeartbeatAfterAttestation"),
    pytest.param(_reused, Reason.PID_REUSE_DETECTED, id="PidReuseDetected"),
    pytest.param(_unknown_verdict, Reason.LIVENESS_UNKNOWN, id="LivenessUnknown"),
    pytest.param(_agent_unavailable, Reason.AGENT_UNAVAILABLE, id="AgentUnavailable"),
    pytest.param(_boot_unknown, Reason.BOOT_IDENTITY_UNKNOWN, id="BootIdentityUnknown"),
    pytest.param(_instance_conflict, Reason.CLIENT_INSTANCE_CONFLICT, id="ClientInstanceConflict"),
    pytest.param(_conflicting_identity, Reason.CONFLICTING_IDENTITY, id="ConflictingIdentity"),
    pytest.param(_already_terminal, Reason.ALREADY_TERMINAL, id="AlreadyTerminal"),
]


@pytest.mark.parametrize(("setup", "expected"), SCENARIOS)
def test_reason_reached_for_real(scene: Scene, setup: Callable[[Scene], None], expected: Reason) -> None:
    setup(scene)
    kube.wait_for(lambda: scene.reason("w") == expected.value, timeout=20, what=expected.value)
    assert not components.retired(scene.admin, scene.namespace, "w")
    row = kube.kubectl(scene.cluster, "get", "registrations", "-n", scene.namespace, "w", "--no-headers").stdout
    assert expected.value in row


def test_incomplete_identity_cannot_even_be_stored(scene: Scene) -> None:
    # IncompleteIdentity is defence in depth: the CRD's schema refuses the objects that would earn
    # it, so on this server the reason is reachable only through unit tests.
    body = kube.registration_body(name="w")
    del body["spec"]["incarnation"]["startTime"]
    with pytest.raises(ApiException) as raised:
        kube.create_registration(scene.admin, scene.namespace, body)
    assert raised.value.status == 422 and "startTime" in kube.api_error_body(raised.value)["message"]


def test_deleted_node_is_evidence_only_after_a_live_get_and_the_quarantine(scene: Scene) -> None:
    node = f"node-{uuid.uuid4().hex[:6]}"
    ensure_node(scene.cluster, name=node, boot_id=BOOT)
    scene.register("w", node=node)
    # No agent ever published a Lease for this node: nothing attested, and nothing can be.
    kube.wait_for(lambda: scene.reason("w") == Reason.AGENT_UNAVAILABLE.value, what="unattested")
    k8s.CoreV1Api(scene.admin).delete_node(node)
    kube.wait_for(lambda: components.retired(scene.admin, scene.namespace, "w"), timeout=30, what="retirement")
    assert kube.get_registration(scene.admin, scene.namespace, "w")["status"]["retirement"]["reason"] == "NodeDeleted"


def test_out_of_service_taint_is_a_human_statement_of_death(scene: Scene) -> None:
    node = f"node-{uuid.uuid4().hex[:6]}"
    ensure_node(scene.cluster, name=node, boot_id=BOOT)
    scene.register("w", node=node)
    # No agent ever published a Lease for this node: nothing attested, and nothing can be.
    kube.wait_for(lambda: scene.reason("w") == Reason.AGENT_UNAVAILABLE.value, what="unattested")
    kube.kubectl(scene.cluster, "taint", "node", node, "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute")
    kube.wait_for(lambda: components.retired(scene.admin, scene.namespace, "w"), timeout=30, what="retirement")
    reason = kube.get_registration(scene.admin, scene.namespace, "w")["status"]["retirement"]["reason"]
    assert reason == "NodeOutOfService"
