"""Node loss with a real kubelet: a node drained and stopped (graceful), then a node killed outright
and deleted, as cluster-autoscaler does last (abrupt). These end the worker node, so they run last
(pytest runs tests/node's files in name order).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from coroner_dev import realnode
from coroner_dev.devcluster import cluster as cluster_mod
from coroner_dev.devcluster.cluster import Cluster
from support.nodes import (
    NODE,
    agent_pids,
    doctor,
    get_json,
    host_pids,
    kubectl,
    registrations,
    retirable_reason,
    state,
    verdict,
    wait_for,
)

pytestmark = pytest.mark.node


def ready(cluster: Cluster, node: str) -> str:
    conditions = get_json(cluster, "node", node)["status"]["conditions"]
    return str({c["type"]: c["status"] for c in conditions}["Ready"])


def start_worker(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    marker = f"6{uuid.uuid4().int % 10**6}"
    pod = realnode.worker_pod(name, namespace=namespace, node=NODE, cluster=cluster, command=["sleep", marker])
    realnode.apply_objects(cluster, [pod])
    return wait_for(
        lambda: (
            next((r for r in registrations(cluster, namespace) if r["spec"].get("role") == name), None)
            if host_pids(marker)
            else None
        ),
        timeout=90,
        what=f"{name}'s registration",
    )


def test_a_drained_and_stopped_node_releases_its_workers_and_retires_none(
    node_cluster: Cluster, worker_namespace: str
) -> None:
    for name in ("drained-a", "drained-b"):
        start_worker(node_cluster, worker_namespace, name)
    wait_for(
        lambda: all(verdict(r) == "Alive" for r in registrations(node_cluster, worker_namespace)),
        timeout=60,
        what="both workers attested Alive",
    )
    # What cluster-autoscaler and a person do before a scale-down: evict every Pod but DaemonSets'.
    kubectl(
        node_cluster,
        "drain",
        NODE,
        "--ignore-daemonsets",
        "--force",
        "--grace-period=20",
        "--timeout=120s",
        timeout=150,
    )
    items = wait_for(
        lambda: (
            (items := registrations(node_cluster, worker_namespace))
            and all(state(r) != "Active" for r in items)
            and items
        ),
        timeout=60,
        what="both drained workers terminal",
    )
    assert {state(r) for r in items} == {"Released"}
    (kubelet,) = [p for p in cluster_mod.Cluster.load(node_cluster.directory).processes if p.name == f"kubelet/{NODE}"]  # type: ignore[union-attr]
    cluster_mod.stop_process(kubelet)
    wait_for(lambda: ready(node_cluster, NODE) != "True", timeout=60, what=f"{NODE} NotReady")
    # Stopping the kubelet stops no container: the agent still runs, and nothing was retired.
    assert agent_pids()
    assert {state(r) for r in registrations(node_cluster, worker_namespace)} == {"Released"}

    cluster_mod.restart_kubelet(node_cluster.directory, NODE)
    kubectl(node_cluster, "uncordon", NODE)
    wait_for(lambda: ready(node_cluster, NODE) == "True", timeout=60, what=f"{NODE} Ready again")


def test_a_node_lost_abruptly_and_deleted_is_truthful_without_node_loss_evidence_and_retired_with_it(
    node_cluster: Cluster, worker_namespace: str
) -> None:
    start_worker(node_cluster, worker_namespace, "lost")
    wait_for(
        lambda: verdict(registrations(node_cluster, worker_namespace)[0]) == "Alive",
        timeout=90,
        what="the worker attested Alive",
    )
    cluster_mod.lose_node(node_cluster.directory, NODE)
    assert not agent_pids()
    # The node lifecycle controller sees no status for its grace period (20 s here).
    wait_for(lambda: ready(node_cluster, NODE) != "True", timeout=90, what=f"{NODE} NotReady")
    kubectl(node_cluster, "delete", "node", NODE, "--wait=true", timeout=60)

    # Without components/node-loss: preserved, and the reason says why; doctor fails.
    (lost,) = wait_for(
        lambda: (
            (items := registrations(node_cluster, worker_namespace))
            and retirable_reason(items[0]) == "AgentUnavailable"
            and items
        ),
        timeout=120,
        what="the lost worker preserved as AgentUnavailable",
    )
    assert state(lost) == "Active"
    report = doctor(node_cluster)
    assert report.returncode == 1, report.stdout + report.stderr
    assert "FAIL" in report.stdout

    # With it (and a short quarantine): retired on the node's deletion.
    realnode.install(node_cluster, components=("node-loss",), operator_args=("--node-quarantine-seconds=10",))
    (retired,) = wait_for(
        lambda: (items := registrations(node_cluster, worker_namespace)) and state(items[0]) == "Retired" and items,
        timeout=180,
        what="the lost worker retired on NodeDeleted",
    )
    assert retired["status"]["retirement"]["reason"] == "NodeDeleted"
