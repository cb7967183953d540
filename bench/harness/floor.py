"""The same-run floor of a death: the two status patches Coroner needs for it, and nothing else.

Per death, on a copy of a registration Coroner retired in this run (its spec, its Alive attestation
and conditions; in a namespace the operator does not watch, on a node no agent serves): the Dead
attestation by that node's agent token, then the retirement by the operator's token, each a JSON
patch built by Coroner's own wire module and testing what it relied on. The API server does for
them what it does for Coroner's own two writes (authentication, the same admission policies, etcd,
the watch fan-out); what Coroner adds on top (the probe, its reads, its queues) is what a
benchmark's ratio to this floor measures. massdeath sends the pairs as fast as a tuned client can;
latency sends one pair at a time and waits for each write's event on its watch.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from coroner.client.rest import registrations_path
from coroner.core import api, wire
from harness.cluster import Bench, Node, client, create_admitted, registrant_annotation
from harness.machine import log


@dataclasses.dataclass(frozen=True)
class FloorCopy:
    """One prepared copy: attested Alive, its Dead attestation and retirement record ready."""

    name: str
    node: str
    body: dict[str, Any]
    dead: dict[str, Any]
    retirement: dict[str, Any]
    conditions: list[dict[str, Any]]


class FloorWriters:
    """The floor's identities: one agent token per floor node, the operator's token, the admin."""

    def __init__(self, bench: Bench, *, namespace: str, nodes: int) -> None:
        from coroner_dev.devcluster.identities import mint_token

        self.namespace = namespace
        self.nodes = [Node(bench, f"floor-node-{i}", real_boot=False) for i in range(1, nodes + 1)]
        self.agent_http = {n.name: client(n.kubeconfig) for n in self.nodes}
        self.operator_http = client(
            mint_token(bench.cluster, service_account=f"{api.SYSTEM_NAMESPACE}/coroner-operator")
        )
        self.admin = client(bench.cluster.kubeconfig)
        self.registrant = registrant_annotation(self.admin)

    def prepare(self, i: int, *, alive: dict[str, Any], final: dict[str, Any]) -> FloorCopy:
        """Copy `i` of a registration seen `alive` (attested Alive) and `final` (retired by Coroner):
        created by the admin, attested Alive by its floor node's agent, given the conditions the
        operator wrote (as the operator's own wire module builds that write)."""
        node = self.nodes[i % len(self.nodes)]
        spec = copy.deepcopy(alive["spec"])
        spec["nodeName"] = node.name
        name = f"floor-{i}"
        created = create_admitted(
            self.admin,
            registrations_path(self.namespace),
            {
                "apiVersion": alive["apiVersion"],
                "kind": alive["kind"],
                "metadata": {
                    "name": name,
                    "namespace": self.namespace,
                    "labels": {api.NODE_LABEL: node.name},
                    "annotations": self.registrant,
                },
                "spec": spec,
            },
        )
        attested = self.agent_http[node.name].request(
            "PATCH",
            registrations_path(self.namespace, name) + "/status",
            body=wire.attestation_ops(created, _moved(alive, spec, node.name)),
            content_type=wire.JSON_PATCH,
        )
        conditions = (alive.get("status") or {}).get("conditions") or []
        if conditions:
            attested = self.operator_http.request(
                "PATCH",
                registrations_path(self.namespace, name) + "/status",
                body=wire.status_ops(
                    body=attested, resource_version=attested["metadata"]["resourceVersion"], conditions=conditions
                ),
                content_type=wire.JSON_PATCH,
            )
        return FloorCopy(
            name=name,
            node=node.name,
            body=attested,
            dead=_moved(final, spec, node.name),
            retirement=final["status"]["retirement"],
            conditions=final["status"].get("conditions") or [],
        )

    def attest(self, floor: FloorCopy) -> dict[str, Any]:
        """The agent's write: the Dead attestation (raises ApiError if refused)."""
        return self.agent_http[floor.node].request(
            "PATCH",
            self._status(floor),
            body=wire.attestation_ops(floor.body, floor.dead),
            content_type=wire.JSON_PATCH,
        )

    def retire(self, floor: FloorCopy, attested: dict[str, Any]) -> dict[str, Any]:
        """The operator's write: the retirement compare-and-swap on the attested copy, testing the
        resourceVersion and the attestation relied on (raises ApiError if refused)."""
        return self.operator_http.request(
            "PATCH",
            self._status(floor),
            body=wire.status_ops(
                body=attested,
                resource_version=str(attested["metadata"]["resourceVersion"]),
                conditions=floor.conditions,
                # The record names the attestation relied on, verbatim (admission checks it): this
                # copy's own, not the original's.
                retirement={**floor.retirement, "attestation": attested["status"]["attestation"]},
            ),
            content_type=wire.JSON_PATCH,
        )

    def close(self) -> None:
        for http in [*self.agent_http.values(), self.operator_http, self.admin]:
            http.close()

    def _status(self, floor: FloorCopy) -> str:
        return registrations_path(self.namespace, floor.name) + "/status"


def _moved(body: dict[str, Any], spec: dict[str, Any], node: str) -> dict[str, Any]:
    """`body`'s attestation, of the copy's incarnation on the copy's node."""
    attestation = copy.deepcopy(body["status"]["attestation"])
    attestation["incarnation"] = spec["incarnation"]
    attestation["agent"] = {**attestation.get("agent", {}), "nodeName": node}
    return attestation


def prepare_all(
    writers: FloorWriters, templates: list[tuple[dict[str, Any], dict[str, Any]]], *, count: int, threads: int
) -> list[FloorCopy]:
    """`count` copies, round-robin over `templates` (alive, final), `threads` at a time."""

    def one(i: int) -> FloorCopy:
        alive, final = templates[i % len(templates)]
        return writers.prepare(i, alive=alive, final=final)

    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(one, range(count)))


def measure_floor(
    bench: Bench,
    *,
    namespace: str,
    victims: list[tuple[str, str]],
    alive: dict[tuple[str, str], dict[str, Any]],
    latest: dict[tuple[str, str], dict[str, Any]],
    lost_nodes: int,
    connections: int,
    cpu_seconds: Callable[[], dict[str, float]],
) -> dict[str, Any]:
    """massdeath's same-run floor: 2 conditional status patches per death, as fast as a tuned client
    can get this API server to take them, on copies of the victims (`alive`: each as last attested
    Alive, `latest`: as retired) in `namespace`, which nobody else touches."""
    writers = FloorWriters(bench, namespace=namespace, nodes=lost_nodes)
    pairs = [k for k in victims if k in alive and k in latest]
    log(f"floor: preparing {len(pairs)} copies of the victims in {namespace}")
    t_setup = time.monotonic()
    plans = prepare_all(writers, [(alive[k], latest[k]) for k in pairs], count=len(pairs), threads=connections)
    setup_seconds = time.monotonic() - t_setup
    time.sleep(2)
    errors: dict[str, int] = {}
    lock = threading.Lock()
    finished: list[float] = []

    def two_writes(plan: FloorCopy) -> None:
        try:
            writers.retire(plan, writers.attest(plan))
        except Exception as exc:
            with lock:
                label = str(getattr(exc, "status", type(exc).__name__))
                errors[label] = errors.get(label, 0) + 1
                if errors[label] == 1:
                    log(f"floor: a write failed: {exc}")
            return
        with lock:
            finished.append(time.monotonic())

    log(f"floor: {2 * len(plans)} conditional status patches, {connections} in flight")
    cpu_before = cpu_seconds()
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=connections) as pool:
        list(pool.map(two_writes, plans))
    seconds = (max(finished) - t0) if finished else None
    cpu_after = cpu_seconds()
    writers.close()
    return {
        "seconds": None if seconds is None else round(seconds, 2),
        "deaths": len(plans),
        "completed": len(finished),
        "errors": errors,
        "writes_per_second": None if not seconds else round(2 * len(finished) / seconds, 1),
        "connections": connections,
        "setup_seconds": round(setup_seconds, 1),
        "cpu_seconds": {
            name: round(cpu_after[name] - cpu_before[name], 2) for name in ("kube-apiserver", "etcd", "benchmark")
        },
        "how": f"per death, on a copy of the victim in {namespace} (spec, Alive attestation and conditions; a node "
        "no agent serves; the operator does not watch the namespace): the victim's Dead attestation by that node's "
        "agent token, then its retirement and conditions by the operator's token, each a JSON patch testing the "
        f"resourceVersion; {connections} requests in flight on keep-alive connections; seconds = first send -> "
        "last answer, after Coroner finished in this same run",
    }
