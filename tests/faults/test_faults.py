"""Seeded fault injection on the real API server with real processes: the invariant in both directions.

Safety: no registration whose incarnation is alive is ever Retired, none is retired twice, every
retirement carries a Dead attestation for exactly its incarnation by its own node's agent, admission
refuses every write an identity may not make, and nothing is retired while the grant is revoked.
Sieve's three patterns (stale view, unobserved state, a crash right after each kind of write) are
faults of the catalogue too (faults/catalogue/sieve.py); each alone once, and each detector they
rely on is shown to fire on a broken variant of the guard they exercise.
Liveness: every dead worker whose node's agent is healthy is Retired within `trial.BOUND` (30 s;
`MASS_BOUND`, 90 s, for the mass death), and every one a fault keeps carries the reason the fault
explains. See docs/faults.md; the long run is `bench/faults.py`.

One dedicated control plane (tests/faults/conftest.py; the API server restart faults must not
disturb a cluster other tests share), three simulated nodes, one operator; each fault runs alone
once with a fixed seed, then two seeded combinations, then a self-test of the detectors. What the
harness found is pinned in test_findings.py. CORONER_FAULTS_CLUSTER_DIR keeps a plane between runs
while developing; CORONER_FAULTS_MASS sets the size of the mass death here (default 100, to fit the CI
budget; the bench runs 500).
"""

from __future__ import annotations

import os

import pytest

from faults import runner
from faults.plane import Plane
from faults.trial import COUNTERS

pytestmark = [
    pytest.mark.integration,
    pytest.mark.procs,
    pytest.mark.timeout(900),
    pytest.mark.skipif(os.geteuid() != 0, reason="pid namespaces, ns_last_pid and nsenter need root"),
]

MASS = int(os.environ.get("CORONER_FAULTS_MASS", "100"))

#: Each fault alone, once, with a fixed seed. The API server restart crashes it right after the
#: deaths, which is what found finding 1 of docs/faults.md (the bench runs every variant).
ALONE = [
    ("none", 101),
    ("pid_reuse:terminated", 102),
    ("pid_reuse:frozen", 103),
    ("boot_id_change", 104),
    ("zombie", 105),
    ("agent_sigkill", 106),
    ("agent_sigstop", 107),
    ("agent_restart", 108),
    ("agent_partition", 109),
    ("agent_clock_skew:-300", 110),
    ("worker_clock_skew:+300", 111),
    ("operator_sigkill", 112),
    ("two_operators", 113),
    ("apiserver_restart:crash", 114),
    ("watch_expiry:crash", 115),
    ("heartbeat_race", 116),
    ("foreign_attestation", 117),
    ("worker_attestation", 118),
    ("grant_revoked", 119),
    ("malformed", 120),
    ("mass_death", 121),
    ("stale_view_operator", 122),
    ("stale_view_agent", 123),
    ("unobserved_operator", 124),
    ("unobserved_agent", 125),
    ("crash_after_write:conditions", 126),
    ("crash_after_write:retirement", 127),
    ("crash_after_write:event", 128),
    ("agent_crash_after_write", 129),
    ("leader_kill", 130),
]
COMBINED = [
    (["pid_reuse:killed", "grant_revoked", "heartbeat_race"], 201),
    (["agent_sigstop", "operator_sigkill", "zombie"], 202),
]


def _check(result: runner.TrialResult) -> None:
    bad = {c: result.counts[c] for c in (*COUNTERS, "harness_errors") if result.counts[c]}
    details = "\n".join(f"  {v['counter']}: {v.get('detail')}" for v in result.violations)
    # The timeline itself, not only its file: a CI run's temporary directories are gone afterwards.
    timeline = "\n".join(result.timeline[-30:])
    assert not bad, f"{result.summary()}\n{details}\ntimeline ({result.facts.get('timeline')}):\n{timeline}"


@pytest.mark.parametrize(("fault", "seed"), ALONE, ids=[f for f, _ in ALONE])
def test_fault_alone(plane: Plane, fault: str, seed: int) -> None:
    result = runner.run_one(plane, seed=seed, faults=[] if fault == "none" else [fault], index=seed, mass_count=MASS)
    _check(result)
    assert result.deaths > 0


@pytest.mark.parametrize(("faults", "seed"), COMBINED, ids=["+".join(f) for f, _ in COMBINED])
def test_faults_combined(plane: Plane, faults: list[str], seed: int) -> None:
    _check(runner.run_one(plane, seed=seed, faults=faults, index=seed, mass_count=MASS))


def test_the_detectors_fire(plane: Plane) -> None:
    """The harness itself: a live registration retired by hand (the admin holds every verb), two
    Retired Events for it, and a dead worker on a node no agent serves must all be reported."""
    result = runner.run_one(plane, seed=401, faults=["selftest"], index=401, mass_count=MASS, bound=3.0)
    counts = result.counts
    assert counts["live_retired"] >= 1, result.violations
    assert counts["bad_provenance"] >= 1, result.violations
    assert counts["double_retired"] >= 1, result.violations
    assert counts["dead_left_active"] >= 1, result.violations
    assert not counts["harness_errors"], result.violations


#: Sieve's faults with the guard they exercise removed at the wire, and the detectors that must fire.
SIEVE_MUTANTS = [
    ("stale_view_operator:mutant-no-cas", 402, {"live_retired", "bad_provenance"}),
    ("stale_view_agent:mutant-no-cas", 403, {"bad_provenance"}),
    ("unobserved_operator:mutant-drop-all", 404, {"dead_left_active"}),
    ("crash_after_write:mutant-repost", 405, {"double_retired"}),
]


@pytest.mark.parametrize(("fault", "seed", "expected"), SIEVE_MUTANTS, ids=[f for f, _, _ in SIEVE_MUTANTS])
def test_the_sieve_detectors_fire(plane: Plane, fault: str, seed: int, expected: set[str]) -> None:
    """A retirement and an attestation without their `test` operations on a stale view, a watch
    that never delivers the cancelling event, an Event posted again after a crash: each must be
    reported by the detector named.

    A trial whose mutant write never landed (`not_injected`, with the answers: under load the API
    server has refused the stale-view mutant's retirement with 403 although the canary said the
    lift was in force) tests no detector, so it is run again, twice at most; the detectors must
    fire on the trial that injected."""
    for attempt in range(3):
        result = runner.run_one(
            plane, seed=seed, faults=[fault], index=seed + 10_000 * attempt, mass_count=MASS, bound=10.0
        )
        if not result.counts["not_injected"]:
            break
    missing = {c for c in expected if not result.counts[c]}
    assert not missing, (missing, result.violations, result.facts, "\n".join(result.timeline))
    assert not result.counts["harness_errors"], result.violations
