"""The agent writes an attestation only when it says something new: never a periodic refresh."""

from __future__ import annotations

import datetime

import pytest

from coroner.core.model import parse_registration
from coroner_agent.step import needs_write
from unit.builders import NOW, make_registration

pytestmark = pytest.mark.unit

HOUR = datetime.timedelta(hours=1)


def _check(verdict: str, evidence: str, *, observed: datetime.datetime) -> bool:
    registration = parse_registration(make_registration(verdict=verdict, evidence=evidence, observed_at=observed))
    current = registration.attestation
    assert current is not None
    new = dict(current.raw)
    return needs_write(current, new, last_heartbeat_raw=registration.last_heartbeat_raw)


def test_an_unchanged_live_verdict_is_never_rewritten_however_old() -> None:
    # A live verdict preserves at any age; rewriting it cost ~40 writes/s at 10 000 registrations.
    assert not _check("Alive", "PidfdPinned", observed=NOW - HOUR)
    assert not _check("Reused", "StartTimeDiffers", observed=NOW - HOUR)


def test_an_unchanged_dead_verdict_is_never_rewritten_however_old() -> None:
    # Attestations are written on change only: a death is final and current while the agent's Lease is live on its boot.
    assert not _check("Dead", "ProcAbsent", observed=NOW - HOUR)
    assert not _check("Dead", "PidfdExited", observed=NOW - datetime.timedelta(seconds=10))


def test_a_confirmed_death_is_written_over_one_recorded_without_its_first_look() -> None:
    registration = parse_registration(make_registration(evidence="ProcAbsent"))
    current = registration.attestation
    assert current is not None
    new = dict(current.raw) | {"firstObservedTime": "2026-11-30T17:59:30.000000Z"}
    assert needs_write(current, new, last_heartbeat_raw=registration.last_heartbeat_raw)
