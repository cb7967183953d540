"""The agent writes an attestation only when it says something new (or a Dead one needs freshness)."""

from __future__ import annotations

import datetime

import pytest

from coroner.model import parse_registration
from coroner_agent.service import needs_write
from unit.builders import NOW, make_registration

pytestmark = pytest.mark.unit

HOUR = datetime.timedelta(hours=1)


def _check(verdict: str, evidence: str, *, observed: datetime.datetime) -> bool:
    registration = parse_registration(make_registration(verdict=verdict, evidence=evidence, observed_at=observed))
    current = registration.attestation
    assert current is not None
    new = dict(current.raw)
    return needs_write(current, new, last_heartbeat_raw=registration.last_heartbeat_raw, now=NOW, refresh_seconds=240)


def test_an_unchanged_live_verdict_is_never_rewritten_however_old() -> None:
    # A live verdict preserves at any age; rewriting it cost ~40 writes/s at 10 000 registrations.
    assert not _check("Alive", "PidfdPinned", observed=NOW - HOUR)
    assert not _check("Reused", "StartTimeDiffers", observed=NOW - HOUR)


def test_a_dead_verdict_is_refreshed_so_it_never_ages_into_attestation_stale() -> None:
    assert _check("Dead", "ProcAbsent", observed=NOW - HOUR)
    assert not _check("Dead", "ProcAbsent", observed=NOW - datetime.timedelta(seconds=10))
