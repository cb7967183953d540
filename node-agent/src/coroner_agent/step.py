"""The attest step: `(registration, probe result, node facts, first look, now) -> AgentEffects`. Pure.

No I/O, no clock, no logging: the probe was run before it (`coroner_agent.reconciler` gathers it,
only where `probe_needed` says so), everything it wants done is returned
(`coroner_agent.effects`), and the executor runs the write.

For one registration:

* **terminal** (Retired or Released): nothing to attest; `release` its pins and forget any first look.
* **another node's** (the label said this node, the spec disagrees): Unknown (ForeignNode), never
  a probe — an agent never speaks for another node.
* **this node's**: the attestation the probe implies (`wire.attestation_body`). A death read from
  /proc (ProcAbsent, PidNamespaceRecreated, BootBoundary) is written only once it was seen again at least
  `absence_confirm_seconds` after it was first seen: the first look is remembered (`first_look`)
  and the step asks to come back when the window ends (`requeue_at`); the written attestation
  carries both looks. A Reused sighting is written as it is seen and counts as the first look at
  the absence (the number was held by another process, so the incarnation was already gone).
  Anything else seen in between starts over. A readable pidfd is the kernel's word: no wait for
  confirmation — but a clean exit (exit status 0, or SIGTERM honoured) is its registrant's to end
  as `Released` (`coroner run` and the registrar say goodbye for it), so its Dead is held for
  `release_grace_seconds` after it was first seen, and a process not reaped yet (whose status the
  kernel gives only once it is) for up to `REAP_WAIT_SECONDS`, looked at every `REAP_POLL_SECONDS`.
  A goodbye that comes in time ends it Released; one that does not leaves it to the Dead written
  then. An exit status the kernel cannot give is never waited for: unknown is never clean.
* the write happens only when the attestation says something the stored one does not
  (`needs_write`): an unchanged verdict is never written again, however old.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

from coroner.core import model, wire
from coroner.core.exits import REAP_WAIT_SECONDS, Ending
from coroner.core.reasons import Evidence, Verdict
from coroner_agent.effects import AgentEffects, FirstLook, Key, WriteAttestation
from coroner_agent.verdict import ProbeResult

#: Deaths read from /proc: attested only once seen twice, `absence_confirm_seconds` apart.
CONFIRMED_EVIDENCE = frozenset(evidence.value for evidence in Evidence if evidence.read_from_proc)
#: What each look says of the incarnation: a pid number held by another process (StartTimeDiffers),
#: held by a process of a newer namespace with the same inode (PidNamespaceRecreated) and a number
#: held by nobody (ProcAbsent) are all looks at an incarnation that is not there.
_ABSENCE = {
    Evidence.PROC_ABSENT.value: "absent",
    Evidence.START_TIME_DIFFERS.value: "absent",
    Evidence.PID_NAMESPACE_RECREATED.value: "absent",
    Evidence.BOOT_BOUNDARY.value: "boot-over",
}


#: How long the Dead of a clean exit waits for its registrant's goodbye (a PATCH sent within
#: milliseconds of the exit; seconds on a loaded API server).
RELEASE_GRACE_SECONDS = 5.0
#: How often a pidfd whose process is not reaped yet is read again for its exit status.
REAP_POLL_SECONDS = 0.1
#: What a look at an exited incarnation waits for, by how it ended.
_CLEAN_EXIT = "clean-exit"
_UNREAPED = "unreaped"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Attester:
    """Who attests, as every attestation records it, and the windows it keeps."""

    node_name: str
    pod_name: str
    identity: str
    absence_confirm_seconds: float
    release_grace_seconds: float = RELEASE_GRACE_SECONDS


def probe_needed(*, registration: model.Registration, node_name: str) -> bool:
    """Whether the step needs a probe of `registration`: an active one of this very node."""
    return not registration.terminal and registration.node_name == node_name


def attest(
    *,
    key: Key,
    body: Mapping[str, Any],
    registration: model.Registration,
    probe: ProbeResult | None,
    attester: Attester,
    boot_id: str | None,
    host_id: str,
    first_look: FirstLook | None,
    now: datetime.datetime,
) -> AgentEffects:
    """What one look at `registration` asks for; `probe` is required exactly when `probe_needed`."""
    if registration.terminal:
        return AgentEffects(key=key, release=True)
    if registration.node_name != attester.node_name:
        probe = ProbeResult(
            verdict=Verdict.UNKNOWN,
            evidence=Evidence.FOREIGN_NODE,
            detail=f"spec.nodeName is {registration.node_name!r}, this agent serves {attester.node_name!r}",
        )
    elif probe is None:
        raise ValueError("an active registration of this node is attested from a probe")
    built: dict[str, Any] = {
        "registration": registration,
        "verdict": probe.verdict,
        "evidence": probe.evidence,
        "detail": probe.detail,
        "boot_id": boot_id,
        "host_id": host_id,
        "now": now,
        "agent_node": attester.node_name,
        "agent_pod": attester.pod_name,
        "agent_identity": attester.identity,
    }
    attestation = wire.attestation_body(**built)
    # What the attestation says (an agent without its boot id says Unknown whatever the probe did).
    evidence = attestation["evidence"]
    if evidence == Evidence.PIDFD_EXITED.value and probe is not None and probe.exit is not None:
        held = _held_for_goodbye(probe.exit.ending, first_look=first_look, attester=attester, now=now)
        if held is not None:
            return AgentEffects(key=key, first_look=held[0], requeue_at=held[1])
    dead_or_reused = attestation["verdict"] in (Verdict.DEAD.value, Verdict.REUSED.value)
    look = _ABSENCE.get(evidence) if dead_or_reused else None
    if look is None:
        return _written(key, body, registration, attestation, first_look=None)
    seen = first_look if first_look is not None and first_look.look == look else FirstLook(look=look, at=now)
    if evidence not in CONFIRMED_EVIDENCE:
        return _written(key, body, registration, attestation, first_look=seen)  # Reused: as seen
    due = seen.at + datetime.timedelta(seconds=attester.absence_confirm_seconds)
    if due > now:
        return AgentEffects(key=key, first_look=seen, requeue_at=due)
    confirmed = wire.attestation_body(**built, first_observed=seen.at)
    return _written(key, body, registration, confirmed, first_look=seen)


def _held_for_goodbye(
    ending: Ending, *, first_look: FirstLook | None, attester: Attester, now: datetime.datetime
) -> tuple[FirstLook, datetime.datetime] | None:
    """(the look to remember, when to look again) while the Dead of an exit waits for its goodbye;
    None once it need not (an unclean or unknown exit, or the window over)."""
    if ending is Ending.CLEAN:
        look, window = _CLEAN_EXIT, attester.release_grace_seconds
    elif ending is Ending.UNREAPED:
        look, window = _UNREAPED, REAP_WAIT_SECONDS
    else:
        return None
    seen = first_look if first_look is not None and first_look.look == look else FirstLook(look=look, at=now)
    due = seen.at + datetime.timedelta(seconds=window)
    if due <= now:
        return None
    if look == _UNREAPED:
        due = min(due, now + datetime.timedelta(seconds=REAP_POLL_SECONDS))
    return seen, due


def _written(
    key: Key,
    body: Mapping[str, Any],
    registration: model.Registration,
    attestation: dict[str, Any],
    *,
    first_look: FirstLook | None,
) -> AgentEffects:
    if not needs_write(registration.attestation, attestation, last_heartbeat_raw=registration.last_heartbeat_raw):
        return AgentEffects(key=key, first_look=first_look)
    write = WriteAttestation(ops=tuple(wire.attestation_ops(body, attestation)), attestation=attestation)
    return AgentEffects(key=key, write=write, first_look=first_look)


def needs_write(current: model.Attestation | None, new: Mapping[str, Any], *, last_heartbeat_raw: str | None) -> bool:
    """Level-based: write only what changes the record — never a periodic refresh (a write per worker
    per period would make the cost grow with workers, not nodes).

    A verdict is current while the agent's Lease is live on the boot it attested from, so nothing
    is rewritten to keep it fresh: an Alive is written once when the incarnation is pinned, a Dead
    once when it is seen."""
    if current is None:
        return True
    if (
        str(current.verdict) != new["verdict"]
        or str(current.evidence) != new["evidence"]
        or current.boot_id != new["bootId"]
        or current.host_id != new["hostId"]
        or current.agent_node != new["agent"]["nodeName"]
        or _recorded_incarnation(current) != new["incarnation"]
    ):
        return True
    if new["verdict"] == Verdict.DEAD.value and current.heartbeat_seen != (last_heartbeat_raw or ""):
        return True  # an opted-in heartbeat landed after the Dead attestation: confirm with what is seen now
    # A confirmed death over one recorded without its first look (an older agent's): say both.
    return "firstObservedTime" in new and current.first_observed_time is None


def _recorded_incarnation(attestation: model.Attestation) -> dict[str, object]:
    """The incarnation an attestation recorded, exactly as stored."""
    recorded = attestation.raw.get("incarnation")
    return dict(recorded) if isinstance(recorded, Mapping) else {}
