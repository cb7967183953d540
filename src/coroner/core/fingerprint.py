"""Fingerprints of a plan, so that ``kubectl coroner apply`` acts only on the world a human approved.

A plan shows every registration with its reason; ``apply`` re-reads, recomputes and aborts with
``RegistryMoved`` or ``CandidateSetMoved`` if the fingerprints no longer match. They therefore hash
content only: no timestamps and no resourceVersion (heartbeats land every few seconds and must not
invalidate an approval), in no particular order, with numbers typed stably (``900``, ``900.0`` and
``"900"`` are one pid). The output is versioned (``v1:sha256:<hex>``) so a future change of content
can never be mistaken for a match.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import hashlib
import json
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, TypeAlias

from coroner.core.decision import Decision, JSONValue, Policy, decide
from coroner.core.model import Registration, parse_pid
from coroner.core.reasons import Reason
from coroner.core.world import World

FINGERPRINT_VERSION: Final = "v1"
_HASH_CHUNK: Final = 1000
_NO_EVIDENCE: Final[Mapping[str, JSONValue]] = types.MappingProxyType({})


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PlanRow:
    """The fingerprinted content of one registration's line in a plan."""

    namespace: str | None
    name: str | None
    uid: str | None
    node_name: str | None
    reason: Reason | str
    verdict: str | None
    death_evidence: str | None
    #: (bootId, pidNamespace, pid, startTime, hostId); pid may arrive as 900, 900.0 or "900".
    incarnation: tuple[str | None, str | None, int | float | str | None, str | None, str | None]
    client_instance_id: str | None

    @property
    def eligible(self) -> bool:
        """The row is a retirement candidate."""
        return self.reason == Reason.ELIGIBLE_STALE_ORPHAN


#: A fingerprint row: a `PlanRow`, or the (registration, decision) pair it is made from.
Row: TypeAlias = PlanRow | tuple[Registration, Decision]


def plan_row(*, registration: Registration, decision: Decision) -> PlanRow:
    """The plan row of one decided registration."""
    attestation = registration.attestation
    inc = registration.incarnation
    return PlanRow(
        namespace=registration.namespace,
        name=registration.name,
        uid=registration.uid,
        node_name=registration.node_name,
        reason=decision.reason,
        verdict=None if attestation is None or attestation.verdict is None else str(attestation.verdict),
        death_evidence=None if decision.death_evidence is None else str(decision.death_evidence),
        incarnation=(inc.boot_id, inc.pid_namespace, inc.pid, inc.start_time, inc.host_id),
        client_instance_id=registration.client_instance_id,
    )


def registry_fingerprint(rows: Iterable[Row]) -> str:
    """The fingerprint of the whole registry as planned: every row, whatever its reason."""
    return _fingerprint(kind="registry", rows=[_row(row) for row in rows])


def candidate_fingerprint(rows: Iterable[Row]) -> str:
    """The fingerprint of the retirement candidates only (rows whose reason is EligibleStaleOrphan)."""
    return _fingerprint(kind="candidates", rows=[row for row in map(_row, rows) if row.eligible])


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PlanEntry:
    """One registration, its decision and its row."""

    registration: Registration
    decision: Decision
    row: PlanRow


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """Every registration decided, sorted by (namespace, name), with counts and fingerprints."""

    entries: tuple[PlanEntry, ...]
    #: Every Reason in declaration order with its count (zero included: zero was counted).
    counts: Mapping[Reason, int]
    registry_fingerprint: str
    candidate_fingerprint: str

    @property
    def rows(self) -> tuple[PlanRow, ...]:
        """The rows, in plan order."""
        return tuple(entry.row for entry in self.entries)


def decide_all(*, world: World, policy: Policy, now: datetime.datetime, keep_evidence: bool = True) -> Plan:
    """Every registration of `world` decided as the operator decides it (its facts and its peers:
    `World.facts_for`), assembled into a plan; pure, like `decide`. The one decide-all, for
    ``kubectl coroner plan``, ``apply`` and ``doctor``.

    Without `keep_evidence` each decision's structured `Decision.evidence` is dropped once decided
    (reason, detail and death evidence stay): only ``plan -o json`` prints it, and at 150,000
    registrations it was 290 MB of the 1.2 GB ``plan -A`` built."""
    entries = []
    for key in sorted(world.parsed):
        registration = world.parsed[key]
        decision = decide(registration=registration, facts=world.facts_for(key, now=now), policy=policy, now=now)
        if not keep_evidence:
            decision = dataclasses.replace(decision, evidence=_NO_EVIDENCE)
        entries.append(
            PlanEntry(
                registration=registration, decision=decision, row=plan_row(registration=registration, decision=decision)
            )
        )
    return assemble(entries)


def assemble(entries: Iterable[PlanEntry]) -> Plan:
    """A `Plan` of decided entries, in plan order: counts for every reason (zero included) and both
    fingerprints."""
    ordered = tuple(sorted(entries, key=lambda entry: _plan_order(entry.registration)))
    rows = [entry.row for entry in ordered]
    tally = collections.Counter(entry.decision.reason for entry in ordered)
    return Plan(
        entries=ordered,
        counts={reason: tally[reason] for reason in Reason},
        registry_fingerprint=registry_fingerprint(rows),
        candidate_fingerprint=candidate_fingerprint(rows),
    )


def _plan_order(registration: Registration) -> tuple[str, str, str]:
    return (registration.namespace or "", registration.name or "", registration.uid or "")


def _row(row: Row) -> PlanRow:
    if isinstance(row, PlanRow):
        return row
    registration, decision = row
    return plan_row(registration=registration, decision=decision)


def _fingerprint(*, kind: str, rows: Sequence[PlanRow]) -> str:
    # Each row is encoded canonically and the encodings sorted: the multiset of rows is hashed,
    # not the order they were listed in. `kind` keeps the two fingerprints from ever coinciding.
    # The hashed payload is json.dumps({"kind": kind, "rows": encoded}) without spaces, fed to the
    # hash a chunk of rows at a time: at 150,000 rows the whole payload was three copies of ~60 MB.
    encoded = sorted(json.dumps(_content(row), sort_keys=True, separators=(",", ":")) for row in rows)
    digest = hashlib.sha256(f'{{"kind":{json.dumps(kind)},"rows":['.encode())
    for start in range(0, len(encoded), _HASH_CHUNK):
        chunk = json.dumps(encoded[start : start + _HASH_CHUNK], separators=(",", ":"))[1:-1]
        digest.update(("," + chunk if start else chunk).encode())
    digest.update(b"]}")
    return f"{FINGERPRINT_VERSION}:sha256:{digest.hexdigest()}"


def _content(row: PlanRow) -> dict[str, object]:
    boot_id, pid_namespace, pid, start_time, host_id = row.incarnation
    return {
        "namespace": row.namespace,
        "name": row.name,
        "uid": row.uid,
        "nodeName": row.node_name,
        "reason": str(row.reason),
        "verdict": row.verdict,
        "deathEvidence": row.death_evidence,
        "incarnation": {
            "bootId": boot_id,
            "pidNamespace": pid_namespace,
            "pid": _stable_pid(pid),
            "startTime": start_time,
            "hostId": host_id,
        },
        "clientInstanceId": row.client_instance_id,
    }


def _stable_pid(pid: int | float | str | None) -> int | str | None:
    """900, 900.0 and "900" are one pid; what no kernel could issue is kept, tagged, as text."""
    if pid is None:
        return None
    number = parse_pid(pid)
    return number if number is not None else f"invalid:{pid!r}"
