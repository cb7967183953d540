"""The long fault-injection run: seeded random fault mixes, trial after trial, on one real control plane.

Each trial is what tests/faults/test_faults.py runs (see docs/faults.md): workers on 2-3 simulated
nodes, 0-3 faults drawn from the fault model, deaths, then the invariant checked in both directions.
One control plane, one operator and one agent per node serve every trial; a fault restarts only what
it needs. Results (totals and per fault) are written to bench/results/faults.json after every trial.

    .venv/bin/python bench/faults.py --trials 10000 --seed S [--minutes 30]

Stops at --trials or when --minutes of wall time have passed (the running trial finishes first).
Replay one trial: --replay SEED --faults a,b (the trial seeds are in the results' violations).

--resume continues the run recorded in --out (its "resume" section: the seed, the trials done, the
totals): trial i always gets the i-th seed of the run's seed sequence, so a run stopped and resumed,
any number of times, is the same sequence of trials as one that never stopped; trials that were in
flight at the stop are run again, none is counted twice.

Shared rounds (default; --no-rounds turns them off): trials are taken in groups of --lanes
consecutive indices; a group any of whose trials drew an API server restart or a watch expiry runs
as one round — every trial of the group carries that fault (one variant, drawn from the group's
first seed), all run at once on the lanes' disjoint nodes, and one restart serves them all
(tests/faults/runner.py `plan_round`). Which trials form a group depends on --lanes: a run resumed
with other --lanes starts a new lane segment after the last trial done (the record's
`lane_segments`), so every earlier group stays as it was (`runner.group_members`); --no-rounds
cannot change on resume.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import random
import resource
import shlex
import signal
import sys
import tempfile
import threading
import time
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from harness.machine import machine_info, versions  # noqa: E402

from faults import runner  # noqa: E402
from faults.plane import Plane  # noqa: E402
from faults.trial import FAULTS, MASS_COUNT  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=None, help="Wall-time budget (default: none).")
    parser.add_argument("--lanes", type=int, default=2, help="Trials run concurrently on disjoint nodes.")
    parser.add_argument("--nodes", type=int, default=None, help="Simulated nodes (default: 3 per lane).")
    parser.add_argument("--mass", type=int, default=MASS_COUNT, help="Deaths of the mass_death fault.")
    parser.add_argument(
        "--faults", default="", help="Comma-separated: draw only from these (or, with --replay, run these)."
    )
    parser.add_argument("--replay", type=int, default=None, help="Run one trial with this trial seed.")
    parser.add_argument("--dir", default=None, help="Directory for the control plane and logs (default: a temp dir).")
    parser.add_argument("--keep-cluster", action="store_true", help="Leave the control plane running (with --dir).")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "faults.json"))
    parser.add_argument("--resume", action="store_true", help="Continue the run recorded in --out (same seed).")
    parser.add_argument(
        "--no-rounds",
        dest="rounds",
        action="store_false",
        help="Run API server restarts and watch expiries alone, one trial at a time (as before shared rounds).",
    )
    args = parser.parse_args()

    allowed = [f for f in args.faults.split(",") if f]
    for name in allowed:
        if name.partition(":")[0] not in FAULTS:
            parser.error(f"unknown fault {name!r}; known: {', '.join(sorted(FAULTS))}")
    if allowed and args.replay is None:
        runner.WEIGHTS = {k: v for k, v in runner.WEIGHTS.items() if k in allowed}

    def interrupted(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")  # so that `finally` stops everything started

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    lanes = 1 if args.replay is not None else max(1, args.lanes)
    nodes = args.nodes or 3 * lanes
    directory = pathlib.Path(args.dir) if args.dir else pathlib.Path(tempfile.mkdtemp(prefix="coroner-faults-"))
    command = ".venv/bin/python bench/faults.py " + shlex.join(sys.argv[1:])
    out = pathlib.Path(args.out)
    previous: dict[str, Any] = {}
    if args.resume:
        try:
            previous = json.loads(out.read_text())["resume"]
        except (OSError, ValueError, KeyError) as exc:
            parser.error(f"--resume: {out} has no resumable run ({exc!r}); start one without --resume")
        if previous["seed"] != args.seed:
            parser.error(f"--resume: {out} is the run of --seed {previous['seed']}, not {args.seed}")
        if previous.get("faults", "") != args.faults:
            parser.error(f"--resume: {out} drew from --faults {previous.get('faults', '')!r}, not {args.faults!r}")
        if "rounds" in previous and previous["rounds"] != args.rounds:
            parser.error(
                f"--resume: {out} ran with shared rounds {'on' if previous['rounds'] else 'off (--no-rounds)'}; "
                f"the groups of its trials depend on it: resume with the same"
            )
    master = random.Random(args.seed)
    seeds: list[int] = []  # seeds[i]: trial i's seed, the i-th draw of the run's sequence

    def seed_of(index: int) -> int:
        while len(seeds) <= index:
            seeds.append(master.getrandbits(32))
        return seeds[index]

    def drawn(index: int) -> list[str]:
        return runner.choose_faults(random.Random(seed_of(index) ^ 0x5EED), nodes=3)

    completed: set[int] = set(previous.get("completed", []))
    segments: list[tuple[int, int]] = [
        (int(first), int(n)) for first, n in previous.get("lane_segments", [[0, previous.get("lanes", lanes)]])
    ]
    if segments[-1][1] != lanes:  # a new lane segment after the last trial done (one begun at it is replaced)
        first = max(completed, default=-1) + 1
        segments = [*(segment for segment in segments if segment[0] < first), (first, lanes)]

    def group_of(index: int) -> tuple[str | None, list[int], list[list[str]]]:
        """The group of consecutive trials `index` is in (`runner.group_members`): its shared-round
        fault (None: none, or rounds are off), its indexes, and each one's faults."""
        if not args.rounds:
            return None, [index], [drawn(index)]
        members = runner.group_members(index, segments)
        spec, lists = runner.plan_round([drawn(i) for i in members], random.Random(seed_of(members[0]) ^ 0x2077D))
        return spec, members, lists

    aggregate = runner.Aggregate.from_state(previous["aggregate"]) if previous else runner.Aggregate()
    in_flight: set[int] = set()
    prior_wall = float(previous.get("wall_seconds", 0.0))
    started_at = previous.get("started") or datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    plane = Plane(directory, node_count=nodes, keep_cluster=args.keep_cluster)
    started = time.monotonic()
    state: dict[str, Any] = {"stopped_because": "trials", "cursor": 0, "done": len(completed), "runs": 1, "rounds": 0}
    state["rounds"] += int(previous.get("rounds_run", 0))
    state["runs"] += int(previous.get("runs", 0))
    lock = threading.Lock()

    def write() -> None:
        elapsed = prior_wall + time.monotonic() - started
        rate = aggregate.trials / elapsed * 60 if elapsed > 0 else 0.0
        body = {
            **aggregate.to_json(),
            "seed": args.seed,
            "requested_trials": args.trials,
            "stopped_because": state["stopped_because"],
            "wall_seconds": round(elapsed, 1),
            "trials_per_minute": round(rate, 2),
            "estimated_hours_for_3000_trials": round(3000 / rate / 60, 1) if rate else None,
            "estimated_hours_for_10000_trials": round(10000 / rate / 60, 1) if rate else None,
            "mass_death_count": args.mass,
            "nodes": nodes,
            "lanes": lanes,
            "shared_rounds": args.rounds,
            "rounds_run": state["rounds"],
            "load_average": list(os.getloadavg()),
            "plane_directory": str(directory),
            "machine": machine_info(),
            "versions": versions(),
            "command": command,
            "started": started_at,
            "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "resume": {
                "seed": args.seed,
                "faults": args.faults,
                "lanes": lanes,
                "lane_segments": [list(segment) for segment in segments],
                "rounds": args.rounds,
                "rounds_run": state["rounds"],
                "runs": state["runs"],
                "completed": sorted(completed),
                "wall_seconds": round(elapsed, 1),
                "started": started_at,
                "aggregate": aggregate.state(),
            },
        }
        if args.replay is None:
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(body, indent=2, sort_keys=False, default=str) + "\n")
            tmp.replace(out)
        else:
            print(json.dumps(body["violations"], indent=1, default=str))

    def next_trial() -> tuple[int, int, list[str]] | list[tuple[int, int, list[str]]] | None:
        with lock:
            if len(completed) + len(in_flight) >= args.trials or state["stopped_because"] != "trials":
                return None
            if args.minutes is not None and time.monotonic() - started > args.minutes * 60:
                state["stopped_because"] = "minutes"
                return None
            if args.replay is not None:
                state["stopped_because"] = "replayed"  # one trial only
                return 0, args.replay, allowed
            while state["cursor"] in completed:
                state["cursor"] += 1
            index = state["cursor"]
            spec, members, lists = group_of(index)
            if spec is not None:  # a shared round: every remaining trial of the group, at once
                chosen = []
                for i, faults in zip(members, lists, strict=True):
                    if i >= index and i not in completed and len(completed) + len(in_flight) < args.trials:
                        in_flight.add(i)
                        chosen.append((i, seed_of(i), faults))
                state["cursor"] = members[-1] + 1
                state["rounds"] += 1
                return chosen
            state["cursor"] += 1
            in_flight.add(index)
            return index, seed_of(index), lists[members.index(index)]

    def stop_issuing() -> None:
        with lock:
            state["stopped_because"] = "interrupted"

    def on_result(index: int, result: runner.TrialResult) -> None:
        with lock:
            aggregate.add(result)
            completed.add(index)
            in_flight.discard(index)
            state["done"] += 1
            print(f"[{state['done']}] {result.summary()}", flush=True)
            for violation in result.violations:
                print(f"    {violation.get('counter')}: {violation.get('detail')}", flush=True)
            write()  # after every trial: a hard stop loses only the trials in flight (rerun on --resume)

    try:
        plane.start()
        print(f"plane ready in {time.monotonic() - started:.1f} s at {directory} ({nodes} nodes, {lanes} lanes)")
        runner.run_lanes(
            plane, lanes=lanes, next_trial=next_trial, on_result=on_result, mass_count=args.mass, stop=stop_issuing
        )
    except KeyboardInterrupt:
        state["stopped_because"] = "interrupted"
    finally:
        with lock:
            write()
        plane.close()
    totals = aggregate.to_json()
    print(
        f"{aggregate.trials} trials ({state['done'] - len(previous.get('completed', []))} in this run of "
        f"{time.monotonic() - started:.0f} s): live_retired={totals['live_retired']} "
        f"double_retired={totals['double_retired']} dead_left_active={totals['dead_left_active']} "
        f"wrong_reason={totals['wrong_reason']} harness_errors={totals['harness_errors']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
