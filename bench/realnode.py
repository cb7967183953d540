"""Coroner as it ships, on real nodes: the images' sizes, the agent Pod's memory while it watches N
worker processes, and kill -> Retired through the real stack (agent DaemonSet and operator
Deployment under kubelets + containerd) next to the host-process harness (bench/latency.py, the
pidfd variant: the same operator and agent code as host processes), in the same run.

    .venv/bin/python bench/realnode.py                      # ~8 min: 1,000 workers, 100 kills
    .venv/bin/python bench/realnode.py --workers 100 --kills 20 --no-host   # quick, ~3 min

The workers are `sleep` processes on the node (the host's pid namespace), registered exactly as
`coroner run` registers them (bench/harness/workers.register_all, a worker ServiceAccount's
token), on the node the agent runs on: the real agent Pod pins each with a pidfd. Writes
bench/results/NAME.json. Nothing asserts on time. Needs root (kubelet, containerd) and the node's
Debian packages (`make node-deps`).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import subprocess
import sys
import tempfile
import time
from typing import Any

import harness as c

from coroner.client.rest import Rest
from coroner_dev import realnode
from coroner_dev.devcluster import cluster as cluster_mod
from coroner_dev.devcluster import identities
from coroner_dev.devcluster.images import ensure_images

NODES = ("coroner-node-0", "coroner-node-1")
NODE = NODES[1]
NAMESPACE = "bench-realnode"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=1000, help="live worker processes on the agent's node")
    parser.add_argument("--kills", type=int, default=100, help="SIGKILLs, spread over --kill-window")
    parser.add_argument("--kill-window", type=float, default=40.0)
    parser.add_argument("--no-host", action="store_true", help="skip the host-process comparison")
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--name", default="realnode")
    return parser.parse_args()


def agent_rss_kib() -> int:
    """VmRSS of the agent container's process (the host sees it: hostPID)."""
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if any(a.endswith(b"coroner-agent") for a in argv[:2]):
                status = (entry / "status").read_text().splitlines()
                return int(next(line.split()[1] for line in status if line.startswith("VmRSS:")))
        except (OSError, StopIteration):
            continue
    raise RuntimeError("no coroner-agent process on this host")


def real_stack(args: argparse.Namespace, directory: pathlib.Path) -> dict[str, Any]:
    images = ensure_images(progress=c.log)
    started = time.monotonic()
    cluster = cluster_mod.up(directory, nodes=NODES, progress=c.log)
    up_seconds = time.monotonic() - started
    workers = c.Workers()
    try:
        started = time.monotonic()
        realnode.install(cluster)
        install_seconds = time.monotonic() - started
        realnode.kubectl(cluster, "create", "namespace", NAMESPACE)
        realnode.apply_objects(cluster, realnode.worker_rbac(NAMESPACE))
        kubeconfig = identities.mint_token(cluster, service_account=f"{NAMESPACE}/coroner-worker")
        time.sleep(2)
        rss_before = agent_rss_kib()
        tracker = c.Tracker()
        admin = Rest.from_kubeconfig(cluster.kubeconfig, pool_size=2)
        watch = c.Watch(admin, tracker.on_event).start()
        pids = workers.spawn(args.workers)
        boot = pathlib.Path("/proc/sys/kernel/random/boot_id")
        keys = c.register_all(
            pathlib.Path(kubeconfig), [(NAMESPACE, NODE, pid, boot) for pid in pids], interval=None, ttl=None
        )
        by_key = dict(zip(keys, pids, strict=True))
        tracker.wait_until(
            lambda: sum(1 for k in keys if tracker.state.get(k, {}).get("verdict") == "Alive") == len(keys),
            timeout=300,
            what="every worker attested Alive by the agent Pod",
        )
        time.sleep(5)
        rss_watching = agent_rss_kib()
        rng = random.Random(args.seed)
        victims = rng.sample(keys, args.kills)
        killed: dict[tuple[str, str], float] = {}
        first = time.monotonic()
        for key, due in zip(victims, sorted(rng.uniform(0, args.kill_window) for _ in victims), strict=True):
            time.sleep(max(0.0, first + due - time.monotonic()))
            killed[key] = workers.kill(by_key[key])
        tracker.wait_until(
            lambda: all(k in tracker.retired_at for k in victims), timeout=120, what="every killed worker Retired"
        )
        latencies = [tracker.retired_at[k] - killed[k] for k in victims if k in tracker.retired_at]
        attested = [tracker.dead_at[k] - killed[k] for k in victims if k in tracker.dead_at]
        live_retired = [k for k in keys if k not in killed and k in tracker.retired_at]
        watch.close()
        admin.close()
        return {
            "images": {
                i.name: {"uncompressed_bytes": i.uncompressed_bytes, "archive_bytes": i.archive_bytes}
                for i in images.all()
            },
            "node_up_seconds": round(up_seconds, 1),
            "install_seconds": round(install_seconds, 1),
            "agent_rss_mib": {
                "before_workers": round(rss_before / 1024, 1),
                f"watching_{args.workers}": round(rss_watching / 1024, 1),
            },
            "kill_to_retired": c.percentiles(latencies),
            "kill_to_dead_attestation": c.percentiles(attested),
            "not_retired": len(victims) - len(latencies),
            "live_retired": len(live_retired),
        }
    finally:
        workers.close()
        cluster_mod.down(directory)


def host_processes(args: argparse.Namespace) -> dict[str, Any]:
    """bench/latency.py's pidfd variant with the same workers and kills: Coroner's processes on the host."""
    name = f"{args.name}-host"
    command = [
        sys.executable,
        str(pathlib.Path(__file__).with_name("latency.py")),
        f"--workers={args.workers}",
        f"--kills={args.kills}",
        f"--kill-window={args.kill_window}",
        "--nodes=1",
        "--variants=pidfd",
        f"--name={name}",
    ]
    subprocess.run(command, check=True)
    result = json.loads((pathlib.Path(__file__).parent / "results" / f"{name}.json").read_text())
    pidfd = result["coroner_pidfd"]
    return {
        "command": " ".join(command[1:]),
        "result_file": f"bench/results/{name}.json",
        "kill_to_retired": {k: pidfd[k] for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms", "min_ms", "mean_ms", "n")},
        "kill_to_dead_attestation": pidfd["kill_to_dead_attestation"],
        "floor": result["floor"],
    }


def main() -> int:
    args = parse_args()
    result: dict[str, Any] = {
        "machine": c.machine_info(),
        "command": " ".join([".venv/bin/python", *sys.argv]),
        "parameters": vars(args),
    }
    with tempfile.TemporaryDirectory(prefix="coroner-realnode-") as tmp:
        result["real_stack"] = real_stack(args, pathlib.Path(tmp))
    c.write_result(args.name, result)  # the real stack's figures, whatever the comparison does
    if not args.no_host:
        result["host_processes"] = host_processes(args)
        real, host = result["real_stack"]["kill_to_retired"], result["host_processes"]["kill_to_retired"]
        if real.get("p50_ms") and host.get("p50_ms"):
            result["real_over_host_p50"] = round(real["p50_ms"] / host["p50_ms"], 2)
    print(json.dumps(result, indent=2))
    c.write_result(args.name, result)  # says where it wrote
    return 0


if __name__ == "__main__":
    sys.exit(main())
