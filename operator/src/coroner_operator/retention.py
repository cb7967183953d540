"""When a terminal registration may be deleted: a pure rule, so it is testable without a clock or an API.

A registration is terminal once it is Retired (the operator or a human retired it) or Released (the
worker said goodbye). Terminal registrations are history: they keep the cluster's object count
growing with every worker ever started unless something deletes them. The operator deletes a
terminal registration `--terminal-retention-seconds` after it became terminal (24 h by default; 0
keeps them forever), at the first reconcile at or after that instant (the periodic sweep reconciles
every registration every `--resync-seconds`, so no per-registration timer is needed).

"Became terminal" is read from the object itself, never from the operator's memory, so a restarted
operator (or another replica) reaches the same answer:

* Retired: ``status.retirement.retiredTime``, else the ``Retired=True`` condition's
  ``lastTransitionTime`` (a retirement written without a parsable ``retiredTime``);
* Released: the ``Released=True`` condition's ``lastTransitionTime``;
* both: the earliest of them (it has been history since then).

A terminal registration with none of these times parsable is kept (and the operator says why, once
per version of the object): deleting on a guessed time would be deleting on unknown evidence.
Times are taken as written: one in the future (a skewed clock) delays the deletion by the skew.
"""

from __future__ import annotations

import dataclasses
import datetime

from coroner.core import model
from coroner.core.conditions import find_condition
from coroner.core.reasons import ConditionType

DEFAULT_TERMINAL_RETENTION_SECONDS = 86400.0
"""24 h: long enough to read a night's retirements in the morning, short enough to bound the object count."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Retention:
    """What the retention rule says about one registration as read."""

    terminal: str | None
    """"Retired" or "Released" (Retired wins when both hold); None while the registration is active."""
    since: datetime.datetime | None
    """When it became terminal; None when active or when no time could be read."""
    due: datetime.datetime | None
    """When it may be deleted; None: never (active, retention 0, or no parsable time)."""
    why: str
    """One line for the log: why it is (or is not yet) due."""


def terminal_since(registration: model.Registration) -> datetime.datetime | None:
    """The earliest recorded instant at which `registration` became terminal (None if none parses)."""
    times: list[datetime.datetime] = []
    if registration.retired:
        if registration.retirement is not None and registration.retirement.retired_time is not None:
            times.append(registration.retirement.retired_time)
        retired = find_condition(registration.conditions, type=ConditionType.RETIRED)
        if retired is not None and retired.status == "True" and retired.last_transition_time is not None:
            times.append(retired.last_transition_time)
    if registration.released:
        released = find_condition(registration.conditions, type=ConditionType.RELEASED)
        if released is not None and released.last_transition_time is not None:
            times.append(released.last_transition_time)
    return min(times) if times else None


def deletion_due(registration: model.Registration, *, retention_seconds: float) -> Retention:
    """When `registration` may be deleted under a retention of `retention_seconds` (0: never)."""
    if not registration.terminal:
        return Retention(terminal=None, since=None, due=None, why="active: never deleted")
    terminal = ConditionType.RETIRED.value if registration.retired else ConditionType.RELEASED.value
    since = terminal_since(registration)
    if retention_seconds <= 0:
        return Retention(terminal=terminal, since=since, due=None, why="retention 0: terminal registrations are kept")
    if since is None:
        where = (
            "neither status.retirement.retiredTime nor the Retired condition's lastTransitionTime parses"
            if registration.retired
            else "the Released condition's lastTransitionTime does not parse"
        )
        return Retention(
            terminal=terminal,
            since=None,
            due=None,
            why=f"{terminal} but {where}: kept (a guessed time would be deleting on unknown evidence; "
            "delete it by hand once reviewed)",
        )
    due = since + datetime.timedelta(seconds=retention_seconds)
    return Retention(
        terminal=terminal,
        since=since,
        due=due,
        why=f"{terminal} since {model.format_time(since)}, retention {retention_seconds:g}s",
    )
