"""The agent names itself in every attestation: who it is, asked once at start, through an outage.

Finding 5 of the fault harness (tests/faults/test_findings.py): a restarting API server answers 429
for a moment, and the agent took that as a final answer, recording identity 'unknown' for its life.
"""

from __future__ import annotations

from typing import Any

import pytest

from coroner.client.rest import ApiError
from coroner_agent import kube as kube_mod
from coroner_agent.kube import AgentApi

pytestmark = pytest.mark.unit

ANSWER = {"status": {"userInfo": {"username": "system:serviceaccount:coroner-system:coroner-agent"}}}


class ScriptedRest:
    """Answers the SelfSubjectReview with each scripted outcome in turn (an exception is raised)."""

    def __init__(self, *outcomes: Any) -> None:
        self.outcomes = list(outcomes)
        self.calls = 0

    def request(self, method: str, path: str, **_: Any) -> Any:
        assert (method, path) == ("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews")
        self.calls += 1
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


class Clock:
    """time.monotonic and time.sleep for the agent's kube module: sleeping moves the clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(kube_mod.time, "sleep", fake.sleep)
    monkeypatch.setattr(kube_mod.time, "monotonic", fake.monotonic)
    return fake


@pytest.mark.parametrize(
    ("outcomes", "expected", "calls"),
    [
        pytest.param([ANSWER], "system:serviceaccount:coroner-system:coroner-agent", 1, id="answered"),
        pytest.param([ApiError(429, "TooManyRequests"), ANSWER], ANSWER, 2, id="429-is-retried"),
        pytest.param([ApiError(503, "ServiceUnavailable"), ANSWER], ANSWER, 2, id="503-is-retried"),
        pytest.param([ConnectionRefusedError(), ANSWER], ANSWER, 2, id="unreachable-is-retried"),
        pytest.param([ApiError(401, "Unauthorized"), ANSWER], ANSWER, 2, id="401-while-warming-up-is-retried"),
        pytest.param([ApiError(403, "Forbidden"), ANSWER], ANSWER, 2, id="403-while-warming-up-is-retried"),
        pytest.param([ApiError(404, "NotFound")], "unknown", 1, id="no-such-api-is-final"),
        pytest.param([{"status": {}}], "unknown", 1, id="answered-without-a-name"),
    ],
)
def test_whoami(outcomes: list[Any], expected: Any, calls: int) -> None:
    rest = ScriptedRest(*outcomes)
    if expected is ANSWER:
        expected = ANSWER["status"]["userInfo"]["username"]
    assert AgentApi(rest, node_name="node-a").whoami() == expected  # type: ignore[arg-type]
    assert rest.calls == calls


@pytest.mark.parametrize("status", [401, 403])
def test_a_refusal_that_outlasts_the_patience_is_final(status: int, clock: Clock) -> None:
    rest = ScriptedRest(*[ApiError(status, "refused")] * 100)
    assert AgentApi(rest, node_name="node-a").whoami(refusal_patience_seconds=60) == "unknown"  # type: ignore[arg-type]
    assert 60 <= clock.now - 1000.0 < 70, "gave up about when the patience ran out, not before"
