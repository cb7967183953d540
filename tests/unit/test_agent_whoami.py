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


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube_mod.time, "sleep", lambda _: None)


@pytest.mark.parametrize(
    ("outcomes", "expected", "calls"),
    [
        pytest.param([ANSWER], "system:serviceaccount:coroner-system:coroner-agent", 1, id="answered"),
        pytest.param([ApiError(429, "TooManyRequests"), ANSWER], ANSWER, 2, id="429-is-retried"),
        pytest.param([ApiError(503, "ServiceUnavailable"), ANSWER], ANSWER, 2, id="503-is-retried"),
        pytest.param([ConnectionRefusedError(), ANSWER], ANSWER, 2, id="unreachable-is-retried"),
        pytest.param([ApiError(403, "Forbidden")], "unknown", 1, id="refused-is-final"),
        pytest.param([{"status": {}}], "unknown", 1, id="answered-without-a-name"),
    ],
)
def test_whoami(outcomes: list[Any], expected: Any, calls: int) -> None:
    rest = ScriptedRest(*outcomes)
    if expected is ANSWER:
        expected = ANSWER["status"]["userInfo"]["username"]
    assert AgentApi(rest, node_name="node-a").whoami() == expected  # type: ignore[arg-type]
    assert rest.calls == calls
