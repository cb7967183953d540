"""Retirement Events under bursts (coroner_operator.eventcorrelator): one Event each below the budget,
one aggregate per (namespace, reason, evidence) past it, every retirement counted exactly once, and
the number of Event writes bounded per namespace per window whatever the number of deaths."""

from __future__ import annotations

import datetime
import itertools
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coroner_operator.eventcorrelator import NAMES_SHOWN, EventCorrelator, Outgoing

pytestmark = pytest.mark.unit

T0 = datetime.datetime(2026, 11, 30, 18, 0, 0, tzinfo=datetime.UTC)
S = datetime.timedelta(seconds=1)


def body(namespace: str, name: str) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name, "uid": f"u-{name}", "resourceVersion": "7"}}


def observe(
    c: EventCorrelator, namespace: str, name: str, *, at: float, evidence: str = "PidfdExited"
) -> list[Outgoing]:
    return c.observe(
        involved=body(namespace, name), reason="Retired", evidence=evidence, message=f"{evidence}: {name}",
        now=T0 + at * S,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("deaths", "burst", "individual", "aggregates"),
    [
        pytest.param([("ns", 0.0)], 10, 1, {}, id="one-death-one-event"),
        pytest.param([("ns", i * 0.1) for i in range(10)], 10, 10, {}, id="at-the-budget-all-individual"),
        pytest.param([("ns", i * 0.01) for i in range(2000)], 10, 10, {("ns", "PidfdExited"): 1990}, id="mass-death"),
        pytest.param(
            [("a", i * 0.01) for i in range(15)] + [("b", i * 0.01) for i in range(3)], 10, 13,
            {("a", "PidfdExited"): 5}, id="budget-is-per-namespace",
        ),
        pytest.param(
            [("ns", float(i * 61)) for i in range(30)], 1, 30, {}, id="a-trickle-across-windows-is-never-combined",
        ),
        pytest.param([("ns", 0.0), ("ns", 1.0)], 0, 0, {("ns", "PidfdExited"): 2}, id="burst-0-always-combines"),
    ],
)  # fmt: skip
def test_individual_until_the_budget_then_one_aggregate_per_key(
    deaths: list[tuple[str, float]], burst: int, individual: int, aggregates: dict[tuple[str, str], int]
) -> None:
    c = EventCorrelator(burst=burst, window_seconds=60)
    out: list[Outgoing] = []
    for i, (namespace, at) in enumerate(deaths):
        out += observe(c, namespace, f"w{i}", at=at)
    out += c.flush()
    assert sum(1 for o in out if not o.aggregated) == individual
    assert {(o.key[0], o.key[2]): o.count for o in out if o.aggregated} == aggregates
    assert c.pending == 0


def test_similar_means_same_evidence_and_the_message_names_how_many_and_some_names() -> None:
    c = EventCorrelator(burst=1, window_seconds=60)
    out = observe(c, "ns", "first", at=0)
    for i in range(12):
        out += observe(c, "ns", f"p{i}", at=1 + i * 0.1)
    out += observe(c, "ns", "x0", at=3, evidence="ProcAbsent")
    assert c.pending == 13
    assert c.flush(now=T0 + 59 * S) == [], "the window has not ended"
    out += c.flush(now=T0 + 60 * S)
    by_evidence = {o.key[2]: o for o in out if o.aggregated}
    pidfd = by_evidence["PidfdExited"]
    assert (pidfd.count, pidfd.names) == (12, tuple(f"p{i}" for i in range(NAMES_SHOWN)))
    assert pidfd.involved["metadata"]["name"] == "p0", "an aggregate is about the first registration it combines"
    assert pidfd.message.startswith("PidfdExited: 12 more registrations retired in namespace ns within 60s")
    assert "combined from similar events" in pidfd.message and "p0, p1, p2, p3, p4 and 7 more" in pidfd.message
    assert (pidfd.first_time, pidfd.last_time) == (T0 + S, T0 + 2.1 * S)
    assert by_evidence["ProcAbsent"].count == 1 and by_evidence["ProcAbsent"].message.endswith(": x0")
    assert c.pending == 0


def test_the_next_event_after_the_window_gets_the_previous_aggregate_and_a_fresh_budget() -> None:
    c = EventCorrelator(burst=2, window_seconds=10)
    for i in range(5):
        observe(c, "ns", f"w{i}", at=i * 0.1)
    out = observe(c, "ns", "late", at=10)
    assert [(o.aggregated, o.count) for o in out] == [(True, 3), (False, 1)]
    assert out[1].window_start == T0 + 10 * S


@pytest.mark.parametrize(("burst", "window"), [(-1, 60.0), (10, 0.0), (10, -5.0)])
def test_nonsense_settings_are_refused(burst: int, window: float) -> None:
    with pytest.raises(ValueError):
        EventCorrelator(burst=burst, window_seconds=window)


deaths_strategy = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from(["PidfdExited", "ProcAbsent", "PidNamespaceRecreated", "BootBoundary"]),
        st.floats(min_value=0, max_value=30, allow_nan=False),  # seconds since the previous one
        st.booleans(),  # the flush tick runs right after this one
    ),
    max_size=300,
)


@settings(max_examples=200, deadline=None)
@given(deaths=deaths_strategy, burst=st.integers(min_value=0, max_value=12), window=st.sampled_from([1.0, 7.5, 60.0]))
def test_every_retirement_is_counted_exactly_once_and_writes_are_bounded(
    deaths: list[tuple[str, str, float, bool]], burst: int, window: float
) -> None:
    c = EventCorrelator(burst=burst, window_seconds=window)
    out: list[Outgoing] = []
    observed: Counter[tuple[str, str]] = Counter()
    now = T0
    for i, (namespace, evidence, gap, tick) in enumerate(deaths):
        now += gap * S
        observed[(namespace, evidence)] += 1
        out += c.observe(involved=body(namespace, f"w{i}"), reason="Retired", evidence=evidence, message="m", now=now)
        if tick:
            out += c.flush(now=now)
        assert c.pending + sum(o.count for o in out) == i + 1, "nothing dropped, nothing counted twice"
    out += c.flush()
    # Exactly once: individual Events (count 1) plus aggregate counts, per namespace and evidence.
    counted: Counter[tuple[str, str]] = Counter()
    for o in out:
        counted[(o.key[0], o.key[2])] += o.count
    assert counted == observed
    # Individual Events name distinct registrations; an aggregate's named ones were not posted alone.
    alone = [o.involved["metadata"]["name"] for o in out if not o.aggregated]
    combined = [n for o in out if o.aggregated for n in o.names]
    assert len(set(alone)) == len(alone) and not set(alone) & set(combined)
    # Bounded: per namespace window, at most `burst` individual writes and one aggregate per key.
    per_window: Counter[tuple[str, datetime.datetime, bool]] = Counter()
    per_key: Counter[tuple[tuple[str, str, str], datetime.datetime]] = Counter()
    for o in out:
        per_window[(o.key[0], o.window_start, o.aggregated)] += 1
        if o.aggregated:
            per_key[(o.key, o.window_start)] += 1
    assert all(n <= burst for (_, _, aggregated), n in per_window.items() if not aggregated)
    assert all(n == 1 for n in per_key.values())
    # ...and a namespace's windows never overlap (so any `window` seconds see at most two of them).
    for namespace in {o.key[0] for o in out}:
        starts = sorted({o.window_start for o in out if o.key[0] == namespace})
        assert all(b - a >= window * S for a, b in itertools.pairwise(starts))
