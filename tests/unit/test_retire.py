"""The one retire protocol (`coroner.retire`) over a recording fake port: each step's answers to
the exact outcome, the one error mapping, and what is written (who retired, the one patch)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coroner.cli.commands.apply import retire
from coroner.core import wire
from coroner.core.decision import Facts, Policy, decide
from coroner.core.model import format_time, parse_registration
from coroner.core.reasons import Reason
from coroner.core.wire import Writer
from coroner.retire import PortError, RetireIntent, RetireOutcome, Retirer, RetireResult, outcome_of_write
from unit.builders import NAME, NAMESPACE, NOW, make_facts, make_lease, make_registration

pytestmark = pytest.mark.unit

S = datetime.timedelta(seconds=1)
OPERATOR = Retirer(name="system:serviceaccount:coroner-system:coroner-operator")
PERSON = Retirer(name="alice", writer=Writer.PERSON, via="kubectl coroner apply")
LATER = NOW + 2 * S


def lease_body(*, holder: str | None, name: str = "work-lock", renewed: datetime.datetime = NOW) -> dict[str, Any]:
    return {
        "metadata": {"namespace": NAMESPACE, "name": name},
        "spec": {"holderIdentity": holder, "renewTime": format_time(renewed), "leaseDurationSeconds": 30},
    }


class FakePort:
    """Answers as told; an answer that is an exception is raised."""

    def __init__(
        self,
        *,
        granted: bool | BaseException | None = True,
        leases: Sequence[Mapping[str, Any]] | BaseException = (),
        patch: BaseException | None = None,
        event: BaseException | None = None,
    ) -> None:
        self.granted = granted
        self.leases = leases
        self.patch = patch
        self.event = event
        self.calls: list[str] = []
        self.patches: list[list[dict[str, Any]]] = []
        self.events: list[dict[str, Any]] = []

    async def can_retire(self, *, namespace: str, name: str) -> bool | None:
        self.calls.append(f"can_retire {namespace}/{name}")
        if isinstance(self.granted, BaseException):
            raise self.granted
        return self.granted

    async def list_leases(self, *, namespace: str) -> Sequence[Mapping[str, Any]]:
        self.calls.append(f"list_leases {namespace}")
        if isinstance(self.leases, BaseException):
            raise self.leases
        return self.leases

    async def patch_status(self, *, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        self.calls.append(f"patch_status {namespace}/{name}")
        self.patches.append(ops)
        if self.patch is not None:
            raise self.patch
        return {"metadata": {"namespace": namespace, "name": name, "resourceVersion": "1002"}, "written": ops}

    async def post_event(self, *, involved: Mapping[str, Any], reason: str, evidence: str, message: str) -> None:
        self.calls.append("post_event")
        if self.event is not None:
            raise self.event
        self.events.append({"involved": involved, "reason": reason, "evidence": evidence, "message": message})


def intent(*, facts: Facts | None = None, body: dict[str, Any] | None = None) -> RetireIntent:
    body = body or make_registration()
    registration = parse_registration(body)
    facts = facts or make_facts()
    decision = decide(registration=registration, facts=facts, policy=Policy(), now=NOW)
    assert decision.retirable
    return RetireIntent(body=body, registration=registration, decision=decision, facts=facts, policy=Policy())


def run(port: FakePort, the_intent: RetireIntent | None = None, *, retirer: Retirer = OPERATOR) -> RetireResult:
    return asyncio.run(retire(port, the_intent or intent(), retirer=retirer, clock=lambda: LATER))


def test_a_retirement_writes_the_one_patch_and_posts_its_event() -> None:
    port = FakePort()
    the_intent = intent()
    result = run(port, the_intent)
    assert result.outcome is RetireOutcome.RETIRED and result.outcome.written is True
    again = decide(registration=the_intent.registration, facts=the_intent.facts, policy=Policy(), now=LATER)
    expected = wire.retirement_ops(the_intent.body, the_intent.registration, again, retired_by=OPERATOR.name, now=LATER)
    assert port.patches == [expected]
    assert expected[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "1001"}
    assert result.patched is not None and result.evidence == "PidfdExited"
    assert port.events == [
        {
            "involved": result.patched,
            "reason": "Retired",
            "evidence": "PidfdExited",
            "message": f"PidfdExited: {again.detail}",
        }
    ]
    assert port.calls[-2:] == [f"patch_status {NAMESPACE}/{NAME}", "post_event"]


def test_a_person_is_recorded_as_the_retirer_and_named_in_the_event() -> None:
    port = FakePort()
    the_intent = intent()
    result = run(port, the_intent, retirer=PERSON)
    assert result.outcome is RetireOutcome.RETIRED
    (ops,) = port.patches
    retirement = next(op["value"] for op in ops if op["path"] == "/status/retirement")
    assert retirement["retiredBy"] == "alice"
    again = decide(registration=the_intent.registration, facts=the_intent.facts, policy=Policy(), now=LATER)
    assert ops == wire.retirement_ops(
        the_intent.body, the_intent.registration, again, retired_by="alice", now=LATER, writer=Writer.PERSON
    )
    assert port.events[0]["message"].startswith("PidfdExited: retired by alice with kubectl coroner apply: ")


@pytest.mark.parametrize(
    ("granted", "leases"),
    [
        pytest.param(False, (), id="denied"),
        pytest.param(None, (), id="unknown"),
        pytest.param(False, PortError(403, "no list"), id="denied-and-lease-read-failed"),
    ],
)
def test_without_the_verb_nothing_is_written(granted: Any, leases: Any) -> None:
    port = FakePort(granted=granted, leases=leases)
    result = run(port)
    assert result.outcome is RetireOutcome.PERMISSION_MISSING and result.outcome.written is False
    assert port.patches == [] and port.events == []


@pytest.mark.parametrize("error", [PortError(403, "forbidden"), PortError(None, "connection refused")])
@pytest.mark.parametrize("failed", ["review", "lease read"])
def test_a_failed_read_writes_nothing(error: PortError, failed: str) -> None:
    port = FakePort(granted=error) if failed == "review" else FakePort(leases=error)
    result = run(port)
    assert result.outcome is RetireOutcome.FAILED and result.error is error
    assert port.patches == [] and result.outcome.written is False


def test_the_lease_fence_moved_when_the_holders_changed() -> None:
    port = FakePort(leases=[lease_body(holder="someone-else")])
    result = run(port)
    assert result.outcome is RetireOutcome.LEASE_FENCE_MOVED and port.patches == []
    assert result.leases is not None and set(result.leases) == {"work-lock"}


def test_a_renewal_by_the_same_holder_is_not_a_fence_move_but_is_decided_again() -> None:
    # Decided with a Lease held by the worker that had expired (not protecting); the live read
    # finds it renewed: same holder (the fence holds), but deciding again preserves it.
    stale = make_lease(holder=NAME, renewed_at=NOW - 600 * S)
    port = FakePort(leases=[lease_body(holder=NAME, renewed=NOW)])
    result = run(port, intent(facts=make_facts(leases=[stale])))
    assert result.outcome is RetireOutcome.ABANDONED and port.patches == []
    assert result.decision is not None and result.decision.reason.value == "ProtectedLeaseHolder"
    assert "decided again right before the write: ProtectedLeaseHolder" in result.detail


#: The API server's words (kube-apiserver 1.37, tests/integration/test_admission_refusal.py sees them):
#: a ValidatingAdmissionPolicy's denial is 403 with `reason: Forbidden` in the validation, else 422.
SUBJECT = 'workerregistrations.coroner.dev "w" is forbidden: '
DENIED_BY = SUBJECT + "ValidatingAdmissionPolicy 'deny-all' with binding 'deny-all-binding' denied request: no"
EVIDENCE_DENIAL = (
    SUBJECT + "ValidatingAdmissionPolicy 'coroner-retire-requires-evidence' with binding "
    "'coroner-retire-requires-evidence' denied request: retiring WorkerRegistration t/w with PidfdExited needs the "
    'evidence: a Dead attestation, and the agent of node "node-a" attested Alive (PidfdPinned)'
)
CAPABILITY_DENIAL = (
    SUBJECT + "ValidatingAdmissionPolicy 'coroner-retire-requires-capability' with binding "
    "'coroner-retire-requires-capability' denied request: retiring WorkerRegistration t/w requires the retire verb"
)
RBAC_DENIAL = SUBJECT + 'User "alice" cannot patch resource "workerregistrations/status" in API group "coroner.dev"'
WEBHOOK_DENIAL = 'admission webhook "deny.example.com" denied the request: not today'
TEST_FAILED = "the server rejected our request due to an error in our request"
ADMISSION_NOT_READY = 'workerregistrations.coroner.dev "w" is forbidden: not yet ready to handle request'


@pytest.mark.parametrize(
    ("status", "message", "outcome"),
    [
        pytest.param(409, "the object has been modified", RetireOutcome.CONFLICT, id="409"),
        pytest.param(422, TEST_FAILED, RetireOutcome.CONFLICT, id="422-a-test-failed"),
        pytest.param(404, "not found", RetireOutcome.CONFLICT, id="404"),
        pytest.param(403, RBAC_DENIAL, RetireOutcome.PERMISSION_MISSING, id="403-rbac"),
        pytest.param(403, CAPABILITY_DENIAL, RetireOutcome.PERMISSION_MISSING, id="403-the-retire-verb-policy"),
        pytest.param(403, "said the server", RetireOutcome.PERMISSION_MISSING, id="403-unworded"),
        # A restarting API server's admission before its policies synced: a moment, not a revocation.
        pytest.param(403, ADMISSION_NOT_READY, RetireOutcome.FAILED, id="403-admission-not-ready"),
        pytest.param(403, DENIED_BY, RetireOutcome.REFUSED_BY_ADMISSION, id="403-another-policy"),
        pytest.param(403, EVIDENCE_DENIAL, RetireOutcome.REFUSED_BY_ADMISSION, id="403-the-evidence-policy"),
        pytest.param(422, DENIED_BY, RetireOutcome.REFUSED_BY_ADMISSION, id="422-a-policy-reason-invalid"),
        pytest.param(403, WEBHOOK_DENIAL, RetireOutcome.REFUSED_BY_ADMISSION, id="403-a-webhook"),
        pytest.param(400, WEBHOOK_DENIAL, RetireOutcome.REFUSED_BY_ADMISSION, id="400-a-webhook"),
        pytest.param(None, "connection refused", RetireOutcome.UNREACHABLE, id="no-answer"),
        pytest.param(None, DENIED_BY, RetireOutcome.UNREACHABLE, id="no-answer-whatever-it-says"),
        pytest.param(500, "said the server", RetireOutcome.FAILED, id="500"),
        pytest.param(500, DENIED_BY, RetireOutcome.FAILED, id="500-not-a-refusal"),
        pytest.param(400, "said the server", RetireOutcome.FAILED, id="400"),
    ],
)
def test_the_one_error_mapping_of_the_write(status: int | None, message: str, outcome: RetireOutcome) -> None:
    error = PortError(status, message)
    assert outcome_of_write(error) is outcome
    port = FakePort(patch=error)
    result = run(port)
    assert result.outcome is outcome and result.error is error and port.events == []
    assert result.outcome.written is (None if status is None else False)
    assert (result.refusal is not None) == (outcome is RetireOutcome.REFUSED_BY_ADMISSION)


@pytest.mark.parametrize(
    ("message", "kind", "name", "binding", "said"),
    [
        pytest.param(DENIED_BY, "ValidatingAdmissionPolicy", "deny-all", "deny-all-binding", "no", id="policy"),
        pytest.param(
            EVIDENCE_DENIAL,
            "ValidatingAdmissionPolicy",
            "coroner-retire-requires-evidence",
            "coroner-retire-requires-evidence",
            "retiring WorkerRegistration t/w with PidfdExited needs the evidence",
            id="evidence",
        ),
        pytest.param(WEBHOOK_DENIAL, "admission webhook", "deny.example.com", None, "not today", id="webhook"),
        pytest.param(
            'admission webhook "w.example.com" denied the request without explanation',
            "admission webhook",
            "w.example.com",
            None,
            "",
            id="webhook-without-a-message",
        ),
    ],
)
def test_an_admission_refusal_names_the_policy_and_what_it_said(
    message: str, kind: str, name: str, binding: str | None, said: str
) -> None:
    result = run(FakePort(patch=PortError(403, message)))
    refusal = result.refusal
    assert refusal is not None
    assert (refusal.kind, refusal.name, refusal.binding) == (kind, name, binding)
    assert refusal.message.startswith(said)
    assert result.outcome is RetireOutcome.REFUSED_BY_ADMISSION
    assert result.outcome.value == Reason.RETIRE_REFUSED_BY_ADMISSION.value
    assert f"{kind} {name}" in result.detail and said in result.detail
    assert f"WorkerRegistration {NAMESPACE}/{NAME}" in result.detail and "nothing written" in result.detail


@given(st.text(max_size=80), st.sampled_from([400, 401, 403, 404, 409, 413, 422, 429, 500, 503, None]))
def test_a_refusal_is_read_only_from_what_the_server_said_and_never_unknown_as_refused(
    text: str, status: int | None
) -> None:
    outcome = outcome_of_write(PortError(status, text))
    if status is None:
        assert outcome is RetireOutcome.UNREACHABLE
    elif outcome is RetireOutcome.REFUSED_BY_ADMISSION:
        assert 400 <= status < 500 and "denied" in text


def test_the_retirement_stands_when_its_event_fails() -> None:
    error = PortError(500, "etcd is sad")
    result = run(FakePort(event=error))
    assert result.outcome is RetireOutcome.RETIRED and result.event_error is error


def test_anything_but_what_the_api_said_is_a_bug_and_propagates() -> None:
    with pytest.raises(ZeroDivisionError):
        run(FakePort(leases=ZeroDivisionError()))
    with pytest.raises(KeyError):
        run(FakePort(patch=KeyError("bug")))


def test_the_review_and_the_fence_are_both_read_before_the_write() -> None:
    port = FakePort()
    run(port)
    assert sorted(port.calls[:2]) == [f"can_retire {NAMESPACE}/{NAME}", f"list_leases {NAMESPACE}"]


ANSWERS_GRANTED = st.sampled_from([True, False, None, PortError(500, "x"), PortError(None, "x")])
ANSWERS_LEASES = st.sampled_from(["same", "moved", "renewed", PortError(403, "x"), PortError(None, "x")])
ANSWERS_PATCH = st.sampled_from(
    [
        None,
        PortError(409, "x"),
        PortError(422, "x"),
        PortError(403, "x"),
        PortError(403, DENIED_BY),
        PortError(None, "x"),
    ]
)
ANSWERS_EVENT = st.sampled_from([None, PortError(500, "x")])


@given(granted=ANSWERS_GRANTED, leases=ANSWERS_LEASES, patch=ANSWERS_PATCH, event=ANSWERS_EVENT)
@settings(max_examples=150, deadline=None)
def test_nothing_is_written_unless_every_step_allowed_it(granted: Any, leases: Any, patch: Any, event: Any) -> None:
    held = make_lease(holder="other-worker")  # protects someone else: not this registration
    live: Any = leases
    if leases == "same":
        live = [lease_body(holder="other-worker")]
    elif leases == "moved":
        live = [lease_body(holder="yet-another")]
    elif leases == "renewed":
        live = [lease_body(holder="other-worker", renewed=NOW + S)]
    port = FakePort(granted=granted, leases=live, patch=patch, event=event)
    result = run(port, intent(facts=make_facts(leases=[held])))
    allowed = granted is True and leases in ("same", "renewed")
    assert bool(port.patches) == allowed
    assert (result.outcome is RetireOutcome.RETIRED) == (allowed and patch is None)
    assert bool(port.events) == (result.outcome is RetireOutcome.RETIRED and event is None)
    assert (result.event_error is not None) == (result.outcome is RetireOutcome.RETIRED and event is not None)
    if result.outcome is not RetireOutcome.RETIRED:
        assert result.patched is None
    assert dataclasses.replace(result) == result
