"""Every body and patch Coroner writes, built in one pure module next to `coroner.core.model`,
which parses the same shapes back (tests/unit/test_wire.py round-trips each builder through it).

- the launcher: the WorkerRegistration it creates (`registration_body`), its opt-in heartbeat
  (`heartbeat_patch`) and its goodbye (`released_condition`, `release_apply`);
- the agent: its attestation (`attestation_body`) and the compare-and-swap that writes it
  (`attestation_ops`);
- the operator: its conditions (`desired_conditions`, `conditions_ops`);
- the operator and ``kubectl coroner apply``: the one retirement patch (`retirement_ops`).

The bodies of Kubernetes' own objects Coroner sends (Events, Leases, reviews, DeleteOptions) are
built in `coroner.core.kubewire`.

Every status write the operator and `apply` make is a JSON patch that first `test`s the
resourceVersion it decided from (and, for a retirement, the attestation it relied on, verbatim):
if anything moved, the server answers 422 and the writer re-reads and decides again. Never a blind
write, never a merge patch (which would replace the whole conditions list and could erase what
another writer added). The one exception is the launcher's goodbye (`release_apply`), a
server-side apply of its own condition that the API server keeps off retired registrations.
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Iterable, Mapping
from typing import Any, Final

from coroner.core import api, model
from coroner.core import conditions as cond
from coroner.core.decision import Decision
from coroner.core.reasons import ConditionType, Evidence, Reason, State, Statement, Verdict

#: Content types of the requests: the one place they are spelled (clients import them).
JSON = "application/json"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


def retirement_record(
    *,
    decision: Decision,
    retired_by: str,
    now: datetime.datetime,
    attestation: object | None,
    statement: Statement | None = None,
) -> dict[str, Any]:
    """`status.retirement`: when, by whom, on which evidence path, the attestation relied on, and
    (`statement`) that a person stated the evidence."""
    record: dict[str, Any] = {
        "retiredTime": model.format_time(now, fraction=True),
        "retiredBy": retired_by,
        "reason": decision.death_evidence.value if decision.death_evidence else "Unknown",
        "decision": decision.reason.value,
    }
    if attestation is not None:
        record["attestation"] = attestation
    if statement is not None:
        record["statement"] = statement.value
    return record


def state_of(conditions: Iterable[object], retirement: object | None) -> State:
    """`status.state` of a status with these (rendered) conditions and this retirement: Retired when
    a retirement is recorded or Retired is True, else Released when Released is True, else Active.
    The same rule as the parser's `retired` and `released`, and the CRD's rule on status."""

    def true(kind: ConditionType) -> bool:
        return any(isinstance(c, Mapping) and c.get("type") == kind and c.get("status") == "True" for c in conditions)

    if retirement is not None or true(ConditionType.RETIRED):
        return State.RETIRED
    return State.RELEASED if true(ConditionType.RELEASED) else State.ACTIVE


def status_ops(
    *,
    body: Mapping[str, Any],
    resource_version: str,
    conditions: list[dict[str, Any]],
    retirement: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Sets status.conditions (and status.retirement), and the status.state they make, only if the
    object is still as it was read."""
    status = body.get("status")
    ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion", "value": resource_version}]
    if retirement is not None and isinstance(status, Mapping) and status.get("attestation") is not None:
        # The attestation relied on must be exactly the one read; with node-level evidence there is
        # none, and the resourceVersion test alone guards that none appeared.
        ops.append({"op": "test", "path": "/status/attestation", "value": status["attestation"]})
    stored_retirement = status.get("retirement") if isinstance(status, Mapping) else None
    state = state_of(conditions, retirement if retirement is not None else stored_retirement).value
    if not isinstance(status, Mapping):
        value: dict[str, Any] = {"conditions": conditions, "state": state}
        if retirement is not None:
            value["retirement"] = retirement
        ops.append({"op": "add", "path": "/status", "value": value})
        return ops
    ops.append({"op": "add", "path": "/status/conditions", "value": conditions})
    if retirement is not None:
        ops.append({"op": "add", "path": "/status/retirement", "value": retirement})
    ops.append({"op": "add", "path": "/status/state", "value": state})
    return ops


# --- the operator's conditions -------------------------------------------------------------------

#: Reason of the Retired condition while a registration is active.
ACTIVE = "Active"
#: Reason of the Retired condition once the worker released its registration.
RELEASED = "Released"


def attested_condition(registration: model.Registration) -> tuple[bool, str, str]:
    """(status, reason, message) of the Attested condition: reason is the verdict."""
    attestation = registration.attestation
    if attestation is None:
        return (
            False,
            Reason.ATTESTATION_MISSING.value,
            f"no attestation yet from the agent of node {registration.node_name or '?'}",
        )
    verdict = attestation.verdict if isinstance(attestation.verdict, Verdict) else Verdict.UNKNOWN
    # No observedTime here: the agent refreshes an unchanged verdict periodically, and a message
    # that moved with it would cost a status write per refresh (the time is in status.attestation).
    message = (
        f"{attestation.verdict or '?'} ({attestation.evidence or 'no evidence'}) by the agent of node "
        f"{attestation.agent_node or '?'}: {attestation.detail or ''}"
    )
    return True, verdict.value, message.rstrip(": ")


def desired_conditions(
    registration: model.Registration, decision: Decision, *, now: datetime.datetime
) -> list[model.Condition]:
    """Attested, Retirable and Retired (False/Active, or False/Released) for a registration.

    A retired registration's Retired condition is its history (whoever wrote it, the operator or a
    human's ``kubectl coroner apply``) and is left exactly as stored."""
    generation = registration.generation
    current = list(registration.conditions)
    status, reason, message = attested_condition(registration)
    current = cond.set_condition(
        current,
        type=ConditionType.ATTESTED,
        status=status,
        reason=reason,
        message=message,
        observed_generation=generation,
        now=now,
    )
    current = cond.set_condition(
        current,
        type=ConditionType.RETIRABLE,
        status=decision.retirable,
        reason=decision.reason.value,
        message=decision.detail,
        observed_generation=generation,
        now=now,
    )
    if registration.retired:
        return current
    return cond.set_condition(
        current,
        type=ConditionType.RETIRED,
        status=False,
        reason=RELEASED if registration.released else ACTIVE,
        message=(
            "released by the worker; nothing to retire"
            if registration.released
            else "active; the Retirable condition says why it is or is not retirable"
        ),
        observed_generation=generation,
        now=now,
    )


def retired_conditions(
    registration: model.Registration, decision: Decision, *, now: datetime.datetime
) -> list[model.Condition]:
    """The operator's conditions written together with status.retirement, in one compare-and-swap patch.

    Retirable reads AlreadyTerminal at once, as it will for ever after: a retired registration
    reads terminal everywhere (the printer column included), and no second write is needed to say so.
    """
    current = desired_conditions(registration, decision, now=now)
    evidence = decision.death_evidence.value if decision.death_evidence else "Unknown"
    current = cond.set_condition(
        current,
        type=ConditionType.RETIRABLE,
        status=False,
        reason=Reason.ALREADY_TERMINAL.value,
        message=f"retired ({evidence}); terminal registrations are history and are not decided again",
        observed_generation=registration.generation,
        now=now,
    )
    return cond.set_condition(
        current,
        type=ConditionType.RETIRED,
        status=True,
        reason=evidence,
        message=f"retired: {decision.detail}",
        observed_generation=registration.generation,
        now=now,
    )


#: The condition types the operator writes. Every other condition it writes back exactly as
#: stored: admission lets only a condition's own writer change it (the goodbye is the registrant's),
#: and a re-rendered one (another time format, a field dropped) would be refused on every write.
OPERATOR_CONDITIONS: Final = frozenset({ConditionType.ATTESTED, ConditionType.RETIRABLE, ConditionType.RETIRED})


def _operator_conditions(body: Mapping[str, Any], conditions: list[model.Condition]) -> list[Any]:
    """The stored conditions, verbatim, with the operator's own set from `conditions`."""
    status = body.get("status")
    return _stored_with(
        status if isinstance(status, Mapping) else None,
        {c.type: cond.render_condition(c) for c in conditions if c.type in OPERATOR_CONDITIONS},
    )


def _stored_with(stored_status: Mapping[str, Any] | None, own: Mapping[str, dict[str, object]]) -> list[Any]:
    """The stored conditions, verbatim, with those of the types in `own` set from it (replaced in
    place, a duplicate dropped, or appended in `own`'s order)."""
    stored = None if stored_status is None else stored_status.get("conditions")
    written: list[Any] = []
    seen: set[str] = set()
    for item in stored if isinstance(stored, list) else []:
        kind = item.get("type") if isinstance(item, Mapping) else None
        if isinstance(kind, str) and kind in own:
            if kind not in seen:
                written.append(own[kind])
                seen.add(kind)
            continue
        written.append(item)
    written.extend(rendered for kind, rendered in own.items() if kind not in seen)
    return written


def conditions_ops(
    body: Mapping[str, Any], conditions: list[model.Condition], *, resource_version: str
) -> list[dict[str, Any]]:
    """The operator's compare-and-swap JSON patch that sets status.conditions."""
    return status_ops(body=body, resource_version=resource_version, conditions=_operator_conditions(body, conditions))


def conditions_changed(registration: model.Registration, desired: list[model.Condition]) -> bool:
    current = list(registration.conditions)
    if current == desired:  # equal records render equal (the common case, without rendering)
        return False
    return cond.render_conditions(current) != cond.render_conditions(desired)


def reads_terminal(registration: model.Registration) -> bool:
    """The Retirable condition already says AlreadyTerminal (whatever its message)."""
    retirable = cond.find_condition(registration.conditions, type=ConditionType.RETIRABLE)
    return retirable is not None and retirable.reason == Reason.ALREADY_TERMINAL.value


# --- the retirement: one patch for the operator and for `kubectl coroner apply` ------------------


class Writer(enum.Enum):
    """Who retires, which decides which conditions the retirement patch may write."""

    #: The operator owns Attested and Retirable and writes all three conditions.
    OPERATOR = "operator"
    #: A person's ``kubectl coroner apply``: the admission policy coroner-status-fields-by-identity
    #: refuses anyone but the operator a change to Attested or Retirable, so those are written back
    #: exactly as stored (re-rendering them could change them) and only Retired is set. On node-level
    #: evidence the record says ``statement: Human`` (coroner-retire-requires-evidence requires it).
    PERSON = "person"


def retirement_ops(
    body: Mapping[str, Any],
    registration: model.Registration,
    decision: Decision,
    *,
    retired_by: str,
    now: datetime.datetime,
    writer: Writer = Writer.OPERATOR,
) -> list[dict[str, Any]]:
    """The compare-and-swap JSON patch that retires one registration.

    ``test`` the resourceVersion read and the attestation relied on (verbatim), then set the
    conditions (see `Writer`) and ``status.retirement``. Raises ValueError for a decision that is
    not retirable: there is nothing to patch.
    """
    if not decision.retirable or decision.death_evidence is None:
        raise ValueError(f"{registration.display_name} is {decision.reason}, not retirable; nothing to patch")
    status = body.get("status")
    stored_status: Mapping[str, Any] | None = status if isinstance(status, Mapping) else None
    raw_attestation = None if stored_status is None else stored_status.get("attestation")
    statement = None
    if writer is Writer.OPERATOR:
        written = _operator_conditions(body, retired_conditions(registration, decision, now=now))
    else:
        written = _person_retired_conditions(stored_status, registration, decision, retired_by=retired_by, now=now)
        statement = Statement.HUMAN if decision.death_evidence.node_level else None
    record = retirement_record(
        decision=decision, retired_by=retired_by, now=now, attestation=raw_attestation, statement=statement
    )
    return status_ops(
        body=body, resource_version=str(registration.resource_version), conditions=written, retirement=record
    )


def _person_retired_conditions(
    stored_status: Mapping[str, Any] | None,
    registration: model.Registration,
    decision: Decision,
    *,
    retired_by: str,
    now: datetime.datetime,
) -> list[Any]:
    """The stored conditions, verbatim, with Retired set (replaced, or appended)."""
    assert decision.death_evidence is not None
    updated = cond.set_condition(
        registration.conditions,
        type=ConditionType.RETIRED,
        status=True,
        reason=decision.death_evidence.value,
        message=f"retired by {retired_by} with kubectl coroner apply: {decision.detail}",
        observed_generation=registration.generation,
        now=now,
    )
    retired = cond.find_condition(updated, type=ConditionType.RETIRED)
    assert retired is not None  # set_condition always leaves one of its type
    return _stored_with(stored_status, {ConditionType.RETIRED.value: cond.render_condition(retired)})


# --- the launcher ----------------------------------------------------------------------------------

#: The reason of the Released condition the launcher writes on a clean exit.
RELEASED_REASON = "CleanExit"


def registration_body(
    *,
    name: str,
    namespace: str,
    node_name: str,
    incarnation: Mapping[str, Any],
    client_instance_id: str,
    role: str = "",
    session_id: str = "",
    generation_id: str = "",
    node_uid: str | None = None,
    heartbeat: tuple[int, int] | None = None,
    registered_by: str | None = None,
) -> dict[str, Any]:
    """The WorkerRegistration the launcher creates: one incarnation, a launcher-minted identity.

    `heartbeat` is (intervalSeconds, ttlSeconds) where the worker opts into heartbeats; empty
    optional fields are left out. `registered_by` (`registrant`) is who the API server will see
    create it: the admission policy coroner-registrant-recorded refuses a create that does not
    name exactly its requester (no mutating policy writes it, which answered 503 for minutes after
    the CRD was re-created; docs/faults.md, finding 7)."""
    spec: dict[str, Any] = {
        "nodeName": node_name,
        "incarnation": dict(incarnation),
        "clientInstanceId": client_instance_id,
    }
    if heartbeat is not None:
        spec["heartbeat"] = {"intervalSeconds": heartbeat[0], "ttlSeconds": heartbeat[1]}
    for key, value in (
        ("role", role),
        ("sessionId", session_id),
        ("generationId", generation_id),
        ("nodeUID", node_uid),
    ):
        if value:
            spec[key] = value
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": {api.NODE_LABEL: node_name}}
    if registered_by:
        metadata["annotations"] = {api.REGISTERED_BY_ANNOTATION: registered_by}
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": metadata, "spec": spec}


def heartbeat_patch(now: datetime.datetime) -> dict[str, Any]:
    """The opted-in heartbeat: a merge patch of status.lastHeartbeatTime alone."""
    return {"status": {"lastHeartbeatTime": model.format_time(now, fraction=True)}}


def released_condition(*, message: str, now: datetime.datetime, generation: int | None) -> dict[str, object]:
    """The Released=True condition of the worker's goodbye, as `release_apply` carries it."""
    return cond.render_condition(
        model.Condition(
            type=ConditionType.RELEASED.value,
            status="True",
            reason=RELEASED_REASON,
            message=message,
            last_transition_time=now.replace(microsecond=0),
            observed_generation=generation,
        )
    )


#: The field manager of the launcher's goodbye; it owns exactly the Released condition.
RELEASE_FIELD_MANAGER = "coroner-launcher"


def release_apply(*, name: str, namespace: str, condition: Mapping[str, object]) -> dict[str, Any]:
    """The worker's goodbye: a server-side apply of the Released condition (and the state it makes,
    Released), one request.

    ``status.conditions`` is a list-map keyed by ``type``, so the apply merges this one entry and
    leaves every other condition as it is: no read first, no precondition, and so no race with the
    agent's Dead attestation of the very exit being reported (a compare-and-swap goodbye had to
    read first and then lost to the attestation and the retirement it allows). What keeps it off a
    retired registration is the API server itself: the CRD refuses Released on a registration
    whose status.retirement is set (a transition rule), and a retirement's compare-and-swap fails
    on a registration whose goodbye landed first.
    """
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "status": {"conditions": [dict(condition)], "state": State.RELEASED.value},
    }


# --- the agent's attestation ------------------------------------------------------------------------

#: The longest attestation detail the agent writes.
ATTESTATION_DETAIL_MAX = 1000


def incarnation_record(registration: model.Registration) -> dict[str, Any]:
    """The incarnation the agent checked, limited to fields valid under the CRD's status schema."""
    return model.render_incarnation(registration.incarnation)


def attestation_body(
    *,
    registration: model.Registration,
    verdict: Verdict,
    evidence: Evidence,
    detail: str,
    boot_id: str | None,
    host_id: str,
    now: datetime.datetime,
    agent_node: str,
    agent_pod: str,
    agent_identity: str,
    first_observed: datetime.datetime | None = None,
) -> dict[str, Any]:
    """``status.attestation``: the same-node agent's verdict on one incarnation (`model.Attestation`).

    An agent that cannot read its own boot id knows nothing about any incarnation on it: Unknown
    (BootIdUnreadable), whatever the probe said. `first_observed` is the first of the two looks a
    death read from /proc needs (``firstObservedTime``)."""
    if not boot_id:
        verdict, evidence = Verdict.UNKNOWN, Evidence.BOOT_ID_UNREADABLE
    return model.render_attestation(
        model.Attestation(
            verdict=verdict,
            evidence=evidence,
            detail=detail[:ATTESTATION_DETAIL_MAX],
            incarnation=registration.incarnation,
            boot_id=boot_id or "",
            host_id=host_id,
            observed_time=now,
            first_observed_time=first_observed,
            heartbeat_seen=registration.last_heartbeat_raw or "",
            agent_node=agent_node,
            agent_pod=agent_pod,
            agent_identity=agent_identity,
        )
    )


def attestation_ops(body: Mapping[str, Any], attestation: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A JSON patch that writes `attestation` only if what the probe relied on still holds.

    The agent relied on the heartbeat it read (recorded as heartbeatSeen): the patch `test`s that
    value, so a heartbeat that lands between the probe and the write turns the write into a 422
    and a fresh probe, instead of an attestation that contradicts the newest heartbeat. It also
    relied on the object itself: the patch `test`s its uid (spec is immutable, so the uid pins the
    incarnation), or a registration deleted and created again under the same name whose heartbeat
    happens to equal the one seen would take the old incarnation's attestation.
    """
    status = body.get("status")
    seen = attestation.get("heartbeatSeen")
    value = dict(attestation)
    metadata = body.get("metadata") or {}
    pinned = [{"op": "test", "path": "/metadata/uid", "value": metadata["uid"]}] if metadata.get("uid") else []
    if isinstance(status, dict) and isinstance(status.get("lastHeartbeatTime"), str):
        return [
            {"op": "test", "path": "/status/lastHeartbeatTime", "value": seen},
            *pinned,
            {"op": "add", "path": "/status/attestation", "value": value},
        ]
    resource_version = str(metadata.get("resourceVersion"))
    if isinstance(status, dict):
        return [
            {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
            {"op": "add", "path": "/status/attestation", "value": value},
        ]
    return [
        {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
        {"op": "add", "path": "/status", "value": {"attestation": value}},
    ]
