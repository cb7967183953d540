"""Batches of seeded trials: in this process, or spread over processes; mutants; replay.

`batch(seeds)` runs trials one after another in this process and returns a `Summary` (plain JSON
data, so that summaries from worker processes merge). `parallel(...)` splits a seed range into
chunks over a process pool. `hunt(mutant)` runs seeds from 0 until the first violation with the
mutant installed: its seeds-to-detection. A violating trial is printed with its seed and the one
command that replays it.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import multiprocessing
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from sim.mutants import ACTIVE, MUTANTS
from sim.prod import memo
from sim.trial import COUNTERS, FAULTS, Trial

REPLAY = ".venv/bin/python bench/sim.py --replay {seed}{mutant}"


def replay_command(seed: int, mutant: str | None = None) -> str:
    return REPLAY.format(seed=seed, mutant=f" --mutant {mutant}" if mutant else "")


#: A summary keeps the failures of the lowest seeds, this many (the counters count them all).
MAX_FAILURES = 50


def empty() -> dict[str, Any]:
    return {
        "trials": 0,
        "steps": 0,
        "seconds": 0.0,
        "cpu_seconds": 0.0,
        "violations": dict.fromkeys(COUNTERS, 0),
        "faults": dict.fromkeys(FAULTS, 0),
        "stats": {},
        "failures": [],
    }


def merge(into: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Add `other`'s counts to `into`. Order-free: merging chunks in any order (from any number of
    processes) gives the same totals, and the same failures (those of the lowest seeds)."""
    into["trials"] += other["trials"]
    into["steps"] += other["steps"]
    into["seconds"] = max(into["seconds"], other["seconds"])
    into["cpu_seconds"] = into.get("cpu_seconds", 0.0) + other.get("cpu_seconds", 0.0)
    for name in ("violations", "faults", "stats"):
        counter = Counter(into[name])
        counter.update(other[name])
        into[name] = dict(counter)
    failures = into["failures"] + other["failures"]
    failures.sort(key=lambda f: (f["seed"], f["counter"]))
    into["failures"] = failures[:MAX_FAILURES]
    return into


def totals(summary: dict[str, Any]) -> dict[str, Any]:
    """What must not depend on how a run was split or spread: everything but the timings."""
    return {k: v for k, v in summary.items() if k not in ("seconds", "cpu_seconds")}


@contextlib.contextmanager
def installed(*, memos: bool = True) -> Any:
    """With `memos`, the production memos of pure functions (`coroner.core.memo`) answer while the
    batch runs: the model API server's bodies are immutable and every component and oracle parses
    the very same objects, and the same /proc texts and instants recur on every probe and
    reconcile. Each trial empties them before it starts and after it ends, so a trial never sees an
    answer computed under another trial or mutant. Without, every call goes to the function (the
    two give the same totals: tests/sim/test_long_run.py)."""
    with memo.remembering() if memos else contextlib.nullcontext():
        yield


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


@contextlib.contextmanager
def _quiet() -> Any:
    """Coroner's logs off for a batch: what they say (a partitioned agent's failed renewals, a
    refused write) the trials' records say already, and a million trials would print it by the
    million. Restored on exit."""
    logger = logging.getLogger("coroner")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def collecting_between_trials() -> Any:
    """The cyclic garbage collector runs between trials, not during them.

    A trial is a web of reference cycles (components, closures and the trial point at each other)
    that only the cyclic collector frees; left to its thresholds it also walks the whole heap
    (pytest's included) again and again. Here what exists before the batch is frozen out of its
    sight, automatic collection is off, and `between()` lets go of the finished trial (the
    mutants' handle on it, the memos) and collects its garbage — a walk over that trial's objects
    only. Restored on exit."""

    finished = [0]

    def between() -> None:
        while ACTIVE:  # no local name may keep the finished trial alive through the collection
            ACTIVE.pop().loop.abandon()
        memo.forget()
        finished[0] += 1
        if finished[0] % 8 == 0:  # a collection has a fixed cost too: one per 8 trials' garbage
            gc.collect()

    enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield between
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


def batch(
    seeds: Iterable[int], *, mutant: str | None = None, stop_at_first: bool = False, memos: bool = True
) -> dict[str, Any]:
    summary = empty()
    started = time.perf_counter()
    cpu_started = time.process_time()
    with installed(memos=memos), _mutant(mutant), _quiet(), collecting_between_trials() as between:
        for seed in seeds:
            result = one(seed, mutant=mutant).result  # type: ignore[attr-defined]
            between()
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
    summary["cpu_seconds"] = time.process_time() - cpu_started
    return summary


def chunks(start: int, count: int, size: int) -> list[tuple[int, int]]:
    """The seed range start..start+count cut into ranges of `size` (the last one shorter): the unit
    of work handed to a process, and of a long run's record (what is done is a set of these)."""
    return [(s, min(s + size, start + count)) for s in range(start, start + count, size)]


def _chunk(args: tuple[int, int, str | None]) -> tuple[tuple[int, int], dict[str, Any]]:
    start, stop, mutant = args
    return (start, stop), batch(range(start, stop), mutant=mutant)


def _worker_init() -> None:
    # ^C and SIGTERM are the parent's to handle: it keeps what finished and ends the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def parallel(
    start: int,
    count: int,
    *,
    jobs: int | None = None,
    chunk: int = 2000,
    mutant: str | None = None,
    minutes: float | None = None,
    skip: Iterable[tuple[int, int]] = (),
    max_chunks: int | None = None,
    on_chunk: Callable[[tuple[int, int], dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """`count` trials from seed `start`, in chunks of `chunk` seeds over `jobs` processes (default:
    every CPU). The totals do not depend on `jobs` or on the order chunks finish in.

    A chunk in `skip` is not run (a resumed run's finished chunks). `on_chunk(range, summary)` is
    called as each chunk finishes. The run stops early — keeping every chunk finished by then and
    abandoning the rest — after `minutes`, after `max_chunks` chunks, or on ^C (KeyboardInterrupt);
    the summary's `trials` says how many ran."""
    jobs = jobs or os.cpu_count() or 1
    done = set(skip)
    tasks = [(a, b, mutant) for a, b in chunks(start, count, chunk) if (a, b) not in done]
    if max_chunks is not None:
        tasks = tasks[:max_chunks]
    summary = empty()
    started = time.perf_counter()
    deadline = None if minutes is None else started + minutes * 60

    def finished(rng: tuple[int, int], part: dict[str, Any]) -> bool:
        merge(summary, part)
        if on_chunk is not None:
            on_chunk(rng, part)
        return deadline is not None and time.perf_counter() > deadline

    try:
        if not tasks:
            # Nothing left (a finished run resumed): no pool. A pool terminated as soon as it had
            # started hung once, past the test's timeout, in a process that had run other tests.
            pass
        elif jobs == 1:
            for task in tasks:
                if finished(*_chunk(task)):
                    break
        else:
            context = multiprocessing.get_context("fork")
            with context.Pool(min(jobs, max(1, len(tasks))), initializer=_worker_init) as pool:
                try:
                    for rng, part in pool.imap_unordered(_chunk, tasks):
                        if finished(rng, part):
                            break
                finally:
                    pool.terminate()
    except KeyboardInterrupt:
        pass
    summary["seconds"] = time.perf_counter() - started
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
