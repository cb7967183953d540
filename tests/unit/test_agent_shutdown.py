"""The agent after SIGTERM: it keeps serving while this node's live incarnations exit, attests each
exit as it happens, and exits once nothing is left to wait for or the grace has run out.

A fake prober (each registration is alive or dead, pinned or not) and a fake API stand in for
/proc and the API server; the Agent, its queue, its workers and its Lease loop are the real ones.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coroner.core import model
from coroner.core.model import Key
from coroner.core.reasons import ConditionType, Evidence, Verdict
from coroner_agent.service import Agent, AgentSettings
from coroner_agent.verdict import ProbeResult

pytestmark = pytest.mark.unit

NODE = "node-a"
BOOT = "6af8093f-1f8e-4864-bd25-cc70d02449a1"


def registration(name: str, *, pid: int, node: str = NODE, attestation: dict[str, Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"lastHeartbeatTime": "2026-11-30T17:59:00.000000Z"}
    if attestation is not None:
        status["attestation"] = attestation
    return {
        "apiVersion": "coroner.dev/v1alpha1",
        "kind": "WorkerRegistration",
        "metadata": {
            "name": name,
            "namespace": "jobs",
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "generation": 1,
            "creationTimestamp": "2026-11-30T17:00:00Z",
            "labels": {"coroner.dev/node": NODE},
        },
        "spec": {
            "nodeName": node,
            "incarnation": {"bootId": BOOT, "pidNamespace": "4026531836", "pid": pid, "startTime": "500"},
            "clientInstanceId": f"inst-{name}",
            "heartbeat": {"intervalSeconds": 10, "ttlSeconds": 30},
        },
        "status": status,
    }


def dead_attestation(pid: int) -> dict[str, Any]:
    return {"verdict": "Dead", "evidence": "PidfdExited", "detail": "", "incarnation": {"pid": pid}}


@dataclasses.dataclass
class Worker:
    alive: bool = True
    pinned: bool = True
    """A pinned worker's exit is an event (on_pidfd); an unpinned one is found by a re-probe only."""


class FakeProber:
    """Answers from `workers`: Alive (PidfdPinned / Unknown PidfdUnavailable) or Dead (PidfdExited)."""

    def __init__(self, workers: dict[str, Worker]) -> None:
        self.workers = workers
        self.forgotten: list[Key] = []
        self.rescans = 0

    def boot_id(self) -> str | None:
        return BOOT

    def host_id(self) -> str:
        return "host-a"

    def rescan(self) -> None:
        self.rescans += 1

    def probe(self, *, key: Key, registration: model.Registration) -> ProbeResult:
        worker = self.workers[key[1]]
        if not worker.alive:
            return ProbeResult(verdict=Verdict.DEAD, evidence=Evidence.PIDFD_EXITED, detail="exited")
        if worker.pinned:
            return ProbeResult(verdict=Verdict.ALIVE, evidence=Evidence.PIDFD_PINNED, detail="pinned")
        return ProbeResult(verdict=Verdict.UNKNOWN, evidence=Evidence.PIDFD_UNAVAILABLE, detail="not pinned")

    def forget(self, *, key: Key) -> None:
        self.forgotten.append(key)


class FakeKube:
    """The agent's API: a list of registrations, attestation writes that land, Lease renewals counted."""

    def __init__(self, bodies: list[dict[str, Any]]) -> None:
        self.bodies = {(b["metadata"]["namespace"], b["metadata"]["name"]): b for b in bodies}
        self.writes: list[tuple[str, str, float]] = []
        self.renewals: list[float] = []
        self.renewed_at: list[Any] = []
        self.watch_stopped = threading.Event()

    def patch_status(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        """The attestation patch (`wire.attestation_ops`): its last op sets it."""
        key = (namespace, name)
        stored = copy.deepcopy(self.bodies[key])
        last = ops[-1]
        attestation = last["value"]["attestation"] if last["path"] == "/status" else last["value"]
        stored["status"]["attestation"] = attestation
        stored["metadata"]["resourceVersion"] = str(int(stored["metadata"]["resourceVersion"]) + 1)
        self.bodies[key] = stored
        self.writes.append((key[1], attestation["verdict"], time.monotonic()))
        return stored

    def get_registration(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.bodies.get((namespace, name))

    def renew_lease(self, *, holder: str, duration: int, annotations: dict[str, str], now: Any = None) -> None:
        self.renewals.append(time.monotonic())
        self.renewed_at.append(now)

    def watch_registrations(
        self, *, loop: asyncio.AbstractEventLoop, on_event: Any, on_relist: Any, stop: Any, **_: Any
    ) -> None:
        loop.call_soon_threadsafe(on_relist, [copy.deepcopy(b) for b in self.bodies.values()])
        stop.wait()
        self.watch_stopped.set()


def make_agent(
    workers: dict[str, Worker], *, extra: Sequence[dict[str, Any]] = (), **options: Any
) -> tuple[Agent, FakeKube, FakeProber]:
    kube = FakeKube([registration(name, pid=100 + i) for i, name in enumerate(workers)] + list(extra))
    prober = FakeProber(workers)
    values: dict[str, Any] = {
        "node_name": NODE,
        "renew_seconds": 0.05,
        "resync_seconds": 3600.0,
        "shutdown_grace_seconds": 2.0,
        "shutdown_sweep_seconds": 2.0,
        "shutdown_resync_seconds": 3600.0,
    }
    agent = Agent(kube=kube, prober=prober, settings=AgentSettings(**(values | options)), identity="test")  # type: ignore[arg-type]
    return agent, kube, prober


async def started(agent: Agent, kube: FakeKube) -> tuple[asyncio.Event, asyncio.Task[None]]:
    """The agent running, listed, and every registration attested once."""
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop=stop))
    await asyncio.wait_for(agent.inputs.synced.wait(), timeout=5)
    deadline = time.monotonic() + 5
    while {name for name, _, _ in kube.writes} != {name for _, name in kube.bodies}:
        assert time.monotonic() < deadline, kube.writes
        await asyncio.sleep(0.005)
    return stop, task


def verdicts(kube: FakeKube) -> dict[str, str]:
    return {key[1]: (body["status"].get("attestation") or {}).get("verdict", "") for key, body in kube.bodies.items()}


def report_line(caplog: pytest.LogCaptureFixture) -> str:
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("shutdown wait done")]
    assert len(lines) == 1, lines
    return lines[0]


# --- the wait ------------------------------------------------------------------------------------


def test_with_nothing_alive_the_agent_exits_promptly(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> float:
        agent, kube, _ = make_agent({"w1": Worker(alive=False)}, shutdown_grace_seconds=30.0)
        stop, task = await started(agent, kube)
        begun = time.monotonic()
        stop.set()
        await asyncio.wait_for(task, timeout=5)
        return time.monotonic() - begun

    caplog.set_level(logging.INFO, logger="coroner.agent")
    elapsed = asyncio.run(scenario())
    assert elapsed < 1.0
    assert "waited=0 attested=0 resolvedOtherwise=0 stillAlive=0" in report_line(caplog)


@pytest.mark.parametrize(
    ("pinned", "shutdown_resync"),
    [
        # No resync at all in the grace: only the pidfd events can have found these exits.
        pytest.param(True, 3600.0, id="pinned: its pidfd event re-probes it"),
        pytest.param(False, 0.1, id="unpinned: the shutdown resync re-probes it"),
    ],
)
def test_every_exit_during_the_grace_is_attested_before_the_agent_exits(
    pinned: bool, shutdown_resync: float, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> tuple[FakeKube, FakeProber, float, float]:
        workers = {"w1": Worker(pinned=pinned), "w2": Worker(pinned=pinned)}
        agent, kube, prober = make_agent(workers, shutdown_grace_seconds=10.0, shutdown_resync_seconds=shutdown_resync)
        stop, task = await started(agent, kube)
        stop.set()
        await asyncio.sleep(0.3)
        assert not task.done(), "it waits while its workers live"
        exits = time.monotonic()
        for name, worker in workers.items():
            worker.alive = False
            if pinned:
                agent.on_pidfd(("jobs", name))
            await asyncio.sleep(0.05)
        await asyncio.wait_for(task, timeout=5)
        return kube, prober, exits, time.monotonic()

    caplog.set_level(logging.INFO, logger="coroner.agent")
    kube, prober, exits, ended = asyncio.run(scenario())
    assert verdicts(kube) == {"w1": "Dead", "w2": "Dead"}
    dead_at = [at for _, verdict, at in kube.writes if verdict == "Dead"]
    assert len(dead_at) == 2 and all(exits <= at <= ended for at in dead_at)
    assert ended - exits < 2.0, "exits once nothing is left, long before the 10 s grace"
    assert "waited=2 attested=2 resolvedOtherwise=0 stillAlive=0" in report_line(caplog)
    assert (prober.rescans > 1) == (not pinned), "the final sweep rescans once; the shutdown resync more"


def test_a_worker_that_never_exits_holds_the_agent_no_longer_than_the_grace(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> tuple[FakeKube, float, int]:
        agent, kube, _ = make_agent({"stuck": Worker(), "gone": Worker()}, shutdown_grace_seconds=0.5)
        stop, task = await started(agent, kube)
        renewals_before = len(kube.renewals)
        begun = time.monotonic()
        stop.set()
        await asyncio.sleep(0.1)
        agent.prober.workers["gone"].alive = False  # type: ignore[attr-defined]
        agent.on_pidfd(("jobs", "gone"))
        await asyncio.wait_for(task, timeout=5)
        return kube, time.monotonic() - begun, len(kube.renewals) - renewals_before

    caplog.set_level(logging.INFO, logger="coroner.agent")
    kube, elapsed, renewals = asyncio.run(scenario())
    assert 0.5 <= elapsed < 1.5
    assert verdicts(kube) == {"stuck": "Alive", "gone": "Dead"}
    assert renewals >= 3, "the Lease is renewed all through the wait"
    assert "waited=2 attested=1 resolvedOtherwise=0 stillAlive=1" in report_line(caplog)


def test_released_and_deleted_registrations_end_the_wait_without_an_attestation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> float:
        agent, kube, _ = make_agent({"clean": Worker(), "deleted": Worker()}, shutdown_grace_seconds=10.0)
        stop, task = await started(agent, kube)
        stop.set()
        await asyncio.sleep(0.05)
        released = copy.deepcopy(kube.bodies[("jobs", "clean")])
        released["status"]["conditions"] = [
            {"type": ConditionType.RELEASED.value, "status": "True", "reason": "CleanExit", "message": "",
             "lastTransitionTime": "2026-11-30T18:00:00Z"},
        ]  # fmt: skip
        begun = time.monotonic()
        agent.on_event("MODIFIED", released)
        agent.on_event("DELETED", kube.bodies[("jobs", "deleted")])
        await asyncio.wait_for(task, timeout=5)
        return time.monotonic() - begun

    caplog.set_level(logging.INFO, logger="coroner.agent")
    assert asyncio.run(scenario()) < 1.0
    assert "waited=2 attested=0 resolvedOtherwise=2 stillAlive=0" in report_line(caplog)


def test_the_wait_ignores_dead_terminal_and_foreign_registrations() -> None:
    extra = [
        registration("already-dead", pid=7, attestation=dead_attestation(7)),
        registration("foreign", pid=8, node="node-b"),
    ]
    agent, _, _ = make_agent({"live": Worker()}, extra=extra)
    agent.on_relist([registration("live", pid=100), *extra])
    assert agent.drain.awaited() == {("jobs", "live")}


def test_an_agent_stopped_before_its_first_list_waits_for_it_within_the_grace() -> None:
    async def scenario() -> tuple[int, int]:
        agent, kube, _ = make_agent({"w": Worker()}, shutdown_grace_seconds=0.3)
        report_task = asyncio.create_task(agent.drain.wait(grace=0.3))
        await asyncio.sleep(0.05)
        agent.on_relist([copy.deepcopy(b) for b in kube.bodies.values()])
        report = await report_task
        return report.waited, report.still_alive

    assert asyncio.run(scenario()) == (1, 1)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    plan=st.lists(st.tuples(st.booleans(), st.none() | st.floats(min_value=0.0, max_value=0.2)), min_size=1, max_size=5)
)
def test_the_report_accounts_for_every_registration_waited_for(plan: list[tuple[bool, float | None]]) -> None:
    """Any mix of workers that exit (pinned or not) at any moment, or never: every one that exited
    before the grace ended is attested Dead, the rest are counted still alive, and the counts add up."""

    async def scenario() -> None:
        workers = {f"w{i}": Worker(pinned=pinned) for i, (pinned, _) in enumerate(plan)}
        agent, kube, _ = make_agent(workers, shutdown_grace_seconds=0.4, shutdown_resync_seconds=0.05)
        agent.inputs.stop_watch()  # no watch thread: the list is delivered by hand
        agent.on_relist([copy.deepcopy(b) for b in kube.bodies.values()])
        runners = agent.workers()
        try:

            async def exit_later(name: str, delay: float) -> None:
                await asyncio.sleep(delay)
                workers[name].alive = False
                if workers[name].pinned:
                    agent.on_pidfd(("jobs", name))

            exits = [
                asyncio.create_task(exit_later(name, delay))
                for name, (_, delay) in zip(workers, plan, strict=True)
                if delay is not None
            ]
            report = await agent.drain.wait(grace=0.4)
            await asyncio.gather(*exits)
        finally:
            for runner in runners:
                runner.cancel()
            await asyncio.gather(*runners, return_exceptions=True)
        exiting = sum(1 for _, delay in plan if delay is not None)
        assert report.waited == len(plan)
        assert report.attested + report.still_alive + report.resolved_otherwise == report.waited
        assert report.resolved_otherwise == 0
        assert report.attested == exiting, (plan, report)
        assert report.still_alive == len(plan) - exiting
        if exiting == len(plan):
            assert report.seconds < 0.4
        dead = {name for name, verdict in verdicts(kube).items() if verdict == "Dead"}
        assert dead == {name for name, (_, delay) in zip(workers, plan, strict=True) if delay is not None}
        assert all(verdict != "Dead" for name, verdict in verdicts(kube).items() if workers[name].alive)

    asyncio.run(scenario())


def test_a_mass_death_costs_the_wait_o_of_changes_not_o_of_registrations_per_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each attestation wakes the wait; it re-reads only what changed. Measured: 900 parses for 300
    deaths; with a full scan per wake-up (the first version) 21,900, growing as N^2."""
    count = 300
    parses = 0
    real_parse = model.parse_registration

    def counting(obj: object) -> model.Registration:
        nonlocal parses
        parses += 1
        return real_parse(obj)

    async def scenario() -> int:
        workers = {f"w{i}": Worker() for i in range(count)}
        agent, kube, _ = make_agent(workers, shutdown_grace_seconds=10.0)
        agent.inputs.stop_watch()
        agent.on_relist([copy.deepcopy(b) for b in kube.bodies.values()])
        runners = agent.workers()
        try:
            while len(kube.writes) < count:
                await asyncio.sleep(0.01)
            drain = asyncio.create_task(agent.drain.wait(grace=10.0))
            await asyncio.sleep(0.01)
            monkeypatch.setattr(model, "parse_registration", counting)
            for name, worker in workers.items():
                worker.alive = False
                agent.on_pidfd(("jobs", name))
            report = await asyncio.wait_for(drain, timeout=10)
        finally:
            for runner in runners:
                runner.cancel()
            await asyncio.gather(*runners, return_exceptions=True)
        assert (report.waited, report.attested, report.still_alive) == (count, count, 0)
        return parses

    # Per death: the attest step parses once; the wait re-reads that one registration (and counts it).
    parsed = asyncio.run(scenario())
    print(f"\n{parsed} parses for {count} deaths")
    assert parsed <= 4 * count
