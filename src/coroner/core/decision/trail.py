"""What a decision returns, and the trail it keeps while deciding: the facts it used (as the JSON
recorded in a condition's evidence) and the instants at which they change by the clock alone."""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Mapping
from typing import TypeAlias

from coroner.core.decision.facts import END_OF_TIME, AgentFacts, NodeFacts, lease_expiry
from coroner.core.decision.known import Known
from coroner.core.model import Attestation, Registration, format_time, render_attestation
from coroner.core.reasons import Evidence, Reason

JSONValue: TypeAlias = "str | int | float | bool | list[JSONValue] | dict[str, JSONValue] | None"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """The outcome of `decide` for one registration at one instant."""

    reason: Reason
    detail: str
    """One sentence naming the object's facts and, for a preserve, what would change it."""
    evidence: Mapping[str, JSONValue]
    """The structured facts the decision used (JSON-serialisable, camelCase keys)."""
    death_evidence: Evidence | None = None
    """The path a retirement records (PidfdExited, ProcAbsent, PidNamespaceRecreated, BootBoundary, NodeDeleted, NodeOutOfService)."""
    relied_on: Attestation | None = None
    """The attestation the decision read; a retirement's write tests it is unchanged."""
    next_evaluation_at: datetime.datetime | None = None
    """The earliest instant the decision could change by the clock alone, or None — except for the
    expiry of the agent Lease, which is `agent_expires_at`."""
    agent_expires_at: datetime.datetime | None = None
    """When the node's agent Lease expires, where the decision relied on that agent being live (or on
    it blocking node-level evidence); the decision may change then. Kept apart from
    `next_evaluation_at` because every agent renews every few seconds: the runtime watches it once
    per node, not once per registration."""

    @property
    def retirable(self) -> bool:
        """Only EligibleStaleOrphan authorizes a retirement."""
        return self.reason.eligible


class Trail:
    """What the decision has looked at so far: the facts it used and the instants they change."""

    def __init__(self, *, registration: Registration, now: datetime.datetime) -> None:
        self.now = now
        self.obj = registration.display_name
        self.evidence: dict[str, JSONValue] = {
            "registration": {
                "namespace": registration.namespace,
                "name": registration.name,
                "uid": registration.uid,
            },
            "now": stamp(now),
        }
        self.deadlines: list[datetime.datetime] = []
        self.relied_on: Attestation | None = None
        self.death_evidence: Evidence | None = None
        self.agent_expiry: datetime.datetime | None = None

    def changes_at(self, moment: datetime.datetime | None) -> None:
        """A fact already read flips at `moment` by the clock alone."""
        if moment is not None and self.now < moment < END_OF_TIME:
            self.deadlines.append(moment)

    def conclude(self, reason: Reason, detail: str) -> Decision:
        return Decision(
            reason=reason,
            detail=detail,
            evidence=self.evidence,
            death_evidence=self.death_evidence,
            relied_on=self.relied_on,
            next_evaluation_at=min(self.deadlines, default=None),
            agent_expires_at=self.agent_expiry,
        )


def stamp(moment: datetime.datetime) -> str:
    try:
        return format_time(moment, fraction=True)
    except OverflowError:
        return moment.isoformat()


def incarnation_json(known: Known) -> dict[str, JSONValue]:
    return {
        "bootId": known.boot_id,
        "pidNamespace": known.pid_namespace,
        "pid": known.pid,
        "startTime": known.start_time,
        "hostId": known.host_id,
    }


def attestation_json(attestation: Attestation, *, now: datetime.datetime) -> dict[str, JSONValue]:
    """The attestation relied on, as stored (`coroner.core.model.render_attestation`), and its age."""
    observed = attestation.observed_time
    return {
        **render_attestation(attestation),
        "ageSeconds": None if observed is None else (now - observed).total_seconds(),
    }


def agent_json(agent: AgentFacts, *, now: datetime.datetime) -> dict[str, JSONValue]:
    until = lease_expiry(agent.renew_time, agent.lease_duration_seconds)
    duration = agent.lease_duration_seconds
    return {
        "bootId": agent.boot_id,
        "hostId": agent.host_id,
        "renewTime": None if agent.renew_time is None else stamp(agent.renew_time),
        "leaseDurationSeconds": duration if duration is None or math.isfinite(duration) else str(duration),
        "live": until is not None and now < until,
    }


def node_json(node: NodeFacts) -> dict[str, JSONValue]:
    return {
        "exists": node.exists,
        "uid": node.uid,
        "bootId": node.boot_id,
        "outOfService": node.out_of_service,
        "missingSince": None if node.missing_since is None else stamp(node.missing_since),
    }


def peer_json(peer: Registration) -> dict[str, JSONValue]:
    verdict = None if peer.attestation is None else peer.attestation.verdict
    return {
        "namespace": peer.namespace,
        "name": peer.name,
        "uid": peer.uid,
        "clientInstanceId": peer.client_instance_id,
        "registeredBy": peer.registered_by,
        "verdict": None if verdict is None else str(verdict),
    }
