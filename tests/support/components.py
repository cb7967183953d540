"""Coroner's own components (operator, agent, workers) in tests: the tests' names for
`coroner_dev.fleet`, with the tests' defaults, and the test-side playing of an agent's part."""

from __future__ import annotations

import contextlib
import datetime
import pathlib
import subprocess
from collections.abc import Iterator
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.core import api, model
from coroner_dev import fleet
from coroner_dev.devcluster.cluster import Cluster
from support import kube

BIN = fleet.BIN
SYSTEM = api.SYSTEM_NAMESPACE


def install(cluster: Cluster, *, grant: bool, node_loss: bool = False) -> None:
    """The manifests as an admin applies them (`coroner_dev.fleet.install`)."""
    fleet.install(cluster, grant=grant, node_loss=node_loss)


def operator_kubeconfig(cluster: Cluster) -> pathlib.Path:
    return fleet.operator_kubeconfig(cluster)


def agent_kubeconfig(cluster: Cluster, node: str) -> pathlib.Path:
    return fleet.agent_kubeconfig(cluster, node=node)


@contextlib.contextmanager
def process(
    argv: list[str], *, log: pathlib.Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A component process for the duration of a block; SIGTERM then SIGKILL afterwards."""
    proc = fleet.spawn(argv, log=log, env=env)
    try:
        yield proc
    finally:
        fleet.stop(proc)


stop = fleet.stop


def operator_argv(kubeconfig: pathlib.Path, *extra: str) -> list[str]:
    """The operator's command line, re-checking its permissions every second (tests revoke them)."""
    return fleet.operator_argv(kubeconfig=kubeconfig, extra=("--permission-refresh-seconds=1", *extra))


def agent_argv(
    kubeconfig: pathlib.Path, *, node: str, boot_id_file: pathlib.Path, extra: tuple[str, ...] = ()
) -> list[str]:
    return fleet.agent_argv(kubeconfig=kubeconfig, node=node, boot_id_file=boot_id_file, extra=extra)


def now_text(offset_seconds: float = 0.0) -> str:
    moment = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=offset_seconds)
    return model.format_time(moment, fraction=True)


def put_agent_lease(
    admin: k8s.ApiClient,
    *,
    node: str,
    boot_id: str,
    host_id: str,
    duration: int = 60,
    renew_offset: float = 0.0,
    namespace: str = SYSTEM,
) -> None:
    """Publishes an agent Lease as a live agent would (for tests that play the agent's part), in the
    system `namespace` (a Helm release's own)."""
    coordination = k8s.CoordinationV1Api(admin)
    name = f"{api.AGENT_LEASE_PREFIX}{node}"
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {api.AGENT_LEASE_BOOT_ID: boot_id, api.AGENT_LEASE_HOST_ID: host_id},
        },
        "spec": {
            "holderIdentity": f"test-agent-{node}",
            "leaseDurationSeconds": duration,
            "renewTime": now_text(renew_offset),
        },
    }
    try:
        coordination.create_namespaced_lease(namespace, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        coordination.patch_namespaced_lease(name, namespace, body)


def attestation(
    body: dict[str, Any], *, verdict: str = "Dead", evidence: str = "PidfdExited", node: str | None = None
) -> dict[str, Any]:
    """An attestation exactly as the agent writes it, about the registration's own incarnation."""
    spec = body["spec"]
    inc = spec["incarnation"]
    return {
        "verdict": verdict,
        "evidence": evidence,
        "detail": "written by a test playing the agent",
        "incarnation": inc,
        "bootId": inc["bootId"],
        "hostId": inc["hostId"],
        "observedTime": now_text(),
        "heartbeatSeen": (body.get("status") or {}).get("lastHeartbeatTime", ""),
        "agent": {"nodeName": node or spec["nodeName"], "podName": "test", "identity": "test"},
    }


def attest(agent: k8s.ApiClient, namespace: str, name: str, **kwargs: Any) -> dict[str, Any]:
    body = kube.get_registration(agent, namespace, name)
    return kube.patch_status(agent, namespace, name, {"status": {"attestation": attestation(body, **kwargs)}})


def condition(body: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for item in (body.get("status") or {}).get("conditions") or []:
        if item.get("type") == type_:
            return dict(item)
    return None


def reason(client: k8s.ApiClient, namespace: str, name: str) -> str | None:
    found = condition(kube.get_registration(client, namespace, name), "Retirable")
    return None if found is None else str(found.get("reason"))


def retired(client: k8s.ApiClient, namespace: str, name: str) -> bool:
    return "retirement" in (kube.get_registration(client, namespace, name).get("status") or {})


def events(client: k8s.ApiClient, namespace: str, *, reason: str = "Retired") -> list[k8s.CoreV1Event]:
    return [e for e in k8s.CoreV1Api(client).list_namespaced_event(namespace).items if e.reason == reason]
