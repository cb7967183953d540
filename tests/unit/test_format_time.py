"""`format_time` prints exactly the RFC 3339 fields of the UTC instant at their widths, whatever the
datetime: naive or in any zone, microsecond zero or not, years 1..9999 — the written-out format it
replaced (for speed: the C `isoformat`) is the oracle here."""

from __future__ import annotations

import datetime
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coroner.core.model import UTC, format_time

pytestmark = pytest.mark.unit


def spelled_out(value: datetime.datetime, *, fraction: bool) -> str:
    moment = value.astimezone(UTC) if value.tzinfo is not None else value
    text = (
        f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}"
        f"T{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}"
    )
    if fraction:
        text += f".{moment.microsecond:06d}"
    return text + "Z"


ZONES = st.one_of(
    st.none(),
    st.just(UTC),
    st.timedeltas(
        min_value=-datetime.timedelta(hours=23, minutes=59), max_value=datetime.timedelta(hours=23, minutes=59)
    ).map(lambda offset: datetime.timezone(datetime.timedelta(minutes=offset // datetime.timedelta(minutes=1)))),
)


def _outcome(fn: Callable[..., str], value: datetime.datetime, fraction: bool) -> tuple[str | None, type | None]:
    try:
        return fn(value, fraction=fraction), None
    except (OverflowError, ValueError) as error:
        return None, type(error)


@given(
    moment=st.datetimes(min_value=datetime.datetime.min, max_value=datetime.datetime.max),
    zone=ZONES,
    fraction=st.booleans(),
    whole=st.booleans(),
)
def test_format_time_prints_the_utc_fields_at_their_widths(
    moment: datetime.datetime, zone: datetime.tzinfo | None, fraction: bool, whole: bool
) -> None:
    if whole:
        moment = moment.replace(microsecond=0)
    value = moment.replace(tzinfo=zone)
    assert _outcome(format_time, value, fraction) == _outcome(spelled_out, value, fraction)


@pytest.mark.parametrize(
    ("value", "fraction", "text"),
    [
        (datetime.datetime(1, 1, 1, tzinfo=UTC), True, "0001-01-01T00:00:00.000000Z"),
        (datetime.datetime(999, 12, 31, 23, 59, 59), False, "0999-12-31T23:59:59Z"),
        (datetime.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), True, "9999-12-31T23:59:59.999999Z"),
        (
            datetime.datetime(2026, 12, 1, 13, 0, 0, 5, tzinfo=datetime.timezone(datetime.timedelta(hours=1))),
            True,
            "2026-12-01T12:00:00.000005Z",
        ),
    ],
)
def test_format_time_table(value: datetime.datetime, fraction: bool, text: str) -> None:
    assert format_time(value, fraction=fraction) == text
