"""What a registration carries beyond what Coroner reads costs the agent and the operator nothing.

Any identity that may create registrations may name any node, and each may carry up to 256 KiB
of annotations (labels, finalizers and owner references besides). The real agent of one node and
the real operator, against the real API server: 300 registrations of 200 KiB of annotations each
aimed at that node (60 MB as stored) grow neither process by 64 MiB, once both have seen and
decided every one. Each keeps of a registration only what it reads (`coroner.core.world.trimmed`),
each object trimmed as it is decoded from the watch.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import subprocess
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k8s

from coroner.core import procfs
from coroner_dev.devcluster.cluster import Cluster
from integration.test_agent_health import free_port, get, samples, value
from integration.test_probe_real import REAL_BOOT
from support import components, kube
from support.fleet import Node

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

JUNK = 300
ANNOTATION_BYTES = 200 * 1024
GROWTH_BOUND = 64 * 1024 * 1024


def rss(pid: int) -> tuple[int, int]:
    """The process's resident set and its peak (VmRSS, VmHWM), in bytes."""
    fields = dict(
        line.split(":", 1) for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def _total(text: str, name: str) -> float:
    """A metric summed over its labels."""
    return sum(v for (sample, _), v in samples(text).items() if sample == name)


def _incarnation(pid: int, node: Node) -> dict[str, object]:
    """The live process `pid` as a launcher on `node` records it (so the agent reads it Alive)."""
    root = pathlib.Path(f"/proc/{pid}")
    machine = pathlib.Path("/etc/machine-id")
    made = procfs.incarnation_from(
        stat=(root / "stat").read_bytes(), status=(root / "status").read_bytes(),
        pid_namespace_link=os.readlink(root / "ns" / "pid"), boot_id=node.boot_file.read_text(),
        machine_id=machine.read_text() if machine.exists() else None, node_name=node.name,
    )  # fmt: skip
    return {"bootId": made.boot_id, "pidNamespace": str(made.pid_namespace), "pid": made.pid,
            "startTime": str(made.start_time), "hostId": made.host_id}  # fmt: skip


def _junk(name: str, node: Node, incarnation: dict[str, object]) -> dict[str, Any]:
    body = kube.registration_body(name=name, node=node.name, interval=None)
    body["spec"]["incarnation"] = incarnation
    # Several annotations, as junk would come: each value far past the shared-string length.
    part = ANNOTATION_BYTES // 4
    body["metadata"]["annotations"] = {f"junk.example/{i}": f"{name}-{i}-".ljust(part, "x") for i in range(4)}
    return body


@pytest.mark.filterwarnings("ignore:record_property is incompatible:pytest.PytestWarning")
def test_junk_registrations_grow_neither_the_agent_nor_the_operator_by_64_mib(
    granted: Cluster,
    admin: k8s.ApiClient,
    namespace: str,
    tmp_path: pathlib.Path,
    record_property: Callable[[str, object], None],
) -> None:
    node = Node(granted, tmp_path, f"junk-{uuid.uuid4().hex[:6]}", REAL_BOOT)
    agent_port, operator_port = free_port(), free_port()
    node.start_agent(f"--metrics-port={agent_port}", "--metrics-bind-address=127.0.0.1")
    operator_argv = components.operator_argv(
        components.operator_kubeconfig(granted), f"--namespace={namespace}", f"--metrics-port={operator_port}",
        "--metrics-bind-address=127.0.0.1", "--resync-seconds=2",
    )  # fmt: skip
    worker = subprocess.Popen(["sleep", "900"])
    try:
        incarnation = _incarnation(worker.pid, node)
        with components.process(operator_argv, log=tmp_path / "operator.log") as operator:
            assert node.agent is not None
            agent_pid = node.agent.pid

            def seen(count: int) -> bool:
                """The agent has cached and attested `count` registrations, the operator cached them."""
                try:
                    agent_text = get(f"http://127.0.0.1:{agent_port}/metrics")[1]
                    operator_text = get(f"http://127.0.0.1:{operator_port}/metrics")[1]
                except OSError:
                    return False
                return (
                    value(agent_text, "coroner_agent_registrations") == count
                    and _total(agent_text, "coroner_agent_attestations_total") >= count
                    and _total(operator_text, "coroner_registration_objects") == count
                )

            # Both up, watching and deciding: one small registration seen by each.
            first = kube.registration_body(name="first", node=node.name, interval=None)
            first["spec"]["incarnation"] = incarnation
            kube.create_registration(admin, namespace, first)
            kube.wait_for(lambda: seen(1), timeout=120, interval=0.5, what="the first registration seen by both")
            before = {"agent": rss(agent_pid), "operator": rss(operator.pid)}

            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda i: kube.create_registration(
                    admin, namespace, _junk(f"junk-{i}", node, incarnation)), range(JUNK)))  # fmt: skip
            kube.wait_for(lambda: seen(JUNK + 1), timeout=600, interval=1.0, what="every junk registration seen")
            after = {"agent": rss(agent_pid), "operator": rss(operator.pid)}
    finally:
        node.stop_agent()
        worker.kill()
        worker.wait()
    growth = {name: after[name][0] - before[name][0] for name in before}
    measured = {name: {"rssBefore": before[name][0], "rssAfter": after[name][0], "peakAfter": after[name][1]}
                for name in before}  # fmt: skip
    record_property("growth", json.dumps(measured))
    print(f"{JUNK} registrations of {ANNOTATION_BYTES} bytes of annotations: {json.dumps(measured)}")
    for name, grown in growth.items():
        assert grown < GROWTH_BOUND, f"the {name} grew by {grown / 2**20:.1f} MiB: {measured[name]}"
