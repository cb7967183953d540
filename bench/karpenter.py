"""Coroner under the real Karpenter's own disruptions, on real nodes: how long from Karpenter's decision
to end a node until every registration of that node is terminal, over several disruptions; whether
any live worker was retired; and how long from a NodeClaim's creation to its first worker attested
Alive.

    .venv/bin/python bench/karpenter.py                     # ~10 min: 5 disruptions
    .venv/bin/python bench/karpenter.py --disruptions 2     # quick, ~6 min

The node cluster (`coroner dev-cluster up --node`, two static nodes) runs Karpenter v1.15 with the dev
cloud provider (`coroner_dev.devcluster.karpenter`): every NodeClaim is a real dev node (containerd +
kubelet) on this machine. Workers are `coroner run` workers in two Deployments that only a node of
the benchmark's NodePool can run: `polite` (2 replicas, `sleep`: honours SIGTERM, ends Released) and
`stubborn` (1 replica, ignores SIGTERM, a 5 s grace period: killed, ends Retired). The NodePool's
`expireAfter` makes Karpenter itself disrupt every node it launches once it is that old (its
expiration controller deletes the NodeClaim: the decision): Karpenter drains it through the Eviction
API, terminates the instance, and launches the next node for the evicted workers, which expires in
turn. Nothing is deleted by hand. Writes bench/results/NAME.json. Nothing asserts on time. Needs root
(kubelet, containerd), the node's Debian packages (`make node-deps`) and Karpenter's build (`coroner
dev-cluster build --node --karpenter`, cached).
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Any

import harness as c

from coroner_dev import realnode
from coroner_dev.devcluster import cluster as cluster_mod
from coroner_dev.devcluster import karpenter
from coroner_dev.devcluster.cluster import Cluster
from coroner_dev.devcluster.errors import DevClusterError

NODES = ("coroner-node-0", "coroner-node-1")
NAMESPACE = "bench-karpenter"
POOL = "bench"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--disruptions", type=int, default=5, help="nodes Karpenter disrupts (expires) and drains")
    parser.add_argument("--expire-after", default="60s", help="the NodePool's expireAfter")
    parser.add_argument("--timeout", type=float, default=1800.0, help="the longest the disruptions may take, s")
    parser.add_argument("--name", default="karpenter")
    return parser.parse_args()


def stamp(text: str | None) -> float | None:
    return None if not text else datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def agent_on_a_shared_network(cluster: Cluster) -> None:
    """Every dev node shares this machine's network namespace, where only one agent can bind the fixed
    metrics port: the agent takes a free one (as tests/node/test_2e_karpenter.py runs it)."""
    ns = realnode.SYSTEM_NAMESPACE
    unprobed = {"name": "agent", "ports": None, "livenessProbe": None, "readinessProbe": None}
    patch = {"spec": {"template": {"spec": {"containers": [unprobed]}}}}
    realnode.kubectl(
        cluster, "-n", ns, "patch", "daemonset", "coroner-agent", "--type=strategic", "-p", json.dumps(patch)
    )
    port = [{"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--metrics-port=0"}]
    realnode.kubectl(cluster, "-n", ns, "patch", "daemonset", "coroner-agent", "--type=json", "-p", json.dumps(port))
    realnode.kubectl(cluster, "-n", ns, "rollout", "status", "daemonset/coroner-agent", "--timeout=240s", timeout=250)


def objects(cluster: Cluster, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The NodePool (its nodes expire; two at a time) and the two worker Deployments."""
    pool = karpenter.node_pool(POOL, cpu_limit="4", expire_after=args.expire_after)
    polite = realnode.pool_deployment(cluster, "polite", namespace=NAMESPACE, pool=POOL, replicas=2, grace_seconds=30)
    stubborn = realnode.pool_deployment(
        cluster, "stubborn", namespace=NAMESPACE, pool=POOL, replicas=1, grace_seconds=5,
        command=["sh", "-c", "trap '' TERM; while :; do sleep 1; done"],
    )  # fmt: skip
    return [pool, polite, stubborn]


def terminal_time(registration: dict[str, Any]) -> float | None:
    """When a registration became terminal, by its own status (server-side times)."""
    status = registration.get("status", {})
    retired = stamp(status.get("retirement", {}).get("retiredTime"))
    if retired is not None:
        return retired
    for condition in status.get("conditions", []):
        if condition["type"] in ("Released", "Retired") and condition["status"] == "True":
            return stamp(condition.get("lastTransitionTime"))
    return None


class Seen:
    """Every NodeClaim and registration the benchmark has seen, polled once a second."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.claims: dict[str, dict[str, Any]] = {}
        self.decided_seen: dict[str, float] = {}
        self.registrations: dict[str, dict[str, Any]] = {}
        self.terminal_seen: dict[str, float] = {}
        self.live_retired: list[str] = []
        self.first_alive: dict[str, float | None] = {}

    def poll(self) -> None:
        now = time.time()
        for claim in json.loads(realnode.kubectl(self.cluster, "get", "nodeclaims", "-o", "json").stdout)["items"]:
            name = claim["metadata"]["name"]
            self.claims[name] = claim
            if claim["metadata"].get("deletionTimestamp"):
                self.decided_seen.setdefault(name, now)
        listed = realnode.kubectl(self.cluster, "-n", NAMESPACE, "get", "workerregistrations", "-o", "json").stdout
        for registration in json.loads(listed)["items"]:
            name = registration["metadata"]["name"]
            self.registrations[name] = registration
            attestation = registration.get("status", {}).get("attestation", {})
            if attestation.get("verdict") == "Alive" and name not in self.first_alive:
                self.first_alive[name] = stamp(attestation.get("observedTime"))
            if (
                registration.get("status", {}).get("state") in ("Retired", "Released")
                and name not in self.terminal_seen
            ):
                self.terminal_seen[name] = now
                live = registration["status"]["state"] == "Retired" and realnode.incarnation_pid(registration)
                if live:
                    self.live_retired.append(name)

    def of_node(self, node: str) -> list[dict[str, Any]]:
        return [r for r in self.registrations.values() if r["spec"]["nodeName"] == node]

    def disruptions_done(self) -> list[str]:
        """The claims Karpenter decided to end whose node's registrations are all seen terminal."""
        return [
            name for name in self.decided_seen
            if (node := self.claims[name].get("status", {}).get("nodeName"))
            and self.of_node(node) and all(r["metadata"]["name"] in self.terminal_seen for r in self.of_node(node))
        ]  # fmt: skip


def figures(seen: Seen, done: list[str]) -> dict[str, Any]:
    per_disruption, decided_to_terminal, decided_to_terminal_seen, to_first_alive = [], [], [], []
    for name in done:
        claim = seen.claims[name]
        regs = seen.of_node(claim["status"]["nodeName"])
        decided = stamp(claim["metadata"]["deletionTimestamp"])
        ends = [terminal_time(r) for r in regs]
        last = max((e for e in ends if e is not None), default=None)
        last_seen = max(seen.terminal_seen[r["metadata"]["name"]] for r in regs)
        if decided is not None and last is not None:
            decided_to_terminal.append(last - decided)
        decided_to_terminal_seen.append(last_seen - seen.decided_seen[name])
        per_disruption.append({
            "nodeclaim": name,
            "registrations": len(regs),
            "endings": sorted(f"{r['status']['state']}/{r['status'].get('retirement', {}).get('reason', '-')}" for r in regs),
            "decided_to_every_terminal_seconds": None if decided is None or last is None else round(last - decided, 1),
            "decided_seen_to_every_terminal_seen_seconds": round(last_seen - seen.decided_seen[name], 1),
        })  # fmt: skip
    for claim in seen.claims.values():
        node = claim.get("status", {}).get("nodeName")
        alive = [seen.first_alive.get(r["metadata"]["name"]) for r in seen.of_node(node or "")]
        created = stamp(claim["metadata"]["creationTimestamp"])
        if any(a is not None for a in alive) and created is not None:
            to_first_alive.append(min(a for a in alive if a is not None) - created)
    return {
        "disruptions": len(done),
        "decided_to_every_registration_terminal": c.percentiles(decided_to_terminal),
        "decided_to_every_registration_terminal_as_polled": c.percentiles(decided_to_terminal_seen),
        "nodeclaim_created_to_first_alive": c.percentiles(to_first_alive),
        "live_retired": len(seen.live_retired),
        "live_retired_names": seen.live_retired,
        "registrations": len(seen.registrations),
        "endings": {
            ending: sum(1 for r in seen.registrations.values() if r.get("status", {}).get("state") == ending)
            for ending in ("Active", "Released", "Retired")
        },
        "per_disruption": per_disruption,
        "how": "decided = the NodeClaim's deletionTimestamp (Karpenter's expiration controller deletes it); terminal = "
        "the registration's retirement.retiredTime or its Released/Retired condition's lastTransitionTime (server-side, "
        "whole seconds); 'as_polled' = the same two moments as the benchmark's 1 s poll first saw them; first Alive = the "
        "earliest observedTime of the first Alive attestation seen of each registration on the claim's node (the agent's clock); live retired = a "
        "registration seen Retired while its very incarnation (pid namespace, pid, start time) still ran",
    }


def run(cluster: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    agent_on_a_shared_network(cluster)
    karpenter.start(cluster, progress=c.log)
    realnode.kubectl(cluster, "create", "namespace", NAMESPACE)
    realnode.apply_objects(cluster, realnode.worker_rbac(NAMESPACE))
    time.sleep(2)
    realnode.apply_objects(cluster, objects(cluster, args))
    seen, deadline = Seen(cluster), time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        try:
            seen.poll()
        except (DevClusterError, subprocess.SubprocessError, ValueError, KeyError) as exc:
            c.log(f"poll: {exc}")
        done = seen.disruptions_done()
        if len(done) >= args.disruptions:
            break
        time.sleep(1.0)
    c.log(f"{len(done)} disruptions done, {len(seen.claims)} NodeClaims seen")
    realnode.kubectl(cluster, "-n", NAMESPACE, "delete", "deployment", "--all", "--wait=false")
    return figures(seen, done[: args.disruptions])


def main() -> int:
    args = parse_args()
    result = c.new_result("karpenter", vars(args))
    started_wall = time.time()
    load = c.LoadMonitor().start()
    with tempfile.TemporaryDirectory(prefix="kb-", dir="/tmp") as tmp, c.written_if_stopped(args.name, result):
        directory = pathlib.Path(tmp)
        cluster = cluster_mod.up(directory, nodes=NODES, progress=c.log)
        try:
            realnode.install(cluster)
            result["karpenter"] = {
                "version": karpenter.KARPENTER_VERSION,
                "disruption": f"expireAfter {args.expire_after}",
            }
            result.update(run(cluster, args))
        finally:
            try:
                karpenter.stop(directory)
            finally:
                # Whatever stopping Karpenter's instances met, the static nodes and the control plane go
                # too (before the directory: a Pod's volume still mounted under it cannot be removed).
                cluster_mod.down(directory)
    result["load"] = load.summary()
    result["load"]["note"] = c.SHARED_MACHINE_NOTE
    result["wall_seconds"] = round(time.time() - started_wall, 1)
    print(json.dumps(result, indent=2))
    c.write_result(args.name, result)  # says where it wrote
    return 0


if __name__ == "__main__":
    sys.exit(main())
