"""Coroner installed from a release alone, on the real node, as a user would: `make release`'s files
(coroner_dev.release, images pinned by digest) copied into a directory that holds nothing else of
the checkout, and installed from there with the dev cluster's one-line form (`coroner dev-cluster
install --release DIR`: the release's own chart or install YAML, plus only the dev node's patches).

- The packaged chart: `helm install` with the grant, then `helm test` (doctor in a Pod), a worker
  killed `Retired` and a live one not; `helm upgrade` with changed values loses and retires no
  registration; `helm uninstall` leaves only the CRD (with its registrations) and the namespace, as
  docs/upgrading.md says.
- And separately `kubectl apply --server-side -f install-production.yaml`, one apply that succeeds
  as it is, then the same kill and a live one kept.

The production overlay is put back afterwards for the tests that follow."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from coroner import __version__
from coroner_dev import realnode, release
from coroner_dev.devcluster.cluster import Cluster
from support import helm
from support.nodes import alive_worker, kubectl, registrations, state, verdict, wait_for

pytestmark = pytest.mark.node

CORONER = os.path.join(os.path.dirname(sys.executable), "coroner")
HELM_RELEASE = ("--namespace", realnode.SYSTEM_NAMESPACE)


@pytest.fixture(scope="module")
def user_directory(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The release's files, and nothing else, in a directory of their own."""
    built = release.build(tmp_path_factory.mktemp("release") / "dist")
    user = tmp_path_factory.mktemp("user")
    for path in built.iterdir():
        shutil.copyfile(path, user / path.name)
    subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=user, check=True)
    return user


@pytest.fixture(scope="module")
def fresh(node_cluster: Cluster) -> Iterator[Cluster]:
    """The node cluster without the production overlay the session installed; put back afterwards."""
    production = node_cluster.directory / "overlays" / "production"
    kubectl(node_cluster, "delete", "-k", str(production), "--wait=true", "--ignore-not-found", timeout=300)
    try:
        yield node_cluster
    finally:
        helm.run("helm", f"--kubeconfig={node_cluster.kubeconfig}", "uninstall", "coroner", *HELM_RELEASE,
                 "--wait", check=False)  # fmt: skip
        realnode.install(node_cluster)


def dev_install(cluster: Cluster, user: pathlib.Path, *args: str) -> None:
    """`coroner dev-cluster install --release USER ARGS`, run from USER."""
    command = [CORONER, "dev-cluster", "install", "--dir", str(cluster.directory), "--release", str(user), *args]
    result = subprocess.run(command, cwd=user, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"


def kill_one_keep_one(cluster: Cluster, namespace: str, prefix: str) -> dict[str, Any]:
    """Two live workers; one SIGKILLed from the host is Retired (PidfdExited), the other stays Active
    and Alive. Returns the live one's registration."""
    killed, kept = (
        alive_worker(cluster, namespace, f"{prefix}-killed"),
        alive_worker(cluster, namespace, f"{prefix}-kept"),
    )
    pid = realnode.incarnation_pid(killed)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    retired = wait_for(
        lambda: next((r for r in registrations(cluster, namespace)
                      if r["metadata"]["name"] == killed["metadata"]["name"] and state(r) == "Retired"), None),
        timeout=60, what=f"{prefix}: the killed worker Retired",
    )  # fmt: skip
    assert retired["status"]["retirement"]["reason"] == "PidfdExited"
    (now,) = [r for r in registrations(cluster, namespace) if r["metadata"]["name"] == kept["metadata"]["name"]]
    assert state(now) == "Active" and verdict(now) == "Alive"
    live: dict[str, Any] = now
    return live


def images_by_digest(cluster: Cluster, user: pathlib.Path) -> None:
    """The operator and the agent run the release's images, by digest."""
    digests = {name: entry["digest"] for name, entry in release_images(user).items()}
    for kind, name in (("deployment", "operator"), ("daemonset", "agent")):
        spec = kubectl(cluster, "-n", realnode.SYSTEM_NAMESPACE, "get", kind, f"coroner-{name}",
                       "-o", "jsonpath={.spec.template.spec.containers[0].image}").stdout  # fmt: skip
        assert spec == f"ghcr.io/coroner-dev/coroner-{name}@{digests[name]}"


def release_images(user: pathlib.Path) -> dict[str, Any]:
    images: dict[str, Any] = json.loads((user / "images.json").read_text())["images"]
    return images


def test_the_packaged_chart_installs_tests_upgrades_and_uninstalls(
    fresh: Cluster, user_directory: pathlib.Path, worker_namespace: str
) -> None:
    chart = user_directory / f"coroner-{__version__}.tgz"
    assert chart.is_file()
    dev_install(fresh, user_directory, "chart", "--set", "retireGrant.enabled=true")
    images_by_digest(fresh, user_directory)
    kept = kill_one_keep_one(fresh, worker_namespace, "chart")

    # The test Pod gets the dev node's patches at admission (realnode.helm_test_pods, by patch_installed).
    tested = helm.run("helm", f"--kubeconfig={fresh.kubeconfig}", "test", "coroner", *HELM_RELEASE,
                      "--timeout=180s", check=False, timeout=240)  # fmt: skip
    assert tested.returncode == 0, f"{tested.stdout}\n{tested.stderr}"

    before = {r["metadata"]["name"]: state(r) for r in registrations(fresh, worker_namespace)}
    dev_install(fresh, user_directory, "chart", "--set", "retireGrant.enabled=true",
                "--set", "operator.terminalRetentionSeconds=7200")  # fmt: skip
    args = kubectl(fresh, "-n", realnode.SYSTEM_NAMESPACE, "get", "deployment", "coroner-operator",
                   "-o", "jsonpath={.spec.template.spec.containers[0].args}").stdout  # fmt: skip
    assert "--terminal-retention-seconds=7200" in args
    after = {r["metadata"]["name"]: state(r) for r in registrations(fresh, worker_namespace)}
    assert after == before, "the upgrade lost or retired a registration"
    (now,) = [r for r in registrations(fresh, worker_namespace) if r["metadata"]["name"] == kept["metadata"]["name"]]
    assert state(now) == "Active" and verdict(now) == "Alive"
    kubectl(fresh, "-n", worker_namespace, "delete", "pod", "--all", "--wait=true", timeout=120)

    helm.run("helm", f"--kubeconfig={fresh.kubeconfig}", "uninstall", "coroner", *HELM_RELEASE, "--wait")
    # What docs/upgrading.md says a `helm uninstall` leaves: the CRD (and its registrations) and
    # the namespace; nothing that runs, binds or admits.
    kubectl(fresh, "get", "crd", "workerregistrations.coroner.dev")
    kubectl(fresh, "get", "namespace", realnode.SYSTEM_NAMESPACE)
    assert registrations(fresh, worker_namespace)
    left = kubectl(fresh, "get", "clusterrole,clusterrolebinding,validatingadmissionpolicy,"
                   "validatingadmissionpolicybinding", "-o", "name").stdout.split()  # fmt: skip
    assert not [name for name in left if "coroner" in name], left
    # Its Pods end as their grace allows (the agent drains for up to 40 s).
    wait_for(
        lambda: not kubectl(fresh, "-n", realnode.SYSTEM_NAMESPACE, "get", "deployment,daemonset,pod",
                            "-o", "name").stdout.split() or None,
        timeout=120, what="nothing of the release left running",
    )  # fmt: skip


def test_install_production_yaml_applies_in_one_go_and_retires_only_the_dead(
    fresh: Cluster, user_directory: pathlib.Path, worker_namespace: str
) -> None:
    manifest = user_directory / "install-production.yaml"
    applied = kubectl(fresh, "apply", "--server-side", "--force-conflicts", "-f", str(manifest), timeout=300)
    assert applied.returncode == 0
    dev_install(fresh, user_directory, "production")
    images_by_digest(fresh, user_directory)
    kill_one_keep_one(fresh, worker_namespace, "yaml")
