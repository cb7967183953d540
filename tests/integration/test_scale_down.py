"""Every scale-down shape a cluster puts a node through, with real agents, real workers and the real
operator against the real API server: a node that goes away never leaves a registration stuck
or retires a live one.

- graceful drain (cluster-autoscaler, Karpenter): workers terminated, then the agent, then the Node;
- kubelet graceful node shutdown: workers first, the agent (system-node-critical) last;
- abrupt loss (spot reclaim, kernel panic): workers and agent SIGKILLed at once, the Node deleted —
  without the node-loss component (preserved, honestly: AgentUnavailable, doctor FAILs) and with it
  (NodeDeleted after the quarantine);
- a Node deleted and recreated by a kubelet that never stopped: nothing is retired.

Workers are registered as `coroner run` does by default: once, with no heartbeats (so API writes grow with nodes, not workers).
Timings are small on purpose (agent Lease 4 s, quarantine 3 s) but never zero: every shape still
has to outlast a real Lease expiry.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner_dev.devcluster.cluster import Cluster
from coroner_dev.devcluster.identities import ensure_node
from support import components, kube
from support import plugin as plugin_cli
from support.fleet import Node, Worker, attestation, launcher, worker_kubeconfig

pytestmark = [pytest.mark.integration, pytest.mark.procs]

REAL_BOOT = pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip()
AGENT_FLAGS = ("--lease-duration-seconds=4", "--renew-seconds=1")
QUARANTINE = 3


#: Whether components/node-loss is installed now (the module's tests share one install).
_NODE_LOSS = {"installed": False}


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Cluster:
    components.install(cluster, grant=True)
    _NODE_LOSS["installed"] = False
    return cluster


@pytest.fixture
def operator(installed: Cluster, tmp_path: pathlib.Path) -> Iterator[Callable[..., None]]:
    """Starts the operator with the given extra flags (once per test)."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*extra: str) -> None:
        # The operator's opt-in into node evidence is the node-loss component, whose admission half
        # lets its retirements on node evidence through (the API server checks the evidence, not only
        # the verb); an operator without it finds
        # that half a weaker evidence policy than it needs and retires nothing (fails closed), so a
        # test after one with node evidence gets the base install back.
        node_loss = "--node-deletion-evidence" in extra
        if node_loss != _NODE_LOSS["installed"]:
            components.install(installed, grant=True, node_loss=node_loss)
            _NODE_LOSS["installed"] = node_loss
        argv = components.operator_argv(components.operator_kubeconfig(installed), *extra)
        with open(tmp_path / "operator.log", "ab") as out:
            started.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT))

    yield start
    for proc in started:
        components.stop(proc)


@pytest.fixture
def nodes(installed: Cluster, admin: k8s.ApiClient, tmp_path: pathlib.Path) -> Iterator[dict[str, Node]]:
    suffix = uuid.uuid4().hex[:6]
    made = {
        "doomed": Node(installed, tmp_path, f"doomed-{suffix}", REAL_BOOT),
        "other": Node(installed, tmp_path, f"other-{suffix}", REAL_BOOT),
    }
    try:
        yield made
    finally:
        for node in made.values():
            node.kill_agent()
        for node in made.values():
            try:
                k8s.CoreV1Api(admin).delete_node(node.name)
            except ApiException as exc:
                if exc.status != 404:
                    raise


@pytest.fixture
def fleet(installed: Cluster, namespace: str, tmp_path: pathlib.Path) -> Iterator[Callable[[str, Node], Worker]]:
    config = worker_kubeconfig(installed, namespace)
    with launcher(namespace=namespace, kubeconfig=config, directory=tmp_path) as start:
        yield start


def retirable(admin: k8s.ApiClient, namespace: str, name: str) -> dict[str, object]:
    return components.condition(kube.get_registration(admin, namespace, name), "Retirable") or {}


def terminal(admin: k8s.ApiClient, namespace: str, name: str) -> str | None:
    """'Retired (evidence)' or 'Released', else None."""
    body = kube.get_registration(admin, namespace, name)
    retirement = (body.get("status") or {}).get("retirement")
    if retirement is not None:
        return f"Retired ({retirement.get('reason')})"
    released = components.condition(body, "Released")
    return "Released" if released and released.get("status") == "True" else None


def start_fleet(
    nodes: dict[str, Node], fleet: Callable[[str, Node], Worker], admin: k8s.ApiClient, namespace: str, *, doomed: int
) -> tuple[list[Worker], Worker]:
    """`doomed` workers on the doomed node, one on the other node, every one attested Alive."""
    for node in nodes.values():
        node.start_agent(*AGENT_FLAGS)
    workers = [fleet(f"w{i}", nodes["doomed"]) for i in range(doomed)]
    survivor = fleet("survivor", nodes["other"])
    for worker in (*workers, survivor):
        kube.wait_for(
            lambda w=worker: attestation(admin, namespace, w.name).get("verdict") == "Alive",
            timeout=30,
            what=f"{worker.name} Alive",
        )
    return workers, survivor


def delete_node(admin: k8s.ApiClient, node: Node) -> float:
    k8s.CoreV1Api(admin).delete_node(node.name)
    return time.monotonic()


def plugin(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl coroner ARGS` as the cluster's admin (a human holding retire), in-process
    (`support.plugin`: what the commands decide is the subject here, not kubectl's plugin path)."""
    return plugin_cli.in_process(*args, kubeconfig=cluster.kubeconfig, env={"COLUMNS": "200"})


def lose_abruptly(admin: k8s.ApiClient, node: Node, workers: list[Worker]) -> float:
    """A spot reclaim: the agent goes first (so it cannot attest what follows), then every worker
    with its launcher, then the Node object. Returns when the Node was deleted (monotonic)."""
    node.kill_agent()
    for worker in workers:
        worker.vanish()
    return delete_node(admin, node)


def assert_untouched(admin: k8s.ApiClient, namespace: str, survivor: Worker) -> None:
    assert terminal(admin, namespace, survivor.name) is None
    assert attestation(admin, namespace, survivor.name)["verdict"] == "Alive"
    assert retirable(admin, namespace, survivor.name)["reason"] == "PidAlive"


def test_graceful_drain_releases_or_retires_everything_and_spares_the_other_node(
    nodes: dict[str, Node],
    fleet: Callable[[str, Node], Worker],
    admin: k8s.ApiClient,
    namespace: str,
    operator: Callable[..., None],
) -> None:
    operator()
    workers, survivor = start_fleet(nodes, fleet, admin, namespace, doomed=3)
    # The drain: two workers terminate cleanly, one dies uncleanly during it.
    workers[0].terminate()
    workers[1].terminate()
    workers[2].kill()
    nodes["doomed"].stop_agent()
    delete_node(admin, nodes["doomed"])
    outcomes = kube.wait_for(
        lambda: (
            (found := {w.name: terminal(admin, namespace, w.name) for w in workers}) and all(found.values()) and found
        ),
        timeout=20,
        what="every registration of the drained node terminal",
    )
    assert outcomes == {"w0": "Released", "w1": "Released", "w2": "Retired (PidfdExited)"}
    assert_untouched(admin, namespace, survivor)


@pytest.mark.parametrize("order", ["workers-then-agent", "agent-then-workers"])
def test_kubelet_graceful_shutdown_attests_every_death_before_the_agent_goes(
    order: str,
    nodes: dict[str, Node],
    fleet: Callable[[str, Node], Worker],
    admin: k8s.ApiClient,
    namespace: str,
    operator: Callable[..., None],
) -> None:
    operator()
    workers, survivor = start_fleet(nodes, fleet, admin, namespace, doomed=3)
    agent = nodes["doomed"].agent
    assert agent is not None
    if order == "workers-then-agent":
        for worker in workers:
            worker.kill()  # the kubelet's SIGKILL after the regular pods' grace
        agent.terminate()
    else:
        # The agent is told first and waits (bounded) for the node's workers before it goes.
        agent.terminate()
        time.sleep(1)
        for worker in workers:
            worker.kill()
    assert agent.wait(timeout=60) == 0
    for worker in workers:
        assert attestation(admin, namespace, worker.name)["verdict"] == "Dead", "attested before the agent exited"
    delete_node(admin, nodes["doomed"])
    for worker in workers:
        kube.wait_for(
            lambda w=worker: terminal(admin, namespace, w.name) == "Retired (PidfdExited)",
            timeout=60,  # a liveness wait: on a loaded machine the Node's deletion reaches the operator late
            what=f"{worker.name} retired",
        )
    assert_untouched(admin, namespace, survivor)


def test_abrupt_loss_without_the_component_is_preserved_and_reported_honestly(
    nodes: dict[str, Node],
    fleet: Callable[[str, Node], Worker],
    admin: k8s.ApiClient,
    namespace: str,
    operator: Callable[..., None],
    cluster: Cluster,
) -> None:
    operator()
    workers, survivor = start_fleet(nodes, fleet, admin, namespace, doomed=3)
    doomed = nodes["doomed"]
    lose_abruptly(admin, doomed, workers)
    lease = f"coroner-agent-{doomed.name} expired at"
    for worker in workers:
        found = kube.wait_for(
            lambda w=worker: (c := retirable(admin, namespace, w.name)).get("reason") == "AgentUnavailable" and c,
            timeout=20,
            what=f"{worker.name} AgentUnavailable",
        )
        message = str(found["message"])
        assert lease in message and "attests the process is alive" not in message, message
        assert "node-loss component" in message, message
    time.sleep(8)  # without node-level evidence nothing is retired, ever
    for worker in workers:
        assert terminal(admin, namespace, worker.name) is None
    assert_untouched(admin, namespace, survivor)
    # doctor is never green while something is stuck: it names the node and what would release it.
    result = plugin(cluster, "doctor", "-o", "json")
    assert result.returncode == 1, result.stdout + result.stderr
    checks = {check["name"]: check for check in json.loads(result.stdout)["checks"]}
    loss = checks["node-loss"]
    assert loss["status"] == "FAIL"
    assert loss["facts"]["nodes"][doomed.name]["count"] == 3, loss
    assert "node-loss" in loss["summary"] and doomed.name in loss["summary"]
    assert "--node-quarantine-seconds=0" in loss["summary"], "the human path for a deleted Node"

    # A human holding retire states the Node is gone for good, under their own verb: plan, apply.
    statement = ("--node-deletion-evidence", "--node-quarantine-seconds=0")
    plan = plugin(cluster, "plan", "-n", namespace, "-o", "json", *statement)
    assert plan.returncode == 0, plan.stderr
    document = json.loads(plan.stdout)
    rows = {row["name"]: row for row in document["registrations"]}
    assert {rows[w.name]["reason"] for w in workers} == {"EligibleStaleOrphan"}, rows
    assert rows[survivor.name]["reason"] == "PidAlive"
    applied = plugin(
        cluster,
        "apply",
        "-n",
        namespace,
        f"--registry-fingerprint={document['registryFingerprint']}",
        f"--candidate-fingerprint={document['candidateFingerprint']}",
        "--yes",
        *statement,
        *(w.name for w in workers),
    )
    assert applied.returncode == 0, applied.stdout + applied.stderr
    for worker in workers:
        assert terminal(admin, namespace, worker.name) == "Retired (NodeDeleted)"
        # Recorded as what it is: a person's statement (the API server admits it only so).
        assert kube.get_registration(admin, namespace, worker.name)["status"]["retirement"]["statement"] == "Human"
        # ...and the operator makes the human's retirement read terminal everywhere (not RetirePermissionMissing next to RETIRED=True).
        kube.wait_for(
            lambda w=worker: retirable(admin, namespace, w.name).get("reason") == "AlreadyTerminal",
            timeout=15,
            what=f"{worker.name} AlreadyTerminal",
        )
    assert_untouched(admin, namespace, survivor)


def test_abrupt_loss_with_the_component_retires_after_the_quarantine(
    nodes: dict[str, Node],
    fleet: Callable[[str, Node], Worker],
    admin: k8s.ApiClient,
    namespace: str,
    operator: Callable[..., None],
) -> None:
    operator("--node-deletion-evidence", f"--node-quarantine-seconds={QUARANTINE}")
    workers, survivor = start_fleet(nodes, fleet, admin, namespace, doomed=3)
    deleted_at = lose_abruptly(admin, nodes["doomed"], workers)
    for worker in workers:
        kube.wait_for(
            lambda w=worker: terminal(admin, namespace, w.name) == "Retired (NodeDeleted)",
            timeout=30,
            what=f"{worker.name} retired by NodeDeleted",
        )
    took = time.monotonic() - deleted_at
    # Bounded below by the quarantine (3 s, from when the operator saw the deletion).
    assert took >= QUARANTINE, took
    print(f"abrupt loss with the node-loss component: all retired {took:.1f}s after the Node was deleted")
    assert_untouched(admin, namespace, survivor)


def test_a_node_deleted_and_recreated_by_a_running_kubelet_retires_nothing(
    nodes: dict[str, Node],
    fleet: Callable[[str, Node], Worker],
    admin: k8s.ApiClient,
    namespace: str,
    operator: Callable[..., None],
) -> None:
    operator("--node-deletion-evidence", f"--node-quarantine-seconds={QUARANTINE}")
    workers, survivor = start_fleet(nodes, fleet, admin, namespace, doomed=2)
    doomed = nodes["doomed"]
    delete_node(admin, doomed)
    time.sleep(1)
    ensure_node(doomed.cluster, name=doomed.name, boot_id=doomed.boot_id)  # a new UID, the same boot
    time.sleep(QUARANTINE + 8)  # well past the quarantine
    for worker in (*workers, survivor):
        assert terminal(admin, namespace, worker.name) is None
        assert retirable(admin, namespace, worker.name)["reason"] == "PidAlive"
