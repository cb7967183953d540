"""Every body and patch Coroner writes (coroner.core.wire) parses back with the parser of its shape.

The WorkerRegistration shapes go through `coroner.core.model.parse_registration` (as the operator,
the agent and the CLI read them), the Lease shapes through `coroner.core.world` (as the operator's
cache reads them): what one component writes, every other one reads back as meant.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coroner.core import api, kubewire, model, wire, world
from coroner.core import conditions as cond
from coroner.core.decision import Policy, decide
from coroner.core.reasons import ConditionType, Evidence, Reason, State, Statement, Verdict
from unit.builders import NOW, make_facts, make_registration

pytestmark = pytest.mark.unit

UTC = datetime.UTC
ATTESTED = {
    "type": "Attested",
    "status": "True",
    "reason": "Dead",
    "message": "m",
    "lastTransitionTime": "2026-11-30T17:00:00Z",
}

# --- strategies ------------------------------------------------------------------------------------

names = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?", fullmatch=True)
moments = st.datetimes(
    min_value=datetime.datetime(2000, 1, 1), max_value=datetime.datetime(2200, 1, 1), timezones=st.just(UTC)
)
digits = st.integers(0, 2**63).map(str)
incarnations = st.fixed_dictionaries(
    {
        "bootId": st.uuids().map(str),
        "pidNamespace": digits,
        "pid": st.integers(1, api.PID_MAX_LIMIT),
        "startTime": digits,
        "hostId": st.text(alphabet="0123456789abcdef", min_size=1, max_size=32),
    }
)
heartbeats = st.none() | st.tuples(
    st.integers(1, model.HEARTBEAT_INTERVAL_MAX), st.integers(1, model.HEARTBEAT_TTL_MAX)
)
optional_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


def as_stored(body: dict[str, Any], *, resource_version: str = "1", created: datetime.datetime = NOW) -> dict[str, Any]:
    """`body` as the API server returns it after a create: uid, resourceVersion, generation, creation time."""
    stored = copy.deepcopy(body)
    stored["metadata"].update(
        uid="0d5e0000-0000-4000-8000-000000000001",
        resourceVersion=resource_version,
        generation=1,
        creationTimestamp=model.format_time(created),
    )
    return stored


def applied(body: dict[str, Any], ops: list[dict[str, Any]], *, resource_version: str = "2") -> dict[str, Any]:
    """A JSON patch as the API server applies it (its `test`s included), with a new resourceVersion."""
    patched: dict[str, Any] = jsonpatch.apply_patch(body, ops)
    patched["metadata"]["resourceVersion"] = resource_version
    return patched


def merged_status(body: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(body)
    merged.setdefault("status", {}).update(status)
    return merged


# --- the launcher ------------------------------------------------------------------------------------


@settings(max_examples=50)
@given(
    name=names,
    namespace=names,
    node=names,
    incarnation=incarnations,
    heartbeat=heartbeats,
    role=optional_text,
    session=optional_text,
    generation=optional_text,
    node_uid=st.none() | st.uuids().map(str),
)
def test_the_launchers_registration_parses_back_as_created(
    name: str,
    namespace: str,
    node: str,
    incarnation: dict[str, Any],
    heartbeat: tuple[int, int] | None,
    role: str,
    session: str,
    generation: str,
    node_uid: str | None,
) -> None:
    body = wire.registration_body(
        name=name,
        namespace=namespace,
        node_name=node,
        incarnation=incarnation,
        client_instance_id=f"{api.CLIENT_INSTANCE_PREFIX}x",
        role=role,
        session_id=session,
        generation_id=generation,
        node_uid=node_uid,
        heartbeat=heartbeat,
    )
    parsed = model.parse_registration(as_stored(body))
    assert parsed.problems == ()
    assert (parsed.namespace, parsed.name, parsed.node_name) == (namespace, name, node)
    assert parsed.labels[api.NODE_LABEL] == node
    assert parsed.incarnation == model.Incarnation(
        boot_id=incarnation["bootId"],
        pid_namespace=incarnation["pidNamespace"],
        pid=incarnation["pid"],
        start_time=incarnation["startTime"],
        host_id=incarnation["hostId"],
    )
    assert parsed.client_instance_id == f"{api.CLIENT_INSTANCE_PREFIX}x"
    assert (parsed.role, parsed.session_id, parsed.generation_id) == (role or None, session or None, generation or None)
    assert parsed.node_uid == (node_uid or None)
    assert parsed.heartbeat.declared is (heartbeat is not None)
    assert (parsed.heartbeat.interval_seconds, parsed.heartbeat.ttl_seconds) == (heartbeat or (None, None))
    assert not parsed.terminal and parsed.attestation is None


@given(now=moments)
def test_a_heartbeat_parses_back_as_its_instant(now: datetime.datetime) -> None:
    stored = as_stored(make_registration(heartbeat_at=None, attested=False))
    parsed = model.parse_registration(merged_status(stored, wire.heartbeat_patch(now)["status"]))
    assert parsed.last_heartbeat_time == now
    assert parsed.last_heartbeat_raw == model.format_time(now, fraction=True)
    assert not parsed.heartbeat_unparsable


@given(now=moments, message=optional_text, generation=st.none() | st.integers(0, 2**31))
def test_the_goodbye_parses_back_as_released(now: datetime.datetime, message: str, generation: int | None) -> None:
    condition = wire.released_condition(message=message, now=now, generation=generation)
    apply = wire.release_apply(name="w", namespace="jobs", condition=condition)
    assert (apply["apiVersion"], apply["kind"], apply["metadata"]) == (
        api.API_VERSION,
        api.KIND,
        {"name": "w", "namespace": "jobs"},
    )
    # The server merges the one list-map entry (keyed by type) into the stored conditions.
    stored = make_registration(conditions=[ATTESTED])
    parsed = model.parse_registration(
        merged_status(stored, {"conditions": [*stored["status"]["conditions"], *apply["status"]["conditions"]]})
    )
    assert parsed.released and parsed.terminal and not parsed.retired
    released = next(c for c in parsed.conditions if c.type == ConditionType.RELEASED)
    assert (released.status, released.reason, released.message) == ("True", wire.RELEASED_REASON, message)
    assert released.last_transition_time == now.replace(microsecond=0)
    assert released.observed_generation == generation
    assert not [p for p in parsed.problems if p[0].startswith("status.conditions")]


_CONDITION_TYPES = [*ConditionType, "Other"]


@given(
    types_and_statuses=st.lists(
        st.tuples(st.sampled_from(_CONDITION_TYPES), st.sampled_from(["True", "False", "Unknown"])), max_size=5
    ),
    retirement=st.none() | st.just({"reason": "PidfdExited"}),
)
def test_the_state_written_is_the_parser_s_retired_and_released(
    types_and_statuses: list[tuple[str, str]], retirement: dict[str, str] | None
) -> None:
    conditions = [
        {
            "type": str(kind),
            "status": status,
            "reason": "R",
            "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
        for kind, status in types_and_statuses
    ]
    status = {"conditions": conditions, **({} if retirement is None else {"retirement": retirement})}
    parsed = model.parse_registration({**make_registration(), "status": status})
    expected = State.RETIRED if parsed.retired else State.RELEASED if parsed.released else State.ACTIVE
    assert wire.state_of(conditions, retirement) == expected
    # The compare-and-swap writes it, from the stored retirement where the write adds none.
    body = {**make_registration(), "status": status}
    ops = wire.status_ops(body=body, resource_version="1", conditions=conditions)
    assert ops[-1] == {"op": "add", "path": "/status/state", "value": expected.value}


# --- the agent -------------------------------------------------------------------------------------


@settings(max_examples=50)
@given(
    verdict=st.sampled_from(Verdict),
    evidence=st.sampled_from(Evidence),
    detail=st.text(max_size=1500),
    now=moments,
    first=st.none() | moments,
    boot_id=st.sampled_from(["", None, "8d0a4c6e-0000-4000-8000-000000000001"]),
    heartbeat=st.booleans(),
)
def test_an_attestation_parses_back_as_the_agent_said(
    verdict: Verdict,
    evidence: Evidence,
    detail: str,
    now: datetime.datetime,
    first: datetime.datetime | None,
    boot_id: str | None,
    heartbeat: bool,
) -> None:
    stored = make_registration(attested=False, heartbeat=heartbeat)
    registration = model.parse_registration(stored)
    attestation = wire.attestation_body(
        registration=registration,
        verdict=verdict,
        evidence=evidence,
        detail=detail,
        boot_id=boot_id,
        host_id="host",
        now=now,
        agent_node="node-a",
        agent_pod="agent-xyz",
        agent_identity="system:serviceaccount:coroner-system:coroner-agent",
        first_observed=first,
    )
    parsed = model.parse_registration(applied(stored, wire.attestation_ops(stored, attestation)))
    read = parsed.attestation
    assert read is not None
    problems = [p for p in parsed.problems if p[0].startswith("status.attestation")]
    # An unreadable boot id is written as "" (the CRD requires the field), which reads as a problem
    # besides the Unknown verdict: unknown either way.
    assert problems == ([] if boot_id else [("status.attestation.bootId", "empty")])
    if boot_id:
        assert (read.verdict, read.evidence) == (verdict, evidence)
    else:  # an agent that cannot read its boot id knows nothing: Unknown, never Dead
        assert (read.verdict, read.evidence) == (Verdict.UNKNOWN, Evidence.BOOT_ID_UNREADABLE)
    assert read.detail == detail[: wire.ATTESTATION_DETAIL_MAX]
    assert read.incarnation == registration.incarnation
    assert (read.boot_id, read.host_id) == ((boot_id or None), "host")
    assert read.observed_time == now and read.first_observed_time == first
    assert read.heartbeat_seen == (registration.last_heartbeat_raw or "")
    assert (read.agent_node, read.agent_pod, read.agent_identity) == (
        "node-a",
        "agent-xyz",
        "system:serviceaccount:coroner-system:coroner-agent",
    )
    assert dict(read.raw) == attestation


@pytest.mark.parametrize(
    ("body", "tested"),
    [
        pytest.param(make_registration(attested=False), "/status/lastHeartbeatTime", id="heartbeat-seen"),
        pytest.param(
            make_registration(attested=False, heartbeat=False), "/metadata/resourceVersion", id="no-heartbeat"
        ),
        pytest.param(
            {k: v for k, v in make_registration(heartbeat=False).items() if k != "status"},
            "/metadata/resourceVersion",
            id="no-status",
        ),
    ],
)
def test_an_attestation_is_written_only_over_what_the_probe_relied_on(body: dict[str, Any], tested: str) -> None:
    attestation = {"verdict": "Dead", "heartbeatSeen": (body.get("status") or {}).get("lastHeartbeatTime", "")}
    ops = wire.attestation_ops(body, attestation)
    assert ops[0]["op"] == "test" and ops[0]["path"] == tested
    applied(body, ops)  # applies to what was read
    moved = copy.deepcopy(body)
    moved["metadata"]["resourceVersion"] = "moved"
    moved.setdefault("status", {})["lastHeartbeatTime"] = "2099-01-01T00:00:00Z"
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(moved, ops)


# --- the operator and apply ------------------------------------------------------------------------


def test_the_operators_conditions_parse_back_as_decided() -> None:
    body = make_registration()
    registration = model.parse_registration(body)
    decision = decide(registration=registration, facts=make_facts(), policy=Policy(), now=NOW)
    desired = wire.desired_conditions(registration, decision, now=NOW)
    ops = wire.conditions_ops(body, desired, resource_version=str(registration.resource_version))
    parsed = model.parse_registration(applied(body, ops))
    assert parsed.conditions == tuple(desired)
    assert not wire.conditions_changed(parsed, desired)
    assert not parsed.terminal


_CONDITION = st.builds(
    model.Condition,
    type=st.sampled_from(["Attested", "Retirable"]),
    status=st.sampled_from([None, "True", "False"]),
    reason=st.sampled_from([None, "Unknown", "PidAlive"]),
    message=st.sampled_from([None, "", "alive"]),
    last_transition_time=st.sampled_from(
        [None, NOW, NOW + datetime.timedelta(microseconds=1), NOW.replace(tzinfo=None)]
    ),
    observed_generation=st.sampled_from([None, 1]),
)


@given(st.lists(_CONDITION, max_size=2), st.lists(_CONDITION, max_size=2))
def test_conditions_changed_means_they_would_be_stored_differently(
    stored: list[model.Condition], desired: list[model.Condition]
) -> None:
    registration = dataclasses.replace(model.parse_registration(make_registration()), conditions=tuple(stored))
    expected = cond.render_conditions(stored) != cond.render_conditions(desired)
    assert wire.conditions_changed(registration, desired) is expected


#: Conditions the operator does not write, as others may store them: a goodbye timed to the
#: microsecond with an offset (RFC 3339 allows both) and no observedGeneration, a type written
#: before admission refused foreign ones, and an item the parser cannot read.
FOREIGN_CONDITIONS: list[Any] = [
    {"type": "Released", "status": "True", "reason": "CleanExit", "message": "bye",
     "lastTransitionTime": "2026-12-01T10:00:00.123456+00:00"},
    {"type": "Peer0", "status": "True", "reason": "Stuffed", "message": "a peer's",
     "lastTransitionTime": "2026-12-01T10:00:00Z", "extra": 1},
    {"type": "Garbage", "status": "Maybe"},
]  # fmt: skip


def test_the_operator_writes_back_what_it_does_not_own_exactly_as_stored() -> None:
    # Admission lets only a condition's own writer change it (the goodbye is the registrant's): a
    # re-rendered one (another time format, a field dropped) would be refused on every write.
    body = make_registration(conditions=[ATTESTED, *FOREIGN_CONDITIONS])
    registration = model.parse_registration(body)
    decision = decide(registration=registration, facts=make_facts(), policy=Policy(), now=NOW)
    desired = wire.desired_conditions(registration, decision, now=NOW)
    ops = wire.conditions_ops(body, desired, resource_version=str(registration.resource_version))
    written = applied(body, ops)["status"]["conditions"]
    assert [c for c in written if c["type"] not in ("Attested", "Retirable", "Retired")] == FOREIGN_CONDITIONS
    assert [c["type"] for c in written][:4] == ["Attested", "Released", "Peer0", "Garbage"]
    if decision.retirable:
        retired = applied(body, wire.retirement_ops(body, registration, decision, retired_by="op", now=NOW))
        kept = [c for c in retired["status"]["conditions"] if c["type"] not in ("Attested", "Retirable", "Retired")]
        assert kept == FOREIGN_CONDITIONS


@pytest.mark.parametrize("writer", list(wire.Writer))
@pytest.mark.parametrize(
    "body",
    [
        pytest.param(make_registration(), id="attested"),
        pytest.param(make_registration(conditions=[ATTESTED]), id="with-conditions"),
    ],
)
def test_one_retirement_patch_parses_back_as_retired(body: dict[str, Any], writer: wire.Writer) -> None:
    registration = model.parse_registration(body)
    decision = decide(registration=registration, facts=make_facts(), policy=Policy(), now=NOW)
    assert decision.reason is Reason.ELIGIBLE_STALE_ORPHAN
    ops = wire.retirement_ops(body, registration, decision, retired_by="someone", now=NOW, writer=writer)
    assert [(op["op"], op["path"]) for op in ops[:2]] == [
        ("test", "/metadata/resourceVersion"),
        ("test", "/status/attestation"),
    ]
    parsed = model.parse_registration(applied(body, ops))
    assert parsed.retired and parsed.terminal and not parsed.released
    assert parsed.retirement == model.Retirement(
        retired_time=NOW, retired_by="someone", reason="PidfdExited", decision=Reason.ELIGIBLE_STALE_ORPHAN.value
    )
    retired = next(c for c in parsed.conditions if c.type == ConditionType.RETIRED)
    assert (retired.status, retired.reason) == ("True", "PidfdExited")
    stored = (body.get("status") or {}).get("conditions") or []
    if writer is wire.Writer.PERSON:  # the operator's conditions are written back exactly as stored
        others = [c for c in applied(body, ops)["status"]["conditions"] if c["type"] != "Retired"]
        assert others == [c for c in stored if c["type"] != "Retired"]
    else:  # the operator says AlreadyTerminal at once
        assert wire.reads_terminal(parsed)


@pytest.mark.parametrize(
    ("writer", "evidence", "statement"),
    [
        pytest.param(wire.Writer.PERSON, Evidence.NODE_DELETED, Statement.HUMAN, id="person-node-deleted"),
        pytest.param(wire.Writer.PERSON, Evidence.NODE_OUT_OF_SERVICE, Statement.HUMAN, id="person-out-of-service"),
        pytest.param(wire.Writer.PERSON, Evidence.PIDFD_EXITED, None, id="person-process-evidence"),
        pytest.param(wire.Writer.OPERATOR, Evidence.NODE_DELETED, None, id="operator-node-deleted"),
        pytest.param(wire.Writer.OPERATOR, Evidence.NODE_OUT_OF_SERVICE, None, id="operator-out-of-service"),
        pytest.param(wire.Writer.OPERATOR, Evidence.PIDFD_EXITED, None, id="operator-process-evidence"),
    ],
)
def test_a_person_stating_node_evidence_is_recorded_as_a_human_statement(
    writer: wire.Writer, evidence: Evidence, statement: Statement | None
) -> None:
    """`statement: Human` exactly where a person retires on node-level evidence (the evidence policy
    requires it there and refuses it anywhere else)."""
    body = make_registration(attested=not evidence.node_level)
    registration = model.parse_registration(body)
    decided = decide(registration=registration, facts=make_facts(), policy=Policy(), now=NOW)
    decision = dataclasses.replace(decided, reason=Reason.ELIGIBLE_STALE_ORPHAN, death_evidence=evidence)
    ops = wire.retirement_ops(body, registration, decision, retired_by="alice", now=NOW, writer=writer)
    record = applied(body, ops)["status"]["retirement"]
    assert record.get("statement") == (None if statement is None else statement.value)
    parsed = model.parse_registration(applied(body, ops))
    assert parsed.retirement == model.Retirement(
        retired_time=NOW,
        retired_by="alice",
        reason=evidence.value,
        decision=Reason.ELIGIBLE_STALE_ORPHAN.value,
        statement=None if statement is None else statement.value,
    )
    assert parsed.problems == ()


def test_a_decision_that_is_not_retirable_has_no_retirement_patch() -> None:
    body = make_registration(verdict="Alive", evidence="PidfdPinned")
    registration = model.parse_registration(body)
    decision = decide(registration=registration, facts=make_facts(), policy=Policy(), now=NOW)
    for writer in wire.Writer:
        with pytest.raises(ValueError, match="not retirable"):
            wire.retirement_ops(body, registration, decision, retired_by="x", now=NOW, writer=writer)


# --- Leases and Events -----------------------------------------------------------------------------


@settings(max_examples=50)
@given(
    name=names,
    holder=names,
    duration=st.integers(1, 3600),
    now=moments,
    later=moments,
    boot=st.uuids().map(str),
)
def test_a_lease_parses_back_as_written_and_renewed(
    name: str, holder: str, duration: int, now: datetime.datetime, later: datetime.datetime, boot: str
) -> None:
    annotations = {api.AGENT_LEASE_BOOT_ID: boot, api.AGENT_LEASE_HOST_ID: "host"}
    created = kubewire.lease_body(
        namespace=api.SYSTEM_NAMESPACE,
        name=f"{api.AGENT_LEASE_PREFIX}{name}",
        holder=holder,
        duration=duration,
        annotations=annotations,
        now=now,
    )
    facts = world.lease_facts(created)
    assert (facts.namespace, facts.name, facts.holder_identity) == (
        api.SYSTEM_NAMESPACE,
        f"{api.AGENT_LEASE_PREFIX}{name}",
        holder,
    )
    assert (facts.renew_time, facts.lease_duration_seconds) == (now, duration)
    agent = world.agent_facts_from_lease(created)
    assert (agent.boot_id, agent.host_id, agent.renew_time) == (boot, "host", now)

    stored = {**created, "metadata": {**created["metadata"], "resourceVersion": "7", "annotations": {"other": "kept"}}}
    renewed = kubewire.lease_renewal(stored, holder=holder, duration=duration + 1, annotations=annotations, now=later)
    assert renewed["metadata"]["resourceVersion"] == "7", "the PUT is a compare-and-swap"
    assert renewed["metadata"]["annotations"] == {"other": "kept", **annotations}
    assert renewed["spec"]["acquireTime"] == created["spec"]["acquireTime"]
    again = world.lease_facts(renewed)
    assert (again.renew_time, again.lease_duration_seconds) == (later, duration + 1)
    assert stored["metadata"]["annotations"] == {"other": "kept"}, "the Lease read is not changed"


@given(holder=names, other=names, duration=st.integers(1, 3600), now=moments, later=moments)
def test_an_elected_lease_counts_its_transitions_and_parses_back(
    holder: str, other: str, duration: int, now: datetime.datetime, later: datetime.datetime
) -> None:
    """The operator's leader Lease, with client-go's semantics: created held with 0 transitions; taken
    over by another holder (or from none) it is acquired again and counts one more; renewed by its
    holder it keeps both; released, nobody holds it for 1 s. Every write keeps the resourceVersion
    read (a compare-and-swap)."""
    created = kubewire.lease_body(
        namespace=api.SYSTEM_NAMESPACE, name="coroner-operator", holder=holder, duration=duration,
        annotations={"coroner.dev/policy": "{}"}, now=now, transitions=0,
    )  # fmt: skip
    assert created["spec"]["leaseTransitions"] == 0
    assert world.lease_facts(created).holder_identity == holder
    stored = {**created, "metadata": {**created["metadata"], "resourceVersion": "7"}}
    annotations = {"coroner.dev/last-sweep": "{}"}
    renewed = kubewire.lease_acquisition(stored, holder=holder, duration=duration, annotations=annotations, now=later)
    assert renewed["spec"]["leaseTransitions"] == 0 and renewed["spec"]["acquireTime"] == created["spec"]["acquireTime"]
    assert renewed["metadata"]["annotations"] == {"coroner.dev/policy": "{}", **annotations}
    assert world.lease_facts(renewed).renew_time == later
    for taker in {other, ""} - {holder}:
        taken = kubewire.lease_acquisition(stored, holder=taker, duration=duration, annotations={}, now=later)
        assert taken["spec"]["leaseTransitions"] == 1, taker
        assert model.parse_time(taken["spec"]["acquireTime"]) == later
        assert taken["metadata"]["resourceVersion"] == "7", "the PUT is a compare-and-swap"
    released = kubewire.lease_release(stored, now=later)
    assert (released["spec"]["holderIdentity"], released["spec"]["leaseDurationSeconds"]) == ("", 1)
    assert released["metadata"]["resourceVersion"] == "7", "never releases a Lease another wrote since"
    assert stored["spec"]["holderIdentity"] == holder, "the Lease read is not changed"


def test_access_reviews_ask_about_the_retire_verb_on_registrations() -> None:
    attributes = {"group": api.GROUP, "resource": api.PLURAL, "verb": api.RETIRE_VERB, "namespace": "jobs"}
    assert kubewire.self_access_review(namespace="jobs") == {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }
    assert kubewire.self_access_review(namespace="jobs", name="w")["spec"]["resourceAttributes"] == {
        **attributes,
        "name": "w",
    }
    review = kubewire.access_review(user="system:serviceaccount:coroner-system:op", groups=["g"], namespace="jobs")
    assert review["kind"] == "SubjectAccessReview" and review["apiVersion"] == "authorization.k8s.io/v1"
    assert review["spec"] == {
        "user": "system:serviceaccount:coroner-system:op",
        "groups": ["g"],
        "resourceAttributes": attributes,
    }
    assert kubewire.SELF_ACCESS_REVIEW_PATH == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


def test_a_delete_holds_only_for_the_object_as_read() -> None:
    assert kubewire.delete_options(uid="u-1", resource_version="42") == {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "preconditions": {"uid": "u-1", "resourceVersion": "42"},
    }


#: The kinds Coroner sends to the API server: each body is built in coroner.core.wire only.
SENT_KINDS = ("Lease", "DeleteOptions", "SelfSubjectAccessReview", "SubjectAccessReview", "SelfSubjectReview", "Event")


def test_every_body_sent_is_built_in_wire() -> None:
    """No other module of the shipped code spells the kind of a body it sends: it calls wire (the
    registration's shapes) or kubewire (Kubernetes' own objects)."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2]
    sources = [p for tree in ("src/coroner", "operator/src", "node-agent/src") for p in (root / tree).rglob("*.py")]
    kinds = "|".join(SENT_KINDS)
    spelled = re.compile(rf"""["']kind["']\s*:\s*["']({kinds})["']""")
    builders = sorted({str(p.relative_to(root)) for p in sources if spelled.search(p.read_text())})
    assert set(builders) <= {"src/coroner/core/kubewire.py", "src/coroner/core/wire.py"}, builders


@given(message=st.text(max_size=2000), count=st.integers(-3, 50), instance=st.text(max_size=300))
def test_an_event_is_about_the_registration_as_written(message: str, count: int, instance: str) -> None:
    involved = as_stored(make_registration())
    event = kubewire.event_body(
        involved=involved,
        reason="Retired",
        message=message,
        component="coroner-operator",
        instance=instance,
        now=NOW,
        suffix="abc",
        count=count,
    )
    meta = involved["metadata"]
    assert event["metadata"] == {"name": f"{meta['name']}.abc", "namespace": meta["namespace"]}
    assert event["involvedObject"] == {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "name": meta["name"],
        "namespace": meta["namespace"],
        "uid": meta["uid"],
        "resourceVersion": meta["resourceVersion"],
    }
    assert event["message"] == message[:1024] and event["reportingInstance"] == instance[:128]
    assert event["count"] == max(1, count)
    assert model.parse_time(event["firstTimestamp"]) == NOW == model.parse_time(event["lastTimestamp"])


def test_content_types_are_spelled_once() -> None:
    """Only wire spells a patch content type; every sender imports it from there."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    sources = [p for tree in ("src", "operator/src", "node-agent/src") for p in (root / tree).rglob("*.py")]
    for content_type in (wire.JSON_PATCH, wire.MERGE_PATCH, wire.APPLY_PATCH):
        spelled = sorted(str(p.relative_to(root)) for p in sources if content_type in p.read_text())
        assert spelled == ["src/coroner/core/wire.py"], (content_type, spelled)


attestation_fields = st.fixed_dictionaries(
    {},
    optional={
        "verdict": st.sampled_from([*Verdict, "Zombie", 7]).map(lambda v: v.value if isinstance(v, Verdict) else v),
        "evidence": st.sampled_from([*Evidence, "Hunch"]).map(lambda v: v.value if isinstance(v, Evidence) else v),
        "detail": st.text(max_size=20) | st.integers(),
        "incarnation": st.fixed_dictionaries(
            {},
            optional={
                "bootId": st.text(max_size=8),
                "pidNamespace": digits | st.text(max_size=4),
                "pid": st.integers(-5, api.PID_MAX_LIMIT + 5) | digits | st.floats(allow_nan=True),
                "startTime": digits,
                "hostId": st.text(max_size=8),
            },
        ),
        "bootId": st.text(max_size=8),
        "hostId": st.text(max_size=8),
        "observedTime": moments.map(model.format_time) | st.text(max_size=8),
        "firstObservedTime": moments.map(lambda m: model.format_time(m, fraction=True)) | st.just("soon"),
        "heartbeatSeen": st.text(max_size=8) | st.none(),
        "agent": st.fixed_dictionaries(
            {}, optional={"nodeName": st.text(max_size=8), "podName": st.text(max_size=8), "identity": st.integers()}
        ),
    },
)


@settings(max_examples=200)
@given(stored=attestation_fields)
def test_the_one_rendering_of_an_attestation_parses_back_to_what_was_parsed(stored: dict[str, Any]) -> None:
    # Whatever the stored attestation holds, rendering what the parser made of it and parsing that
    # again changes nothing: the decision's evidence shows exactly what it relied on.
    first = model.parse_registration(make_registration(paths={"status.attestation": stored})).attestation
    assert first is not None
    rendered = model.render_attestation(first)
    again = model.parse_registration(make_registration(paths={"status.attestation": rendered})).attestation
    assert again == first
    assert model.render_attestation(again) == rendered


def test_an_attestation_never_lands_on_a_registration_created_again_under_its_name() -> None:
    """Deleted and created again under the same name for another incarnation, the new object can
    carry the very lastHeartbeatTime the probe saw on the old one (one tick stamping both): the
    patch must still fail, since it pins the object it was decided on by uid. The long fault run
    (seed 2026, trial 557: stale_view_agent) saw such a stale Dead attestation accepted."""
    body = make_registration(attested=False)
    attestation = {"verdict": "Dead", "heartbeatSeen": body["status"]["lastHeartbeatTime"]}
    ops = wire.attestation_ops(body, attestation)
    applied(body, ops)
    again = copy.deepcopy(body)
    again["metadata"] |= {"uid": "another-uid", "resourceVersion": "moved"}
    again["spec"]["incarnation"]["pid"] += 1
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(again, ops)


@pytest.mark.parametrize(
    ("user_info", "expected"),
    [
        ({"username": "alice"}, "alice"),
        ({"username": "system:serviceaccount:jobs:w", "extra": {}}, "system:serviceaccount:jobs:w"),
        (
            {
                "username": "system:serviceaccount:jobs:w",
                "extra": {
                    "authentication.kubernetes.io/pod-name": ["w-0"],
                    "authentication.kubernetes.io/pod-uid": ["u-1"],
                    "authentication.kubernetes.io/node-name": ["node-a"],
                },
            },
            "system:serviceaccount:jobs:w pod/w-0/u-1",
        ),
        (
            {"username": "sa", "extra": {"authentication.kubernetes.io/pod-uid": ["u-1"]}},
            "sa pod//u-1",  # as the policy's CEL spells a pod-uid without a pod-name
        ),
        ({}, None),
        ({"username": ""}, None),
    ],
)
def test_the_registrant_is_spelled_as_the_admission_policies_spell_the_requester(
    user_info: dict[str, Any], expected: str | None
) -> None:
    answer = {"status": {"userInfo": user_info}}
    assert kubewire.registrant(answer) == expected
    body = wire.registration_body(
        name="w", namespace="jobs", node_name="node-a", incarnation={}, client_instance_id="i", registered_by=expected
    )
    assert body["metadata"].get("annotations") == (
        None if expected is None else {api.REGISTERED_BY_ANNOTATION: expected}
    )
