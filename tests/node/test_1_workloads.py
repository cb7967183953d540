"""Coroner as it ships, on a real node: the agent DaemonSet and the operator Deployment scheduled by
kube-scheduler and run by a kubelet under containerd + runc from the images built here, and workers
in Pods of their own (their own pid namespace) launched by `coroner run`.

Nothing here starts a Coroner process on the host: every agent, operator and worker is a container
of a Pod of the shipped manifests (production overlay through the one test overlay, see
`coroner_dev.realnode`). The host is only used as a person with root on the node would use it:
to find a process and kill it, and to read /proc.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import signal
import time
import uuid
from typing import Any

import pytest

from coroner_dev import realnode
from coroner_dev.devcluster.cluster import Cluster
from support.nodes import (
    NODE,
    agent_pids,
    get_json,
    host_pids,
    kubectl,
    registrations,
    state,
    status_field,
    verdict,
    wait_for,
)

pytestmark = pytest.mark.node


def run_worker(
    cluster: Cluster, namespace: str, *, name: str, command: list[str], restart_policy: str = "Never"
) -> None:
    pod = realnode.worker_pod(
        name, namespace=namespace, node=NODE, cluster=cluster, command=command, restart_policy=restart_policy
    )
    realnode.apply_objects(cluster, [pod])


def only_registration(cluster: Cluster, namespace: str) -> dict[str, Any] | None:
    items = registrations(cluster, namespace)
    return items[0] if len(items) == 1 else None


def alive_registration(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return wait_for(
        lambda: (r := only_registration(cluster, namespace)) and verdict(r) == "Alive" and r,
        timeout=90,
        what=f"one registration in {namespace} attested Alive by the node's agent",
    )


def jwt_claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    claims: dict[str, Any] = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return claims


def test_the_agent_daemonset_runs_with_a_kubelet_projected_pod_bound_token_and_its_seccomp_profile(
    node_cluster: Cluster,
) -> None:
    (pod,) = get_json(node_cluster, "-n", "coroner-system", "pods", "-l", "app.kubernetes.io/name=coroner-agent")[
        "items"
    ]
    assert pod["spec"]["nodeName"] == NODE
    assert pod["status"]["phase"] == "Running"
    assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"] == "True"
    # The ServiceAccount admission plugin gave it the projected, kubelet-rotated token volume.
    projected = [v for v in pod["spec"]["volumes"] if "projected" in v]
    assert any("serviceAccountToken" in s for v in projected for s in v["projected"]["sources"])

    (pid,) = agent_pids()
    # runc loaded a seccomp filter into the agent (the Localhost profile the init container installed).
    assert status_field(pid, "Seccomp") == "2"
    assert status_field(pid, "NoNewPrivs") == "1"
    # Its own uid, and no capability at all, effective or permitted.
    assert status_field(pid, "Uid").split()[0] == "64242"
    assert int(status_field(pid, "CapEff"), 16) == 0
    assert int(status_field(pid, "CapPrm"), 16) == 0
    # The token in the container is the kubelet's Pod-bound one, naming the pod and the node: the
    # claims the admission policies read as the requester's node.
    token = pathlib.Path(f"/proc/{pid}/root/run/secrets/kubernetes.io/serviceaccount/token").read_text()
    claims = jwt_claims(token)["kubernetes.io"]
    assert claims["pod"]["name"] == pod["metadata"]["name"]
    assert claims["pod"]["uid"] == pod["metadata"]["uid"]
    assert claims["node"]["name"] == NODE
    assert claims["serviceaccount"]["name"] == "coroner-agent"

    # It renews its node Lease.
    def renew_time() -> str:
        lease = get_json(node_cluster, "-n", "coroner-system", "lease", f"coroner-agent-{NODE}")
        return str(lease["spec"]["renewTime"])

    first = wait_for(renew_time, timeout=60, what="the agent's Lease")
    wait_for(lambda: renew_time() != first, timeout=60, what="a renewal of the agent's Lease")


def test_the_operator_deployment_runs_two_replicas_and_one_leads(node_cluster: Cluster) -> None:
    pods = get_json(node_cluster, "-n", "coroner-system", "pods", "-l", "app.kubernetes.io/name=coroner-operator")[
        "items"
    ]
    running = [p["metadata"]["name"] for p in pods if p["status"]["phase"] == "Running"]
    assert len(running) == 2
    lease = wait_for(
        lambda: (
            (lease := get_json(node_cluster, "-n", "coroner-system", "lease", "coroner-operator"))
            and lease["spec"].get("holderIdentity") in running
            and lease
        ),
        timeout=60,
        what="the operator's leader Lease held by one of its pods",
    )
    assert lease["spec"]["holderIdentity"] in running


def test_a_worker_pod_killed_from_the_host_is_retired(node_cluster: Cluster, worker_namespace: str) -> None:
    marker = f"{uuid.uuid4().int % 10**6}"
    run_worker(node_cluster, worker_namespace, name="sleeper", command=["sleep", f"3{marker}"])
    registration = alive_registration(node_cluster, worker_namespace)
    incarnation = registration["spec"]["incarnation"]
    (pid,) = host_pids(f"3{marker}")
    # The worker sees its own pid namespace: the registration names the pid as the container numbers
    # it, and the host's pid differs.
    assert int(incarnation["pid"]) != pid
    assert incarnation["pidNamespace"] != str(os.stat("/proc/self/ns/pid").st_ino)
    assert status_field(pid, "NSpid").split()[-1] == str(incarnation["pid"])

    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    retired = wait_for(
        lambda: (r := only_registration(node_cluster, worker_namespace)) and state(r) == "Retired" and r,
        timeout=60,
        what="the killed worker's registration Retired",
    )
    print(f"kill -> Retired through the real node: {time.monotonic() - killed:.3f} s")
    assert retired["status"]["retirement"]["reason"] == "PidfdExited"
    assert retired["status"]["attestation"]["agent"]["nodeName"] == NODE


def test_a_deleted_worker_pod_says_goodbye_and_is_released_never_retired(
    node_cluster: Cluster, worker_namespace: str
) -> None:
    marker = f"{uuid.uuid4().int % 10**6}"
    run_worker(node_cluster, worker_namespace, name="polite", command=["sleep", f"3{marker}"])
    alive_registration(node_cluster, worker_namespace)
    # The kubelet sends SIGTERM to the container's pid 1, `coroner run`, which forwards it to sleep.
    kubectl(node_cluster, "-n", worker_namespace, "delete", "pod", "polite", "--wait=true", timeout=90)
    released = wait_for(
        lambda: (r := only_registration(node_cluster, worker_namespace)) and state(r) in ("Released", "Retired") and r,
        timeout=60,
        what="the deleted worker's registration terminal",
    )
    assert state(released) == "Released"
    conditions = {c["type"]: c for c in released["status"]["conditions"]}
    assert conditions["Released"]["reason"] == "CleanExit"
    assert "Retired" not in conditions or conditions["Retired"]["status"] != "True"


def test_a_crash_looping_container_retires_each_old_incarnation_and_never_the_live_one(
    node_cluster: Cluster, worker_namespace: str
) -> None:
    # Runs 6 s, then dies unclean (exit 3); the kubelet restarts the container (with its back-off),
    # and each run is a new `coroner run`, a new incarnation and a new registration.
    run_worker(
        node_cluster,
        worker_namespace,
        name="crasher",
        command=["sh", "-c", "sleep 6; exit 3"],
        restart_policy="Always",
    )

    def retired_and_running() -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
        items = registrations(node_cluster, worker_namespace)
        retired = [r for r in items if state(r) == "Retired"]
        running = [r for r in items if realnode.incarnation_pid(r) is not None]
        return (retired, running[0]) if len(retired) >= 2 and running and verdict(running[0]) == "Alive" else None

    retired, running = wait_for(
        retired_and_running, timeout=180, what="two retired incarnations and the current one attested Alive"
    )
    pod = get_json(node_cluster, "-n", worker_namespace, "pod", "crasher")
    assert pod["status"]["containerStatuses"][0]["restartCount"] >= 2
    keys = [tuple(sorted(r["spec"]["incarnation"].items())) for r in [*retired, running]]
    assert len(set(keys)) == len(keys), "each container run is its own incarnation"
    for r in retired:
        assert r["status"]["retirement"]["reason"] == "PidfdExited"
        assert realnode.incarnation_pid(r) is None
    # The run that is alive right now is never confused with the dead ones.
    assert state(running) == "Active"
    assert "retirement" not in running["status"]
    kubectl(node_cluster, "-n", worker_namespace, "delete", "pod", "crasher", "--wait=false")
