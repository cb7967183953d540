"""Conditions follow apimachinery's SetStatusCondition: transitions move only on a status flip."""

from __future__ import annotations

import datetime

import pytest

from coroner.core.conditions import ConditionStatus, find_condition, render_condition, render_conditions, set_condition
from coroner.core.model import Condition, parse_registration
from coroner.core.reasons import ConditionType
from unit.builders import NOW, make_registration

pytestmark = pytest.mark.unit

EARLIER = NOW - datetime.timedelta(hours=1)
LATER = NOW + datetime.timedelta(minutes=5, microseconds=123456)


def retirable(
    status: str = "False", reason: str = "HeartbeatNotExpired", when: datetime.datetime = EARLIER
) -> Condition:
    return Condition(
        type="Retirable",
        status=status,
        reason=reason,
        message="old message",
        last_transition_time=when,
        observed_generation=1,
    )


def test_new_condition_is_appended_with_now() -> None:
    attested = Condition(type="Attested", status="True", reason="Dead", message="", last_transition_time=EARLIER)
    result = set_condition(
        [attested],
        type=ConditionType.RETIRABLE,
        status=ConditionStatus.FALSE,
        reason="PidAlive",
        message="alive",
        observed_generation=3,
        now=NOW,
    )
    assert result == [
        attested,
        Condition(
            type="Retirable",
            status="False",
            reason="PidAlive",
            message="alive",
            last_transition_time=NOW,
            observed_generation=3,
        ),
    ]


def test_same_status_keeps_transition_time_and_updates_the_rest() -> None:
    (updated,) = set_condition(
        [retirable()],
        type="Retirable",
        status="False",
        reason="PidAlive",
        message="new",
        observed_generation=2,
        now=LATER,
    )
    assert updated.last_transition_time == EARLIER
    assert (updated.reason, updated.message, updated.observed_generation) == ("PidAlive", "new", 2)


def test_flip_moves_transition_time() -> None:
    (updated,) = set_condition(
        [retirable()],
        type="Retirable",
        status=True,
        reason="EligibleStaleOrphan",
        message="m",
        observed_generation=1,
        now=LATER,
    )
    assert updated.status == "True"
    # metav1.Time serialises whole seconds; the stored value must equal what comes back.
    assert updated.last_transition_time == LATER.replace(microsecond=0)


def test_observed_generation_always_set() -> None:
    (updated,) = set_condition(
        [retirable()], type="Retirable", status="False", reason="HeartbeatNotExpired", message="old message",
        observed_generation=7, now=LATER,
    )  # fmt: skip
    assert updated.observed_generation == 7
    assert updated.last_transition_time == EARLIER


def test_unchanged_is_equal_so_nothing_is_written() -> None:
    before = [retirable()]
    after = set_condition(
        before, type="Retirable", status="False", reason="HeartbeatNotExpired", message="old message",
        observed_generation=1, now=LATER,
    )  # fmt: skip
    assert after == before


def test_unchanged_keeps_the_very_record() -> None:
    # The sweep sets three conditions on every registration; what already says it is kept as is.
    before = [retirable()]
    (after,) = set_condition(
        before, type="Retirable", status="False", reason="HeartbeatNotExpired", message="old message",
        observed_generation=1, now=LATER,
    )  # fmt: skip
    assert after is before[0]


def test_input_is_not_modified_and_order_is_kept() -> None:
    first = Condition(type="Attested", status="True", reason="Dead", last_transition_time=EARLIER)
    last = Condition(type="Released", status="False", reason="Running", last_transition_time=EARLIER)
    before = [first, retirable(), last]
    snapshot = list(before)
    after = set_condition(
        before, type="Retirable", status="True", reason="X", message="", observed_generation=1, now=NOW
    )
    assert before == snapshot
    assert [c.type for c in after] == ["Attested", "Retirable", "Released"]


def test_missing_transition_time_is_repaired() -> None:
    broken = Condition(type="Retirable", status="False", reason="X")
    (updated,) = set_condition(
        [broken], type="Retirable", status="False", reason="X", message="", observed_generation=1, now=NOW
    )
    assert updated.last_transition_time == NOW


def test_invalid_status_is_refused() -> None:
    with pytest.raises(ValueError):
        set_condition([], type="Retirable", status="Maybe", reason="X", message="", observed_generation=1, now=NOW)


def test_find_condition() -> None:
    conditions = [retirable(), Condition(type="Attested", status="True")]
    assert find_condition(conditions, type=ConditionType.ATTESTED) == conditions[1]
    assert find_condition(conditions, type="Retired") is None


def test_render_is_camel_case_and_zulu() -> None:
    rendered = render_condition(retirable(when=datetime.datetime(2026, 11, 30, 18, 0, 0, tzinfo=datetime.UTC)))
    assert rendered == {
        "type": "Retirable",
        "status": "False",
        "reason": "HeartbeatNotExpired",
        "message": "old message",
        "lastTransitionTime": "2026-11-30T18:00:00Z",
        "observedGeneration": 1,
    }


def test_render_offset_times_in_utc() -> None:
    offset = datetime.datetime(2026, 11, 30, 20, 0, 0, tzinfo=datetime.timezone(datetime.timedelta(hours=2)))
    assert render_condition(retirable(when=offset))["lastTransitionTime"] == "2026-11-30T18:00:00Z"


def test_round_trip_through_the_api_shape() -> None:
    conditions = set_condition(
        [], type="Retirable", status="True", reason="EligibleStaleOrphan", message="m", observed_generation=4, now=LATER
    )
    stored = parse_registration(make_registration(paths={"status.conditions": render_conditions(conditions)}))
    assert list(stored.conditions) == conditions
