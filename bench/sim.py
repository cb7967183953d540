"""A million seeded trials of the deterministic simulation (tests/sim), and the mutants' seeds-to-detection.

    .venv/bin/python bench/sim.py                       # 1,000,000 trials over every CPU -> bench/results/sim.json
    .venv/bin/python bench/sim.py --resume              # continue the recorded run where it stopped
    .venv/bin/python bench/sim.py --trials 100000 --out /tmp/sim.json --no-mutants
    .venv/bin/python bench/sim.py --replay 1234         # one trial, its trace and its violations
    .venv/bin/python bench/sim.py --replay 15 --mutant retire_on_stale_cached_view

Every trial is a short seeded scenario (docs/simulation.md): a few workers on one or two nodes,
their agents, one or two operators, faults drawn from the seed (Sieve's three patterns among
them), the oracles checked at every step. A violation prints its seed and the one-line command
that replays it; the run exits 1.

A long run is resumable. The seed range is cut into chunks (`--chunk` seeds each); the record
(`--out`) is rewritten after every chunk that finishes, with the chunks done and the totals so
far, so the run can be stopped at any moment (^C, SIGTERM, `--minutes`, `--max-chunks`) losing only
the chunks under way, and `--resume` runs the chunks not done yet and adds them in. The totals do
not depend on how the run was split into sessions, nor on `--jobs`: an interrupted and resumed
run records what an unbroken one would. A resumed run must run seeds as the code that began it
did (the record names that code by the totals of seeds 0-99: a seed names a scenario only for
its generator); each session is recorded with its commit under `segments`.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import hashlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
# harness, also when this file is loaded by its path (tests/sim/test_long_run.py); appended, so that
# `sim` stays tests/sim and not this file.
sys.path.append(str(REPO / "bench"))

from harness.machine import machine_info  # noqa: E402

from sim import run  # noqa: E402
from sim.mutants import MUTANTS  # noqa: E402
from sim.trial import COUNTERS  # noqa: E402

#: Seeds each mutant is given to be caught in (the stated bound; tests/sim/test_sim.py asserts it).
MUTANT_LIMIT = 2000
#: HEAD when this run began (set by `main`).
COMMIT_AT_START = "unknown"
#: The seeds whose totals name the generator a record's seeds belong to (see `generator_hash`).
PROBE_SEEDS = range(100)


def _replay(seed: int, mutant: str | None, trace: bool, faults: tuple[str, ...] | None) -> int:
    with run.installed(), run._mutant(mutant):
        trial = run.one(seed, mutant=mutant, trace=True, faults=faults)
    result = trial.result  # type: ignore[attr-defined]
    print(f"seed {seed}: faults {list(result.faults)}, {result.steps} steps, mutant {mutant}")
    for worker in trial.workers:
        print(
            f"  {worker.name}: node {worker.node.name}, fate {worker.fate}, container {worker.container},"
            f" heartbeat {worker.heartbeat}"
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


@functools.cache
def generator_hash() -> str:
    """What this code makes of seeds 0-99: the hash of their totals, step for step. A seed names a
    scenario only for the code that generated it — the simulation's and the production code it
    drives — so a record is resumed only by code that runs these seeds the same way (a change
    that only makes the simulation faster keeps it; one that changes what a seed does, in the
    simulation or in production, does not)."""
    totals = run.totals(run.batch(PROBE_SEEDS))
    return hashlib.sha256(json.dumps(totals, sort_keys=True).encode()).hexdigest()[:16]


def _ranges(done: list[tuple[int, int]]) -> list[list[int]]:
    """Chunks done as a few [start, stop) ranges (adjacent chunks joined)."""
    out: list[list[int]] = []
    for a, b in sorted(done):
        if out and out[-1][1] == a:
            out[-1][1] = b
        else:
            out.append([a, b])
    return out


def _group(stats: dict[str, int], prefix: str) -> dict[str, int]:
    return {k[len(prefix) :]: v for k, v in sorted(stats.items()) if k.startswith(prefix)}


def document(record: dict[str, Any]) -> dict[str, Any]:
    """The JSON written: the headline numbers first, then the breakdowns, then what resuming needs."""
    summary = record["totals"]
    violations, stats = summary["violations"], summary["stats"]
    seconds = sum(s["seconds"] for s in record["segments"])
    trials = summary["trials"]
    return {
        "benchmark": "sim",
        "date": record["date"],
        "commit": record["segments"][-1]["commit"] if record["segments"] else None,
        "generator": record["generator"],
        "complete": trials == record["requested_trials"],
        "trials": trials,
        "steps": summary["steps"],
        **{counter: violations.get(counter, 0) for counter in COUNTERS},
        "requested_trials": record["requested_trials"],
        "first_seed": record["first_seed"],
        "seconds": round(seconds, 1),
        "trials_per_second": round(trials / seconds, 1) if seconds else None,
        "cpu_seconds": round(summary.get("cpu_seconds", 0.0), 1),
        "cpu_ms_per_trial": round(summary.get("cpu_seconds", 0.0) / trials * 1000, 2) if trials else None,
        "cpus": os.cpu_count(),
        "segments": record["segments"],
        "faults": summary["faults"],
        "sieve": {k: v for k, v in sorted(stats.items()) if k.startswith("sieve")},
        "fates": _group(stats, "fate:"),
        "verdicts": _group(stats, "verdict:"),
        "writes": _group(stats, "write:"),
        "stats": {k: v for k, v in sorted(stats.items()) if not k.startswith(("sieve", "fate:", "verdict:", "write:"))},
        "mutants": record["mutants"],
        "failures": summary["failures"],
        "chunk": record["chunk"],
        "done": _ranges(record["done"]),
        "totals": summary,
    }


def load(path: pathlib.Path) -> dict[str, Any]:
    """A record written by `document`, as `main` keeps it (the chunks done as (start, stop) pairs)."""
    doc = json.loads(path.read_text())
    if "totals" not in doc or "done" not in doc:
        raise SystemExit(f"{path}: not a resumable record (written before bench/sim.py --resume existed)")
    chunk, done = doc["chunk"], []
    for a, b in doc["done"]:
        done += [(s, min(s + chunk, b)) for s in range(a, b, chunk)]
    return {
        "date": doc["date"],
        "generator": doc["generator"],
        "requested_trials": doc["requested_trials"],
        "first_seed": doc["first_seed"],
        "chunk": chunk,
        "segments": doc["segments"],
        "mutants": doc["mutants"],
        "totals": doc["totals"],
        "done": done,
    }


def save(path: pathlib.Path, record: dict[str, Any]) -> None:
    """Write the record whole or not at all (a stop mid-write keeps the previous one)."""
    record["date"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document(record), indent=2) + "\n")
    os.replace(tmp, path)


def _stop_on_signals() -> None:
    """SIGINT and SIGTERM stop the run (the chunks finished are kept), even where the shell that
    started it in the background made SIGINT ignored."""

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)


def run_long(args: argparse.Namespace) -> dict[str, Any]:
    """Start or resume the recorded run; returns the record as it stands when this session stops."""
    out = pathlib.Path(args.out)
    generator = generator_hash()
    if args.resume and out.exists():
        record = load(out)
        args.seed = record["first_seed"] if args.seed is None else args.seed
        args.chunk = record["chunk"] if args.chunk is None else args.chunk
        if record["generator"] != generator:
            raise SystemExit(
                f"{out} was run by another simulation (generator {record['generator']}, this code's is {generator}:"
                " it runs seeds 0-99 otherwise), so its seeds name other scenarios here; start a new run"
                " without --resume"
            )
        if record["first_seed"] != args.seed or record["chunk"] != args.chunk:
            raise SystemExit(
                f"{out} runs seeds from {record['first_seed']} in chunks of {record['chunk']}:"
                f" resume with --seed {record['first_seed']} --chunk {record['chunk']}"
            )
        if args.trials < record["requested_trials"]:
            raise SystemExit(f"{out} asks for {record['requested_trials']} trials: resume with --trials >= that")
        if args.trials > record["requested_trials"] and record["requested_trials"] % record["chunk"]:
            # Its last chunk was cut short at the old end; extended, that chunk would be another one.
            raise SystemExit(
                f"{out} asks for {record['requested_trials']} trials, not a multiple of its chunk"
                f" {record['chunk']}: it can be resumed to that end, not extended"
            )
        record["requested_trials"] = args.trials
    else:
        args.seed = 0 if args.seed is None else args.seed
        args.chunk = 2000 if args.chunk is None else args.chunk
        record = {
            "date": "",
            "generator": generator,
            "requested_trials": args.trials,
            "first_seed": args.seed,
            "chunk": args.chunk,
            "segments": [],
            "mutants": [],
            "totals": run.empty(),
            "done": [],
        }
    if not args.no_mutants and not record["mutants"]:
        for name in MUTANTS:
            hunt = run.hunt(name, limit=args.mutant_limit)
            print(
                f"mutant {name}: caught={hunt['caught']} after {hunt['seeds_to_detection']} seeds by {hunt['oracle']}",
                flush=True,
            )
            record["mutants"].append(hunt)
    segment = {
        "commit": COMMIT_AT_START,  # the code that runs: read when it was loaded, not after the hunts
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "trials": 0,
        "seconds": 0.0,
        "jobs": args.jobs,
        "command": args.command,
        # The interpreter's build matters as much as the code: a PGO+LTO CPython runs a trial ~1.3x faster.
        "machine": machine_info() | {"interpreter": os.path.realpath(sys.executable)},
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
    }
    record["segments"].append(segment)
    started = time.perf_counter()

    def on_chunk(rng: tuple[int, int], part: dict[str, Any]) -> None:
        # A stop (^C, SIGTERM) waits until the chunk is both counted and marked done, and saved.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            _add(rng, part)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def _add(rng: tuple[int, int], part: dict[str, Any]) -> None:
        run.merge(record["totals"], part)
        record["done"].append(rng)
        segment["trials"] += part["trials"]
        segment["seconds"] = round(time.perf_counter() - started, 1)
        segment["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        save(out, record)
        total = record["totals"]["trials"]
        print(f"  {total} of {record['requested_trials']} trials ({rng[0]}..{rng[1] - 1} done)", flush=True)

    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    _stop_on_signals()
    try:
        summary = run.parallel(
            args.seed,
            args.trials,
            jobs=args.jobs,
            chunk=args.chunk,
            minutes=args.minutes,
            skip=list(record["done"]),
            max_chunks=args.max_chunks,
            on_chunk=on_chunk,
        )
    finally:
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])
    segment["seconds"] = round(time.perf_counter() - started, 1)
    segment["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    save(out, record)
    print(f"this session: {summary['trials']} trials in {summary['seconds']:.0f}s")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=1_000_000)
    parser.add_argument(
        "--seed", type=int, default=None, help="First seed (trial i runs seed + i); 0, or the record's."
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--chunk",
        type=int,
        default=None,
        help="Seeds per chunk: a worker's task, a record's unit (2000, or the record's).",
    )
    parser.add_argument("--minutes", type=float, default=None, help="Wall-time budget: keep the chunks done by then.")
    parser.add_argument("--max-chunks", type=int, default=None, help="Stop after this many chunks this session.")
    parser.add_argument("--resume", action="store_true", help="Continue the run recorded in --out.")
    parser.add_argument("--mutant-limit", type=int, default=MUTANT_LIMIT)
    parser.add_argument("--no-mutants", action="store_true")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "sim.json"))
    parser.add_argument("--replay", type=int, default=None, help="Run one trial with this seed, print it.")
    parser.add_argument("--mutant", choices=sorted(MUTANTS), default=None, help="With --replay: install this mutant.")
    parser.add_argument("--trace", action="store_true", help="With --replay: print every write and exit.")
    parser.add_argument(
        "--faults", default=None, help="With --replay: these faults (comma-separated) instead of the seed's draw."
    )
    args = parser.parse_args(argv)
    args.command = " ".join(["bench/sim.py", *(sys.argv[1:] if argv is None else argv)])
    global COMMIT_AT_START
    COMMIT_AT_START = _git_commit()
    if args.replay is not None:
        faults = None if args.faults is None else tuple(f for f in args.faults.split(",") if f)
        return _replay(args.replay, args.mutant, args.trace, faults)

    record = run_long(args)
    summary = record["totals"]
    run.report({**summary, "seconds": sum(s["seconds"] for s in record["segments"])})
    print(f"wrote {args.out}: {summary['trials']} of {record['requested_trials']} trials done")
    violations = summary["violations"]
    uncaught = [m["mutant"] for m in record["mutants"] if not m["caught"]]
    if uncaught:
        print(f"mutants not caught within {args.mutant_limit} seeds: {uncaught}")
    return 1 if any(violations.get(c, 0) for c in COUNTERS) or uncaught else 0


if __name__ == "__main__":
    sys.exit(main())
