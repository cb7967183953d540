"""`coroner registrar` against real processes and the real API server: a Pod made by hand on this
machine. Its pid namespace (`unshare`, a `sleep` as the sandbox's pid 1) is shared by every
"container": a process entered into it with `nsenter` (so its parent is outside the namespace, as a
runtime's is) in a cgroup of its own named like a container id, nested under this process's own
memory cgroup. The registrar runs in it as in a Pod, under the worker ServiceAccount's token."""

from __future__ import annotations

import contextlib
import os
import pathlib
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

from coroner.core import api
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
