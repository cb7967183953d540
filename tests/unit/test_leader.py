"""Leader election (`coroner.runtime.leader`): the pure `attempt` table-driven, two candidates over
an in-memory compare-and-swap store under arbitrary interleavings (hypothesis), and the elector's
loop: a partitioned leader steps down before a standby may take over; a released Lease is taken at
the next retry."""

from __future__ import annotations

import asyncio
import copy
import datetime
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coroner.client.rest import ApiError
from coroner.core import kubewire
from coroner.runtime.leader import (
    Create,
    ElectionConfig,
    HeldByOther,
    LeaderElector,
    Replace,
    Seen,
    attempt,
    released,
)

pytestmark = pytest.mark.unit

NOW = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)
CONFIG = ElectionConfig()


def lease(
    holder: str, *, renew: str = "2026-12-01T11:59:59.000000Z", transitions: int = 3, rv: str = "7"
) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "coroner-operator", "namespace": "coroner-system", "resourceVersion": rv,
                     "annotations": {"coroner.dev/last-sweep": "{}"}},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "acquireTime": "2026-12-01T11:00:00.000000Z",
                 "renewTime": renew, "leaseTransitions": transitions},
    }  # fmt: skip


def run(current: dict[str, Any] | None, *, seen: Seen | None = None, mono: float = 100.0, me: str = "b") -> Any:
    return attempt(
        current, namespace="coroner-system", name="coroner-operator", identity=me, config=CONFIG,
        annotations={"coroner.dev/policy": "{}"}, seen=seen, now=NOW, mono=mono,
    )  # fmt: skip


def test_no_lease_is_created_held_by_this_candidate() -> None:
    step, seen = run(None)
    assert isinstance(step, Create) and seen is None
    spec = step.body["spec"]
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 0 and spec["leaseDurationSeconds"] == 15
    assert spec["acquireTime"] == spec["renewTime"] == "2026-12-01T12:00:00.000000Z"
    assert step.body["metadata"]["annotations"] == {"coroner.dev/policy": "{}"}


@pytest.mark.parametrize(
    ("case", "holder", "first_seen", "expect"),
    [
        ("another holds it, just seen", "a", 100.0, HeldByOther),
        ("another holds it, unchanged for less than its duration", "a", 85.5, HeldByOther),
        ("another's record unchanged for its whole duration: expired", "a", 85.0, Replace),
        ("released (no holder): taken at once", "", 100.0, Replace),
        ("this candidate holds it: renewed", "b", 0.0, Replace),
    ],
)
def test_acquire_or_renew(case: str, holder: str, first_seen: float, expect: type) -> None:
    current = lease(holder)
    _, seen = run(current, mono=first_seen)
    step, _ = run(current, seen=seen, mono=100.0)
    assert isinstance(step, expect), case
    if isinstance(step, Replace):
        spec = step.body["spec"]
        assert spec["holderIdentity"] == "b" and spec["renewTime"] == "2026-12-01T12:00:00.000000Z"
        assert step.body["metadata"]["resourceVersion"] == "7", "a compare-and-swap on what was read"
        assert step.body["metadata"]["annotations"] == {"coroner.dev/last-sweep": "{}", "coroner.dev/policy": "{}"}
        if holder == "b":
            assert spec["leaseTransitions"] == 3 and spec["acquireTime"] == "2026-12-01T11:00:00.000000Z"
        else:
            assert spec["leaseTransitions"] == 4 and spec["acquireTime"] == "2026-12-01T12:00:00.000000Z"


def test_a_renewal_seen_restarts_the_standbys_clock_whatever_the_renewTime_says() -> None:
    """Expiry is measured by the standby's own clock from the last change it saw, never by comparing
    the holder's renewTime (another pod's clock) with its own."""
    _, seen = run(lease("a", renew="2020-01-01T00:00:00.000000Z"), mono=0.0)
    step, _ = run(lease("a", renew="2020-01-01T00:00:00.000000Z"), seen=seen, mono=14.0)
    assert isinstance(step, HeldByOther) and step.expires_in == pytest.approx(1.0)
    step, seen = run(lease("a", renew="2020-01-01T00:00:02.000000Z", rv="8"), seen=seen, mono=14.5)
    assert isinstance(step, HeldByOther) and step.expires_in == pytest.approx(15.0), "it changed: a new 15 s"


def test_release_empties_the_holder_on_the_lease_as_held() -> None:
    body = released(lease("b"), now=NOW)
    assert body["spec"]["holderIdentity"] == "" and body["spec"]["leaseDurationSeconds"] == 1
    assert body["metadata"]["resourceVersion"] == "7"


def test_every_lease_the_elector_writes_is_wires() -> None:
    """The elector decides when to write; coroner.core.wire builds what it writes."""
    policy = {"coroner.dev/policy": "{}"}
    step, _ = run(None)
    assert isinstance(step, Create)
    assert step.body == kubewire.lease_body(
        namespace="coroner-system", name="coroner-operator", holder="b", duration=15, annotations=policy, now=NOW,
        transitions=0,
    )  # fmt: skip
    for holder in ("a", "", "b"):
        current = lease(holder)
        _, seen = run(current, mono=0.0)
        step, _ = run(current, seen=seen, mono=100.0)
        assert isinstance(step, Replace)
        assert step.body == kubewire.lease_acquisition(current, holder="b", duration=15, annotations=policy, now=NOW)
    assert released(lease("b"), now=NOW) == kubewire.lease_release(lease("b"), now=NOW)


@pytest.mark.parametrize(("duration", "deadline", "retry"), [(10, 10, 2), (15, 2.3, 2), (15, 10, 0)])
def test_the_config_keeps_a_leader_stepping_down_before_a_standby_may_take_over(
    duration: float, deadline: float, retry: float
) -> None:
    with pytest.raises(ValueError):
        ElectionConfig(lease_duration=duration, renew_deadline=deadline, retry_period=retry)


class Store:
    """An in-memory Lease with the API server's compare-and-swap (409 on a stale resourceVersion)."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.down: set[str] = set()  # identities cut off from it

    def view(self, who: str) -> Store:
        store = self

        class View:
            async def get_lease(self, *, namespace: str, name: str) -> dict[str, Any] | None:
                store.check(who)
                return copy.deepcopy(store.lease)

            async def create_lease(self, *, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
                store.check(who)
                if store.lease is not None:
                    raise ApiError(409, "AlreadyExists", "exists")
                return store.write(body)

            async def replace_lease(self, *, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
                store.check(who)
                assert store.lease is not None
                if body["metadata"].get("resourceVersion") != store.lease["metadata"]["resourceVersion"]:
                    raise ApiError(409, "Conflict", "moved")
                return store.write(body)

        return View()  # type: ignore[return-value]

    def check(self, who: str) -> None:
        if who in self.down:
            raise OSError("connection refused")

    def write(self, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.lease)


@given(order=st.lists(st.sampled_from("ab"), min_size=1, max_size=40), steps=st.lists(st.floats(0, 6), max_size=40))
@settings(max_examples=200, deadline=None)
def test_two_candidates_never_hold_one_lease_at_once(order: list[str], steps: list[float]) -> None:
    """Any interleaving of tries by two candidates (time advancing between them): a try succeeds for
    one only if the other's last successful write is at least a lease duration old by the clock."""
    store = Store()
    clock = {"t": 0.0}
    electors = {
        who: LeaderElector(store=store.view(who), namespace="ns", name="l", identity=who, monotonic=lambda: clock["t"])
        for who in "ab"
    }
    last_win: dict[str, float] = {}

    async def scenario() -> None:
        for i, who in enumerate(order):
            clock["t"] += steps[i] if i < len(steps) else 1.0
            if await electors[who].try_once():
                other = "b" if who == "a" else "a"
                if other in last_win and store.lease and last_win[other] > last_win.get(who, -1):
                    assert clock["t"] - last_win[other] >= CONFIG.lease_duration, "taken from a live holder"
                last_win[who] = clock["t"]

    asyncio.run(scenario())


def test_a_partitioned_leader_steps_down_before_the_standby_takes_over() -> None:
    config = ElectionConfig(lease_duration=1.5, renew_deadline=0.8, retry_period=0.1)
    store = Store()
    events: list[tuple[str, bool, float]] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()

        def elector(who: str) -> LeaderElector:
            return LeaderElector(
                store=store.view(who), namespace="ns", name="l", identity=who, config=config,
                on_change=lambda leading: events.append((who, leading, loop.time())), rng=random.Random(1),
            )  # fmt: skip

        a, b = elector("a"), elector("b")
        ta = asyncio.create_task(a.run())
        await a.leading.wait()
        tb = asyncio.create_task(b.run())
        await asyncio.sleep(0.3)
        assert not b.is_leader and b.holder == "a", "the standby sees a live leader"
        store.down.add("a")
        await b.leading.wait()
        assert not a.is_leader
        store.down.clear()
        await asyncio.sleep(0.3)
        assert store.lease is not None and store.lease["spec"]["holderIdentity"] == "b"
        assert store.lease["spec"]["leaseTransitions"] == 1
        assert not a.is_leader, "the old leader stands by; it does not take the live Lease back"
        await b.release()
        await a.leading.wait()
        ta.cancel()
        tb.cancel()

    asyncio.run(asyncio.wait_for(scenario(), timeout=30))
    (a_up, a_down, b_up, b_down, a_again) = events
    assert a_up[:2] == ("a", True) and a_down[:2] == ("a", False) and b_up[:2] == ("b", True)
    assert a_down[2] < b_up[2], "the partitioned leader stopped before the standby started"
    assert b_down[:2] == ("b", False) and a_again[:2] == ("a", True)


def test_a_replica_that_stops_leading_stops_reporting_the_decision_gauges() -> None:
    from coroner.core.reasons import Reason
    from coroner_operator.metrics import DecisionGauge, Metrics

    metrics = Metrics(process_collectors=False)
    gauge = DecisionGauge(metrics)
    reasons = list(Reason)[:3]
    for i, reason in enumerate(reasons * 2):
        gauge.set(("ns", f"w{i}"), reason)
    assert sum(gauge.by_reason().values()) == 6
    gauge.clear()
    assert gauge.by_reason() == {}
    assert all(metrics.registrations.labels(r.value)._value.get() == 0 for r in reasons)


def test_the_decision_gauge_counts_each_registration_once_under_its_latest_reason() -> None:
    from coroner.core.reasons import Reason
    from coroner_operator.metrics import DecisionGauge, Metrics

    metrics = Metrics(process_collectors=False)
    gauge = DecisionGauge(metrics)

    def counted(reason: Reason) -> float:
        return float(metrics.registrations.labels(reason.value)._value.get())

    for _ in range(3):  # every sweep decides it again, unchanged
        gauge.set(("ns", "w"), Reason.PID_ALIVE)
    assert counted(Reason.PID_ALIVE) == 1
    gauge.set(("ns", "w"), Reason.AGENT_UNAVAILABLE)
    assert (counted(Reason.PID_ALIVE), counted(Reason.AGENT_UNAVAILABLE)) == (0, 1)
    gauge.set(("ns", "w"), None)
    gauge.set(("ns", "w"), None)
    assert counted(Reason.AGENT_UNAVAILABLE) == 0 and gauge.by_reason() == {}
