"""How a blocking call (an HTTP request of `coroner.client.rest`) is awaited without stalling the
event loop: the one seam between Coroner's processes and their transport's threads.

Production runs each call in a bounded thread pool (`ThreadPool`); the deterministic simulation
(tests/sim) gives a `Blocking` that answers in virtual time, one API latency later. Everything that
awaits a `Blocking` is the same code in both.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Protocol, TypeVar

T = TypeVar("T")


class Blocking(Protocol):
    """Awaits a blocking call."""

    async def run(self, call: Callable[[], T]) -> T: ...

    def close(self) -> None: ...


class ThreadPool:
    """`Blocking` on a bounded pool of threads: at most `workers` calls in flight."""

    def __init__(self, *, workers: int, name: str = "kubeapi") -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)

    async def run(self, call: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
