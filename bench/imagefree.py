"""Image-free workers on the real node: the registrar's speed, its cost per Pod, and kill -> Retired
next to `coroner run` workers in the same run.

    .venv/bin/python bench/imagefree.py              # ~12 min: 120 container starts, 40 kills
    .venv/bin/python bench/imagefree.py --starts 10 --parallelism 2 --kill-pods 2 --kill-rounds 1 \\
        --steady-seconds 10 --name quick-imagefree  # quick, ~5 min

The workers are examples/ (docs/workers.md), the static Go binary in a `scratch` image, injected by
`coroner.core.inject` (what `kubectl coroner inject` prints) and run through the real-node test
overlay (`realnode.example_on_the_node`: hostNetwork, the node, the registrar's API server address):

- **start -> Active, -> Alive**: examples/job.yaml with `--starts` completions, `--parallelism` at a
  time, each worker exiting 0 after `--job-seconds`. A container's start is its main process's start
  time as the kernel records it (the registration's spec.incarnation.startTime, in clock ticks since
  boot, 10 ms: read on CLOCK_BOOTTIME, which CLOCK_MONOTONIC follows on a machine that never
  suspends); "Active" is the arrival of the registration on the benchmark's watch, "Alive" of its
  first Alive attestation.
- **the registrar's RSS and CPU**: examples/deployment.yaml (3 Pods, idle workers): each registrar's
  main process found on the host by its container id (the leaf of its cgroup path), VmRSS and VmHWM
  from /proc/PID/status, its CPU (utime + stime) over `--steady-seconds`, and in all since its start.
- **kill -> Retired**: `--kill-pods` Pods of each kind, examples/deployment.yaml's Go worker with the
  registrar and `coroner run -- sleep` in the worker image (`realnode.worker_pod`), each registered
  worker process SIGKILLed from the host `--kill-rounds` times (after each restart), both kinds in
  one random order over the same window; kill -> Dead attestation and -> Retired per kind.

Writes bench/results/NAME.json (machine, load, command). Nothing asserts on time. Needs root and the
node's packages (`make node-deps`), as bench/realnode.py.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import harness as c
import yaml

from coroner.core import inject
from coroner_dev import realnode
from coroner_dev.devcluster import cluster as cluster_mod
from coroner_dev.devcluster.images import ensure_images

NODES = ("coroner-node-0", "coroner-node-1")
NODE = NODES[1]
EXAMPLES = c.REPO / "examples"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=120, help="container starts (the Job's completions)")
    parser.add_argument("--parallelism", type=int, default=4, help="the Job's Pods at a time")
    parser.add_argument("--job-seconds", type=float, default=3.0, help="each Job worker's run before it exits 0")
    parser.add_argument("--steady-seconds", type=float, default=60.0, help="the window of the registrar's CPU")
    parser.add_argument("--kill-pods", type=int, default=10, help="Pods of each kind whose workers are killed")
    parser.add_argument("--kill-rounds", type=int, default=2, help="kills of each Pod's worker (after restarts)")
    parser.add_argument("--kill-window", type=float, default=30.0, help="seconds over which a round's kills spread")
    parser.add_argument("--seed", type=int, default=40)
    parser.add_argument("--name", default="imagefree")
    return parser.parse_args()


def example(name: str) -> dict[str, Any]:
    (document,) = yaml.safe_load_all((EXAMPLES / f"{name}.yaml").read_text())
    return dict(document)


def apply(cluster: Any, namespace: str, documents: list[dict[str, Any]]) -> None:
    """The documents, with examples/rbac.yaml first, through the test overlay, in `namespace`."""
    realnode.kubectl(cluster, "create", "namespace", namespace)
    rbac = list(yaml.safe_load_all((EXAMPLES / "rbac.yaml").read_text()))
    realnode.apply_objects(
        cluster,
        [realnode.example_on_the_node(cluster, d, namespace=namespace, node=NODE) for d in [*rbac, *documents]],
    )


class Seen:
    """Per registration (by namespace and name): its latest body, its first arrival, its first Alive."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bodies: dict[tuple[str, str], dict[str, Any]] = {}
        self.first: dict[tuple[str, str], float] = {}
        self.alive: dict[tuple[str, str], float] = {}

    def hook(self, kind: str, obj: dict[str, Any], arrived: float) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        if kind == "DELETED":
            return
        with self.lock:
            self.bodies[key] = obj
            self.first.setdefault(key, arrived)
            verdict = ((obj.get("status") or {}).get("attestation") or {}).get("verdict")
            if verdict == "Alive":
                self.alive.setdefault(key, arrived)

    def of(self, namespace: str) -> dict[tuple[str, str], dict[str, Any]]:
        with self.lock:
            return {k: v for k, v in self.bodies.items() if k[0] == namespace}


def poll(predicate: Callable[[], bool], *, timeout: float, what: str) -> bool:
    """Waits (bounded) until predicate() holds, checking every second; False on timeout (logged)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            c.log(f"gave up waiting for {what} after {timeout:.0f} s")
            return False
        time.sleep(1.0)
    return True


def ending(registration: dict[str, Any]) -> str:
    status = registration.get("status") or {}
    if "retirement" in status:
        return "Retired"
    released = any(x.get("type") == "Released" and x.get("status") == "True" for x in status.get("conditions") or [])
    return "Released" if released else "Active"


def started_monotonic(registration: dict[str, Any]) -> float:
    """The incarnation's start (clock ticks since boot) on this process's monotonic clock."""
    ticks = int(registration["spec"]["incarnation"]["startTime"])
    offset = time.clock_gettime(time.CLOCK_BOOTTIME) - time.monotonic()
    return ticks / CLK_TCK - offset


def start_to_registered(cluster: Any, args: argparse.Namespace, seen: Seen, tracker: c.Tracker) -> dict[str, Any]:
    namespace = "bench-imagefree-job"
    job = example("job")
    job["spec"].update({"completions": args.starts, "parallelism": args.parallelism, "backoffLimit": args.starts})
    job["spec"]["template"]["spec"]["containers"][0]["args"] = [f"{args.job_seconds:g}", "0"]
    started = time.monotonic()
    apply(cluster, namespace, [inject.inject(job)])

    def complete() -> bool:
        read = realnode.kubectl(cluster, "-n", namespace, "get", "job", "batch", "-o", "json", check=False)
        if read.returncode != 0:
            return False  # a moment, not an answer: asked again
        return int((json.loads(read.stdout).get("status") or {}).get("succeeded") or 0) >= args.starts

    poll(complete, timeout=120 + args.starts * (args.job_seconds + 20) / max(1, args.parallelism), what="the Job")
    poll(lambda: len(seen.of(namespace)) >= args.starts, timeout=60, what="every Job worker's registration")
    job_seconds = time.monotonic() - started
    registered, alive, never_alive = [], [], 0
    for key, body in seen.of(namespace).items():
        start = started_monotonic(body)
        registered.append(seen.first[key] - start)
        if key in seen.alive:
            alive.append(seen.alive[key] - start)
        else:
            never_alive += 1
    endings: dict[str, int] = {}
    for body in seen.of(namespace).values():
        endings[ending(body)] = endings.get(ending(body), 0) + 1
    realnode.kubectl(cluster, "delete", "namespace", namespace, "--wait=false")
    return {
        "container_starts": len(registered),
        "job_seconds": round(job_seconds, 1),
        "start_to_active": c.percentiles(registered),
        "start_to_alive": c.percentiles(alive),
        "exited_before_alive": never_alive,
        "endings": endings,
    }


def usage(pid: int) -> tuple[int, int, float, float]:
    """(VmRSS KiB, VmHWM KiB, CPU seconds, seconds since its start) of a process."""
    status = {
        line.split(":")[0]: line.split()[1]
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith(("VmRSS:", "VmHWM:"))
    }
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14 and 15)
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / CLK_TCK  # starttime (field 22)
    return int(status["VmRSS"]), int(status["VmHWM"]), cpu, age


def registrar_cost(cluster: Any, args: argparse.Namespace, seen: Seen, tracker: c.Tracker) -> dict[str, Any]:
    namespace = "bench-imagefree-steady"
    deployment = example("deployment")
    replicas = int(deployment["spec"]["replicas"])
    apply(cluster, namespace, [inject.inject(deployment)])
    poll(
        lambda: sum(1 for k in seen.of(namespace) if k in seen.alive) >= replicas,
        timeout=300,
        what="the Deployment's workers registered and Alive",
    )
    pods = json.loads(realnode.kubectl(cluster, "-n", namespace, "get", "pods", "-o", "json").stdout)["items"]
    pids = []
    for pod in pods:
        (status,) = [s for s in pod["status"]["initContainerStatuses"] if s["name"] == inject.CONTAINER_NAME]
        pid = realnode.container_main_pid(str(status["containerID"]).partition("://")[2])
        if pid is not None:
            pids.append(pid)
    before = {pid: usage(pid) for pid in pids}
    time.sleep(args.steady_seconds)
    after = {pid: usage(pid) for pid in pids}
    realnode.kubectl(cluster, "delete", "namespace", namespace, "--wait=false")
    return {
        "pods": len(pods),
        "registrars_found": len(pids),
        "workers_per_pod": 1,
        "rss_mib": [round(after[p][0] / 1024, 1) for p in pids],
        "peak_rss_mib": [round(after[p][1] / 1024, 1) for p in pids],
        "cpu_millicores_steady": [
            round(1000 * (after[p][2] - before[p][2]) / (after[p][3] - before[p][3]), 2) for p in pids
        ],
        "steady_window_seconds": args.steady_seconds,
        "cpu_seconds_since_start": [round(after[p][2], 2) for p in pids],
        "seconds_since_start": [round(after[p][3], 1) for p in pids],
    }


def kill_to_retired(cluster: Any, args: argparse.Namespace, seen: Seen, tracker: c.Tracker) -> dict[str, Any]:
    go, run = "bench-imagefree-go", "bench-imagefree-run"
    deployment = example("deployment")
    deployment["spec"]["replicas"] = args.kill_pods
    apply(cluster, go, [inject.inject(deployment)])
    realnode.kubectl(cluster, "create", "namespace", run)
    realnode.apply_objects(cluster, realnode.worker_rbac(run))
    realnode.apply_objects(
        cluster,
        [
            realnode.worker_pod(
                f"run-{i}", namespace=run, node=NODE, cluster=cluster, command=["sleep", "3600"],
                restart_policy="Always",
            )
            for i in range(args.kill_pods)
        ],
    )  # fmt: skip
    rng = random.Random(args.seed)
    killed: dict[str, dict[tuple[str, str], float]] = {go: {}, run: {}}
    for round_ in range(args.kill_rounds):

        def live(namespace: str) -> list[tuple[tuple[str, str], int]]:
            found = []
            for key, body in seen.of(namespace).items():
                summary = tracker.state.get(key) or {}
                if key in killed[namespace] or summary.get("verdict") != "Alive" or summary.get("retired"):
                    continue
                pid = realnode.incarnation_pid(body)
                if pid is not None:
                    found.append((key, pid))
            return found

        def ready() -> bool:
            return all(len(live(ns)) >= args.kill_pods for ns in (go, run))

        if not poll(ready, timeout=600, what=f"round {round_ + 1}: every worker of both kinds Alive"):
            break
        victims = [(ns, key, pid) for ns in (go, run) for key, pid in live(ns)[: args.kill_pods]]
        rng.shuffle(victims)
        first = time.monotonic()
        for (namespace, key, pid), due in zip(
            victims, sorted(rng.uniform(0, args.kill_window) for _ in victims), strict=True
        ):
            time.sleep(max(0.0, first + due - time.monotonic()))
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            killed[namespace][key] = time.monotonic()
        poll(
            lambda: all(k in tracker.retired_at for ns in (go, run) for k in killed[ns]),
            timeout=180,
            what=f"round {round_ + 1}: every killed worker Retired",
        )
    result: dict[str, Any] = {"pods_per_kind": args.kill_pods, "rounds": args.kill_rounds}
    for label, namespace in (("image_free", go), ("coroner_run", run)):
        kills = killed[namespace]
        result[label] = {
            "kills": len(kills),
            "kill_to_retired": c.percentiles([tracker.retired_at[k] - t for k, t in kills.items() if k in tracker.retired_at]),
            "kill_to_dead_attestation": c.percentiles([tracker.dead_at[k] - t for k, t in kills.items() if k in tracker.dead_at]),
            "not_retired": sum(1 for k in kills if k not in tracker.retired_at),
            "live_retired": sum(
                1 for k in seen.of(namespace) if k not in kills and k in tracker.retired_at
                and realnode.incarnation_pid(seen.of(namespace)[k]) is not None
            ),
        }  # fmt: skip
    for namespace in (go, run):
        realnode.kubectl(cluster, "delete", "namespace", namespace, "--wait=false")
    return result


def main() -> int:
    args = parse_args()
    result = c.new_result("imagefree", vars(args))
    started_wall = time.time()
    load = c.LoadMonitor().start()
    with tempfile.TemporaryDirectory(prefix="coroner-imagefree-") as tmp, c.written_if_stopped(args.name, result):
        ensure_images(progress=c.log)
        cluster = cluster_mod.up(pathlib.Path(tmp), nodes=NODES, progress=c.log)
        try:
            realnode.install(cluster)
            seen, tracker = Seen(), c.Tracker()
            tracker.hooks.append(seen.hook)
            admin = c.Rest.from_kubeconfig(cluster.kubeconfig, pool_size=2)
            watch = c.Watch(admin, tracker.on_event).start()
            try:
                c.log("start -> Active and Alive: the Job")
                result["start_to_registered"] = start_to_registered(cluster, args, seen, tracker)
                c.log("the registrar's RSS and CPU: the Deployment")
                result["registrar_per_pod"] = registrar_cost(cluster, args, seen, tracker)
                c.log("kill -> Retired: image-free and coroner run workers")
                result["kill_to_retired"] = kill_to_retired(cluster, args, seen, tracker)
            finally:
                watch.close()
                admin.close()
        finally:
            cluster_mod.down(pathlib.Path(tmp))
    result["load"] = load.summary()
    result["load"]["note"] = c.SHARED_MACHINE_NOTE
    result["wall_seconds"] = round(time.time() - started_wall, 1)
    print(json.dumps(result, indent=2))
    c.write_result(args.name, result)  # says where it wrote
    return 0


if __name__ == "__main__":
    sys.exit(main())
