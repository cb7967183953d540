"""A keyed work queue, as controllers use: the operator's registrations and the agent's probes.

Duplicates collapse (a burst of watch events is one piece of work), one key is never worked on by
two workers at once, and a key requested while it is being worked on runs once more afterwards —
the running worker may have read the state from before the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class KeyedQueue(Generic[K]):
    """FIFO of distinct keys with in-flight tracking. Use from one event loop only."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._pending: set[K] = set()
        self._active: set[K] = set()
        self._again: set[K] = set()

    def put(self, key: K) -> None:
        """Asks for one (more) round of work on `key`."""
        if key in self._active:
            self._again.add(key)
        elif key not in self._pending:
            self._pending.add(key)
            self._queue.put_nowait(key)

    async def get(self) -> K:
        """The next key; the caller must call `done(key)` when finished, whatever happened."""
        key = await self._queue.get()
        self._pending.discard(key)
        self._active.add(key)
        return key

    def done(self, key: K) -> None:
        self._active.discard(key)
        self._queue.task_done()
        if key in self._again:
            self._again.discard(key)
            self.put(key)

    async def join(self) -> None:
        """Waits until every requested round of work has been done."""
        await self._queue.join()

    @property
    def pending(self) -> int:
        return len(self._pending)
