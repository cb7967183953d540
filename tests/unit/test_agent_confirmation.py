"""A death read from /proc is attested only once the agent has seen it twice.

Without heartbeats there is no worker-side witness, so a ProcAbsent or BootBoundary verdict is
corroborated by the agent's own repeated observation: first seen, remembered, re-probed after
`absence_confirm_seconds`, and written once, with both looks — never over silence that cannot
happen. A pidfd death is the kernel's word and is written at once.
"""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest

from coroner.core import model
from coroner.core.model import Key
from coroner.core.reasons import Evidence, Verdict
from coroner_agent.service import Agent, AgentSettings
from coroner_agent.verdict import ProbeResult
from unit.test_agent_shutdown import BOOT, NODE, FakeKube, registration

pytestmark = pytest.mark.unit


class ScriptedProber:
    """Answers each probe of a key from a script (the last answer repeats)."""

    def __init__(self, script: list[tuple[Verdict, Evidence]]) -> None:
        self.script = script
        self.probes = 0

    def boot_id(self) -> str | None:
        return BOOT

    def host_id(self) -> str:
        return "host-a"

    def rescan(self) -> None:
        pass

    def probe(self, *, key: Key, registration: model.Registration) -> ProbeResult:
        verdict, evidence = self.script[min(self.probes, len(self.script) - 1)]
        self.probes += 1
        return ProbeResult(verdict=verdict, evidence=evidence, detail="scripted")

    def forget(self, *, key: Key) -> None:
        pass


ABSENT = (Verdict.DEAD, Evidence.PROC_ABSENT)
REUSED = (Verdict.REUSED, Evidence.START_TIME_DIFFERS)
ALIVE = (Verdict.ALIVE, Evidence.PIDFD_PINNED)
EXITED = (Verdict.DEAD, Evidence.PIDFD_EXITED)
KEY = ("jobs", "w")


async def _run(script: list[tuple[Verdict, Evidence]], *, confirm: float, settle: float) -> FakeKube:
    kube = FakeKube([registration("w", pid=42)])
    prober = ScriptedProber(script)
    agent = Agent(
        kube=kube,  # type: ignore[arg-type]
        prober=prober,
        settings=AgentSettings(node_name=NODE, absence_confirm_seconds=confirm),
        identity="agent",
    )
    agent.on_relist([kube.bodies[KEY]])
    workers = agent.workers()
    await asyncio.sleep(settle)
    for worker in workers:
        worker.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    return kube


def _attestation(kube: FakeKube) -> dict[str, Any]:
    return dict(kube.bodies[KEY]["status"].get("attestation") or {})


def test_a_proc_absence_is_written_once_confirmed_with_both_looks() -> None:
    kube = asyncio.run(_run([ABSENT, ABSENT], confirm=0.2, settle=0.6))
    assert [w[1] for w in kube.writes] == ["Dead"], "one write, after the confirming look"
    written = _attestation(kube)
    first = model.parse_time(written["firstObservedTime"])
    last = model.parse_time(written["observedTime"])
    assert first is not None and last is not None
    assert (last - first).total_seconds() >= 0.2


def test_nothing_is_written_before_the_window() -> None:
    kube = asyncio.run(_run([ABSENT, ABSENT], confirm=5.0, settle=0.3))
    assert kube.writes == []


def test_a_different_answer_on_the_second_look_starts_over() -> None:
    # Absent, then alive (a /proc glitch, or the record was wrong): the absence is never written.
    kube = asyncio.run(_run([ABSENT, ALIVE], confirm=0.1, settle=0.5))
    assert [w[1] for w in kube.writes] == ["Alive"]
    assert "firstObservedTime" not in _attestation(kube)


def test_a_pidfd_death_is_written_at_once() -> None:
    kube = asyncio.run(_run([EXITED], confirm=60.0, settle=0.2))
    assert [w[1] for w in kube.writes] == ["Dead"]
    assert _attestation(kube)["evidence"] == "PidfdExited"


def test_a_reused_sighting_is_the_first_look_at_the_absence() -> None:
    # A Reused registration turns Dead as fast as a death: the number was held by another process (Reused) before it
    # was held by none, so the absence was first seen then; its confirmation counts from there.
    async def scenario() -> FakeKube:
        kube = FakeKube([registration("w", pid=42)])
        prober = ScriptedProber([REUSED, REUSED, ABSENT])
        agent = Agent(
            kube=kube,  # type: ignore[arg-type]
            prober=prober,
            settings=AgentSettings(node_name=NODE, absence_confirm_seconds=0.3),
            identity="agent",
        )

        async def probed(count: int) -> None:  # no fixed sleeps: a loaded machine only waits longer
            while prober.probes < count:
                await asyncio.sleep(0.01)

        agent.on_relist([kube.bodies[KEY]])
        workers = agent.workers()
        await probed(1)
        await asyncio.sleep(0.35)  # the confirmation window (0.3 s) has passed since the first look
        agent.enqueue(KEY)  # the holder of the number exits (its pidfd event): still Reused here
        await probed(2)
        agent.enqueue(KEY)  # and now absent: written at once, the first look was the Reused one
        await probed(3)
        for _ in range(500):  # the write follows the third probe (a bound, not a timing)
            if len(kube.writes) >= 2:
                break
            await asyncio.sleep(0.01)
        # At once: on the third look itself, not on a later one after a confirmation window.
        assert prober.probes == 3
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        return kube

    kube = asyncio.run(scenario())
    assert [w[1] for w in kube.writes] == ["Reused", "Dead"]
    written = _attestation(kube)
    first = model.parse_time(written["firstObservedTime"])
    last = model.parse_time(written["observedTime"])
    assert first is not None and last is not None and (last - first).total_seconds() >= 0.3


def test_the_confirmation_window_runs_on_the_injected_clock() -> None:
    """No sleeps and nothing patched: the agent's clock is a parameter and its timer is data
    (`Result.requeue_at`), so a test (or the simulation) moves time by hand."""
    moments = [datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)]

    async def scenario() -> tuple[FakeKube, list[Any]]:
        kube = FakeKube([registration("w", pid=42)])
        agent = Agent(
            kube=kube,  # type: ignore[arg-type]
            prober=ScriptedProber([ABSENT]),
            settings=AgentSettings(node_name=NODE, absence_confirm_seconds=10.0),
            identity="agent",
            clock=lambda: moments[-1],
        )
        agent.on_relist([kube.bodies[KEY]])
        first = await agent.reconciler.reconcile(KEY)
        moments.append(moments[0] + datetime.timedelta(seconds=10))
        second = await agent.reconciler.reconcile(KEY)
        await agent.lease.renew_once()
        return kube, [first.requeue_at, second.requeue_at]

    kube, requeues = asyncio.run(scenario())
    assert requeues == [moments[1], None], "back exactly when the window ends, then done"
    written = _attestation(kube)
    assert (written["verdict"], written["evidence"]) == ("Dead", "ProcAbsent")
    assert model.parse_time(written["firstObservedTime"]) == moments[0]
    assert model.parse_time(written["observedTime"]) == moments[1]
    assert kube.renewed_at == [moments[1]], "the Lease's renewTime is the same clock's"
