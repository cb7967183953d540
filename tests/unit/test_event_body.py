"""The Event Coroner posts about a registration (operator and `kubectl coroner apply` alike)."""

from __future__ import annotations

import datetime

import pytest

from coroner.core import api
from coroner.core.kubewire import event_body

pytestmark = pytest.mark.unit

WRITTEN = {"metadata": {"name": "w1", "namespace": "ns", "uid": "u-1", "resourceVersion": "42"}}
NOW = datetime.datetime(2026, 11, 30, 23, 59, 58, 123456, tzinfo=datetime.UTC)


def test_names_the_object_as_written_and_who_reports() -> None:
    event = event_body(
        involved=WRITTEN, reason="Retired", message="PidfdExited: dead", component="coroner-operator",
        instance="coroner-operator", now=NOW, suffix="abc",
    )  # fmt: skip
    assert event["metadata"] == {"name": "w1.abc", "namespace": "ns"}
    assert event["involvedObject"] == {
        "apiVersion": api.API_VERSION, "kind": api.KIND, "name": "w1", "namespace": "ns", "uid": "u-1",
        "resourceVersion": "42",
    }  # fmt: skip
    assert (event["reason"], event["type"], event["count"]) == ("Retired", "Normal", 1)
    assert event["firstTimestamp"] == event["lastTimestamp"] == "2026-11-30T23:59:58Z"
    assert event["source"] == {"component": "coroner-operator"}


@pytest.mark.parametrize(("field", "limit"), [("message", 1024), ("reportingInstance", 128)])
def test_long_texts_are_cut_to_what_the_api_accepts(field: str, limit: int) -> None:
    event = event_body(
        involved=WRITTEN, reason="Retired", message="m" * 5000, component="c", instance="i" * 500, now=NOW,
        suffix="s", event_type="Warning",
    )  # fmt: skip
    assert len(event[field]) == limit
    assert event["type"] == "Warning"


def test_an_aggregate_carries_its_count_and_first_time() -> None:
    first = NOW - datetime.timedelta(seconds=42)
    event = event_body(
        involved=WRITTEN, reason="Retired", message="PidfdExited: 12 more", component="c", instance="i", now=NOW,
        suffix="s", count=12, first_time=first,
    )  # fmt: skip
    assert (event["count"], event["firstTimestamp"], event["lastTimestamp"]) == (
        12, "2026-11-30T23:59:16Z", "2026-11-30T23:59:58Z",
    )  # fmt: skip
