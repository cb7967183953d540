"""The operator's executor against a recording fake of its API door: what each outcome of a write
does to the cache and the queue (the integration tests show the same against the real API server)."""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from typing import Any

import jsonpatch
import pytest

from coroner.client.rest import ApiError
from coroner.core import api
from coroner.core.decision import Policy
from coroner.core.model import format_time
from coroner.core.world import World
from coroner.retire import RetireOutcome
from coroner_operator.app import Operator
from coroner_operator.effects import RetireFailed, WriteRefused
from coroner_operator.metrics import Metrics
from coroner_operator.settings import OperatorSettings
from unit.builders import NAME, NAMESPACE, make_registration, shipped_admission_policies

pytestmark = pytest.mark.unit

KEY = (NAMESPACE, NAME)


class FakeKube:
    def __init__(
        self,
        *,
        granted: bool = True,
        leases: list[dict[str, Any]] | None = None,
        patch_error: BaseException | None = None,
        fresh: dict[str, Any] | None = None,
    ) -> None:
        self.granted = granted
        self.leases = leases or []
        self.patch_error = patch_error
        self.fresh = fresh
        self.patches: list[list[dict[str, Any]]] = []
        self.events: list[dict[str, Any]] = []

    async def can_retire(self, *, namespace: str, name: str | None = None) -> bool:
        return self.granted

    async def list_leases(self, *, namespace: str) -> list[dict[str, Any]]:
        return self.leases

    async def list_admission_policies(self) -> list[dict[str, Any]]:
        return shipped_admission_policies()  # intact: the operator may retire

    async def get_node(self, *, name: str) -> dict[str, Any] | None:
        return None

    async def patch_status(
        self, *, namespace: str, name: str, ops: list[dict[str, Any]], decided_on: str | None = None
    ) -> dict[str, Any]:
        self.patches.append(ops)
        if self.patch_error is not None:
            raise self.patch_error
        body = make_registration(paths={"metadata.resourceVersion": "2000", "status.retirement": {"retiredBy": "op"}})
        return body

    async def get_registration(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        return self.fresh

    async def post_event(self, **kwargs: Any) -> None:
        self.events.append(kwargs)


def operator(kube: FakeKube) -> Operator:
    op = Operator(
        world=World(system_namespace=api.SYSTEM_NAMESPACE),
        kube=kube,  # type: ignore[arg-type]
        policy=Policy(),
        metrics=Metrics(),
        settings=OperatorSettings(),
        identity="system:serviceaccount:coroner-system:coroner-operator",
    )
    op.world.put_registration(make_registration())  # retirable (its agent Lease aside: see below)
    op.world.put_lease(
        {
            "metadata": {"namespace": api.SYSTEM_NAMESPACE, "name": f"{api.AGENT_LEASE_PREFIX}node-a",
                         "annotations": {api.AGENT_LEASE_BOOT_ID: "8d0a4c6e-0000-4000-8000-000000000001",
                                         api.AGENT_LEASE_HOST_ID: "0f2e0000000000000000000000000001"}},
            "spec": {"holderIdentity": "agent", "renewTime": _now_text(), "leaseDurationSeconds": 3600},
        }
    )  # fmt: skip
    return op


def _now_text() -> str:
    return format_time(datetime.datetime.now(datetime.UTC), fraction=True)


def sample(op: Operator, name: str, labels: dict[str, str] | None = None) -> float:
    return op.metrics.registry.get_sample_value(name, labels or {}) or 0.0


def reconcile(op: Operator) -> None:
    asyncio.run(op.reconciler.reconcile(KEY))


def test_a_retirement_is_cached_counted_and_its_event_recorded() -> None:
    kube = FakeKube()
    op = operator(kube)
    reconcile(op)
    assert len(kube.patches) == 1
    assert op.world.bodies[KEY]["metadata"]["resourceVersion"] == "2000", "the answer is cached"
    assert sample(op, "coroner_retirements_total", {"evidence": "PidfdExited"}) == 1
    assert op.events.queue.qsize() == 1, "its Event waits for a poster"
    assert op.controller.queue.pending == 0


def test_a_revoked_permission_is_recorded_and_the_registration_decided_again() -> None:
    # The verb went since the namespace was last reviewed: the write itself is refused for it (no
    # review is asked per retirement), in the API server's words for the capability policy.
    message = (
        'workerregistrations.coroner.dev "w" is forbidden: ValidatingAdmissionPolicy '
        "'coroner-retire-requires-capability' with binding 'coroner-retire-requires-capability' denied request: "
        "retiring needs the retire verb"
    )
    refusal = ApiError(403, "Forbidden", json.dumps({"kind": "Status", "message": message, "code": 403}))
    op = operator(FakeKube(granted=True, patch_error=refusal))
    op.world.set_retire_permission(NAMESPACE, True)
    reconcile(op)
    assert op.world.retire_permission[NAMESPACE] is False
    assert sample(op, "coroner_retire_abandoned_total", {"cause": "RetirePermissionMissing"}) == 1
    assert op.controller.queue.pending == 1


def test_a_moved_lease_fence_takes_the_live_leases_and_decides_again() -> None:
    lease = {"metadata": {"namespace": NAMESPACE, "name": "lock"}, "spec": {"holderIdentity": "someone"}}
    op = operator(FakeKube(leases=[lease]))
    reconcile(op)
    assert set(op.world.leases[NAMESPACE]) == {"lock"}
    assert sample(op, "coroner_retire_abandoned_total", {"cause": "LeaseFenceMoved"}) == 1
    assert op.controller.queue.pending == 1 and op.kube.patches == []  # type: ignore[attr-defined]


@pytest.mark.parametrize(("status", "fresh"), [(409, True), (422, True), (404, False)])
def test_a_conflict_reads_it_again(status: int, fresh: bool) -> None:
    body = make_registration(paths={"metadata.resourceVersion": "1500"})
    op = operator(FakeKube(patch_error=ApiError(status, "Conflict", "moved"), fresh=body if fresh else None))
    reconcile(op)
    assert sample(op, "coroner_cas_conflicts_total") == 1
    if fresh:
        assert op.world.bodies[KEY]["metadata"]["resourceVersion"] == "1500"
        assert op.controller.queue.pending == 1
    else:
        assert KEY not in op.world.bodies, "gone: forgotten"


TOO_MANY = ApiError(
    422,
    "Invalid",
    json.dumps(
        {
            "kind": "Status",
            "reason": "Invalid",
            "code": 422,
            "message": (
                'WorkerRegistration.coroner.dev "w" is invalid: status.conditions: Too many: 17: must have at most 16 items'
            ),
        }
    ),
)


@pytest.mark.parametrize("verdict", ["Dead", "Alive"], ids=["retirement", "conditions"])
def test_a_422_for_an_object_that_did_not_move_backs_off_instead_of_spinning(verdict: str) -> None:
    """A peer stuffed the conditions up to the CRD's maxItems: every write that appends one is
    refused 422 though nothing moved. Read again, the object is the one that was tested: not a
    conflict, so it is not reconciled again at once (a hot loop) but raised for the runtime's
    capped exponential backoff, logged and counted as a reconcile failure."""
    body = make_registration(verdict=verdict, paths={"metadata.resourceVersion": "1000"})
    op = operator(FakeKube(patch_error=TOO_MANY, fresh=body))
    op.world.put_registration(body)
    with pytest.raises(WriteRefused):
        reconcile(op)
    assert len(op.kube.patches) == 1  # type: ignore[attr-defined]
    assert op.controller.queue.pending == 0, "not reconciled again at once"
    assert sample(op, "coroner_cas_conflicts_total") == 0, "not a conflict"


@pytest.mark.parametrize("error", [ApiError(500, "InternalError", "etcd"), ConnectionRefusedError("down")])
def test_an_unexpected_write_failure_is_raised_for_the_backoff(error: BaseException) -> None:
    op = operator(FakeKube(patch_error=error))
    with pytest.raises(RetireFailed):
        reconcile(op)
    assert KEY in op.world.bodies and op.controller.queue.pending == 0


class RefusingKube(FakeKube):
    """Admission refuses every retirement write with the API server's words; other writes land."""

    def __init__(self, *, status: int, said: str = "not on this cluster") -> None:
        super().__init__()
        message = (
            "workerregistrations.coroner.dev \"w\" is forbidden: ValidatingAdmissionPolicy 'deny-retirements' with "
            f"binding 'deny-retirements-binding' denied request: {said}"
        )
        self.refusal = ApiError(status, "Forbidden", json.dumps({"kind": "Status", "message": message, "code": status}))
        self.body = make_registration()

    async def patch_status(
        self, *, namespace: str, name: str, ops: list[dict[str, Any]], decided_on: str | None = None
    ) -> dict[str, Any]:
        self.patches.append(ops)
        if any(_retires(op) for op in ops):
            raise self.refusal
        self.body = jsonpatch.apply_patch(self.body, ops)
        self.body["metadata"]["resourceVersion"] = str(int(self.body["metadata"]["resourceVersion"]) + 1)
        return self.body


def _retires(op: dict[str, Any]) -> bool:
    value = op.get("value")
    return op["path"] == "/status/retirement" or (isinstance(value, dict) and "retirement" in value)


def _retirable(body: dict[str, Any]) -> dict[str, Any]:
    (found,) = [c for c in body["status"]["conditions"] if c["type"] == "Retirable"]
    return dict(found)


@pytest.mark.parametrize("status", [403, 422], ids=["reason-Forbidden", "reason-Invalid"])
def test_an_admission_refusal_is_recorded_as_such_keeps_the_grant_and_backs_off(status: int) -> None:
    kube = RefusingKube(status=status)
    op = operator(kube)
    op.world.put_registration(kube.body)
    op.world.set_retire_permission(NAMESPACE, True)
    with pytest.raises(RetireFailed) as raised:  # the runtime retries it with backoff
        reconcile(op)
    assert raised.value.result.outcome is RetireOutcome.REFUSED_BY_ADMISSION
    assert op.world.retire_permission[NAMESPACE] is True, "the grant is there: not plan-only"
    assert sample(op, "coroner_retire_abandoned_total", {"cause": "RetireRefusedByAdmission"}) == 1
    assert sample(op, "coroner_retire_abandoned_total", {"cause": "RetirePermissionMissing"}) == 0
    assert sample(op, "coroner_cas_conflicts_total") == 0, "a 422 refusal is not a conflict (re-read at once)"
    retirable = _retirable(op.world.bodies[KEY])
    assert (retirable["status"], retirable["reason"]) == ("False", "RetireRefusedByAdmission")
    assert "ValidatingAdmissionPolicy deny-retirements (binding deny-retirements-binding)" in retirable["message"]
    assert "not on this cluster" in retirable["message"]
    assert op.controller.queue.pending == 0, "not enqueued again at once: the backoff brings it back"
    # The backoff's retry: refused again, and the condition already says so (nothing else written).
    written = len(kube.patches)
    with pytest.raises(RetireFailed):
        reconcile(op)
    assert len(kube.patches) == written + 1 and any(_retires(op) for op in kube.patches[-1])
    assert sample(op, "coroner_retire_abandoned_total", {"cause": "RetireRefusedByAdmission"}) == 2


def test_a_refusal_by_the_verbs_own_policy_is_a_missing_permission() -> None:
    kube = RefusingKube(status=403)
    kube.refusal = ApiError(
        403,
        "Forbidden",
        json.dumps(
            {
                "message": 'workerregistrations.coroner.dev "w" is forbidden: ValidatingAdmissionPolicy '
                "'coroner-retire-requires-capability' with binding 'coroner-retire-requires-capability' denied "
                "request: retiring WorkerRegistration t/w requires the retire verb"
            }
        ),
    )
    op = operator(kube)
    op.world.set_retire_permission(NAMESPACE, True)
    reconcile(op)
    assert op.world.retire_permission[NAMESPACE] is False
    assert sample(op, "coroner_retire_abandoned_total", {"cause": "RetirePermissionMissing"}) == 1


def test_the_reads_a_retirement_acted_on_serve_the_next_batch_once_its_write_is_answered() -> None:
    # Its Event waits while the backlog is full: a read decided now must not wait behind that Event
    # (each read is held until the writes of its batch are answered, and no longer).
    kube = FakeKube()
    op = operator(kube)
    reads: list[str] = []

    async def record(**_: Any) -> None:
        now = time.monotonic()
        await asyncio.wait_for(op.reconciler.lease_reads.get(NAMESPACE, decided_at=now), timeout=5)
        reads.append("leases")
        async with op.permissions.admission_held(decided_at=now):
            reads.append("admission")

    op.events.record = record  # type: ignore[method-assign]
    asyncio.run(asyncio.wait_for(op.reconciler.reconcile(KEY), timeout=10))
    assert len(kube.patches) == 1 and reads == ["leases", "admission"]


def test_the_admission_read_and_the_lease_fence_read_are_in_flight_together() -> None:
    # Both reads guard the same write and both must be sent after the decision: one waiting for the
    # other would put a second round trip (and a second wait for the API server's watch cache to
    # become fresh) between a death and its retirement.
    class Gated(FakeKube):
        def __init__(self) -> None:
            super().__init__()
            self.asked: list[str] = []
            self.answer = asyncio.Event()

        async def list_leases(self, *, namespace: str) -> list[dict[str, Any]]:
            self.asked.append("leases")
            await self.answer.wait()
            return await super().list_leases(namespace=namespace)

        async def list_admission_policies(self) -> list[dict[str, Any]]:
            self.asked.append("admission")
            if len(self.asked) > 1:  # the check before the first decision is answered at once
                await self.answer.wait()
            return await super().list_admission_policies()

    kube = Gated()
    op = operator(kube)

    async def scenario() -> None:
        retiring = asyncio.ensure_future(op.reconciler.reconcile(KEY))
        for _ in range(100):
            if len(kube.asked) == 3:
                break
            await asyncio.sleep(0.01)
        in_flight = list(kube.asked)
        kube.answer.set()
        await asyncio.wait_for(retiring, timeout=10)
        assert sorted(in_flight[1:]) == ["admission", "leases"], in_flight

    asyncio.run(scenario())
    assert len(kube.patches) == 1
