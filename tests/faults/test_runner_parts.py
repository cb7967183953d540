"""The runner's pure parts, without a cluster: shared rounds (which trials share one API server
restart, and the rendezvous that makes one injection serve them all) and the fault draw."""

from __future__ import annotations

import random
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from faults import runner
from faults.catalogue import FAULTS


def test_a_group_without_a_shared_fault_keeps_its_draws() -> None:
    drawn = [["zombie"], [], ["operator_sigkill", "pid_reuse"]]
    assert runner.plan_round(drawn, random.Random(1)) == (None, drawn)


def test_a_shared_fault_is_carried_by_every_trial_of_the_group() -> None:
    drawn = [["zombie"], ["watch_expiry", "pid_reuse"], ["operator_sigkill", "stale_view_agent", "agent_sigkill"]]
    spec, lists = runner.plan_round(drawn, random.Random(1))
    assert spec is not None and spec.startswith("watch_expiry:")
    assert spec.partition(":")[2] in FAULTS["watch_expiry"].variants
    # Its own shared faults, other cluster-wide ones and the ones exclusive with it are dropped.
    assert lists == [["zombie", spec], ["pid_reuse", spec], ["agent_sigkill", spec]]


@given(seed=st.integers(min_value=0, max_value=2**32 - 1), size=st.integers(min_value=1, max_value=4))
def test_rounds_never_mix_what_cannot_run_together(seed: int, size: int) -> None:
    rng = random.Random(seed)
    drawn = [runner.choose_faults(rng, nodes=3) for _ in range(size)]
    spec, lists = runner.plan_round(drawn, random.Random(seed))
    assert len(lists) == size
    if spec is None:
        assert lists == drawn
        return
    for faults in lists:
        names = [f.partition(":")[0] for f in faults]
        assert faults[-1] == spec and names.count(spec.partition(":")[0]) == 1
        assert not any(FAULTS[n].cluster_wide for n in names[:-1])
        assert not any({a, b} <= pair for a in names for b in names if a != b for pair in runner.EXCLUSIVE)


def test_a_round_runs_its_action_once_with_every_contribution() -> None:
    shared = runner.Round(3, timeout=30)
    calls: list[list[int]] = []
    results: list[int] = []

    def action(parts: list[int]) -> int:
        calls.append(sorted(parts))
        return sum(parts)

    threads = [
        threading.Thread(target=lambda k=k: results.append(shared.together("restart", k, action))) for k in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert calls == [[0, 1, 2]]
    assert results == [3, 3, 3]


def test_a_member_that_leaves_early_releases_the_others() -> None:
    shared = runner.Round(2, timeout=30)
    errors: list[BaseException] = []

    def waiter() -> None:
        try:
            shared.together("restart", None, lambda parts: None)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=waiter)
    thread.start()
    while not shared._points:
        threading.Event().wait(0.01)
    shared.leave()
    thread.join(timeout=30)
    assert errors and not thread.is_alive()
    with pytest.raises(RuntimeError):
        shared.together("later", None, lambda parts: None)


def test_an_action_that_fails_fails_every_member() -> None:
    shared = runner.Round(1, timeout=30)

    def boom(parts: list[object]) -> None:
        raise ValueError("no")

    with pytest.raises(RuntimeError, match="no"):
        shared.together("restart", None, boom)
