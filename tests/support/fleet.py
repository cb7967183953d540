"""Simulated nodes with real agents and real workers, for tests that drive whole node lifecycles.

A `Node` is a Node object plus a boot-id file and an agent process with a node-bound token; a
`Worker` is a real `coroner run` launcher with its child, started in its own session so that an
abrupt loss can kill both at once, as a vanished machine would.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
from typing import Any

from kubernetes import client as k8s

from coroner_dev.devcluster.cluster import Cluster
from coroner_dev.devcluster.identities import ensure_node, mint_token
from support import components, kube


class Node:
    def __init__(self, cluster: Cluster, directory: pathlib.Path, name: str, boot_id: str) -> None:
        self.cluster = cluster
        self.name = name
        self.boot_id = boot_id
        self.directory = directory
        self.boot_file = directory / f"{name}.boot_id"
        self.boot_file.write_text(boot_id + "\n")
        self.log = directory / f"agent-{name}.log"
        ensure_node(cluster, name=name, boot_id=boot_id)
        self.kubeconfig = components.agent_kubeconfig(cluster, name)
        self.agent: subprocess.Popen[bytes] | None = None

    def start_agent(self, *extra: str) -> None:
        argv = components.agent_argv(
            self.kubeconfig, node=self.name, boot_id_file=self.boot_file, extra=("--resync-seconds=2", *extra)
        )
        with open(self.log, "ab") as out:
            self.agent = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)

    def stop_agent(self) -> None:
        if self.agent is not None:
            components.stop(self.agent)
            self.agent = None

    def kill_agent(self) -> None:
        """SIGKILL: the agent goes with its machine, with no chance to sweep or to say goodbye."""
        if self.agent is not None:
            self.agent.kill()
            self.agent.wait()
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
    beats = [] if heartbeat is None else [f"--interval-seconds={heartbeat[0]}", f"--ttl-seconds={heartbeat[1]}"]
    argv = [
        str(components.BIN / "coroner"),
        "run",
        "-n",
        namespace,
        f"--node-name={node.name}",
        f"--name={name}",
        f"--kubeconfig={kubeconfig}",
        *beats,
        f"--boot-id-file={node.boot_file}",
        "--",
        *command,
    ]
    with open(directory / f"worker-{name}.log", "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return Worker(proc, name)


def worker_kubeconfig(cluster: Cluster, namespace: str) -> pathlib.Path:
    """A token of the ServiceAccount `worker` in `namespace`, bound to ClusterRole coroner-worker there
    (what a cluster admin does for a worker's namespace)."""
    kube.kubectl(
        cluster,
        "create",
        "rolebinding",
        "worker",
        "--clusterrole=coroner-worker",
        f"--serviceaccount={namespace}:worker",
        "-n",
        namespace,
    )
    return mint_token(cluster, service_account=f"{namespace}/worker")


def attestation(admin: k8s.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    """status.attestation of a registration; {} while it does not exist or is unattested."""
    if not kube.exists(admin, namespace, name):
        return {}
    return dict((kube.get_registration(admin, namespace, name).get("status") or {}).get("attestation") or {})
