"""A million seeded trials of the deterministic simulation (tests/sim), and the mutants' seeds-to-detection.

    .venv/bin/python bench/sim.py                       # 1,000,000 trials over every CPU -> bench/results/sim.json
    .venv/bin/python bench/sim.py --trials 100000       # the CI size
    .venv/bin/python bench/sim.py --replay 1234         # one trial, its trace and its violations
    .venv/bin/python bench/sim.py --replay 15 --mutant retire_on_stale_cached_view

Every trial is a short seeded scenario (docs/simulation.md): a few workers on one or two nodes,
their agents, one or two operators, faults drawn from the seed (Sieve's three patterns among
them), the oracles checked at every step. A violation prints its seed and the one-line command
that replays it; the run exits 1.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from sim import run  # noqa: E402
from sim.mutants import MUTANTS  # noqa: E402
from sim.trial import COUNTERS  # noqa: E402

#: Seeds each mutant is given to be caught in (the stated bound; tests/sim/test_sim.py asserts it).
MUTANT_LIMIT = 2000


def _replay(seed: int, mutant: str | None, trace: bool, faults: tuple[str, ...] | None) -> int:
    with run.installed(), run._mutant(mutant):
        trial = run.one(seed, mutant=mutant, trace=True, faults=faults)
    result = trial.result  # type: ignore[attr-defined]
    print(f"seed {seed}: faults {list(result.faults)}, {result.steps} steps, mutant {mutant}")
    for worker in trial.workers:
        print(
            f"  {worker.name}: node {worker.node.name}, fate {worker.fate}, pid ns {worker.ns}, heartbeat {worker.heartbeat}"
        )
    if trace:
        for line in trial.trace or []:
            print(line)
    for counter, detail, at in result.violations:
        print(f"VIOLATION at {at}s: {counter}: {detail}")
    return 1 if result.violations else 0


def _git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0, help="First seed (trial i runs seed + i).")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--chunk", type=int, default=2000, help="Trials per task handed to a worker process.")
    parser.add_argument("--minutes", type=float, default=None, help="Wall-time budget: keep the chunks done by then.")
    parser.add_argument("--mutant-limit", type=int, default=MUTANT_LIMIT)
    parser.add_argument("--no-mutants", action="store_true")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "sim.json"))
    parser.add_argument("--replay", type=int, default=None, help="Run one trial with this seed, print it.")
    parser.add_argument("--mutant", choices=sorted(MUTANTS), default=None, help="With --replay: install this mutant.")
    parser.add_argument("--trace", action="store_true", help="With --replay: print every write and exit.")
    parser.add_argument(
        "--faults", default=None, help="With --replay: these faults (comma-separated) instead of the seed's draw."
    )
    args = parser.parse_args()
    if args.replay is not None:
        faults = None if args.faults is None else tuple(f for f in args.faults.split(",") if f)
        return _replay(args.replay, args.mutant, args.trace, faults)

    load_before = os.getloadavg()
    commit = _git_commit()  # the code that runs: read before the run, not after it
    started = time.time()
    mutants = []
    if not args.no_mutants:
        for name in MUTANTS:
            hunt = run.hunt(name, limit=args.mutant_limit)
            print(
                f"mutant {name}: caught={hunt['caught']} after {hunt['seeds_to_detection']} seeds by {hunt['oracle']}",
                flush=True,
            )
            mutants.append(hunt)
    summary = run.parallel(args.seed, args.trials, jobs=args.jobs, chunk=args.chunk, minutes=args.minutes)
    run.report(summary)
    load_after = os.getloadavg()
    violations = summary["violations"]
    document = {
        "benchmark": "sim",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "trials": summary["trials"],
        "steps": summary["steps"],
        **{counter: violations.get(counter, 0) for counter in COUNTERS},
        "seconds": round(summary["seconds"], 1),
        "trials_per_second": round(summary["trials"] / summary["seconds"], 1) if summary["seconds"] else None,
        "jobs": args.jobs,
        "cpus": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "first_seed": args.seed,
        "requested_trials": args.trials,
        "minutes_budget": args.minutes,
        "faults": summary["faults"],
        "sieve": {k: v for k, v in sorted(summary["stats"].items()) if k.startswith("sieve")},
        "fates": {k[5:]: v for k, v in sorted(summary["stats"].items()) if k.startswith("fate:")},
        "verdicts": {k[8:]: v for k, v in sorted(summary["stats"].items()) if k.startswith("verdict:")},
        "writes": {k[6:]: v for k, v in sorted(summary["stats"].items()) if k.startswith("write:")},
        "stats": {
            k: v
            for k, v in sorted(summary["stats"].items())
            if not k.startswith(("sieve", "fate:", "verdict:", "write:"))
        },
        "mutants": mutants,
        "failures": summary["failures"],
        "wall_seconds": round(time.time() - started, 1),
    }
    pathlib.Path(args.out).write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {args.out}")
    uncaught = [m["mutant"] for m in mutants if not m["caught"]]
    if uncaught:
        print(f"mutants not caught within {args.mutant_limit} seeds: {uncaught}")
    return 1 if any(violations.get(c, 0) for c in COUNTERS) or uncaught else 0


if __name__ == "__main__":
    sys.exit(main())
