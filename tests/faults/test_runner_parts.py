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


@pytest.mark.parametrize(
    ("index", "segments", "members"),
    [
        (0, [(0, 3)], [0, 1, 2]),
        (4, [(0, 3)], [3, 4, 5]),
        (1214, [(0, 3)], [1212, 1213, 1214]),
        # Resumed with 4 lanes at 1216: the group 1215-1217 of 3 lanes ends where the segment begins.
        (1215, [(0, 3), (1216, 4)], [1215]),
        (1216, [(0, 3), (1216, 4)], [1216, 1217, 1218, 1219]),
        (1223, [(0, 3), (1216, 4)], [1220, 1221, 1222, 1223]),
        (1212, [(0, 3), (1216, 4)], [1212, 1213, 1214]),
        (7, [(0, 1)], [7]),
        (9, [(0, 3), (5, 2), (8, 5)], [8, 9, 10, 11, 12]),
        (6, [(0, 3), (5, 2), (8, 5)], [5, 6]),
        (7, [(0, 3), (5, 2), (8, 5)], [7]),
    ],
)
def test_groups_follow_the_lanes_of_their_segment(
    index: int, segments: list[tuple[int, int]], members: list[int]
) -> None:
    assert runner.group_members(index, segments) == members


@pytest.mark.parametrize("segments", [[], [(1, 3)], [(0, 3), (0, 4)], [(0, 3), (9, 4), (5, 2)], [(0, 0)]])
def test_lane_segments_that_cannot_be_a_run_s_history_are_refused(segments: list[tuple[int, int]]) -> None:
    with pytest.raises(ValueError, match="lane segments"):
        runner.group_members(3, segments)


@given(
    lanes=st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=4),
    gaps=st.lists(st.integers(min_value=1, max_value=20), min_size=3, max_size=3),
)
def test_groups_partition_the_run_and_a_single_segment_is_the_old_grouping(lanes: list[int], gaps: list[int]) -> None:
    firsts = [0]
    for gap in gaps[: len(lanes) - 1]:
        firsts.append(firsts[-1] + gap)
    segments = list(zip(firsts, lanes, strict=True))
    groups = {tuple(runner.group_members(i, segments)) for i in range(firsts[-1] + 30)}
    covered = sorted(i for group in groups for i in group)
    assert covered == sorted(set(covered)) and covered[: firsts[-1] + 30] == list(range(firsts[-1] + 30))
    for group in groups:
        assert list(group) == list(range(group[0], group[-1] + 1))
        assert all(tuple(runner.group_members(i, segments)) == group for i in group)
        lanes_there = [n for first, n in segments if first <= group[0]][-1]
        assert len(group) <= lanes_there
    for i in range(40):
        assert runner.group_members(i, [(0, lanes[0])]) == list(range(i - i % lanes[0], i - i % lanes[0] + lanes[0]))
