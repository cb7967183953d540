"""One real Kubernetes node on this machine: containerd (with runc) and a kubelet, for the dev cluster.

`start` runs after the control plane is ready; `stop` undoes it: every container stopped and
removed, containerd and the kubelet stopped, every mount it left unmounted, every cgroup it made
removed. What this machine imposes, and how the node meets it:

- **cgroups.** Nested under the machine's own memory cgroup, never changing it (`cgroups`).
- **oom_score_adj.** No process may lower its oom_score_adj below 0 here, not even root; containerd
  clamps the values the kubelet asks for (`restrict_oom_score_adj`), else every sandbox fails.
- **Network.** No CNI plugin runs: every Pod of the dev node uses `hostNetwork` and reaches the
  API server on loopback. containerd is given one CNI network of the `loopback` type alone, so the
  runtime reports its network ready and the Node turns Ready without a taint to tolerate; a Pod
  without `hostNetwork` would fail at sandbox setup (the plugin binary is absent) rather than get
  a route anywhere.
- **Images.** No registry is reachable: the sandbox (pause) image and Coroner's images are built
  here (`images`) and imported; the sandbox image is pinned so the kubelet never collects it.
- **Addresses.** The kubelet serves on a free loopback port with `--node-ip=127.0.0.1`. A Node
  may not publish a loopback address, so the Node has none, and the API server cannot reach the
  kubelet: `kubectl logs` and `kubectl exec` do not work on the dev node; `crictl` (`crictl`
  below) does both against the node's containerd, and the containers' logs are files under the
  node's directory. The alternative, the machine's own eth0 address, would send traffic off
  loopback. No more than that is lost: scheduling, Pods, probes, tokens and status all flow from
  the kubelet to the API server.
- **Directories.** Each node's state is under `<cluster>/nodes/<name>/`: the kubelet's root, the
  pod logs, containerd's content and snapshots; containerd's sockets are under /run/coroner-node/
  (a unix socket path has at most 108 bytes). Each kubelet's seccomp root links to one
  `<cluster>/seccomp`, the one path a DaemonSet's hostPath can name (`/var/lib/kubelet/seccomp`
  on a real cluster).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

from coroner_dev.devcluster import pki as pki_mod
from coroner_dev.devcluster.cgroups import (
    CGROUP_MOUNTS,
    cgroup_parent,
    ensure_cgroups,
    mounts,
    node_cgroup_root,
    remove_ancestors,
    remove_cgroups,
)
from coroner_dev.devcluster.cluster import (
    Cluster,
    Started,
    admin_ssl_context,
    free_port,
    http_get,
    stop_process,
    wait_ready,
    write_kubeconfig,
)
from coroner_dev.devcluster.errors import DevClusterError
from coroner_dev.devcluster.nodebinaries import NodeBinaries

#: How a node's processes are started: (name, argv, log, environment) -> the started process.
Spawn = Callable[[str, list[str], pathlib.Path, dict[str, str]], Started]

#: The v1 hierarchies the kubelet and runc use (named `systemd` too: runc joins it when present).
CNI_NETWORK = "coroner-local"
READY_TIMEOUT = 120.0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NodeLayout:
    """Every path of one dev node, derived from the cluster directory and the node's name."""

    directory: pathlib.Path
    name: str

    @property
    def root(self) -> pathlib.Path:
        return self.directory / "nodes" / self.name

    @property
    def kubelet_root(self) -> pathlib.Path:
        """The kubelet's state, pods and seccomp profiles."""
        return self.root / "kubelet"

    @property
    def seccomp_root(self) -> pathlib.Path:
        """Where the kubelet resolves `Localhost` seccomp profiles: a link to `shared_seccomp_root`."""
        return self.kubelet_root / "seccomp"

    @property
    def shared_seccomp_root(self) -> pathlib.Path:
        """The one seccomp directory of every dev node, as a DaemonSet's hostPath names one path for
        all nodes (`/var/lib/kubelet/seccomp` on a real cluster)."""
        return self.directory / "seccomp"

    @property
    def run_dir(self) -> pathlib.Path:
        """containerd's state and socket: under /run, short enough for a unix socket path (108 bytes)."""
        digest = hashlib.sha256(str(self.root).encode()).hexdigest()[:10]
        return pathlib.Path("/run/coroner-node") / digest

    @property
    def containerd_socket(self) -> pathlib.Path:
        return self.run_dir / "containerd.sock"

    @property
    def endpoint(self) -> str:
        return f"unix://{self.containerd_socket}"

    @property
    def cni_conf_dir(self) -> pathlib.Path:
        return self.root / "cni" / "net.d"

    @property
    def cni_bin_dir(self) -> pathlib.Path:
        return self.root / "cni" / "bin"


def containerd_config(layout: NodeLayout, *, binaries: NodeBinaries, sandbox_image: str) -> str:
    """containerd 2.x's config (version 4): CRI with runc, the clamped oom_score_adj, the pinned
    sandbox image, the loopback-only CNI network, state under `layout`."""
    runc = binaries.path("runc")
    return f"""version = 4
root = "{layout.root / "containerd"}"
state = "{layout.run_dir / "state"}"
# Nothing from the machine's own /etc/containerd.
imports = []

[plugins."io.containerd.server.v1.grpc"]
  address = "{layout.containerd_socket}"

[plugins."io.containerd.server.v1.ttrpc"]
  address = "{layout.containerd_socket}.ttrpc"

[plugins."io.containerd.cri.v1.runtime"]
  # Nothing on this machine may lower an oom_score_adj below 0; the kubelet asks for -997 for
  # critical pods. Clamp instead of failing every sandbox.
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{layout.cni_bin_dir}"]
    conf_dir = "{layout.cni_conf_dir}"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{sandbox_image}"

[plugins."io.containerd.grpc.v1.cri"]
  # The kubelet reaches exec/attach/port-forward streams here; loopback only.
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def cni_network() -> dict[str, Any]:
    """One network with only the loopback plugin: the runtime reports its network ready, no Pod gets
    a route off the host, and hostNetwork Pods never call a plugin."""
    return {"cniVersion": "1.0.0", "name": CNI_NETWORK, "plugins": [{"type": "loopback"}]}


def kubelet_config(
    layout: NodeLayout, *, pki: pki_mod.Pki, cgroup_root: str, port: int, healthz_port: int
) -> dict[str, Any]:
    """The KubeletConfiguration of the dev node."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # This machine runs cgroup v1, which the kubelet otherwise refuses.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        "containerRuntimeEndpoint": layout.endpoint,
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        # Only the API server calls the kubelet, with the admin client certificate.
        "authentication": {
            "x509": {"clientCAFile": str(pki.ca_cert)},
            "webhook": {"enabled": False},
            "anonymous": {"enabled": False},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "failSwapOn": False,
        # The machine's disk is shared with everything else: never evict for it, never collect the
        # images built here (they cannot be pulled back).
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "resolvConf": "/etc/resolv.conf",
        "podLogsDir": str(layout.root / "pod-logs"),
        "nodeStatusUpdateFrequency": "5s",
        "syncFrequency": "10s",
        # Graceful node shutdown needs systemd-logind's inhibitor locks, which this machine lacks.
        "shutdownGracePeriod": "0s",
        "shutdownGracePeriodCriticalPods": "0s",
    }


def process_name(component: str, node: str) -> str:
    """How a node's process is named in the cluster's state: `kubelet/NODE`, `containerd/NODE`."""
    return f"{component}/{node}"


def start(
    cluster: Cluster,
    *,
    name: str,
    binaries: NodeBinaries,
    images: list[tuple[str, pathlib.Path]],
    sandbox_image: str,
    spawn: Spawn,
    say: Callable[[str], None],
    kubelet_settings: dict[str, Any] | None = None,
) -> tuple[list[Started], list[str]]:
    """Starts containerd and the kubelet of node NAME for `cluster`, imports `images`, and waits for
    the Node to be Ready. Returns the processes started (containerd, kubelet) and the cgroups created.
    `kubelet_settings` are added to its KubeletConfiguration (a cloud's node: its providerID and the
    taints it registers with)."""
    layout = NodeLayout(directory=cluster.directory, name=name)
    for path in (layout.root / "containerd", layout.run_dir, layout.cni_conf_dir, layout.cni_bin_dir):
        path.mkdir(parents=True, exist_ok=True)
    (layout.cni_conf_dir / f"10-{CNI_NETWORK}.conflist").write_text(json.dumps(cni_network(), indent=2) + "\n")
    config = layout.root / "containerd.toml"
    config.write_text(containerd_config(layout, binaries=binaries, sandbox_image=sandbox_image))
    logs = cluster.directory / "logs"
    env = {**os.environ, "PATH": f"{binaries.search_path}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    started: list[Started] = []
    cgroup_root = node_cgroup_root(cgroup_parent(pathlib.Path("/proc/self/cgroup").read_text()), name)
    created = ensure_cgroups(cgroup_root, say=say)
    try:
        containerd_log = logs / f"{name}-containerd.log"
        containerd = spawn(
            process_name("containerd", name),
            [str(binaries.path("containerd")), f"--config={config}"],
            containerd_log,
            env,
        )
        started.append(containerd)
        wait_ready(
            f"containerd of {name}",
            lambda: crictl(layout, binaries, "info", check=False).returncode == 0,
            process=containerd,
            log=containerd_log,
            timeout=60,
        )
        for reference, archive in images:
            ctr(layout, binaries, "images", "import", "--local", str(archive))
            say(f"imported {reference} into {name}")
        kubelet_log = logs / f"{name}-kubelet.log"
        kubelet = spawn(
            process_name("kubelet", name),
            kubelet_argv(cluster, layout, binaries, cgroup_root, settings=kubelet_settings),
            kubelet_log,
            env,
        )
        started.append(kubelet)
        wait_ready(
            f"the kubelet's Node {name}",
            lambda: node_ready(cluster, name),
            process=kubelet,
            log=kubelet_log,
            timeout=READY_TIMEOUT,
        )
    except BaseException:
        stop(cluster, name=name, binaries=binaries, processes=started)
        remove_ancestors(created)
        raise
    return started, created


def kubelet_argv(
    cluster: Cluster,
    layout: NodeLayout,
    binaries: NodeBinaries,
    cgroup_root: str,
    *,
    settings: dict[str, Any] | None = None,
) -> list[str]:
    pki = cluster.pki
    cert, key = pki_mod.ensure_client_cert(pki, user=f"system:node:{layout.name}", groups=("system:nodes",))
    kubeconfig = write_kubeconfig(
        layout.root / "kubelet.kubeconfig",
        server=cluster.server,
        ca=pki.ca_cert,
        user=f"system:node:{layout.name}",
        cert=cert,
        key=key,
    )
    config = layout.root / "kubelet.json"
    configuration = kubelet_config(layout, pki=pki, cgroup_root=cgroup_root, port=free_port(), healthz_port=free_port())
    config.write_text(json.dumps({**configuration, **(settings or {})}, indent=2) + "\n")
    layout.kubelet_root.mkdir(parents=True, exist_ok=True)
    layout.shared_seccomp_root.mkdir(exist_ok=True)
    if not layout.seccomp_root.is_symlink():
        layout.seccomp_root.symlink_to(layout.shared_seccomp_root)
    return [
        str(binaries.path("kubelet")),
        f"--config={config}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={layout.kubelet_root}",
        f"--hostname-override={layout.name}",
        # Without it the kubelet would publish the machine's eth0 address (and the API server would
        # send traffic there); with it the Node has no address (loopback is refused): see above.
        "--node-ip=127.0.0.1",
        "--v=1",
    ]


def node_ready(cluster: Cluster, name: str) -> bool:
    status, body = http_get(
        host="127.0.0.1",
        port=cluster.apiserver_port,
        path=f"/api/v1/nodes/{name}",
        context=admin_ssl_context(cluster),
    )
    if status != 200:
        return False
    try:
        conditions = json.loads(body).get("status", {}).get("conditions", [])
    except ValueError:
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def crictl(
    layout: NodeLayout, binaries: NodeBinaries, *args: str, check: bool = True, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """crictl against this node's containerd."""
    return _run(
        [
            str(binaries.path("crictl")),
            f"--runtime-endpoint={layout.endpoint}",
            f"--image-endpoint={layout.endpoint}",
            *args,
        ],
        check=check,
        timeout=timeout,
    )


def ctr(layout: NodeLayout, binaries: NodeBinaries, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """ctr in containerd's `k8s.io` namespace (the one the CRI plugin serves the kubelet from)."""
    return _run(
        [str(binaries.path("ctr")), f"--address={layout.containerd_socket}", "--namespace=k8s.io", *args],
        check=check,
        timeout=300,
    )


def _run(argv: list[str], *, check: bool, timeout: float) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise DevClusterError(
            f"{' '.join(argv[:4])} ... failed (exit {result.returncode}): {result.stderr.strip()[-800:]}",
            fix="read the node's logs under <cluster>/logs",
        )
    return result


def stop(cluster: Cluster, *, name: str, binaries: NodeBinaries, processes: list[Started]) -> list[str]:
    """Stops node NAME: the kubelet, then every pod sandbox and container, then containerd; unmounts
    what they left; removes the node's cgroups. Returns what it could not clean (said, not raised)."""
    layout = NodeLayout(directory=cluster.directory, name=name)
    by_name = {p.name: p for p in processes}
    kubelet = by_name.get(process_name("kubelet", name))
    if kubelet is not None:
        stop_process(kubelet)
    containerd = by_name.get(process_name("containerd", name))
    if containerd is not None and containerd.alive():
        # Stops and removes every sandbox with its containers: their processes end and their shims exit.
        with contextlib.suppress(DevClusterError, subprocess.TimeoutExpired):
            crictl(layout, binaries, "rmp", "--all", "--force", check=False, timeout=120)
        stop_process(containerd)
    kill_node(layout)
    problems = unmount_under([layout.root, layout.run_dir])
    parent = cgroup_parent(pathlib.Path("/proc/self/cgroup").read_text())
    problems += remove_cgroups(node_cgroup_root(parent, name))
    shutil.rmtree(layout.run_dir, ignore_errors=True)
    return problems


def kill_node(layout: NodeLayout) -> None:
    """SIGKILLs every task in the node's cgroups and every shim of its containerd: what a node's abrupt
    loss does to its containers, and what makes sure nothing of the node outlives `stop`."""
    root = node_cgroup_root(cgroup_parent(pathlib.Path("/proc/self/cgroup").read_text()), layout.name)
    top = CGROUP_MOUNTS / "memory" / root.lstrip("/")
    for _ in range(3):
        pids = sorted({int(pid) for tasks in top.rglob("cgroup.procs") for pid in _read_pids(tasks)})
        if not pids:
            break
        for pid in pids:
            _kill_exactly(pid, lambda pid: f":{root}/" in _read_text(f"/proc/{pid}/cgroup"))
        time.sleep(0.3)
    for pid in _node_pids(layout):
        _kill_exactly(pid, lambda pid: _names_node(layout, _read_bytes(f"/proc/{pid}/cmdline")))


def _kill_exactly(pid: int, still_ours: Callable[[int], bool]) -> None:
    """SIGKILL through a pidfd, once the process it pins is confirmed to be the one meant: a pid read
    a moment ago may already name a stranger."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        if still_ours(pid):
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    finally:
        os.close(pidfd)


def _read_text(path: str) -> str:
    try:
        return pathlib.Path(path).read_text()
    except OSError:
        return ""


def _read_bytes(path: str) -> bytes:
    try:
        return pathlib.Path(path).read_bytes()
    except OSError:
        return b""


def _read_pids(path: pathlib.Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def _names_node(layout: NodeLayout, cmdline: bytes) -> bool:
    """A shim of this node's containerd (its command line names the socket), or the node's containerd
    or kubelet (theirs name the node's directory)."""
    shim = b"containerd-shim-runc-v2" in cmdline and str(layout.containerd_socket).encode() in cmdline
    argv = cmdline.split(b"\0")
    ours = (f"--config={layout.root}/containerd.toml".encode(), f"--config={layout.root}/kubelet.json".encode())
    return shim or (os.path.basename(argv[0]) in (b"containerd", b"kubelet") and any(a in ours for a in argv))


def _node_pids(layout: NodeLayout) -> list[int]:
    """The processes of the node outside its cgroups: its containerd's shims (they run next to
    containerd), and its containerd and kubelet themselves even where no record names them (a node
    terminated while it boots may have spawned one a moment before)."""
    return [
        int(entry.name)
        for entry in pathlib.Path("/proc").iterdir()
        if entry.name.isdigit() and _names_node(layout, _read_bytes(f"/proc/{entry.name}/cmdline"))
    ]


def unmount_under(roots: list[pathlib.Path]) -> list[str]:
    """Lazily unmounts every mount point under `roots`, deepest first (overlay rootfs, sandbox shm,
    projected token tmpfs)."""
    problems = []
    prefixes = [str(r.resolve()) + "/" for r in roots]
    points = []
    for line in mounts().splitlines():
        point = line.split()[1].replace("\\040", " ")
        if any((point + "/").startswith(prefix) for prefix in prefixes):
            points.append(point)
    for point in sorted(set(points), key=lambda p: -p.count("/")):
        result = subprocess.run(["umount", "--lazy", point], capture_output=True, text=True, check=False)
        if result.returncode != 0 and "not mounted" not in result.stderr:
            problems.append(f"umount {point}: {result.stderr.strip()}")
    return problems


def lose(cluster: Cluster, name: str) -> None:
    """Node NAME lost abruptly, as by a power cut: SIGKILL to its kubelet, its containerd, every shim
    and every container process at once (and to the process booting it, if it is still booting).
    Nothing is cleaned (the cluster's `down` does that)."""
    ours = tuple(process_name(component, name) for component in ("boot", "kubelet", "containerd"))
    for process in [p for p in cluster.processes if p.name in ours and p.alive()]:
        _kill_exactly(process.pid, lambda _pid: process.alive())  # noqa: B023 -- called at once
    kill_node(NodeLayout(directory=cluster.directory, name=name))


def restart_kubelet(
    cluster: Cluster,
    name: str,
    *,
    binaries: NodeBinaries,
    spawn: Spawn,
) -> Any:
    """Starts node NAME's kubelet again (after a stop), on its existing containerd; returns it once the
    Node is Ready."""
    layout = NodeLayout(directory=cluster.directory, name=name)
    cgroup_root = node_cgroup_root(cgroup_parent(pathlib.Path("/proc/self/cgroup").read_text()), name)
    env = {**os.environ, "PATH": f"{binaries.search_path}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    log = cluster.directory / "logs" / f"{name}-kubelet.log"
    kubelet = spawn(process_name("kubelet", name), kubelet_argv(cluster, layout, binaries, cgroup_root), log, env)
    wait_ready(
        f"the kubelet's Node {name}", lambda: node_ready(cluster, name), process=kubelet, log=log, timeout=READY_TIMEOUT
    )
    return kubelet
