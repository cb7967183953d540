"""`coroner dev-cluster up|down|token`: idempotent, exact about what it stops, clear when it fails."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from coroner_dev.devcluster import cluster as cluster_mod
from coroner_dev.devcluster.cluster import Cluster

pytestmark = pytest.mark.integration

CORONER = [sys.executable, "-m", "coroner.cli.main"]


def _coroner(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CORONER, *args], capture_output=True, text=True, timeout=300, check=False)


def _listening(port: int) -> bool:
    """A LISTEN socket (state 0A) on this local port, from /proc/net/tcp."""
    for line in pathlib.Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":
            return True
    return False


def test_up_is_idempotent_and_down_stops_exactly_what_up_started(tmp_path: pathlib.Path) -> None:
    first = _coroner("dev-cluster", "up", "--dir", str(tmp_path), "--no-controller-manager")
    assert first.returncode == 0, first.stderr
    state = Cluster.load(tmp_path)
    assert state is not None and all(p.alive() for p in state.processes)
    again = _coroner("dev-cluster", "up", "--dir", str(tmp_path), "--no-controller-manager")
    assert again.returncode == 0, again.stderr
    assert Cluster.load(tmp_path) == state, "a second up must reuse the running cluster"

    bystander = subprocess.Popen(["sleep", "60"])
    try:
        down = _coroner("dev-cluster", "down", "--dir", str(tmp_path))
        assert down.returncode == 0, down.stderr
        assert "kube-apiserver" in down.stdout and "etcd" in down.stdout
        assert not any(p.alive() for p in state.processes)
        assert not _listening(state.apiserver_port) and not _listening(state.etcd_port)
        assert bystander.poll() is None, "down must not touch processes it did not start"
    finally:
        bystander.kill()
        bystander.wait()
    assert "nothing running" in _coroner("dev-cluster", "down", "--dir", str(tmp_path)).stdout


def test_stale_state_file_is_replaced_without_killing_a_stranger(tmp_path: pathlib.Path) -> None:
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        # A state file naming a live pid with a different start time: the recorded incarnation is
        # gone even though the number is in use. `up` must not signal the stranger.
        (tmp_path / cluster_mod.STATE_FILE).write_text(
            json.dumps(
                {
                    "apiserverPort": 1,
                    "etcdPort": 2,
                    "binaries": "/nonexistent",
                    "processes": [{"name": "etcd", "pid": stranger.pid, "start_time": 1}],
                }
            )
        )
        started = cluster_mod.up(tmp_path, controller_manager=False)
        try:
            assert cluster_mod.is_ready(started)
            assert stranger.poll() is None
        finally:
            cluster_mod.down(tmp_path)
    finally:
        stranger.kill()
        stranger.wait()


def test_unreadable_state_file_names_the_fix(tmp_path: pathlib.Path) -> None:
    (tmp_path / cluster_mod.STATE_FILE).write_text("{not json")
    result = _coroner("dev-cluster", "up", "--dir", str(tmp_path))
    assert result.returncode == 1
    assert "unreadable" in result.stderr and "fix:" in result.stderr


def test_token_without_a_cluster_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    result = _coroner("dev-cluster", "token", "--dir", str(tmp_path), "--service-account", "ns/sa")
    assert result.returncode == 1
    assert "no ready dev cluster" in result.stderr


def test_token_command_prints_a_working_kubeconfig(cluster: Cluster) -> None:
    result = _coroner(
        "dev-cluster",
        "token",
        "--dir",
        str(cluster.directory),
        "--service-account",
        "tok-ns/tok",
        "--node",
        "tok-node",
    )
    assert result.returncode == 0, result.stderr
    kubeconfig = pathlib.Path(result.stdout.strip())
    whoami = subprocess.run(
        [str(cluster.binary("kubectl")), f"--kubeconfig={kubeconfig}", "auth", "whoami", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    user = json.loads(whoami.stdout)["status"]["userInfo"]
    assert user["username"] == "system:serviceaccount:tok-ns:tok"
    assert user["extra"]["authentication.kubernetes.io/node-name"] == ["tok-node"]


def test_missing_go_toolchain_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KUBEBUILDER_ASSETS"}
    env.update(PATH="/nonexistent", CORONER_CACHE_DIR=str(tmp_path / "empty-cache"))
    result = subprocess.run(
        [*CORONER, "dev-cluster", "up", "--dir", str(tmp_path / "c")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "Go toolchain" in result.stderr and "KUBEBUILDER_ASSETS" in result.stderr
    assert not (tmp_path / "c" / cluster_mod.STATE_FILE).exists()


def test_kubebuilder_assets_is_honoured(cluster: Cluster, tmp_path: pathlib.Path) -> None:
    env = {
        **os.environ,
        "KUBEBUILDER_ASSETS": str(cluster.binaries),
        "PATH": "/nonexistent",
        "CORONER_CACHE_DIR": str(tmp_path / "empty-cache"),
    }
    directory = tmp_path / "c"
    result = subprocess.run(
        [*CORONER, "dev-cluster", "up", "--dir", str(directory), "--no-controller-manager"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    try:
        assert result.returncode == 0, result.stderr
        state = Cluster.load(directory)
        assert state is not None and state.binaries == cluster.binaries
    finally:
        cluster_mod.down(directory)
