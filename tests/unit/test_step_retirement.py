"""The operator's step after a retirable decision, without a network: `step.retire` on the facts
read for it (the capability, the live Lease fence) and `step.after` on each outcome the executor
returns. Tables: what each retire protocol outcome and each answer to a conditions write or a
re-read is followed by — the compare-and-swap, the Event, the cache's record, a re-read, Retirable
rewritten, a reconcile again, a failure for the backoff — and that a failure still pending is
carried through what follows.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest

from coroner.core import wire
from coroner.core.decision import Policy, decide
from coroner.core.model import parse_registration
from coroner.core.reasons import EventReason, Reason
from coroner.core.world import lease_facts
from coroner.retire import PortError, RetireIntent, RetireOutcome, Retirer, RetireResult, RetireWrite, retirement
from coroner_operator import step
from coroner_operator.effects import (
    Effects,
    ReadBack,
    Refusal,
    Reread,
    RetireAnswer,
    RetireFailed,
    WriteConditions,
    WriteRefused,
)
from unit.builders import NAME, NAMESPACE, NOW, make_facts, make_registration
from unit.test_step import apply_patch

pytestmark = pytest.mark.unit

KEY = (NAMESPACE, NAME)
OPERATOR = Retirer(name="system:serviceaccount:coroner-system:coroner-operator")
LATER = NOW + datetime.timedelta(seconds=2)
LOCK = {"metadata": {"namespace": NAMESPACE, "name": "work-lock"}, "spec": {"holderIdentity": "someone"}}
RV = parse_registration(make_registration()).resource_version
EVIDENCE_DENIAL = (
    'workerregistrations.coroner.dev "w" is forbidden: ValidatingAdmissionPolicy '
    "'coroner-retire-requires-evidence' with binding 'coroner-retire-requires-evidence' denied request: no"
)


def asked() -> Effects:
    """What `step.reconcile` returns for the retirable registration of the builders."""
    body = make_registration()
    registration = parse_registration(body)
    facts = make_facts()
    decision = decide(registration=registration, facts=facts, policy=Policy(), now=NOW)
    assert decision.retirable
    the_intent = RetireIntent(body=body, registration=registration, decision=decision, facts=facts, policy=Policy())
    return Effects(key=KEY, reason=decision.reason, retire=the_intent, requeue_at=NOW)


def retiring() -> Effects:
    """The compare-and-swap `step.retire` returns on an unmoved fence."""
    effects = step.retire(asked(), granted=True, fence=[], retirer=OPERATOR, now=LATER)
    assert effects.retire_write is not None
    return effects


# --- step.retire: the facts read after the decision ----------------------------------------------


def test_an_unmoved_fence_and_the_capability_give_the_compare_and_swap_as_an_effect() -> None:
    effects = asked()
    assert effects.retire is not None
    decided = step.retire(effects, granted=True, fence=[], retirer=OPERATOR, now=LATER)
    write = decided.retire_write
    assert isinstance(write, RetireWrite)
    assert decided.writes == 1 and decided.retire is None and decided.fail is None
    assert (decided.key, decided.reason, decided.requeue_at) == (KEY, effects.reason, effects.requeue_at)
    assert write.ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": RV}
    assert write.ops == wire.retirement_ops(
        effects.retire.body, effects.retire.registration, write.decision, retired_by=OPERATOR.name, now=LATER
    ), "the one retirement patch, decided at `now` on the live Leases"
    assert write.decision.retirable and write.intent is effects.retire


def test_step_retire_only_takes_a_retirement_it_asked_for() -> None:
    with pytest.raises(ValueError):
        step.retire(Effects(key=KEY), granted=True, fence=[], retirer=OPERATOR, now=LATER)


# --- what follows each outcome of a retirement -----------------------------------------------------

PATCHED = {"metadata": {"namespace": NAMESPACE, "name": NAME, "resourceVersion": "1001"}}
CAPABILITY_DENIAL = (
    'workerregistrations.coroner.dev "w" is forbidden: ValidatingAdmissionPolicy '
    "'coroner-retire-requires-capability' with binding 'coroner-retire-requires-capability' denied request: no"
)


def answered(answer: dict[str, Any] | PortError) -> Effects | None:
    """What follows the API server's `answer` to the compare-and-swap."""
    return step.after(retiring(), RetireAnswer(answer=answer), retirer=OPERATOR, now=LATER)


def unwritten(*, granted: bool | None = True, fence: Any = (), now: datetime.datetime = LATER) -> Effects:
    """What follows a retirement decided, on the facts read for it, to write nothing."""
    return step.retire(asked(), granted=granted, fence=list(fence) if isinstance(fence, tuple) else fence,
                       retirer=OPERATOR, now=now)  # fmt: skip


#: case -> (how the follow-up comes, the outcome recorded or failed, then what follows: the Event,
#: retired, abandoned (counted), the grant revoked, the live Leases taken in, a reconcile again, a
#: re-read, Retirable written, a failure for the backoff)
CASES: dict[str, tuple[Any, RetireOutcome, tuple[bool, bool, bool, bool, bool, bool, bool, bool, bool]]] = {
    "written": (lambda: answered(PATCHED), RetireOutcome.RETIRED,
                (True, True, False, False, False, False, False, False, False)),
    "refused-for-the-verb": (lambda: answered(PortError(403, CAPABILITY_DENIAL, reason="Forbidden")),
                             RetireOutcome.PERMISSION_MISSING,
                             (False, False, True, True, False, True, False, False, False)),
    "refused-by-rbac": (lambda: answered(PortError(403, "forbidden", reason="Forbidden")),
                        RetireOutcome.PERMISSION_MISSING,
                        (False, False, True, True, False, True, False, False, False)),
    "refused-by-admission": (lambda: answered(PortError(403, EVIDENCE_DENIAL, reason="Forbidden")),
                             RetireOutcome.REFUSED_BY_ADMISSION,
                             (False, False, True, False, False, False, False, True, True)),
    "moved-409": (lambda: answered(PortError(409, "modified", reason="Conflict")), RetireOutcome.CONFLICT,
                  (False, False, False, False, False, False, True, False, False)),
    "moved-422": (lambda: answered(PortError(422, "test failed", reason="Invalid")), RetireOutcome.CONFLICT,
                  (False, False, False, False, False, False, True, False, False)),
    "gone-404": (lambda: answered(PortError(404, "not found", reason="NotFound")), RetireOutcome.CONFLICT,
                 (False, False, False, False, False, False, True, False, False)),
    "unanswered": (lambda: answered(PortError(None, "timed out")), RetireOutcome.UNREACHABLE,
                   (False, False, False, False, False, False, False, False, True)),
    "failed-500": (lambda: answered(PortError(500, "etcd", reason="InternalError")), RetireOutcome.FAILED,
                   (False, False, False, False, False, False, False, False, True)),
    "not-granted": (lambda: unwritten(granted=False), RetireOutcome.PERMISSION_MISSING,
                    (False, False, True, True, False, True, False, False, False)),
    "grant-unknown": (lambda: unwritten(granted=None), RetireOutcome.PERMISSION_MISSING,
                      (False, False, True, True, False, True, False, False, False)),
    "fence-unread": (lambda: unwritten(fence=PortError(503, "etcd")), RetireOutcome.FAILED,
                     (False, False, False, False, False, False, False, False, True)),
    "fence-unanswered": (lambda: unwritten(fence=PortError(None, "no answer")), RetireOutcome.FAILED,
                         (False, False, False, False, False, False, False, False, True)),
    "fence-moved": (lambda: unwritten(fence=[LOCK]), RetireOutcome.LEASE_FENCE_MOVED,
                    (False, False, True, False, True, True, False, False, False)),
    "no-longer-retirable": (lambda: unwritten(now=NOW + datetime.timedelta(days=1)), RetireOutcome.ABANDONED,
                            (False, False, False, False, True, True, False, False, False)),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_what_follows_each_outcome_of_a_retirement(case: str) -> None:
    make, expected, flags = CASES[case]
    event, retired, abandoned, revoked, leases, requeue, reread, conditions, fails = flags
    follow = make()
    assert follow is not None and follow.key == KEY
    assert follow.retire_write is None and follow.retire is None and follow.delete is None, "nothing is sent again"
    record = follow.record
    if record is not None:
        assert record.result.outcome is expected
    if isinstance(follow.fail, RetireFailed):
        assert follow.fail.result.outcome is expected
    assert (follow.event is not None) is event
    assert (record is not None and record.retired) is retired
    assert (record is not None and record.abandoned) is abandoned
    assert (record is not None and record.revoked) is revoked
    assert (record is not None and record.leases is not None) is leases
    assert follow.requeue is requeue
    assert (follow.reread is not None) is reread
    assert (follow.write_conditions is not None) is conditions
    assert isinstance(follow.fail, RetireFailed) is fails


def test_every_outcome_of_the_protocol_has_a_row() -> None:
    assert {expected for _, expected, _ in CASES.values()} == set(RetireOutcome)


def test_a_landed_retirement_is_announced_about_the_object_as_written() -> None:
    follow = answered(PATCHED)
    assert follow is not None and follow.event is not None and follow.record is not None
    assert follow.event.involved is PATCHED and follow.record.result.patched is PATCHED
    assert follow.event.reason == EventReason.RETIRED.value
    assert follow.event.evidence == follow.record.result.evidence == "PidfdExited"
    assert follow.record.registration == retiring().retire_write.intent.registration  # type: ignore[union-attr]


def test_a_refusal_by_admission_rewrites_retirable_naming_it_and_fails_for_the_backoff() -> None:
    follow = answered(PortError(403, EVIDENCE_DENIAL, reason="Forbidden"))
    assert follow is not None and isinstance(follow.write_conditions, WriteConditions)
    assert follow.write_conditions.resource_version == RV, "tested on the version decided from"
    retirable = [op for op in follow.write_conditions.ops if op["op"] != "test"]
    assert Reason.RETIRE_REFUSED_BY_ADMISSION.value in str(retirable)
    assert follow.record is not None and not follow.record.revoked, "the grant stands"


def test_a_refusal_retirable_already_says_writes_nothing_and_still_fails() -> None:
    """Level-based: once Retirable says the refusal, the same refusal writes no conditions."""
    refusal = RetireAnswer(answer=PortError(403, EVIDENCE_DENIAL, reason="Forbidden"))
    first = step.after(retiring(), refusal, retirer=OPERATOR, now=LATER)
    assert first is not None and first.write_conditions is not None
    write = retiring().retire_write
    assert write is not None
    body = apply_patch(write.intent.body, first.write_conditions.ops)
    said = dataclasses.replace(write.intent, body=body, registration=parse_registration(body))
    effects = dataclasses.replace(retiring(), retire_write=dataclasses.replace(write, intent=said))
    again = step.after(effects, refusal, retirer=OPERATOR, now=LATER)
    assert again is not None and again.write_conditions is None and isinstance(again.fail, RetireFailed)


def test_a_conflict_reads_the_version_it_tested_again() -> None:
    follow = answered(PortError(409, "the object has been modified", reason="Conflict"))
    assert follow is not None
    assert follow.reread == Reread(tested=RV, said="409 Conflict: the object has been modified", conflict=True)


# --- step.after: a conditions write's refusal, and what a re-read found --------------------------

CONDITIONS = WriteConditions(
    ops=({"op": "test", "path": "/metadata/resourceVersion", "value": "7"},), resource_version="7"
)


@pytest.mark.parametrize(
    ("status", "reread"),
    [(404, True), (409, True), (422, True), (403, False), (500, False)],
)
def test_a_refused_conditions_write_is_read_again_or_fails(status: int, reread: bool) -> None:
    error = RuntimeError(f"{status}")
    refusal = Refusal(status=status, said=f"{status} said", error=error)
    follow = step.after(Effects(key=KEY, write_conditions=CONDITIONS), refusal, retirer=OPERATOR, now=LATER)
    assert follow is not None
    if reread:
        assert follow.reread == Reread(tested="7", said=f"{status} said") and follow.fail is None
    else:
        assert follow.reread is None and follow.fail is error


@pytest.mark.parametrize(
    ("found", "conflict", "requeue", "counted", "refused"),
    [
        pytest.param(None, False, False, False, False, id="gone"),
        pytest.param(None, True, False, True, False, id="gone-after-a-lost-cas"),
        pytest.param("8", False, True, False, False, id="moved"),
        pytest.param("8", True, True, True, False, id="moved-after-a-lost-cas"),
        pytest.param("7", False, False, False, True, id="not-moved"),
        pytest.param("7", True, False, False, True, id="not-moved-after-a-lost-cas"),
    ],
)
def test_what_a_reread_found_decides_what_follows(
    found: str | None, conflict: bool, requeue: bool, counted: bool, refused: bool
) -> None:
    effects = Effects(key=KEY, reread=Reread(tested="7", said="422 Invalid: too many", conflict=conflict))
    follow = step.after(effects, ReadBack(resource_version=found), retirer=OPERATOR, now=LATER)
    assert follow is not None
    assert follow.requeue is requeue and follow.conflict is counted
    assert isinstance(follow.fail, WriteRefused) is refused
    if refused:
        assert "422 Invalid: too many" in str(follow.fail)


def test_nothing_follows_an_outcome_of_nothing() -> None:
    assert step.after(Effects(key=KEY), None, retirer=OPERATOR, now=LATER) is None


def test_a_pending_failure_is_carried_through_what_follows_unless_that_fails_first() -> None:
    pending = RetireFailed(RetireResult(outcome=RetireOutcome.REFUSED_BY_ADMISSION, detail="refused."))
    writing = Effects(key=KEY, write_conditions=CONDITIONS, fail=pending)
    conflict = step.after(writing, Refusal(status=409, said="409", error=RuntimeError()), retirer=OPERATOR, now=LATER)
    assert conflict is not None and conflict.fail is pending, "carried into the re-read"
    moved = step.after(conflict, ReadBack(resource_version="8"), retirer=OPERATOR, now=LATER)
    assert moved is not None and moved.requeue and moved.fail is pending
    unmoved = step.after(conflict, ReadBack(resource_version="7"), retirer=OPERATOR, now=LATER)
    assert unmoved is not None and isinstance(unmoved.fail, WriteRefused), "the re-read's own failure comes first"


def test_the_live_leases_taken_in_are_the_ones_the_fence_read() -> None:
    decided = step.retire(asked(), granted=True, fence=[LOCK], retirer=OPERATOR, now=LATER)
    assert decided.record is not None and decided.record.leases == {"work-lock": lease_facts(LOCK)}


def test_the_pure_retirement_is_the_one_apply_runs() -> None:
    """`step.retire` decides with `coroner.retire.retirement`, the function `kubectl coroner apply` runs."""
    effects = asked()
    assert effects.retire is not None
    decided = retirement(effects.retire, granted=True, listed=[], retirer=OPERATOR, now=LATER)
    assert decided == step.retire(effects, granted=True, fence=[], retirer=OPERATOR, now=LATER).retire_write
