"""Event aggregation under bursts: client-go's EventCorrelator, adapted to many objects dying at once.

client-go's recorder (tools/record/events_cache.go) aggregates per *object*: after 10 Events about
one object that differ only by message within 10 minutes (`EventAggregatorByReasonFunc`) it writes
"(combined from similar events): ..." instead, and a token bucket per source and object
(`EventSourceObjectSpamFilter`) bounds the rest. Coroner's burst is the other shape: one Event
about each of *many* objects (a mass death retires 2,000 registrations in a minute, which would be
2,000 more API writes on top of the retirements themselves). So here:

* the budget is per **namespace** and per **window** (tumbling: a namespace's window opens with its
  first Event after the previous window ended and lasts `window_seconds`): the first `burst` Events
  of a window are posted one by one, each about its own registration (`kubectl describe` shows it);
* past the budget, similar Events — same namespace, reason and evidence (the aggregation key) — are
  combined into one aggregate per key, posted when the window ends, whose `count` is how many it
  combines and whose message names how many and the first few names. Its involvedObject is the
  first registration it combines.

Hence per namespace and window at most `burst` individual writes plus one per key (reasons x
evidence paths: a handful), whatever the number of deaths. Nothing is dropped: every Event observed
is either posted individually or counted in exactly one aggregate (`pending` until flushed; the
operator flushes on every tick and at shutdown). The retirement itself never depends on any Event:
it is in the registration's status (Retired condition, status.retirement) the moment it is written.

Pure: time is passed in, nothing here does I/O; `coroner_operator.events` posts what it returns.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

DEFAULT_BURST = 10
"""Individual Events per namespace per window (client-go aggregates after 10 similar ones too)."""
DEFAULT_WINDOW_SECONDS = 60.0
"""The window; also the longest an aggregated retirement waits for its Event."""
NAMES_SHOWN = 5
"""Registrations named in an aggregate's message (the count says how many more)."""

Key = tuple[str, str, str]
"""(namespace, reason, evidence): what makes two Events similar."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Outgoing:
    """One Event write: an individual Event (count 1) or an aggregate of `count` similar ones."""

    key: Key
    involved: Mapping[str, Any]
    """The registration as written (the Event's involvedObject)."""
    message: str
    count: int
    first_time: datetime.datetime
    last_time: datetime.datetime
    window_start: datetime.datetime
    """The namespace window this write belongs to (what the write bound is counted against)."""
    names: tuple[str, ...] = ()
    """For an aggregate: the first registrations it combines (NAMES_SHOWN at most)."""

    @property
    def aggregated(self) -> bool:
        return self.count > 1 or bool(self.names)

    @property
    def reason(self) -> str:
        return self.key[1]


@dataclasses.dataclass(slots=True)
class _Aggregate:
    involved: Mapping[str, Any]
    first_time: datetime.datetime
    last_time: datetime.datetime
    count: int = 0
    names: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(slots=True)
class _Window:
    start: datetime.datetime
    individual: int = 0
    aggregates: dict[Key, _Aggregate] = dataclasses.field(default_factory=dict)


class EventCorrelator:
    """Decides, per Event, whether it is posted now or combined; see the module docstring."""

    def __init__(self, *, burst: int = DEFAULT_BURST, window_seconds: float = DEFAULT_WINDOW_SECONDS) -> None:
        if burst < 0 or not window_seconds > 0:
            raise ValueError(f"burst must be >= 0 and window_seconds > 0, got {burst}, {window_seconds}")
        self.burst = burst
        self.window = datetime.timedelta(seconds=window_seconds)
        self._windows: dict[str, _Window] = {}

    @property
    def pending(self) -> int:
        """Events combined into aggregates not yet returned for posting."""
        return sum(a.count for w in self._windows.values() for a in w.aggregates.values())

    def observe(
        self,
        *,
        involved: Mapping[str, Any],
        reason: str,
        evidence: str,
        message: str,
        now: datetime.datetime,
    ) -> list[Outgoing]:
        """One Event to record about `involved`; returns the writes due now (this one, if it is
        within the budget, and the aggregates of this namespace's window if that just ended)."""
        meta = involved.get("metadata") or {}
        namespace = str(meta.get("namespace") or "")
        name = str(meta.get("name") or "?")
        key: Key = (namespace, reason, evidence)
        out: list[Outgoing] = []
        window = self._windows.get(namespace)
        if window is not None and now >= window.start + self.window:
            out += self._close(namespace)
            window = None
        if window is None:
            window = self._windows[namespace] = _Window(start=now)
        if window.individual < self.burst:
            window.individual += 1
            single = Outgoing(
                key=key, involved=involved, message=message, count=1, first_time=now, last_time=now,
                window_start=window.start,
            )  # fmt: skip
            out.append(single)
            return out
        aggregate = window.aggregates.get(key)
        if aggregate is None:
            aggregate = window.aggregates[key] = _Aggregate(involved=involved, first_time=now, last_time=now)
        aggregate.count += 1
        aggregate.last_time = max(aggregate.last_time, now)
        if len(aggregate.names) < NAMES_SHOWN:
            aggregate.names.append(name)
        return out

    def flush(self, *, now: datetime.datetime | None = None) -> list[Outgoing]:
        """The aggregates of every window ended by `now` (all of them, whatever their age, when None:
        at shutdown). A namespace whose window ended is forgotten: its next Event opens a new one."""
        out: list[Outgoing] = []
        for namespace in list(self._windows):
            if now is None or now >= self._windows[namespace].start + self.window:
                out += self._close(namespace)
        return out

    def _close(self, namespace: str) -> list[Outgoing]:
        window = self._windows.pop(namespace)
        return [
            Outgoing(
                key=key,
                involved=aggregate.involved,
                message=aggregate_message(key, aggregate.count, aggregate.names, window_seconds=self.window),
                count=aggregate.count,
                first_time=aggregate.first_time,
                last_time=aggregate.last_time,
                window_start=window.start,
                names=tuple(aggregate.names),
            )
            for key, aggregate in window.aggregates.items()
        ]


def aggregate_message(key: Key, count: int, names: list[str], *, window_seconds: datetime.timedelta) -> str:
    """`PidfdExited: 1990 registrations ... (combined from similar events): w1, w2, ... and 1985 more`."""
    namespace, reason, evidence = key
    shown = ", ".join(names)
    more = count - len(names)
    listed = f"{shown} and {more} more" if more > 0 else shown
    return (
        f"{evidence}: {count} more registrations {reason.lower()} in namespace {namespace} within "
        f"{window_seconds.total_seconds():g}s (combined from similar events; each one's own status.retirement "
        f"and Retired condition say when and why): {listed}"
    )
