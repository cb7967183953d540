"""What a benchmark reports: percentiles, the result file and its plot, and the per-registration
time line a watch feeds (Tracker, stages)."""

from __future__ import annotations

import contextlib
import datetime
import json
import pathlib
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from coroner.core import model
from harness.machine import RESULTS, command_line, log, machine_info, shown, versions


def percentiles(values_s: Sequence[float]) -> dict[str, Any]:
    """p50/p90/p99/max/min/mean in milliseconds (nearest-rank percentiles) and n."""
    values = sorted(v * 1000.0 for v in values_s)
    n = len(values)
    if n == 0:
        return {"p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None, "min_ms": None, "mean_ms": None, "n": 0}

    def rank(p: float) -> float:
        index = max(0, min(n - 1, int(-(-p * n // 100)) - 1))  # nearest rank: ceil(p/100 * n) - 1
        return round(values[index], 1)

    return {
        "p50_ms": rank(50),
        "p90_ms": rank(90),
        "p99_ms": rank(99),
        "max_ms": round(values[-1], 1),
        "min_ms": round(values[0], 1),
        "mean_ms": round(statistics.fmean(values), 1),
        "n": n,
    }


def new_result(benchmark: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """A result's opening: what ran, how, where, on what code, with which parameters."""
    return {
        "benchmark": benchmark,
        "command": command_line(),
        "machine": machine_info(),
        "versions": versions(),
        "parameters": parameters,
    }


def finish(name: str, result: dict[str, Any], *, started_wall: float, draw: Callable[[Any], None]) -> None:
    """Closes a result: its wall time and end, written, then its plot (`draw(plt)`) and, when drawn,
    written again naming the plot."""
    result["wall_seconds"] = round(time.time() - started_wall, 1)
    result["finished"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    write_result(name, result)
    result["plot"] = plot(name, draw)
    if result["plot"]:
        write_result(name, result)


def write_result(name: str, result: dict[str, Any]) -> pathlib.Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, sort_keys=False) + "\n")
    log(f"wrote {shown(path)}")
    return path


@contextlib.contextmanager
def written_if_stopped(name: str, result: dict[str, Any]) -> Iterator[None]:
    """A run that fails or is stopped still writes what it measured so far: `result` with
    `complete: false` and why (a run at the limit can take an hour and die at its end)."""
    try:
        yield
    except BaseException as exc:
        result["complete"] = False
        result["why_incomplete"] = f"{type(exc).__name__}: {exc}"[:2000]
        result["finished"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        write_result(name, result)
        raise


def plot(name: str, draw: Callable[[Any], None]) -> str | None:
    """Draws bench/results/<name>.png with matplotlib if installed; else says so and goes on."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no plot (install it with `.venv/bin/pip install matplotlib`)")
        return None
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.png"
    try:
        draw(plt)
        plt.savefig(path, dpi=110, bbox_inches="tight")
    finally:
        plt.close("all")
    log(f"wrote {shown(path)}")
    return str(shown(path))


def summarize(obj: dict[str, Any]) -> dict[str, Any]:
    """What the benchmarks track of one registration."""
    status = obj.get("status") or {}
    attestation = status.get("attestation") or {}
    retirable = next((c for c in status.get("conditions") or [] if c.get("type") == "Retirable"), {})
    return {
        "rv": (obj.get("metadata") or {}).get("resourceVersion"),
        "verdict": attestation.get("verdict"),
        "evidence": attestation.get("evidence"),
        "reason": retirable.get("reason"),
        "retired": "retirement" in status,
        "retired_reason": (status.get("retirement") or {}).get("reason"),
        "observed_time": attestation.get("observedTime"),
        "retired_time": (status.get("retirement") or {}).get("retiredTime"),
    }


#: time.time() - time.monotonic(): turns the wall-clock stamps Coroner writes (observedTime,
#: retiredTime; same machine, same clock) into the benchmark's monotonic time line.
WALL_OFFSET = time.time() - time.monotonic()


def stamp_to_monotonic(text: str | None) -> float | None:
    moment = model.parse_time(text) if text else None
    return None if moment is None else moment.timestamp() - WALL_OFFSET


def stages(tracker: Tracker, killed: dict[tuple[str, str], float]) -> dict[str, Any]:
    """Where the time goes, per kill: the agent's probe (attestation observedTime), the Dead
    attestation seen on the watch, the operator's retirement write (retiredTime), the retirement
    seen on the watch. Coroner's stamps are wall-clock times of this same machine."""
    probe, dead_seen, written, retired_seen = [], [], [], []
    with tracker.cond:
        for key, moment in killed.items():
            observed = tracker.dead_observed.get(key)
            if observed is not None:
                probe.append(observed - moment)
            if key in tracker.dead_at:
                dead_seen.append(tracker.dead_at[key] - moment)
            retired_time = stamp_to_monotonic((tracker.state.get(key) or {}).get("retired_time"))
            if retired_time is not None:
                written.append(retired_time - moment)
            if key in tracker.retired_at:
                retired_seen.append(tracker.retired_at[key] - moment)
    return {
        "kill_to_agent_probe": percentiles(probe),
        "kill_to_dead_attestation_seen": percentiles(dead_seen),
        "kill_to_retirement_write": percentiles(written),
        "kill_to_retired_seen": percentiles(retired_seen),
        "how": "agent probe = the Dead attestation's observedTime; retirement write = retirement.retiredTime "
        "(both written by Coroner with this machine's clock, which has 1 us resolution); 'seen' = arrival "
        "on the benchmark's watch",
    }


def all_alive(tracker: Tracker, keys: Iterable[tuple[str, str]]) -> bool:
    """Every one of `keys` attested Alive and decided PidAlive (call under `tracker.cond`)."""
    return all(
        (s := tracker.state.get(k)) is not None and s["verdict"] == "Alive" and s["reason"] == "PidAlive" for k in keys
    )


class Tracker:
    """Latest summary of every registration, fed by a Watch; wakes waiters on every event."""

    def __init__(self) -> None:
        self.state: dict[tuple[str, str], dict[str, Any]] = {}
        self.deleted: dict[tuple[str, str], float] = {}
        self.retired_at: dict[tuple[str, str], float] = {}
        self.dead_at: dict[tuple[str, str], float] = {}  # first Dead attestation seen
        self.dead_observed: dict[tuple[str, str], float] = {}  # its observedTime (monotonic)
        self.events = 0
        self.cond = threading.Condition()
        self.hooks: list[Callable[[str, dict[str, Any], float], None]] = []

    def on_event(self, kind: str, obj: dict[str, Any], arrived: float) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        for hook in self.hooks:
            hook(kind, obj, arrived)
        with self.cond:
            self.events += 1
            if kind == "DELETED":
                self.state.pop(key, None)
                self.deleted.setdefault(key, arrived)
            else:
                summary = summarize(obj)
                self.state[key] = summary
                if summary["retired"]:
                    self.retired_at.setdefault(key, arrived)
                if summary["verdict"] == "Dead" and key not in self.dead_at:
                    self.dead_at[key] = arrived
                    observed = stamp_to_monotonic(summary["observed_time"])
                    if observed is not None:
                        self.dead_observed[key] = observed
            self.cond.notify_all()

    def wait_until(self, predicate: Callable[[], bool], *, timeout: float, what: str, poll: float = 1.0) -> bool:
        """Waits (bounded) until predicate() holds; logs progress; False on timeout (never raises)."""
        deadline = time.monotonic() + timeout
        next_log = time.monotonic() + 15
        with self.cond:
            while True:
                if predicate():
                    return True
                now = time.monotonic()
                if now >= deadline:
                    log(f"gave up waiting for {what} after {timeout:.0f} s")
                    return False
                if now >= next_log:
                    log(f"still waiting for {what} ...")
                    next_log = now + 15
                self.cond.wait(timeout=min(poll, deadline - now))
