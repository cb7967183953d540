"""Deliberately broken variants of production code, to prove the oracles bite.

Each mutant is a context manager that monkeypatches one production function (or property) in
this process for the duration of a run, and restores it after; no source file is ever edited.
`MUTANTS` maps a name to (installer, what it breaks, the oracle expected to catch it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from sim.prod import Evidence, Verdict, agent_probe, agent_verdict, decision, procfs, retire_protocol, wire

#: The trial being run (a mutant that needs the API server reads it; set by the runner).
ACTIVE: list[Any] = []


@contextlib.contextmanager
def _patched(owner: Any, name: str, replacement: Any) -> Iterator[None]:
    saved = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, saved)


@contextlib.contextmanager
def retire_without_rv_test() -> Iterator[None]:
    """The retirement patch without its `test` of /metadata/resourceVersion (wherever it is bound:
    the wire module and the one retire protocol)."""
    original = wire.retirement_ops

    def mutant(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        ops = original(*args, **kwargs)
        return [op for op in ops if not (op["op"] == "test" and op["path"] == "/metadata/resourceVersion")]

    owners = [m for m in (wire, retire_protocol) if hasattr(m, "retirement_ops")]
    with contextlib.ExitStack() as stack:
        for owner in owners:
            stack.enter_context(_patched(owner, "retirement_ops", mutant))
        yield


def trust_procabsent_nonroot() -> contextlib.AbstractContextManager[None]:
    """The agent believes its /proc shows every process even from a child pid namespace."""
    return _patched(agent_probe.LocalNode, "sees_every_process", property(lambda self: True))


class _AnyTick(int):
    """A start time that equals every start time: the probe's start-time checks all pass."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, int)

    def __ne__(self, other: object) -> bool:
        return not isinstance(other, int)

    __hash__ = int.__hash__


def skip_start_time_check() -> contextlib.AbstractContextManager[None]:
    """The probe matches a pid without comparing its start time (a reused pid reads as the worker)."""
    original = procfs.recorded_incarnation

    def mutant(**kwargs: Any) -> procfs.IncarnationKey:
        key = original(**kwargs)
        return procfs.IncarnationKey(
            boot_id=key.boot_id, pid_namespace=key.pid_namespace, pid=key.pid, start_time=_AnyTick(key.start_time)
        )

    return _patched(procfs, "recorded_incarnation", mutant)


def reused_read_as_dead() -> contextlib.AbstractContextManager[None]:
    """The probe reads any pid number held by another start time as the incarnation's death (instead
    of showing that the namespace holding it was made after the incarnation)."""

    def mutant(*, key: Any, view: Any, reuser: Any, reuser_exited: bool, note: str) -> Any:
        return agent_verdict.ProbeResult(
            verdict=Verdict.DEAD,
            evidence=Evidence.PID_NAMESPACE_RECREATED,
            detail=f"pid {key.pid} is held by another start time ({note})",
            host_pid=view.host_pid,
        )

    return _patched(agent_verdict, "reused", mutant)


def future_heartbeat_expiry() -> contextlib.AbstractContextManager[None]:
    """The decision reads a heartbeat from the future (negative silence) as expired."""
    original = decision.conjunction._silent

    def mutant(trail: Any, *, known: Any, registration: Any, window: Any) -> Any:
        if known.last_heartbeat > trail.now:
            return None
        return original(trail, known=known, registration=registration, window=window)

    return _patched(decision.conjunction, "_silent", mutant)


def retire_on_stale_cached_view() -> contextlib.AbstractContextManager[None]:
    """The retirement decided on the cached object, but its precondition taken from a fresh read
    (the resourceVersion of the object as it is now, no test of the attestation relied on)."""
    original = wire.status_ops

    def mutant(*, body: Any, resource_version: str, conditions: Any, retirement: Any = None) -> list[dict[str, Any]]:
        if retirement is None or not ACTIVE:
            return original(body=body, resource_version=resource_version, conditions=conditions, retirement=retirement)
        meta = body.get("metadata") or {}
        fresh = ACTIVE[-1].server.objects.get(("wreg", meta.get("namespace"), meta.get("name")))
        if fresh is not None:
            resource_version = fresh["metadata"]["resourceVersion"]
        ops = original(body=body, resource_version=resource_version, conditions=conditions, retirement=retirement)
        return [op for op in ops if op["path"] != "/status/attestation" or op["op"] != "test"]

    return _patched(wire, "status_ops", mutant)


MUTANTS: dict[str, tuple[Callable[[], contextlib.AbstractContextManager[None]], str, str]] = {
    "retire_without_rv_test": (
        retire_without_rv_test,
        "the retirement CAS without its resourceVersion test",
        "stale_view",
    ),
    "trust_procabsent_nonroot": (
        trust_procabsent_nonroot,
        "ProcAbsent trusted from a non-root pid namespace",
        "live_retired",
    ),
    "skip_start_time_check": (skip_start_time_check, "the probe skips the start-time check", "wrong_reason"),
    "reused_read_as_dead": (reused_read_as_dead, "any Reused read as Dead", "live_attested_dead"),
    "future_heartbeat_expiry": (future_heartbeat_expiry, "a heartbeat from the future read as expiry", "wrong_reason"),
    "retire_on_stale_cached_view": (retire_on_stale_cached_view, "retire on a stale cached view", "stale_view"),
}
