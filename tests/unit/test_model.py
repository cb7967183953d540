"""Parsing raw registrations: total (never raises), strict about values, explicit about problems."""

from __future__ import annotations

import datetime
import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coroner.core.model import (
    Attestation,
    Incarnation,
    Registration,
    format_time,
    parse_pid,
    parse_registration,
    parse_time,
)
from coroner.core.reasons import Evidence, Verdict
from unit.builders import (
    BOOT,
    CLIENT_INSTANCE,
    DELETE,
    HOST,
    NAME,
    NAMESPACE,
    NODE,
    NOW,
    PID,
    PID_NAMESPACE,
    SILENCE,
    START_TIME,
    condition,
    make_registration,
    stamp,
)

pytestmark = pytest.mark.unit

UTC = datetime.UTC


def problem_paths(registration: Registration) -> set[str]:
    return {path for path, _ in registration.problems}


class TestBaseline:
    def test_every_field(self) -> None:
        r = parse_registration(make_registration())
        assert r.problems == ()
        assert (r.namespace, r.name, r.uid, r.resource_version, r.generation) == (
            NAMESPACE,
            NAME,
            f"uid-{NAMESPACE}-{NAME}",
            "1001",
            1,
        )
        assert r.node_name == NODE
        assert r.incarnation == Incarnation(
            boot_id=BOOT, pid_namespace=PID_NAMESPACE, pid=PID, start_time=START_TIME, host_id=HOST
        )
        assert r.incarnation.complete
        assert r.client_instance_id == CLIENT_INSTANCE
        assert (r.heartbeat.interval_seconds, r.heartbeat.ttl_seconds) == (10, 30)
        assert r.last_heartbeat_time == NOW - SILENCE
        assert r.last_heartbeat_raw == stamp(NOW - SILENCE)
        assert not r.heartbeat_unparsable
        assert r.labels == {"coroner.dev/node": NODE}
        assert not (r.retired or r.released or r.terminal)
        assert r.display_name == f"{NAMESPACE}/{NAME}"

    def test_attestation(self) -> None:
        attestation = parse_registration(make_registration()).attestation
        assert isinstance(attestation, Attestation)
        assert attestation.verdict is Verdict.DEAD
        assert attestation.evidence is Evidence.PIDFD_EXITED
        assert attestation.incarnation.key == (BOOT, PID_NAMESPACE, PID, START_TIME)
        assert attestation.heartbeat_seen == stamp(NOW - SILENCE)
        assert attestation.agent_node == NODE
        assert attestation.observed_time is not None and attestation.observed_time.tzinfo is not None

    def test_attestation_raw_is_a_json_copy(self) -> None:
        obj = make_registration()
        attestation = parse_registration(obj).attestation
        assert attestation is not None
        assert attestation.raw == obj["status"]["attestation"]
        json.dumps(attestation.raw)
        obj["status"]["attestation"]["verdict"] = "Alive"
        assert attestation.raw["verdict"] == "Dead"


class TestPid:
    @pytest.mark.parametrize(
        "value",
        [
            pytest.param(900, id="int"),
            pytest.param(900.0, id="integral-float"),
            pytest.param("900", id="digits"),
            pytest.param("0900", id="leading-zero"),
        ],
    )
    def test_accepted(self, value: object) -> None:
        assert parse_pid(value) == 900
        assert parse_registration(make_registration(pid=value)).incarnation.pid == 900

    @pytest.mark.parametrize(
        "value",
        [
            pytest.param(900.5, id="fraction"),
            pytest.param(math.nan, id="nan"),
            pytest.param(math.inf, id="inf"),
            pytest.param(True, id="bool"),
            pytest.param(0, id="zero"),
            pytest.param(-1, id="negative"),
            pytest.param(4194305, id="above-pid-max-limit"),
            pytest.param("-1", id="signed-string"),
            pytest.param(" 900", id="whitespace"),
            pytest.param("9e2", id="exponent-string"),
            pytest.param("٩٠٠", id="non-ascii-digits"),
            pytest.param("9" * 5000, id="huge-digit-string"),
            pytest.param([900], id="list"),
        ],
    )
    def test_rejected(self, value: object) -> None:
        assert parse_pid(value) is None
        r = parse_registration(make_registration(pid=value))
        assert r.incarnation.pid is None
        assert "spec.incarnation.pid" in problem_paths(r)
        assert not r.incarnation.complete

    def test_upper_bound_is_accepted(self) -> None:
        assert parse_pid(4194304) == 4194304


class TestDigitStrings:
    @pytest.mark.parametrize("field", ["pidNamespace", "startTime"])
    @pytest.mark.parametrize(
        "value",
        [
            pytest.param(4026531836, id="int"),
            pytest.param("pid:[4026531836]", id="decorated"),
            pytest.param("", id="empty"),
            pytest.param("12a", id="letters"),
        ],
    )
    def test_rejected(self, field: str, value: object) -> None:
        r = parse_registration(make_registration(paths={f"spec.incarnation.{field}": value}))
        assert f"spec.incarnation.{field}" in problem_paths(r)
        assert not r.incarnation.complete


class TestTime:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            pytest.param("2026-11-30T18:00:00Z", datetime.datetime(2026, 11, 30, 18, tzinfo=UTC), id="zulu"),
            pytest.param("2026-11-30t18:00:00z", datetime.datetime(2026, 11, 30, 18, tzinfo=UTC), id="lowercase"),
            pytest.param(
                "2026-11-30T18:00:00.5Z", datetime.datetime(2026, 11, 30, 18, 0, 0, 500000, tzinfo=UTC), id="fraction"
            ),
            pytest.param(
                "2026-11-30T18:00:00.123456789Z",
                datetime.datetime(2026, 11, 30, 18, 0, 0, 123456, tzinfo=UTC),
                id="nanoseconds-truncated",
            ),
            pytest.param(
                "2026-11-30T20:30:00+02:30", datetime.datetime(2026, 11, 30, 18, tzinfo=UTC), id="positive-offset"
            ),
            pytest.param(
                "2026-11-30T13:00:00-05:00", datetime.datetime(2026, 11, 30, 18, tzinfo=UTC), id="negative-offset"
            ),
        ],
    )
    def test_parsed_to_utc(self, text: str, expected: datetime.datetime) -> None:
        parsed = parse_time(text)
        assert parsed == expected
        assert parsed is not None and parsed.utcoffset() == datetime.timedelta(0)

    @pytest.mark.parametrize(
        "value",
        [
            pytest.param("2026-11-30T18:00:00", id="no-zone"),
            pytest.param("2026-11-30 18:00:00Z", id="space"),
            pytest.param("2026-11-30", id="date-only"),
            pytest.param("2026-13-30T18:00:00Z", id="month-13"),
            pytest.param("2026-11-30T23:59:60Z", id="leap-second"),
            pytest.param("2026-11-30T18:00:00+24:00", id="offset-out-of-range"),
            pytest.param("0001-01-01T00:00:00+01:00", id="before-datetime-min-in-utc"),
            pytest.param("yesterday", id="words"),
            pytest.param("", id="empty"),
            pytest.param(1764525600, id="epoch-number"),
            pytest.param(None, id="none"),
        ],
    )
    def test_unparsable(self, value: object) -> None:
        assert parse_time(value) is None

    @given(st.text(alphabet="0123456789-:TtZz.+ ", max_size=40) | st.sampled_from(["2026-11-30T18:00:00Z"]))
    def test_a_text_parses_the_same_every_time_and_shares_its_datetime(self, text: str) -> None:
        # Remembered parses (a cache holds one datetime per repeated timestamp) change no answer,
        # and a str subclass is parsed, not looked up.
        class Text(str):
            pass

        first, again, subclassed = parse_time(text), parse_time(text), parse_time(Text(text))
        assert again is first and subclassed == first

    def test_format_round_trips(self) -> None:
        moment = datetime.datetime(2026, 11, 30, 18, 0, 0, 123456, tzinfo=UTC)
        assert format_time(moment) == "2026-11-30T18:00:00Z"
        assert format_time(moment, fraction=True) == "2026-11-30T18:00:00.123456Z"
        assert parse_time(format_time(moment, fraction=True)) == moment
        offset = moment.astimezone(datetime.timezone(datetime.timedelta(hours=-3)))
        assert format_time(offset, fraction=True).endswith("18:00:00.123456Z")


class TestHeartbeat:
    def test_missing_falls_back_to_creation(self) -> None:
        created = NOW - datetime.timedelta(hours=1)
        r = parse_registration(make_registration(heartbeat_at=None, created_at=created))
        assert r.last_heartbeat_time == created
        assert r.last_heartbeat_raw is None
        assert not r.heartbeat_unparsable

    @pytest.mark.parametrize(
        "value", [pytest.param("yesterday", id="words"), pytest.param("", id="empty"), pytest.param(5, id="number")]
    )
    def test_unparsable_is_recorded(self, value: object) -> None:
        r = parse_registration(make_registration(heartbeat_at=None, paths={"status.lastHeartbeatTime": value}))
        assert r.heartbeat_unparsable
        assert r.last_heartbeat_time is None
        assert "status.lastHeartbeatTime" in problem_paths(r)

    def test_unparsable_creation_without_heartbeat_is_unparsable(self) -> None:
        r = parse_registration(make_registration(heartbeat_at=None, paths={"metadata.creationTimestamp": "garbage"}))
        assert r.heartbeat_unparsable
        assert r.last_heartbeat_time is None

    def test_neither_is_absent_not_unparsable(self) -> None:
        r = parse_registration(make_registration(heartbeat_at=None, paths={"metadata.creationTimestamp": DELETE}))
        assert not r.heartbeat_unparsable
        assert r.last_heartbeat_time is None

    @pytest.mark.parametrize(
        ("field", "value"),
        [
            pytest.param("intervalSeconds", 0, id="interval-zero"),
            pytest.param("ttlSeconds", 604801, id="ttl-above-crd-max"),
            pytest.param("ttlSeconds", "thirty", id="ttl-words"),
            pytest.param("intervalSeconds", DELETE, id="interval-missing"),
        ],
    )
    def test_invalid_settings(self, field: str, value: object) -> None:
        r = parse_registration(make_registration(paths={f"spec.heartbeat.{field}": value}))
        assert f"spec.heartbeat.{field}" in problem_paths(r)

    def test_integral_float_settings(self) -> None:
        r = parse_registration(make_registration(paths={"spec.heartbeat.ttlSeconds": 30.0}))
        assert r.heartbeat.ttl_seconds == 30


class TestAttestationValues:
    def test_unknown_verdict_kept_verbatim_and_flagged(self) -> None:
        r = parse_registration(make_registration(verdict="dead"))
        assert r.attestation is not None
        assert r.attestation.verdict == "dead"
        assert not isinstance(r.attestation.verdict, Verdict)
        assert "status.attestation.verdict" in problem_paths(r)

    def test_unknown_evidence_kept_verbatim_and_flagged(self) -> None:
        r = parse_registration(make_registration(evidence="Vibes"))
        assert r.attestation is not None and r.attestation.evidence == "Vibes"
        assert "status.attestation.evidence" in problem_paths(r)

    def test_not_an_object(self) -> None:
        r = parse_registration(make_registration(paths={"status.attestation": "Dead"}))
        assert r.attestation is None
        assert "status.attestation" in problem_paths(r)

    def test_empty_heartbeat_seen_is_a_value(self) -> None:
        r = parse_registration(make_registration(heartbeat_at=None))
        assert r.attestation is not None and r.attestation.heartbeat_seen == ""


class TestTerminal:
    @pytest.mark.parametrize(
        ("conditions", "paths", "retired", "released"),
        [
            pytest.param([condition("Retired", "True", "PidfdExited")], {}, True, False, id="retired-condition"),
            pytest.param([condition("Retired", "False", "Active")], {}, False, False, id="retired-false"),
            pytest.param([], {"status.retirement": {"reason": "PidfdExited"}}, True, False, id="retirement"),
            pytest.param([], {"status.retirement": "yes"}, True, False, id="retirement-garbage"),
            pytest.param([condition("Released", "True", "CleanExit")], {}, False, True, id="released"),
        ],
    )
    def test_terminal(
        self, conditions: list[dict[str, object]], paths: dict[str, object], retired: bool, released: bool
    ) -> None:
        r = parse_registration(make_registration(conditions=conditions, paths=paths))
        assert (r.retired, r.released) == (retired, released)

    def test_conditions_parsed_leniently(self) -> None:
        r = parse_registration(
            make_registration(
                paths={"status.conditions": [{"type": "Retired", "status": "True"}, "junk", {"status": "True"}]}
            )
        )
        assert r.retired
        assert [c.type for c in r.conditions] == ["Retired"]
        assert {"status.conditions[1]", "status.conditions[2].type"} <= problem_paths(r)


class TestMissing:
    @pytest.mark.parametrize(
        "path",
        [
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.clientInstanceId",
            "spec.incarnation.bootId",
            "spec.incarnation.hostId",
            "spec.heartbeat.ttlSeconds",
        ],
    )
    def test_required_missing_is_a_problem(self, path: str) -> None:
        r = parse_registration(make_registration(paths={path: DELETE}))
        assert path in problem_paths(r)

    @pytest.mark.parametrize("path", ["spec.sessionId", "spec.generationId", "spec.role", "spec.nodeUID"])
    def test_optional_missing_is_not_a_problem(self, path: str) -> None:
        r = parse_registration(make_registration(paths={path: DELETE}))
        assert r.problems == ()

    @pytest.mark.parametrize(
        "obj", [pytest.param(None, id="none"), pytest.param([], id="list"), pytest.param("x", id="string")]
    )
    def test_not_an_object(self, obj: object) -> None:
        r = parse_registration(obj)
        assert r.node_name is None and r.attestation is None
        assert "" in problem_paths(r)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=30,
)

#: Keys the parser looks for, so that garbage lands where it is read, not only beside it.
KEYS = st.sampled_from(
    [
        "metadata", "spec", "status", "name", "namespace", "uid", "creationTimestamp", "labels", "nodeName",
        "incarnation", "bootId", "pid", "pidNamespace", "startTime", "hostId", "clientInstanceId", "heartbeat",
        "intervalSeconds", "ttlSeconds", "lastHeartbeatTime", "attestation", "verdict", "evidence",
        "observedTime", "heartbeatSeen", "agent", "conditions", "type", "retirement",
    ]
)  # fmt: skip


@st.composite
def garbled(draw: st.DrawFn) -> Any:
    """The baseline object with some of its known paths replaced by arbitrary JSON."""
    obj: Any = make_registration()
    for _ in range(draw(st.integers(0, 6))):
        node = obj
        for _depth in range(draw(st.integers(0, 3))):
            key = draw(KEYS)
            if not isinstance(node, dict) or not isinstance(node.get(key), dict):
                break
            node = node[key]
        if isinstance(node, dict):
            node[draw(KEYS)] = draw(JSON)
    return obj


class TestTotality:
    @given(obj=JSON)
    @settings(suppress_health_check=[HealthCheck.too_slow])
    def test_arbitrary_json_never_raises(self, obj: object) -> None:
        assert isinstance(parse_registration(obj), Registration)

    @given(obj=garbled())
    @settings(suppress_health_check=[HealthCheck.too_slow])
    def test_garbled_registration_never_raises_and_reports(self, obj: object) -> None:
        r = parse_registration(obj)
        for path, message in r.problems:
            assert isinstance(path, str) and isinstance(message, str) and message
        if r.incarnation.pid is not None:
            assert isinstance(r.incarnation.pid, int) and not isinstance(r.incarnation.pid, bool)
        for moment in (r.last_heartbeat_time, r.creation_time):
            assert moment is None or moment.utcoffset() == datetime.timedelta(0)
        if r.attestation is not None:
            json.dumps(r.attestation.raw)

    def test_deeply_nested_attestation_does_not_exhaust_the_stack(self) -> None:
        deep: Any = {}
        for _ in range(5000):
            deep = {"x": deep}
        obj = make_registration()
        obj["status"]["attestation"]["detail"] = deep
        r = parse_registration(obj)
        assert r.attestation is not None
