"""The retirement's Lease fence against the real API server: one read per batch, never a stale one.

The operator's reconciler reads a namespace's Leases once for every retirement decided before the
read was sent, and each retirement holds that read until its own write is answered; a retirement
decided while the batch before it writes waits for the next read. Here the first retirement's
write is held at its I/O boundary while a second registration is decided retirable from a cache
that has not seen its worker's Lease; the Lease is then taken in the API, and the first write let
go. The second retirement must be fenced by a read sent after that (LeaseFenceMoved, nothing
written), not executed on the first batch's read.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes import client as k8s

from coroner.client.rest import Rest
from coroner.core import api
from coroner.core.decision import Policy
from coroner.core.world import World
from coroner.retire import RetireOutcome
from coroner_dev.devcluster.cluster import Cluster
from coroner_operator.app import Operator
from coroner_operator.kubeapi import KubeApi
from coroner_operator.metrics import Metrics
from coroner_operator.settings import OperatorSettings
from support import components, kube

pytestmark = pytest.mark.integration


class HeldWrites(KubeApi):
    """The real API door, with each status write waiting for the test's go (the I/O boundary only)."""

    def __init__(self, rest: Rest) -> None:
        super().__init__(rest)
        self.go = asyncio.Event()
        self.writing = asyncio.Event()

    async def patch_status(
        self, *, namespace: str, name: str, ops: list[dict[str, Any]], decided_on: str | None = None
    ) -> dict[str, Any]:
        self.writing.set()
        await self.go.wait()
        return await super().patch_status(namespace=namespace, name=name, ops=ops, decided_on=decided_on)


def _dead(admin: k8s.ApiClient, agent: k8s.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    kube.create_registration(admin, namespace, kube.registration_body(name=name))
    kube.patch_status(admin, namespace, name, {"status": {"lastHeartbeatTime": components.now_text(-120)}})
    return components.attest(agent, namespace, name, evidence="PidfdExited")


def test_a_retirement_decided_while_the_last_batch_writes_is_fenced_by_a_read_sent_after_a_renewal(
    granted: Cluster, agent_a: k8s.ApiClient, admin: k8s.ApiClient, namespace: str
) -> None:
    first, second = _dead(admin, agent_a, namespace, "first"), _dead(admin, agent_a, namespace, "second")
    agent_lease = k8s.CoordinationV1Api(admin).read_namespaced_lease(
        f"{api.AGENT_LEASE_PREFIX}node-a", api.SYSTEM_NAMESPACE
    )
    door = HeldWrites(Rest.default(components.operator_kubeconfig(granted)))
    op = Operator(
        world=World(system_namespace=api.SYSTEM_NAMESPACE),
        kube=door,
        policy=Policy(),
        metrics=Metrics(),
        settings=OperatorSettings(),
        identity="system:serviceaccount:coroner-system:coroner-operator",
    )
    op.world.put_lease(admin.sanitize_for_serialization(agent_lease))
    op.world.put_registration(first)
    outcomes: list[RetireOutcome] = []
    run_of = op.executor.run

    async def recorded(effects: Any, **kwargs: Any) -> Any:
        if effects.record is not None:  # what a retirement's outcome tells the cache
            outcomes.append(effects.record.result.outcome)
        return await run_of(effects, **kwargs)

    op.executor.run = recorded  # type: ignore[method-assign]

    async def scenario() -> None:
        one = asyncio.ensure_future(op.reconciler.reconcile((namespace, "first")))
        await asyncio.wait_for(door.writing.wait(), timeout=30)  # first's fence read answered, its write held
        assert op.reconciler.lease_reads.requests == 1
        op.world.put_registration(second)  # decided now, from a cache without its worker's Lease
        two = asyncio.ensure_future(op.reconciler.reconcile((namespace, "second")))
        for _ in range(50):
            await asyncio.sleep(0.01)
        assert op.reconciler.lease_reads.requests == 1, "no read while the first batch writes"
        # The worker takes its Lease (a renewal the operator's cache has not seen).
        k8s.CoordinationV1Api(admin).create_namespaced_lease(
            namespace,
            k8s.V1Lease(
                metadata=k8s.V1ObjectMeta(name="second-lock"),
                spec=k8s.V1LeaseSpec(holder_identity="second", lease_duration_seconds=60),
            ),
        )
        door.go.set()
        await asyncio.wait_for(asyncio.gather(one, two), timeout=60)

    try:
        asyncio.run(scenario())
    finally:
        op.close()
    assert outcomes == [RetireOutcome.RETIRED, RetireOutcome.LEASE_FENCE_MOVED], outcomes
    assert op.reconciler.lease_reads.requests == 2, "one read per batch: the second decided after the first was sent"
    assert components.retired(admin, namespace, "first")
    assert not components.retired(admin, namespace, "second"), "retired on a read sent before its worker's Lease"
