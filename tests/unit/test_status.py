"""The operator's status writes are level-based: only a changed decision changes the conditions."""

from __future__ import annotations

import datetime

import pytest

from coroner.core import wire as status
from coroner.core.decision import Policy, decide
from coroner.core.model import parse_registration
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


def _by_type(conditions: list[object]) -> dict[str, object]:
    return {c.type: c for c in conditions}  # type: ignore[attr-defined]


def test_the_operators_retirement_reads_terminal_at_once() -> None:
    registration = parse_registration(make_registration())
    decision = decide(registration=registration, facts=make_facts(), policy=Policy(), now=NOW)
    written = _by_type(status.retired_conditions(registration, decision, now=NOW))  # type: ignore[arg-type]
    retirable, retired = written["Retirable"], written["Retired"]
    assert (retirable.status, retirable.reason) == ("False", "AlreadyTerminal")  # type: ignore[attr-defined]
    assert (retired.status, retired.reason) == ("True", "PidfdExited")  # type: ignore[attr-defined]


def test_a_human_retirement_is_made_to_read_terminal_and_keeps_its_retired_condition() -> None:
    # `kubectl coroner apply` may not write Retirable (admission): the row read RETIRED=True next
    # to REASON=RetirePermissionMissing until the operator says AlreadyTerminal.
    human = {
        "type": "Retired",
        "status": "True",
        "reason": "NodeDeleted",
        "message": "retired by alice with kubectl coroner apply",
        "lastTransitionTime": "2026-11-30T17:59:00Z",
        "observedGeneration": 1,
    }
    stale = {**human, "type": "Retirable", "status": "False", "reason": "RetirePermissionMissing", "message": "m"}
    obj = make_registration(conditions=[stale, human], paths={"status.retirement": {"reason": "NodeDeleted"}})
    registration = parse_registration(obj)
    assert not status.reads_terminal(registration)
    decision = decide(registration=registration, facts=make_facts(), policy=Policy(), now=NOW)
    desired = _by_type(status.desired_conditions(registration, decision, now=NOW))  # type: ignore[arg-type]
    assert desired["Retirable"].reason == "AlreadyTerminal"  # type: ignore[attr-defined]
    assert desired["Retired"] == _by_type(list(registration.conditions))["Retired"]
    after = parse_registration(
        make_registration(
            conditions=[{**stale, "reason": "AlreadyTerminal"}, human],
            paths={"status.retirement": {"reason": "NodeDeleted"}},
        )
    )
    assert status.reads_terminal(after)
