"""The host of one process's background engines, for the operator and the agent alike
(controller-runtime's Manager, small).

Each engine is a loop: a coroutine that runs until it is cancelled (a watch, a Lease renewal, a
resync, the runtime's timers and workers, an HTTP server). The manager

* starts each as a task (`add`; with `after`, once that event is set), at once if it already runs;
* tells `on_failure` of a loop that raised: a loop's end is a bug or a dead port, which the
  operator answers by stopping its process (its Deployment restarts it) rather than running on
  with, say, no permission refresh; by default it is logged;
* shuts down in one order (`shutdown`, once): the shutdown hooks in the order added, each bounded by
  its own timeout if it has one, while every loop still runs (the agent keeps renewing its Lease and
  attesting through its shutdown wait); then `stop`: every loop cancelled and awaited, then the
  closers, last added first. A failure or a cancellation skips what is left of the hooks, never
  `stop`.

`run(stop)` is the whole life: start, wait for `stop`, shut down; leaving `async with` stops.
`signalled()` is an event that SIGTERM and SIGINT set, for a process that owns its event loop (the
operator's is kopf's). A manager named `name` logs as `coroner.<name>`, as its process does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

Loop = Coroutine[Any, Any, None]


def log_failure(name: str, error: BaseException) -> None:
    logging.getLogger(f"coroner.{name}").error("%s loop failed: %r", name, error)


def stop_process(name: str, error: BaseException) -> None:
    """Stops this process as SIGTERM does (its shutdown runs): for a process that something restarts."""
    logging.getLogger(f"coroner.{name}").error("%s loop failed, stopping: %r", name, error)
    os.kill(os.getpid(), signal.SIGTERM)


class Manager:
    def __init__(self, *, name: str, on_failure: Callable[[str, BaseException], None] = log_failure) -> None:
        self.name = name
        self.on_failure = on_failure
        self.tasks: list[asyncio.Task[None]] = []
        self._waiting: list[Loop] = []
        self._hooks: list[tuple[Callable[[], Awaitable[None]], float | None]] = []
        self._closers: list[Callable[[], None]] = []
        self._started = False
        self._shut = False
        self._stopped = False

    def add(self, *loops: Loop, after: asyncio.Event | None = None) -> None:
        """Host `loops` (each forever; started now if the manager runs, else at `start`)."""
        for loop in loops:
            self._waiting.append(loop if after is None else _after(after, loop))
        if self._started:
            self.start()

    def on_shutdown(self, hook: Callable[[], Awaitable[None]], *, timeout: float | None = None) -> None:
        """Awaited at shutdown while the loops still run (at most `timeout` seconds, if given)."""
        self._hooks.append((hook, timeout))

    def closing(self, close: Callable[[], None]) -> None:
        """Called at shutdown once every loop has ended (last added, first called)."""
        self._closers.append(close)

    def start(self) -> None:
        self._started = True
        waiting, self._waiting = self._waiting, []
        for loop in waiting:
            task = asyncio.create_task(loop)
            task.add_done_callback(self._ended)
            self.tasks.append(task)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        assert error is not None
        self.on_failure(self.name, error)

    def signalled(self) -> asyncio.Event:
        """An event set by SIGTERM or SIGINT (on the running loop)."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        return stop

    async def run(self, *, stop: asyncio.Event) -> None:
        self.start()
        try:
            await stop.wait()
            await self.shutdown()
        finally:
            await self.stop()

    async def shutdown(self) -> None:
        """The shutdown hooks, then `stop` (once)."""
        if self._shut:
            return
        self._shut = True
        try:
            for hook, timeout in self._hooks:
                if timeout is None:
                    await hook()
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(hook(), timeout=timeout)
        finally:
            await self.stop()

    async def stop(self) -> None:
        """Every loop cancelled and awaited, then the closers (once; no shutdown hook runs)."""
        if self._stopped:
            return
        self._stopped = True
        for loop in self._waiting:
            loop.close()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for close in reversed(self._closers):
            close()

    async def __aenter__(self) -> Manager:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()


async def _after(event: asyncio.Event, loop: Loop) -> None:
    """`loop`, once `event` is set."""
    try:
        await event.wait()
    except asyncio.CancelledError:
        loop.close()
        raise
    await loop
