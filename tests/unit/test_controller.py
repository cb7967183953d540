"""The controller runtime (`coroner.runtime`): the timer heap against a model, and the controller's
queue, requeue-at, alarms and backoff with a clock the test moves."""

from __future__ import annotations

import asyncio
import datetime
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coroner.runtime.controller import Controller, Result, _Requeue, decorrelated_jitter, detach
from coroner.runtime.timers import TimerHeap

pytestmark = pytest.mark.unit

T0 = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)
S = datetime.timedelta(seconds=1)

OPS = st.lists(
    st.tuples(st.sampled_from(["earliest", "move", "cancel", "pop"]), st.sampled_from("abcd"), st.integers(0, 20)),
    max_size=60,
)


@given(ops=OPS)
@settings(max_examples=300, deadline=None)
def test_the_timer_heap_is_a_dict_of_due_times(ops: list[tuple[str, str, int]]) -> None:
    heap: TimerHeap[str] = TimerHeap()
    model: dict[str, datetime.datetime] = {}
    for op, token, seconds in ops:
        when = T0 + seconds * S
        if op == "earliest":
            heap.earliest(token, when)
            model[token] = min(model.get(token, when), when)
        elif op == "move":
            heap.move(token, when)
            model[token] = when
        elif op == "cancel":
            heap.cancel(token)
            model.pop(token, None)
        else:
            fired = heap.pop_due(when)
            due = sorted((t for t in model if model[t] <= when), key=lambda t: model[t])
            assert sorted(fired) == sorted(due)
            assert [model[t] for t in fired] == sorted(model[t] for t in fired), "in due order"
            for t in due:
                del model[t]
        assert heap.next_at() == (min(model.values()) if model else None)
        assert len(heap) == len(model)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime.datetime:
        return self.now


def test_requeue_at_keeps_the_earliest_and_alarms_move() -> None:
    clock = Clock()
    seen: list[str] = []

    async def reconcile(key: str) -> None:
        seen.append(key)

    controller: Controller[str] = Controller(reconcile, clock=clock)
    controller.requeue_at("a", T0 + 10 * S)
    controller.requeue_at("a", T0 + 5 * S)
    controller.requeue_at("a", T0 + 20 * S)
    fired: list[str] = []
    controller.alarm("node", T0 + 5 * S, lambda: fired.append("first"))
    controller.alarm("node", T0 + 30 * S, lambda: fired.append("moved"))
    controller.fire_due(T0 + 5 * S)
    assert controller.queue.pending == 1 and fired == []
    controller.fire_due(T0 + 29 * S)
    assert fired == []
    controller.fire_due(T0 + 30 * S)
    assert fired == ["moved"]
    controller.alarm("gone", T0 + S, lambda: fired.append("cancelled"))
    controller.cancel_alarm("gone")
    controller.fire_due(T0 + 60 * S)
    assert fired == ["moved"]


def test_a_failing_reconcile_is_retried_with_backoff_and_a_success_resets_it() -> None:
    clock = Clock()
    failures: list[tuple[str, float]] = []
    outcomes = iter([ValueError("1"), ValueError("2"), None, ValueError("3")])

    async def reconcile(key: str) -> Result:
        outcome = next(outcomes)
        if outcome is not None:
            raise outcome
        return Result(requeue_at=T0 + 100 * S)

    controller: Controller[str] = Controller(
        reconcile,
        backoff=(1, 4),
        on_failure=lambda k, e, d: failures.append((str(e), d)),
        clock=clock,
        jitter=False,
    )

    async def scenario() -> None:
        worker = asyncio.create_task(controller.run_worker())
        controller.enqueue("a")
        await controller.drain()
        assert failures == [("1", 1.0)]
        assert controller._timers.due_at(_Requeue("a")) == T0 + S
        controller.fire_due(T0 + S)
        await controller.drain()
        assert failures[-1] == ("2", 4.0)
        controller.fire_due(T0 + 5 * S)
        await controller.drain()  # succeeds: asks to come back at T0 + 100 s
        assert controller._timers.due_at(_Requeue("a")) == T0 + 100 * S
        controller.fire_due(T0 + 100 * S)
        await controller.drain()
        assert failures[-1] == ("3", 1.0), "the success reset the backoff"
        worker.cancel()

    asyncio.run(scenario())


def test_backoff_needs_a_delay() -> None:
    async def reconcile(key: str) -> None:
        return None

    with pytest.raises(ValueError, match="backoff"):
        Controller(reconcile, backoff=())


@given(seed=st.integers(0, 2**32), base=st.floats(0.01, 10), factor=st.floats(1, 100), n=st.integers(1, 30))
@settings(max_examples=200, deadline=None)
def test_jittered_backoff_stays_between_base_and_cap_and_is_seeded(
    seed: int, base: float, factor: float, n: int
) -> None:
    cap = base * factor

    def delays() -> list[float]:
        rng, previous, out = random.Random(seed), None, []
        for _ in range(n):
            previous = decorrelated_jitter(rng, base=base, cap=cap, previous=previous)
            out.append(previous)
        return out

    first = delays()
    assert first == delays(), "the same seed, the same delays"
    assert all(base <= d <= cap for d in first), "never a hot loop, never past the cap"


def test_jittered_retries_of_keys_that_failed_together_spread_out() -> None:
    """After an API server restart every key fails at once; their retries must not all land on one instant."""

    async def reconcile(key: int) -> None:
        raise ValueError("503")

    delays: list[float] = []
    controller: Controller[int] = Controller(
        reconcile, backoff=(1, 60), on_failure=lambda k, e, d: delays.append(d), rng=random.Random(7)
    )

    async def scenario() -> None:
        worker = asyncio.create_task(controller.run_worker())
        for key in range(50):
            controller.enqueue(key)
        await controller.drain()
        worker.cancel()

    asyncio.run(scenario())
    assert len(delays) == 50 and all(1 <= d <= 3 for d in delays)
    assert len({round(d, 3) for d in delays}) > 40


def test_a_gate_holds_every_reconcile_until_it_opens() -> None:
    seen: list[str] = []
    open_ = asyncio.Event()

    async def reconcile(key: str) -> None:
        seen.append(key)

    async def scenario() -> None:
        controller: Controller[str] = Controller(reconcile, gate=open_.wait)
        worker = asyncio.create_task(controller.run_worker())
        controller.enqueue("a")
        for _ in range(20):
            await asyncio.sleep(0)
        assert seen == [] and controller.queue.pending == 1, "a standby reconciles nothing; its queue stays"
        open_.set()
        await controller.drain()
        assert seen == ["a"]
        worker.cancel()

    asyncio.run(scenario())


def test_a_detached_reconcile_frees_its_worker_and_still_counts_as_running() -> None:
    """A reconcile that waits on a shared read (a retirement's fence) detaches: the worker takes the
    next key, so the keys decided meanwhile join the same read; the detached one still holds its key
    (no second reconcile of it at once), is drained, and its failure is retried with backoff."""
    seen: list[str] = []
    failures: list[str] = []
    release = asyncio.Event()

    async def reconcile(key: str) -> None:
        seen.append(key)
        if key.startswith("parked"):
            detach()
            await release.wait()
            if key == "parked-failing":
                raise ValueError(key)

    async def scenario() -> None:
        controller: Controller[str] = Controller(reconcile, on_failure=lambda k, e, d: failures.append(k), jitter=False)
        worker = asyncio.create_task(controller.run_worker())  # one worker only
        for key in ("parked", "parked-failing", "b"):
            controller.enqueue(key)
        for _ in range(20):
            await asyncio.sleep(0)
        assert seen == ["parked", "parked-failing", "b"], "the one worker moved on past the detached reconciles"
        controller.enqueue("parked")  # asked again while it runs: once more afterwards, never twice at once
        for _ in range(20):
            await asyncio.sleep(0)
        assert seen.count("parked") == 1
        drained = asyncio.ensure_future(controller.drain())
        for _ in range(20):
            await asyncio.sleep(0)
        assert not drained.done(), "drain waits for the detached reconciles"
        release.set()
        await drained
        assert seen.count("parked") == 2 and failures == ["parked-failing"]
        worker.cancel()

    asyncio.run(scenario())
