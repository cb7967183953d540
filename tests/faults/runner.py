"""Choosing fault mixes, running trials back to back on one plane, and adding up the results.

Lanes run trials concurrently on disjoint nodes. A trial with a cluster-wide fault runs alone
(exclusive), except a *shared round*: when a group of `lanes` consecutive trials draws an API
server restart or a watch expiry (faults with `shared_round`), every trial of the group carries it
(one variant for the group), the group runs at once, one trial per lane, and one injection serves
all of them (`Round`): one restart, `lanes` trials' worth of checks (`plan_round`).
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from faults.plane import Plane
from faults.trial import BOUND, COUNTERS, FAULTS, MASS_BOUND, Trial, TrialResult

#: How often each fault is drawn relative to the others (500 deaths take ~2 minutes here).
WEIGHTS = {name: 1.0 for name in FAULTS if name not in ("none", "selftest")} | {"mass_death": 0.05}
#: Pairs of faults that cannot share a trial: both restart the API server; or one needs a view the
#: other resets (a restarted operator or a relisting agent sees the present, not the withheld past;
#: a revoked grant means no retirement is tried on the stale view); or both kill the operator.
_RESETS_OPERATOR_VIEW = (
    "operator_sigkill",
    "two_operators",
    "leader_kill",
    "apiserver_restart",
    "watch_expiry",
    "crash_after_write",
)
EXCLUSIVE = [
    {"apiserver_restart", "watch_expiry"},
    *({view, other} for view in ("stale_view_operator", "unobserved_operator") for other in _RESETS_OPERATOR_VIEW),
    *(
        {view, other}
        for view in ("stale_view_agent", "unobserved_agent")
        for other in ("apiserver_restart", "watch_expiry")
    ),
    {"stale_view_operator", "grant_revoked"},
    {"crash_after_write", "operator_sigkill"},
    {"crash_after_write", "two_operators"},
    *({"leader_kill", other} for other in ("operator_sigkill", "two_operators", "crash_after_write")),
]


def choose_faults(rng: random.Random, *, nodes: int, max_faults: int = 3) -> list[str]:
    """0-3 distinct faults, node-local ones at most one per node, exclusive pairs never together."""
    count = rng.choices([0, 1, 2, 3], weights=[0.1, 0.45, 0.3, 0.15])[0]
    count = min(count, max_faults)
    names = list(WEIGHTS)
    chosen: list[str] = []
    for _ in range(50):
        if len(chosen) >= count:
            break
        name = rng.choices(names, weights=[WEIGHTS[n] for n in names])[0]
        if name in chosen:
            continue
        if any(name in pair and pair & set(chosen) for pair in EXCLUSIVE):
            continue
        local = sum(1 for f in chosen if FAULTS[f].node_local)
        if FAULTS[name].node_local and local >= nodes:
            continue
        chosen.append(name)
    return chosen


def shared(name: str) -> bool:
    return FAULTS[name.partition(":")[0]].shared_round


def group_members(index: int, segments: list[tuple[int, int]]) -> list[int]:
    """The indexes of the group of consecutive trials that trial `index` is in. `segments` is the
    run's history of --lanes: (first index, lanes) pairs in order, the first at 0; a segment's
    groups are `lanes` consecutive indexes from its first, and its last group ends where the next
    segment begins. A run resumed with other --lanes thus keeps every earlier group as it was."""
    firsts = [first for first, _ in segments]
    if not segments or firsts[0] != 0 or firsts != sorted(set(firsts)) or min(n for _, n in segments) < 1:
        raise ValueError(f"lane segments must begin at index 0, ascend, and have lanes >= 1: {segments!r}")
    position = max(i for i, (first, _) in enumerate(segments) if first <= index)
    first, lanes = segments[position]
    end = segments[position + 1][0] if position + 1 < len(segments) else None
    start = first + (index - first) // lanes * lanes
    stop = start + lanes if end is None else min(start + lanes, end)
    return list(range(start, stop))


def plan_round(drawn: list[list[str]], rng: random.Random) -> tuple[str | None, list[list[str]]]:
    """A group of consecutive trials' drawn faults -> (the group's shared-round fault spec or None,
    each trial's faults). With one: every trial carries it (the variant drawn by `rng`, the group's),
    and drops what cannot run beside it: its own shared faults, other cluster-wide faults (they need
    the plane alone) and faults exclusive with it. Without: the draws unchanged."""
    name = next((f for faults in drawn for f in faults if shared(f)), None)
    if name is None:
        return None, drawn
    name = name.partition(":")[0]
    spec = f"{name}:{rng.choice(FAULTS[name].variants)}"
    lists = []
    for faults in drawn:
        kept = [
            f
            for f in faults
            if not FAULTS[f.partition(":")[0]].cluster_wide
            and not any({name, f.partition(":")[0]} <= pair for pair in EXCLUSIVE)
        ]
        lists.append([*kept, spec])
    return spec, lists


class Round:
    """The trials of one shared round: each calls `together(key, contribution, action)` at the
    same point of its run; when all have arrived, `action` runs once with every contribution and
    each gets its result. A member that leaves (its trial ended, or failed before arriving) breaks
    the points not yet reached, so that no member waits for it forever."""

    def __init__(self, parties: int, *, timeout: float = 900.0) -> None:
        self.parties = parties
        self.timeout = timeout
        self._lock = threading.Lock()
        self._points: dict[str, tuple[threading.Barrier, list[Any]]] = {}
        self._results: dict[str, Any] = {}
        self._broken = False

    def together(self, key: str, contribution: Any, action: Callable[[list[Any]], Any]) -> Any:
        with self._lock:
            if self._broken:
                raise RuntimeError(f"shared round: a member left before {key}")
            point = self._points.get(key)
            if point is None:
                contributions: list[Any] = []

                def run(key: str = key, contributions: list[Any] = contributions) -> None:
                    try:
                        self._results[key] = action(list(contributions))
                    except Exception as exc:  # every member sees it, none is left waiting
                        self._results[key] = exc

                point = (threading.Barrier(self.parties, action=run, timeout=self.timeout), contributions)
                self._points[key] = point
            point[1].append(contribution)
        point[0].wait()
        result = self._results[key]
        if isinstance(result, Exception):
            raise RuntimeError(f"shared round: {key} failed: {result!r}") from result
        return result

    def leave(self) -> None:
        with self._lock:
            self._broken = True
            for barrier, _ in self._points.values():
                barrier.abort()


def run_one(
    plane: Plane,
    *,
    seed: int,
    faults: list[str],
    index: int,
    mass_count: int,
    pool: list[str] | None = None,
    restart: bool = True,
    shared_round: Round | None = None,
    **options: Any,
) -> TrialResult:
    """One trial; a harness error is recorded in the result (not raised), and the plane is healed.

    `restart`: restart the operator afterwards when the trial found a violation or a harness error
    (so that one trial's damage is not charged to the next); a lane runner passes False and does it
    itself once no other trial is running. An API server restart alone is no reason: the operator
    must ride it out (docs/faults.md, finding 1), and the next trials check that it did.
    """
    trial = Trial(
        plane,
        seed=seed,
        faults=faults,
        index=index,
        mass_count=mass_count,
        pool=pool,
        shared_round=shared_round,
        **options,
    )
    try:
        result = trial.run()
    except Exception as exc:
        result = trial.result
        result.labels = result.labels or list(faults) or ["none"]
        result.counts["harness_errors"] += 1
        result.violations.append(
            {
                "counter": "harness_errors",
                "detail": f"{exc!r} {str(getattr(exc, 'body', '') or '')[:600]}".strip(),
                "seed": seed,
                "faults": result.labels,
                "traceback": traceback.format_exc()[-2000:],
                "timeline": trial.timeline[-30:],
            }
        )
    if restart and needs_operator_restart(result):
        restart_operator(plane)
    return result


def needs_operator_restart(result: TrialResult) -> bool:
    return not result.ok or bool(result.counts["harness_errors"])


def cluster_wide(faults: list[str]) -> bool:
    return any(FAULTS[f.partition(":")[0]].cluster_wide for f in faults)


class Gate:
    """Shared for ordinary trials (one per lane), exclusive for trials with a cluster-wide fault."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._waiting = 0

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._writer or self._waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


Item = tuple[int, int, list[str]]


def run_round(plane: Plane, members: list[Item], *, pools: list[list[str]], mass_count: int) -> list[TrialResult]:
    """The trials of one shared round at once, member k on pools[k]; the plane is theirs alone."""
    shared_round = Round(len(members))
    results: list[TrialResult | None] = [None] * len(members)

    def member(k: int) -> None:
        index, seed, faults = members[k]
        results[k] = run_one(
            plane,
            seed=seed,
            faults=faults,
            index=index,
            mass_count=mass_count,
            pool=pools[k],
            restart=False,
            shared_round=shared_round,
        )

    threads = [threading.Thread(target=member, args=(k,), name=f"round-{k}", daemon=True) for k in range(len(members))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done = [r for r in results if r is not None]
    if len(done) != len(members):
        raise RuntimeError("a trial of a shared round ended without a result")
    if any(needs_operator_restart(r) for r in done):
        restart_operator(plane)
    return done


def run_lanes(
    plane: Plane,
    *,
    lanes: int,
    next_trial: Callable[[], Item | list[Item] | None],
    on_result: Callable[[int, TrialResult], None],
    mass_count: int,
    stop: Callable[[], None] | None = None,
) -> None:
    """Runs trials from `next_trial` in `lanes` threads; lane i owns nodes i*k..i*k+k-1 (k = nodes /
    lanes) for ordinary trials. A trial with a cluster-wide fault waits until it runs alone, over
    every node. `next_trial` returns (index, seed, faults), a list of those (a shared round: run
    together, one per lane's nodes, alone on the plane), or None when done."""
    names = list(plane.agents)
    size = len(names) // lanes
    pools = [names[i * size : (i + 1) * size] for i in range(lanes)]
    gate = Gate()
    errors: list[BaseException] = []

    def lane(pool: list[str]) -> None:
        try:
            while (item := next_trial()) is not None:
                if isinstance(item, list):
                    with gate.exclusive():
                        results = run_round(plane, item, pools=pools, mass_count=mass_count)
                    for (index, _, _), result in zip(item, results, strict=True):
                        on_result(index, result)
                    continue
                index, seed, faults = item
                if cluster_wide(faults):
                    with gate.exclusive():
                        result = run_one(plane, seed=seed, faults=faults, index=index, mass_count=mass_count)
                else:
                    with gate.shared():
                        result = run_one(
                            plane, seed=seed, faults=faults, index=index, mass_count=mass_count, pool=pool,
                            restart=False,
                        )  # fmt: skip
                    if needs_operator_restart(result):
                        with gate.exclusive():
                            restart_operator(plane)
                on_result(index, result)
        except BaseException as exc:
            errors.append(exc)
            raise

    threads = [
        threading.Thread(target=lane, args=(pool,), name=f"lane-{i}", daemon=True) for i, pool in enumerate(pools)
    ]
    for thread in threads:
        thread.start()
    try:
        while any(thread.is_alive() for thread in threads):
            for thread in threads:
                thread.join(timeout=0.5)
    except KeyboardInterrupt:
        # Let every lane finish (and heal) the trial it is in before the caller stops the plane.
        if stop is not None:
            stop()
        for thread in threads:
            thread.join(timeout=300)
        raise
    if errors:
        raise errors[0]


def restart_operator(plane: Plane) -> None:
    for operator in plane.operators:
        operator.stop()
    plane.operators = []
    plane.start_operator()
    deadline = time.monotonic() + 60
    while "operator started" not in plane.operator.log.read_text(errors="replace"):
        if time.monotonic() > deadline:
            raise RuntimeError("the operator did not start again")
        time.sleep(0.1)


class Aggregate:
    """Totals over trials, overall and per fault (a trial counts once under each of its faults)."""

    def __init__(self) -> None:
        self.trials = 0
        self.totals: Counter[str] = Counter()
        self.per_fault: dict[str, dict[str, Any]] = {}
        self.violations: list[dict[str, Any]] = []
        self.latencies: list[float] = []
        self.retired_by: Counter[str] = Counter()
        self.notes: Counter[str] = Counter()
        self.facts: dict[str, Counter[str]] = {}
        self.reasons: dict[str, Counter[str]] = {"final": Counter(), "live": Counter()}
        self.deaths = 0
        self.workers = 0
        self.seconds = 0.0
        self.phases: Counter[str] = Counter()

    def add(self, result: TrialResult) -> None:
        self.trials += 1
        self.deaths += result.deaths
        self.workers += result.workers
        self.seconds += result.seconds
        self.phases.update(result.phases)
        for key, value in result.counts.items():
            self.totals[key] += value
        self.latencies.extend(result.latencies)
        self.retired_by.update(result.evidence.get("retired_by", Counter()))
        self.notes.update(result.evidence.get("notes", Counter()))
        for key in ("final", "live"):
            self.reasons[key].update(result.reasons.get(key, Counter()))
        for violation in result.violations:
            if len(self.violations) < 200:
                self.violations.append(violation)
        labels = result.labels or ["none"]
        for label in labels:
            name, _, variant = label.partition("[")
            entry = self.per_fault.setdefault(
                name,
                {
                    "trials": 0,
                    "alone": 0,
                    **{c: 0 for c in (*COUNTERS, "harness_errors")},
                    "reasons": Counter(),
                    "variants": Counter(),
                },
            )
            entry["trials"] += 1
            entry["alone"] += len(labels) == 1
            if variant:
                entry["variants"][variant.rstrip("]")] += 1
            for key, value in result.counts.items():
                entry[key] = entry.get(key, 0) + value
            for reason, count in result.reasons.get(name, Counter()).items():
                entry["reasons"][reason] += count
            self._facts(name, result.facts.get(label) or {})

    def state(self) -> dict[str, Any]:
        """Everything needed to continue adding to these totals in another process (a resumed run).
        Latencies are kept as a histogram of 10 ms steps: bounded in size however long the run."""
        return {
            "trials": self.trials,
            "totals": dict(self.totals),
            "per_fault": {
                name: {k: (dict(v) if isinstance(v, Counter) else v) for k, v in entry.items()}
                for name, entry in self.per_fault.items()
            },
            "violations": self.violations,
            "latency_histogram_10ms": dict(Counter(f"{x:.2f}" for x in self.latencies)),
            "retired_by": dict(self.retired_by),
            "notes": dict(self.notes),
            "facts": {name: dict(bucket) for name, bucket in self.facts.items()},
            "reasons": {key: dict(counter) for key, counter in self.reasons.items()},
            "deaths": self.deaths,
            "workers": self.workers,
            "seconds": self.seconds,
            "phases": dict(self.phases),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Aggregate:
        self = cls()
        self.trials = int(state["trials"])
        self.totals = Counter(state["totals"])
        self.per_fault = {
            name: {k: (Counter(v) if k in ("reasons", "variants") else v) for k, v in entry.items()}
            for name, entry in state["per_fault"].items()
        }
        self.violations = list(state["violations"])
        self.latencies = [float(x) for x, n in state["latency_histogram_10ms"].items() for _ in range(int(n))]
        self.retired_by = Counter(state["retired_by"])
        self.notes = Counter(state["notes"])
        self.facts = {name: Counter(bucket) for name, bucket in state["facts"].items()}
        self.reasons = {key: Counter(counter) for key, counter in state["reasons"].items()}
        self.deaths, self.workers, self.seconds = int(state["deaths"]), int(state["workers"]), float(state["seconds"])
        self.phases = Counter(state.get("phases", {}))
        return self

    def _facts(self, name: str, facts: dict[str, Any]) -> None:
        """Fault-specific evidence, summed: 410s seen, CAS conflicts, lease forgeries, ..."""
        bucket = self.facts.setdefault(name, Counter())
        for key, value in facts.items():
            if isinstance(value, bool):
                bucket[f"{key}={value}"] += 1
            elif isinstance(value, int | float) and key not in ("pid", "reuser_start", "victim_start"):
                bucket[key] += value
            elif isinstance(value, dict) and key == "gone_410":
                bucket["gone_410_operator"] += value.get("operator", 0)
                bucket["gone_410_agents"] += sum(v for k, v in value.items() if k != "operator")
            elif key == "retirement" and value:
                bucket[f"retired_by_{value}"] += 1

    def to_json(self) -> dict[str, Any]:
        lat = sorted(self.latencies)

        def q(p: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(p * (len(lat) - 1)))], 3) if lat else None

        return {
            "trials": self.trials,
            "live_retired": self.totals["live_retired"],
            "double_retired": self.totals["double_retired"],
            "dead_left_active": self.totals["dead_left_active"],
            "bad_provenance": self.totals["bad_provenance"],
            "admission_breaches": self.totals["admission_breaches"],
            "retired_without_grant": self.totals["retired_without_grant"],
            "wrong_reason": self.totals["wrong_reason"],
            "not_injected": self.totals["not_injected"],
            "harness_errors": self.totals["harness_errors"],
            "workers": self.workers,
            "deaths": self.deaths,
            "trial_seconds_mean": round(self.seconds / self.trials, 2) if self.trials else None,
            "phase_seconds_mean": {k: round(v / self.trials, 2) for k, v in self.phases.items()} if self.trials else {},
            "bounds_seconds": {"dead_retired": BOUND, "mass_death_retired": MASS_BOUND},
            "kill_to_retired_seconds": {
                "n": len(lat),
                "p50": q(0.5),
                "p90": q(0.9),
                "p99": q(0.99),
                "max": lat[-1] if lat else None,
            },
            "retired_by_evidence": dict(self.retired_by),
            "reasons_after_heal": dict(self.reasons["final"]),
            "reasons_of_live_workers": dict(self.reasons["live"]),
            "notes": dict(self.notes),
            "per_fault": {
                name: {
                    **{k: (dict(v) if isinstance(v, Counter) else v) for k, v in entry.items()},
                    "facts": dict(self.facts.get(name, {})),
                }
                for name, entry in sorted(self.per_fault.items())
            },
            "violations": self.violations,
        }
