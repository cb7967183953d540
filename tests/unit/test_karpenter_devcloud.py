"""The dev cloud's pure parts: Karpenter's build key, the instance records the Go provider reads, and
which processes are a dev node's (`karpenter`, `karpenter_instances`, `node`). Karpenter itself runs
in tests/node/test_2e_karpenter.py."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import threading

import pytest

from coroner_dev.devcluster import karpenter, karpenter_instances, node
from coroner_dev.devcluster.errors import DevClusterError

pytestmark = pytest.mark.unit


def test_an_edited_provider_source_is_a_new_cache_key_and_a_rerun_is_not(tmp_path: pathlib.Path) -> None:
    (tmp_path / "go.mod").write_text("module x\n")
    (tmp_path / "devcloud").mkdir()
    source = tmp_path / "devcloud" / "cloudprovider.go"
    source.write_text("package devcloud\n")
    build = dataclasses.replace(karpenter.karpenter_build(), module=tmp_path)
    first = build.cache_key()
    assert build.cache_key() == first
    source.write_text("package devcloud // edited\n")
    assert build.cache_key() != first
    assert first.startswith(f"karpenter-{karpenter.KARPENTER_VERSION}-")


def test_the_build_asks_for_the_toolchain_karpenter_needs() -> None:
    build = karpenter.karpenter_build()
    assert build.env["GOTOOLCHAIN"] == karpenter.TOOLCHAIN
    assert "-p=1" in build.env["GOFLAGS"].split()
    assert (build.module / "go.mod").read_text().count(f"sigs.k8s.io/karpenter {karpenter.KARPENTER_VERSION}") == 1


def test_an_instance_record_has_what_the_go_provider_reads_and_round_trips(tmp_path: pathlib.Path) -> None:
    instance = karpenter_instances.Instance(
        name="pool-abc12",
        provider_id="coroner-dev://pool-abc12",
        instance_type="dev.host",
        zone="dev-local",
        capacity_type="on-demand",
        state="booting",
    )
    raw = instance.to_json()
    # devcloud.Instance's JSON fields (testenv/karpenter/devcloud/instances.go).
    go_side = ("name", "providerID", "instanceType", "zone", "capacityType", "state")
    assert {key: raw[key] for key in go_side} == {
        "name": "pool-abc12",
        "providerID": "coroner-dev://pool-abc12",
        "instanceType": "dev.host",
        "zone": "dev-local",
        "capacityType": "on-demand",
        "state": "booting",
    }
    assert karpenter_instances.Instance.from_json(json.loads(json.dumps(raw))) == instance
    go_source = (karpenter.module_dir() / "devcloud" / "instances.go").read_text()
    assert all(f'`json:"{key}"`' in go_source for key in go_side)


@pytest.mark.parametrize("name", ["../etc", "a/b", "UPPER", "", "x" * 64])
def test_a_name_that_is_no_dns_label_is_refused_before_any_path_is_made(tmp_path: pathlib.Path, name: str) -> None:
    with pytest.raises(DevClusterError, match="no instance name"):
        karpenter_instances.read(tmp_path, name)


def test_terminating_an_instance_with_no_record_succeeds_and_touches_nothing(tmp_path: pathlib.Path) -> None:
    assert karpenter_instances.terminate(tmp_path, "pool-gone1") is False
    assert karpenter_instances.terminate_all(tmp_path) == []


def test_an_instance_another_process_is_terminating_is_not_terminated_beside_it(tmp_path: pathlib.Path) -> None:
    # Karpenter's Delete (a process of its own, which outlives Karpenter's stop) and `down` both end
    # instances: two at once removed each other's cgroups under their walk (FileNotFoundError).
    finished = threading.Event()
    second = threading.Thread(
        target=lambda: (karpenter_instances.terminate(tmp_path, "pool-both1"), finished.set()), daemon=True
    )
    with karpenter_instances.terminating(tmp_path, "pool-both1"):
        second.start()
        assert not finished.wait(0.5)
    assert finished.wait(10)


def test_a_nodes_own_processes_are_told_from_strangers_naming_its_directory(tmp_path: pathlib.Path) -> None:
    layout = node.NodeLayout(directory=tmp_path, name="pool-abc12")

    def argv(*parts: str) -> bytes:
        return b"\0".join(p.encode() for p in parts) + b"\0"

    assert node._names_node(layout, argv("/cache/containerd", f"--config={layout.root}/containerd.toml"))
    assert node._names_node(layout, argv("/cache/kubelet", f"--config={layout.root}/kubelet.json", "--v=1"))
    shim = argv("/cache/containerd-shim-runc-v2", "-namespace", "k8s.io", "-address", str(layout.containerd_socket))
    assert node._names_node(layout, shim)
    assert not node._names_node(layout, argv("/usr/bin/less", f"--config={layout.root}/kubelet.json"))
    other = node.NodeLayout(directory=tmp_path, name="pool-abc123")
    assert not node._names_node(layout, argv("/cache/kubelet", f"--config={other.root}/kubelet.json"))


@pytest.mark.procs
def test_a_spawned_cluster_process_keeps_none_of_the_callers_descriptors(tmp_path: pathlib.Path) -> None:
    """`flock LOCK coroner dev-cluster up` must not leave LOCK held by the etcd it started."""
    from coroner_dev.devcluster import cluster

    held = os.open(tmp_path / "lock", os.O_CREAT | os.O_RDWR)
    os.set_inheritable(held, True)
    try:
        spawned = cluster._spawn("probe", ["/bin/sleep", "30"], log=tmp_path / "probe.log")
        try:
            # What each descriptor names, not how many there are: the dynamic loader of the new program
            # may hold a file of its own open for a moment.
            assert str(tmp_path / "lock") not in _open_files(spawned.pid)
        finally:
            cluster.stop_process(spawned)
    finally:
        os.close(held)


def _open_files(pid: int) -> set[str]:
    """What the descriptors of process `pid` name now (one closed while they are listed is left out)."""
    named: set[str] = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):
            named.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return named
