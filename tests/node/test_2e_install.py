"""The README's install, revoke and uninstall steps, as a user runs them on the dev cluster with real
nodes: `coroner dev-cluster install --dir D production` (the install's one-line dev-cluster form), a
worker killed from the host `Retired` and a live one not; the grant revoked with plain kubectl as
the README says, `kubectl auth can-i` and `kubectl coroner doctor --expect-plan-only` confirming it
and a worker killed after it not retired; then the README's uninstall commands run twice (each
deletes only what is still there, so any order and a rerun work), leaving only what the README and
docs/upgrading.md say stays: nothing of Coroner in the API but the seccomp profile on the node.
The production overlay is put back afterwards for the tests that follow."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from coroner_dev import realnode
from coroner_dev.devcluster.cluster import Cluster
from support.nodes import alive_worker, kubectl, registrations, state, verdict, wait_for
from support.plugin import kubectl_coroner

pytestmark = pytest.mark.node

OPERATOR = f"system:serviceaccount:{realnode.SYSTEM_NAMESPACE}:coroner-operator"
CORONER = os.path.join(os.path.dirname(sys.executable), "coroner")
#: The README's Uninstall section, word for word but for the path of the checkout.
UNINSTALL = (
    ("delete", "-k", str(realnode.repository() / "manifests" / "overlays" / "production"), "--ignore-not-found"),
    (
        "delete", "mutatingadmissionpolicy,mutatingadmissionpolicybinding",
        "coroner-registration-state", "coroner-record-registrant", "--ignore-not-found",
    ),
)  # fmt: skip


def can_retire(cluster: Cluster) -> str:
    result = kubectl(
        cluster, "auth", "can-i", "retire", "workerregistrations.coroner.dev", f"--as={OPERATOR}", "-A", check=False
    )
    return str(result.stdout).strip()


def reasons(registration: dict[str, Any]) -> set[str]:
    return {str(c.get("reason")) for c in registration.get("status", {}).get("conditions", [])}


def coroner_objects(cluster: Cluster) -> list[str]:
    """Every cluster-scoped object of Coroner's kinds named coroner-*, and the system namespace."""
    kinds = (
        "crd,clusterrole,clusterrolebinding,validatingadmissionpolicy,validatingadmissionpolicybinding,"
        "mutatingadmissionpolicy,mutatingadmissionpolicybinding,namespace"
    )
    names = kubectl(cluster, "get", kinds, "-o", "name").stdout.split()
    return [n for n in names if "coroner" in n.split("/", 1)[1]]


def test_the_readmes_install_revoke_and_uninstall_as_a_user_runs_them(
    node_cluster: Cluster, worker_namespace: str
) -> None:
    production = node_cluster.directory / "overlays" / "production"
    kubectl(node_cluster, "delete", "-k", str(production), "--wait=true", "--ignore-not-found", timeout=300)
    try:
        installed = subprocess.run(
            [CORONER, "dev-cluster", "install", "--dir", str(node_cluster.directory), "production"],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert installed.returncode == 0, installed.stderr
        assert f"export KUBECONFIG={node_cluster.kubeconfig}" in installed.stdout
        assert can_retire(node_cluster) == "yes"

        killed, survivor = (alive_worker(node_cluster, worker_namespace, name) for name in ("killed", "survivor"))
        pid = realnode.incarnation_pid(killed)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_for(
            lambda: any(r["metadata"]["name"] == killed["metadata"]["name"] and state(r) == "Retired"
                        for r in registrations(node_cluster, worker_namespace)),
            timeout=60, what="the killed worker Retired",
        )  # fmt: skip
        (alive,) = [r for r in registrations(node_cluster, worker_namespace) if r["spec"]["role"] == "survivor"]
        assert state(alive) == "Active" and verdict(alive) == "Alive"
        assert alive["metadata"]["name"] == survivor["metadata"]["name"]

        # Revoke, as the README says, with plain kubectl.
        kubectl(node_cluster, "delete", "clusterrolebinding", "coroner-operator-retire", "--ignore-not-found")
        assert can_retire(node_cluster) == "no"
        doctor = kubectl_coroner(
            node_cluster, "doctor", "--expect-plan-only", "-o", "json", kubeconfig=node_cluster.kubeconfig
        )
        assert '"retire-grant"' in doctor.stdout and "plan-only, as expected" in doctor.stdout, doctor.stdout
        # The operator notices within --permission-refresh-seconds (5 s); then a death is not retired.
        pid = realnode.incarnation_pid(alive)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        blocked = wait_for(
            lambda: next((r for r in registrations(node_cluster, worker_namespace)
                          if r["metadata"]["name"] == alive["metadata"]["name"] and verdict(r) == "Dead"
                          and "RetirePermissionMissing" in reasons(r)), None),
            timeout=60, what="the second death attested and preserved: RetirePermissionMissing",
        )  # fmt: skip
        assert state(blocked) == "Active", "retired after the grant was revoked"
        kubectl(node_cluster, "-n", worker_namespace, "delete", "pod", "--all", "--wait=true", timeout=120)

        # Uninstall: the README's commands, twice (each deletes only what is still there).
        for _ in range(2):
            for command in UNINSTALL:
                result = kubectl(node_cluster, *command, check=False, timeout=300)
                assert result.returncode == 0 or "the server doesn't have a resource type" in result.stderr, (
                    result.stderr
                )
        wait_for(lambda: not coroner_objects(node_cluster) or None, timeout=180, what="nothing of Coroner left")
        assert (node_cluster.directory / "seccomp" / "coroner" / "agent-seccomp.json").is_file()
    finally:
        realnode.install(node_cluster)
