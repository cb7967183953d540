"""Batches of seeded trials: in this process, or spread over processes; mutants; replay.

`batch(seeds)` runs trials one after another in this process and returns a `Summary` (plain JSON
data, so that summaries from worker processes merge). `parallel(...)` splits a seed range into
chunks over a process pool. `hunt(mutant)` runs seeds from 0 until the first violation with the
mutant installed: its seeds-to-detection. A violating trial is printed with its seed and the one
command that replays it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

from sim.clock import installed
from sim.mutants import ACTIVE, MUTANTS
from sim.trial import COUNTERS, FAULTS, Trial

REPLAY = ".venv/bin/python bench/sim.py --replay {seed}{mutant}"


def replay_command(seed: int, mutant: str | None = None) -> str:
    return REPLAY.format(seed=seed, mutant=f" --mutant {mutant}" if mutant else "")


def empty() -> dict[str, Any]:
    return {
        "trials": 0,
        "steps": 0,
        "seconds": 0.0,
        "violations": dict.fromkeys(COUNTERS, 0),
        "faults": dict.fromkeys(FAULTS, 0),
        "stats": {},
        "failures": [],
    }


def merge(into: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    into["trials"] += other["trials"]
    into["steps"] += other["steps"]
    into["seconds"] = max(into["seconds"], other["seconds"])
    for name in ("violations", "faults", "stats"):
        counter = Counter(into[name])
        counter.update(other[name])
        into[name] = dict(counter)
    into["failures"] = (into["failures"] + other["failures"])[:50]
    return into


@contextlib.contextmanager
def _mutant(name: str | None) -> Any:
    if name is None:
        yield
        return
    with MUTANTS[name][0]():
        yield


def one(seed: int, *, mutant: str | None = None, trace: bool = False, faults: tuple[str, ...] | None = None) -> Trial:
    """Run one trial (inside the simulation's clock and the mutant, if any); returns it, executed."""
    trial = Trial(seed, trace=trace, faults=faults)
    ACTIVE[:] = [trial]
    trial.result = trial.execute()  # type: ignore[attr-defined]
    return trial


def batch(seeds: Iterable[int], *, mutant: str | None = None, stop_at_first: bool = False) -> dict[str, Any]:
    summary = empty()
    started = time.perf_counter()
    with installed(), _mutant(mutant):
        for seed in seeds:
            trial = one(seed, mutant=mutant)
            result = trial.result  # type: ignore[attr-defined]
            summary["trials"] += 1
            summary["steps"] += result.steps
            stats = summary["stats"]
            for key, value in result.stats.items():
                if key.startswith("fault:"):
                    summary["faults"][key[6:]] += value
                else:
                    stats[key] = stats.get(key, 0) + value
            if result.violations:
                for counter, _detail, _at in result.violations:
                    summary["violations"][counter] = summary["violations"].get(counter, 0) + 1
                counter, detail, at = result.violations[0]
                summary["failures"].append(
                    {
                        "seed": seed,
                        "counter": counter,
                        "detail": detail[:400],
                        "at": at,
                        "faults": list(result.faults),
                        "replay": replay_command(seed, mutant),
                    }
                )
                if stop_at_first:
                    break
    summary["seconds"] = time.perf_counter() - started
    return summary


def _chunk(args: tuple[int, int, str | None]) -> dict[str, Any]:
    start, stop, mutant = args
    return batch(range(start, stop), mutant=mutant)


def parallel(
    start: int,
    count: int,
    *,
    jobs: int | None = None,
    chunk: int = 2000,
    mutant: str | None = None,
    minutes: float | None = None,
) -> dict[str, Any]:
    """`count` trials from seed `start`, over `jobs` processes (default: every CPU).

    With `minutes`, chunks finished by then are kept and the rest abandoned (the summary says how
    many trials ran: seeds start..start+count, minus the unfinished chunks)."""
    jobs = jobs or os.cpu_count() or 1
    tasks = [(s, min(s + chunk, start + count), mutant) for s in range(start, start + count, chunk)]
    summary = empty()
    started = time.perf_counter()
    deadline = None if minutes is None else started + minutes * 60
    if jobs == 1:
        for task in tasks:
            merge(summary, _chunk(task))
            if deadline is not None and time.perf_counter() > deadline:
                break
    else:
        context = multiprocessing.get_context("fork")
        with context.Pool(jobs) as pool:
            for part in pool.imap_unordered(_chunk, tasks):
                merge(summary, part)
                if deadline is not None and time.perf_counter() > deadline:
                    pool.terminate()
                    break
    summary["seconds"] = time.perf_counter() - started
    summary["failures"].sort(key=lambda f: f["seed"])
    return summary


def hunt(mutant: str, *, limit: int, start: int = 0) -> dict[str, Any]:
    """Seeds from `start` until the mutant is caught: how many it took, and by which oracle."""
    summary = batch(range(start, start + limit), mutant=mutant, stop_at_first=True)
    first = summary["failures"][0] if summary["failures"] else None
    return {
        "mutant": mutant,
        "breaks": MUTANTS[mutant][1],
        "expected_oracle": MUTANTS[mutant][2],
        "caught": first is not None,
        "seeds_to_detection": summary["trials"] if first is not None else None,
        "limit": limit,
        "seed": None if first is None else first["seed"],
        "oracle": None if first is None else first["counter"],
        "detail": None if first is None else first["detail"],
        "replay": None if first is None else first["replay"],
    }


def report(summary: dict[str, Any], *, out: Any = sys.stdout) -> None:
    rate = summary["trials"] / summary["seconds"] if summary["seconds"] else 0.0
    print(
        f"{summary['trials']} trials, {summary['steps']} steps, {summary['seconds']:.1f}s ({rate:.0f} trials/s); "
        f"violations: {summary['violations']}",
        file=out,
    )
    for failure in summary["failures"][:10]:
        print(f"  seed {failure['seed']}: {failure['counter']}: {failure['detail']}", file=out)
        print(f"    replay: {failure['replay']}", file=out)
