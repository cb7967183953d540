"""Simulated nodes with real agents and real workers, for tests that drive whole node lifecycles.

A `Node` is a Node object plus a boot-id file and an agent process with a node-bound token; a
`Worker` is a real `coroner run` launcher with its child, started in its own session so that an
abrupt loss can kill both at once, as a vanished machine would.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import client as k8s

from coroner_dev import fleet
from coroner_dev.devcluster.cluster import Cluster
from support import kube


class Node:
    """A `coroner_dev.fleet.Node` with its agent process (started on demand, resync every 2 s)."""

    def __init__(self, cluster: Cluster, directory: pathlib.Path, name: str, boot_id: str) -> None:
        self.cluster = cluster
        self.directory = directory
        self.node = fleet.node(cluster, name=name, directory=directory, boot_id=boot_id)
        self.name, self.boot_file, self.kubeconfig = name, self.node.boot_file, self.node.kubeconfig
        self.log = directory / f"agent-{name}.log"
        self.agent: subprocess.Popen[bytes] | None = None

    @property
    def boot_id(self) -> str:
        """The node's boot id (a reboot changes it)."""
        return self.node.boot_id

    def reboot(self) -> str:
        """A new boot id in the boot-id file and on the Node (restarting the agent is the test's)."""
        return self.node.reboot(self.cluster)

    def start_agent(self, *extra: str) -> None:
        self.agent = fleet.start_agent(node=self.node, log=self.log, extra=("--resync-seconds=2", *extra))

    def stop_agent(self) -> None:
        if self.agent is not None:
            fleet.stop(self.agent)
            self.agent = None

    def kill_agent(self) -> None:
        """SIGKILL: the agent goes with its machine, with no chance to sweep or to say goodbye."""
        if self.agent is not None:
            fleet.kill(self.agent)
            self.agent = None


class Worker:
    def __init__(self, launcher: subprocess.Popen[bytes], name: str) -> None:
        self.launcher = launcher
        self.name = name

    @property
    def child(self) -> int:
        children = pathlib.Path(f"/proc/{self.launcher.pid}/task/{self.launcher.pid}/children").read_text().split()
        return int(children[0])

    def kill(self) -> None:
        """SIGKILL the worker process only: `coroner run` sees an unclean exit and says no goodbye."""
        os.kill(self.child, signal.SIGKILL)
        self.launcher.wait(timeout=10)

    def terminate(self) -> None:
        """SIGTERM `coroner run`, as a drain does: forwarded to the worker, a clean exit, Released."""
        self.launcher.send_signal(signal.SIGTERM)
        self.launcher.wait(timeout=20)

    def vanish(self) -> None:
        """SIGKILL launcher and worker at once: the machine is gone, nothing is said by anyone."""
        os.killpg(self.launcher.pid, signal.SIGKILL)
        self.launcher.wait(timeout=10)


def launch(
    *,
    namespace: str,
    kubeconfig: pathlib.Path,
    directory: pathlib.Path,
    name: str,
    node: Node,
    command: tuple[str, ...] = ("sleep", "600"),
    heartbeat: tuple[int, int] | None = None,
) -> Worker:
    """`coroner run` a worker on `node` under the worker's own ServiceAccount token; with `heartbeat`
    (interval, TTL) it opts into heartbeats, by default it sends none (registered once)."""
    proc = fleet.run_worker(
        namespace=namespace,
        node=node.node,
        name=name,
        kubeconfig=kubeconfig,
        log=directory / f"worker-{name}.log",
        command=command,
        heartbeat=heartbeat,
    )
    return Worker(proc, name)


@contextlib.contextmanager
def launcher(
    *, namespace: str, kubeconfig: pathlib.Path, directory: pathlib.Path, heartbeat: tuple[int, int] | None = None
) -> Iterator[Callable[..., Worker]]:
    """`launch` for one test: `start(name, node, *command)` (default `sleep 600`) in `namespace` under
    `kubeconfig`, with `heartbeat`; every worker still running at the end vanishes with its launcher."""
    started: list[Worker] = []

    def start(name: str, node: Node, *command: str) -> Worker:
        worker = launch(
            namespace=namespace,
            kubeconfig=kubeconfig,
            directory=directory,
            name=name,
            node=node,
            command=command or ("sleep", "600"),
            heartbeat=heartbeat,
        )
        started.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in started:
            if worker.launcher.poll() is None:
                worker.vanish()


def worker_kubeconfig(cluster: Cluster, namespace: str) -> pathlib.Path:
    """A token of the ServiceAccount `worker` in `namespace`, bound to ClusterRole coroner-worker there
    (what a cluster admin does for a worker's namespace)."""
    return fleet.worker_kubeconfig(cluster, namespaces=[namespace])


def attestation(admin: k8s.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    """status.attestation of a registration; {} while it does not exist or is unattested."""
    if not kube.exists(admin, namespace, name):
        return {}
    return dict((kube.get_registration(admin, namespace, name).get("status") or {}).get("attestation") or {})
