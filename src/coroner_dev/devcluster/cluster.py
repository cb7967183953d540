"""A real local control plane: etcd + kube-apiserver (+ kube-controller-manager) on loopback.

`up` starts what a cluster directory describes and returns once `/readyz` is OK; `down` stops
exactly what `up` started there. Each started process is recorded as (pid, start time): a pid
number is reused, an incarnation is not, so `down` never signals a stranger that inherited a pid —
the same rule Coroner enforces for workers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import os
import pathlib
import shutil
import signal
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

from coroner.core import procfs
from coroner_dev.devcluster import cgroups as cgroups_mod
from coroner_dev.devcluster import pki as pki_mod
from coroner_dev.devcluster.binaries import Binaries, ensure_binaries
from coroner_dev.devcluster.errors import DevClusterError

STATE_FILE = "cluster.json"
SERVICE_CIDR = "10.0.0.0/24"
READY_TIMEOUT = 180.0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Started:
    """One process `up` started: enough to find it again and to prove it is still the same one."""

    name: str
    pid: int
    start_time: int

    def alive(self) -> bool:
        """True only if this pid still holds the incarnation `up` started."""
        return _start_time(self.pid) == self.start_time


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """What `up` returns and writes to DIR/cluster.json."""

    directory: pathlib.Path
    apiserver_port: int
    etcd_port: int
    binaries: pathlib.Path
    processes: tuple[Started, ...]
    nodes: tuple[str, ...] = ()
    """The names of the real nodes (kubelet + containerd each) `up --node` started, if any."""
    node_cgroups: tuple[str, ...] = ()
    """The cgroup directories the nodes created, removed again by `down`."""

    @property
    def kubeconfig(self) -> pathlib.Path:
        return self.directory / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def pki(self) -> pki_mod.Pki:
        return pki_mod.Pki(directory=self.directory / "pki")

    def binary(self, name: str) -> pathlib.Path:
        return self.binaries / name

    def to_json(self) -> dict[str, Any]:
        return {
            "apiserverPort": self.apiserver_port,
            "etcdPort": self.etcd_port,
            "binaries": str(self.binaries),
            "processes": [dataclasses.asdict(p) for p in self.processes],
            "nodes": list(self.nodes),
            "nodeCgroups": list(self.node_cgroups),
        }

    @classmethod
    def load(cls, directory: pathlib.Path) -> Cluster | None:
        path = directory / STATE_FILE
        try:
            raw = json.loads(path.read_text())
            return cls(
                directory=directory,
                apiserver_port=int(raw["apiserverPort"]),
                etcd_port=int(raw["etcdPort"]),
                binaries=pathlib.Path(raw["binaries"]),
                processes=tuple(Started(**p) for p in raw["processes"]),
                nodes=tuple(raw.get("nodes", ())),
                node_cgroups=tuple(raw.get("nodeCgroups", ())),
            )
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            raise DevClusterError(
                f"the cluster state file {path} is unreadable ({exc})",
                fix=f"run `coroner dev-cluster down --dir {directory}` (it stops what it can find) or remove {path}",
            ) from exc


def save(cluster: Cluster) -> None:
    """Writes CLUSTER's state file: what `down` stops."""
    (cluster.directory / STATE_FILE).write_text(json.dumps(cluster.to_json(), indent=2) + "\n")


def _start_time(pid: int) -> int | None:
    """The start time of `pid`, or None once it is gone (or a zombie: exited, not yet reaped)."""
    try:
        stat = procfs.parse_stat(pathlib.Path(f"/proc/{pid}/stat").read_bytes())
    except (OSError, procfs.ParseError):
        return None
    return None if stat.state == "Z" else stat.start_time


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _spawn(name: str, argv: list[str], *, log: pathlib.Path, env: dict[str, str] | None = None) -> Started:
    # posix_spawn, not Popen: the process must outlive `coroner dev-cluster up`, and a Popen object
    # left behind warns when collected. setsid detaches it from the caller's terminal signals.
    log.parent.mkdir(parents=True, exist_ok=True)
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, str(log), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644),
        (os.POSIX_SPAWN_DUP2, 1, 2),
        # Nothing else the caller holds: a process that outlives it must not keep, say, the lock file
        # of `flock LOCK coroner dev-cluster up` open, which would hold that lock until `down`.
        *((os.POSIX_SPAWN_CLOSE, fd) for fd in _inherited_fds()),
    ]
    pid = os.posix_spawn(argv[0], argv, dict(os.environ) if env is None else env, file_actions=actions, setsid=True)
    for _ in range(100):
        start = _start_time(pid)
        if start is not None:
            return Started(name=name, pid=pid, start_time=start)
        time.sleep(0.01)
    _reap(pid)
    raise DevClusterError(f"{name} exited immediately; see {log}", fix=f"read {log}")


def _inherited_fds() -> list[int]:
    """This process's open descriptors above stderr that a spawned process would inherit."""
    fds = []
    for entry in os.listdir("/proc/self/fd"):
        fd = int(entry)
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            if fd > 2 and os.get_inheritable(fd):
                fds.append(fd)
    return fds


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def stop_process(process: Started, *, timeout: float = 15.0) -> None:
    if not process.alive():
        _reap(process.pid)
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(process.pid)
        if not process.alive():
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGKILL)
    for _ in range(100):
        _reap(process.pid)
        if not process.alive():
            return
        time.sleep(0.02)


def _tail(path: pathlib.Path, lines: int = 12) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:])
    except OSError:
        return "(no log)"


def http_get(
    *, host: str, port: int, path: str, context: ssl.SSLContext | None, timeout: float = 2.0
) -> tuple[int, bytes]:
    conn: http.client.HTTPConnection
    if context is None:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    else:
        conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def admin_ssl_context(cluster: Cluster) -> ssl.SSLContext:
    """TLS context that verifies the API server and presents the admin client certificate."""
    context = ssl.create_default_context(cafile=str(cluster.pki.ca_cert))
    context.load_cert_chain(str(cluster.pki.client_cert("admin")), str(cluster.pki.client_key("admin")))
    return context


def wait_ready(
    what: str,
    probe: Callable[[], bool],
    *,
    process: Started,
    log: pathlib.Path,
    timeout: float,
) -> None:
    """Returns once `probe()` holds; raises, with the log's last lines, when PROCESS exits first or
    TIMEOUT passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.alive():
            _reap(process.pid)
            tail = _tail(log)
            fix = f"read {log}"
            if "address already in use" in tail:
                fix = "another process holds the port; run `coroner dev-cluster up` again (it picks new ports)"
            raise DevClusterError(f"{what} exited during startup; last log lines:\n{tail}", fix=fix)
        with contextlib.suppress(OSError, http.client.HTTPException):
            if probe():
                return
        time.sleep(0.2)
    raise DevClusterError(
        f"{what} did not become ready within {timeout:.0f} s; last log lines:\n{_tail(log)}",
        fix=f"read {log}",
    )


def is_ready(cluster: Cluster) -> bool:
    """True when every recorded process is the one `up` started and `/readyz` answers OK."""
    if not all(p.alive() for p in cluster.processes):
        return False
    try:
        status, _ = http_get(
            host="127.0.0.1", port=cluster.apiserver_port, path="/readyz", context=admin_ssl_context(cluster)
        )
    except (OSError, http.client.HTTPException):
        return False
    return status == 200


def write_kubeconfig(
    path: pathlib.Path,
    *,
    server: str,
    ca: pathlib.Path,
    user: str,
    cert: pathlib.Path | None = None,
    key: pathlib.Path | None = None,
    token: str | None = None,
) -> pathlib.Path:
    """A one-context kubeconfig for one identity (client certificate or bearer token)."""
    credentials: dict[str, str] = {}
    if cert is not None and key is not None:
        credentials = {"client-certificate": str(cert), "client-key": str(key)}
    if token is not None:
        credentials = {"token": token}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "coroner-dev", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": user, "context": {"cluster": "coroner-dev", "user": user}}],
        "current-context": user,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2) + "\n")
    path.chmod(0o600)
    return path


def up(
    directory: pathlib.Path,
    *,
    controller_manager: bool = True,
    nodes: tuple[str, ...] = (),
    progress: Callable[[str], None] | None = None,
) -> Cluster:
    """Starts (or finds running) etcd and kube-apiserver for DIR; returns once the API is ready.

    With `nodes`, also kube-scheduler, every controller a node needs (Deployments, DaemonSets, node
    lifecycle, the root CA publisher) and one real node of each name: containerd and a kubelet,
    with Coroner's images built and imported (`coroner_dev.devcluster.node`); returns once every
    Node is Ready."""
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    existing = Cluster.load(directory)
    if existing is not None:
        if is_ready(existing) and existing.nodes == nodes:
            return existing
        # A stale state file (some recorded process is gone or not ready) or other nodes asked for:
        # stop what is left so nothing half-started lingers, then start afresh.
        down(directory)

    binaries = ensure_binaries(progress=progress)
    say = progress or (lambda message: None)
    if nodes:
        from coroner_dev.devcluster import images as images_mod
        from coroner_dev.devcluster.nodebinaries import ensure_node_binaries

        # Builds take minutes the first time: said on stderr when the caller passes no progress.
        node_binaries = ensure_node_binaries(progress=progress)
        built = images_mod.ensure_images(progress=progress)
    pki = pki_mod.ensure_pki(directory / "pki")
    logs = directory / "logs"
    started: list[Started] = []
    cgroups: list[str] = []
    try:
        etcd_port, peer_port = free_port(), free_port()
        etcd_log = logs / "etcd.log"
        etcd = _spawn("etcd", _etcd_argv(binaries, directory, etcd_port, peer_port), log=etcd_log)
        started.append(etcd)
        wait_ready(
            "etcd",
            lambda: http_get(host="127.0.0.1", port=etcd_port, path="/health", context=None)[0] == 200,
            process=etcd,
            log=etcd_log,
            timeout=60,
        )
        api_port = free_port()
        api_log = logs / "kube-apiserver.log"
        apiserver = _spawn(
            "kube-apiserver",
            _apiserver_argv(binaries, directory, pki, etcd_port, api_port, node=bool(nodes)),
            log=api_log,
        )
        started.append(apiserver)
        cluster = Cluster(
            directory=directory,
            apiserver_port=api_port,
            etcd_port=etcd_port,
            binaries=binaries.directory,
            processes=tuple(started),
        )
        context = admin_ssl_context(cluster)
        wait_ready(
            "kube-apiserver",
            lambda: (
                http_get(host="127.0.0.1", port=api_port, path="/readyz", context=context)[0] == 200
                and http_get(host="127.0.0.1", port=api_port, path="/api/v1/namespaces/default", context=context)[0]
                == 200
            ),
            process=apiserver,
            log=api_log,
            timeout=READY_TIMEOUT,
        )
        write_kubeconfig(
            cluster.kubeconfig,
            server=cluster.server,
            ca=pki.ca_cert,
            user="admin",
            cert=pki.client_cert("admin"),
            key=pki.client_key("admin"),
        )
        if (controller_manager or nodes) and binaries.has_controller_manager:
            kcm_log = logs / "kube-controller-manager.log"
            kcm = _spawn("kube-controller-manager", _kcm_argv(binaries, cluster, pki, node=bool(nodes)), log=kcm_log)
            started.append(kcm)
        cluster = dataclasses.replace(cluster, processes=tuple(started))
        if nodes:
            from coroner_dev.devcluster import node as node_mod

            scheduler = _spawn(
                "kube-scheduler",
                [
                    str(node_binaries.path("kube-scheduler")),
                    f"--kubeconfig={cluster.kubeconfig}",
                    "--leader-elect=false",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={free_port()}",
                    "--v=1",
                ],
                log=logs / "kube-scheduler.log",
            )
            started.append(scheduler)
            cluster = dataclasses.replace(cluster, nodes=nodes)
            for name in nodes:
                node_processes, created = node_mod.start(
                    cluster,
                    name=name,
                    binaries=node_binaries,
                    # The sandbox image first: every Pod needs it.
                    images=[(i.reference, i.archive) for i in sorted(built.all(), key=lambda i: i is not built.pause)],
                    sandbox_image=built.pause.reference,
                    spawn=lambda process, argv, log, env: _spawn(process, argv, log=log, env=env),
                    say=say,
                )
                started.extend(node_processes)
                cgroups.extend(created)
                cluster = dataclasses.replace(cluster, processes=tuple(started), node_cgroups=tuple(cgroups))
        save(cluster)
        return cluster
    except BaseException:
        # Never leave half-started processes behind (nor a started node's containers and cgroups).
        from coroner_dev.devcluster import node as node_mod

        for name in nodes:
            if any(p.name == node_mod.process_name("containerd", name) for p in started):
                node_mod.stop(cluster, name=name, binaries=node_binaries, processes=started)
        cgroups_mod.remove_ancestors(cgroups)
        for process in reversed(started):
            stop_process(process)
        raise


def lose_node(directory: pathlib.Path, name: str) -> None:
    """Node NAME of the cluster in DIR lost abruptly (`node.lose`): kubelet, containerd and containers
    SIGKILLed; `down` still cleans everything up."""
    from coroner_dev.devcluster import node as node_mod

    cluster = _require(directory)
    node_mod.lose(cluster, name)


def restart_kubelet(directory: pathlib.Path, name: str) -> Cluster:
    """Starts node NAME's kubelet again after it was stopped, and records it for `down`."""
    from coroner_dev.devcluster import node as node_mod
    from coroner_dev.devcluster.nodebinaries import ensure_node_binaries

    cluster = _require(directory)
    kubelet = node_mod.restart_kubelet(
        cluster,
        name,
        binaries=ensure_node_binaries(),
        spawn=lambda process, argv, log, env: _spawn(process, argv, log=log, env=env),
    )
    processes = (*(p for p in cluster.processes if p.name != kubelet.name), kubelet)
    cluster = dataclasses.replace(cluster, processes=processes)
    save(cluster)
    return cluster


def _require(directory: pathlib.Path) -> Cluster:
    cluster = Cluster.load(directory.resolve())
    if cluster is None:
        raise DevClusterError(f"no dev cluster in {directory}", fix=f"run `coroner dev-cluster up --dir {directory}`")
    return cluster


def down(directory: pathlib.Path) -> list[str]:
    """Stops what `up` started in DIR (and nothing else); returns the names it stopped."""
    directory = directory.resolve()
    cluster = Cluster.load(directory)
    if cluster is None:
        return []
    stopped = [p.name for p in reversed(cluster.processes) if p.alive()]
    if cluster.nodes:
        from coroner_dev.devcluster import karpenter

        # Karpenter first, then its instances: nothing launches one again while the rest stops.
        stopped += karpenter.stop(directory)
        cluster = Cluster.load(directory) or cluster
        from coroner_dev.devcluster import node as node_mod
        from coroner_dev.devcluster.nodebinaries import ensure_node_binaries

        node_binaries = ensure_node_binaries()
        for name in cluster.nodes:
            node_mod.stop(cluster, name=name, binaries=node_binaries, processes=list(cluster.processes))
        cgroups_mod.remove_ancestors(list(cluster.node_cgroups))
    for process in reversed(cluster.processes):
        stop_process(process)
    (directory / STATE_FILE).unlink(missing_ok=True)
    return stopped


#: What a cluster's directory holds of its own run: its registry, identities and logs. (The nodes'
#: directories stay: a kubelet's state may hold mounts, and a new registry makes it start over.)
RUN_STATE: Final = ("etcd", "tokens", "users", "logs")


def reset(directory: pathlib.Path) -> None:
    """Stops what `up` started in DIR and drops what it stored, so the next `up` starts empty: no
    registration, Node or Pod of an earlier run (a Node without its kubelet stays NotReady, and a
    DaemonSet's Pod for it Pending forever). The certificates stay: nothing of a run is in them."""
    down(directory)
    for name in RUN_STATE:
        shutil.rmtree(directory.resolve() / name, ignore_errors=True)


def _etcd_argv(binaries: Binaries, directory: pathlib.Path, port: int, peer_port: int) -> list[str]:
    return [
        str(binaries.path("etcd")),
        f"--data-dir={directory / 'etcd'}",
        f"--listen-client-urls=http://127.0.0.1:{port}",
        f"--advertise-client-urls=http://127.0.0.1:{port}",
        f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
        f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
        "--unsafe-no-fsync=true",
        "--quota-backend-bytes=8589934592",
        "--log-level=warn",
    ]


def _apiserver_argv(
    binaries: Binaries, directory: pathlib.Path, pki: pki_mod.Pki, etcd_port: int, port: int, *, node: bool = False
) -> list[str]:
    return [
        str(binaries.path("kube-apiserver")),
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        f"--cert-dir={directory / 'pki'}",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca_cert}",
        f"--secure-port={port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        # The kubernetes Service endpoint reconciler refuses loopback addresses; nothing here
        # reaches the API through that Service, so it is off.
        "--endpoint-reconciler-type=none",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        *(
            [
                # Kubelets run: the Node authorizer and NodeRestriction confine each one's credential
                # to its own Node and Pods, and the ServiceAccount admission plugin gives every Pod
                # its projected, Pod-bound token, as on any real cluster.
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
            ]
            if node
            else [
                "--authorization-mode=RBAC",
                # No kubelet: pods are never run, so the ServiceAccount admission plugin (which
                # wants mounted token volumes) stays off.
                "--disable-admission-plugins=ServiceAccount",
            ]
        ),
        f"--service-account-issuer=https://127.0.0.1:{port}",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        "--profiling=false",
        "--v=1",
    ]


def _kcm_argv(binaries: Binaries, cluster: Cluster, pki: pki_mod.Pki, *, node: bool = False) -> list[str]:
    # Without a node, only the controllers Coroner's tests rely on: namespace deletion, owner-reference
    # garbage collection, default ServiceAccounts, and aggregated ClusterRoles such as `view` (the
    # node lifecycle controller would taint the Node objects tests create without a kubelet). With
    # a node, every default controller, and a node that stops posting status is NotReady after 20 s.
    controllers = (
        ["--controllers=*", "--node-monitor-grace-period=20s", "--allocate-node-cidrs=false"]
        if node
        else ["--controllers=namespace,garbagecollector,serviceaccount,clusterrole-aggregation"]
    )
    return [
        str(binaries.path("kube-controller-manager")),
        f"--kubeconfig={cluster.kubeconfig}",
        *controllers,
        f"--service-account-private-key-file={pki.sa_key}",
        f"--root-ca-file={pki.ca_cert}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        "--secure-port=0",
        "--v=1",
    ]


@contextlib.contextmanager
def running(directory: pathlib.Path, *, keep: bool = False) -> Iterator[Cluster]:
    """`up` for the duration of a block; `down` afterwards unless `keep`."""
    cluster = up(directory)
    try:
        yield cluster
    finally:
        if not keep:
            down(directory)
