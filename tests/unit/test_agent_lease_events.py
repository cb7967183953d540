"""Which agent Lease events re-decide the node's registrations: every change that can change a
decision, and not the routine renewal of a live agent (which only moves the expiry: the node's
one expiry timer re-decides its registrations if the Lease runs out)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from coroner.core import api
from coroner.core.decision import Policy
from coroner.core.model import format_time
from coroner.core.world import World
from coroner_operator.app import Operator
from coroner_operator.metrics import Metrics
from coroner_operator.settings import OperatorSettings
from unit.builders import BOOT, HOST, NODE, make_registration

pytestmark = pytest.mark.unit

UTC = datetime.UTC


def agent_lease(
    *, renewed: datetime.datetime, boot_id: str = BOOT, host_id: str = HOST, duration: int = 40, holder: str = "pod-1"
) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": api.SYSTEM_NAMESPACE,
            "name": f"{api.AGENT_LEASE_PREFIX}{NODE}",
            "annotations": {api.AGENT_LEASE_BOOT_ID: boot_id, api.AGENT_LEASE_HOST_ID: host_id},
        },
        "spec": {
            "holderIdentity": holder,
            "renewTime": format_time(renewed, fraction=True),
            "leaseDurationSeconds": duration,
        },
    }


class Harness:
    """The operator's watch inputs and runtime, no API: what is queued, and timers fired by hand."""

    def __init__(self) -> None:
        self.world = World(system_namespace=api.SYSTEM_NAMESPACE)
        self.operator = Operator(
            world=self.world,
            kube=None,  # type: ignore[arg-type]
            policy=Policy(),
            metrics=Metrics(),
            settings=OperatorSettings(),
        )
        for i in range(3):
            self.world.put_registration(make_registration(name=f"w{i}", uid=f"u{i}"))

    def on_lease(self, body: dict[str, Any], *, deleted: bool) -> None:
        self.operator.inputs.on_lease(body, deleted=deleted)

    def fire_timers(self, now: datetime.datetime) -> None:
        self.operator.controller.fire_due(now)

    @property
    def queued(self) -> int:
        return self.operator.controller.queue.pending

    def clear_queue(self) -> None:
        self.operator.controller.queue = type(self.operator.controller.queue)()


def reconciler_with_three_registrations() -> Harness:
    return Harness()


def test_a_routine_renewal_of_a_live_agent_re_decides_nothing() -> None:
    r = reconciler_with_three_registrations()
    now = datetime.datetime.now(UTC)
    r.on_lease(agent_lease(renewed=now - datetime.timedelta(seconds=10)), deleted=False)
    assert r.queued == 3, "first sight of the agent: decide its node again"
    r.clear_queue()
    r.on_lease(agent_lease(renewed=now), deleted=False)
    assert r.queued == 0
    assert r.world.agents[NODE].renew_time == now, "the cache still moves on"


@pytest.mark.parametrize(
    "change",
    [
        {"boot_id": "another-boot"},
        {"host_id": "another-host"},
        {"duration": 15},
    ],
    ids=["boot id", "host id", "duration"],
)
def test_a_renewal_that_changes_what_the_agent_publishes_re_decides_the_node(change: dict[str, Any]) -> None:
    r = reconciler_with_three_registrations()
    now = datetime.datetime.now(UTC)
    r.on_lease(agent_lease(renewed=now - datetime.timedelta(seconds=10)), deleted=False)
    r.clear_queue()
    r.on_lease(agent_lease(renewed=now, **change), deleted=False)
    assert r.queued == 3


def test_a_renewal_after_the_lease_had_expired_re_decides_the_node() -> None:
    r = reconciler_with_three_registrations()
    now = datetime.datetime.now(UTC)
    r.on_lease(agent_lease(renewed=now - datetime.timedelta(seconds=60)), deleted=False)  # expired 20 s ago
    r.clear_queue()
    r.on_lease(agent_lease(renewed=now), deleted=False)
    assert r.queued == 3, "decided AgentUnavailable while it was expired: decide again now"


def test_a_deleted_agent_lease_re_decides_the_node() -> None:
    r = reconciler_with_three_registrations()
    now = datetime.datetime.now(UTC)
    lease = agent_lease(renewed=now)
    r.on_lease(lease, deleted=False)
    r.clear_queue()
    r.on_lease(lease, deleted=True)
    assert r.queued == 3


def test_the_node_is_re_decided_when_its_agent_lease_runs_out() -> None:
    # A stale Alive is not alive: an agent that dies renews nothing, so no Lease event
    # arrives; the node's expiry timer is what turns PidAlive into AgentUnavailable.
    r = reconciler_with_three_registrations()
    now = datetime.datetime.now(UTC)
    r.on_lease(agent_lease(renewed=now - datetime.timedelta(seconds=10)), deleted=False)
    r.clear_queue()
    expiry = now + datetime.timedelta(seconds=30)
    r.fire_timers(expiry - datetime.timedelta(microseconds=1))
    assert r.queued == 0
    r.fire_timers(expiry)
    assert r.queued == 3


def test_a_renewal_moves_the_expiry_timer() -> None:
    r = reconciler_with_three_registrations()
    now = datetime.datetime.now(UTC)
    r.on_lease(agent_lease(renewed=now - datetime.timedelta(seconds=10)), deleted=False)
    r.on_lease(agent_lease(renewed=now), deleted=False)  # routine
    r.clear_queue()
    r.fire_timers(now + datetime.timedelta(seconds=30))  # the old expiry: renewed since
    assert r.queued == 0
    r.fire_timers(now + datetime.timedelta(seconds=40))
    assert r.queued == 3


def test_a_deleted_agent_lease_has_no_timer() -> None:
    r = reconciler_with_three_registrations()
    now = datetime.datetime.now(UTC)
    lease = agent_lease(renewed=now)
    r.on_lease(lease, deleted=False)
    r.on_lease(lease, deleted=True)
    r.clear_queue()
    r.fire_timers(now + datetime.timedelta(seconds=40))
    assert r.queued == 0
