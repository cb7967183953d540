"""`coroner registrar` against real processes and the real API server: a Pod made by hand on this
machine. Its pid namespace (`unshare`, a `sleep` as the sandbox's pid 1) is shared by every
"container": a process entered into it with `nsenter` (so its parent is outside the namespace, as a
runtime's is) in a cgroup of its own named like a container id, nested under this process's own
memory cgroup. The registrar runs in it as in a Pod, under the worker ServiceAccount's token."""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from coroner import launcher, pidfs
from coroner.core import api, procfs
from coroner.core.exits import Ending
from coroner.registrar import Registrar, registration_name
from coroner_dev import fleet
from coroner_dev.devcluster import cgroups
from coroner_dev.devcluster.cluster import Cluster
from support import components, kube
from support.fleet import worker_kubeconfig

pytestmark = [
    pytest.mark.integration,
    pytest.mark.procs,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("nsenter") is None, reason="needs root and nsenter"),
]

CORONER = str(pathlib.Path(sys.executable).parent / "coroner")
POD = "api-7d9f8-x2x4q"


class Pod:
    """A pid namespace with its sandbox process, and containers as cgroups nested under ours."""

    def __init__(self, directory: pathlib.Path) -> None:
        self.directory = directory
        self.sandbox = fleet.spawn(
            ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sleep", "3600"],
            log=None,
            parent_death=signal.SIGKILL,
        )
        self.init = fleet.wait_child(self.sandbox.pid)
        memory = cgroups.CGROUP_MOUNTS / "memory"
        parent = cgroups.cgroup_parent(pathlib.Path("/proc/self/cgroup").read_text())
        self.cgroups = memory / parent.lstrip("/") / f"coroner-registrar-test-{uuid.uuid4().hex[:8]}"
        self.cgroups.mkdir()
        self.started: list[subprocess.Popen[bytes]] = [self.sandbox]

    def container_id(self) -> str:
        return uuid.uuid4().hex + uuid.uuid4().hex

    def start(self, container: str, *command: str, log: str = "container") -> subprocess.Popen[bytes]:
        """`command` as a process the runtime started in `container` (joined before it execs)."""
        group = self.cgroups / container
        group.mkdir(exist_ok=True)
        shell = f'echo $$ > {group}/cgroup.procs && exec "$@"'
        argv = ["nsenter", f"--target={self.init}", "--pid", "--mount", "--", "sh", "-c", shell, "sh", *command]
        proc = fleet.spawn(argv, log=self.directory / f"{log}.log", parent_death=signal.SIGKILL)
        self.started.append(proc)
        return proc

    def pid_in_namespace(self, proc: subprocess.Popen[bytes]) -> int:
        host = fleet.wait_child(proc.pid)
        status = pathlib.Path(f"/proc/{host}/status").read_text()
        return int(next(line.split()[-1] for line in status.splitlines() if line.startswith("NSpid:")))

    def close(self) -> None:
        for proc in reversed(self.started):
            fleet.kill(proc)
        for group in sorted(self.cgroups.glob("*"), reverse=True):
            with contextlib.suppress(OSError):
                group.rmdir()
        with contextlib.suppress(OSError):
            self.cgroups.rmdir()


@pytest.fixture
def pod(tmp_path: pathlib.Path) -> Iterator[Pod]:
    made = Pod(tmp_path)
    try:
        yield made
    finally:
        made.close()


def registrations(admin: k8s.ApiClient, namespace: str) -> dict[str, dict[str, Any]]:
    listed = k8s.CustomObjectsApi(admin).list_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL)
    return {item["metadata"]["name"]: item for item in listed["items"]}


def of_container(found: dict[str, dict[str, Any]], container: str) -> list[dict[str, Any]]:
    return [body for name, body in found.items() if name.startswith(f"{POD}-{container[:12]}-")]


def released(body: dict[str, Any]) -> bool:
    condition = components.condition(body, "Released")
    return condition is not None and condition["status"] == "True"


def test_the_registrar_registers_each_containers_main_process_and_releases_only_clean_exits(
    plane: Cluster, admin: k8s.ApiClient, namespace: str, pod: Pod
) -> None:
    config = worker_kubeconfig(plane, namespace)
    registrar_container = pod.container_id()
    argv = [CORONER, "registrar", "-n", namespace, "--node-name=node-a", f"--pod-name={POD}",
            f"--kubeconfig={config}", "--scan-seconds=0.2"]  # fmt: skip
    registrar = pod.start(registrar_container, *argv, log="registrar")
    server, clean, term, killed = (pod.container_id() for _ in range(4))
    server_proc = pod.start(server, "sleep", "600")
    started = time.monotonic()
    kube.wait_for(lambda: len(of_container(registrations(admin, namespace), server)) == 1, what="server registered")
    print(f"\ncontainer start -> registered: {time.monotonic() - started:.2f} s")
    (body,) = of_container(registrations(admin, namespace), server)
    incarnation = body["spec"]["incarnation"]
    assert incarnation["pid"] == pod.pid_in_namespace(server_proc)
    assert incarnation["pidNamespace"] == os.readlink(f"/proc/{pod.init}/ns/pid").removeprefix("pid:[").rstrip("]")
    # The process's pidfd inode, by which an agent without ptrace access finds it.
    assert incarnation["pidfdInode"] == str(pidfs.inode_of(fleet.wait_child(server_proc.pid)))
    assert body["spec"]["clientInstanceId"].startswith(api.CLIENT_INSTANCE_PREFIX)
    # A later process the runtime starts in the same container is a `kubectl exec`, not its main one.
    exec_proc = pod.start(server, "sleep", "600", log="exec")
    # Exit 0 and a SIGTERM honoured are clean: Released; a SIGKILL is the agent's to attest.
    pod.start(clean, "sh", "-c", "sleep 2; exit 0", log="clean")
    term_proc = pod.start(term, "sleep", "600", log="term")
    killed_proc = pod.start(killed, "sleep", "600", log="killed")
    for container in (clean, term, killed):
        kube.wait_for(lambda c=container: len(of_container(registrations(admin, namespace), c)) == 1, what="registered")
    os.kill(fleet.wait_child(term_proc.pid), signal.SIGTERM)
    os.kill(fleet.wait_child(killed_proc.pid), signal.SIGKILL)
    for container in (clean, term):
        kube.wait_for(
            lambda c=container: released(of_container(registrations(admin, namespace), c)[0]), what="Released"
        )
    time.sleep(2)
    found = registrations(admin, namespace)
    assert not released(of_container(found, killed)[0])
    assert len(of_container(found, server)) == 1 and not released(of_container(found, server)[0])
    assert not of_container(found, registrar_container)
    # The registrar may die without harm: restarted, it registers nothing twice.
    fleet.kill(registrar)
    pod.start(registrar_container, *argv, log="registrar-again")
    # A container restarted is a new container (the runtime's new id, its old cgroup gone with
    # everything in it): a new main process, a new registration.
    fleet.kill(exec_proc)
    fleet.kill(server_proc)
    restarted = pod.container_id()
    pod.start(restarted, "sleep", "600", log="restarted")
    kube.wait_for(lambda: len(of_container(registrations(admin, namespace), restarted)) == 1, what="the restart")
    time.sleep(1)
    assert len(registrations(admin, namespace)) == 5


def registrar_argv(plane: Cluster, namespace: str) -> list[str]:
    config = worker_kubeconfig(plane, namespace)
    return [CORONER, "registrar", "-n", namespace, "--node-name=node-a", f"--pod-name={POD}",
            f"--kubeconfig={config}", "--scan-seconds=0.2"]  # fmt: skip


def start_time_of_pid(pid: int) -> int:
    return procfs.parse_stat(pathlib.Path(f"/proc/{pid}/stat").read_bytes()).start_time


def start_time_of(proc: subprocess.Popen[bytes]) -> int:
    """The start time of the container process `proc` (an nsenter) started, as /proc gives it."""
    return start_time_of_pid(fleet.wait_child(proc.pid))


def test_a_container_whose_registration_is_refused_leaves_the_others_registered_and_is_tried_again(
    plane: Cluster, admin: k8s.ApiClient, namespace: str, pod: Pod, tmp_path: pathlib.Path
) -> None:
    refused, other = pod.container_id(), pod.container_id()
    refused_proc = pod.start(refused, "sleep", "600", log="refused")
    name = registration_name(pod_name=POD, container=refused, start_time=start_time_of(refused_proc))
    # Its name is taken by another incarnation: the API server refuses it (409), a RegistrationError.
    kube.create_registration(admin, namespace, kube.registration_body(name=name, interval=None))
    registrar = pod.start(pod.container_id(), *registrar_argv(plane, namespace), log="registrar")
    pod.start(other, "sleep", "600", log="other")
    kube.wait_for(lambda: len(of_container(registrations(admin, namespace), other)) == 1, what="the other registered")
    log = tmp_path / "registrar.log"
    kube.wait_for(lambda: log.read_text().count(f"workerregistration={namespace}/{name} ") >= 2, what="tried again")
    assert registrar.poll() is None, log.read_text()
    assert "already exists for another incarnation" in log.read_text()
    # Once the name is free, the next attempt registers the container's own incarnation.
    kube.custom(admin).delete_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name)
    pid = pod.pid_in_namespace(refused_proc)
    kube.wait_for(
        lambda: (
            kube.exists(admin, namespace, name)
            and kube.get_registration(admin, namespace, name)["spec"]["incarnation"]["pid"] == pid
        ),
        timeout=90,
        what="the refused container registered",
    )
    assert registrar.poll() is None


def test_an_exit_the_runtime_reaps_late_is_registered_once(
    plane: Cluster, admin: k8s.ApiClient, namespace: str, tmp_path: pathlib.Path
) -> None:
    """A zombie stays in its container's cgroup on cgroup v2 (on v1 it shows `/`, so this host's own
    /proc cannot show it): the registrar reads a /proc made of this host's real entries for a real
    process, with the cgroup a v2 node shows, and the process is killed and left unreaped (its
    "runtime", this test, does not wait for it) for several scans after the registrar's reap wait."""
    proc_root = tmp_path / "proc"
    (proc_root / "0" / "ns").mkdir(parents=True)
    (proc_root / "self").symlink_to("0")  # the registrar's own pid: none of the Pod's processes
    (proc_root / "0" / "ns" / "pid").symlink_to(os.readlink("/proc/self/ns/pid"))
    worker = subprocess.Popen(["sleep", "600"])
    container = uuid.uuid4().hex + uuid.uuid4().hex
    try:
        entry = proc_root / str(worker.pid)
        entry.mkdir()
        for name in ("stat", "status"):
            (entry / name).write_bytes(pathlib.Path(f"/proc/{worker.pid}/{name}").read_bytes())
        (entry / "status").write_text(re.sub(r"(?m)^PPid:.*$", "PPid:\t0", (entry / "status").read_text()))
        (entry / "cgroup").write_text(f"0::/kubepods.slice/cri-containerd-{container}.scope\n")
        registrar = Registrar(
            client=launcher.client_for(str(worker_kubeconfig(plane, namespace))),
            namespace=namespace,
            node_name="node-a",
            pod_name=POD,
            proc_root=str(proc_root),
            reap_wait_seconds=0.2,
        )
        registrar.scan_once()
        name = registration_name(pod_name=POD, container=container, start_time=start_time_of_pid(worker.pid))
        assert kube.exists(admin, namespace, name)
        os.kill(worker.pid, signal.SIGKILL)
        for _ in range(5):
            registrar.wait(1.0)
            registrar.scan_once()
        assert registrar.endings == [(name, Ending.UNKNOWN)]
        assert not registrar.tracked
        registrar.client.close()
    finally:
        worker.kill()
        worker.wait()
