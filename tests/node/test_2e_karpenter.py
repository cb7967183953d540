"""Karpenter's own decisions on real nodes: Karpenter v1.15 (sigs.k8s.io/karpenter, built with the dev
cloud provider, `coroner_dev.devcluster.karpenter`) provisions and terminates real dev nodes
(containerd + kubelet each) for the node cluster, and Coroner runs as it ships on them.

Workers here are `coroner run` workers (`realnode.worker_pod`) in a Deployment whose Pods select a
NodePool of their own (`karpenter.sh/nodepool`), so nothing fits them on the cluster's two static
nodes: only a node Karpenter launches can run them. The NodePool's `limits` allow one node at a time.

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
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

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


def nodepool(name: str, *, cpu_limit: str = "2") -> dict[str, Any]:
    """A NodePool of dev instances, at most CPU_LIMIT CPUs of them (one node per 2), never consolidated
    by itself (the scenarios decide when a node goes)."""
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "spec": {
                    "nodeClassRef": {
                        "group": "devcloud.coroner.dev",
                        "kind": "DevNodeClass",
                        "name": karpenter.NODE_CLASS,
                    },
                    "requirements": [
                        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["dev.host"]}
                    ],
                    "expireAfter": "Never",
                }
            },
            "limits": {"cpu": cpu_limit},
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "Never"},
        },
    }


def worker_deployment(cluster: Cluster, name: str, *, namespace: str, pool: str, replicas: int) -> dict[str, Any]:
    """`coroner run` workers that only a node of POOL can run."""
    pod = realnode.worker_pod(
        name, namespace=namespace, node="", cluster=cluster, command=["sleep", "3600"], restart_policy="Always"
    )
    spec = pod["spec"]
    del spec["nodeName"]
    spec["nodeSelector"] = {"karpenter.sh/nodepool": pool}
    spec["containers"][0]["resources"] = {"requests": {"cpu": "50m", "memory": "64Mi"}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }


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
    realnode.apply_objects(cluster, [nodepool(pool)])
    realnode.apply_objects(
        cluster, [worker_deployment(cluster, "scaled", namespace=worker_namespace, pool=pool, replicas=2)]
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
    realnode.apply_objects(cluster, [nodepool(pool, cpu_limit="4")])
    polite = worker_deployment(cluster, "polite", namespace=ns, pool=pool, replicas=2)
    stubborn = worker_deployment(cluster, "stubborn", namespace=ns, pool=pool, replicas=1)
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


def test_a_worker_no_budget_lets_go_outlives_the_drain_and_is_never_taken_for_dead(
    karpenter_cluster: Cluster, worker_namespace: str
) -> None:
    """Disruption with a worker still running when the instance goes: a budget that allows no eviction
    holds it until the NodeClaim's terminationGracePeriod (30 s) forces the end. Karpenter then deletes
    it with what is left of that period and terminates the instance at its end, so the kubelet's kill
    and the instance's end come together: either the agent saw the worker die first (`Retired`,
    `PidfdExited`, the process gone), or nobody did, and the registration stays `Active` with the
    truthful `AgentUnavailable` once the agent's Lease expires, which doctor FAILs. Never anything else."""
    cluster, pool, ns = karpenter_cluster, f"tgp-{uuid.uuid4().hex[:6]}", worker_namespace
    held_pool = nodepool(pool)
    held_pool["spec"]["template"]["spec"]["terminationGracePeriod"] = "30s"
    held = worker_deployment(cluster, "held", namespace=ns, pool=pool, replicas=1)
    spec = held["spec"]["template"]["spec"]
    spec["containers"][0]["command"] = [
        *spec["containers"][0]["command"][:-2],
        "sh",
        "-c",
        "trap '' TERM; while :; do sleep 1; done",
    ]
    spec["terminationGracePeriodSeconds"] = 120
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "held", "namespace": ns},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "held"}}},
    }
    realnode.apply_objects(cluster, [held_pool, held, budget])
    (registration,) = wait_for(
        lambda: (items := registrations(cluster, ns)) and verdict(items[0]) == "Alive" and items,
        timeout=PROVISIONED_WITHIN_SECONDS,
        what="the held worker attested Alive",
    )
    node_name = registration["spec"]["nodeName"]
    (claim,) = claims_of(cluster, pool)

    kubectl(cluster, "delete", "nodeclaim", claim["metadata"]["name"], "--wait=false")
    wait_for(
        lambda: kubectl(cluster, "get", "node", node_name, check=False).returncode != 0,
        timeout=TERMINATED_WITHIN_SECONDS,
        what=f"Karpenter to end {node_name} at its terminationGracePeriod",
    )
    assert node_processes(cluster, node_name) == []

    def ended_or_preserved() -> dict[str, Any] | None:
        (current,) = [
            r for r in registrations(cluster, ns) if r["metadata"]["name"] == registration["metadata"]["name"]
        ]
        return current if state(current) == "Retired" or retirable_reason(current) == "AgentUnavailable" else None

    current = wait_for(ended_or_preserved, timeout=120, what="the held worker Retired or preserved as AgentUnavailable")
    assert realnode.incarnation_pid(current) is None
    if state(current) == "Retired":
        assert retirement_reason(current) == "PidfdExited", describe(current)
    else:
        assert state(current) == "Active", describe(current)
        report = doctor(cluster)
        assert report.returncode == 1, report.stdout + report.stderr
        assert "FAIL" in report.stdout
    print(
        f"held worker after its instance went: {state(current)} ({retirement_reason(current) or retirable_reason(current)})"
    )
    kubectl(cluster, "-n", ns, "delete", "deployment", "held", "--wait=false")
    kubectl(cluster, "delete", "nodepool", pool, "--wait=false")
