"""The agents of nodes 2..N as bench/steady.py plays them, with those nodes' node-bound agent
tokens: the registrations on those nodes (`EmulatedAgents.create`), each node's agent Lease renewed
every 10 s (GET + PUT, as coroner-agent does), each registration's `Alive` attestation written once
as coroner-agent writes it, and, when asked, refreshed periodically (`refresh_request`, for a
`Heartbeater`). So the operator decides every registration on the path of a live worker (PidAlive)."""

from __future__ import annotations

import pathlib
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from coroner.client.rest import Rest, registrations_path, upsert_lease
from coroner.core import api
from coroner.core.procfs import ProcessIncarnation
from coroner.core.wire import attestation_ops
from harness.cluster import Node, client, create_admitted, registrant_annotation
from harness.machine import SYSTEM
from harness.workers import Heartbeater, HeartbeatSpec, now_text

AGENT_IDENTITY = f"system:serviceaccount:{SYSTEM}:coroner-agent"
LEASE_SECONDS = 10.0  # coroner-agent --renew-seconds default
LEASE_DURATION = 30  # coroner-agent --lease-duration-seconds default


class EmulatedAgents:
    """The API side of coroner-agent for nodes 2..N: Lease renewals and Alive attestations."""

    def __init__(self, nodes: list[Node], reference: ProcessIncarnation) -> None:
        self.reference = reference
        self.host_id = reference.host_id
        self.nodes = {node.name: node for node in nodes}
        self.http = {node.name: client(node.kubeconfig) for node in nodes}
        self.bodies: dict[tuple[str, str], dict[str, Any]] = {}
        self.lease_requests = 0
        self.lease_failures = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._leases, name="emulated-agent-leases", daemon=True)
        self.refresher: Heartbeater | None = None
        self.heartbeats: Heartbeater | None = None

    def create(
        self,
        kubeconfig: pathlib.Path,
        namespaces: list[str],
        count: int,
        *,
        threads: int,
        spec: HeartbeatSpec,
    ) -> list[tuple[str, str]]:
        """`count` registrations spread over these nodes and `namespaces`, created `threads` at a
        time by the workers' identity; with a heartbeat spec each is heartbeated once right after, as
        the launcher does."""
        spec_interval, spec_ttl, _ = spec
        nodes = list(self.nodes.values())
        creator = client(kubeconfig, timeout=60, pool_size=threads)
        registrant = registrant_annotation(creator)

        def create(i: int) -> tuple[str, str]:
            node = nodes[i % len(nodes)]
            namespace = namespaces[i % len(namespaces)]
            name = f"s-{node.name}-{i}"
            body = {
                "apiVersion": api.API_VERSION,
                "kind": api.KIND,
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": {api.NODE_LABEL: node.name},
                    "annotations": registrant,
                },
                "spec": {
                    "nodeName": node.name,
                    "incarnation": {
                        "bootId": node.boot_id,
                        "pidNamespace": str(self.reference.pid_namespace),
                        "pid": 100000 + i,
                        "startTime": str(1000 + i),
                        "hostId": self.host_id,
                    },
                    "clientInstanceId": f"{api.CLIENT_INSTANCE_PREFIX}{uuid.uuid4()}",
                    "role": "bench-synthetic",
                },
            }
            if spec_interval is not None:
                body["spec"]["heartbeat"] = {"intervalSeconds": spec_interval, "ttlSeconds": spec_ttl}
            stored = create_admitted(creator, registrations_path(namespace), body)
            if spec_interval is not None:  # the launcher's first heartbeat, right after the create
                beat = {"status": {"lastHeartbeatTime": now_text()}}
                stored = creator.request(
                    "PATCH",
                    registrations_path(namespace, name) + "/status",
                    body=beat,
                    content_type="application/merge-patch+json",
                )
            self.bodies[(namespace, name)] = stored
            return namespace, name

        try:
            with ThreadPoolExecutor(max_workers=threads) as pool:
                return list(pool.map(create, range(count)))
        finally:
            creator.close()

    def start_leases(self) -> None:
        for node in self.nodes:
            self._renew(node)
        self.thread.start()

    def _leases(self) -> None:
        deadline = time.monotonic() + 4 * 3600
        while not self._stop.wait(LEASE_SECONDS) and time.monotonic() < deadline:
            for node in self.nodes:
                try:
                    self._renew(node)
                except Exception:
                    self.lease_failures += 1

    def _renew(self, node: str) -> None:
        """The agent's own Lease renewal (`coroner.client.rest.upsert_lease`: a GET, then a PUT, or a
        POST the first time)."""
        annotations = {api.AGENT_LEASE_BOOT_ID: self.nodes[node].boot_id, api.AGENT_LEASE_HOST_ID: self.host_id}
        try:
            upsert_lease(
                self.http[node],
                namespace=SYSTEM,
                name=f"{api.AGENT_LEASE_PREFIX}{node}",
                holder=AGENT_IDENTITY,
                duration=LEASE_DURATION,
                annotations=annotations,
            )
        except Exception:
            with self._lock:
                self.lease_requests += 1  # the GET at least (the write, if it was sent, is not counted)
            raise
        with self._lock:
            self.lease_requests += 2

    def attestation(self, key: tuple[str, str], seen: str) -> dict[str, Any]:
        body = self.bodies[key]
        spec = body["spec"]
        return {
            "verdict": "Alive",
            "evidence": "PidfdPinned",
            "detail": f"host pid {spec['incarnation']['pid']} (state S, 1 threads) pinned by a pidfd, start time "
            "re-checked after opening",
            "incarnation": spec["incarnation"],
            "bootId": spec["incarnation"]["bootId"],
            "hostId": self.host_id,
            "observedTime": now_text(),
            "heartbeatSeen": seen,
            "agent": {"nodeName": spec["nodeName"], "podName": "", "identity": AGENT_IDENTITY},
        }

    def attest(self, key: tuple[str, str]) -> None:
        """The first attestation, exactly as coroner-agent writes it (JSON patch testing what it read)."""
        body = self.bodies[key]
        seen = (body.get("status") or {}).get("lastHeartbeatTime") or ""
        ops = attestation_ops(body, self.attestation(key, seen))
        self.http[body["spec"]["nodeName"]].request(
            "PATCH", registrations_path(*key) + "/status", body=ops, content_type="application/json-patch+json"
        )

    def refresh_request(self, key: tuple[str, str]) -> tuple[Rest, str, str, Any, str]:
        """A refresh of an unchanged Alive verdict (merge patch of status.attestation, same content
        but observedTime). heartbeatSeen is the heartbeat the benchmark last wrote for it."""
        seen = (self.heartbeats.last.get(key) if self.heartbeats else None) or ""
        body = {"status": {"attestation": self.attestation(key, seen)}}
        node = self.bodies[key]["spec"]["nodeName"]
        return self.http[node], "PATCH", registrations_path(*key) + "/status", body, "application/merge-patch+json"

    def close(self) -> None:
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=30)
        for http_ in self.http.values():
            http_.close()
