"""The fault run's totals survive a stop: a resumed long run adds to exactly what the last one had."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from faults.runner import Aggregate
from faults.trial import TrialResult

pytestmark = pytest.mark.unit


def result(seed: int, labels: list[str], latencies: list[float], **counts: int) -> TrialResult:
    r = TrialResult(seed=seed, faults=labels, labels=labels, namespace=f"t{seed}", seconds=3.5, workers=4, deaths=2)
    r.counts.update(counts)
    r.latencies = latencies
    r.reasons = {labels[0].split("[")[0]: Counter({"PidAlive": 2}), "final": Counter({"PidReuseDetected": 1})}
    r.evidence = {"retired_by": Counter({"PidfdExited": 2}), "notes": Counter({"heartbeat_after_retirement": 1})}
    r.facts = {labels[0]: {"refused": 3, "gone_410": {"operator": 1, "node-1": 2}, "flag": True}}
    if counts.get("dead_left_active"):
        r.violations.append({"counter": "dead_left_active", "detail": "x", "seed": seed})
    return r


def test_state_round_trips_through_json_and_goes_on_adding() -> None:
    whole, first = Aggregate(), Aggregate()
    trials = [
        result(1, ["agent_sigstop"], [0.31, 1.2]),
        result(2, ["pid_reuse[frozen]", "zombie"], [0.25], dead_left_active=1),
        result(3, ["none"], [], live_retired=0),
    ]
    for trial in trials[:2]:
        whole.add(trial)
        first.add(trial)
    resumed = Aggregate.from_state(json.loads(json.dumps(first.state())))
    whole.add(trials[2])
    resumed.add(trials[2])
    assert resumed.to_json() == whole.to_json()
    assert resumed.to_json()["dead_left_active"] == 1
    assert resumed.to_json()["per_fault"]["pid_reuse"]["variants"] == {"frozen": 1}
