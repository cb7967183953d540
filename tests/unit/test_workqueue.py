"""The keyed work queue: duplicates collapse, no key runs twice at once, a mid-flight request reruns."""

from __future__ import annotations

import asyncio

import pytest

from coroner.runtime.workqueue import KeyedQueue

pytestmark = pytest.mark.unit


def test_duplicates_collapse_and_order_is_kept() -> None:
    async def scenario() -> list[str]:
        queue: KeyedQueue[str] = KeyedQueue()
        for key in ("a", "b", "a", "c", "b"):
            queue.put(key)
        assert queue.pending == 3
        seen = []
        for _ in range(3):
            key = await queue.get()
            seen.append(key)
            queue.done(key)
        await queue.join()
        return seen

    assert asyncio.run(scenario()) == ["a", "b", "c"]


def test_a_request_during_work_runs_once_more_afterwards_never_concurrently() -> None:
    async def scenario() -> list[str]:
        queue: KeyedQueue[str] = KeyedQueue()
        queue.put("a")
        first = await queue.get()
        queue.put("a")
        queue.put("a")
        assert queue.pending == 0, "not queued while in flight: a second worker must not take it"
        queue.done(first)
        assert queue.pending == 1
        second = await queue.get()
        queue.done(second)
        await queue.join()
        return [first, second]

    assert asyncio.run(scenario()) == ["a", "a"]
