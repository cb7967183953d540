"""The simulation's scheduler and clock: an asyncio event loop in virtual time, one per trial.

Production code is async (the operator's runtime, reconciler, executor, retire protocol); the
simulation is a discrete-event simulation. This loop is both: asyncio's futures and tasks run on
it unchanged, and time is a number that jumps to the next timer when nothing is ready (the idea of
nolar's `looptime`, without a selector: nothing here ever waits for real I/O). Every callback is
taken in a fixed order — the ready ones first-in first-out, then the timers by (when, order of
scheduling) — so a trial is a function of its seed, step for step.

Crash semantics, as a SIGKILL: each component runs its coroutines in a context of its own
(`Owner.context()`); a callback whose context's owner died is dropped, not run. So a crashed
operator's tasks, timers and requests in flight simply never resume (no `finally` runs, nothing it
had decided is sent), while the trial's own callbacks (`ROOT`, owned by nobody) always run.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import heapq
from asyncio import format_helpers
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

_OWNER: contextvars.ContextVar[Owner | None] = contextvars.ContextVar("sim_owner", default=None)


class Owner:
    """One life of a component (a crash ends it; a restart is a new `Owner`)."""

    __slots__ = ("alive", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.alive = True

    def context(self) -> contextvars.Context:
        """A context whose callbacks (and the tasks started in it, and theirs) belong to this life."""
        context = ROOT.copy()
        context.run(_OWNER.set, self)
        return context


ROOT = contextvars.Context()
"""The context of the trial's own callbacks (the scheduler, the kernel, the API server's watches)."""


class _Handle(asyncio.Handle):
    """`asyncio.Handle` as a loop that is never in debug mode makes it (no `get_debug` call, no
    source traceback): a trial schedules a few hundred of them."""

    __slots__ = ()

    def __init__(self, callback: Callable[..., Any], args: tuple[Any, ...], loop: SimLoop,
                 context: contextvars.Context | None) -> None:  # fmt: skip
        _fill(self, callback, args, loop, context)


class _TimerHandle(asyncio.TimerHandle):
    """`asyncio.TimerHandle`, made as `_Handle` is."""

    __slots__ = ()

    def __init__(self, when: float, callback: Callable[..., Any], args: tuple[Any, ...], loop: SimLoop,
                 context: contextvars.Context | None) -> None:  # fmt: skip
        _fill(self, callback, args, loop, context)
        self._when = when
        self._scheduled = False


def _fill(handle: asyncio.Handle, callback: Callable[..., Any], args: tuple[Any, ...], loop: SimLoop,
          context: contextvars.Context | None) -> None:  # fmt: skip
    """The fields `asyncio.Handle.__init__` sets, without its debug-mode work."""
    handle._context = contextvars.copy_context() if context is None else context  # type: ignore[attr-defined]
    handle._loop = loop  # type: ignore[attr-defined]
    handle._callback = callback  # type: ignore[attr-defined]
    handle._args = args  # type: ignore[attr-defined]
    handle._cancelled = False  # type: ignore[attr-defined]
    handle._repr = None  # type: ignore[attr-defined]
    handle._source_traceback = None  # type: ignore[attr-defined]


class SimLoop(asyncio.AbstractEventLoop):
    """An event loop in virtual time (seconds since the trial's start; see `sim.clock`)."""

    def __init__(self) -> None:
        self._now = 0.0
        self._ready: collections.deque[asyncio.Handle] = collections.deque()
        self._timers: list[tuple[float, int, asyncio.TimerHandle]] = []
        self._seq = 0
        self.steps = 0
        """Callbacks run so far (a trial's steps)."""
        self.errors: list[dict[str, Any]] = []
        """What the exception handler was given: an error no production code caught (a trial fails)."""
        # Never in debug mode: a builtin that answers False costs asyncio's every future less than a method.
        self.get_debug = False.__bool__  # type: ignore[method-assign]

    # --- the clock and the scheduler ------------------------------------------------------------

    def time(self) -> float:
        return self._now

    def call_soon(self, callback: Callable[..., Any], *args: Any, context: contextvars.Context | None = None) -> Any:
        handle = _Handle(callback, args, self, context)
        self._ready.append(handle)
        return handle

    def call_at(
        self, when: float, callback: Callable[..., Any], *args: Any, context: contextvars.Context | None = None
    ) -> Any:
        when = max(when, self._now)
        handle = _TimerHandle(when, callback, args, self, context)
        self._seq += 1
        heapq.heappush(self._timers, (when, self._seq, handle))
        return handle

    def call_later(
        self, delay: float, callback: Callable[..., Any], *args: Any, context: contextvars.Context | None = None
    ) -> Any:
        return self.call_at(self._now + delay, callback, *args, context=context)

    def _timer_handle_cancelled(self, handle: asyncio.TimerHandle) -> None:
        """A cancelled timer stays in the heap and is skipped when it comes up."""

    def run_until(self, until: float) -> None:
        """Runs every callback due up to `until` (virtual seconds), then sets the clock to `until`."""
        ready, timers = self._ready, self._timers
        previous = asyncio.events._get_running_loop()
        asyncio.events._set_running_loop(self)
        try:
            while True:
                if ready:
                    handle: asyncio.Handle = ready.popleft()
                elif timers and timers[0][0] <= until:
                    when, _, handle = heapq.heappop(timers)
                    self._now = when
                else:
                    break
                if handle._cancelled:  # type: ignore[attr-defined]
                    continue
                owner = handle._context.get(_OWNER)  # type: ignore[attr-defined]
                if owner is not None and not owner.alive:
                    continue  # its component died: nothing of that life runs again
                self.steps += 1
                # `Handle._run`, inlined (one call less per step), its error report the same.
                try:
                    handle._context.run(handle._callback, *handle._args)  # type: ignore[attr-defined]
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:
                    source = format_helpers._format_callback_source(handle._callback, handle._args)  # type: ignore[attr-defined]
                    self.call_exception_handler(
                        {"message": f"Exception in callback {source}", "exception": exc, "handle": handle}
                    )
        finally:
            asyncio.events._set_running_loop(previous)
        self._now = max(self._now, until)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """This loop as the running loop (for code that starts tasks outside `run_until`)."""
        previous = asyncio.events._get_running_loop()
        asyncio.events._set_running_loop(self)
        try:
            yield
        finally:
            asyncio.events._set_running_loop(previous)

    # --- futures and tasks -----------------------------------------------------------------------

    def create_future(self) -> asyncio.Future[Any]:
        return asyncio.Future(loop=self)

    def create_task(
        self, coro: Coroutine[Any, Any, Any], *, name: str | None = None, context: contextvars.Context | None = None
    ) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=self, name=name, context=context)
        # A task left pending when its component died, or when the trial ended, is not an error.
        task._log_destroy_pending = False  # type: ignore[attr-defined]
        return task

    def abandon(self) -> None:
        """The trial is over: close the coroutine of every task still pending, as the garbage
        collector's finalizer of a suspended coroutine does (its `finally` clauses run, an error
        raised there goes nowhere), only sooner and cheaper: a collection that finalizes a few
        hundred coroutines costs about twice as much as closing them first. Nothing of the trial
        runs after its result is taken, so nothing it reports changes. The tasks are found as asyncio
        finds them (weakly): a strong reference would keep a task that failed unobserved alive past
        the trial, and its "exception was never retrieved" out of the trial's errors."""
        for task in asyncio.all_tasks(self):
            with contextlib.suppress(BaseException):
                task.get_coro().close()

    def start(self, owner: Owner | None, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Runs `coro` as a task of `owner`'s life (None: the trial's own)."""
        with self.running():
            return self.create_task(coro, context=ROOT if owner is None else owner.context())

    # --- what asyncio asks of a loop ---------------------------------------------------------------

    def get_debug(self) -> bool:
        return False  # every future and task asks at its creation (see `__init__`)

    def is_running(self) -> bool:
        return asyncio.events._get_running_loop() is self

    def is_closed(self) -> bool:
        return False

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        self.errors.append(context)

    def default_exception_handler(self, context: dict[str, Any]) -> None:
        self.errors.append(context)
