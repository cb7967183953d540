"""patchcost — what a conditional status write of a WorkerRegistration costs the API server, by kind.

Measured before choosing how the operator's compare-and-swap writes are sent: a
JSON patch whose first op `test`s metadata.resourceVersion (what Coroner sends), or a merge patch
carrying metadata.resourceVersion (also a compare-and-swap: 409 on a mismatch). This writes the
same status change (the operator's conditions list, as the operator writes it, with the operator's
own token) to N fresh registrations with each kind in turn, from a tuned client (`--connections`
requests in flight over keep-alive connections), and reports per kind: wall seconds, writes per
second, and kube-apiserver CPU seconds per write (its own /proc utime+stime over the phase). A
third kind, a JSON patch without the `test`, is the unconditional baseline.

    .venv/bin/python bench/patchcost.py                 # 2000 objects per kind, ~2 min
    .venv/bin/python bench/patchcost.py --objects 300   # quick

Writes bench/results/patchcost.json. Measures only; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import harness as c

from coroner.core import api
from coroner_dev.devcluster.identities import mint_token

NS = "bench-patchcost"
KINDS = ("json_patch_test_rv", "merge_patch_rv", "json_patch_unconditional")


def apiserver_cpu_seconds(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def conditions(kind: str, i: int) -> list[dict[str, Any]]:
    stamp = c.now_text()[:19] + "Z"
    return [
        {"type": "Attested", "status": "True", "reason": "Alive", "message": f"Alive (PidfdPinned) {kind}",
         "lastTransitionTime": stamp, "observedGeneration": 1},
        {"type": "Retirable", "status": "False", "reason": "PidAlive",
         "message": f"{NS}/obj-{i} (pid {1000 + i} on node-1): the agent of node-1 attests the process is alive "
         "(PidfdPinned); it becomes retirable only after the agent attests it Dead.",
         "lastTransitionTime": stamp, "observedGeneration": 1},
        {"type": "Retired", "status": "False", "reason": "Active",
         "message": "active; the Retirable condition says why it is or is not retirable",
         "lastTransitionTime": stamp, "observedGeneration": 1},
    ]  # fmt: skip


def request(kind: str, i: int, rv: str) -> tuple[Any, str]:
    body = conditions(kind, i)
    if kind == "merge_patch_rv":
        return {"metadata": {"resourceVersion": rv}, "status": {"conditions": body}}, "application/merge-patch+json"
    # Fresh objects have no status yet: the operator's own builder adds /status whole then too.
    ops: list[dict[str, Any]] = [{"op": "add", "path": "/status", "value": {"conditions": body}}]
    if kind == "json_patch_test_rv":
        ops.insert(0, {"op": "test", "path": "/metadata/resourceVersion", "value": rv})
    return ops, "application/json-patch+json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=2000, help="registrations written per kind")
    parser.add_argument("--connections", type=int, default=16, help="requests in flight")
    parser.add_argument("--name", default="patchcost")
    args = parser.parse_args()
    started = time.monotonic()
    with c.Bench(args.name) as bench:
        bench.namespace(NS)
        pid = _apiserver_pid(bench)
        # One pooled client per identity, a keep-alive connection per request in flight.
        admin = c.client(bench.cluster.kubeconfig, pool_size=args.connections)
        operator = c.client(
            mint_token(bench.cluster, service_account=f"{c.SYSTEM}/coroner-operator"), pool_size=args.connections
        )

        registrant = c.registrant_annotation(admin)

        def create(name: str) -> str:
            body = {
                "apiVersion": api.API_VERSION,
                "kind": api.KIND,
                "metadata": {"name": name, "namespace": NS, "labels": {api.NODE_LABEL: "node-1"},
                             "annotations": registrant},
                "spec": {
                    "nodeName": "node-1",
                    "incarnation": {"bootId": "b" * 36, "pidNamespace": str(api.ROOT_PID_NAMESPACE_INODE),
                                    "pid": 1000 + int(name.rsplit("-", 1)[1]), "startTime": "123456", "hostId": "h" * 32},
                    "clientInstanceId": f"inst-{name}",
                },
            }  # fmt: skip
            created = c.create_admitted(admin, c.registrations_path(NS), body)
            return str(created["metadata"]["resourceVersion"])

        results: dict[str, Any] = {}
        with ThreadPoolExecutor(max_workers=args.connections) as pool:
            for kind in KINDS:
                names = [f"{kind.replace('_', '-')}-{i}" for i in range(args.objects)]
                c.log(f"{kind}: creating {args.objects}")
                rvs = list(pool.map(create, names))
                time.sleep(2)  # let the creations' watch fan-out settle before measuring

                def write(item: tuple[int, str, str], kind: str = kind) -> int:
                    i, name, rv = item
                    body, content_type = request(kind, i, rv)
                    status, _ = operator.send(
                        "PATCH", c.registrations_path(NS, name) + "/status", body=body, content_type=content_type
                    )
                    return status

                cpu0, t0 = apiserver_cpu_seconds(pid), time.monotonic()
                statuses = list(pool.map(write, [(i, n, rv) for i, (n, rv) in enumerate(zip(names, rvs, strict=True))]))
                seconds, cpu = time.monotonic() - t0, apiserver_cpu_seconds(pid) - cpu0
                ok = sum(1 for s in statuses if s == 200)
                if ok != len(statuses):
                    raise RuntimeError(f"{kind}: {len(statuses) - ok} writes failed ({sorted(set(statuses))})")
                results[kind] = {
                    "writes": len(statuses),
                    "ok": ok,
                    "seconds": round(seconds, 3),
                    "writes_per_second": round(len(statuses) / seconds, 1),
                    "apiserver_cpu_seconds": round(cpu, 3),
                    "apiserver_cpu_ms_per_write": round(1000 * cpu / len(statuses), 3),
                }
                c.log(f"{kind}: {results[kind]}")
        base = results["json_patch_test_rv"]["apiserver_cpu_ms_per_write"]
        result = {
            "benchmark": "patchcost",
            "command": c.command_line(),
            "machine": c.machine_info() | {"load_during_run": bench.load.summary()},
            "versions": c.versions(),
            "parameters": {"objects": args.objects, "connections": args.connections},
            "kinds": results,
            "cpu_ratio_merge_over_json_test": round(results["merge_patch_rv"]["apiserver_cpu_ms_per_write"] / base, 3),
            "cpu_ratio_unconditional_over_json_test": round(
                results["json_patch_unconditional"]["apiserver_cpu_ms_per_write"] / base, 3
            ),
            "wall_seconds": round(time.monotonic() - started, 1),
        }
        c.write_result(args.name, result)


def _apiserver_pid(bench: c.Bench) -> int:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = pathlib.Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"kube-apiserver") and str(bench.dir).encode() in b" ".join(argv):
            return int(entry)
    raise RuntimeError("kube-apiserver of this benchmark not found")


if __name__ == "__main__":
    main()
