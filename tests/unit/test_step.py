"""The operator's reconcile step, `(registration, facts, policy, now) -> Effects`, without a network.

Every decision shape (each row of test_decision's reason table) x the state of the stored
conditions x the retention, to the exact Effects; terminal registrations x retention x what
Retirable already says; the quarantine of a missing Node; and properties: one write at most, a
retirement only for a retirable active registration, level-based writes (applying the step's patch
and stepping again writes nothing), and no mutation of what it is given.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coroner.core import conditions as cond
from coroner.core import wire
from coroner.core.decision import Facts, Policy, decide
from coroner.core.model import format_time, parse_registration
from coroner.core.reasons import Reason
from coroner_operator.effects import Delete, Effects, WriteConditions
from coroner_operator.step import reconcile
from unit.builders import NAME, NAMESPACE, NODE, NOW, make_facts, make_node, make_registration
from unit.test_decision import REASON_CASES, State, states

pytestmark = pytest.mark.unit

S = datetime.timedelta(seconds=1)
RETENTIONS = [0.0, 10.0, 86400.0]


def apply_patch(body: Mapping[str, Any], ops: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The API server's JSON patch, for the ops the operator sends (test, add of an object member)."""
    out = copy.deepcopy(dict(body))
    for op in ops:
        *parents, leaf = op["path"].strip("/").split("/")
        node: Any = out
        for part in parents:
            node = node[part]
        if op["op"] == "test":
            assert node.get(leaf) == op["value"], f"test of {op['path']} failed"
        else:
            assert op["op"] == "add", op
            node[leaf] = copy.deepcopy(op["value"])
    return out


def step(
    body: Mapping[str, Any], facts: Facts, policy: Policy, now: datetime.datetime, *, retention: float = 86400.0
) -> Effects:
    return reconcile(
        body=body,
        registration=parse_registration(body),
        facts=facts,
        policy=policy,
        now=now,
        retention_seconds=retention,
    )


def expected_conditions_write(
    body: Mapping[str, Any], facts: Facts, policy: Policy, now: datetime.datetime
) -> WriteConditions | None:
    registration = parse_registration(body)
    decision = decide(registration=registration, facts=facts, policy=policy, now=now)
    desired = wire.desired_conditions(registration, decision, now=now)
    if cond.render_conditions(list(registration.conditions)) == cond.render_conditions(desired):
        return None
    rv = str(registration.resource_version)
    return WriteConditions(ops=tuple(wire.conditions_ops(body, desired, resource_version=rv)), resource_version=rv)


def with_stored(
    body: dict[str, Any], state: str, facts: Facts, policy: Policy, now: datetime.datetime
) -> dict[str, Any]:
    """The registration with its stored conditions in `state`: none, as the decision would write
    them, or as an earlier, different decision wrote them."""
    body = copy.deepcopy(body)
    status = body.get("status")
    stored = status.get("conditions") if isinstance(status, dict) else None
    # What makes a registration terminal (Retired, Released) stays as it is in every state.
    terminal = [c for c in stored or [] if isinstance(c, dict) and c.get("type") in ("Retired", "Released")]
    if state == "none":
        if isinstance(status, dict) and "conditions" in status:
            status["conditions"] = terminal
        return body
    if state == "stale":
        stale = {"type": "Retirable", "status": "False", "reason": "HeartbeatNotExpired", "message": "earlier",
                 "lastTransitionTime": format_time(NOW - 600 * S), "observedGeneration": 1}  # fmt: skip
        if isinstance(status, dict):
            status["conditions"] = [*terminal, stale]
        return body
    assert state == "current"
    write = expected_conditions_write(body, facts, policy, now)
    return body if write is None else apply_patch(body, write.ops)


ACTIVE_CASES = [p for p in REASON_CASES if isinstance(p.values[0], dict)]


@pytest.mark.parametrize("stored", ["none", "current", "stale"])
@pytest.mark.parametrize(("obj", "facts", "policy", "now", "expected"), ACTIVE_CASES)
def test_every_decision_shape_to_its_exact_effects(
    obj: dict[str, Any], facts: Facts, policy: Policy, now: datetime.datetime, expected: Reason, stored: str
) -> None:
    body = with_stored(obj, stored, facts, policy, now)
    registration = parse_registration(body)
    effects, *others = (step(body, facts, policy, now, retention=retention) for retention in RETENTIONS)
    if not registration.terminal:
        assert others == [effects, effects], "an active registration's effects do not depend on the retention"
    key = (registration.namespace or "", registration.name or "")
    if registration.terminal:
        assert expected is Reason.ALREADY_TERMINAL
        assert effects.reason is None and effects.retire is None and effects.requeue_at is None
        return  # terminal registrations: see the tests below
    decision = decide(registration=registration, facts=facts, policy=policy, now=now)
    assert decision.reason is expected
    if decision.retirable:
        assert effects.retire is not None
        assert effects == Effects(
            key=key, reason=expected, retire=effects.retire, requeue_at=decision.next_evaluation_at
        )
        intent = effects.retire
        assert intent.body is body and intent.facts is facts and intent.policy is policy
        assert intent.decision == decision and intent.resource_version == registration.resource_version
    else:
        write = expected_conditions_write(body, facts, policy, now)
        assert effects == Effects(
            key=key, reason=expected, write_conditions=write, requeue_at=decision.next_evaluation_at
        )
        if stored == "current":
            assert write is None, "level-based: conditions that already say it are not written again"
        if write is not None:
            assert write.ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "1001"}


# --- terminal registrations ------------------------------------------------------------------


def terminal_body(kind: str, *, ago: float | None, reads_terminal: bool, uid: str | None = "uid-1") -> dict[str, Any]:
    when = None if ago is None else format_time(NOW - ago * S)
    conditions: list[dict[str, Any]] = []
    paths: dict[str, object] = {}
    if kind == "Released":
        released = {"type": "Released", "status": "True", "reason": "CleanExit", "message": "bye"}
        conditions.append({**released, **({"lastTransitionTime": when} if when else {})})
    else:
        retirement: dict[str, object] = {"retiredBy": "someone", "reason": "PidfdExited", "decision": "x"}
        if when:
            retirement["retiredTime"] = when
        paths["status.retirement"] = retirement
        conditions.append({"type": "Retired", "status": "True", "reason": "PidfdExited", "message": "retired"})
    if reads_terminal:
        conditions.append(
            {"type": "Retirable", "status": "False", "reason": "AlreadyTerminal", "message": "terminal",
             "lastTransitionTime": format_time(NOW - 600 * S), "observedGeneration": 1}
        )  # fmt: skip
    body = make_registration(uid=uid, conditions=conditions, paths=paths)
    if uid is None:
        del body["metadata"]["uid"]
    return body


@pytest.mark.parametrize("reads_terminal", [False, True])
@pytest.mark.parametrize("kind", ["Released", "Retired"])
@pytest.mark.parametrize(
    ("ago", "retention", "due"),
    [
        pytest.param(60.0, 10.0, True, id="past-retention"),
        pytest.param(10.0, 10.0, True, id="exactly-due"),
        pytest.param(5.0, 10.0, False, id="not-yet-due"),
        pytest.param(10.0**6, 0.0, False, id="retention-0-keeps"),
        pytest.param(None, 10.0, False, id="no-parsable-time"),
    ],
)
def test_terminal_registrations(
    kind: str, reads_terminal: bool, ago: float | None, retention: float, due: bool
) -> None:
    body = terminal_body(kind, ago=ago, reads_terminal=reads_terminal)
    facts = make_facts()
    effects = step(body, facts, Policy(), NOW, retention=retention)
    key = (NAMESPACE, NAME)
    if due:
        assert ago is not None
        since = NOW - ago * S
        delete = Delete(uid="uid-1", resource_version="1001", terminal=kind, since=since, retention_seconds=retention)
        assert effects == Effects(key=key, delete=delete)
        return
    kept = None
    if ago is None:
        kept = effects.kept
        assert kept is not None and "kept" in kept
    write = None if reads_terminal else expected_conditions_write(body, facts, Policy(), NOW)
    assert effects == Effects(key=key, write_conditions=write, kept=kept)
    if not reads_terminal:
        assert write is not None
        written = parse_registration(apply_patch(body, write.ops))
        assert wire.reads_terminal(written), "said once: AlreadyTerminal"
        retired = cond.find_condition(written.conditions, type="Retired")
        assert retired is not None and retired.status == ("True" if kind == "Retired" else "False")


def test_a_terminal_registration_without_a_uid_is_never_deleted() -> None:
    body = terminal_body("Released", ago=60, reads_terminal=True, uid=None)
    effects = step(body, make_facts(), Policy(), NOW, retention=10.0)
    assert effects.delete is None and effects.writes == 0


# --- the quarantine of a missing Node ----------------------------------------------------------

NODE_DELETION = Policy(node_deletion_evidence=True, node_deletion_quarantine_seconds=40)


@pytest.mark.parametrize(
    ("node", "policy", "requeue"),
    [
        pytest.param(
            make_node(exists=None, missing_since=NOW - 10 * S), NODE_DELETION, NOW + 30 * S, id="in-quarantine"
        ),
        pytest.param(make_node(exists=None, missing_since=NOW - 40 * S), NODE_DELETION, None, id="quarantine-over"),
        pytest.param(make_node(exists=None, missing_since=NOW - 10 * S), Policy(), None, id="evidence-off"),
        pytest.param(make_node(exists=None, missing_since=None), NODE_DELETION, None, id="not-synced"),
        pytest.param(make_node(), NODE_DELETION, None, id="present"),
    ],
)
def test_a_missing_node_is_looked_at_again_when_its_quarantine_ends(
    node: Any, policy: Policy, requeue: datetime.datetime | None
) -> None:
    body = make_registration(
        paths={"status.attestation.verdict": "Alive", "status.attestation.evidence": "PidfdPinned"}
    )
    facts = make_facts(node=node)
    effects = step(body, facts, policy, NOW)
    decision = decide(registration=parse_registration(body), facts=facts, policy=policy, now=NOW)
    moments = [m for m in (decision.next_evaluation_at, requeue) if m is not None]
    assert effects.requeue_at == (min(moments) if moments else None)
    assert NODE in facts.nodes


# --- properties ------------------------------------------------------------------------------

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@given(state=states(), stored=st.sampled_from(["none", "current", "stale"]), retention=st.sampled_from(RETENTIONS))
@PROPERTY_SETTINGS
def test_step_properties(state: State, stored: str, retention: float) -> None:
    body = with_stored(state.obj, stored, state.facts, state.policy, state.now)
    before = copy.deepcopy(body)
    effects = step(body, state.facts, state.policy, state.now, retention=retention)
    assert body == before, "the step mutates nothing it is given"
    assert effects == step(body, state.facts, state.policy, state.now, retention=retention), "deterministic"
    assert effects.writes <= 1
    registration = parse_registration(body)
    decision = decide(registration=registration, facts=state.facts, policy=state.policy, now=state.now)
    assert (effects.retire is not None) == (decision.retirable and not registration.terminal)
    assert effects.delete is None or registration.terminal
    if effects.write_conditions is not None:
        written = apply_patch(body, effects.write_conditions.ops)
        again = step(written, state.facts, state.policy, state.now, retention=retention)
        assert again.write_conditions is None, "level-based: what was written is not written again"
        assert dataclasses.replace(again, write_conditions=None) == dataclasses.replace(
            effects, write_conditions=None
        ), "writing the conditions changes no other effect"
    if not registration.terminal:
        assert effects.reason is decision.reason


@given(state=states(), later=st.integers(0, 10**6))
@PROPERTY_SETTINGS
def test_the_requeue_is_the_decisions_next_evaluation_when_no_node_is_missing(state: State, later: int) -> None:
    effects = step(state.obj, state.facts, state.policy, state.now)
    registration = parse_registration(state.obj)
    if registration.terminal:
        assert effects.requeue_at is None
        return
    decision = decide(registration=registration, facts=state.facts, policy=state.policy, now=state.now)
    node = state.facts.nodes.get(NODE)
    if node is None or node.exists is not None or not state.policy.node_deletion_evidence:
        assert effects.requeue_at == decision.next_evaluation_at
    else:
        assert effects.requeue_at is not None or decision.next_evaluation_at is None


def test_a_retirement_admission_refused_is_counted_as_refused_and_tried_again() -> None:
    """The gauge says what doctor says (coroner.core.conditions.refused_by_admission): a retirable
    registration whose last retirement admission refused is RetireRefusedByAdmission, not the
    decision's EligibleStaleOrphan; the retirement is still tried (the policy may have changed)."""
    refused = {"type": "Retirable", "status": "False", "reason": "RetireRefusedByAdmission", "message": "denied",
               "lastTransitionTime": format_time(NOW - 60 * S), "observedGeneration": 1}  # fmt: skip
    for conditions, expected in (([], Reason.ELIGIBLE_STALE_ORPHAN), ([refused], Reason.RETIRE_REFUSED_BY_ADMISSION)):
        effects = step(make_registration(conditions=conditions), make_facts(), Policy(), NOW)
        assert effects.retire is not None and effects.retire.decision.reason is Reason.ELIGIBLE_STALE_ORPHAN
        assert effects.reason is expected
