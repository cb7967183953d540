"""The Helm chart, once, on the real node: `helm install` with the grant on, the dev node's patches
applied on top with `kubectl patch` (what a post-renderer would do: hostNetwork, the loopback API
address, the seccomp path, the operator's metrics port), and a worker killed from the host retired;
then `helm test`: `kubectl coroner doctor` in a Pod of the operator image, run by the real kubelet,
passes (its Pod given the same host network at admission, `realnode.helm_test_pods`). The
production overlay is put back afterwards for the tests that follow."""

from __future__ import annotations

import os
import signal

import pytest

from coroner_dev import realnode
from coroner_dev.devcluster.cluster import Cluster
from support import helm
from support.nodes import NODE, kubectl, registrations, state, verdict, wait_for

pytestmark = pytest.mark.node


def test_the_helm_chart_runs_coroner_on_the_real_node(node_cluster: Cluster, worker_namespace: str) -> None:
    production = node_cluster.directory / "overlays" / "production"
    kubectl(node_cluster, "delete", "-k", str(production), "--wait=true", "--ignore-not-found", timeout=240)
    release = [f"--kubeconfig={node_cluster.kubeconfig}", "--namespace", realnode.SYSTEM_NAMESPACE]
    try:
        helm.run(
            "helm", "install", "coroner", str(helm.CHART), *release, "--create-namespace",
            "--set", "retireGrant.enabled=true",
        )  # fmt: skip
        realnode.patch_installed(node_cluster)
        realnode.rolled_out(node_cluster)
        pod = realnode.worker_pod(
            "charted", namespace=worker_namespace, node=NODE, cluster=node_cluster, command=["sleep", "3601"]
        )
        realnode.apply_objects(node_cluster, [pod])
        (alive,) = wait_for(
            lambda: (items := registrations(node_cluster, worker_namespace)) and verdict(items[0]) == "Alive" and items,
            timeout=120,
            what="the worker attested Alive by the chart's agent",
        )
        pid = realnode.incarnation_pid(alive)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        (retired,) = wait_for(
            lambda: (items := registrations(node_cluster, worker_namespace)) and state(items[0]) == "Retired" and items,
            timeout=60,
            what="the killed worker Retired by the chart's operator",
        )
        assert retired["status"]["retirement"]["reason"] == "PidfdExited"

        tested = helm.run("helm", "test", "coroner", *release, "--timeout=180s", check=False, timeout=240)
        assert tested.returncode == 0, f"{tested.stdout}\n{tested.stderr}"
        assert "TEST SUITE:     coroner-doctor-test" in tested.stdout and "Phase:          Succeeded" in tested.stdout
        # A success leaves nothing of the test behind.
        for kind in ("pod", "serviceaccount", "clusterrolebinding"):
            gone = kubectl(
                node_cluster, "-n", realnode.SYSTEM_NAMESPACE, "get", kind, "coroner-doctor-test", check=False
            )
            assert gone.returncode != 0, kind
    finally:
        helm.run("helm", "uninstall", "coroner", *release, "--wait", check=False)
        # The chart keeps the CRD and the namespace (resource-policy: keep); the overlay takes them over.
        realnode.install(node_cluster)
