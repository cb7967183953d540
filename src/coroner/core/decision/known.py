"""The registration as the conjunction reads it: the fields it needs (line 2 shows they are all
present), what a registration's own record says about it (launcher-minted, attested dead), and
which peers could be the same worker (one registrant) or squat on its claims (another)."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from typing import Final

from coroner.core import api
from coroner.core.decision.facts import START_OF_TIME, aware
from coroner.core.model import Registration
from coroner.core.reasons import Evidence, Verdict

#: Evidence an agent may cite for `Dead` (node-level evidence is the operator's own, never an agent's).
AGENT_DEATH_EVIDENCE: Final = frozenset(
    {Evidence.PIDFD_EXITED, Evidence.PROC_ABSENT, Evidence.BOOT_BOUNDARY, Evidence.PID_NAMESPACE_RECREATED}
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Known:
    """The fields the conjunction reads, once line 2 has shown they are all present."""

    namespace: str
    name: str
    node_name: str
    boot_id: str
    pid_namespace: str
    pid: int
    start_time: str
    host_id: str
    client_instance_id: str
    heartbeat: bool
    """The worker opted into heartbeats (``spec.heartbeat``): its silence is a second witness."""
    interval_seconds: int | None
    ttl_seconds: int | None
    last_heartbeat: datetime.datetime

    @property
    def key(self) -> tuple[str, str, int, str]:
        return (self.boot_id, self.pid_namespace, self.pid, self.start_time)


# Optional fields the conjunction still reads when present: present but invalid is not "absent".
_READ_OPTIONAL_PATHS: Final = frozenset({"spec.nodeUID", "spec.sessionId", "spec.generationId"})


def known_fields(r: Registration) -> tuple[Known | None, tuple[str, ...]]:
    """The conjunction's fields, or the dotted paths of those missing or invalid."""
    inc, beat = r.incarnation, r.heartbeat
    # An unparsable heartbeat is present (line 4 reports it); only an absent one is missing here,
    # and a placeholder instant stands in for it that line 4 keeps from ever being compared.
    last_heartbeat = START_OF_TIME if r.heartbeat_unparsable else r.last_heartbeat_time
    heartbeat_fields: dict[str, object] = (
        {"spec.heartbeat.intervalSeconds": beat.interval_seconds, "spec.heartbeat.ttlSeconds": beat.ttl_seconds}
        if beat.declared
        else {}
    )
    fields: dict[str, object] = {
        "metadata.namespace": r.namespace,
        "metadata.name": r.name,
        "spec.nodeName": r.node_name,
        "spec.incarnation.bootId": inc.boot_id,
        "spec.incarnation.pidNamespace": inc.pid_namespace,
        "spec.incarnation.pid": inc.pid,
        "spec.incarnation.startTime": inc.start_time,
        "spec.incarnation.hostId": inc.host_id,
        "spec.clientInstanceId": r.client_instance_id,
        **heartbeat_fields,
        "status.lastHeartbeatTime or metadata.creationTimestamp": last_heartbeat,
    }
    missing = [path for path, value in fields.items() if value is None]
    missing += sorted({path for path, _ in r.problems if path in _READ_OPTIONAL_PATHS})
    if (
        missing
        or r.namespace is None
        or r.name is None
        or r.node_name is None
        or inc.boot_id is None
        or inc.pid_namespace is None
        or inc.pid is None
        or inc.start_time is None
        or inc.host_id is None
        or r.client_instance_id is None
        or last_heartbeat is None
    ):
        return None, tuple(missing)
    known = Known(
        namespace=r.namespace,
        name=r.name,
        node_name=r.node_name,
        boot_id=inc.boot_id,
        pid_namespace=inc.pid_namespace,
        pid=inc.pid,
        start_time=inc.start_time,
        host_id=inc.host_id,
        client_instance_id=r.client_instance_id,
        heartbeat=beat.declared,
        interval_seconds=beat.interval_seconds,
        ttl_seconds=beat.ttl_seconds,
        last_heartbeat=aware(last_heartbeat),
    )
    return known, ()


def nothing_attested(r: Registration) -> bool:
    """No ``status.attestation`` at all: not even one that failed to parse."""
    return r.attestation is None and not any(path == "status.attestation" for path, _ in r.problems)


def launcher_minted(client_instance_id: str) -> bool:
    prefix = api.CLIENT_INSTANCE_PREFIX
    return client_instance_id.startswith(prefix) and len(client_instance_id) > len(prefix)


def agent_death_evidence(cited: Evidence | str | None) -> Evidence | None:
    for evidence in AGENT_DEATH_EVIDENCE:
        if cited == evidence.value:
            return evidence
    return None


def attested_dead(peer: Registration) -> bool:
    """The peer carries its own Dead attestation for exactly its incarnation, unchallenged by a heartbeat."""
    attestation = peer.attestation
    return (
        attestation is not None
        and attestation.verdict == Verdict.DEAD
        and agent_death_evidence(attestation.evidence) is not None
        and peer.incarnation.complete
        and attestation.incarnation.key == peer.incarnation.key
        and peer.node_name is not None
        and attestation.agent_node == peer.node_name
        and attestation.heartbeat_seen == (peer.last_heartbeat_raw or "")
    )


def is_self(registration: Registration, peer: Registration) -> bool:
    if registration.uid is not None and peer.uid == registration.uid:
        return True
    return peer.namespace == registration.namespace and peer.name == registration.name


def same_registrant(registration: Registration, peer: Registration) -> bool | None:
    """Whether two registrations were created by one requester (``coroner.dev/registered-by``, which
    admission admits at CREATE only as the requester, and freezes): only those can be the same worker, so only their
    claims can conflict. None when either does not name its registrant: unknown, never "another"."""
    if registration.registered_by is None or peer.registered_by is None:
        return None
    return registration.registered_by == peer.registered_by


def shared_claims(known: Known, registration: Registration, peer: Registration) -> tuple[str, ...]:
    """The identity claims of `registration` that `peer` also makes (lines 12 and 13): the
    launcher-minted clientInstanceId, the incarnation on the same node, the session and generation."""
    shared = []
    if peer.client_instance_id == known.client_instance_id:
        shared.append("clientInstanceId")
    if peer.node_name == known.node_name and peer.incarnation.key == known.key:
        shared.append("incarnation")
    session = (registration.session_id, registration.generation_id)
    if all(session) and (peer.session_id, peer.generation_id) == session:
        shared.append("sessionId and generationId")
    return tuple(shared)


def squatters(
    registration: Registration, peers: Sequence[Registration]
) -> tuple[tuple[Registration, tuple[str, ...]], ...]:
    """The active peers in `registration`'s namespace, made by another registrant, that claim what
    it claims (and what they claim): they cannot be the same worker, so they block nothing, and
    `kubectl coroner doctor` names them. Empty unless `registration` has its conjunction fields."""
    known, _ = known_fields(registration)
    if known is None:
        return ()
    found = []
    for peer in peers:
        if peer.namespace != known.namespace or peer.terminal or is_self(registration, peer):
            continue
        shared = shared_claims(known, registration, peer)
        if shared and same_registrant(registration, peer) is False:
            found.append((peer, shared))
    return tuple(found)
