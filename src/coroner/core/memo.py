"""Remembered answers of the core's pure functions: off unless a caller turns them on.

A few pure functions (their answer depends on their arguments only, and is immutable: a string, a
datetime, None, a frozen dataclass) are asked the same question many times over by a caller that
replays the same inputs — the simulation parses the same `/proc` texts on every probe, renders the
same transition times on every reconcile and parses the same immutable bodies in every component.
Each such function is built with one of the wrappers below. While `remembering()` is active they
answer a repeated question from a memo; otherwise (production, always) a call goes straight to the
function after one test of a module flag, so the production path does not change in what it
computes and barely in what it costs.

Only arguments of exactly the types a function is built for are remembered (`True == 1` must not
answer for `1`, nor an instant in one zone for the equal instant in another); anything else, and
any call that raises, goes straight to the function. `forget()` empties every memo: the caller
decides what a memo's lifetime is (the simulation: one trial).
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

R = TypeVar("R")

_MISS: Any = object()
_CACHES: list[dict[Any, Any]] = []
#: Whether memos answer (a one-element list: read on every call, set only by `remembering`).
_ON = [False]


def forget() -> None:
    """Empties every memo."""
    for cache in _CACHES:
        cache.clear()


class remembering:  # named as the function it is used as: `with memo.remembering():`
    """Memos answer while this is active; every memo is emptied when it ends."""

    def __enter__(self) -> None:
        self._previous = _ON[0]
        _ON[0] = True

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        _ON[0] = self._previous
        forget()


def _new_cache() -> dict[Any, Any]:
    cache: dict[Any, Any] = {}
    _CACHES.append(cache)
    return cache


def by_text(fn: Callable[[Any], R]) -> Callable[[Any], R]:
    """One positional argument, remembered when it is a `str`."""
    cache = _new_cache()
    on = _ON

    @functools.wraps(fn)
    def remembered(raw: Any) -> R:
        if not on[0] or type(raw) is not str:
            return fn(raw)
        hit = cache.get(raw, _MISS)
        if hit is _MISS:
            hit = cache[raw] = fn(raw)
        return hit  # type: ignore[no-any-return]

    return remembered


def _instant_key(moment: datetime.datetime) -> tuple[object, ...]:
    return (moment, moment.tzinfo, moment.fold)


def by_instant(fn: Callable[[Any], R]) -> Callable[[Any], R]:
    """One datetime argument, remembered by its value, zone and fold."""
    cache = _new_cache()
    on = _ON

    @functools.wraps(fn)
    def remembered(moment: Any) -> R:
        if not on[0] or type(moment) is not datetime.datetime:
            return fn(moment)
        key = _instant_key(moment)
        hit = cache.get(key, _MISS)
        if hit is _MISS:
            hit = cache[key] = fn(moment)
        return hit  # type: ignore[no-any-return]

    return remembered


def by_key(key: Callable[..., object]) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Remembered by `key(*args, **kwargs)`, which says None for a question not to remember (an
    argument of another type than the function is built for)."""

    def wrap(fn: Callable[..., R]) -> Callable[..., R]:
        cache = _new_cache()
        on = _ON

        @functools.wraps(fn)
        def remembered(*args: Any, **kwargs: Any) -> R:
            if not on[0]:
                return fn(*args, **kwargs)
            found = key(*args, **kwargs)
            if found is None:
                return fn(*args, **kwargs)
            hit = cache.get(found, _MISS)
            if hit is _MISS:
                hit = cache[found] = fn(*args, **kwargs)
            return hit  # type: ignore[no-any-return]

        return remembered

    return wrap


def by_fields(fn: Callable[..., R]) -> Callable[..., R]:
    """Keyword arguments only, remembered by each one's name, type and value (an unhashable value
    is not remembered)."""
    cache = _new_cache()
    on = _ON

    @functools.wraps(fn)
    def remembered(**fields: Any) -> R:
        if not on[0]:
            return fn(**fields)
        found = tuple((name, type(value), value) for name, value in fields.items())
        try:
            hit = cache.get(found, _MISS)
        except TypeError:
            return fn(**fields)
        if hit is _MISS:
            hit = cache[found] = fn(**fields)
        return hit  # type: ignore[no-any-return]

    return remembered


def by_identity(fn: Callable[..., R]) -> Callable[..., R]:
    """One positional object (immutable to every caller that turns memos on) and keyword options,
    remembered by the object's identity; the memo keeps the object alive, so its id is not reused
    while it is a key."""
    cache = _new_cache()
    on = _ON

    @functools.wraps(fn)
    def remembered(obj: Any, **options: Any) -> R:
        if not on[0]:
            return fn(obj, **options)
        found = (id(obj), *options.items())
        hit = cache.get(found)
        if hit is not None and hit[0] is obj:
            return hit[1]  # type: ignore[no-any-return]
        answer = fn(obj, **options)
        cache[found] = (obj, answer)
        return answer

    return remembered


def instant_and_number(moment: object, number: object) -> object:
    """`by_key`'s key for (a datetime, an int or float): None for anything else."""
    if type(moment) is not datetime.datetime or type(number) not in (int, float):
        return None
    return (moment, moment.tzinfo, moment.fold, number, type(number))
