"""Virtual time: seconds (a float) since a fixed epoch; each component reads it through its own skew.

The operator is given its clock (`dt` of the trial's loop time plus its skew) and its loop
(`sim.loop`). The agent takes its clock as a parameter (`SimAgent.clock`) and asks for its timers as
data (`AgentEffects.requeue_at`): nothing of either is patched here.
"""

from __future__ import annotations

import datetime
from typing import Any

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
