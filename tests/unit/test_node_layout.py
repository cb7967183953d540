"""The dev node's pure parts (coroner_dev.devcluster.node, .cgroups): where its cgroups go, which hierarchies
it touches, its paths, and the settings this machine needs in containerd's and the kubelet's
configurations. The node itself runs in tests/node."""

from __future__ import annotations

import json
import pathlib

import pytest

from coroner_dev.devcluster import cgroups, node, pki
from coroner_dev.devcluster.errors import DevClusterError
from coroner_dev.devcluster.nodebinaries import NodeBinaries

pytestmark = pytest.mark.unit

MOUNTS = """tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
/dev/vda / ext4 rw,relatime 0 0
"""


@pytest.mark.parametrize(
    ("text", "parent"),
    [
        ("4:memory:/process_api/abc\n3:cpuset:/\n0::/\n", "/process_api/abc"),
        ("2:cpu,cpuacct:/\n5:memory:/\n", "/"),
        ("7:hugetlb:/x\n6:blkio,memory:/kubepods/p1\n", "/kubepods/p1"),
    ],
)
def test_the_node_nests_under_the_memory_cgroup_this_process_is_in(text: str, parent: str) -> None:
    assert cgroups.cgroup_parent(text) == parent
    assert cgroups.node_cgroup_root(parent, "n1") == f"{parent.rstrip('/')}/coroner-node-n1"


def test_a_machine_without_a_v1_memory_hierarchy_is_said_not_guessed() -> None:
    with pytest.raises(DevClusterError, match="no cgroup v1 memory hierarchy"):
        cgroups.cgroup_parent("0::/user.slice\n")


def test_the_hierarchies_are_read_from_the_mounts() -> None:
    assert cgroups.v1_hierarchies(MOUNTS) == [
        pathlib.Path("/sys/fs/cgroup/cpu"),
        pathlib.Path("/sys/fs/cgroup/memory"),
        pathlib.Path("/sys/fs/cgroup/systemd"),
    ]
    assert cgroups.cgroup2_hierarchies(MOUNTS) == [pathlib.Path("/sys/fs/cgroup/unified")]


@pytest.mark.parametrize("directory", ["/tmp/c", "/tmp/pytest-of-root/pytest-123/" + "deep/" * 30 + "cluster"])
def test_every_node_has_its_own_short_socket_and_directories(directory: str) -> None:
    a = node.NodeLayout(directory=pathlib.Path(directory), name="a")
    b = node.NodeLayout(directory=pathlib.Path(directory), name="b")
    assert a.containerd_socket != b.containerd_socket
    # A unix socket path has at most 108 bytes, with its ".ttrpc" sibling too.
    assert len(f"{a.containerd_socket}.ttrpc") < 108
    assert a.kubelet_root.is_relative_to(pathlib.Path(directory) / "nodes" / "a")
    assert a.shared_seccomp_root == b.shared_seccomp_root == pathlib.Path(directory) / "seccomp"


def test_containerd_clamps_oom_score_adj_and_keeps_to_its_own_paths() -> None:
    layout = node.NodeLayout(directory=pathlib.Path("/tmp/c"), name="a")
    binaries = NodeBinaries(kubernetes=pathlib.Path("/k"), runtime=pathlib.Path("/r"), runc_dir=pathlib.Path("/u"))
    config = node.containerd_config(layout, binaries=binaries, sandbox_image="localhost/pause:x")
    assert "restrict_oom_score_adj = true" in config
    assert 'BinaryName = "/u/runc"' in config
    assert f'address = "{layout.containerd_socket}"' in config
    assert 'sandbox = "localhost/pause:x"' in config
    assert "imports = []" in config
    assert json.loads(json.dumps(node.cni_network()))["plugins"] == [{"type": "loopback"}]


def test_the_kubelet_runs_on_cgroup_v1_on_loopback_and_never_collects_the_images(tmp_path: pathlib.Path) -> None:
    layout = node.NodeLayout(directory=tmp_path, name="a")
    config = node.kubelet_config(
        layout, pki=pki.Pki(directory=tmp_path / "pki"), cgroup_root="/x/coroner-node-a", port=1, healthz_port=2
    )
    assert config["failCgroupV1"] is False
    assert (config["cgroupDriver"], config["cgroupRoot"]) == ("cgroupfs", "/x/coroner-node-a")
    assert config["address"] == config["healthzBindAddress"] == "127.0.0.1"
    assert config["readOnlyPort"] == 0
    assert config["authentication"]["anonymous"] == {"enabled": False}
    assert config["imageGCHighThresholdPercent"] == 100
    assert config["containerRuntimeEndpoint"] == layout.endpoint
