"""One API read shared by every caller that needs a result fetched after its own decision.

Right before a batch of retirements the operator re-reads the Lease fence of the namespace and the
admission policies: the answer must come from a request sent *after* the decision it guards. When
hundreds of registrations of one namespace die together, each would send the same reads.

A caller whose decision predates the newest read in flight shares it: that read is as fresh for it
as one of its own. A caller whose decision is newer waits for the next read, which answers all of
them: group commit, for reads. A result is never reused for a caller that decided after its request
was sent, and a finished read answers nobody who asks afterwards.

The write phase belongs to the batch (`hold`): a caller that acts on a read's result (a retirement
write) holds it until its action is done, and the next read of that key is sent only once every
holder of the last one let go. Decisions made while a batch writes all join the next read, so under
a burst the reads per retirement fall with the burst's size, while an isolated caller (nothing held)
still gets its read at once. The wait is bounded by the writes' own answers.

One exception, for two deaths in quick succession: a caller that finds a read in flight for a single
other caller, and nobody queued, sends its own read at once. The API server serves these reads only
once its watch cache has caught up with etcd, which can take up to its progress-request period (100
ms); both reads in flight are answered by the same catch-up, where waiting would have cost the first
read, its write, and then a period of its own. At most two reads per key are live, so a burst, whose
reads have many holders, batches as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class FreshRead(Generic[K, T]):
    def __init__(self, fetch: Callable[[K], Awaitable[T]], *, clock: Callable[[], float] = time.monotonic) -> None:
        self._fetch = fetch
        self._clock = clock
        self._inflight: dict[K, tuple[float, asyncio.Future[T]]] = {}
        """Per key, the newest read in flight and when it was sent."""
        self._next: dict[K, asyncio.Future[T]] = {}
        self._live: dict[K, list[asyncio.Future[T]]] = {}
        """Per key, the reads in flight or answered but still held (at most two)."""
        self._holders: dict[asyncio.Future[T], int] = {}
        self.requests = 0
        """Reads actually sent (for tests and the benchmark's accounting)."""

    async def get(self, key: K, *, decided_at: float) -> T:
        """The result of a read of `key` sent no earlier than `decided_at` (a `clock()` reading the
        caller took before it looked at the cached state it decided on)."""
        async with self.hold(key, decided_at=decided_at) as value:
            return value

    @contextlib.asynccontextmanager
    async def hold(self, key: K, *, decided_at: float) -> AsyncIterator[T]:
        """`get`, and the next read of `key` waits until this caller leaves the block."""
        future = self._future_for(key, decided_at)
        self._holders[future] = self._holders.get(future, 0) + 1
        try:
            # shield: a cancelled caller must not cancel the read the others are waiting for.
            yield await asyncio.shield(future)
        finally:
            self._release(key, future)

    def _future_for(self, key: K, decided_at: float) -> asyncio.Future[T]:
        current = self._inflight.get(key)
        if current is not None and current[0] >= decided_at:
            return current[1]
        if (queued := self._next.get(key)) is not None:
            return queued
        live = self._live.get(key, [])
        # The read in flight is live, so with one live read it is the only one.
        overtakes = current is not None and len(live) == 1 and self._holders.get(current[1], 0) == 1
        if not live or overtakes:
            return self._start(key, asyncio.get_running_loop().create_future())
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieve)
        self._next[key] = future
        return future

    def _start(self, key: K, future: asyncio.Future[T]) -> asyncio.Future[T]:
        started = self._clock()  # read before the request exists: never later than its send
        self._inflight[key] = (started, future)
        self._live.setdefault(key, []).append(future)
        self.requests += 1
        fetch = asyncio.ensure_future(self._fetch(key))
        fetch.add_done_callback(lambda done: self._done(key, future, done))
        return future

    def _done(self, key: K, future: asyncio.Future[T], fetch: asyncio.Future[T]) -> None:
        current = self._inflight.get(key)
        if current is not None and current[1] is future:
            del self._inflight[key]
        _forward(future, fetch)
        _retrieve(future)
        if not self._holders.get(future):
            self._unheld(key, future)

    def _release(self, key: K, future: asyncio.Future[T]) -> None:
        left = self._holders.get(future, 0) - 1
        if left > 0:
            self._holders[future] = left
            return
        self._holders.pop(future, None)
        if future.done():
            self._unheld(key, future)

    def _unheld(self, key: K, future: asyncio.Future[T]) -> None:
        """Nobody holds `future` any more: the next read of `key`, if anyone waits for one, starts
        once no other read of `key` is live."""
        live = self._live.get(key, [])
        if future in live:
            live.remove(future)
        if live:
            return
        self._live.pop(key, None)
        waiting = self._next.pop(key, None)
        if waiting is not None:
            self._start(key, waiting)


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
