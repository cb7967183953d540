"""One API read shared by every caller that needs a result fetched after its own decision.

Right before a retirement the operator re-checks the `retire` capability and re-reads the Lease
fence of the namespace: the answer must come from a request sent *after* the decision it guards.
When hundreds of registrations of one namespace die together, each would send the same two reads.

Per key, at most one read is in flight. A caller whose decision predates the read in flight shares
it: that read is as fresh for it as one of its own. A caller whose decision is newer waits for the
next read, which starts the moment the one in flight finishes (after every caller waiting for it
had decided) and answers all of them: group commit, for reads. A result is never reused for a caller
that decided after its request was sent, and a finished read answers nobody who asks afterwards.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class FreshRead(Generic[K, T]):
    def __init__(self, fetch: Callable[[K], Awaitable[T]], *, clock: Callable[[], float] = time.monotonic) -> None:
        self._fetch = fetch
        self._clock = clock
        self._inflight: dict[K, tuple[float, asyncio.Future[T]]] = {}
        self._next: dict[K, asyncio.Future[T]] = {}
        self.requests = 0
        """Reads actually sent (for tests and the benchmark's accounting)."""

    async def get(self, key: K, *, decided_at: float) -> T:
        """The result of a read of `key` sent no earlier than `decided_at` (a `clock()` reading the
        caller took before it looked at the cached state it decided on)."""
        current = self._inflight.get(key)
        if current is None:
            future = self._start(key)
        elif current[0] >= decided_at:
            future = current[1]
        elif (queued := self._next.get(key)) is not None:
            future = queued
        else:
            future = self._next[key] = asyncio.get_running_loop().create_future()
            future.add_done_callback(_retrieve)
        # shield: a cancelled caller must not cancel the read the others are waiting for.
        return await asyncio.shield(future)

    def _start(self, key: K) -> asyncio.Future[T]:
        started = self._clock()  # read before the request exists: never later than its send
        future = asyncio.ensure_future(self._fetch(key))
        self._inflight[key] = (started, future)
        self.requests += 1
        future.add_done_callback(functools.partial(self._done, key))
        return future

    def _done(self, key: K, future: asyncio.Future[T]) -> None:
        current = self._inflight.get(key)
        if current is not None and current[1] is future:
            del self._inflight[key]
        _retrieve(future)
        waiting = self._next.pop(key, None)
        if waiting is not None:
            self._start(key).add_done_callback(functools.partial(_forward, waiting))


def _retrieve(future: asyncio.Future[T]) -> None:
    """Marks an error as seen: every waiter receives it; none is logged as lost."""
    if future.done() and not future.cancelled():
        future.exception()


def _forward(target: asyncio.Future[T], source: asyncio.Future[T]) -> None:
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif (error := source.exception()) is not None:
        target.set_exception(error)
    else:
        target.set_result(source.result())
