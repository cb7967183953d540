"""Kill-to-Retired latency: Coroner (pidfd path, /proc resync path) against a naive TTL reaper and
against the API server's own floor.

    .venv/bin/python bench/latency.py                 # full: 1000 workers, 200 kills per variant
    .venv/bin/python bench/latency.py --workers 3000 --name latency-3000   # the per-node cost goals' second size
    .venv/bin/python bench/latency.py --workers 100 --kills 20 --kill-window 20   # quick
    .venv/bin/python bench/latency.py --heartbeat     # workers heartbeat (10 s, TTL 30 s), for comparison

N real worker processes (`sleep`) on `--nodes` simulated nodes (one real coroner-agent each; node-1
carries this machine's boot id, the others a random one), registered exactly as the launcher
registers them (`coroner.launcher.probe_incarnation` + `coroner.launcher.register`, as a worker
ServiceAccount bound to the ClusterRole coroner-worker). By default they do not heartbeat
(liveness is the agent's pidfd and the agent's node Lease; no spec.heartbeat is written); with
`--heartbeat` they carry a heartbeat spec and a benchmark thread heartbeats each every
`--heartbeat-seconds` (TTL `--ttl`), for comparison. K of them are SIGKILLed at random moments spread
over `--kill-window` seconds. Per kill, the figure is the time from just before `os.kill` to
the moment the benchmark's own watch of workerregistrations delivers the object with
`status.retirement` set.

Variants, run one after the other on the same cluster with N live workers each:

- coroner_pidfd: agents as shipped (pidfds pinned; death is an event).
- coroner_proc_resync: agents restarted with `--no-pidfd --resync-seconds=5
  --absence-confirm-seconds=S`: a death is found by the periodic /proc resync (`ProcAbsent`) and
  attested Dead only after the agent re-confirmed the absence S seconds later (no heartbeat witnesses it; with
  `--heartbeat` and a build without that flag: retired after 2 x the heartbeat interval of silence).
- baseline_ttl: no Coroner at all; a naive TTL reaper (in this file) lists plain registrations in
  another namespace every `--sweep-seconds` as admin and deletes those silent >= `--ttl` seconds;
  the figure is kill -> DELETED seen on the watch. Its workers always heartbeat (every
  `--heartbeat-seconds`): a TTL reaper has nothing else to go by.
- floor: one status JSON-patch (test resourceVersion + write) as admin, from send to its watch
  event on the same watch, sampled at 4 Hz during the Coroner variants; times two (the agent's
  attestation and the operator's retirement are two such writes in sequence).
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import random
import sys
import time
from typing import Any

import harness as c
from harness.baseline import TtlReaper
from harness.floor import FloorWriters, prepare_all
from harness.floorprobe import FloorProbe

NS = "bench"
NS_TTL = "bench-ttl"
NS_FLOOR = "bench-floor"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=1000, help="live workers during each variant (N)")
    parser.add_argument("--kills", type=int, default=200, help="SIGKILLs per variant (K)")
    parser.add_argument("--nodes", type=int, default=10, help="simulated nodes, one agent each")
    parser.add_argument("--kill-window", type=float, default=60.0, help="kills are spread over this many seconds")
    parser.add_argument(
        "--heartbeat",
        action="store_true",
        help="workers carry a heartbeat spec and heartbeat for comparison; default: no heartbeats",
    )
    parser.add_argument(
        "--heartbeat-seconds", type=int, default=10, help="heartbeat interval (--heartbeat, and the baseline)"
    )
    parser.add_argument("--ttl", type=int, default=30, help="heartbeat TTL (--heartbeat, and the baseline reaper)")
    parser.add_argument(
        "--absence-confirm-seconds",
        type=float,
        default=10.0,
        help="agent --absence-confirm-seconds (all variants; the window coroner_proc_resync measures)",
    )
    parser.add_argument("--register-threads", type=int, default=16, help="registrations in flight during setup")
    parser.add_argument("--sweep-seconds", type=float, default=10.0, help="baseline reaper sweep period")
    parser.add_argument("--resync-seconds", type=float, default=5.0, help="agent resync for coroner_proc_resync")
    parser.add_argument("--variants", default="pidfd,proc_resync,baseline", help="comma-separated subset")
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument(
        "--profile", action="store_true", help="py-spy the operator and node-1's agent during the pidfd kills"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs) afterwards")
    parser.add_argument("--name", default="latency", help="result name: bench/results/NAME.json")
    return parser.parse_args()


class Fleet:
    """The live workers and their registrations."""

    def __init__(
        self, bench: c.Bench, nodes: list[c.Node], kubeconfig: Any, hb: c.Heartbeater, args: argparse.Namespace
    ) -> None:
        self.bench = bench
        self.nodes = nodes
        self.kubeconfig = kubeconfig
        self.hb = hb
        self.args = args
        self.live: dict[tuple[str, str], int] = {}  # registration key -> pid
        self._spawned = 0

    def kill(self, key: tuple[str, str]) -> float:
        """SIGKILLs the worker of `key` (its launcher stops heartbeating with it); the kill moment."""
        workers = self.bench.workers
        assert workers is not None
        pid = self.live.pop(key)
        self.hb.stop_one(key)
        return workers.kill(pid)

    def grow(self, count: int, *, namespace: str, node_prefix: str = "") -> list[tuple[str, str]]:
        pids = self.bench.spawn_workers(count)
        items = []
        for pid in pids:
            node = self.nodes[self._spawned % len(self.nodes)]
            self._spawned += 1
            items.append((namespace, f"{node_prefix}{node.name}", pid, node.boot_file))
        if namespace == NS_TTL:  # the baseline's plain registrations always heartbeat
            interval, ttl = self.args.heartbeat_seconds, self.args.ttl
        else:
            interval, ttl = self.args.spec_interval, self.args.spec_ttl
        keys = c.register_all(self.kubeconfig, items, interval=interval, ttl=ttl, threads=self.args.register_threads)
        for key, pid in zip(keys, pids, strict=True):
            self.live[key] = pid
        return keys


def kill_schedule(rng: random.Random, count: int, window: float) -> list[float]:
    return sorted(rng.uniform(0, window) for _ in range(count))


def run_kills(
    fleet: Fleet, rng: random.Random, *, count: int, window: float, namespace: str, silences: list[float] | None = None
) -> dict[tuple[str, str], float]:
    """SIGKILLs `count` random live workers of `namespace` at random moments; returns kill moments.
    Appends to `silences` each victim's time since its last successful heartbeat, at its kill."""
    killed: dict[tuple[str, str], float] = {}
    start = time.monotonic()
    for offset in kill_schedule(rng, count, window):
        delay = start + offset - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        candidates = [k for k in fleet.live if k[0] == namespace]
        if not candidates:
            break
        key = rng.choice(candidates)
        killed[key] = fleet.kill(key)
        if silences is not None:
            last = fleet.hb.last_ok_at.get(key)
            if last is not None:
                silences.append(killed[key] - last)
    return killed


def floor_templates(fleet: Fleet, tracker: c.Tracker, *, count: int) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """`count` live registrations of NS killed and retired by Coroner before the measurement, each
    as read while attested Alive and as read once retired."""
    admin = fleet.bench.admin
    victims = [k for k in fleet.live if k[0] == NS][:count]
    alive = {k: admin.request("GET", c.registrations_path(*k)) for k in victims}
    for key in victims:
        fleet.kill(key)
    if not tracker.wait_until(
        lambda: all(k in tracker.retired_at for k in victims), timeout=60, what=f"{count} floor templates retired"
    ):
        raise RuntimeError(f"the two-write floor's templates {victims} were not retired within 60 s")
    return [(alive[k], admin.request("GET", c.registrations_path(*k))) for k in victims]


def collect(
    tracker: c.Tracker, killed: dict[tuple[str, str], float], *, deleted: bool = False
) -> tuple[list[float], dict[str, int], list[float]]:
    latencies, reasons, to_dead = [], {}, []
    with tracker.cond:
        for key, moment in killed.items():
            seen = (tracker.deleted if deleted else tracker.retired_at).get(key)
            if seen is not None:
                latencies.append(seen - moment)
            if not deleted:
                state = tracker.state.get(key) or {}
                reason = str(state.get("retired_reason"))
                reasons[reason] = reasons.get(reason, 0) + 1
                if key in tracker.dead_at:
                    to_dead.append(tracker.dead_at[key] - moment)
    return latencies, reasons, to_dead


def parameters(args: argparse.Namespace, heartbeat_info: dict[str, Any], agent_extra: list[str]) -> dict[str, Any]:
    return {
        "workers": args.workers,
        "kills_per_variant": args.kills,
        "nodes": args.nodes,
        "kill_window_seconds": args.kill_window,
        "heartbeats": heartbeat_info,
        "heartbeat_interval_seconds": args.heartbeat_seconds if args.heartbeat else None,
        "heartbeat_ttl_seconds": args.ttl,
        "baseline_heartbeat_interval_seconds": args.heartbeat_seconds,
        "absence_confirm_seconds": args.absence_confirm_seconds,
        "proc_absent_window_seconds": args.absence_confirm_seconds,
        "proc_absent_window_how": "the agent's --absence-confirm-seconds (re-confirmation before it attests Dead)",
        "agent_resync_seconds_proc_variant": args.resync_seconds,
        "register_threads": args.register_threads,
        "baseline_sweep_seconds": args.sweep_seconds,
        "seed": args.seed,
        "operator_flags": "defaults (--workers 8, --resync-seconds 60, --permission-refresh-seconds 5), "
        f"--namespace {NS} --namespace coroner-system",
        "agent_flags": f"defaults (--resync-seconds 30) {' '.join(agent_extra)} for coroner_pidfd; "
        f"--no-pidfd --resync-seconds {args.resync_seconds:g} {' '.join(agent_extra)} for coroner_proc_resync",
    }


def main() -> int:
    args = parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    args.spec_interval, args.spec_ttl, heartbeat_info = c.heartbeat_spec(
        args.heartbeat, args.heartbeat_seconds, args.ttl
    )
    # The agent re-confirms a /proc absence (or a boot boundary) after this many seconds before it
    # attests Dead.
    agent_extra = [f"--absence-confirm-seconds={args.absence_confirm_seconds:g}"]
    rng = random.Random(args.seed)
    random.seed(args.seed)
    c.raise_nofile()
    started_wall = time.time()
    result = c.new_result("latency", parameters(args, heartbeat_info, agent_extra))
    raw: dict[str, list[float]] = {}
    with c.Bench("latency", keep=args.keep) as bench:
        run = setup(bench, args, variants, agent_extra, result)
        profiles: dict[str, c.Profile | None] = {}
        for variant in (v for v in variants if v in ("pidfd", "proc_resync")):
            if variant == "proc_resync":
                restart_agents_without_pidfd(run, args, agent_extra)
            raw[f"coroner_{variant}"], result[f"coroner_{variant}"] = kill_variant(run, args, rng, variant, profiles)
        if run.operator is not None:
            result["operator_metrics"] = {
                k: v for k, v in c.scrape_operator(run.port).items() if k.startswith(OPERATOR_METRICS)
            }
        if "baseline" in variants:
            raw["baseline_ttl"], result["baseline_ttl"] = baseline(run, args, rng)
        raw.update(floor_figures(run.floor, result))
        result["machine"]["load_during_run"] = bench.load.summary()
        result["heartbeats"] = run.hb.lag_summary()
        if profiles:
            result["profiles"] = {k: v.summary() for k, v in profiles.items() if v is not None}
        result["watch_reconnect_errors"] = run.watch.errors
    result["ratios"] = ratios(result)
    result["goals"] = goals(result, args)
    result["goals_note"] = (
        "workers without heartbeats; the 100 ms / 500 ms / 3x / 100x goals (and the tighter 2x and 150 ms) are "
        "stated at 1,000 workers, p99 <= 1 s at 3,000"
    )
    c.finish(args.name, result, started_wall=started_wall, draw=lambda plt: draw(plt, raw, result))
    return 0


#: The operator's counters a result keeps at the end of the Coroner variants.
OPERATOR_METRICS = (
    "coroner_status_writes_total",
    "coroner_retirements_total",
    "coroner_cas_conflicts_total",
    "coroner_retire_abandoned_total",
    "coroner_reconcile_errors_total",
)


# --- setup: the cluster, the floor probe, Coroner and the workers -----------------------------------


@dataclasses.dataclass
class Run:
    bench: c.Bench
    nodes: list[c.Node]
    kubeconfig: pathlib.Path
    tracker: c.Tracker
    watch: c.Watch
    hb: c.Heartbeater
    floor: FloorProbe
    fleet: Fleet
    operator: c.Component | None
    port: int


def setup(
    bench: c.Bench, args: argparse.Namespace, variants: list[str], agent_extra: list[str], result: dict[str, Any]
) -> Run:
    """The namespaces, the workers' identity, the nodes, the benchmark's watch, the heartbeater, the
    floor probe; with a Coroner variant to run, the operator, an agent per node and the workers."""
    for ns in (NS, NS_TTL, NS_FLOOR):
        bench.namespace(ns)
    kubeconfig = bench.worker_identity([NS, NS_TTL])
    nodes = bench.nodes(args.nodes)
    tracker = c.Tracker()
    watch = c.Watch(bench.admin, tracker.on_event).start()
    bench.on_close(watch.close)
    hb = c.Heartbeater(kubeconfig, interval=args.heartbeat_seconds)
    bench.on_close(hb.close)
    floor = FloorProbe(bench, tracker, namespace=NS_FLOOR)
    bench.on_close(floor.close)
    fleet = Fleet(bench, nodes, kubeconfig, hb, args)
    run = Run(bench, nodes, kubeconfig, tracker, watch, hb, floor, fleet, operator=None, port=0)
    if any(v in ("pidfd", "proc_resync") for v in variants):
        run.port = c.free_port()
        run.operator = bench.start_operator(f"--namespace={NS}", "--namespace=coroner-system", metrics_port=run.port)
        for node in nodes:
            bench.start_agent(node, *agent_extra)
        c.log(
            f"registering {args.workers} workers on {args.nodes} nodes ({result['parameters']['heartbeats']['mode']})"
        )
        t0 = time.monotonic()
        keys = fleet.grow(args.workers, namespace=NS)
        result["parameters"]["registration_seconds"] = round(time.monotonic() - t0, 1)
        if args.heartbeat:
            hb.start(keys)
    return run


def restart_agents_without_pidfd(run: Run, args: argparse.Namespace, agent_extra: list[str]) -> None:
    """For coroner_proc_resync: every agent restarted with `--no-pidfd`, the workers killed so far
    replaced, and two resyncs' time for the agents to relist and re-probe."""
    c.log("restarting the agents with --no-pidfd")
    for node in run.nodes:
        assert node.agent is not None
        run.bench.stop_component(node.agent)
    for node in run.nodes:
        run.bench.start_agent(node, "--no-pidfd", f"--resync-seconds={args.resync_seconds:g}", *agent_extra)
    refill = args.workers - sum(1 for k in run.fleet.live if k[0] == NS)
    if refill > 0:
        grown = run.fleet.grow(refill, namespace=NS)
        if args.heartbeat:
            run.hb.add(grown)
    time.sleep(2 * args.resync_seconds + 2)


# --- load and measure: one variant's kills ----------------------------------------------------------


def kill_variant(
    run: Run, args: argparse.Namespace, rng: random.Random, variant: str, profiles: dict[str, c.Profile | None]
) -> tuple[list[float], dict[str, Any]]:
    """Once every live worker is attested Alive: `--kills` SIGKILLs over `--kill-window` seconds,
    each timed to its retirement on the benchmark's watch, with the floor sampled meanwhile."""
    bench, tracker, floor, name = run.bench, run.tracker, run.floor, f"coroner_{variant}"
    live = [k for k in run.fleet.live if k[0] == NS]
    t0 = time.monotonic()
    settled = tracker.wait_until(
        lambda: c.all_alive(tracker, live), timeout=300, what=f"{len(live)} registrations attested Alive ({name})"
    )
    c.log(
        f"{name}: settled={settled} in {time.monotonic() - t0:.1f} s; killing {args.kills} over {args.kill_window:g} s"
    )
    if variant == "pidfd":
        # The two-write floor's copies, of registrations Coroner retired just now.
        writers = FloorWriters(bench, namespace=NS_FLOOR, nodes=2)
        bench.on_close(writers.close)
        count = int(args.kill_window / (2 * floor.period)) + 40
        floor.arm(writers, prepare_all(writers, floor_templates(run.fleet, tracker, count=2), count=count, threads=8))
        if args.profile:
            assert run.operator is not None and run.nodes[0].agent is not None
            for who, pid in (("operator", run.operator.pid), ("agent", run.nodes[0].agent.pid)):
                profiles[f"{name}-{who}"] = c.py_spy(
                    bench, pid, name=f"{args.name}-{name}-{who}", seconds=args.kill_window
                )
    writes_before = c.operator_status_writes(c.scrape_operator(run.port))
    waits_before = c.cache_read_waits(bench.admin)
    floor_start = len(floor.samples)
    floor.measure(True)
    silences: list[float] = []
    t_kills = time.monotonic()
    killed = run_kills(run.fleet, rng, count=args.kills, window=args.kill_window, namespace=NS, silences=silences)
    tail = 60.0 if variant == "pidfd" else 2 * args.absence_confirm_seconds + 4 * args.resync_seconds + 60
    tracker.wait_until(
        lambda: all(k in tracker.retired_at for k in killed), timeout=tail, what=f"{len(killed)} retirements ({name})"
    )
    floor.measure(False)
    writes_after = c.operator_status_writes(c.scrape_operator(run.port))
    latencies, reasons, to_dead = collect(tracker, killed)
    figures = {
        **c.percentiles(latencies),
        "killed": len(killed),
        "not_retired": len(killed) - len(latencies),
        "retired_by_reason": reasons,
        "kill_to_dead_attestation": c.percentiles(to_dead),
        "stages": c.stages(tracker, killed),
        "operator_status_writes_during_kills": {
            kind: int(writes_after[kind] - writes_before[kind]) for kind in writes_after
        },
        "floor_during_kills": c.percentiles([2 * x for x in floor.samples[floor_start:]]),
        # What the operator's consistent reads (the Lease fence, the admission policies) waited for
        # before the API server served them.
        "apiserver_watch_cache_read_wait": c.diff_cache_read_waits(
            c.cache_read_waits(bench.admin), waits_before, resources=c.RETIREMENT_READS
        ),
    }
    if args.heartbeat:
        figures["heartbeat_silence_at_kill"] = c.percentiles(silences)
        figures["heartbeat_schedule_during_kills"] = run.hb.lag_summary(t_kills, time.monotonic())
    c.log(f"{name}: {figures}")
    return latencies, figures


def baseline(run: Run, args: argparse.Namespace, rng: random.Random) -> tuple[list[float], dict[str, Any]]:
    """No Coroner at all from here on: the same workers with plain registrations in another namespace
    (on node names no agent serves), heartbeating at the same interval, and a naive TTL reaper;
    their Coroner registrations go quiet. Each kill timed to its DELETED on the watch."""
    bench, fleet, hb, tracker = run.bench, run.fleet, run.hb, run.tracker
    for component in list(bench.components):
        bench.stop_component(component)
    for key in [k for k in fleet.live if k[0] == NS]:
        hb.stop_one(key)
    c.log(f"baseline: registering {args.workers} plain registrations in {NS_TTL}")
    existing = sorted(fleet.live.values())
    for key in [k for k in fleet.live if k[0] == NS]:
        fleet.live.pop(key)
    items = []
    for i, pid in enumerate(existing[: args.workers]):
        node = run.nodes[i % len(run.nodes)]
        items.append((NS_TTL, f"ttl-{node.name}", pid, node.boot_file))
    keys = c.register_all(
        run.kubeconfig, items, interval=args.heartbeat_seconds, ttl=args.ttl, threads=args.register_threads
    )
    for key, (_, _, pid, _) in zip(keys, items, strict=True):
        fleet.live[key] = pid
    if args.workers > len(keys):
        keys += fleet.grow(args.workers - len(keys), namespace=NS_TTL, node_prefix="ttl-")
    hb.add(keys)  # starts the heartbeat threads if the Coroner variants ran without heartbeats
    time.sleep(args.heartbeat_seconds)  # every one heartbeats once at its own phase
    reaper = TtlReaper(bench, namespace=NS_TTL, ttl=args.ttl, sweep=args.sweep_seconds)
    bench.on_close(reaper.close)
    c.log(f"baseline_ttl: killing {args.kills} over {args.kill_window:g} s")
    silences: list[float] = []
    t_kills = time.monotonic()
    killed = run_kills(fleet, rng, count=args.kills, window=args.kill_window, namespace=NS_TTL, silences=silences)
    tracker.wait_until(
        lambda: all(k in tracker.deleted for k in killed),
        timeout=args.ttl + 3 * args.sweep_seconds + 60,
        what=f"{len(killed)} reaps (baseline_ttl)",
    )
    latencies, _, _ = collect(tracker, killed, deleted=True)
    figures = {
        **c.percentiles(latencies),
        "killed": len(killed),
        "not_reaped": len(killed) - len(latencies),
        "live_reaped": sum(1 for k in fleet.live if k in tracker.deleted),
        "sweeps": reaper.sweeps,
        "heartbeat_silence_at_kill": c.percentiles(silences),
        "heartbeat_schedule_during_kills": hb.lag_summary(t_kills, time.monotonic()),
        "how": f"admin lists {NS_TTL} every {args.sweep_seconds:g} s and deletes registrations whose "
        f"lastHeartbeatTime is >= {args.ttl} s old; figure = kill -> DELETED on the watch",
    }
    c.log(f"baseline_ttl: {figures}")
    return latencies, figures


# --- report -----------------------------------------------------------------------------------------


def floor_figures(floor: FloorProbe, result: dict[str, Any]) -> dict[str, list[float]]:
    """`result["floor"]` and, when sampled, `result["floor_two_writes"]`; returns their samples."""
    raw = {"floor": [2 * s for s in floor.samples]}
    single = c.percentiles(floor.samples)
    result["floor"] = {
        **c.percentiles(raw["floor"]),
        "single_write_to_watch_p50_ms": single["p50_ms"],
        "single_write_to_watch_p99_ms": single["p99_ms"],
        "single_patch_round_trip_p50_ms": c.percentiles(floor.round_trips)["p50_ms"],
        "how": "2 x (send of a status JSON patch with a resourceVersion test, as admin -> its event on the "
        "benchmark's watch), sampled at 4 Hz during the Coroner variants' kill windows",
    }
    if floor.pairs:
        raw["floor_two_writes"] = [a + b for a, b in floor.pairs]
        result["floor_two_writes"] = {
            **c.percentiles(raw["floor_two_writes"]),
            "attestation_to_watch_p50_ms": c.percentiles([a for a, _ in floor.pairs])["p50_ms"],
            "retirement_to_watch_p50_ms": c.percentiles([b for _, b in floor.pairs])["p50_ms"],
            "errors": floor.pair_errors,
            "how": "a death's two writes on a copy of a registration Coroner retired in this run (harness.floor: "
            f"in {NS_FLOOR}, on a node no agent serves): the Dead attestation by that node's agent token -> its "
            "event on the benchmark's watch, then the retirement compare-and-swap by the operator's token -> its "
            "event; one pair at a time, alternating with the heartbeat floor's samples, during the pidfd kill "
            "window",
        }
    return raw


def ratios(result: dict[str, Any]) -> dict[str, Any]:
    pidfd, base = result.get("coroner_pidfd", {}), result.get("baseline_ttl", {})
    floor, two = result["floor"], result.get("floor_two_writes", {})
    out: dict[str, Any] = {}
    if pidfd.get("p50_ms") and floor.get("p50_ms"):
        out["coroner_pidfd_p50_over_floor_p50"] = round(pidfd["p50_ms"] / floor["p50_ms"], 2)
    if pidfd.get("p50_ms") and two.get("p50_ms"):
        out["coroner_pidfd_p50_over_two_write_floor_p50"] = round(pidfd["p50_ms"] / two["p50_ms"], 2)
    if pidfd.get("p50_ms") and base.get("p50_ms"):
        out["baseline_p50_over_coroner_pidfd_p50"] = round(base["p50_ms"] / pidfd["p50_ms"], 1)
    return out


def goals(result: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The latency goals: at 1,000 workers p50 <= 100 ms, p99 <= 500 ms, within 3x the floor, >= 100x
    faster than the TTL-30 s reaper; at 3,000 workers still p99 <= 1 s. Reported, never asserted."""
    pidfd, ratios_ = result.get("coroner_pidfd", {}), result["ratios"]
    out: dict[str, Any] = {}
    if pidfd.get("n"):
        out["pidfd_p50_le_100ms"] = {"measured_ms": pidfd["p50_ms"], "met": pidfd["p50_ms"] <= 100}
        out["pidfd_p99_le_500ms"] = {"measured_ms": pidfd["p99_ms"], "met": pidfd["p99_ms"] <= 500}
        if args.workers >= 3000:
            out["pidfd_p99_le_1s_at_3000_workers"] = {"measured_ms": pidfd["p99_ms"], "met": pidfd["p99_ms"] <= 1000}
    if "coroner_pidfd_p50_over_floor_p50" in ratios_:
        value = ratios_["coroner_pidfd_p50_over_floor_p50"]
        out["pidfd_p50_within_3x_floor"] = {"measured_ratio": value, "met": value <= 3}
    if "baseline_p50_over_coroner_pidfd_p50" in ratios_:
        value = ratios_["baseline_p50_over_coroner_pidfd_p50"]
        out["baseline_ge_100x_pidfd_at_median"] = {"measured_ratio": value, "met": value >= 100}
    # The tighter goals, stated at 1,000 workers: p50 within 2x the floor, p99 <= 150 ms.
    if args.workers == 1000 and pidfd.get("n"):
        # Their floor is a death's two writes by the agent's and the operator's tokens (as
        # massdeath's): the heartbeat floor above leaves out what the API server does for them.
        if "coroner_pidfd_p50_over_two_write_floor_p50" in ratios_:
            value = ratios_["coroner_pidfd_p50_over_two_write_floor_p50"]
            out["pidfd_p50_within_2x_floor"] = {"measured_ratio": value, "met": value <= 2, "floor": "floor_two_writes"}
        out["pidfd_p99_le_150ms"] = {"measured_ms": pidfd["p99_ms"], "met": pidfd["p99_ms"] <= 150}
    return out


def draw(plt: Any, raw: dict[str, list[float]], result: dict[str, Any]) -> None:
    _fig, ax = plt.subplots(figsize=(9, 5))
    colours = {
        "floor": "grey",
        "coroner_pidfd": "tab:green",
        "coroner_proc_resync": "tab:orange",
        "baseline_ttl": "tab:red",
    }
    for name, values in raw.items():
        if not values:
            continue
        xs = sorted(v * 1000 for v in values)
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        p50 = result[name]["p50_ms"]
        ax.step(xs, ys, where="post", label=f"{name} (n={len(xs)}, p50={p50:g} ms)", color=colours.get(name))
    ax.set_xscale("log")
    ax.set_xlabel("kill -> Retired seen on a watch (ms, log scale); floor = 2 x (status patch -> watch event)")
    ax.set_ylabel("fraction of kills")
    params = result["parameters"]
    ax.set_title(
        f"Coroner kill-to-retirement latency: {params['workers']} workers, {params['nodes']} nodes, "
        f"{params['kills_per_variant']} kills per variant\n("
        + (
            f"heartbeat {params['heartbeat_interval_seconds']} s"
            if params.get("heartbeat_interval_seconds")
            else "no heartbeats"
        )
        + "; shared 2-core machine)",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)


if __name__ == "__main__":
    sys.exit(main())
