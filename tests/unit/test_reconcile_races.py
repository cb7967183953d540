"""The reconcile of a registration whose object changes while the reconcile awaits a live read:
it decides on what the cache holds after its awaits, and on nothing once the object is gone (the
watch delivers a deletion while the first permission review of its namespace is in flight)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from coroner.core import api
from coroner.core.decision import Policy
from coroner.core.world import World
from coroner_operator.app import Operator
from coroner_operator.metrics import Metrics
from coroner_operator.settings import OperatorSettings
from unit.builders import make_operator, make_registration
from unit.test_terminal_deletion import FakeKube

pytestmark = pytest.mark.unit


class DeletedDuringReview(FakeKube):
    """The namespace's first `retire` review is answered after the registration's deletion arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.world: World | None = None

    async def can_retire(self, **kwargs: Any) -> bool:
        assert self.world is not None
        self.world.forget_registration(("jobs", "w1"))
        return await super().can_retire(**kwargs)


def test_a_registration_deleted_while_its_reconcile_awaits_is_not_decided() -> None:
    kube = DeletedDuringReview()
    operator = make_operator(kube)
    kube.world = operator.world
    operator.world.put_registration(make_registration(name="w1", uid="uid-w1"))
    result = asyncio.run(operator.reconciler.reconcile(("jobs", "w1")))
    assert result.requeue_at is None
    assert kube.patches == [] and kube.deletes == []


class SlowReview(FakeKube):
    """The namespace's first `retire` review takes a while (the clock moves while it is in flight)."""

    def __init__(self, clock: list[float]) -> None:
        super().__init__()
        self.clock = clock

    async def can_retire(self, **kwargs: Any) -> bool:
        self.clock[0] += 100.0
        return await super().can_retire(**kwargs)


def test_a_decision_is_dated_after_the_live_reads_it_awaited() -> None:
    # The fence and the admission reads that serve a retirement must be sent after the cache read
    # the decision rests on: a read another retirement sent while this one awaited its first review
    # predates that cache read, and must not count as fresh for it.
    clock = [0.0]
    operator = Operator(
        world=World(system_namespace=api.SYSTEM_NAMESPACE),
        kube=SlowReview(clock),  # type: ignore[arg-type]
        policy=Policy(),
        metrics=Metrics(),
        settings=OperatorSettings(),
        monotonic=lambda: clock[0],
    )
    operator.world.put_registration(make_registration(name="w1", uid="uid-w1"))
    decided_at, _ = asyncio.run(operator.reconciler.decide(("jobs", "w1")))
    assert decided_at == 100.0
