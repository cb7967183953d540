"""Helpers of the real-node tests (tests/node): kubectl as the admin, polling, and the host's view of
the node's processes."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from coroner_dev import realnode
from coroner_dev.devcluster.cluster import Cluster
from coroner_dev.devcluster.errors import DevClusterError

#: The dev cluster's two real nodes: the first is labeled a control-plane node (the operator runs
#: there and on the second; the agent DaemonSet's affinity keeps it off), the second runs the agent
#: and every worker (`coroner_dev.realnode`).
NODES = ("coroner-node-0", "coroner-node-1")
NODE = NODES[1]
T = TypeVar("T")


def kubectl(cluster: Cluster, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return realnode.kubectl(cluster, *args, check=check, timeout=timeout)


def get_json(cluster: Cluster, *args: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(kubectl(cluster, "get", "-o", "json", *args).stdout)
    return result


def wait_for(predicate: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.2) -> T:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (
            DevClusterError,
            subprocess.SubprocessError,
            ValueError,
            KeyError,
            OSError,
        ) as exc:  # a moment, not an answer
            last, value = exc, None
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last error: {last})")


def registrations(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get_json(cluster, "-n", namespace, "workerregistrations")["items"]
    return items


def state(registration: dict[str, Any]) -> str:
    return str(registration.get("status", {}).get("state", ""))


def verdict(registration: dict[str, Any]) -> str:
    return str(registration.get("status", {}).get("attestation", {}).get("verdict", ""))


def alive_worker(cluster: Cluster, namespace: str, role: str) -> dict[str, Any]:
    """A worker Pod on NODE (`coroner run -- sleep`, role ROLE), once its registration is attested Alive."""
    pod = realnode.worker_pod(role, namespace=namespace, node=NODE, cluster=cluster, command=["sleep", "3601"])
    realnode.apply_objects(cluster, [pod])
    found: dict[str, Any] = wait_for(
        lambda: next(
            (r for r in registrations(cluster, namespace) if r["spec"].get("role") == role and verdict(r) == "Alive"),
            None,
        ),
        timeout=120,
        what=f"the worker {role} attested Alive",
    )
    return found


def cmdline(pid: int) -> list[str]:
    try:
        raw = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def host_pids(marker: str, *, launcher: bool = False) -> list[int]:
    """Host pids of the processes whose command line holds MARKER: the workers' own programs, or (with
    `launcher`) the `coroner run` processes that launched them."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        argv = cmdline(int(entry.name))
        if marker not in argv:
            continue
        is_launcher = any(a.endswith("/coroner") for a in argv[:2]) and "run" in argv
        if is_launcher == launcher:
            found.append(int(entry.name))
    return sorted(found)


def agent_pids(node: str = NODE) -> list[int]:
    """Host pids of the coroner-agent processes running for NODE (the DaemonSet's container, seen
    with hostPID; an agent some other test runs on the host names another node)."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        argv = cmdline(int(entry.name)) if entry.name.isdigit() else []
        if any(a.endswith("coroner-agent") for a in argv[:2]) and f"--node-name={node}" in argv:
            found.append(int(entry.name))
    return sorted(found)


def status_field(pid: int, field: str) -> str:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return line.split(":", 1)[1].strip()
    raise KeyError(field)


def crictl(cluster: Cluster, node: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """crictl against NODE's containerd (the API server cannot reach a dev node's kubelet for exec
    or logs: coroner_dev.devcluster.node)."""
    from coroner_dev.devcluster import node as node_mod
    from coroner_dev.devcluster.nodebinaries import ensure_node_binaries

    layout = node_mod.NodeLayout(directory=cluster.directory, name=node)
    return node_mod.crictl(layout, ensure_node_binaries(), *args, check=check)


def container_id(cluster: Cluster, node: str, *, name: str, namespace: str) -> str:
    """The id of the running container NAME of a pod in NAMESPACE on NODE."""
    ids = crictl(cluster, node, "ps", "--name", f"^{name}$", "--namespace", namespace, "--state", "Running", "-q")
    found = ids.stdout.split()
    if len(found) != 1:
        raise ValueError(f"{len(found)} running containers named {name} in {namespace} on {node}")
    return found[0]


def retirable_reason(registration: dict[str, Any]) -> str:
    """The reason of a registration's Retirable condition (why it is kept, or may be retired)."""
    conditions = {c["type"]: c for c in registration.get("status", {}).get("conditions", [])}
    return str(conditions.get("Retirable", {}).get("reason", ""))


def doctor(cluster: Cluster) -> subprocess.CompletedProcess[str]:
    """`kubectl coroner doctor` (the installed plugin) against CLUSTER."""
    plugin = pathlib.Path(sys.executable).parent / "kubectl-coroner"
    return subprocess.run(
        [str(plugin), "doctor", f"--kubeconfig={cluster.kubeconfig}"], capture_output=True, text=True, timeout=120
    )
