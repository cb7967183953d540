"""The operator publishes the policy it decides with on its own Lease: before the first sweep, and
with every sweep, next to the sweep record, in the one shape `coroner.core.policy_json` reads back;
and with it its own user (`api.OPERATOR_USER_ANNOTATION`), whoever writes the Lease (the sweeper, or
the leader elector under leader election), so `kubectl coroner doctor` knows whose grant to review."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from coroner.core import api, policy_json
from coroner.core.decision import Policy
from coroner.core.world import World
from coroner.runtime.leader import ElectionConfig
from coroner_operator.app import Operator
from coroner_operator.metrics import Metrics
from coroner_operator.settings import OperatorSettings
from unit.builders import make_operator, make_registration

pytestmark = pytest.mark.unit

USER = "system:serviceaccount:coroner-system:team-a-coroner-operator"


class RecordingKube:
    """Records every Lease write; `fail` makes them raise as an API outage would."""

    def __init__(self, *, fail: bool = False) -> None:
        self.writes: list[dict[str, Any]] = []
        self.fail = fail
        self.wrote = asyncio.Event()

    async def upsert_lease(self, **kwargs: Any) -> None:
        self.writes.append(kwargs)
        self.wrote.set()
        if self.fail:
            raise ConnectionError("API server unreachable")


async def sweeps_until(kube: RecordingKube, policy: Policy, *, writes: int) -> None:
    operator = Operator(
        world=World(system_namespace=api.SYSTEM_NAMESPACE),
        kube=kube,  # type: ignore[arg-type]
        policy=policy,
        metrics=Metrics(),
        settings=OperatorSettings(resync_seconds=0.01),
        identity=USER,
    )
    task = asyncio.create_task(operator.sweeper.run())
    try:
        while len(kube.writes) < writes:
            kube.wrote.clear()
            await asyncio.wait_for(kube.wrote.wait(), timeout=5)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.mark.parametrize(
    "policy",
    [
        pytest.param(Policy(), id="defaults"),
        pytest.param(Policy(node_deletion_evidence=True, node_deletion_quarantine_seconds=300), id="node-loss"),
        pytest.param(Policy(node_out_of_service_evidence=False, absence_confirm_seconds=60), id="strict"),
    ],
)
def test_the_policy_is_published_before_the_first_sweep_and_with_every_sweep(policy: Policy) -> None:
    kube = RecordingKube()
    asyncio.run(sweeps_until(kube, policy, writes=3))
    first, *sweeps = kube.writes
    assert first["namespace"] == api.SYSTEM_NAMESPACE and first["name"] == api.OPERATOR_LEASE
    # At startup: the policy and the user (upsert_lease merges annotations, so a recorded sweep is kept).
    assert set(first["annotations"]) == {api.POLICY_ANNOTATION, api.OPERATOR_USER_ANNOTATION}
    for write in kube.writes:
        assert policy_json.parse_policy(write["annotations"][api.POLICY_ANNOTATION]) == policy
    for write in sweeps:
        assert set(write["annotations"]) == {
            api.POLICY_ANNOTATION,
            api.OPERATOR_USER_ANNOTATION,
            api.LAST_SWEEP_ANNOTATION,
        }
        assert write["annotations"][api.OPERATOR_USER_ANNOTATION] == USER
        assert json.loads(write["annotations"][api.LAST_SWEEP_ANNOTATION])["failures"] == {}


def test_a_lease_write_that_fails_does_not_stop_the_sweeps() -> None:
    kube = RecordingKube(fail=True)
    asyncio.run(sweeps_until(kube, Policy(), writes=3))
    assert len(kube.writes) >= 3


class ElectionStore:
    """An in-memory LeaseStore: the one Lease, as the leader elector creates and replaces it."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.written = asyncio.Event()

    async def get_lease(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        return self.lease

    async def create_lease(self, *, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self.lease = {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}
        self.written.set()
        return self.lease

    async def replace_lease(self, *, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self.lease = body
        self.written.set()
        return body


def test_under_leader_election_the_leader_lease_carries_the_operators_user() -> None:
    """The elector's holderIdentity is the pod's name; the operator's user rides on its Lease as an
    annotation, published by the sweeper before the first sweep (the pod name says no ServiceAccount)."""
    store = ElectionStore()

    async def scenario() -> dict[str, Any]:
        operator = Operator(
            world=World(system_namespace=api.SYSTEM_NAMESPACE),
            kube=store,  # type: ignore[arg-type]
            policy=Policy(),
            metrics=Metrics(),
            settings=OperatorSettings(
                resync_seconds=0.01, leader_election=ElectionConfig(), leader_identity="coroner-operator-7d9f-abcde"
            ),
            identity=USER,
        )
        assert operator.elector is not None
        sweeper = asyncio.create_task(operator.sweeper.run())
        elector = asyncio.create_task(operator.elector.run())
        try:
            while store.lease is None or api.LAST_SWEEP_ANNOTATION not in store.lease["metadata"]["annotations"]:
                store.written.clear()
                await asyncio.wait_for(store.written.wait(), timeout=5)
        finally:
            for task in (sweeper, elector):
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
        assert store.lease is not None
        return store.lease

    lease = asyncio.run(scenario())
    assert lease["spec"]["holderIdentity"] == "coroner-operator-7d9f-abcde"
    annotations = lease["metadata"]["annotations"]
    assert annotations[api.OPERATOR_USER_ANNOTATION] == USER
    assert api.POLICY_ANNOTATION in annotations


def test_many_registrations_space_the_sweeps_and_the_lease_allows_for_it() -> None:
    """A sweep every --resync-seconds (60) up to 30,000 registrations; at 150,000 every 300 s (2 ms
    each), and the Lease written with it lasts three such intervals."""
    kube = RecordingKube()
    operator = make_operator(kube, settings=OperatorSettings(resync_seconds=60), identity=USER)
    sweeper = operator.sweeper

    async def drained() -> None:
        return None

    sweeper.drain = drained  # type: ignore[method-assign]
    body = make_registration(attested=False)
    for count, interval in ((10, 60.0), (30000, 60.0), (150000, 300.0), (10, 60.0)):
        operator.world.bodies = dict.fromkeys((("jobs", f"w-{i}") for i in range(count)), body)
        operator.world.parsed = {}
        asyncio.run(sweeper.sweep())
        assert sweeper.interval == pytest.approx(interval)
        assert kube.writes[-1]["duration"] == int(interval * 3)
