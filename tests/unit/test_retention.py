"""When a terminal registration may be deleted (coroner_operator.retention): the time it is counted
from, the retention, and the cases where it is kept forever."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

import pytest

from coroner.core.model import format_time, parse_registration
from coroner_operator.retention import DEFAULT_TERMINAL_RETENTION_SECONDS, deletion_due, terminal_since
from unit.builders import NOW, make_registration

pytestmark = pytest.mark.unit

H = datetime.timedelta(hours=1)
DAY = DEFAULT_TERMINAL_RETENTION_SECONDS


def cond(type_: str, status: str = "True", at: datetime.datetime | str | None = NOW - H) -> dict[str, object]:
    found: dict[str, object] = {"type": type_, "status": status, "reason": "Because", "message": ""}
    if at is not None:
        found["lastTransitionTime"] = format_time(at) if isinstance(at, datetime.datetime) else at
    return found


def retirement(at: datetime.datetime | str | None = NOW - H) -> dict[str, object]:
    record: dict[str, object] = {"retiredBy": "op", "reason": "PidfdExited", "decision": "EligibleStaleOrphan"}
    if at is not None:
        record["retiredTime"] = format_time(at) if isinstance(at, datetime.datetime) else at
    return record


def registration(*conditions: Mapping[str, object], paths: Mapping[str, object] | None = None) -> Any:
    return parse_registration(make_registration(conditions=conditions, paths=paths))


@pytest.mark.parametrize(
    ("conditions", "paths", "retention", "terminal", "since", "due"),
    [
        pytest.param((), {}, DAY, None, None, None, id="active-never"),
        pytest.param((cond("Released", "False"),), {}, DAY, None, None, None, id="released-false-is-active"),
        pytest.param(
            (cond("Retired"),), {"status.retirement": retirement(NOW - 2 * H)}, DAY,
            "Retired", NOW - 2 * H, NOW - 2 * H + 24 * H, id="retired-from-retiredTime",
        ),
        pytest.param(
            (cond("Retired", at=NOW - 3 * H),), {"status.retirement": retirement(None)}, DAY,
            "Retired", NOW - 3 * H, NOW + 21 * H, id="retired-no-retiredTime-uses-condition",
        ),
        pytest.param(
            (cond("Retired", at="yesterday"),), {"status.retirement": retirement("soon")}, DAY,
            "Retired", None, None, id="retired-no-parsable-time-kept",
        ),
        pytest.param(
            (), {"status.retirement": retirement(NOW - H)}, DAY,
            "Retired", NOW - H, NOW + 23 * H, id="retirement-without-condition",
        ),
        pytest.param(
            (cond("Released", at=NOW - 30 * H),), {}, DAY,
            "Released", NOW - 30 * H, NOW - 6 * H, id="released-from-lastTransitionTime",
        ),
        pytest.param((cond("Released", at=None),), {}, DAY, "Released", None, None, id="released-no-time-kept"),
        pytest.param(
            (cond("Released", at="2026-13-01T00:00:00Z"),), {}, DAY, "Released", None, None,
            id="released-garbage-time-kept",
        ),
        pytest.param(
            (cond("Retired", at=NOW - H), cond("Released", at=NOW - 5 * H)),
            {"status.retirement": retirement(NOW - H)}, DAY,
            "Retired", NOW - 5 * H, NOW + 19 * H, id="both-counted-from-the-earliest",
        ),
        pytest.param(
            (cond("Released", at=NOW - 30 * H),), {}, 0.0, "Released", NOW - 30 * H, None, id="retention-0-keeps",
        ),
        pytest.param(
            (cond("Released", at=NOW - 30 * H),), {}, 5.0,
            "Released", NOW - 30 * H, NOW - 30 * H + datetime.timedelta(seconds=5), id="short-retention",
        ),
        pytest.param(
            (cond("Released", at=NOW + H),), {}, DAY, "Released", NOW + H, NOW + 25 * H,
            id="future-time-taken-as-written",
        ),
    ],
)  # fmt: skip
def test_deletion_due(
    conditions: tuple[Mapping[str, object], ...],
    paths: Mapping[str, object],
    retention: float,
    terminal: str | None,
    since: datetime.datetime | None,
    due: datetime.datetime | None,
) -> None:
    r = registration(*conditions, paths=paths)
    verdict = deletion_due(r, retention_seconds=retention)
    assert (verdict.terminal, verdict.since, verdict.due) == (terminal, since, due)
    assert verdict.why


def test_a_kept_registration_says_which_time_did_not_parse() -> None:
    released = deletion_due(registration(cond("Released", at=None)), retention_seconds=DAY)
    assert "Released condition's lastTransitionTime does not parse" in released.why and "kept" in released.why
    retired = deletion_due(
        registration(cond("Retired", at=None), paths={"status.retirement": retirement(None)}), retention_seconds=DAY
    )
    assert "retiredTime" in retired.why and "kept" in retired.why


def test_terminal_since_of_an_active_registration_is_none() -> None:
    assert terminal_since(registration()) is None
