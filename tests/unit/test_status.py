"""The operator's status writes are level-based: only a changed decision changes the conditions."""

from __future__ import annotations

import datetime

import pytest

from coroner.decision import Policy, decide
from coroner.model import parse_registration
from coroner_operator import status
from unit.builders import NOW, make_facts, make_registration

pytestmark = pytest.mark.unit

S = datetime.timedelta(seconds=1)


def _desired(obj: dict[str, object], now: datetime.datetime) -> list[dict[str, object]]:
    registration = parse_registration(obj)
    decision = decide(registration=registration, facts=make_facts(), policy=Policy(), now=now)
    return [
        {"type": c.type, "status": c.status, "reason": c.reason, "message": c.message}
        for c in status.desired_conditions(registration, decision, now=now)
    ]


def test_an_agent_refresh_of_an_unchanged_verdict_changes_no_condition() -> None:
    # The agent re-attests an Alive worker every few minutes with a new observedTime; that alone
    # must not make the operator write (measured: ~2500 writes/min at 10 000 registrations).
    first = make_registration(verdict="Alive", evidence="PidfdPinned", observed_at=NOW - 300 * S)
    refreshed = make_registration(verdict="Alive", evidence="PidfdPinned", observed_at=NOW - 1 * S)
    assert _desired(first, NOW) == _desired(refreshed, NOW)


def test_waiting_for_the_corroboration_window_changes_no_condition_as_time_passes() -> None:
    obj = make_registration(evidence="ProcAbsent", heartbeat_at=NOW - 2 * S)
    assert _desired(obj, NOW) == _desired(obj, NOW + 3 * S)
