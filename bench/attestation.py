"""Exit-to-attestation latency of the agent, and its footprint while it watches many workers.

One real control plane, one agent (a local process with a node-bound token), N real `sleep`
workers registered on its node; then K of them are SIGKILLed one at a time and the time from
os.kill to `status.attestation.verdict == Dead` observed on a watch is recorded. Also records the
agent's RSS and open fds once all N are pinned.

    .venv/bin/python bench/attestation.py [--workers 1000] [--kills 120]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import queue
import random
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import psutil
from kubernetes import client as k8s
from kubernetes import watch

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import harness as common  # noqa: E402  (bench/harness: machine facts and versions, shared by every bench)

from coroner import launcher  # noqa: E402
from coroner.client.kube import api_client  # noqa: E402
from coroner.client.rest import Rest  # noqa: E402
from coroner.core import api  # noqa: E402
from coroner_dev import fleet  # noqa: E402
from coroner_dev.devcluster import cluster as cluster_mod  # noqa: E402

NODE = "bench-node"
NAMESPACE = "bench"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--kills", type=int, default=120)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--name", default="attestation", help="result name: bench/results/NAME.json")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="coroner-bench-attest-"))
    sleepers: list[subprocess.Popen[bytes]] = []
    agent: subprocess.Popen[bytes] | None = None
    try:
        cluster = fleet.up(directory=workdir / "cluster", controller_manager=False)
        fleet.install(cluster, grant=False)
        fleet.kubectl_ok(cluster, "create", "namespace", NAMESPACE)
        node = fleet.node(cluster, name=NODE, directory=workdir, boot_id=fleet.real_boot_id())
        admin = api_client(cluster.kubeconfig)
        worker = Rest.from_kubeconfig(cluster.kubeconfig)  # the launcher's own client
        registrations: dict[str, subprocess.Popen[bytes]] = {}
        for index in range(args.workers):
            proc = fleet.spawn(["sleep", "3600"], log=None, parent_death=signal.SIGKILL)
            sleepers.append(proc)
            incarnation = launcher.probe_incarnation(proc.pid, node_name=NODE)
            name = f"w{index:05d}"
            launcher.register(
                client=worker,
                namespace=NAMESPACE,
                node_name=NODE,
                incarnation=incarnation,
                name=name,
                interval_seconds=10,
                ttl_seconds=30,
            )
            registrations[name] = proc
        agent = fleet.start_agent(node=node, log=workdir / "agent.log", extra=("--resync-seconds=300",))
        custom = k8s.CustomObjectsApi(admin)

        def alive_count() -> int:
            items = custom.list_namespaced_custom_object(api.GROUP, api.VERSION, NAMESPACE, api.PLURAL)["items"]
            return sum(1 for i in items if (i.get("status") or {}).get("attestation", {}).get("verdict") == "Alive")

        started = time.monotonic()
        while alive_count() < args.workers and time.monotonic() - started < 600:
            time.sleep(1)
        settle_seconds = time.monotonic() - started
        time.sleep(3)
        agent_ps = psutil.Process(agent.pid)
        footprint = {
            "agent_rss_mb": round(agent_ps.memory_info().rss / 2**20, 1),
            "agent_fds": agent_ps.num_fds(),
            "watched_workers": args.workers,
            "seconds_to_all_alive": round(settle_seconds, 1),
        }

        events: queue.Queue[tuple[str, float]] = queue.Queue()
        stop = threading.Event()

        def watch_dead() -> None:
            stream = watch.Watch()
            try:
                for event in stream.stream(
                    custom.list_namespaced_custom_object,
                    api.GROUP,
                    api.VERSION,
                    NAMESPACE,
                    api.PLURAL,
                    timeout_seconds=900,
                ):
                    obj = event["object"]
                    if (obj.get("status") or {}).get("attestation", {}).get("verdict") == "Dead":
                        events.put((obj["metadata"]["name"], time.monotonic()))
                    if stop.is_set():
                        stream.stop()
            except Exception:  # the control plane going down at the end ends the watch
                if not stop.is_set():
                    raise

        watcher = threading.Thread(target=watch_dead, daemon=True)
        watcher.start()
        time.sleep(2)
        while not events.empty():
            events.get_nowait()
        latencies: list[float] = []
        for name in rng.sample(sorted(registrations), args.kills):
            proc = registrations[name]
            time.sleep(rng.uniform(0.05, 0.3))
            killed = time.monotonic()
            os.kill(proc.pid, signal.SIGKILL)
            deadline = killed + 30
            while time.monotonic() < deadline:
                try:
                    seen, at = events.get(timeout=max(0.01, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if seen == name:
                    latencies.append((at - killed) * 1000)
                    break
            proc.wait()
        stop.set()
        result = {
            "exit_to_attestation": {
                "n": len(latencies),
                "p50_ms": round(statistics.median(latencies), 2),
                "p90_ms": round(percentile(latencies, 0.9), 2),
                "p99_ms": round(percentile(latencies, 0.99), 2),
                "max_ms": round(max(latencies), 2),
                "kills": args.kills,
            },
            **footprint,
            "machine": common.machine_info(),
            "versions": common.versions(),
            "command": " ".join([".venv/bin/python", "bench/attestation.py", *sys.argv[1:]]),
            "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        }
        common.RESULTS.mkdir(parents=True, exist_ok=True)
        out = common.RESULTS / f"{args.name}.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
    finally:
        fleet.stop(agent, timeout=60)
        for proc in sleepers:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        cluster_mod.down(workdir / "cluster")


if __name__ == "__main__":
    main()
