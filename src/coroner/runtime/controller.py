"""The framework part of a controller: keyed queue, timers, backoff, requeue-at.

controller-runtime's shape: the application supplies one `reconcile(key) -> Result` (raising on an
unexpected error), and this runtime owns everything around it —

* a keyed work queue (`KeyedQueue`): duplicates collapse, one key is never reconciled twice at
  once, a key asked for while it is being reconciled runs once more afterwards;
* requeue-at: a `Result.requeue_at` (or `requeue_at(key, when)` from anywhere) puts the key back
  at that instant; the earliest request wins;
* backoff: a reconcile that raises is retried after a delay, never in a hot loop; a success resets
  it. With `jitter` (the default) the delays are decorrelated jitter between `backoff[0]` and
  `backoff[-1]` (each drawn from [base, 3 * the previous delay], capped), so keys that failed together
  (an API server restart) are not all retried in the same instant; without it, `backoff[attempt]`
  (the last delay repeats). The random source is `rng` (seeded in tests);
* leadership: with a `gate`, workers take and reconcile keys only while it is open (awaited before
  each reconcile): a standby keeps its queue and caches warm but writes nothing;
* detaching: a reconcile that is about to wait on something shared with other keys (a batch's
  read) may `detach()`: its worker takes the next key at once, while the reconcile runs on as its
  own task and still holds its key (never reconciled twice at once, drained, retried on failure);
* alarms: one named timer per token (e.g. an agent Lease's expiry) that calls back when due and
  that a later `alarm` for the same token moves (earlier or later).

Use from one event loop. Time comes from `clock` (UTC), so tests can fire timers by hand
(`fire_due(now)`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import datetime
import random
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

from coroner.runtime.timers import TimerHeap
from coroner.runtime.workqueue import KeyedQueue

K = TypeVar("K", bound=Hashable)

_IDLE_SECONDS = 3600.0

#: Inside a reconcile run by a worker: the future that frees that worker (see `detach`).
_FREE_WORKER: contextvars.ContextVar[asyncio.Future[None] | None] = contextvars.ContextVar(
    "coroner_free_worker", default=None
)


def detach() -> None:
    """From inside a reconcile: let its worker take the next key while this reconcile goes on.

    For a reconcile about to wait on a read shared with other keys' reconciles: without it, the
    read's batch could never be larger than the number of workers. A no-op outside a worker (a
    reconcile called directly, as tests and the simulation do)."""
    free = _FREE_WORKER.get()
    if free is not None and not free.done():
        free.set_result(None)


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclasses.dataclass(frozen=True, slots=True)
class Result:
    """What a reconcile asks of the runtime: come back at `requeue_at` (None: only on a change)."""

    requeue_at: datetime.datetime | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class _Requeue(Generic[K]):
    key: K


@dataclasses.dataclass(frozen=True, slots=True)
class _Alarm:
    token: Hashable


class Controller(Generic[K]):
    def __init__(
        self,
        reconcile: Callable[[K], Awaitable[Result | None]],
        *,
        backoff: Sequence[float] = (1, 2, 4, 8, 16, 30, 60),
        on_failure: Callable[[K, Exception, float], None] | None = None,
        clock: Callable[[], datetime.datetime] = utcnow,
        jitter: bool = True,
        rng: random.Random | None = None,
        gate: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        if not backoff:
            raise ValueError("backoff needs at least one delay")
        if min(backoff) <= 0:
            raise ValueError("backoff delays must be positive (never a hot loop)")
        self._reconcile = reconcile
        self._backoff = tuple(backoff)
        self._jitter = jitter
        self._rng = rng or random.Random()
        self._gate = gate
        self._on_failure = on_failure
        self._clock = clock
        self.queue: KeyedQueue[K] = KeyedQueue()
        self._timers: TimerHeap[_Requeue[K] | _Alarm] = TimerHeap()
        self._alarms: dict[Hashable, Callable[[], None]] = {}
        self._failures: dict[K, tuple[int, float | None]] = {}  # attempts so far, the last delay
        self._wakeup = asyncio.Event()
        self._running: set[asyncio.Future[None]] = set()  # reconciles in progress, detached or not

    # --- asking for work -------------------------------------------------------------------------

    def enqueue(self, key: K) -> None:
        """Reconcile `key` soon; duplicates collapse into one."""
        self.queue.put(key)

    def requeue_at(self, key: K, when: datetime.datetime) -> None:
        """Reconcile `key` at `when` (the earliest of several requests wins)."""
        if self._timers.earliest(_Requeue(key), when):
            self._wakeup.set()

    def alarm(self, token: Hashable, when: datetime.datetime, fire: Callable[[], None]) -> None:
        """Call `fire` at `when`; a later alarm for `token` replaces this one (moved, not added)."""
        self._alarms[token] = fire
        if self._timers.move(_Alarm(token), when):
            self._wakeup.set()

    def cancel_alarm(self, token: Hashable) -> None:
        self._timers.cancel(_Alarm(token))
        self._alarms.pop(token, None)

    def alarm_at(self, token: Hashable) -> datetime.datetime | None:
        return self._timers.due_at(_Alarm(token))

    def backoff_delay(self, attempt: int, previous: float | None = None) -> float:
        """The delay before retry `attempt` (0-based); `previous` is the delay before the last one."""
        if not self._jitter:
            return float(self._backoff[min(attempt, len(self._backoff) - 1)])
        return decorrelated_jitter(self._rng, base=self._backoff[0], cap=self._backoff[-1], previous=previous)

    # --- running -------------------------------------------------------------------------------

    def fire_due(self, now: datetime.datetime) -> None:
        """Enqueues every requeue due by `now` and calls every alarm due by `now`."""
        for token in self._timers.pop_due(now):
            if isinstance(token, _Requeue):
                self.enqueue(token.key)
            else:
                fire = self._alarms.pop(token.token, None)
                if fire is not None:
                    fire()

    async def run_timers(self) -> None:
        while True:
            now = self._clock()
            self.fire_due(now)
            head = self._timers.next_at()
            timeout = (head - now).total_seconds() if head is not None else _IDLE_SECONDS
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout=max(timeout, 0.0) + 0.001)

    async def run_worker(self) -> None:
        while True:
            if self._gate is not None:
                await self._gate()
            key = await self.queue.get()
            free: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            task = asyncio.ensure_future(self._reconcile_one(key, free))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
            try:
                await free
            except asyncio.CancelledError:
                # Stopping: the reconciles this runtime started go too, detached ones included
                # (as one running in the worker itself always did).
                for running in list(self._running):
                    running.cancel()
                raise

    async def _reconcile_one(self, key: K, free: asyncio.Future[None]) -> None:
        _FREE_WORKER.set(free)  # this task's own context: `detach` frees exactly this worker
        try:
            if self._gate is not None:
                await self._gate()  # leadership may have been lost while waiting for a key
            result = await self._reconcile(key)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failed(key, exc)
        else:
            self._failures.pop(key, None)
            if result is not None and result.requeue_at is not None:
                self.requeue_at(key, result.requeue_at)
        finally:
            self.queue.done(key)
            if not free.done():
                free.set_result(None)

    async def drain(self) -> None:
        """Waits until the queue is empty and nothing is being reconciled."""
        await self.queue.join()

    def _failed(self, key: K, exc: Exception) -> None:
        attempt, previous = self._failures.get(key, (0, None))
        delay = self.backoff_delay(attempt, previous)
        self._failures[key] = (attempt + 1, delay)
        if self._on_failure is not None:
            self._on_failure(key, exc, delay)
        self.requeue_at(key, self._clock() + datetime.timedelta(seconds=delay))


def decorrelated_jitter(rng: random.Random, *, base: float, cap: float, previous: float | None) -> float:
    """The next delay of a decorrelated-jitter backoff: uniform in [base, 3 * previous] (previous
    starts at base), never above `cap` nor below `base`."""
    upper = max(base, 3 * (previous if previous is not None else base))
    return float(min(cap, max(base, rng.uniform(base, upper))))
