"""The process host: loops started together (one after an event), a failed loop reported, and the
shutdown in one order — hooks while the loops run, then the loops cancelled, then the closers."""

from __future__ import annotations

import asyncio

import pytest

from coroner.runtime.manager import Manager

pytestmark = pytest.mark.unit


def test_the_shutdown_runs_the_hooks_while_the_loops_run_then_stops_them_then_closes() -> None:
    order: list[str] = []

    async def scenario() -> None:
        manager = Manager(name="test")
        ticks = 0

        async def loop() -> None:
            nonlocal ticks
            try:
                while True:
                    ticks += 1
                    await asyncio.sleep(0.001)
            finally:
                order.append("loop ended")

        async def hook() -> None:
            seen = ticks
            await asyncio.sleep(0.02)
            order.append(f"hook saw the loop run: {ticks > seen}")

        manager.add(loop())
        manager.on_shutdown(hook)
        manager.closing(lambda: order.append("closed first-added"))
        manager.closing(lambda: order.append("closed last-added"))
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.01, stop.set)
        await manager.run(stop=stop)
        await manager.shutdown()  # once only
        await manager.stop()

    asyncio.run(scenario())
    assert order == ["hook saw the loop run: True", "loop ended", "closed last-added", "closed first-added"]


def test_a_bounded_hook_is_cut_off_and_the_rest_still_runs() -> None:
    order: list[str] = []

    async def scenario() -> None:
        manager = Manager(name="test")

        async def slow() -> None:
            await asyncio.sleep(10)

        async def quick() -> None:
            order.append("quick")

        manager.on_shutdown(slow, timeout=0.01)
        manager.on_shutdown(quick)
        manager.closing(lambda: order.append("closed"))
        manager.start()
        await manager.shutdown()

    asyncio.run(scenario())
    assert order == ["quick", "closed"]


def test_a_loop_waits_for_its_event_and_a_failed_loop_is_reported() -> None:
    failures: list[tuple[str, str]] = []

    async def scenario() -> bool:
        manager = Manager(name="proc", on_failure=lambda name, error: failures.append((name, str(error))))
        ready = asyncio.Event()
        started = asyncio.Event()

        async def waiting() -> None:
            started.set()
            await asyncio.Event().wait()

        async def failing() -> None:
            raise RuntimeError("dead port")

        async with manager:
            manager.start()
            manager.add(waiting(), after=ready)  # added while running: started at once, held by `ready`
            manager.add(failing())
            await asyncio.sleep(0.01)
            early = started.is_set()
            ready.set()
            await asyncio.wait_for(started.wait(), timeout=1)
        return early

    assert asyncio.run(scenario()) is False
    assert failures == [("proc", "dead port")]


def test_leaving_early_stops_without_the_hooks() -> None:
    order: list[str] = []

    async def scenario() -> None:
        async def hook() -> None:
            order.append("hook")

        async def never() -> None:
            await asyncio.Event().wait()

        with pytest.raises(ValueError, match="assembly failed"):
            async with Manager(name="test") as manager:
                manager.on_shutdown(hook)
                manager.closing(lambda: order.append("closed"))
                manager.add(never())
                manager.start()
                raise ValueError("assembly failed")
        assert all(task.done() for task in manager.tasks)

    asyncio.run(scenario())
    assert order == ["closed"]


def test_a_failed_loop_is_logged_as_its_process_logs(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async def failing() -> None:
            raise RuntimeError("bug")

        async with Manager(name="agent") as manager:
            manager.add(failing())
            manager.start()
            await asyncio.sleep(0.01)

    asyncio.run(scenario())
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("coroner.agent", "agent loop failed: RuntimeError('bug')")
    ]
