"""`coroner_registrations_held{reason}`: the operator counts, at every sweep and from its cache alone,
the active registrations a reason of `coroner.core.held.HELD_REASONS` has held past the bound, as
`kubectl coroner doctor`'s `held` check names them (alert CoronerRegistrationsHeld)."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest

from coroner.core import held
from coroner.core.decision import Policy, decide
from coroner.core.reasons import Reason
from coroner_operator.app import Operator
from coroner_operator.main import main as operator_main
from coroner_operator.settings import OperatorSettings
from unit.builders import NOW, make_operator, make_registration
from unit.test_plan import agent_lease

pytestmark = pytest.mark.unit

HOUR = datetime.timedelta(hours=1)
MINUTE = datetime.timedelta(minutes=1)


class RecordingKube:
    """Every call the sweep makes: the operator's Lease, and nothing else."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def upsert_lease(self, **_: Any) -> None:
        self.calls.append("upsert_lease")


def reused(name: str, *, said: datetime.datetime) -> dict[str, Any]:
    return make_registration(
        name=name,
        client_instance_id=f"inst-{name}",
        session_id=f"s-{name}",
        pid=1000 + sum(map(ord, name)),
        heartbeat=False,
        verdict="Reused",
        evidence="StartTimeDiffers",
        observed_at=said,
    )


def unknown(name: str, *, said: datetime.datetime) -> dict[str, Any]:
    body = reused(name, said=said)
    body["status"]["attestation"] |= {"verdict": "Unknown", "evidence": "ProcHidesProcesses"}
    return body


def operator(bodies: list[dict[str, Any]], *, clock: list[datetime.datetime], **settings: Any) -> Operator:
    op: Operator = make_operator(RecordingKube(), settings=OperatorSettings(**settings))
    op.sweeper.clock = lambda: clock[0]
    for body in bodies:
        op.world.put_registration(body)
    return op


def sweep(op: Operator, now: datetime.datetime) -> dict[str, float]:
    """The reconciles a sweep drains (each registration decided, its reason on the gauge), then the
    sweep's own bookkeeping; what `coroner_registrations_held` reads after it, by reason. The node's
    agent is live throughout (its Lease renewed at `now`)."""
    op.world.put_lease(agent_lease(renewed_at=now))
    for key, registration in op.world.parsed.items():
        decision = decide(registration=registration, facts=op.world.facts_for(key, now=now), policy=Policy(), now=now)
        op.gauge.set(key, decision.reason)

    async def nothing() -> None:
        return None

    op.sweeper.enqueue = lambda key: None
    op.sweeper.drain = nothing  # type: ignore[method-assign]
    asyncio.run(op.sweeper.sweep())
    return {
        reason.value: op.metrics.registry.get_sample_value("coroner_registrations_held", {"reason": reason.value})
        for reason in held.HELD_REASONS
    }


def only(**counts: float) -> dict[str, float]:
    return {reason.value: float(counts.get(reason.value, 0)) for reason in held.HELD_REASONS}


@pytest.mark.parametrize(
    ("bodies", "grace", "expected"),
    [
        pytest.param([reused("a", said=NOW - HOUR)], 600.0, only(PidReuseDetected=1), id="reused-an-hour"),
        pytest.param([reused("a", said=NOW - 5 * MINUTE)], 600.0, only(), id="reused-5-minutes"),
        pytest.param([reused("a", said=NOW - HOUR)], 7200.0, only(), id="a-longer-bound"),
        pytest.param(
            [reused("a", said=NOW - HOUR), reused("b", said=NOW - 2 * HOUR), unknown("c", said=NOW - HOUR)],
            600.0,
            only(PidReuseDetected=2, LivenessUnknown=1),
            id="by-reason",
        ),
        pytest.param(
            [
                make_registration(attested=False, created_at=NOW - HOUR),
                make_registration(name="alive", verdict="Alive"),
            ],
            600.0,
            only(),
            id="unattested-and-alive-are-not-held",
        ),
    ],
)
def test_the_sweep_counts_what_is_held_past_the_bound(
    bodies: list[dict[str, Any]], grace: float, expected: dict[str, float]
) -> None:
    op = operator(bodies, clock=[NOW], held_grace_seconds=grace)
    assert sweep(op, NOW) == expected  # every reason's series is there, zero included


def test_time_alone_makes_one_held_and_no_request_is_made_for_it() -> None:
    clock = [NOW]
    op = operator([reused("a", said=NOW - 5 * MINUTE)], clock=clock)
    assert sweep(op, NOW) == only()
    clock[0] = NOW + 6 * MINUTE
    assert sweep(op, clock[0]) == only(PidReuseDetected=1)
    assert op.kube.calls == ["upsert_lease", "upsert_lease"]  # type: ignore[attr-defined]


def test_a_registration_that_moves_on_or_goes_is_no_longer_counted() -> None:
    op = operator([reused("a", said=NOW - HOUR)], clock=[NOW])
    assert sweep(op, NOW) == only(PidReuseDetected=1)
    key = next(iter(op.world.parsed))
    op.gauge.set(key, Reason.PID_ALIVE)
    assert op.gauge.count_held(op.world.parsed, now=NOW, grace_seconds=600) == {}
    op.gauge.set(key, Reason.PID_REUSE_DETECTED)
    op.gauge.set(key, None)
    assert op.gauge.count_held(op.world.parsed, now=NOW, grace_seconds=600) == {}


def test_a_replica_that_stops_leading_stops_reporting_it() -> None:
    op = operator([reused("a", said=NOW - HOUR)], clock=[NOW])
    assert sweep(op, NOW) == only(PidReuseDetected=1)
    op.leadership.changed(False)
    assert all(
        op.metrics.registry.get_sample_value("coroner_registrations_held", {"reason": reason.value}) == 0
        for reason in held.HELD_REASONS
    )


def test_the_operator_flag() -> None:
    def params(*args: str) -> dict[str, object]:
        return dict(operator_main.make_context("coroner-operator", list(args)).params)

    assert params()["held_grace_seconds"] == held.HELD_GRACE_SECONDS == OperatorSettings().held_grace_seconds
    assert params("--held-grace-seconds=3600")["held_grace_seconds"] == 3600.0
