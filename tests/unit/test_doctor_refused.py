"""Doctor's `blocked` check and a retirement the API server's admission keeps refusing: the decision
says retirable (EligibleStaleOrphan), so only the operator's stored Retirable condition tells that
its write was refused (RetireRefusedByAdmission). Stuck is never green."""

from __future__ import annotations

import pytest

from coroner.cli import doctor
from coroner.core.reasons import ConditionType, Reason
from unit.builders import NAMESPACE, condition
from unit.test_plan import planned, worker

pytestmark = pytest.mark.unit

REFUSED = Reason.RETIRE_REFUSED_BY_ADMISSION.value


def refused(name: str) -> dict[str, object]:
    body = worker(name)
    body["status"]["conditions"] = [condition(ConditionType.RETIRABLE.value, "False", REFUSED)]
    return body


def test_a_retirement_admission_refuses_is_blocked() -> None:
    result = planned([refused("refused"), worker("retirable")])
    assert {e.registration.name: e.decision.reason for e in result.entries} == {
        "refused": Reason.ELIGIBLE_STALE_ORPHAN,
        "retirable": Reason.ELIGIBLE_STALE_ORPHAN,
    }
    check = doctor.check_blocked(plan=result, expect_plan_only=False)
    assert check.status == doctor.CheckStatus.FAIL
    assert check.objects == (f"workerregistration/{NAMESPACE}/refused",)
    assert REFUSED in check.summary and check.facts["byReason"] == {REFUSED: [f"{NAMESPACE}/refused"]}


def test_a_refusal_of_an_earlier_decision_does_not_block_what_is_no_longer_retirable() -> None:
    body = refused("alive-again")
    body["status"]["attestation"]["verdict"] = "Alive"
    body["status"]["attestation"]["evidence"] = "PidfdPinned"
    result = planned([body])
    assert doctor.check_blocked(plan=result, expect_plan_only=False).status == doctor.CheckStatus.PASS
