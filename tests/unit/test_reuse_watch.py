"""A Reused verdict moves as fast as a death: the process holding the recorded number is pinned with
a pidfd, and its exit re-probes the registration — which concludes only what that probe sees.

The probe half runs against `test_probe_fake`'s fake /proc; the bookkeeping half (which
registration watches which holder, when a holder's pidfd is closed, the retry while a holder is an
unreaped zombie) runs `ProcProber` over the same fake.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coroner.core import model
from coroner.core.model import Key
from coroner.core.reasons import Evidence, Verdict
from coroner_agent import prober as prober_module
from coroner_agent.pidfds import PidfdTable
from coroner_agent.prober import ProcProber
from unit.test_probe_fake import (
    BOOT,
    CHILD,
    NODE,
    ROOT,
    Agent,
    FakeProc,
    FakeProcess,
    expect,
    facts,
    key,
    oserror,
    sleeper,
)

pytestmark = pytest.mark.unit

RECORDED = key(start=500)
HOLDER = key(start=777)


def reused_world() -> FakeProc:
    """The recorded incarnation (pid 4242, start 500) is gone; another process (start 777) holds 4242."""
    return FakeProc(sleeper(start_time=777))


# --- the probe: the holder is pinned, and its exit proves nothing by itself ----------------------


def test_the_holder_of_a_reused_number_is_pinned_and_reported() -> None:
    agent = Agent(reused_world())
    result = agent.probe(RECORDED)
    expect(result, Verdict.REUSED, Evidence.START_TIME_DIFFERS)
    assert result.reuser == HOLDER and not result.reuser_exited
    assert agent.pidfds.get(HOLDER) is not None and agent.pidfds.get(RECORDED) is None
    assert "pinned by a pidfd" in result.detail
    # The next probe reuses the pin: one poll, no second pidfd.
    opened = agent.proc.calls["open"]
    expect(agent.probe(RECORDED), Verdict.REUSED, Evidence.START_TIME_DIFFERS)
    assert agent.proc.calls["open"] == opened and len(agent.proc.open_fds) == 1


def _exited(proc: FakeProc) -> None:
    proc.processes[4242].exited, proc.processes[4242].state = True, "Z"


def _reaped(proc: FakeProc) -> None:
    proc.reap(4242)


def _reused_again(proc: FakeProc) -> None:
    proc.reap(4242)
    proc.add(sleeper(start_time=999))


@pytest.mark.parametrize(
    ("after_the_holder_exits", "node", "verdict", "evidence", "reuser"),
    [
        pytest.param(_exited, facts(), Verdict.REUSED, Evidence.START_TIME_DIFFERS, HOLDER, id="zombie-still-holds-it"),
        pytest.param(_reaped, facts(), Verdict.DEAD, Evidence.PROC_ABSENT, None, id="reaped-number-free"),
        pytest.param(
            _reused_again, facts(), Verdict.REUSED, Evidence.START_TIME_DIFFERS, key(start=999), id="taken-again"
        ),
        pytest.param(
            _reaped,
            facts(agent_pid_namespace=CHILD, proc_pid_namespace=CHILD),
            Verdict.UNKNOWN,
            Evidence.NOT_ROOT_PID_NAMESPACE,
            None,
            id="free-but-not-seen-from-the-root-namespace",
        ),
    ],
)
def test_the_re_probe_after_the_holder_exits_decides_on_what_it_sees(
    after_the_holder_exits: Any, node: Any, verdict: Verdict, evidence: Evidence, reuser: Any
) -> None:
    proc = reused_world()
    agent = Agent(proc, node=node)
    expect(agent.probe(RECORDED), Verdict.REUSED, Evidence.START_TIME_DIFFERS)
    after_the_holder_exits(proc)
    result = agent.probe(RECORDED)
    expect(result, verdict, evidence)
    assert result.reuser == reuser
    assert result.reuser_exited == (after_the_holder_exits is _exited)


@pytest.mark.parametrize(
    ("holder", "why"),
    [
        pytest.param(FakeProcess(host_pid=4242, tgid=4000, start_time=777), "a thread", id="a-thread"),
    ],
)
def test_a_thread_holding_the_number_is_not_pinned(holder: FakeProcess, why: str) -> None:
    proc = FakeProc(FakeProcess(host_pid=4000, start_time=100))
    proc.threads[4242] = holder
    result = Agent(proc).probe(RECORDED)
    expect(result, Verdict.REUSED, Evidence.START_TIME_DIFFERS)
    assert result.reuser is None and not proc.open_fds and "resync" in result.detail


def test_a_holder_in_a_child_namespace_is_pinned_under_its_own_incarnation() -> None:
    proc = FakeProc(FakeProcess(host_pid=4242, pid_namespace=CHILD, nspid=(4242, 7), start_time=900))
    agent = Agent(proc)
    result = agent.probe(RECORDED)
    expect(result, Verdict.REUSED, Evidence.START_TIME_DIFFERS)
    assert result.reuser == key(ns=CHILD, pid=7, start=900)
    assert agent.pidfds.get(key(ns=CHILD, pid=7, start=900)) is not None


@pytest.mark.parametrize(
    ("setup", "detail"),
    [
        pytest.param(lambda proc: proc.fault("open", 4242, oserror(errno.EMFILE)), "not pinned", id="EMFILE"),
        pytest.param(lambda proc: setattr(proc, "fdinfo_offset", 3), "cannot be pinned", id="other-namespace"),
    ],
)
def test_a_holder_that_cannot_be_pinned_leaves_reused_to_the_resync(setup: Any, detail: str) -> None:
    proc = reused_world()
    setup(proc)
    agent = Agent(proc)
    result = agent.probe(RECORDED)
    expect(result, Verdict.REUSED, Evidence.START_TIME_DIFFERS)
    assert result.reuser == HOLDER and detail in result.detail
    assert not proc.open_fds and agent.pidfds.unpinned == 1


def test_the_holder_counts_against_the_same_pidfd_budget() -> None:
    proc = FakeProc(sleeper(start_time=777), sleeper(host_pid=5000, start_time=600))
    agent = Agent(proc, pidfds=PidfdTable(max_pinned=1))
    expect(agent.probe(key(pid=5000, start=600)), Verdict.ALIVE, Evidence.PIDFD_PINNED)  # the budget is spent
    result = agent.probe(RECORDED)
    expect(result, Verdict.REUSED, Evidence.START_TIME_DIFFERS)
    assert result.reuser == HOLDER and "limit 1" in result.detail
    assert len(agent.pidfds) == 1 and agent.pidfds.unpinned == 1 and proc.calls["open"] == 1


def test_a_holder_that_vanishes_under_the_pin_is_resolved_again() -> None:
    proc = reused_world()
    proc.then("open", 4242, lambda: proc.reap(4242))  # reaped right after pidfd_open
    agent = Agent(proc)
    expect(agent.probe(RECORDED), Verdict.DEAD, Evidence.PROC_ABSENT)
    assert not proc.open_fds and len(agent.pidfds) == 0


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.sampled_from(["exit", "reap", "take", "probe"]), max_size=12))
def test_dead_only_when_nothing_holds_the_number(steps: list[str]) -> None:
    """Whatever the holders of the number do between probes, the recorded incarnation is Dead only
    when no process holds the number, and Reused only when one does (the holder's exit alone never
    decides); the pidfd kept is always the current holder's."""
    proc = reused_world()
    agent = Agent(proc)
    starts = iter(range(1000, 2000))
    for step in [*steps, "probe"]:
        holder = proc.processes.get(4242)
        if step == "exit" and holder is not None:
            holder.exited, holder.state = True, "Z"
        elif step == "reap" and holder is not None:
            proc.reap(4242)
        elif step == "take" and holder is None:
            proc.add(sleeper(start_time=next(starts)))
        elif step == "probe":
            result = agent.probe(RECORDED)
            holder = proc.processes.get(4242)
            if holder is None:
                expect(result, Verdict.DEAD, Evidence.PROC_ABSENT)
            else:
                expect(result, Verdict.REUSED, Evidence.START_TIME_DIFFERS)
                assert result.reuser == key(start=holder.start_time)
                assert result.reuser_exited == holder.exited
                assert agent.pidfds.get(key(start=holder.start_time)) is not None


# --- the prober: who watches which holder, and for how long ------------------------------------


def body(name: str, *, pid: int = 4242, start: int = 500, ns: int = ROOT) -> model.Registration:
    return model.parse_registration(
        {
            "metadata": {"namespace": "jobs", "name": name, "creationTimestamp": "2026-11-30T17:00:00Z"},
            "spec": {
                "nodeName": NODE,
                "incarnation": {"bootId": BOOT, "pidNamespace": str(ns), "pid": pid, "startTime": str(start)},
            },
        }
    )


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


class Prober:
    """A ProcProber over a fake /proc; `fired` collects the registrations it asks to re-probe."""

    def __init__(self, proc: FakeProc, loop: asyncio.AbstractEventLoop, *, max_pinned: int = 100):
        self.fired: list[Key] = []
        self.proc = proc
        self.real = ProcProber(
            node_name=NODE,
            loop=loop,
            on_exit=self.fired.append,
            reader=proc,
            pidfd_table=lambda fired: PidfdTable(max_pinned=max_pinned, close=proc.close_pidfd),
            node_facts=facts,
        )

    def probe(self, name: str, **incarnation: Any) -> tuple[Verdict, Evidence]:
        outcome = self.real.probe(key=("jobs", name), registration=body(name, **incarnation))
        return outcome.verdict, outcome.evidence


def test_the_holders_exit_re_probes_every_registration_that_watches_it(loop: asyncio.AbstractEventLoop) -> None:
    p = Prober(reused_world(), loop)
    assert p.probe("old-a") == (Verdict.REUSED, Evidence.START_TIME_DIFFERS)
    assert p.probe("old-b") == (Verdict.REUSED, Evidence.START_TIME_DIFFERS)
    assert p.real.watched_reusers == 1 and len(p.proc.open_fds) == 1  # one pidfd for the one holder
    p.real.fired(HOLDER)
    assert p.fired == [("jobs", "old-a"), ("jobs", "old-b")]
    p.proc.reap(4242)
    assert p.probe("old-a") == (Verdict.DEAD, Evidence.PROC_ABSENT)
    assert len(p.proc.open_fds) == 1, "old-b still watches the holder"
    p.real.forget(key=("jobs", "old-b"))
    assert not p.proc.open_fds and p.real.watched_reusers == 0 and len(p.real.pidfds) == 0


def test_a_holder_that_is_itself_registered_shares_one_pidfd_until_both_let_go(loop: asyncio.AbstractEventLoop) -> None:
    p = Prober(reused_world(), loop)
    assert p.probe("old") == (Verdict.REUSED, Evidence.START_TIME_DIFFERS)
    assert p.probe("new", start=777) == (Verdict.ALIVE, Evidence.PIDFD_PINNED)  # answered by the same pidfd
    assert len(p.proc.open_fds) == 1
    p.real.fired(HOLDER)
    assert sorted(p.fired) == [("jobs", "new"), ("jobs", "old")]
    p.real.forget(key=("jobs", "old"))
    assert len(p.proc.open_fds) == 1, "the registration of the holder itself still names it"
    p.real.forget(key=("jobs", "new"))
    assert not p.proc.open_fds


def test_an_unpinned_holder_is_uncounted_once_nothing_watches_it(loop: asyncio.AbstractEventLoop) -> None:
    p = Prober(reused_world(), loop, max_pinned=0)
    assert p.probe("old") == (Verdict.REUSED, Evidence.START_TIME_DIFFERS)
    assert p.real.pidfds.unpinned == 1 and not p.proc.open_fds
    p.real.forget(key=("jobs", "old"))
    assert p.real.pidfds.unpinned == 0


def test_an_unreaped_holder_is_looked_at_again_with_a_backoff_until_it_is_reaped(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prober_module, "REUSER_RETRY_SECONDS", 0.01)
    monkeypatch.setattr(prober_module, "REUSER_RETRY_MAX_SECONDS", 0.02)
    p = Prober(reused_world(), loop)
    assert p.probe("old") == (Verdict.REUSED, Evidence.START_TIME_DIFFERS)
    _exited(p.proc)  # no event will come for the reap: the prober must look again by itself

    async def until_dead() -> int:
        rounds = 0
        p.real.fired(HOLDER)
        while True:
            while not p.fired:
                await asyncio.sleep(0.002)
            p.fired.clear()
            rounds += 1
            if rounds == 3:
                p.proc.reap(4242)  # the holder's parent reaps it at last
            if p.probe("old") == (Verdict.DEAD, Evidence.PROC_ABSENT):
                return rounds

    # Round 1 is the holder's pidfd event; rounds 2 and 3 are the prober's own retries.
    assert loop.run_until_complete(asyncio.wait_for(until_dead(), timeout=5)) == 3
    assert not p.real._retry_handles and not p.real._retry_delays and not p.proc.open_fds


def test_forgetting_a_registration_cancels_its_retry(loop: asyncio.AbstractEventLoop) -> None:
    p = Prober(reused_world(), loop)
    _exited(p.proc)
    assert p.probe("old") == (Verdict.REUSED, Evidence.START_TIME_DIFFERS)
    assert p.real._retry_handles
    p.real.forget(key=("jobs", "old"))
    assert not p.real._retry_handles and not p.proc.open_fds
    loop.run_until_complete(asyncio.sleep(prober_module.REUSER_RETRY_SECONDS * 2))
    assert p.fired == []
