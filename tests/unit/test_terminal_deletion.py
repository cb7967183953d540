"""The operator's deletion of terminal registrations, against a recording fake of its API door: only
what was read terminal, only once due, with uid and resourceVersion preconditions; a refused delete
(409: it changed since the read) leaves the object alone; and Events go out through the correlator."""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable
from typing import Any

import pytest

from coroner.client.rest import ApiError
from coroner.core import api
from coroner.core.decision import Policy
from coroner.core.model import format_time
from coroner.core.world import World
from coroner_operator.app import Operator
from coroner_operator.eventcorrelator import EventCorrelator
from coroner_operator.metrics import Metrics
from coroner_operator.settings import OperatorSettings
from unit.builders import make_registration

pytestmark = pytest.mark.unit


class FakeKube:
    def __init__(self, *, delete_error: int | None = None, post_error: bool = False) -> None:
        self.deletes: list[dict[str, Any]] = []
        self.patches: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.delete_error = delete_error
        self.post_error = post_error

    async def delete_registration(self, **kwargs: Any) -> None:
        self.deletes.append(kwargs)
        if self.delete_error is not None:
            raise ApiError(self.delete_error, "Conflict", "Precondition failed: UID or ResourceVersion")

    async def patch_status(self, **kwargs: Any) -> dict[str, Any]:
        self.patches.append(kwargs)
        raise ApiError(409, "Conflict", "not in this test")

    async def get_registration(self, **_: Any) -> None:
        return None

    async def can_retire(self, **_: Any) -> bool:
        return False

    async def post_event(self, **kwargs: Any) -> None:
        if self.post_error:
            raise ApiError(500, "InternalError", "etcd is sad")
        self.events.append(kwargs)


def released(*, ago: float | None, name: str = "w1") -> dict[str, Any]:
    now = datetime.datetime.now(datetime.UTC)
    condition: dict[str, Any] = {"type": "Released", "status": "True", "reason": "CleanExit", "message": "bye"}
    if ago is not None:
        condition["lastTransitionTime"] = format_time(now - datetime.timedelta(seconds=ago))
    return make_registration(name=name, uid=f"uid-{name}", conditions=[condition])


def reconciler(kube: FakeKube, *, retention: float = 10.0, burst: int = 10) -> Operator:
    return Operator(
        world=World(system_namespace=api.SYSTEM_NAMESPACE),
        kube=kube,  # type: ignore[arg-type]
        policy=Policy(),
        metrics=Metrics(),
        settings=OperatorSettings(terminal_retention_seconds=retention, event_burst=burst),
    )


def deleted(r: Operator, terminal: str) -> float:
    return r.metrics.registry.get_sample_value("coroner_terminal_deletions_total", {"terminal": terminal}) or 0.0


def test_a_terminal_registration_past_its_retention_is_deleted_with_preconditions_and_no_other_write() -> None:
    kube = FakeKube()
    r = reconciler(kube)
    r.world.put_registration(released(ago=60))
    asyncio.run(r.reconciler.reconcile(("jobs", "w1")))
    assert kube.deletes == [{"namespace": "jobs", "name": "w1", "uid": "uid-w1", "resource_version": "1001"}]
    assert kube.patches == [], "no AlreadyTerminal write for an object being deleted"
    assert deleted(r, "Released") == 1


@pytest.mark.parametrize(
    ("build", "retention"),
    [
        # Built when the test runs, not when it is collected: "5 s ago" must not age with the suite.
        pytest.param(lambda: released(ago=5), 10.0, id="not-yet-due"),
        pytest.param(lambda: released(ago=10**6), 0.0, id="retention-0-keeps-forever"),
        pytest.param(make_registration, 10.0, id="active"),
        pytest.param(lambda: released(ago=None), 10.0, id="no-parsable-time"),
    ],
)
def test_nothing_is_deleted_before_it_is_due_or_when_kept(
    build: Callable[[], dict[str, Any]], retention: float
) -> None:
    body = build()
    kube = FakeKube()
    r = reconciler(kube, retention=retention)
    r.world.put_registration(body)
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    asyncio.run(r.reconciler.reconcile(key))
    assert kube.deletes == []


def test_a_registration_kept_for_lack_of_a_time_is_logged_once_per_version(caplog: pytest.LogCaptureFixture) -> None:
    kube = FakeKube()
    r = reconciler(kube)
    conditions = [
        {"type": "Released", "status": "True", "reason": "CleanExit", "message": "bye"},
        {"type": "Retirable", "status": "False", "reason": "AlreadyTerminal", "message": "released"},
    ]
    r.world.put_registration(make_registration(name="w1", uid="uid-w1", conditions=conditions))
    with caplog.at_level(logging.WARNING, logger="coroner.operator"):
        for _ in range(3):
            asyncio.run(r.reconciler.reconcile(("jobs", "w1")))
    kept = [m for m in caplog.messages if "terminal workerregistration kept" in m]
    assert len(kept) == 1 and "lastTransitionTime does not parse" in kept[0]
    assert kube.patches == [] and kube.deletes == []


@pytest.mark.parametrize("status", [409, 404])
def test_a_refused_delete_leaves_the_object_alone_and_counts_nothing(status: int) -> None:
    kube = FakeKube(delete_error=status)
    r = reconciler(kube)
    r.world.put_registration(released(ago=60))
    asyncio.run(r.reconciler.reconcile(("jobs", "w1")))  # no exception: nothing to retry
    assert len(kube.deletes) == 1 and kube.patches == []
    assert deleted(r, "Released") == 0
    assert ("jobs", "w1") in r.world.parsed, "only the watch's delete event forgets it"


def test_other_delete_errors_propagate_for_the_backoff() -> None:
    r = reconciler(FakeKube(delete_error=500))
    r.world.put_registration(released(ago=60))
    with pytest.raises(ApiError):
        asyncio.run(r.reconciler.reconcile(("jobs", "w1")))


def test_events_past_the_burst_are_posted_as_one_aggregate_and_counted() -> None:
    async def run() -> tuple[FakeKube, Operator]:
        kube = FakeKube()
        r = reconciler(kube, burst=2)
        posters = [asyncio.create_task(r.events.run_poster()) for _ in range(2)]
        now = datetime.datetime.now(datetime.UTC)
        for i in range(7):
            involved = released(ago=0, name=f"w{i}")
            for out in r.events.correlator.observe(
                involved=involved, reason="Retired", evidence="PidfdExited", message=f"m{i}", now=now
            ):
                await r.events.queue.put(out)
        await r.drain_events()  # flushes the window's aggregate too
        for task in posters:
            task.cancel()
        return kube, r

    kube, r = asyncio.run(run())
    counts = sorted(e["count"] for e in kube.events)
    assert counts == [1, 1, 5]
    sample = r.metrics.registry.get_sample_value
    assert sample("coroner_events_posted_total", {"reason": "Retired", "kind": "individual"}) == 2
    assert sample("coroner_events_posted_total", {"reason": "Retired", "kind": "aggregate"}) == 1
    assert sample("coroner_events_aggregated_total", {"reason": "Retired"}) == 5


def test_a_failed_event_write_is_counted() -> None:
    async def run() -> Operator:
        r = reconciler(FakeKube(post_error=True))
        poster = asyncio.create_task(r.events.run_poster())
        for out in r.events.correlator.observe(
            involved=released(ago=0), reason="Retired", evidence="PidfdExited", message="m",
            now=datetime.datetime.now(datetime.UTC),
        ):  # fmt: skip
            await r.events.queue.put(out)
        await r.drain_events()
        poster.cancel()
        return r

    r = asyncio.run(run())
    assert r.metrics.registry.get_sample_value("coroner_event_failures_total", {"reason": "Retired"}) == 1
    assert isinstance(r.events.correlator, EventCorrelator)
