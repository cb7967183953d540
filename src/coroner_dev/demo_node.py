"""`coroner demo --real-node`: the main job as Coroner ships, on real nodes.

Two kubelets with containerd and runc run on this machine (`coroner dev-cluster up --node`), the
shipped production overlay is applied through the one test overlay (`coroner_dev.realnode`), and
the agent DaemonSet and the operator Deployment run from the images built here. Workers are Pods:
`coroner run -- sleep` in a container of their own pid namespace. The demo kills one worker from
the host (`kill -9`, as the OOM killer would), deletes another's Pod (the kubelet's SIGTERM: a clean
goodbye), leaves a third running, and shows what Coroner concluded.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from coroner_dev import realnode
from coroner_dev.demo import DemoError, console, say
from coroner_dev.devcluster import cluster as cluster_mod

NAMESPACE = "demo"
NODES = ("coroner-node-0", "coroner-node-1")
WORKER_NODE = NODES[1]
WORKERS = ("steady", "victim", "polite")


def _wait(what: str, probe: Callable[[], Any], *, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise DemoError(f"timed out after {timeout:.0f} s waiting for {what}")


def _registrations(cluster: cluster_mod.Cluster) -> dict[str, dict[str, Any]]:
    """The demo's registrations by role (each worker Pod registers with its own name as its role)."""
    listed = realnode.kubectl(cluster, "-n", NAMESPACE, "get", "workerregistrations", "-o", "json").stdout
    return {r["spec"].get("role", ""): r for r in json.loads(listed)["items"]}


def _field(registration: dict[str, Any] | None, *path: str) -> str:
    value: Any = registration or {}
    for key in path:
        value = value.get(key, {}) if isinstance(value, dict) else {}
    return value if isinstance(value, str) else ""


def _show(cluster: cluster_mod.Cluster, *args: str) -> None:
    print(realnode.kubectl(cluster, *args).stdout.rstrip(), flush=True)


def run_real_node_demo(*, directory: pathlib.Path, keep: bool) -> None:
    """Runs the real-node demo; stops the nodes and the control plane afterwards unless `keep`."""
    if os.geteuid() != 0:
        raise DemoError("the real-node demo runs a kubelet and containerd: it needs root")
    # From an empty registry, as the other demo: its simulated Nodes (no kubelet, NotReady) would
    # keep the agent DaemonSet's rollout waiting on Pods that never schedule.
    cluster_mod.reset(directory)
    say("starting the control plane and two real nodes (the first time also builds kubelet, containerd, runc")
    say("and Coroner's images: several minutes)")
    started = time.monotonic()
    cluster = cluster_mod.up(directory, nodes=NODES, progress=lambda line: console.print(f"    {line}"))
    try:
        say(f"nodes Ready in {time.monotonic() - started:.0f} s; applying manifests/overlays/production")
        realnode.install(cluster)
        _show(cluster, "get", "nodes")
        _show(cluster, "-n", realnode.SYSTEM_NAMESPACE, "get", "pods", "-o", "wide")
        realnode.kubectl(cluster, "create", "namespace", NAMESPACE)
        realnode.apply_objects(cluster, realnode.worker_rbac(NAMESPACE))
        _wait(
            "the worker ServiceAccount",
            lambda: (
                realnode.kubectl(
                    cluster, "-n", NAMESPACE, "get", "serviceaccount", "coroner-worker", check=False
                ).returncode
                == 0
            ),
            timeout=30,
        )
        say(f"three worker Pods on {WORKER_NODE}, each `coroner run -- sleep 3600` in its own pid namespace")
        pods = [
            realnode.worker_pod(name, namespace=NAMESPACE, node=WORKER_NODE, cluster=cluster, command=["sleep", "3600"])
            for name in WORKERS
        ]
        realnode.apply_objects(cluster, pods)
        _wait(
            "the node's agent to attest all three Alive",
            lambda: all(
                _field(_registrations(cluster).get(n), "status", "attestation", "verdict") == "Alive" for n in WORKERS
            ),
            timeout=120,
        )
        _show(cluster, "-n", NAMESPACE, "get", "registrations", "-o", "wide")

        victim = _registrations(cluster)["victim"]
        pid = realnode.incarnation_pid(victim)
        if pid is None:
            raise DemoError("the victim worker's process is not running")
        say(f"kill -9 of the victim's process (host pid {pid}, pid {victim['spec']['incarnation']['pid']} in its Pod)")
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        _wait(
            "the victim Retired",
            lambda: _field(_registrations(cluster).get("victim"), "status", "state") == "Retired",
            timeout=60,
        )
        say(
            f"the victim is Retired {time.monotonic() - killed:.2f} s after the kill (the agent's pidfd, then the operator)"
        )

        say("kubectl delete pod polite: the kubelet's SIGTERM reaches `coroner run`, which says goodbye")
        realnode.kubectl(cluster, "-n", NAMESPACE, "delete", "pod", "polite", timeout=90)
        _wait(
            "polite Released",
            lambda: _field(_registrations(cluster).get("polite"), "status", "state") == "Released",
            timeout=60,
        )
        _show(cluster, "-n", NAMESPACE, "get", "registrations", "-o", "wide")
        say("kubectl coroner doctor")
        doctor = subprocess.run(
            [
                str(pathlib.Path(sys.executable).parent / "kubectl-coroner"),
                "doctor",
                f"--kubeconfig={cluster.kubeconfig}",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        print(doctor.stdout.rstrip(), flush=True)
        say("steady still runs and stays Active; victim Retired; polite Released. Nothing ran on the host but kill -9.")
    except DemoError as exc:
        console.print(f"[bold red]demo failed:[/] {exc}")
        console.print(f"logs: {cluster.directory / 'logs'} and {cluster.directory / 'nodes'}/*/pod-logs")
        raise SystemExit(1) from exc
    finally:
        if not keep:
            cluster_mod.down(directory)
