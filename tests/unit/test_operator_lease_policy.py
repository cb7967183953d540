"""The operator publishes the policy it decides with on its own Lease: before the first sweep, and
with every sweep, next to the sweep record, in the one shape `coroner.core.policy_json` reads back."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from coroner.core import api, policy_json
from coroner.core.decision import Policy
from coroner.core.world import World
from coroner_operator.app import Operator
from coroner_operator.metrics import Metrics
from coroner_operator.settings import OperatorSettings

pytestmark = pytest.mark.unit


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
        identity="system:serviceaccount:coroner-system:coroner-operator",
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
    # At startup: the policy only (upsert_lease merges annotations, so a recorded sweep is kept).
    assert set(first["annotations"]) == {api.POLICY_ANNOTATION}
    for write in kube.writes:
        assert policy_json.parse_policy(write["annotations"][api.POLICY_ANNOTATION]) == policy
    for write in sweeps:
        assert set(write["annotations"]) == {api.POLICY_ANNOTATION, api.LAST_SWEEP_ANNOTATION}
        assert json.loads(write["annotations"][api.LAST_SWEEP_ANNOTATION])["failures"] == {}


def test_a_lease_write_that_fails_does_not_stop_the_sweeps() -> None:
    kube = RecordingKube(fail=True)
    asyncio.run(sweeps_until(kube, Policy(), writes=3))
    assert len(kube.writes) >= 3
