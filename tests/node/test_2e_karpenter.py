"""Karpenter's own decisions on real nodes: Karpenter v1.15 (sigs.k8s.io/karpenter, built with the dev
cloud provider, `coroner_dev.devcluster.karpenter`) provisions and terminates real dev nodes
(containerd + kubelet each) for the node cluster, and Coroner runs as it ships on them.

Workers here are `coroner run` workers (`realnode.worker_pod`) whose Pods (of a Deployment, or bare) select a
NodePool of their own (`karpenter.sh/nodepool`), so nothing fits them on the cluster's two static
nodes: only a node Karpenter launches can run them. Each NodePool's `limits` keep its nodes to
one to three.

Every dev node shares this machine's one network namespace, where only one agent can bind a fixed
metrics port: while these tests run, the agent DaemonSet takes a free port instead (`--metrics-port=0`,
without the port and the probes that name it), as the test overlay does for the operator's second
replica; the shipped overlay is applied again afterwards. Nodes are never deleted by hand here: a
NodePool deleted makes Karpenter drain and terminate its nodes, as it does in a cluster.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from coroner_dev import realnode
from coroner_dev.devcluster import karpenter, karpenter_instances
from coroner_dev.devcluster.cluster import Cluster
from support.nodes import (
    agent_pids,
    doctor,
    get_json,
    kubectl,
    registrations,
    retirable_reason,
    state,
    verdict,
    wait_for,
)

pytestmark = [
    pytest.mark.node,
    pytest.mark.filterwarnings("ignore:record_property is incompatible:pytest.PytestWarning"),
    # The first test's setup builds Karpenter where it is not cached yet (8-10 minutes on 2 shared
    # cores; `coroner dev-cluster build --karpenter` builds it ahead).
    pytest.mark.timeout(1200),
]

#: A node Karpenter launches boots (containerd, the images imported, a kubelet) and registers, then the
#: agent and the workers start on it; generous for 2 shared cores.
PROVISIONED_WITHIN_SECONDS = 300.0
TERMINATED_WITHIN_SECONDS = 180.0


def agent_on_a_shared_network(cluster: Cluster) -> None:
    """The agent DaemonSet on a free metrics port (see the module's docstring)."""
    patch = {
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {"name": "agent", "ports": None, "livenessProbe": None, "readinessProbe": None},
                    ]
                }
            }
        }
    }
    ns = realnode.SYSTEM_NAMESPACE
    kubectl(cluster, "-n", ns, "patch", "daemonset", "coroner-agent", "--type=strategic", "-p", json.dumps(patch))
    port = [{"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--metrics-port=0"}]
    kubectl(cluster, "-n", ns, "patch", "daemonset", "coroner-agent", "--type=json", "-p", json.dumps(port))
    kubectl(cluster, "-n", ns, "rollout", "status", "daemonset/coroner-agent", "--timeout=240s", timeout=250)


@pytest.fixture(scope="module")
def karpenter_cluster(node_cluster: Cluster) -> Iterator[Cluster]:
    agent_on_a_shared_network(node_cluster)
    try:
        started = karpenter.start(node_cluster, progress=print)
        try:
            yield started
        finally:
            # Karpenter drains and terminates what it launched, as it does in a cluster.
            kubectl(started, "delete", "nodepools", "--all", "--wait=false", check=False)
            wait_for(
                lambda: not get_json(started, "nodeclaims")["items"],
                timeout=TERMINATED_WITHIN_SECONDS,
                what="Karpenter to terminate every NodeClaim",
            )
    finally:
        karpenter.stop(node_cluster.directory)
        realnode.install(node_cluster)


def claims_of(cluster: Cluster, pool: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get_json(cluster, "nodeclaims", "-l", f"karpenter.sh/nodepool={pool}")["items"]
    return items


def condition(obj: dict[str, Any], kind: str) -> str:
    return next((c["status"] for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), "")


def timestamp(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def node_processes(cluster: Cluster, node: str) -> list[int]:
    """Host pids of NODE's kubelet and containerd (their command lines name its directory)."""
    root = f"{cluster.directory / 'nodes' / node}/"
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if any(a.startswith(f"--config={root}".encode()) for a in argv):
            found.append(int(entry.name))
    return found


def test_pending_workers_make_karpenter_provision_a_node_where_the_agent_lands_and_attests_them_alive(
    karpenter_cluster: Cluster, worker_namespace: str, record_property: Any
) -> None:
    cluster, pool = karpenter_cluster, f"up-{uuid.uuid4().hex[:6]}"
    realnode.apply_objects(cluster, [karpenter.node_pool(pool)])
    realnode.apply_objects(
        cluster, [realnode.pool_deployment(cluster, "scaled", namespace=worker_namespace, pool=pool, replicas=2)]
    )

    claim = wait_for(lambda: (c := claims_of(cluster, pool)) and c[0], timeout=120, what=f"a NodeClaim of {pool}")
    claim_seen = time.time()
    first_alive: dict[str, float] = {}

    def alive_on_the_claims_node() -> list[dict[str, Any]] | None:
        current = claims_of(cluster, pool)
        node = current[0]["status"].get("nodeName") if current else None
        items = [r for r in registrations(cluster, worker_namespace) if node and r["spec"]["nodeName"] == node]
        alive = [r for r in items if verdict(r) == "Alive" and state(r) == "Active"]
        if alive and "seen" not in first_alive:
            first_alive["seen"] = time.time()
        return items if len(alive) == 2 else None

    alive = wait_for(alive_on_the_claims_node, timeout=PROVISIONED_WITHIN_SECONDS, what="2 workers attested Alive")
    claim = claims_of(cluster, pool)[0]
    name = claim["metadata"]["name"]
    node_name = claim["status"]["nodeName"]
    node = get_json(cluster, "node", node_name)

    # Karpenter's own view: one claim, launched, registered (the kubelet's Node carries the claim's
    # providerID), initialized; the Node carries the claim's labels and none of its startup taint.
    assert len(claims_of(cluster, pool)) == 1
    assert claim["status"]["providerID"] == f"coroner-dev://{name}" == node["spec"]["providerID"]
    assert [condition(claim, c) for c in ("Launched", "Registered")] == ["True"] * 2
    # Karpenter marks the claim initialized once it sees the Node Ready without startup taints: its
    # own pace, which may trail the workers' start.
    wait_for(
        lambda: condition(claims_of(cluster, pool)[0], "Initialized") == "True",
        timeout=60,
        what=f"Karpenter to mark {name} initialized",
    )
    assert node["metadata"]["labels"]["karpenter.sh/nodepool"] == pool
    assert node["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "dev.host"
    assert not [t for t in node["spec"].get("taints", []) if t["key"] == "karpenter.sh/unregistered"]
    # The instance is a real node on this machine: its kubelet and containerd run, its agent too.
    assert karpenter_instances.read(cluster.directory.resolve(), name) is not None
    assert len(node_processes(cluster, node_name)) == 2
    assert agent_pids(node_name)
    assert all(r["spec"]["nodeName"] == node_name for r in alive)

    created = timestamp(claim["metadata"]["creationTimestamp"])
    attested = min(timestamp(r["status"]["attestation"]["observedTime"]) for r in alive if verdict(r) == "Alive")
    record_property("nodeclaim_to_first_alive_seconds", round(attested - created, 1))
    record_property("nodeclaim_seen_to_first_alive_seen_seconds", round(first_alive["seen"] - claim_seen, 1))
    print(
        f"NodeClaim {name} created -> first worker attested Alive: {attested - created:.1f} s "
        f"(server timestamps; as the test saw them {first_alive['seen'] - claim_seen:.1f} s)"
    )

    # The NodePool deleted: Karpenter drains and terminates its node, and nothing of it is left.
    kubectl(cluster, "-n", worker_namespace, "delete", "deployment", "scaled", "--wait=false")
    kubectl(cluster, "delete", "nodepool", pool, "--wait=false")
    wait_for(
        lambda: (
            not claims_of(cluster, pool) and kubectl(cluster, "get", "node", node_name, check=False).returncode != 0
        ),
        timeout=TERMINATED_WITHIN_SECONDS,
        what=f"Karpenter to terminate {name} and remove its Node",
    )
    assert karpenter_instances.read(cluster.directory.resolve(), name) is None
    assert node_processes(cluster, node_name) == []
    assert agent_pids(node_name) == []


def terminal(registration: dict[str, Any]) -> bool:
    return state(registration) in ("Released", "Retired")


def describe(registration: dict[str, Any]) -> str:
    status = registration.get("status", {})
    return f"{registration['metadata']['name']} ({registration['spec'].get('role')}): {json.dumps(status)[:600]}"


def retirement_reason(registration: dict[str, Any]) -> str:
    return str(registration.get("status", {}).get("retirement", {}).get("reason", ""))


def pods_on(cluster: Cluster, namespace: str, node: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get_json(cluster, "-n", namespace, "pods", f"--field-selector=spec.nodeName={node}")[
        "items"
    ]
    return items


def events(cluster: Cluster, *scope: str, selector: str) -> list[dict[str, Any]]:
    """The Events in SCOPE (`-n NS` or `-A`) that SELECTOR (a field selector) matches."""
    items: list[dict[str, Any]] = get_json(cluster, "events", *scope, f"--field-selector={selector}")["items"]
    return items


def eviction_requests(cluster: Cluster) -> dict[str, float]:
    """Karpenter's eviction requests so far, by the Eviction API's response code."""
    found = re.findall(
        r'^karpenter_pods_eviction_requests_total\{[^}]*code="(\d+)"[^}]*\} (\S+)$', karpenter.metrics(cluster), re.M
    )
    return {code: float(count) for code, count in found}


def test_a_deleted_nodeclaim_is_drained_by_karpenter_one_eviction_at_a_time_and_ends_every_worker_truthfully(
    karpenter_cluster: Cluster, worker_namespace: str, record_property: Any
) -> None:
    """Disruption, graceful: `kubectl delete nodeclaim`. Karpenter taints the node, evicts its workers
    through the Eviction API (a PDB allowing one at a time), leaves the agent running, terminates the
    instance, removes the Node. The evicted workers are rescheduled onto a node Karpenter launches for
    them (the NodePool allows two at a time)."""
    cluster, pool, ns = karpenter_cluster, f"dis-{uuid.uuid4().hex[:6]}", worker_namespace
    realnode.apply_objects(cluster, [karpenter.node_pool(pool, cpu_limit="4")])
    polite = realnode.pool_deployment(cluster, "polite", namespace=ns, pool=pool, replicas=2)
    stubborn = realnode.pool_deployment(cluster, "stubborn", namespace=ns, pool=pool, replicas=1)
    container = stubborn["spec"]["template"]["spec"]["containers"][0]
    # The worker's own process ignores SIGTERM (`coroner run` passes it on): killed at its grace period.
    container["command"] = [*container["command"][:-2], "sh", "-c", "trap '' TERM; while :; do sleep 1; done"]
    stubborn["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 5
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "polite", "namespace": ns},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "polite"}}},
    }
    realnode.apply_objects(cluster, [polite, stubborn, budget])

    def all_alive() -> list[dict[str, Any]] | None:
        items = registrations(cluster, ns)
        alive = [r for r in items if verdict(r) == "Alive" and state(r) == "Active"]
        return alive if len(alive) == 3 else None

    first = wait_for(all_alive, timeout=PROVISIONED_WITHIN_SECONDS, what="3 workers attested Alive")
    node_name = first[0]["spec"]["nodeName"]
    assert {r["spec"]["nodeName"] for r in first} == {node_name}
    claim = next(c for c in claims_of(cluster, pool) if c["status"].get("nodeName") == node_name)
    agent = agent_pids(node_name)
    assert agent

    refused_before = eviction_requests(cluster).get("429", 0)
    kubectl(cluster, "delete", "nodeclaim", claim["metadata"]["name"], "--wait=false")
    deleted = time.time()
    # Until the Node is gone: the agent runs while any worker Pod is still on the node, and no two
    # polite workers are ever terminating on it at once (the budget's one eviction at a time).
    most_terminating, agent_gone_early = 0, False
    while kubectl(cluster, "get", "node", node_name, check=False).returncode == 0:
        if time.time() - deleted > TERMINATED_WITHIN_SECONDS:
            raise AssertionError(f"Karpenter did not remove {node_name} within {TERMINATED_WITHIN_SECONDS:.0f} s")
        on_node = [p for p in pods_on(cluster, ns, node_name) if p["status"].get("phase") in ("Pending", "Running")]
        terminating = [
            p for p in on_node if p["metadata"].get("deletionTimestamp") and "polite" in p["metadata"]["name"]
        ]
        most_terminating = max(most_terminating, len(terminating))
        if on_node and not agent_pids(node_name):
            agent_gone_early = True
        time.sleep(0.5)
    node_gone = time.time()
    assert not agent_gone_early, "the agent was gone while workers were still on the node"
    assert most_terminating <= 1
    # Karpenter's own record: every worker went by the Eviction API, and the budget refused at least
    # one eviction (HTTP 429), which Karpenter retried.
    evicted = {e["involvedObject"]["name"] for e in events(cluster, "-n", ns, selector="reason=Evicted")}
    assert len([name for name in evicted if name.startswith(("polite-", "stubborn-"))]) >= 3, evicted
    assert eviction_requests(cluster).get("429", 0) > refused_before

    old = {r["metadata"]["name"]: r for r in first}

    def every_old_terminal() -> dict[str, dict[str, Any]] | None:
        now = {r["metadata"]["name"]: r for r in registrations(cluster, ns) if r["metadata"]["name"] in old}
        return now if len(now) == len(old) and all(terminal(r) for r in now.values()) else None

    ended = wait_for(every_old_terminal, timeout=120, what="every registration of the terminated node terminal")
    all_terminal = time.time()
    for registration in ended.values():
        assert realnode.incarnation_pid(registration) is None, f"a live incarnation ended: {describe(registration)}"
        if registration["spec"]["role"] == "stubborn":
            assert state(registration) == "Retired", describe(registration)
            assert retirement_reason(registration) == "PidfdExited", describe(registration)
        elif state(registration) == "Retired":
            # A clean exit's goodbye races the agent's Dead attestation; both are true endings.
            assert retirement_reason(registration) == "PidfdExited", describe(registration)
    assert karpenter_instances.read(cluster.directory.resolve(), claim["metadata"]["name"]) is None
    assert node_processes(cluster, node_name) == []
    endings = sorted(state(r) for r in ended.values())
    record_property("nodeclaim_deleted_to_node_gone_seconds", round(node_gone - deleted, 1))
    record_property("nodeclaim_deleted_to_every_registration_terminal_seconds", round(all_terminal - deleted, 1))
    print(
        f"NodeClaim deleted -> Node gone {node_gone - deleted:.1f} s, -> every registration terminal "
        f"{all_terminal - deleted:.1f} s; endings {endings}"
    )
    kubectl(cluster, "-n", ns, "delete", "deployment", "polite", "stubborn", "--wait=false")
    kubectl(cluster, "delete", "nodepool", pool, "--wait=false")


def operator_with(cluster: Cluster, *, components: tuple[str, ...], operator_args: tuple[str, ...]) -> None:
    """The operator as an overlay with COMPONENTS and OPERATOR_ARGS installs it: its Deployment and
    the admission policy a component patches, applied alone, so the agent DaemonSet stays as these
    tests run it (the whole overlay applied again would roll every agent back to the fixed port)."""
    directory = realnode.write_overlay(cluster, components=components, operator_args=operator_args)
    rendered = yaml.safe_load_all(kubectl(cluster, "kustomize", str(directory)).stdout)
    wanted = {("Deployment", "coroner-operator"), ("ValidatingAdmissionPolicy", "coroner-retire-requires-evidence")}
    objects = [o for o in rendered if o and (o["kind"], o["metadata"]["name"]) in wanted]
    assert len(objects) == len(wanted), [o["metadata"]["name"] for o in objects]
    listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    realnode.kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=listed)
    ns = realnode.SYSTEM_NAMESPACE
    kubectl(cluster, "-n", ns, "rollout", "status", "deployment/coroner-operator", "--timeout=240s", timeout=250)


#: What the node-loss scenarios and the churn run the operator with: node evidence on, a quarantine
#: short enough for a test, and a terminal retention short enough to be seen deleting.
NODE_LOSS_ARGS = ("--node-quarantine-seconds=10", "--terminal-retention-seconds=30")


def sigterm_ignoring(pod: dict[str, Any]) -> dict[str, Any]:
    container = pod["spec"]["containers"][0]
    container["command"] = [*container["command"][:-2], "sh", "-c", "trap '' TERM; while :; do sleep 1; done"]
    return pod


def test_workers_karpenter_cannot_drain_end_truthfully_and_one_still_running_when_the_instance_goes_is_never_taken_for_dead(
    karpenter_cluster: Cluster, worker_namespace: str
) -> None:
    """Disruption with workers Karpenter's drain cannot evict, both ignoring SIGTERM with a 120 s grace
    period, on one node whose NodeClaim has a 20 s terminationGracePeriod:

    - `held`, under a budget that allows no eviction: at the claim's deletion Karpenter deletes it at
      once (its 120 s outlast the claim's 20 s) with the 20 s that are left, and waits for it to be
      gone before it terminates the instance; so the kubelet kills it first: `Retired`
      (`PidfdExited`);
    - `tolerant`, which tolerates every taint (as a node-level service's Pod often does), so
      Karpenter's drain never waits for it nor evicts it: it is still running when the instance
      goes. By default it is preserved (`Active`, `AgentUnavailable` once the agent's Lease has
      expired) and doctor FAILs naming it; with components/node-loss it is retired `NodeDeleted`
      once its Node has been gone for the quarantine.
    """
    cluster, pool, ns = karpenter_cluster, f"tgp-{uuid.uuid4().hex[:6]}", worker_namespace
    held_pool = karpenter.node_pool(pool)
    held_pool["spec"]["template"]["spec"]["terminationGracePeriod"] = "20s"
    pods = {}
    for role in ("held", "tolerant"):
        pod = sigterm_ignoring(
            realnode.worker_pod(role, namespace=ns, node="", cluster=cluster, command=["sleep", "1"])
        )
        del pod["spec"]["nodeName"]
        pod["spec"]["nodeSelector"] = {"karpenter.sh/nodepool": pool}
        pod["spec"]["terminationGracePeriodSeconds"] = 120
        pods[role] = pod
    pods["tolerant"]["spec"]["tolerations"] = [{"operator": "Exists"}]
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "held", "namespace": ns},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "held"}}},
    }
    realnode.apply_objects(cluster, [held_pool, budget, *pods.values()])
    first = wait_for(
        lambda: (
            (items := registrations(cluster, ns))
            and all(verdict(r) == "Alive" for r in items)
            and len(items) == 2
            and items
        ),
        timeout=PROVISIONED_WITHIN_SECONDS,
        what="both workers attested Alive",
    )
    by_role = {r["spec"]["role"]: r["metadata"]["name"] for r in first}
    node_name = first[0]["spec"]["nodeName"]
    assert {r["spec"]["nodeName"] for r in first} == {node_name}
    (claim,) = claims_of(cluster, pool)

    kubectl(cluster, "delete", "nodeclaim", claim["metadata"]["name"], "--wait=false")
    deleted = time.time()
    # Until the Node is gone the tolerant worker's Pod is never deleted. (The held one's end comes
    # before the instance's: Karpenter waits for its Pod to be gone, and the agent attests its death.)
    tolerant_deleted = False
    while kubectl(cluster, "get", "node", node_name, check=False).returncode == 0:
        assert time.time() - deleted < TERMINATED_WITHIN_SECONDS, f"{node_name} still there"
        on_node = {p["metadata"]["name"]: p for p in pods_on(cluster, ns, node_name)}
        tolerant_deleted |= bool(on_node.get("tolerant", {}).get("metadata", {}).get("deletionTimestamp"))
        time.sleep(0.5)
    assert not tolerant_deleted, "Karpenter deleted the Pod that tolerates its taint"
    assert node_processes(cluster, node_name) == []

    def current(role: str) -> dict[str, Any]:
        return next(r for r in registrations(cluster, ns) if r["metadata"]["name"] == by_role[role])

    held = wait_for(lambda: terminal(r := current("held")) and r, timeout=60, what="the held worker terminal")
    assert (state(held), retirement_reason(held)) == ("Retired", "PidfdExited"), describe(held)
    tolerant = wait_for(
        lambda: retirable_reason(r := current("tolerant")) == "AgentUnavailable" and r,
        timeout=120,
        what="the tolerant worker preserved as AgentUnavailable",
    )
    assert state(tolerant) == "Active", describe(tolerant)
    assert doctor(cluster).returncode == 1
    report = subprocess.run(
        [str(pathlib.Path(sys.executable).parent / "kubectl-coroner"), "doctor", "-o", "json", f"--kubeconfig={cluster.kubeconfig}"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    (node_loss,) = [c for c in json.loads(report.stdout)["checks"] if c["name"] == "node-loss"]
    assert node_loss["status"] == "FAIL", node_loss
    named = " ".join(node_loss["objects"])
    assert f"node/{node_name}" in named and by_role["tolerant"] in named, node_loss

    # With components/node-loss (and a short quarantine): retired on its Node's deletion.
    operator_with(cluster, components=("node-loss",), operator_args=NODE_LOSS_ARGS)
    retired = wait_for(
        lambda: terminal(r := current("tolerant")) and r, timeout=120, what="the tolerant worker retired"
    )
    assert (state(retired), retirement_reason(retired)) == ("Retired", "NodeDeleted"), describe(retired)
    print(f"held: Retired ({retirement_reason(held)}); tolerant: AgentUnavailable, then Retired (NodeDeleted)")
    kubectl(cluster, "delete", "nodepool", pool, "--wait=false")


#: The documented bound (docs/faults.md): a dead worker is terminal within 30 s of its death.
TERMINAL_WITHIN_SECONDS = 30.0
#: NODE_LOSS_ARGS' retention, and how late the operator may delete after it.
RETENTION_SECONDS, RETENTION_SLACK_SECONDS = 30.0, 20.0


def disrupted(cluster: Cluster, pool: str) -> float:
    """How many of POOL's NodeClaims Karpenter has consolidated (its own count: empty or underutilized)."""
    found = re.findall(r"^karpenter_nodeclaims_disrupted_total\{([^}]*)\} (\S+)$", karpenter.metrics(cluster), re.M)
    return sum(
        float(value)
        for labels, value in found
        if f'nodepool="{pool}"' in labels and re.search(r'reason="(empty|underutilized)"', labels)
    )


class Churn:
    """What the churn test checks on every poll: the NodeClaims seen; when each registration's process
    was first seen gone and when the registration was first seen terminal; a Retired registration
    whose very incarnation still runs (a live worker retired); a terminal one kept past retention."""

    def __init__(self, cluster: Cluster, namespace: str, pool: str) -> None:
        self.cluster, self.namespace, self.pool = cluster, namespace, pool
        self.claims: set[str] = set()
        self.names: set[str] = set()
        self.gone: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.live_retired: list[str] = []
        self.overdue: list[str] = []
        self.most_objects = 0

    def settled(self, replicas: int, nodes: int) -> bool:
        now, current = time.time(), claims_of(self.cluster, self.pool)
        self.claims |= {c["metadata"]["name"] for c in current}
        items = registrations(self.cluster, self.namespace)
        self.most_objects = max(self.most_objects, len(items))
        for registration in items:
            name = registration["metadata"]["name"]
            self.names.add(name)
            if terminal(registration):
                if name not in self.ended:
                    self.ended[name] = now
                    if state(registration) == "Retired" and realnode.incarnation_pid(registration) is not None:
                        self.live_retired.append(describe(registration))
                elif now - self.ended[name] > RETENTION_SECONDS + RETENTION_SLACK_SECONDS:
                    self.overdue.append(name)
            elif name not in self.gone and realnode.incarnation_pid(registration) is None:
                self.gone[name] = now
        alive = [r for r in items if state(r) == "Active" and verdict(r) == "Alive"]
        return len(alive) == replicas == len([r for r in items if not terminal(r)]) and len(current) == nodes


def test_consolidation_churn_provisions_and_consolidates_nodes_and_retires_no_live_worker(
    karpenter_cluster: Cluster, worker_namespace: str, record_property: Any
) -> None:
    """A worker Deployment scaled 4 → 2 → 4 → 0, two workers to a node (each asks for 800m of an
    instance's 2 CPUs), under a NodePool that consolidates at once (`WhenEmptyOrUnderutilized`,
    `consolidateAfter: 0s`): Karpenter launches two nodes, consolidates one (empty, or underutilized,
    its worker evicted to the other), launches a third, consolidates both. Nothing is deleted here
    but by Karpenter and the Deployment."""
    cluster, pool, ns = karpenter_cluster, f"churn-{uuid.uuid4().hex[:6]}", worker_namespace
    operator_with(cluster, components=("node-loss",), operator_args=NODE_LOSS_ARGS)
    churn_pool = karpenter.node_pool(pool, cpu_limit="6")
    churn_pool["spec"]["disruption"] = {
        "consolidationPolicy": "WhenEmptyOrUnderutilized",
        "consolidateAfter": "0s",
        "budgets": [{"nodes": "100%"}],
    }
    workers = realnode.pool_deployment(cluster, "churned", namespace=ns, pool=pool, replicas=0)
    workers["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "800m"
    realnode.apply_objects(cluster, [churn_pool, workers])
    watch, started = Churn(cluster, ns, pool), time.time()
    for replicas, nodes in ((4, 2), (2, 1), (4, 2), (0, 0)):
        kubectl(cluster, "-n", ns, "scale", "deployment", "churned", f"--replicas={replicas}")
        wait_for(
            lambda r=replicas, n=nodes: watch.settled(r, n),
            timeout=PROVISIONED_WITHIN_SECONDS,
            what=f"{replicas} workers Alive on {nodes} node(s) of {pool}",
            interval=1.0,
        )
    late = {n: round(watch.ended[n] - watch.gone[n], 1) for n in watch.gone if n in watch.ended}
    left = [r for r in registrations(cluster, ns) if not terminal(r)]
    print(
        f"churn: {len(watch.claims)} NodeClaims, {len(watch.names)} registrations in {time.time() - started:.0f} s; "
        f"process gone -> terminal max {max(late.values(), default=0):.1f} s; at most {watch.most_objects} objects"
    )
    record_property("churn_nodeclaims", len(watch.claims))
    record_property("churn_gone_to_terminal_max_seconds", max(late.values(), default=0))
    assert len(watch.claims) >= 3 and disrupted(cluster, pool) >= 3, (watch.claims, disrupted(cluster, pool))
    assert watch.live_retired == []
    assert not left, [describe(r) for r in left]
    assert set(late) == set(watch.gone), "a registration whose process is gone never seen terminal"
    assert max(late.values(), default=0) <= TERMINAL_WITHIN_SECONDS, late
    assert watch.overdue == [], watch.overdue
    kubectl(cluster, "-n", ns, "delete", "deployment", "churned", "--wait=false")
    kubectl(cluster, "delete", "nodepool", pool, "--wait=false")
