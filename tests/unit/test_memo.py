"""The memos of the core's pure functions: off unless turned on, and never an answer to another question."""

from __future__ import annotations

import datetime

import pytest

from coroner.core import memo

pytestmark = pytest.mark.unit


def counting() -> tuple[list[object], object]:
    calls: list[object] = []

    def fn(value: object) -> object:
        calls.append(value)
        return ("answer", value)

    return calls, fn


def test_off_by_default_every_call_reaches_the_function() -> None:
    calls, fn = counting()
    remembered = memo.by_text(fn)  # type: ignore[arg-type]
    remembered("x")
    remembered("x")
    assert calls == ["x", "x"]


def test_on_a_repeated_question_is_answered_from_the_memo_until_it_ends() -> None:
    calls, fn = counting()
    remembered = memo.by_text(fn)  # type: ignore[arg-type]
    with memo.remembering():
        assert remembered("x") == remembered("x") == ("answer", "x")
        assert calls == ["x"]
        memo.forget()
        remembered("x")
        assert calls == ["x", "x"]
    remembered("x")
    assert calls == ["x", "x", "x"]


def test_equal_arguments_of_another_type_or_zone_are_another_question() -> None:
    calls, fn = counting()
    by_fields = memo.by_fields(lambda **fields: fn(fields))
    instant = memo.by_instant(fn)  # type: ignore[arg-type]
    utc = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    east = utc.astimezone(datetime.timezone(datetime.timedelta(hours=1)))
    with memo.remembering():
        by_fields(pid=1)
        by_fields(pid=True)
        instant(utc)
        instant(east)
        by_fields(pid=[1])  # unhashable: not remembered, still answered
    assert calls == [{"pid": 1}, {"pid": True}, utc, east, {"pid": [1]}]


def test_by_identity_answers_only_for_the_same_object() -> None:
    calls, fn = counting()
    remembered = memo.by_identity(fn)  # type: ignore[arg-type]
    body = {"a": 1}
    with memo.remembering():
        assert remembered(body) is remembered(body)
        remembered({"a": 1})
    assert len(calls) == 2
