"""Virtual time: seconds (a float) since a fixed epoch; each component reads it through its own skew.

The operator is given its clock (`dt` of the trial's loop time plus its skew) and its loop
(`sim.loop`). The agent takes its clock as a parameter (`SimAgent.clock`) and asks for its timers as
data (`AgentEffects.requeue_at`): nothing of either is patched here.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator
from typing import Any

from sim import memo
from sim.prod import model

EPOCH = datetime.datetime(2026, 12, 1, 12, 0, 0, tzinfo=datetime.UTC)


_LAST_DT: list[Any] = [None, None]


def dt(t: float) -> datetime.datetime:
    """The instant `t` seconds after EPOCH (the last one asked is kept: many ask at the same instant)."""
    last = _LAST_DT
    if last[0] == t and type(t) is type(last[0]):
        return last[1]  # type: ignore[no-any-return]
    moment = EPOCH + datetime.timedelta(seconds=t)
    last[0], last[1] = t, moment
    return moment


def iso(t: float, *, fraction: bool = True) -> str:
    return model.format_time(dt(t), fraction=fraction)


#: parse_registration results by the identity of the (immutable) body parsed; see `installed`.
PARSED: dict[tuple[int, bool], tuple[Any, Any]] = {}
_parse = model.parse_registration


def _memo_parse(obj: object, *, raw_attestation: bool = True) -> Any:
    key = (id(obj), raw_attestation)
    hit = PARSED.get(key)
    if hit is not None and hit[0] is obj:
        return hit[1]
    registration = _parse(obj, raw_attestation=raw_attestation)
    PARSED[key] = (obj, registration)
    return registration


@contextlib.contextmanager
def installed(*, memos: bool = True) -> Iterator[None]:
    """Memoizes `model.parse_registration` by the identity of the body: the model API server's
    bodies are immutable, the parse is pure, and the agent, the operator and the oracles parse
    the very same objects (the trial clears the memo, which also keeps each body alive while its
    id is a key). With `memos`, the pure functions of `sim.memo` are memoized by value too."""
    saved = model.parse_registration
    model.parse_registration = _memo_parse  # type: ignore[assignment]
    try:
        with memo.installed() if memos else contextlib.nullcontext():
            yield
    finally:
        model.parse_registration = saved
        PARSED.clear()
