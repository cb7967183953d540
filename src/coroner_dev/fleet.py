"""A local fleet: the dev control plane with Coroner's API, the identities, and Coroner's processes.

The demo, the tests, the fault runner and the benchmarks all run the same things — a control plane,
the manifests, ServiceAccount tokens (node-bound for agents), `coroner-agent`, `coroner-operator`
and `coroner run` — so one module mints the tokens, writes the command lines and starts the
processes. The harness serves the code it ships with: it passes the flags this tree's components
take, and asks no build what it supports.

Every process starts in its own session (a fault or a benchmark can signal it, or its whole group,
without touching the harness) with a parent-death signal (`setpriv --pdeathsig`), so a harness
killed without cleaning up leaves none behind. The kernel sends that signal when the *thread* that
forked the process exits, so processes spawned from another thread are forked by one lasting
thread instead (the fault runner restarts agents from short-lived trial threads).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time
import typing
import uuid
from collections.abc import Callable, Sequence
from typing import TypeVar

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.client.kube import api_client
from coroner.core import api
from coroner_dev.devcluster import cluster as cluster_mod
from coroner_dev.devcluster.cluster import Cluster
from coroner_dev.devcluster.identities import ensure_node, mint_token
from coroner_dev.realnode import host_pid

#: The console scripts of the environment this module runs in: the code the harness ships with.
BIN = pathlib.Path(sys.executable).parent
REPO = pathlib.Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
REAL_BOOT_ID_FILE = pathlib.Path("/proc/sys/kernel/random/boot_id")
SYSTEM = api.SYSTEM_NAMESPACE
WORKER_CLUSTER_ROLE = "coroner-worker"
RETIRE_BINDING = "coroner-operator-retire"

_T = TypeVar("_T")


class FleetError(RuntimeError):
    """A step of starting the fleet failed; the message says which and why."""


# --- the control plane and the API ------------------------------------------------------------------


def up(
    *, directory: pathlib.Path, controller_manager: bool = True, progress: Callable[[str], None] | None = None
) -> Cluster:
    """The dev control plane of `directory`: the running one if it is ready, else a fresh start."""
    return cluster_mod.up(directory, controller_manager=controller_manager, progress=progress)


def kubectl(
    cluster: Cluster,
    *args: str,
    kubeconfig: pathlib.Path | None = None,
    stdin: str | None = None,
    timeout: float = 120.0,
) -> subprocess.CompletedProcess[str]:
    """The real kubectl built with the control plane, as the admin (or `kubeconfig`); never raises on
    a non-zero exit (callers say what a failure means to them; `kubectl_ok` raises)."""
    command = [str(cluster.binary("kubectl")), f"--kubeconfig={kubeconfig or cluster.kubeconfig}", *args]
    return subprocess.run(command, capture_output=True, text=True, input=stdin, timeout=timeout, check=False)


def kubectl_ok(cluster: Cluster, *args: str, kubeconfig: pathlib.Path | None = None) -> str:
    """kubectl's stdout; a FleetError with its stderr when it fails."""
    result = kubectl(cluster, *args, kubeconfig=kubeconfig)
    if result.returncode != 0:
        raise FleetError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def install(cluster: Cluster, *, grant: bool = True, node_loss: bool = False) -> None:
    """The manifests as an admin applies them: production (with the retire grant) or plan-only, and
    with `node_loss` also components/node-loss (whose admission half lets the operator retire on
    node evidence); returns once the CRD is served."""
    overlay = MANIFESTS / "overlays" / ("production" if grant else "plan-only")
    if node_loss:
        overlay = _with_node_loss(cluster, overlay)
    kubectl_ok(cluster, "apply", "-k", str(overlay))
    wait_for_api(cluster)
    if not grant:
        kubectl_ok(cluster, "delete", "clusterrolebinding", RETIRE_BINDING, "--ignore-not-found")


def install_api(cluster: Cluster) -> None:
    """Only the CRD and the admission policies (no workloads, no RBAC); returns once the CRD is served."""
    for manifest in ("crd.yaml", "admission-policies.yaml"):
        kubectl_ok(cluster, "apply", "--server-side", "--force-conflicts", "-f", str(MANIFESTS / "base" / manifest))
    wait_for_api(cluster)


def wait_for_api(cluster: Cluster) -> None:
    """Until the CRD is Established and kubectl's discovery knows it."""
    kubectl_ok(cluster, "wait", "--for=condition=Established", f"crd/{api.CRD_NAME}", "--timeout=60s")
    # kubectl's cached discovery, taken before the CRD was served, can lack it (then `kubectl get
    # registrations` fails on a fresh cluster): refresh it.
    kubectl_ok(cluster, "api-resources", f"--api-group={api.GROUP}")


def _with_node_loss(cluster: Cluster, overlay: pathlib.Path) -> pathlib.Path:
    """An overlay of one's own: `overlay` plus components/node-loss (kustomize wants relative paths)."""
    mine = cluster.directory / "overlays" / f"{overlay.name}-node-loss"
    mine.mkdir(parents=True, exist_ok=True)
    up_ = pathlib.Path(os.path.relpath(MANIFESTS, mine))
    (mine / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{up_ / 'overlays' / overlay.name}]\ncomponents: [{up_ / 'components' / 'node-loss'}]\n"
    )
    return mine


# --- identities -------------------------------------------------------------------------------------


def operator_kubeconfig(cluster: Cluster) -> pathlib.Path:
    """A token of the operator's ServiceAccount (which holds `retire` while the grant is bound)."""
    return mint_token(cluster, service_account=f"{SYSTEM}/coroner-operator")


def agent_kubeconfig(cluster: Cluster, *, node: str) -> pathlib.Path:
    """A token of the agent's ServiceAccount bound to Node `node`, as the kubelet mints a pod's."""
    return mint_token(cluster, service_account=f"{SYSTEM}/coroner-agent", node=node)


def bind_worker(cluster: Cluster, *, namespace: str, service_account: str, binding: str = "worker") -> None:
    """Binds ClusterRole coroner-worker to `service_account` (NAMESPACE/NAME) in `namespace`, creating
    the namespace if missing: what a cluster admin does for a worker's namespace."""
    sa_namespace, _, sa_name = service_account.partition("/")
    namespace_body = k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace))
    body = k8s.V1RoleBinding(
        metadata=k8s.V1ObjectMeta(name=binding, namespace=namespace),
        role_ref=k8s.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=WORKER_CLUSTER_ROLE),
        subjects=[k8s.RbacV1Subject(kind="ServiceAccount", name=sa_name, namespace=sa_namespace)],
    )
    with api_client(cluster.kubeconfig) as admin:
        with contextlib.suppress(_Exists):
            _create(lambda: k8s.CoreV1Api(admin).create_namespace(namespace_body))
        with contextlib.suppress(_Exists):
            _create(lambda: k8s.RbacAuthorizationV1Api(admin).create_namespaced_role_binding(namespace, body))


def worker_kubeconfig(
    cluster: Cluster, *, namespaces: Sequence[str], service_account: str = "worker", binding: str = "worker"
) -> pathlib.Path:
    """A token of ServiceAccount `service_account` in the first namespace, bound to coroner-worker in
    every one of `namespaces` (each created if missing)."""
    home = namespaces[0]
    for namespace in namespaces:
        bind_worker(cluster, namespace=namespace, service_account=f"{home}/{service_account}", binding=binding)
    return mint_token(cluster, service_account=f"{home}/{service_account}")


class _Exists(Exception):
    """The object is there already (409)."""


def _create(call: Callable[[], object]) -> None:
    try:
        call()
    except ApiException as exc:
        if exc.status == 409:
            raise _Exists from exc
        raise


# --- nodes ------------------------------------------------------------------------------------------


@dataclasses.dataclass(kw_only=True)
class Node:
    """A simulated node: a Node object with a boot id, the boot-id file its agent and workers read
    (so several nodes share one machine), and its agent's node-bound token."""

    name: str
    boot_id: str
    boot_file: pathlib.Path
    kubeconfig: pathlib.Path

    def reboot(self, cluster: Cluster, *, boot_id: str | None = None) -> str:
        """A new boot id in the file and on the Node object (the agent is the caller's to restart)."""
        self.boot_id = boot_id or str(uuid.uuid4())
        self.boot_file.write_text(self.boot_id + "\n")
        ensure_node(cluster, name=self.name, boot_id=self.boot_id)
        return self.boot_id


def real_boot_id() -> str:
    """This machine's boot id: the node that uses it is the machine itself."""
    return REAL_BOOT_ID_FILE.read_text().strip()


def node(cluster: Cluster, *, name: str, directory: pathlib.Path, boot_id: str | None = None) -> Node:
    """Creates (or updates) Node `name` with `boot_id` (a random one if None), writes its boot-id file
    in `directory` and mints its agent's token."""
    boot = boot_id or str(uuid.uuid4())
    directory.mkdir(parents=True, exist_ok=True)
    boot_file = directory / f"{name}.boot_id"
    boot_file.write_text(boot + "\n")
    ensure_node(cluster, name=name, boot_id=boot)
    return Node(name=name, boot_id=boot, boot_file=boot_file, kubeconfig=agent_kubeconfig(cluster, node=name))


# --- command lines ----------------------------------------------------------------------------------


def operator_argv(*, kubeconfig: pathlib.Path, extra: Sequence[str] = ()) -> list[str]:
    return [str(BIN / "coroner-operator"), f"--kubeconfig={kubeconfig}", *extra]


def agent_argv(
    *, kubeconfig: pathlib.Path, node: str, boot_id_file: pathlib.Path, extra: Sequence[str] = ()
) -> list[str]:
    return [
        str(BIN / "coroner-agent"),
        f"--node-name={node}",
        f"--kubeconfig={kubeconfig}",
        f"--boot-id-file={boot_id_file}",
        *extra,
    ]


def run_argv(
    *,
    namespace: str,
    node: str,
    name: str,
    kubeconfig: pathlib.Path,
    boot_id_file: pathlib.Path | None,
    command: Sequence[str],
    heartbeat: tuple[int, int] | None = None,
) -> list[str]:
    """`coroner run` of `command` as worker `name` on `node`; with `heartbeat` (interval, TTL) it opts
    into heartbeats, by default it registers once and sends none. `boot_id_file` None: the machine's."""
    beats = [] if heartbeat is None else [f"--interval-seconds={heartbeat[0]}", f"--ttl-seconds={heartbeat[1]}"]
    return [
        str(BIN / "coroner"),
        "run",
        "-n",
        namespace,
        f"--node-name={node}",
        f"--name={name}",
        f"--kubeconfig={kubeconfig}",
        *beats,
        *([] if boot_id_file is None else [f"--boot-id-file={boot_id_file}"]),
        "--",
        *command,
    ]


# --- processes --------------------------------------------------------------------------------------

_forker: concurrent.futures.ThreadPoolExecutor | None = None
_forker_lock = threading.Lock()


def _in_lasting_thread(call: Callable[[], _T]) -> _T:
    """Runs `call` (a fork) in the main thread or in one thread that lives as long as this process,
    so a child's parent-death signal fires when the harness dies, not when a helper thread ends."""
    global _forker
    if threading.current_thread() is threading.main_thread():
        return call()
    with _forker_lock:
        if _forker is None:
            _forker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleet-forker")
    return _forker.submit(call).result()


@functools.cache
def _setpriv() -> str | None:
    """util-linux `setpriv`, which sets the parent-death signal and execs (None: not installed)."""
    return shutil.which("setpriv")


def spawn(
    argv: Sequence[str],
    *,
    log: pathlib.Path | None,
    env: dict[str, str] | None = None,
    parent_death: signal.Signals = signal.SIGTERM,
    process_group: int | None = None,
) -> subprocess.Popen[bytes]:
    """Starts `argv` in its own session (or in `process_group`), stdout and stderr appended to `log`
    (discarded if None), with `parent_death` sent to it if this process dies first. setpriv execs the
    command, so the Popen's pid is the command's."""
    setpriv = _setpriv()
    name = parent_death.name.removeprefix("SIG")
    full = [setpriv, f"--pdeathsig={name}", "--", *argv] if setpriv else list(argv)

    def fork() -> subprocess.Popen[bytes]:
        with contextlib.ExitStack() as stack:
            if log is None:
                out: int | typing.IO[bytes] = subprocess.DEVNULL
                err: int = subprocess.DEVNULL
            else:
                log.parent.mkdir(parents=True, exist_ok=True)
                out, err = stack.enter_context(open(log, "ab")), subprocess.STDOUT
            return subprocess.Popen(
                full,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=None if env is None else {**os.environ, **env},
                start_new_session=process_group is None,
                process_group=process_group,
            )

    return _in_lasting_thread(fork)


def stop(proc: subprocess.Popen[bytes] | None, *, timeout: float = 20.0) -> None:
    """SIGCONT (a frozen process cannot handle SIGTERM) and SIGTERM, then SIGKILL to its whole group
    after `timeout`; always reaped."""
    if proc is None or proc.poll() is not None:
        return
    _terminate(proc)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill(proc)


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    """SIGCONT and SIGTERM to the process, or to its whole group if it leads one (a launcher and
    its worker, a pid namespace's init and what runs in it)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            os.kill(proc.pid, signal.SIGCONT)
            os.kill(proc.pid, signal.SIGTERM)


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process and, if it leads one, its group (the process goes with its machine); reaped."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(proc.pid) == proc.pid:
                os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    proc.wait(timeout=30)


def start_operator(
    *, kubeconfig: pathlib.Path, log: pathlib.Path, extra: Sequence[str] = (), env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    return spawn(operator_argv(kubeconfig=kubeconfig, extra=extra), log=log, env=env)


def start_agent(
    *,
    node: Node,
    log: pathlib.Path,
    kubeconfig: pathlib.Path | None = None,
    extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """`node`'s agent, with its own token unless `kubeconfig` (e.g. one through a proxy) is given."""
    argv = agent_argv(
        kubeconfig=kubeconfig or node.kubeconfig, node=node.name, boot_id_file=node.boot_file, extra=extra
    )
    return spawn(argv, log=log, env=env)


def run_worker(
    *,
    namespace: str,
    node: Node,
    name: str,
    kubeconfig: pathlib.Path,
    log: pathlib.Path,
    command: Sequence[str] = ("sleep", "600"),
    heartbeat: tuple[int, int] | None = None,
) -> subprocess.Popen[bytes]:
    """A real `coroner run` launcher of `command` on `node`, in its own session (so a vanished
    machine can be played by killing the group). Its parent-death signal is SIGKILL: a harness gone
    is a machine gone."""
    argv = run_argv(
        namespace=namespace,
        node=node.name,
        name=name,
        kubeconfig=kubeconfig,
        boot_id_file=node.boot_file,
        command=command,
        heartbeat=heartbeat,
    )
    return spawn(argv, log=log, parent_death=signal.SIGKILL)


class Processes:
    """What one harness started, stopped together (last started, first stopped)."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []

    def add(self, proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        self.started.append(proc)
        return proc

    def stop_all(self, *, timeout: float = 20.0) -> None:
        for proc in reversed(self.started):
            if proc.poll() is None:
                _terminate(proc)
        for proc in reversed(self.started):
            stop(proc, timeout=timeout)
        self.started.clear()


# --- pid namespaces ---------------------------------------------------------------------------------


def children(pid: int) -> list[int]:
    """The pids of `pid`'s children (none if it is gone)."""
    try:
        return [int(c) for c in pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def wait_child(pid: int, *, timeout: float = 10.0) -> int:
    """`pid`'s first child, once it has one (a launcher's worker, nsenter's command)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = children(pid)
        if kids:
            return kids[0]
        time.sleep(0.005)
    raise FleetError(f"process {pid} started no child within {timeout} s")


class PidNamespace:
    """A pid namespace whose init just sleeps; workers enter it with nsenter, and a number in it can
    be handed out again on purpose (`reuse`), as a container's pids are: the pid-reuse case made real.
    Needs root and util-linux `unshare` and `nsenter`."""

    def __init__(self) -> None:
        self.init = spawn(
            ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sleep", "3600"],
            log=None,
            parent_death=signal.SIGKILL,
        )
        self.init_pid = wait_child(self.init.pid)
        self.link = os.readlink(f"/proc/{self.init_pid}/ns/pid")
        self.lock = threading.Lock()
        self.extra: list[subprocess.Popen[bytes]] = []

    def holder(self, number: int) -> int | None:
        """The host pid of the process whose pid in this namespace is `number`, if any."""
        return host_pid(self.link, number)

    def enter(self, *command: str) -> list[str]:
        """`command`, run inside this namespace."""
        return ["nsenter", f"--target={self.init_pid}", "--pid", "--mount", "--", *command]

    def spawn(self, *command: str, log: pathlib.Path | None = None) -> tuple[subprocess.Popen[bytes], int]:
        """Runs `command` in the namespace; returns nsenter's process and the command's host pid."""
        proc = spawn(self.enter(*command), log=log, parent_death=signal.SIGKILL)
        self.extra.append(proc)
        return proc, wait_child(proc.pid)

    def reuse(self, number: int, *, attempts: int = 5) -> tuple[subprocess.Popen[bytes], int]:
        """Forks a `sleep` that gets namespaced pid `number` (ns_last_pid = number - 1, then fork);
        returns its shell's process and the sleep's host pid."""
        with self.lock:
            for _ in range(attempts):
                shell = f"echo {number - 1} > /proc/sys/kernel/ns_last_pid; sleep 3600 & wait"
                proc = spawn(self.enter("sh", "-c", shell), log=None, parent_death=signal.SIGKILL)
                self.extra.append(proc)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    holder = self.holder(number)
                    if holder is not None:
                        with contextlib.suppress(OSError):
                            if pathlib.Path(f"/proc/{holder}/comm").read_text().strip() == "sleep":
                                return proc, holder
                    time.sleep(0.01)
                kill(proc)
        raise FleetError(f"could not force pid {number} in {self.link}")

    def close(self) -> None:
        """SIGKILLs everything in and around the namespace; reaps it."""
        for proc in [*self.extra, self.init]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in [*self.extra, self.init]:
            with contextlib.suppress(Exception):
                proc.wait(timeout=10)
