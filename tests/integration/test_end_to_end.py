"""Real workers, real agents, the real operator, the real API server: the whole loop.

Workers are launched with `coroner run` (a real process, registered under the worker's own
ServiceAccount), agents run as local processes with node-bound tokens and their own boot-id
files (two simulated nodes on one machine), and the operator holds the retire grant.
"""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from coroner import launcher as worker_launcher
from coroner_dev import fleet
from coroner_dev.devcluster.cluster import Cluster
from support import components, kube
from support.fleet import Node, attestation, launcher, worker_kubeconfig

pytestmark = [pytest.mark.integration, pytest.mark.procs]

REAL_BOOT = pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip()


@pytest.fixture
def nodes(plane: Cluster, tmp_path: pathlib.Path) -> Iterator[dict[str, Node]]:
    suffix = uuid.uuid4().hex[:6]
    made = {
        "a": Node(plane, tmp_path, f"node-a-{suffix}", REAL_BOOT),
        "b": Node(plane, tmp_path, f"node-b-{suffix}", str(uuid.uuid4())),
    }
    try:
        yield made
    finally:
        for node in made.values():
            node.stop_agent()


@pytest.fixture
def worker_config(plane: Cluster, namespace: str) -> pathlib.Path:
    return worker_kubeconfig(plane, namespace)


@pytest.fixture
def launch(namespace: str, worker_config: pathlib.Path, tmp_path: pathlib.Path) -> Iterator[object]:
    """`coroner run` on a node, with heartbeats (interval 2 s, TTL 6 s): these tests cover the opt-in."""
    with launcher(namespace=namespace, kubeconfig=worker_config, directory=tmp_path, heartbeat=(2, 6)) as start:
        yield start


def test_kill_9_is_retired_by_pidfd_and_a_live_worker_is_not(
    nodes: dict[str, Node], launch: object, admin: k8s.ApiClient, namespace: str
) -> None:
    node = nodes["a"]
    node.start_agent()
    victim = launch("victim", node)  # type: ignore[operator]
    launch("survivor", node)  # type: ignore[operator]
    for name in ("victim", "survivor"):
        kube.wait_for(
            lambda n=name: attestation(admin, namespace, n).get("verdict") == "Alive", timeout=30, what=f"{name} Alive"
        )
    victim.kill()  # how fast is bench/attestation.py's and bench/latency.py's business, not a test's
    kube.wait_for(lambda: components.retired(admin, namespace, "victim"), timeout=10, interval=0.02, what="retirement")
    body = kube.get_registration(admin, namespace, "victim")
    assert body["status"]["retirement"]["reason"] == "PidfdExited"
    time.sleep(8)  # longer than the survivor's TTL: heartbeats and Alive keep it
    assert not components.retired(admin, namespace, "survivor")
    assert attestation(admin, namespace, "survivor")["verdict"] == "Alive"


def test_agent_started_after_the_death_attests_proc_absent(
    nodes: dict[str, Node], launch: object, admin: k8s.ApiClient, namespace: str
) -> None:
    node = nodes["a"]
    worker = launch("late", node)  # type: ignore[operator]
    kube.wait_for(lambda: kube.exists(admin, namespace, "late"), what="registration")
    worker.kill()
    node.start_agent()
    kube.wait_for(lambda: components.retired(admin, namespace, "late"), timeout=40, what="retirement")
    assert kube.get_registration(admin, namespace, "late")["status"]["retirement"]["reason"] == "ProcAbsent"


def test_boot_id_change_is_a_boot_boundary(
    nodes: dict[str, Node], launch: object, admin: k8s.ApiClient, namespace: str
) -> None:
    node = nodes["b"]
    worker = launch("rebooted", node)  # type: ignore[operator]
    kube.wait_for(lambda: kube.exists(admin, namespace, "rebooted"), what="registration")
    worker.kill()
    # The simulated node "reboots": a new boot id, the Node object agrees, the agent restarts.
    node.reboot()
    node.start_agent()
    kube.wait_for(lambda: components.retired(admin, namespace, "rebooted"), timeout=40, what="retirement")
    assert kube.get_registration(admin, namespace, "rebooted")["status"]["retirement"]["reason"] == "BootBoundary"


def test_two_simulated_nodes_never_attest_each_others_registrations(
    nodes: dict[str, Node], launch: object, admin: k8s.ApiClient, namespace: str
) -> None:
    nodes["a"].start_agent()
    launch("on-b", nodes["b"])  # type: ignore[operator]
    kube.wait_for(lambda: kube.exists(admin, namespace, "on-b"), what="registration")
    time.sleep(4)  # two resyncs of node a's agent
    assert attestation(admin, namespace, "on-b") == {}
    nodes["b"].start_agent()
    kube.wait_for(lambda: attestation(admin, namespace, "on-b").get("verdict") == "Alive", timeout=30, what="Alive")
    assert attestation(admin, namespace, "on-b")["agent"]["nodeName"] == nodes["b"].name  # type: ignore[index]


def test_a_clean_exit_under_coroner_run_ends_terminal_released_or_retired_on_its_exit(
    nodes: dict[str, Node], launch: object, admin: k8s.ApiClient, namespace: str
) -> None:
    """`coroner run` says goodbye once its child exited, and the agent holds that exit's Dead for the
    goodbye (docs/api.md): Released, never retired, and the launcher exits with the child's 0. The
    Python API says goodbye while alive: tests/integration/test_launcher.py."""
    nodes["a"].start_agent()
    worker = launch("batch", nodes["a"], "sleep", "2")  # type: ignore[operator]
    assert worker.launcher.wait(timeout=30) == 0
    body = kube.wait_for(lambda: _terminal(admin, namespace, "batch"), what="Released or Retired")
    assert components.condition(body, "Released") and "retirement" not in body.get("status", {}), body
    kube.wait_for(lambda: components.reason(admin, namespace, "batch") == "AlreadyTerminal", what="AlreadyTerminal")


def _terminal(admin: k8s.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    body = kube.get_registration(admin, namespace, name)
    return body if components.condition(body, "Released") or "retirement" in body.get("status", {}) else None


@pytest.mark.parametrize("status", [0, "SIGTERM"])
def test_a_clean_exit_whose_goodbye_comes_seconds_late_is_released_and_not_retired(
    nodes: dict[str, Node], worker_config: pathlib.Path, admin: k8s.ApiClient, namespace: str, status: object
) -> None:
    """The registrant says goodbye for a clean exit (exit 0, or SIGTERM honoured) after the agent has
    seen it: a reaper or an API server seconds slower than the agent. The agent reads the exit status
    from its pidfd and holds the Dead for the goodbye, which lands first. (Without the hold, the Dead
    was written at once and the operator retired a worker that had ended cleanly.)"""
    node = nodes["a"]
    node.start_agent()
    name = f"late-goodbye-{status}".lower()
    worker = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    client = worker_launcher.client_for(str(worker_config))
    try:
        incarnation = worker_launcher.probe_incarnation(worker.pid, node_name=node.name)
        held = worker_launcher.register(
            client=client, namespace=namespace, node_name=node.name, incarnation=incarnation, name=name
        )
        kube.wait_for(lambda: attestation(admin, namespace, name).get("verdict") == "Alive", what=f"{name} Alive")
        if status == 0:
            assert worker.stdin is not None
            worker.stdin.close()  # its input ends: it exits 0
        else:
            worker.send_signal(signal.SIGTERM)
        worker.wait()
        time.sleep(3)  # the agent has seen the exit long since
        assert _terminal(admin, namespace, name) is None, "retired while its registrant was still to say goodbye"
        worker_launcher.say_goodbye(held, message="the worker exited cleanly")
        body = kube.wait_for(lambda: _terminal(admin, namespace, name), what="terminal")
        assert components.condition(body, "Released") and "retirement" not in body.get("status", {}), body
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        if worker.stdin is not None:
            worker.stdin.close()
        client.close()


@pytest.mark.filterwarnings("ignore:record_property is incompatible:pytest.PytestWarning")
def test_a_container_restarted_while_its_agent_was_away_retires_the_old_incarnation_and_not_the_new(
    nodes: dict[str, Node],
    worker_config: pathlib.Path,
    admin: k8s.ApiClient,
    namespace: str,
    tmp_path: pathlib.Path,
    record_property: Callable[[str, object], None],
) -> None:
    """A "container": `coroner run` as pid 1 of its own pid namespace, its worker pid 2. While the
    node's agent is stopped (an agent upgrade), the container is killed and started again until the
    kernel gives the new namespace the old one's inode number: the old incarnation's (pidNamespace,
    pid) is then held by the new, live worker."""
    node = nodes["a"]
    started: list[subprocess.Popen[bytes]] = []

    def container(name: str) -> dict[str, Any]:
        argv = fleet.run_argv(
            namespace=namespace, node=node.name, name=name, kubeconfig=worker_config, boot_id_file=node.boot_file,
            command=("sleep", "600"),
        )  # fmt: skip
        unshare = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
        started.append(fleet.spawn([*unshare, *argv], log=tmp_path / f"{name}.log", parent_death=signal.SIGKILL))
        kube.wait_for(lambda: kube.exists(admin, namespace, name), timeout=30, what=f"{name} registered")
        return dict(kube.get_registration(admin, namespace, name)["spec"]["incarnation"])

    def end(proc: subprocess.Popen[bytes], incarnation: dict[str, Any]) -> None:
        fleet.kill(proc)  # unshare: --kill-child takes pid 1, and so the namespace, with it
        link = f"pid:[{incarnation['pidNamespace']}]"
        kube.wait_for(
            lambda: fleet.host_pid(link, 1) is None and fleet.host_pid(link, incarnation["pid"]) is None,
            timeout=10,
            what="the namespace gone",
        )

    try:
        node.start_agent()
        previous, incarnation = "c-0", container("c-0")
        kube.wait_for(lambda: attestation(admin, namespace, "c-0").get("verdict") == "Alive", timeout=30, what="Alive")
        node.stop_agent()
        dead: list[str] = []
        # Other namespaces made on this machine meanwhile may take a freed number: each restart is
        # compared with the container just ended.
        for attempt in range(1, 40):
            end(started[-1], incarnation)
            dead.append(previous)
            new = container(f"c-{attempt}")
            if (new["pidNamespace"], new["pid"]) == (incarnation["pidNamespace"], incarnation["pid"]):
                break
            previous, incarnation = f"c-{attempt}", new
        else:
            pytest.fail("no restarted container's pid namespace got its predecessor's inode number in 39 restarts")
        live = f"c-{attempt}"
        returned = time.monotonic()
        node.start_agent()
        for name in dead:
            kube.wait_for(lambda n=name: components.retired(admin, namespace, n), timeout=30, what=f"{name} retired")
        seconds = round(time.monotonic() - returned, 2)
        record_property("agent_return_to_retired_seconds", seconds)
        record_property("containers_until_inode_reused", attempt)
        print(
            f"\nagent start -> {len(dead)} dead incarnations Retired: {seconds} s; inode reused at container {attempt}"
        )
        dead = kube.get_registration(admin, namespace, previous)
        retirement = dead["status"]["retirement"]
        # A launcher on pidfs records the process's pidfd inode: no process has it any more
        # (ProcAbsent). Without one, the namespace under the reused inode is younger than the record.
        recorded_inode = "pidfdInode" in dead["spec"]["incarnation"]
        assert retirement["reason"] == ("ProcAbsent" if recorded_inode else "PidNamespaceRecreated"), retirement
        kube.wait_for(lambda: attestation(admin, namespace, live).get("verdict") == "Alive", timeout=30, what="Alive")
        assert not components.retired(admin, namespace, live)
    finally:
        for proc in started:
            fleet.kill(proc)
