"""Memos of pure production functions, by the value of their arguments, for the length of one trial.

A trial asks the same pure questions again and again — the same `/proc` texts parsed on every
probe, the same transition times rendered on every reconcile, the same timestamps parsed in every
registration — and most of a trial's CPU time is production code. Each function below is pure (its
answer depends on its arguments only, it has no side effect) and returns an immutable value (a
string, a datetime, None, or a frozen dataclass), so answering a repeated question from a memo is
invisible to everything downstream: the production function still answers every distinct question
of every trial. `tests/sim/test_sim.py` checks that a batch with the memos and one without give the
same summary, step for step.

The memos are emptied at the start of each trial (`clear`), so a trial never sees an answer computed
under another trial, or under another mutant. Only arguments of exactly the hashable types the
function is called with are memoized (`True == 1` must not answer for `1`); anything else, and any
call that raises, goes straight to the function.
"""

from __future__ import annotations

import contextlib
import datetime
import sys
from collections.abc import Callable, Iterator
from typing import Any

from sim.prod import conditions, decision_facts, model, procfs

_MISS = object()
_CACHES: list[dict[Any, Any]] = []


def clear() -> None:
    for cache in _CACHES:
        cache.clear()


def _text_arg(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """One positional argument, memoized when it is a `str` (parse_stat, parse_status, parse_time)."""
    cache: dict[str, Any] = {}
    _CACHES.append(cache)

    def memo(raw: Any) -> Any:
        if type(raw) is not str:
            return fn(raw)
        hit = cache.get(raw, _MISS)
        if hit is _MISS:
            hit = cache[raw] = fn(raw)
        return hit

    return memo


def _format_time(fn: Callable[..., str]) -> Callable[..., str]:
    # One cache per value of `fraction` (False, True): the instant alone is the key.
    caches: tuple[dict[datetime.datetime, str], dict[datetime.datetime, str]] = ({}, {})
    _CACHES.extend(caches)

    def memo(value: Any, *, fraction: Any = False) -> str:
        if type(value) is not datetime.datetime or type(fraction) is not bool:
            return fn(value, fraction=fraction)
        cache = caches[fraction]
        hit = cache.get(value)
        if hit is None:
            hit = cache[value] = fn(value, fraction=fraction)
        return hit

    return memo


def _instant(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """One datetime argument (conditions._whole_seconds), memoized by its value, zone and fold: an
    equal instant in another zone is another question."""
    cache: dict[tuple[object, ...], Any] = {}
    _CACHES.append(cache)

    def memo(moment: Any) -> Any:
        if type(moment) is not datetime.datetime:
            return fn(moment)
        key = (moment, moment.tzinfo, moment.fold)
        hit = cache.get(key, _MISS)
        if hit is _MISS:
            hit = cache[key] = fn(moment)
        return hit

    return memo


def _lease_expiry(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """decision.lease_expiry(renew_time, duration_seconds): a datetime (by value, zone and fold) and
    a number (by value and type)."""
    cache: dict[tuple[object, ...], Any] = {}
    _CACHES.append(cache)

    def memo(renew_time: Any, duration_seconds: Any) -> Any:
        if type(renew_time) is not datetime.datetime or type(duration_seconds) not in (int, float):
            return fn(renew_time, duration_seconds)
        key = (renew_time, renew_time.tzinfo, renew_time.fold, duration_seconds, type(duration_seconds))
        hit = cache.get(key, _MISS)
        if hit is _MISS:
            hit = cache[key] = fn(renew_time, duration_seconds)
        return hit

    return memo


def _recorded_incarnation(fn: Callable[..., Any]) -> Callable[..., Any]:
    cache: dict[tuple[object, ...], Any] = {}
    _CACHES.append(cache)

    def memo(*, boot_id: Any, pid_namespace: Any, pid: Any, start_time: Any, pidfd_inode: Any = None) -> Any:
        fields = {
            "boot_id": boot_id, "pid_namespace": pid_namespace, "pid": pid, "start_time": start_time,
            "pidfd_inode": pidfd_inode,
        }  # fmt: skip
        try:
            key = tuple((type(value), value) for value in fields.values())
            hit = cache.get(key, _MISS)
        except TypeError:  # unhashable: not a question the memo answers
            return fn(**fields)
        if hit is _MISS:
            hit = cache[key] = fn(**fields)
        return hit

    return memo


def _process_view(fn: Callable[..., Any]) -> Callable[..., Any]:
    cache: dict[tuple[object, ...], Any] = {}
    _CACHES.append(cache)

    def memo(
        *,
        stat: Any,
        status: Any,
        pid_namespace_link: Any,
        proc_pid_namespace: Any = None,
        namespace_required: Any = True,
    ) -> Any:
        key = (type(stat), stat, type(status), status, type(pid_namespace_link), pid_namespace_link,
               type(proc_pid_namespace), proc_pid_namespace, namespace_required)  # fmt: skip
        try:
            hit = cache.get(key, _MISS)
        except TypeError:
            hit = _MISS
            key = None
        if hit is _MISS:
            hit = fn(
                stat=stat,
                status=status,
                pid_namespace_link=pid_namespace_link,
                proc_pid_namespace=proc_pid_namespace,
                namespace_required=namespace_required,
            )
            if key is not None:
                cache[key] = hit
        return hit

    return memo


#: (the module that defines it, its name, the memo's maker). Each is replaced wherever a production
#: module binds that very function object (`from coroner.core.model import format_time` included).
PURE: tuple[tuple[Any, str, Callable[[Any], Any]], ...] = (
    (procfs, "parse_stat", _text_arg),
    (procfs, "parse_status", _text_arg),
    (procfs, "process_view", _process_view),
    (procfs, "recorded_incarnation", _recorded_incarnation),
    (model, "parse_time", _text_arg),
    (model, "format_time", _format_time),
    (decision_facts, "lease_expiry", _lease_expiry),
    (conditions, "_whole_seconds", _instant),
)
_PRODUCTION = ("coroner", "coroner_agent", "coroner_operator")


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """Each function of `PURE` memoized in every production module that binds it; restored on exit."""
    saved: list[tuple[Any, str, Any]] = []
    ours = len(_CACHES)
    modules = [m for name, m in list(sys.modules.items()) if m is not None and name.split(".")[0] in _PRODUCTION]
    try:
        for owner, name, maker in PURE:
            original = getattr(owner, name)
            memo = maker(original)
            for module in modules:
                if module.__dict__.get(name) is original:
                    saved.append((module, name, original))
                    setattr(module, name, memo)
        yield
    finally:
        for module, name, original in reversed(saved):
            setattr(module, name, original)
        del _CACHES[ours:]
