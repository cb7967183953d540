"""The real agent's /metrics, /healthz and /readyz , what a kubelet probe and Prometheus read, against the real API server.

The agent runs as a process with a node-bound token, under the very seccomp profile the DaemonSet
installs (its server needs listen and accept4), and reaches the API server through a loopback proxy
(tests/faults/proxy.py) that can cut it off. With a worker registered on its node it attests, renews
its Lease and is ready; /metrics carries every coroner_agent_* series the monitoring component uses,
coroner_build_info and the process collectors. Then the API server becomes unreachable for it: it
turns unready once its Lease's duration has passed without a renewal, counts the failures, and
stays live — the kubelet must never restart an agent because the API server is down. Connectivity
back, it is ready again.
"""

from __future__ import annotations

import pathlib
import re
import socket
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from coroner_dev.devcluster.cluster import Cluster
from faults.plane import proxied_kubeconfig
from faults.proxy import ApiProxy
from integration.test_agent_confinement import confined
from support import components, kube
from support.fleet import Node, attestation, launch, worker_kubeconfig

pytestmark = pytest.mark.integration

REAL_BOOT = pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip()
MONITORING = kube.MANIFESTS / "components" / "monitoring"
#: Every series the agent must export (beside what the monitoring component names).
AGENT_SERIES = {
    "coroner_build_info",
    "coroner_agent_registrations",
    "coroner_agent_attestations_total",
    "coroner_agent_probe_seconds_bucket",
    "coroner_agent_pidfds",
    "coroner_agent_lease_renewals_total",
    "coroner_agent_lease_renewal_failures_total",
    "coroner_agent_lease_last_renewal_timestamp_seconds",
    "process_resident_memory_bytes",
    "python_info",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, frozenset(labels.items())), 0.0)


def monitored_agent_series() -> set[str]:
    """The coroner_agent_* names the PrometheusRule and the dashboard use."""
    found: set[str] = set()
    for path in MONITORING.iterdir():
        found |= set(re.findall(r"\bcoroner_agent_[a-z_]+", path.read_text()))
    return found


@pytest.fixture
def proxy(cluster: Cluster) -> Iterator[ApiProxy]:
    made = ApiProxy(
        name="agent-health",
        upstream_port=cluster.apiserver_port,
        ca_cert=cluster.pki.ca_cert,
        serving_cert=cluster.pki.serving_cert,
        serving_key=cluster.pki.serving_key,
    ).start()
    yield made
    made.close()


@pytest.fixture
def node(cluster: Cluster, tmp_path: pathlib.Path) -> Iterator[Node]:
    components.install(cluster, grant=False)
    made = Node(cluster, tmp_path, f"health-{uuid.uuid4().hex[:6]}", REAL_BOOT)
    yield made
    made.stop_agent()


def test_the_real_agent_serves_metrics_and_stays_live_but_unready_without_the_api_server(
    node: Node, proxy: ApiProxy, cluster: Cluster, admin: k8s.ApiClient, namespace: str, tmp_path: pathlib.Path
) -> None:
    port = free_port()
    kubeconfig = proxied_kubeconfig(node.kubeconfig, proxy.port, tmp_path / "agent.kubeconfig")
    argv = components.agent_argv(
        kubeconfig, node=node.name, boot_id_file=node.boot_file,
        extra=(f"--metrics-port={port}", "--metrics-bind-address=127.0.0.1", "--lease-duration-seconds=3",
               "--renew-seconds=1", "--resync-seconds=2", "--shutdown-grace-seconds=1"),
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    with components.process(confined(argv), log=node.log) as agent:
        worker = launch(
            namespace=namespace, kubeconfig=worker_kubeconfig(cluster, namespace), directory=tmp_path, name="w",
            node=node,
        )  # fmt: skip
        try:
            kube.wait_for(lambda: attestation(admin, namespace, "w").get("verdict") == "Alive", what="w Alive")
            kube.wait_for(lambda: get(base + "/readyz")[0] == 200, what="ready")
            assert get(base + "/healthz")[0] == 200
            status, text = get(base + "/metrics")
            assert status == 200
            names = {name for name, _ in samples(text)}
            exported = names | {re.sub(r"_(bucket|count|sum|total|created)$", "", n) for n in names}
            assert AGENT_SERIES | monitored_agent_series() <= exported, sorted(names)
            assert value(text, "coroner_agent_attestations_total", verdict="Alive", evidence="PidfdPinned") == 1
            assert value(text, "coroner_agent_registrations") == 1
            assert value(text, "coroner_agent_pidfds") == 1
            assert value(text, "coroner_agent_lease_renewals_total") >= 1
            assert value(text, "coroner_agent_lease_last_renewal_timestamp_seconds") > 0
            assert value(text, "coroner_agent_probe_seconds_count") >= 1
            # No label names a registration: every label of every coroner_agent_ series is one of these.
            assert {k for (n, labels) in samples(text) if n.startswith("coroner_agent_") for k, _ in labels} <= {
                "verdict", "evidence", "call", "status", "le",
            }  # fmt: skip

            # The API server unreachable for this agent: unready once its Lease's duration passes, live throughout.
            proxy.set_mode("drop")
            kube.wait_for(lambda: get(base + "/readyz")[0] == 503, timeout=60, what="unready without the API server")
            _, body = get(base + "/readyz")
            assert "node Lease was last renewed" in body, body
            assert get(base + "/healthz")[0] == 200
            text = get(base + "/metrics")[1]
            assert value(text, "coroner_agent_lease_renewal_failures_total") >= 1
            assert sum(v for (n, _), v in samples(text).items() if n == "coroner_agent_api_errors_total") >= 1
            assert agent.poll() is None, "the agent keeps running"

            proxy.set_mode("pass")
            kube.wait_for(lambda: get(base + "/readyz")[0] == 200, timeout=60, what="ready again")
            assert get(base + "/healthz")[0] == 200
        finally:
            worker.kill()
