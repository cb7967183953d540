"""A heap of timers, one per token: what is due when, and nothing else.

Pure (time is passed in; nothing here sleeps): the controller runtime sleeps until `next_at()` and
fires what `pop_due(now)` returns. One timer per token: `earliest` keeps the earlier of two requests
(a requeue: whoever asks first for a re-decision wins), `move` replaces it (an expiry that a
renewal pushes back). Superseded entries stay in the heap and are skipped when they surface, so
every operation is O(log n).
"""

from __future__ import annotations

import datetime
import heapq
import itertools
from collections.abc import Hashable
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)


class TimerHeap(Generic[T]):
    def __init__(self) -> None:
        self._heap: list[tuple[datetime.datetime, int, T]] = []
        self._due: dict[T, datetime.datetime] = {}
        self._seq = itertools.count()

    def earliest(self, token: T, when: datetime.datetime) -> bool:
        """Due at `when` unless already due earlier; True if the timer moved."""
        due = self._due.get(token)
        if due is not None and due <= when:
            return False
        self._set(token, when)
        return True

    def move(self, token: T, when: datetime.datetime) -> bool:
        """Due at `when` exactly, earlier or later than before; True if the timer moved."""
        if self._due.get(token) == when:
            return False
        self._set(token, when)
        return True

    def cancel(self, token: T) -> None:
        self._due.pop(token, None)

    def due_at(self, token: T) -> datetime.datetime | None:
        return self._due.get(token)

    def pop_due(self, now: datetime.datetime) -> list[T]:
        """The tokens due at or before `now`, in due order; each fires once."""
        fired: list[T] = []
        while self._heap and self._heap[0][0] <= now:
            when, _, token = heapq.heappop(self._heap)
            if self._due.get(token) == when:  # otherwise moved or cancelled since
                del self._due[token]
                fired.append(token)
        return fired

    def next_at(self) -> datetime.datetime | None:
        """When the next live timer is due (None: none is)."""
        while self._heap and self._due.get(self._heap[0][2]) != self._heap[0][0]:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def __len__(self) -> int:
        return len(self._due)

    def _set(self, token: T, when: datetime.datetime) -> None:
        self._due[token] = when
        heapq.heappush(self._heap, (when, next(self._seq), token))
