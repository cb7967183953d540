"""One API read shared by every caller that needs a result fetched after its own decision.

Right before a retirement the operator re-checks the `retire` capability and re-reads the Lease
fence of the namespace: the answer must come from a request sent *after* the decision it guards.
When hundreds of registrations of one namespace die together, each would send the same two reads.
A request already in flight that was started after a caller's decision is as fresh for that caller
as one of its own, so the caller waits for it; a caller whose decision is newer than the request in
flight starts its own (which later callers then share). Never is a result reused that was fetched
before the decision it is meant to guard.
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
        self.requests = 0
        """Reads actually sent (for tests and the benchmark's accounting)."""

    async def get(self, key: K, *, decided_at: float) -> T:
        """The result of a read of `key` started no earlier than `decided_at` (a `clock()` reading
        taken before the caller looked at its cached state)."""
        entry = self._inflight.get(key)
        if entry is None or entry[0] < decided_at:
            # The start is read before the request exists, so it is never later than the send.
            started = self._clock()
            future = asyncio.ensure_future(self._fetch(key))
            future.add_done_callback(functools.partial(self._done, key))
            entry = (started, future)
            self._inflight[key] = entry
            self.requests += 1
        # shield: a cancelled caller must not cancel the read the others are waiting for.
        return await asyncio.shield(entry[1])

    def _done(self, key: K, future: asyncio.Future[T]) -> None:
        current = self._inflight.get(key)
        if current is not None and current[1] is future:
            del self._inflight[key]
        if not future.cancelled():
            future.exception()  # retrieved: every waiter gets it; none is logged as lost
