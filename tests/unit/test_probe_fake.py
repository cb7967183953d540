"""The probe against a fake /proc: every verdict and every Unknown, without a real process or a sleep.

`FakeProc` is a node's process table plus fault injection (an errno for the next read of one file
of one pid; a hook that changes the world right after a read, to stage the races the probe closes).
The tables walk the verdicts in the order `probe` decides them; the properties then say what must
hold in any world: a live incarnation is never Dead, and Dead always has a reason that proves it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import itertools
import os
import pathlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coroner.core import api
from coroner.core.exits import Ending, Exit
from coroner.core.procfs import IncarnationKey
from coroner.core.reasons import Evidence, Verdict
from coroner_agent.pidfds import PidfdTable, PidfdWatcher
from coroner_agent.pidindex import PidIndex
from coroner_agent.probe import probe
from coroner_agent.proc import LocalNode
from coroner_agent.verdict import ProbeResult

pytestmark = pytest.mark.unit

ROOT = api.ROOT_PID_NAMESPACE_INODE
CHILD = 4026532178
OTHER_CHILD = 4026532999
BOOT = "6af8093f-1f8e-4864-bd25-cc70d02449a1"
OTHER_BOOT = "11111111-2222-4333-8444-555555555555"
HOST_CLOCK = 4026531834  # the initial time namespace
OTHER_CLOCK = 4026532400
NODE = "node-a"


#: What a kernel before 6.15 says of any exit.
UNREAD = Exit(Ending.UNKNOWN)


@dataclasses.dataclass(eq=False)
class FakeProcess:
    """One task as a root-namespace /proc shows it."""

    host_pid: int
    start_time: int
    pid_namespace: int = ROOT
    nspid: tuple[int, ...] = ()
    state: str = "S"
    threads: int = 1
    tgid: int = 0
    exited: bool = False
    """The whole thread group exited (a pidfd for it is readable); it stays until reaped."""
    exit: Exit = UNREAD
    """How it ended, as the kernel says once it is reaped."""
    generation: int = 0
    time_namespace: int = HOST_CLOCK
    """Whose CLOCK_BOOTTIME the process reads: a launcher in another one records its child's start
    time shifted by that namespace's offset."""

    def __post_init__(self) -> None:
        self.nspid = self.nspid or (self.host_pid,)
        self.tgid = self.tgid or self.host_pid
        self.generation = self.generation or next(_GENERATIONS)

    def stat(self) -> str:
        after = [self.state, "1", "1", "1", "0", "-1", "0", "0", "0", "0", "0", "0", "0", "0", "0", "20", "0"]
        after += [str(self.threads), "0", str(self.start_time), "0", "0", "0", "0"]
        return f"{self.host_pid} (fake) {' '.join(after)}\n"

    def status(self) -> str:
        nspid = "\t".join(map(str, self.nspid))
        return (
            f"Name:\tfake\nState:\t{self.state} (x)\nTgid:\t{self.tgid}\nPid:\t{self.host_pid}\nPPid:\t1\n"
            f"NSpid:\t{nspid}\nThreads:\t{self.threads}\n"
        )


_GENERATIONS = itertools.count(1000)


def oserror(code: int) -> OSError:
    return OSError(code, os.strerror(code))


class FakeProc:
    """A ProcReader over FakeProcess records, with fault injection and call counting."""

    def __init__(self, *processes: FakeProcess) -> None:
        self.processes: dict[int, FakeProcess] = {p.host_pid: p for p in processes}
        self.threads: dict[int, FakeProcess] = {}  # /proc/<tid> resolves but is not listed
        self.faults: dict[tuple[str, int], list[OSError | str]] = {}
        self.after: dict[tuple[str, int], list[Callable[[], None]]] = {}
        self.calls: dict[str, int] = {}
        self.fds: dict[int, FakeProcess] = {}
        self.closed: list[int] = []
        self.fdinfo_offset = 0  # simulates an agent whose pid namespace is not /proc's
        self.list_error: OSError | None = None
        self.mount_options: tuple[str, ...] | OSError = ("rw", "nosuid", "rw")
        self.agent_time_namespace = HOST_CLOCK
        self.pidfs = True
        self._next_fd = itertools.count(100)

    # world changes
    def add(self, process: FakeProcess) -> FakeProcess:
        self.processes[process.host_pid] = process
        return process

    def reap(self, host_pid: int) -> None:
        del self.processes[host_pid]

    def fault(self, op: str, pid: int, *outcomes: OSError | str) -> None:
        """The next calls of `op` for `pid` raise these errors (or return these texts), in order."""
        self.faults.setdefault((op, pid), []).extend(outcomes)

    def then(self, op: str, pid: int, change: Callable[[], None]) -> None:
        """Right after the next `op` for `pid` returns, change the world (a race, staged)."""
        self.after.setdefault((op, pid), []).append(change)

    def _task(self, op: str, pid: int) -> FakeProcess:
        self.calls[op] = self.calls.get(op, 0) + 1
        queued = self.faults.get((op, pid))
        if queued:
            outcome = queued.pop(0)
            if isinstance(outcome, OSError):
                raise outcome
        task = self.processes.get(pid) or self.threads.get(pid)
        if task is None:
            raise oserror(errno.ENOENT)
        return task

    def _done(self, op: str, pid: int) -> None:
        changes = self.after.get((op, pid))
        if changes:
            changes.pop(0)()

    def _text(self, op: str, pid: int, render: Callable[[FakeProcess], str]) -> str:
        queued = self.faults.get((op, pid))
        if queued and isinstance(queued[0], str):
            self.calls[op] = self.calls.get(op, 0) + 1
            return str(queued.pop(0))
        text = render(self._task(op, pid))
        self._done(op, pid)
        return text

    # ProcReader
    def list_pids(self) -> list[tuple[int, int]]:
        self.calls["list"] = self.calls.get("list", 0) + 1
        if self.list_error is not None:
            raise self.list_error
        return [(pid, p.generation) for pid, p in self.processes.items()]

    def read_stat(self, pid: int) -> str:
        return self._text("stat", pid, FakeProcess.stat)

    def read_status(self, pid: int) -> str:
        return self._text("status", pid, FakeProcess.status)

    def read_pid_namespace_link(self, pid: int) -> str:
        return self._text("link", pid, lambda task: f"pid:[{task.pid_namespace}]")

    def read_time_namespace_link(self, pid: int) -> str:
        if pid == self.self_pid() and pid not in self.processes:
            return f"time:[{self.agent_time_namespace}]"
        return self._text("time", pid, lambda task: f"time:[{task.time_namespace}]")

    def self_pid(self) -> int:
        return 1

    def open_pidfd(self, pid: int) -> int:
        task = self._task("open", pid)
        if pid not in self.processes:
            raise oserror(errno.ENOENT)  # a thread id: pidfd_open wants a process
        fd = next(self._next_fd)
        self.fds[fd] = task
        self._done("open", pid)
        return fd

    def pidfd_pid(self, fd: int) -> int | None:
        task = self.fds[fd]
        if self.processes.get(task.host_pid) is not task:
            return None  # reaped
        return task.host_pid + self.fdinfo_offset

    def pidfd_exited(self, fd: int) -> bool:
        self.calls["poll"] = self.calls.get("poll", 0) + 1
        return self.fds[fd].exited

    def pidfd_exit(self, fd: int) -> Exit:
        task = self.fds[fd]
        return task.exit if self.processes.get(task.host_pid) is not task else Exit(Ending.UNREAPED)

    def close_pidfd(self, fd: int) -> None:
        assert fd in self.fds and fd not in self.closed, f"fd {fd} closed twice or never opened"
        self.closed.append(fd)

    def pidfd_inode(self, fd: int) -> int | None:
        # A process's generation stands for its pidfs inode: one per process, never reused.
        task = self.fds[fd]
        if task.host_pid in self.processes:
            self._task("inode", task.host_pid)  # raises what a test queued for it
        return task.generation if self.pidfs else None

    def proc_mount_options(self) -> tuple[str, ...]:
        if isinstance(self.mount_options, OSError):
            raise self.mount_options
        return self.mount_options

    @property
    def open_fds(self) -> set[int]:
        return set(self.fds) - set(self.closed)


def facts(**changes: Any) -> LocalNode:
    values: dict[str, Any] = {
        "node_name": NODE, "boot_id": BOOT, "host_id": "host-a", "agent_pid_namespace": ROOT, "proc_pid_namespace": ROOT,
        "proc_hides_processes": False,
    }  # fmt: skip
    return LocalNode(**(values | changes))


def key(*, pid: int = 4242, start: int = 500, ns: int = ROOT, boot: str = BOOT, inode: int = 0) -> IncarnationKey:
    return IncarnationKey(boot_id=boot, pid_namespace=ns, pid=pid, start_time=start, pidfd_inode=inode)


@dataclasses.dataclass
class Agent:
    """One agent's state across probes: its index and its pidfd table, over one fake /proc."""

    proc: FakeProc
    node: LocalNode = dataclasses.field(default_factory=facts)
    index: PidIndex = dataclasses.field(default_factory=PidIndex)
    pidfds: PidfdTable = dataclasses.field(default_factory=lambda: PidfdTable(close=lambda fd: None))

    def __post_init__(self) -> None:
        self.pidfds = PidfdTable(max_pinned=self.pidfds.max_pinned, close=self.proc.close_pidfd)

    def probe(self, incarnation: Any, *, registration_node: str | None = NODE) -> ProbeResult:
        return probe(
            incarnation=incarnation,
            registration_node=registration_node,
            node=self.node,
            reader=self.proc,
            index=self.index,
            pidfds=self.pidfds,
        )


def sleeper(**changes: Any) -> FakeProcess:
    return FakeProcess(**({"host_pid": 4242, "start_time": 500} | changes))


def expect(result: ProbeResult, verdict: Verdict, evidence: Evidence) -> None:
    assert (result.verdict, result.evidence) == (verdict, evidence), result.detail


# --- refusals before any /proc read -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Recorded:
    """What `coroner.core.model.Incarnation` carries: strings of digits, an int pid, any of them junk."""

    boot_id: object = BOOT
    pid_namespace: object = str(ROOT)
    pid: object = 4242
    start_time: object = "500"
    pidfd_inode: object = None


@pytest.mark.parametrize("registration_node", ["node-b", None, ""], ids=["other-node", "no-node", "empty"])
def test_a_registration_of_another_node_is_foreign(registration_node: str | None) -> None:
    agent = Agent(FakeProc(sleeper()))
    expect(agent.probe(key(), registration_node=registration_node), Verdict.UNKNOWN, Evidence.FOREIGN_NODE)
    assert agent.proc.calls == {}  # never even looked


@pytest.mark.parametrize(
    "recorded",
    [
        pytest.param(Recorded(boot_id=None), id="boot-missing"),
        pytest.param(Recorded(boot_id="boot-a"), id="boot-not-a-uuid"),
        pytest.param(Recorded(pid_namespace=None), id="pidns-missing"),
        pytest.param(Recorded(pid_namespace="pid:[4026531836]"), id="pidns-as-link"),
        pytest.param(Recorded(pid=0), id="pid-zero"),
        pytest.param(Recorded(pid=True), id="pid-true"),
        pytest.param(Recorded(start_time="5.0"), id="start-fraction"),
        pytest.param(Recorded(start_time=None), id="start-missing"),
        pytest.param(Recorded(pidfd_inode="0"), id="pidfd-inode-zero"),
        pytest.param(Recorded(pidfd_inode="x1"), id="pidfd-inode-not-digits"),
        pytest.param(Recorded(pidfd_inode=2**64), id="pidfd-inode-too-large"),
    ],
)
def test_garbage_incarnation_fields_are_invalid(recorded: Recorded) -> None:
    agent = Agent(FakeProc(sleeper()))
    expect(agent.probe(recorded), Verdict.UNKNOWN, Evidence.INVALID_INCARNATION)
    assert agent.proc.calls == {}


def test_the_model_shape_is_accepted() -> None:
    expect(Agent(FakeProc(sleeper())).probe(Recorded()), Verdict.ALIVE, Evidence.PIDFD_PINNED)


def test_an_unreadable_boot_id_is_unknown() -> None:
    agent = Agent(FakeProc(), node=facts(boot_id=None))
    expect(agent.probe(key()), Verdict.UNKNOWN, Evidence.BOOT_ID_UNREADABLE)


# --- Alive, and the pidfd it rests on -----------------------------------------------------------


def test_alive_is_pinned_and_then_answered_by_the_pidfd_alone() -> None:
    agent = Agent(FakeProc(sleeper()))
    first = agent.probe(key())
    expect(first, Verdict.ALIVE, Evidence.PIDFD_PINNED)
    assert first.host_pid == 4242 and len(agent.pidfds) == 1
    reads = dict(agent.proc.calls)
    second = agent.probe(key())
    expect(second, Verdict.ALIVE, Evidence.PIDFD_PINNED)
    # A pinned incarnation costs one poll per probe, no /proc read.
    assert {op: n - reads.get(op, 0) for op, n in agent.proc.calls.items() if n != reads.get(op, 0)} == {"poll": 1}


def test_the_start_time_is_rechecked_after_the_pidfd_is_opened() -> None:
    proc = FakeProc(sleeper())
    agent = Agent(proc)
    before = proc.calls.get("stat", 0)
    agent.probe(key())
    # stat twice to read the process, twice again after opening the pidfd.
    assert proc.calls["stat"] - before == 4 and proc.calls["open"] == 1


def test_a_pidfd_that_fires_is_death() -> None:
    proc = FakeProc(sleeper())
    agent = Agent(proc)
    agent.probe(key())
    proc.processes[4242].exited = True  # killed; still an unreaped zombie
    result = agent.probe(key())
    expect(result, Verdict.DEAD, Evidence.PIDFD_EXITED)
    proc.reap(4242)
    # Reaped too: the held pidfd still says so (stable evidence, no flip to ProcAbsent).
    expect(agent.probe(key()), Verdict.DEAD, Evidence.PIDFD_EXITED)


def test_a_pidfd_that_cannot_be_polled_proves_nothing() -> None:
    proc = FakeProc(sleeper())
    agent = Agent(proc)
    agent.probe(key())

    def broken(fd: int) -> bool:
        raise oserror(errno.EBADF)

    proc.pidfd_exited = broken  # type: ignore[method-assign]
    expect(agent.probe(key()), Verdict.UNKNOWN, Evidence.PIDFD_UNAVAILABLE)
    assert len(agent.pidfds) == 0 and not proc.open_fds


# --- the zombie trap ----------------------------------------------------------------------------


def test_a_zombie_whose_thread_group_exited_is_dead() -> None:
    agent = Agent(FakeProc(sleeper(state="Z", exited=True)))
    expect(agent.probe(key()), Verdict.DEAD, Evidence.PIDFD_EXITED)


def test_a_zombie_leader_with_running_threads_is_alive_never_dead() -> None:
    proc = FakeProc(sleeper(state="Z", threads=2))
    agent = Agent(proc)
    result = agent.probe(key())
    expect(result, Verdict.ALIVE, Evidence.PIDFD_PINNED)
    assert "state Z is not death" in result.detail
    expect(Agent(proc).probe(key()), Verdict.ALIVE, Evidence.PIDFD_PINNED)  # a fresh agent too
    proc.processes[4242].threads, proc.processes[4242].exited = 1, True  # the last thread returns
    expect(agent.probe(key()), Verdict.DEAD, Evidence.PIDFD_EXITED)


@pytest.mark.parametrize(
    ("process", "evidence"),
    [
        pytest.param(sleeper(), Evidence.PIDFD_UNAVAILABLE, id="live"),
        pytest.param(sleeper(state="Z", threads=2), Evidence.ZOMBIE_THREAD_GROUP_ALIVE, id="zombie-leader-threads"),
        pytest.param(sleeper(state="Z", exited=True), Evidence.PIDFD_UNAVAILABLE, id="exited-zombie"),
    ],
)
@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE, errno.EPERM], ids=["EMFILE", "ENFILE", "EPERM"])
def test_without_a_pidfd_nothing_is_concluded(process: FakeProcess, evidence: Evidence, code: int) -> None:
    proc = FakeProc(process)
    proc.fault("open", 4242, oserror(code))
    agent = Agent(proc)
    expect(agent.probe(key()), Verdict.UNKNOWN, evidence)
    assert agent.pidfds.unpinned == 1
    # The next probe (the resync) tries again.
    expect(
        agent.probe(key()),
        Verdict.DEAD if process.exited else Verdict.ALIVE,
        Evidence.PIDFD_EXITED if process.exited else Evidence.PIDFD_PINNED,
    )
    assert agent.pidfds.unpinned == 0


def test_at_the_limit_alive_is_checked_with_a_pidfd_that_is_not_kept() -> None:
    proc = FakeProc(sleeper(), sleeper(host_pid=4343, start_time=600))
    agent = Agent(proc, pidfds=PidfdTable(max_pinned=1))
    expect(agent.probe(key()), Verdict.ALIVE, Evidence.PIDFD_PINNED)
    second = agent.probe(key(pid=4343, start=600))
    expect(second, Verdict.ALIVE, Evidence.PIDFD_PINNED)
    assert "not kept" in second.detail
    assert len(agent.pidfds) == 1 and agent.pidfds.unpinned == 1 and len(proc.open_fds) == 1
    # Its death is then found by a later probe (the resync), without a pidfd event.
    proc.processes[4343].exited = True
    expect(agent.probe(key(pid=4343, start=600)), Verdict.DEAD, Evidence.PIDFD_EXITED)
    proc.reap(4343)
    expect(agent.probe(key(pid=4343, start=600)), Verdict.DEAD, Evidence.PROC_ABSENT)


def test_a_pidfd_pinned_to_what_proc_calls_another_pid_is_refused() -> None:
    # pidfd_open numbers pids in the agent's namespace; if that is not /proc's, the fd pins a stranger.
    proc = FakeProc(sleeper())
    proc.fdinfo_offset = 7
    agent = Agent(proc)
    expect(agent.probe(key()), Verdict.UNKNOWN, Evidence.PIDFD_UNAVAILABLE)
    assert not proc.open_fds and len(agent.pidfds) == 0


# --- Dead by absence, and when absence proves nothing -------------------------------------------


def test_absent_on_the_same_boot_is_dead() -> None:
    agent = Agent(FakeProc())
    expect(agent.probe(key()), Verdict.DEAD, Evidence.PROC_ABSENT)


@pytest.mark.parametrize(
    "node",
    [
        pytest.param(facts(agent_pid_namespace=CHILD, proc_pid_namespace=CHILD), id="agent-in-a-child-namespace"),
        pytest.param(facts(proc_pid_namespace=None), id="proc-namespace-unknown"),
        pytest.param(facts(agent_pid_namespace=None, proc_pid_namespace=None), id="nothing-known"),
    ],
)
def test_absence_seen_from_outside_the_root_namespace_is_unknown(node: LocalNode) -> None:
    agent = Agent(FakeProc(), node=node)
    expect(agent.probe(key()), Verdict.UNKNOWN, Evidence.NOT_ROOT_PID_NAMESPACE)
    expect(agent.probe(key(ns=CHILD, pid=2)), Verdict.UNKNOWN, Evidence.NOT_ROOT_PID_NAMESPACE)
    boundary = agent.probe(key(boot=OTHER_BOOT))
    expect(boundary, Verdict.UNKNOWN, Evidence.NOT_ROOT_PID_NAMESPACE)


@pytest.mark.parametrize("hides", [True, None], ids=["hidepid", "mount-options-unreadable"])
def test_absence_in_a_proc_that_may_hide_processes_is_unknown(hides: bool | None) -> None:
    # With hidepid=invisible, /proc answers ENOENT for a live process the reader may not ptrace,
    # exactly as for no process: the listing and the lookup prove nothing there.
    proc = FakeProc(sleeper())
    proc.fault("stat", 4242, oserror(errno.ENOENT))
    agent = Agent(proc, node=facts(proc_hides_processes=hides))
    result = agent.probe(key())
    expect(result, Verdict.UNKNOWN, Evidence.PROC_HIDES_PROCESSES)
    assert ("hidepid" if hides else "cannot be read") in result.detail
    unlisted = Agent(FakeProc(), node=facts(proc_hides_processes=hides))
    expect(unlisted.probe(key(ns=CHILD, pid=2)), Verdict.UNKNOWN, Evidence.PROC_HIDES_PROCESSES)
    expect(unlisted.probe(key(boot=OTHER_BOOT)), Verdict.UNKNOWN, Evidence.PROC_HIDES_PROCESSES)


def test_a_reused_number_is_reported_not_dead() -> None:
    agent = Agent(FakeProc(sleeper(start_time=777)))
    result = agent.probe(key(start=500))
    expect(result, Verdict.REUSED, Evidence.START_TIME_DIFFERS)
    # The pidfd kept is the holder's (its exit is the moment to look again), never the recorded one's.
    assert result.host_pid == 4242 and agent.pidfds.incarnations() == [key(start=777)]
    assert result.reuser == key(start=777) and not result.reuser_exited


# --- a pid namespace recreated under the recorded inode (a container restarted while its agent was away)


def restarted(*, init_start: int = 600, holder_start: int = 650, **holder: Any) -> FakeProc:
    """The recorded (CHILD, pid 7) started at 500; its namespace is gone, and a new one under the
    same inode has its own pid 1 and a worker that is pid 7 again."""
    return FakeProc(
        FakeProcess(host_pid=6000, pid_namespace=CHILD, nspid=(6000, 1), start_time=init_start),
        FakeProcess(
            **({"host_pid": 6007, "pid_namespace": CHILD, "nspid": (6007, 7), "start_time": holder_start} | holder)
        ),
    )


def test_a_number_held_in_a_namespace_younger_than_the_incarnation_is_dead() -> None:
    agent = Agent(restarted())
    result = agent.probe(key(ns=CHILD, pid=7, start=500))
    expect(result, Verdict.DEAD, Evidence.PID_NAMESPACE_RECREATED)
    assert result.host_pid == 6007 and "pid 1 (host pid 6000) started at 600" in result.detail
    assert not agent.pidfds.incarnations()  # nothing to watch: the verdict is final
    # The restarted worker itself, as its own registration records it, is alive.
    expect(agent.probe(key(ns=CHILD, pid=7, start=650)), Verdict.ALIVE, Evidence.PIDFD_PINNED)


def test_a_recorded_pid_1_whose_namespace_was_recreated_is_dead() -> None:
    proc = FakeProc(FakeProcess(host_pid=6000, pid_namespace=CHILD, nspid=(6000, 1), start_time=600))
    expect(Agent(proc).probe(key(ns=CHILD, pid=1, start=500)), Verdict.DEAD, Evidence.PID_NAMESPACE_RECREATED)


@pytest.mark.parametrize(
    ("world", "incarnation", "why"),
    [
        pytest.param(restarted(init_start=500), key(ns=CHILD, pid=7, start=500), "not after", id="pid-1-same-tick"),
        pytest.param(restarted(init_start=400), key(ns=CHILD, pid=7, start=500), "not after", id="pid-1-older"),
        pytest.param(
            FakeProc(FakeProcess(host_pid=6007, pid_namespace=CHILD, nspid=(6007, 7), start_time=650)),
            key(ns=CHILD, pid=7, start=500),
            "pid 1 of pid namespace",
            id="no-pid-1",
        ),
        pytest.param(
            restarted(time_namespace=OTHER_CLOCK),
            key(ns=CHILD, pid=7, start=500),
            "another time namespace",
            id="holder-on-another-clock",
        ),
        pytest.param(
            FakeProc(FakeProcess(host_pid=4242, start_time=777)),
            key(start=500),
            "lasts the whole boot",
            id="host-namespace",
        ),
    ],
)
def test_a_namespace_not_shown_younger_than_the_incarnation_stays_reused(
    world: FakeProc, incarnation: IncarnationKey, why: str
) -> None:
    result = Agent(world).probe(incarnation)
    expect(result, Verdict.REUSED, Evidence.START_TIME_DIFFERS)
    assert why in result.detail


@pytest.mark.parametrize("op", ["stat", "status", "link"])
def test_a_pid_1_that_cannot_be_read_concludes_nothing(op: str) -> None:
    proc = restarted()
    proc.fault(op, 6000, *[oserror(errno.EACCES)] * 4)
    result = Agent(proc).probe(key(ns=CHILD, pid=7, start=500))
    assert result.verdict is not Verdict.DEAD, result.detail


def test_a_holder_whose_time_namespace_cannot_be_read_concludes_nothing() -> None:
    proc = restarted()
    proc.fault("time", 6007, oserror(errno.EACCES))
    result = Agent(proc).probe(key(ns=CHILD, pid=7, start=500))
    expect(result, Verdict.REUSED, Evidence.START_TIME_DIFFERS)
    assert "unreadable time namespace" in result.detail


def test_a_pid_1_replaced_between_the_index_and_the_read_is_resolved_again() -> None:
    proc = restarted()
    agent = Agent(proc)
    agent.index.refresh(reader=proc, proc_pid_namespace=ROOT)

    def swap() -> None:  # host pid 6000 is now some root process; the namespace's pid 1 is 6100
        proc.reap(6000)
        proc.add(FakeProcess(host_pid=6000, start_time=900))
        proc.add(FakeProcess(host_pid=6100, pid_namespace=CHILD, nspid=(6100, 1), start_time=600))

    proc.then("link", 6007, swap)  # after the holder is read, before its pid 1 is
    result = agent.probe(key(ns=CHILD, pid=7, start=500))
    expect(result, Verdict.DEAD, Evidence.PID_NAMESPACE_RECREATED)
    assert "host pid 6100" in result.detail


def test_another_boot_is_never_a_recreated_namespace() -> None:
    result = Agent(restarted()).probe(key(ns=CHILD, pid=7, start=500, boot=OTHER_BOOT))
    expect(result, Verdict.REUSED, Evidence.START_TIME_DIFFERS)


def test_a_root_number_held_by_a_thread_or_a_child_namespace_is_reused() -> None:
    proc = FakeProc(FakeProcess(host_pid=4000, start_time=100))
    proc.threads[4242] = FakeProcess(host_pid=4242, tgid=4000, start_time=900)
    expect(Agent(proc).probe(key()), Verdict.REUSED, Evidence.START_TIME_DIFFERS)
    proc = FakeProc(FakeProcess(host_pid=4242, pid_namespace=CHILD, nspid=(4242, 7), start_time=900))
    expect(Agent(proc).probe(key()), Verdict.REUSED, Evidence.START_TIME_DIFFERS)


@pytest.mark.parametrize(
    "holder",
    [
        pytest.param(FakeProcess(host_pid=4242, tgid=4000, start_time=500), id="a-thread"),
        pytest.param(
            FakeProcess(host_pid=4242, pid_namespace=CHILD, nspid=(4242, 7), start_time=500), id="child-namespace"
        ),
    ],
)
def test_same_start_but_not_the_process_is_a_contradiction(holder: FakeProcess) -> None:
    proc = FakeProc(FakeProcess(host_pid=4000, start_time=100))
    if holder.tgid != holder.host_pid:
        proc.threads[4242] = holder
    else:
        proc.add(holder)
    expect(Agent(proc).probe(key()), Verdict.UNKNOWN, Evidence.INCARNATION_CONTRADICTED)
    assert not proc.open_fds


# --- child pid namespaces, through the index ----------------------------------------------------


def containers() -> FakeProc:
    """Two containers whose workers both see themselves as pid 2, and a root process with pid 2."""
    return FakeProc(
        FakeProcess(host_pid=2, start_time=1),
        FakeProcess(host_pid=22136, pid_namespace=CHILD, nspid=(22136, 1), start_time=900),
        FakeProcess(host_pid=22137, pid_namespace=CHILD, nspid=(22137, 2), start_time=901),
        FakeProcess(host_pid=30001, pid_namespace=OTHER_CHILD, nspid=(30001, 1), start_time=950),
        FakeProcess(host_pid=30002, pid_namespace=OTHER_CHILD, nspid=(30002, 2), start_time=951),
    )


def test_a_worker_in_a_child_namespace_is_found_through_nspid() -> None:
    agent = Agent(containers())
    first = agent.probe(key(ns=CHILD, pid=2, start=901))
    other = agent.probe(key(ns=OTHER_CHILD, pid=2, start=951))
    expect(first, Verdict.ALIVE, Evidence.PIDFD_PINNED)
    expect(other, Verdict.ALIVE, Evidence.PIDFD_PINNED)
    assert (first.host_pid, other.host_pid) == (22137, 30002)


def test_the_index_is_built_once_and_refreshed_incrementally() -> None:
    proc = containers()
    agent = Agent(proc)
    agent.probe(key(ns=CHILD, pid=2, start=901))
    assert agent.index.refreshes == 1 and agent.index.reads == 5
    # A hit costs no listing and no re-read of the others.
    agent.probe(key(ns=OTHER_CHILD, pid=2, start=951))
    assert agent.index.refreshes == 1 and agent.index.reads == 5
    # A new process: one listing, one read (only the new one).
    proc.add(FakeProcess(host_pid=40001, pid_namespace=CHILD, nspid=(40001, 3), start_time=990))
    expect(agent.probe(key(ns=CHILD, pid=3, start=990)), Verdict.ALIVE, Evidence.PIDFD_PINNED)
    assert agent.index.refreshes == 2 and agent.index.reads == 6


def test_root_namespace_processes_need_no_ns_link() -> None:
    # On this project's VM root gets EACCES for pid 1's ns link: NSpid's length says enough.
    proc = containers()
    proc.fault("link", 2, *[oserror(errno.EACCES)] * 5)
    agent = Agent(proc)
    expect(agent.probe(key(ns=CHILD, pid=7)), Verdict.DEAD, Evidence.PROC_ABSENT)
    assert agent.index.unclassified == 0


def test_absent_from_a_child_namespace_is_dead() -> None:
    proc = containers()
    agent = Agent(proc)
    agent.probe(key(ns=CHILD, pid=2, start=901))
    agent.pidfds.close()
    proc.reap(22137)
    expect(agent.probe(key(ns=CHILD, pid=2, start=901)), Verdict.DEAD, Evidence.PROC_ABSENT)


def test_a_process_started_after_the_index_is_not_absent() -> None:
    # The index predates the worker: a miss must be judged on a fresh listing, never on the old one.
    proc = containers()
    agent = Agent(proc)
    agent.index.refresh(reader=proc, proc_pid_namespace=ROOT)
    proc.add(FakeProcess(host_pid=40001, pid_namespace=CHILD, nspid=(40001, 5), start_time=999))
    expect(agent.probe(key(ns=CHILD, pid=5, start=999)), Verdict.ALIVE, Evidence.PIDFD_PINNED)


def test_a_host_pid_reused_since_the_index_is_read_again() -> None:
    # 22137 exits; its host pid goes to a process of another namespace: a new generation.
    proc = containers()
    agent = Agent(proc)
    agent.index.refresh(reader=proc, proc_pid_namespace=ROOT)
    proc.reap(22137)
    proc.add(FakeProcess(host_pid=22137, pid_namespace=OTHER_CHILD, nspid=(22137, 9), start_time=2000))
    expect(agent.probe(key(ns=OTHER_CHILD, pid=9, start=2000)), Verdict.ALIVE, Evidence.PIDFD_PINNED)
    agent.pidfds.close()
    expect(agent.probe(key(ns=CHILD, pid=2, start=901)), Verdict.DEAD, Evidence.PROC_ABSENT)


def test_a_stale_index_entry_is_dropped_and_the_number_looked_up_again() -> None:
    proc = containers()
    agent = Agent(proc)
    agent.index.refresh(reader=proc, proc_pid_namespace=ROOT)
    # The worker is replaced by a new incarnation under another host pid (same namespace and pid).
    proc.reap(22137)
    proc.add(FakeProcess(host_pid=22200, pid_namespace=CHILD, nspid=(22200, 2), start_time=1500))
    result = agent.probe(key(ns=CHILD, pid=2, start=901))
    expect(result, Verdict.REUSED, Evidence.START_TIME_DIFFERS)
    assert result.host_pid == 22200


def test_an_unreadable_process_makes_absence_unknown() -> None:
    proc = containers()
    proc.fault("status", 30001, oserror(errno.EACCES))
    agent = Agent(proc)
    result = agent.probe(key(ns=CHILD, pid=7))
    expect(result, Verdict.UNKNOWN, Evidence.PROC_UNREADABLE)
    assert agent.index.unclassified == 1
    # Readable again: the next refresh re-reads it, whatever its generation, and absence holds.
    expect(agent.probe(key(ns=CHILD, pid=7)), Verdict.DEAD, Evidence.PROC_ABSENT)


def test_garbage_in_a_status_makes_absence_unknown() -> None:
    proc = containers()
    proc.fault("status", 30001, "Name:\tno colon here\ngarbage\n")
    expect(Agent(proc).probe(key(ns=CHILD, pid=7)), Verdict.UNKNOWN, Evidence.PROC_UNREADABLE)


def test_a_process_vanishing_during_the_refresh_holds_nothing() -> None:
    proc = containers()
    proc.fault("status", 30001, oserror(errno.ENOENT))
    listing = proc.list_pids

    def list_then_exit() -> list[tuple[int, int]]:
        listed = listing()
        proc.processes.pop(30001, None)  # it exits right after the listing saw it
        return listed

    proc.list_pids = list_then_exit  # type: ignore[method-assign]
    expect(Agent(proc).probe(key(ns=CHILD, pid=7)), Verdict.DEAD, Evidence.PROC_ABSENT)


def test_a_read_error_on_a_process_still_listed_is_not_absence() -> None:
    # Regression (found by test_a_live_incarnation_is_never_dead): one transient ESRCH on a live
    # process's status, read while classifying it, made its incarnation Dead/ProcAbsent.
    proc = containers()
    holder = next(p for p in proc.processes.values() if p.pid_namespace == CHILD and p.nspid[-1] == 2)
    proc.fault("status", holder.host_pid, oserror(errno.ESRCH))
    result = Agent(proc).probe(key(ns=CHILD, pid=2, start=holder.start_time))
    assert result.verdict is not Verdict.DEAD, result


def test_an_unlistable_proc_is_unknown() -> None:
    proc = containers()
    proc.list_error = oserror(errno.EACCES)
    expect(Agent(proc).probe(key(ns=CHILD, pid=2, start=901)), Verdict.UNKNOWN, Evidence.PROC_UNREADABLE)


# --- unreadable facts ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "outcome", "evidence"),
    [
        pytest.param("stat", oserror(errno.EACCES), Evidence.PROC_UNREADABLE, id="stat-denied"),
        pytest.param("stat", oserror(errno.EIO), Evidence.PROC_UNREADABLE, id="stat-io-error"),
        pytest.param("stat", "4242 (x) S 1 2\n", Evidence.START_TIME_UNREADABLE, id="stat-truncated"),
        pytest.param("status", oserror(errno.EACCES), Evidence.PROC_UNREADABLE, id="status-denied"),
        pytest.param("status", "garbage", Evidence.PROC_UNREADABLE, id="status-garbage"),
        pytest.param("link", oserror(errno.EACCES), Evidence.PID_NAMESPACE_NOT_VISIBLE, id="link-denied"),
        pytest.param("link", "pid:[garbage]", Evidence.PROC_UNREADABLE, id="link-garbage"),
    ],
)
def test_what_cannot_be_read_is_unknown(op: str, outcome: OSError | str, evidence: Evidence) -> None:
    proc = containers()
    agent = Agent(proc)
    agent.index.refresh(reader=proc, proc_pid_namespace=ROOT)
    proc.fault(op, 22137, outcome)
    expect(agent.probe(key(ns=CHILD, pid=2, start=901)), Verdict.UNKNOWN, evidence)
    assert not proc.open_fds


def test_stat_garbage_in_the_root_namespace_is_start_time_unreadable() -> None:
    proc = FakeProc(sleeper())
    proc.fault("stat", 4242, "4242 (sleep) S 1 1 1 0 -1\n")
    expect(Agent(proc).probe(key()), Verdict.UNKNOWN, Evidence.START_TIME_UNREADABLE)


# --- races: vanished or reused mid-probe -> re-resolve once -> Unknown -------------------------


def test_vanished_mid_read_is_resolved_again() -> None:
    proc = FakeProc(sleeper())
    proc.then("stat", 4242, lambda: proc.reap(4242))  # it exits right after the first read
    expect(Agent(proc).probe(key()), Verdict.DEAD, Evidence.PROC_ABSENT)


def test_link_denied_because_the_task_was_released_is_resolved_again() -> None:
    # EACCES from ns/pid also means "the task went away after the path lookup": stat tells which.
    proc = containers()
    agent = Agent(proc)
    agent.index.refresh(reader=proc, proc_pid_namespace=ROOT)
    proc.fault("link", 22137, oserror(errno.EACCES))
    proc.then("status", 22137, lambda: proc.reap(22137))
    expect(agent.probe(key(ns=CHILD, pid=2, start=901)), Verdict.DEAD, Evidence.PROC_ABSENT)


def test_reused_between_two_reads_is_resolved_again() -> None:
    proc = FakeProc(sleeper())

    def reuse() -> None:
        proc.reap(4242)
        proc.add(sleeper(start_time=888))

    proc.then("status", 4242, reuse)  # status of the old one, then stat of the new one
    result = Agent(proc).probe(key())
    expect(result, Verdict.REUSED, Evidence.START_TIME_DIFFERS)


def test_reaped_between_read_and_pidfd_open_is_resolved_again() -> None:
    proc = FakeProc(sleeper())
    proc.fault("open", 4242, oserror(errno.ESRCH))
    proc.then("stat", 4242, lambda: None)
    proc.then("stat", 4242, lambda: proc.reap(4242))  # after the second stat, before open
    expect(Agent(proc).probe(key()), Verdict.DEAD, Evidence.PROC_ABSENT)


def test_reused_between_read_and_pidfd_open_is_caught_after_opening() -> None:
    # The fd pins the *new* holder of the number; the re-read after opening sees a new start time.
    proc = FakeProc(sleeper())

    def reuse() -> None:
        proc.reap(4242)
        proc.add(sleeper(start_time=888))

    proc.then("open", 4242, reuse)
    agent = Agent(proc)
    result = agent.probe(key())
    expect(result, Verdict.REUSED, Evidence.START_TIME_DIFFERS)
    # The fd opened under the race was closed; the one left pins the new holder, for its exit.
    assert len(proc.open_fds) == 1 and agent.pidfds.incarnations() == [key(start=888)]


def test_reaped_right_after_pidfd_open_is_resolved_again() -> None:
    proc = FakeProc(sleeper())
    proc.then("open", 4242, lambda: proc.reap(4242))
    agent = Agent(proc)
    expect(agent.probe(key()), Verdict.DEAD, Evidence.PROC_ABSENT)
    assert not proc.open_fds


def test_a_number_that_keeps_changing_is_unknown() -> None:
    proc = FakeProc(sleeper())
    proc.fault("status", 4242, oserror(errno.ESRCH), oserror(errno.ESRCH))
    expect(Agent(proc).probe(key()), Verdict.UNKNOWN, Evidence.PROCESS_CHANGED_DURING_PROBE)


def test_a_candidate_that_exits_right_after_the_listing_is_resolved_again() -> None:
    proc = containers()
    proc.then("link", 22137, lambda: proc.reap(22137))  # classified by the refresh, then gone
    expect(Agent(proc).probe(key(ns=CHILD, pid=2, start=901)), Verdict.DEAD, Evidence.PROC_ABSENT)


def test_a_pid_that_seemed_to_vanish_during_a_refresh_is_read_at_the_next() -> None:
    proc = containers()
    proc.fault("status", 22137, oserror(errno.ESRCH))
    agent = Agent(proc)
    agent.index.refresh(reader=proc, proc_pid_namespace=ROOT)
    assert agent.index.lookup(pid_namespace=CHILD, namespaced_pid=2) is None
    expect(agent.probe(key(ns=CHILD, pid=2, start=901)), Verdict.ALIVE, Evidence.PIDFD_PINNED)


# --- boot boundary -------------------------------------------------------------------------------


def test_another_boot_and_an_unoccupied_number_is_a_boot_boundary() -> None:
    agent = Agent(containers())
    expect(agent.probe(key(boot=OTHER_BOOT, pid=4242)), Verdict.DEAD, Evidence.BOOT_BOUNDARY)
    expect(agent.probe(key(boot=OTHER_BOOT, ns=CHILD, pid=7)), Verdict.DEAD, Evidence.BOOT_BOUNDARY)
    expect(agent.probe(key(boot=OTHER_BOOT, ns=4026539999, pid=1)), Verdict.DEAD, Evidence.BOOT_BOUNDARY)


def test_another_boot_and_an_occupied_number_is_reused() -> None:
    agent = Agent(containers())
    expect(agent.probe(key(boot=OTHER_BOOT, pid=2, start=12345)), Verdict.REUSED, Evidence.START_TIME_DIFFERS)


def test_another_boot_yet_the_same_process_is_a_contradiction() -> None:
    proc = containers()
    agent = Agent(proc)
    result = agent.probe(key(boot=OTHER_BOOT, ns=CHILD, pid=2, start=901))
    expect(result, Verdict.UNKNOWN, Evidence.INCARNATION_CONTRADICTED)
    assert not proc.open_fds


def test_a_boot_change_releases_the_pidfd() -> None:
    # A pidfd never outlives a boot; one held under another boot id says nothing about this incarnation.
    proc = FakeProc(sleeper())
    agent = Agent(proc)
    expect(agent.probe(key()), Verdict.ALIVE, Evidence.PIDFD_PINNED)
    agent.node = facts(boot_id=OTHER_BOOT)
    proc.reap(4242)
    expect(agent.probe(key()), Verdict.DEAD, Evidence.BOOT_BOUNDARY)
    assert len(agent.pidfds) == 0 and not proc.open_fds


# --- node facts ----------------------------------------------------------------------------------


@pytest.fixture
def node_files(tmp_path: pathlib.Path) -> dict[str, pathlib.Path]:
    boot, machine, link = tmp_path / "boot_id", tmp_path / "machine-id", tmp_path / "ns-pid"
    boot.write_text(BOOT + "\n")
    machine.write_text("3d1219c7c4c5404aaa1f6d2a48adfda4\n")
    link.symlink_to(f"pid:[{ROOT}]")  # a readlink answer, not a file
    return {"boot_id_file": boot, "machine_id_file": machine, "self_pid_namespace_link": link}


def read_facts(files: dict[str, pathlib.Path], proc: FakeProc | None = None) -> LocalNode:
    reader = proc or FakeProc(FakeProcess(host_pid=1, start_time=0))
    return LocalNode.read(node_name=NODE, reader=reader, **{name: str(path) for name, path in files.items()})


def test_node_facts(node_files: dict[str, pathlib.Path]) -> None:
    read = read_facts(node_files)
    assert (read.boot_id, read.host_id, read.agent_pid_namespace, read.proc_pid_namespace) == (
        BOOT, "3d1219c7c4c5404aaa1f6d2a48adfda4", ROOT, ROOT,
    )  # fmt: skip
    assert read.in_root_pid_namespace and read.sees_every_process


@pytest.mark.parametrize("content", ["", "not-a-uuid\n", BOOT.upper()], ids=["empty", "garbage", "uppercase"])
def test_node_facts_boot_id_invalid(node_files: dict[str, pathlib.Path], content: str) -> None:
    node_files["boot_id_file"].write_text(content)
    assert read_facts(node_files).boot_id is None


def test_node_facts_without_files(node_files: dict[str, pathlib.Path]) -> None:
    for path in node_files.values():
        path.unlink()
    read = read_facts(node_files)
    assert (read.boot_id, read.host_id, read.agent_pid_namespace, read.sees_every_process) == (None, NODE, None, False)


@pytest.mark.parametrize(
    ("options", "hides"),
    [
        (("rw", "nosuid", "rw"), False),
        (("rw", "rw", "hidepid=invisible"), True),
        (("rw", "rw", "hidepid=2", "gid=4"), True),
        (("rw", "rw", "hidepid=off"), False),
        (oserror(errno.EACCES), None),
    ],
)
def test_node_facts_proc_hiding(
    node_files: dict[str, pathlib.Path], options: tuple[str, ...] | OSError, hides: bool | None
) -> None:
    proc = FakeProc(FakeProcess(host_pid=1, start_time=0))
    proc.mount_options = options
    read = read_facts(node_files, proc)
    assert read.proc_hides_processes is hides
    assert read.sees_every_process is (hides is False)


def test_node_facts_machine_id_uninitialized(node_files: dict[str, pathlib.Path]) -> None:
    node_files["machine_id_file"].write_text("uninitialized\n")
    assert read_facts(node_files).host_id == NODE


def test_node_facts_proc_of_an_ancestor_namespace(node_files: dict[str, pathlib.Path]) -> None:
    # The agent shows in that /proc with two NSpid entries: an ancestor's, whose inode is unknown.
    node_files["self_pid_namespace_link"].unlink()
    node_files["self_pid_namespace_link"].symlink_to(f"pid:[{CHILD}]")
    read = read_facts(node_files, FakeProc(FakeProcess(host_pid=1, start_time=0, nspid=(1, 1), pid_namespace=CHILD)))
    assert (read.agent_pid_namespace, read.proc_pid_namespace, read.sees_every_process) == (CHILD, None, False)


# --- the pidfd table and watcher ---------------------------------------------------------------


def test_the_table_closes_what_it_forgets() -> None:
    closed: list[int] = []
    table = PidfdTable(max_pinned=2, close=closed.append)
    assert table.adopt(key(pid=1), fd=10, host_pid=1)
    assert not table.adopt(key(pid=1), fd=11, host_pid=1)  # one fd per incarnation; the caller closes 11
    assert table.adopt(key(pid=2), fd=12, host_pid=2)
    assert table.full and not table.adopt(key(pid=3), fd=13, host_pid=3)
    assert (len(table), table.unpinned) == (2, 1)
    table.release(key(pid=1))
    table.release(key(pid=3))
    assert closed == [10] and table.unpinned == 0
    table.close()
    assert sorted(closed) == [10, 12] and len(table) == 0 and table.unpinned == 0


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.close()


def pipe() -> tuple[int, int]:
    """A stand-in for a pidfd: readable when written to, as a pidfd is when its process exits."""
    read_end, write_end = os.pipe()
    return read_end, write_end


def test_the_watcher_turns_a_readable_fd_into_one_callback(loop: asyncio.AbstractEventLoop) -> None:
    fired: list[IncarnationKey] = []
    closed: list[int] = []

    def close(fd: int) -> None:
        closed.append(fd)
        os.close(fd)

    watcher = PidfdWatcher(loop=loop, on_exit=fired.append, close=close)
    read_end, write_end = pipe()

    async def scenario() -> None:
        assert watcher.adopt(key(), fd=read_end, host_pid=4242)
        assert watcher.watched == 1
        os.write(write_end, b"x")  # "the process exited"
        for _ in range(100):
            await asyncio.sleep(0)
            if fired:
                break
        await asyncio.sleep(0.01)  # level-triggered: it must not fire again
        assert fired == [key()] and watcher.fired == 1 and watcher.watched == 0
        assert watcher.get(key()) is not None  # the fd stays for the next probe to read
        watcher.release(key())
        assert closed == [read_end]

    try:
        loop.run_until_complete(scenario())
    finally:
        os.close(write_end)


def test_the_watcher_is_bounded(loop: asyncio.AbstractEventLoop) -> None:
    ends = [pipe() for _ in range(3)]
    watcher = PidfdWatcher(loop=loop, on_exit=lambda key: None, max_pinned=2)

    async def scenario() -> None:
        assert [watcher.adopt(key(pid=i + 1), fd=r, host_pid=i + 1) for i, (r, _) in enumerate(ends)] == [
            True, True, False,
        ]  # fmt: skip
        assert (watcher.watched, watcher.unpinned) == (2, 1)
        watcher.close()
        assert watcher.watched == 0

    try:
        loop.run_until_complete(scenario())
    finally:
        os.close(ends[2][0])
        for _, write_end in ends:
            os.close(write_end)


def test_the_watcher_accepts_pins_from_another_thread(loop: asyncio.AbstractEventLoop) -> None:
    fired: list[IncarnationKey] = []
    watcher = PidfdWatcher(loop=loop, on_exit=fired.append)
    read_end, write_end = pipe()

    async def scenario() -> None:
        thread = threading.Thread(target=watcher.adopt, args=(key(),), kwargs={"fd": read_end, "host_pid": 1})
        thread.start()
        thread.join()
        os.write(write_end, b"x")
        for _ in range(200):
            await asyncio.sleep(0.001)
            if fired:
                break
        assert fired == [key()]
        release = threading.Thread(target=watcher.release, args=(key(),))
        release.start()
        release.join()
        await asyncio.sleep(0.01)
        with pytest.raises(OSError):
            os.fstat(read_end)  # closed on the loop, after leaving the selector

    try:
        loop.run_until_complete(scenario())
    finally:
        os.close(write_end)


def test_an_exited_pin_is_not_watched(loop: asyncio.AbstractEventLoop) -> None:
    read_end, write_end = pipe()
    watcher = PidfdWatcher(loop=loop, on_exit=lambda key: None)

    async def scenario() -> None:
        watcher.adopt(key(), fd=read_end, host_pid=1, exited=True)
        assert watcher.watched == 0
        watcher.close()

    try:
        loop.run_until_complete(scenario())
    finally:
        os.close(write_end)


# --- properties: whatever the world, unknown is never dead ---------------------------------------

NAMESPACES = st.sampled_from([ROOT, CHILD, OTHER_CHILD])


@st.composite
def worlds(draw: st.DrawFn) -> tuple[FakeProc, IncarnationKey, LocalNode]:
    processes: dict[int, FakeProcess] = {}
    taken: set[tuple[int, int]] = set()
    for host_pid in draw(st.lists(st.integers(2, 60), unique=True, max_size=12)):
        namespace = draw(NAMESPACES)
        namespaced = host_pid if namespace == ROOT else draw(st.integers(1, 8))
        if (namespace, namespaced) in taken:
            continue
        taken.add((namespace, namespaced))
        zombie = draw(st.booleans())
        threads = draw(st.integers(1, 3))
        processes[host_pid] = FakeProcess(
            host_pid=host_pid,
            start_time=draw(st.integers(0, 3)),
            pid_namespace=namespace,
            nspid=(host_pid,) if namespace == ROOT else (host_pid, namespaced),
            state="Z" if zombie else "S",
            threads=threads,
            exited=zombie and threads == 1 and draw(st.booleans()),
            time_namespace=draw(st.sampled_from([HOST_CLOCK, HOST_CLOCK, OTHER_CLOCK])),
        )
    # The kernel's order: a child namespace's pid 1 is its first process, so none started before it.
    for namespace in (CHILD, OTHER_CHILD):
        members = [p for p in processes.values() if p.pid_namespace == namespace]
        init = next((p for p in members if p.nspid[-1] == 1), None)
        if init is not None:
            init.start_time = min(p.start_time for p in members)
    proc = FakeProc(*processes.values())
    hides = draw(st.sampled_from([False, False, True, None]))
    for host_pid, process in processes.items():
        for op in draw(st.lists(st.sampled_from(["stat", "status", "link", "open", "time", "inode"]), max_size=2)):
            codes = [errno.EACCES, errno.ESRCH, errno.EMFILE]
            # The kernel answers ENOENT for a process that still runs only where /proc hides it.
            if hides is not False or process.exited:
                codes.append(errno.ENOENT)
            proc.fault(op, host_pid, oserror(draw(st.sampled_from(codes))))
    # Half the time, the number of a process that is there (a worker, or what took its number).
    target = draw(st.sampled_from([None, *processes.values()]))
    namespace = draw(NAMESPACES) if target is None else target.pid_namespace
    if target is not None:
        pid = target.nspid[-1]
    else:
        pid = draw(st.integers(2, 60)) if namespace == ROOT else draw(st.integers(1, 8))
    # Its pidfd inode recorded or not; if recorded, of the target or of a process gone since.
    recorded_inode = draw(st.sampled_from(["none", "target", "gone"]))
    inode = 0 if recorded_inode == "none" else 999_999
    if recorded_inode == "target" and target is not None:
        inode = target.generation
    incarnation = key(
        boot=draw(st.sampled_from([BOOT, OTHER_BOOT])),
        ns=namespace,
        pid=pid,
        start=draw(st.integers(0, 3)),
        inode=inode,
    )
    proc.pidfs = draw(st.sampled_from([True, True, False]))
    node = facts(
        agent_pid_namespace=draw(st.sampled_from([ROOT, ROOT, CHILD, None])),
        proc_pid_namespace=draw(st.sampled_from([ROOT, ROOT, None])),
        proc_hides_processes=hides,
    )
    return proc, incarnation, node


def _may_be(process: FakeProcess, incarnation: IncarnationKey) -> bool:
    """`process` may be the recorded incarnation: its number, and its start time on the recording clock
    (a launcher on another clock saw it shifted by an offset the agent cannot know); on the same
    boot, a recorded pidfd inode names exactly one process."""
    if incarnation.pidfd_inode and incarnation.boot_id == BOOT:
        return process.generation == incarnation.pidfd_inode
    number = (process.pid_namespace, process.nspid[-1]) == (incarnation.pid_namespace, incarnation.pid)
    return number and (process.time_namespace != HOST_CLOCK or process.start_time == incarnation.start_time)


@given(world=worlds())
@settings(max_examples=600, deadline=None)
def test_a_live_incarnation_is_never_dead(world: tuple[FakeProc, IncarnationKey, LocalNode]) -> None:
    proc, incarnation, node = world
    live = [p for p in proc.processes.values() if _may_be(p, incarnation) and not p.exited]
    agent = Agent(proc, node=node)
    result = agent.probe(incarnation)
    if result.verdict is Verdict.DEAD:
        assert not live, result
        assert result.evidence.proves_death and not result.evidence.node_level
        assert (result.evidence is Evidence.BOOT_BOUNDARY) == (incarnation.boot_id != BOOT)
    if result.evidence in {Evidence.PROC_ABSENT, Evidence.BOOT_BOUNDARY}:
        assert node.sees_every_process
    if result.evidence is Evidence.PID_NAMESPACE_RECREATED:
        init = next(
            p for p in proc.processes.values() if (p.pid_namespace, p.nspid[-1]) == (incarnation.pid_namespace, 1)
        )
        assert init.start_time > incarnation.start_time
    if result.verdict is Verdict.ALIVE:
        exact = [p for p in live if p.start_time == incarnation.start_time]
        assert exact and result.host_pid == exact[0].host_pid and incarnation.boot_id == BOOT
        if incarnation.pidfd_inode:
            assert exact[0].generation == incarnation.pidfd_inode and proc.pidfs
    # Every fd is either held by the table or closed.
    held = {pinned.fd for k in agent.pidfds.incarnations() if (pinned := agent.pidfds.get(k))}
    assert proc.open_fds == held


# --- by pidfd inode: what an agent without ptrace access can establish ----------------------------


def in_child(**changes: Any) -> FakeProcess:
    """pid 1 of a child pid namespace, whose ns/pid link this agent may not read."""
    return FakeProcess(**({"host_pid": 4242, "start_time": 500, "pid_namespace": CHILD, "nspid": (4242, 1)} | changes))


def by_inode(process: FakeProcess, **changes: Any) -> IncarnationKey:
    fields = {"pid": process.nspid[-1], "start": process.start_time, "ns": process.pid_namespace} | changes
    return key(inode=process.generation, **fields)


def test_a_worker_whose_namespace_link_is_refused_is_alive_by_its_pidfd_inode_then_dead() -> None:
    worker = in_child()
    proc = FakeProc(worker, FakeProcess(host_pid=77, start_time=3, pid_namespace=OTHER_CHILD, nspid=(77, 1)))
    for pid in (4242, 77):
        proc.fault("link", pid, *[oserror(errno.EACCES)] * 10)
    agent = Agent(proc)
    expect(agent.probe(by_inode(worker)), Verdict.ALIVE, Evidence.PIDFD_PINNED)
    worker.exited = True
    expect(agent.probe(by_inode(worker)), Verdict.DEAD, Evidence.PIDFD_EXITED)


def test_a_recorded_inode_no_process_has_is_absent_on_the_same_boot() -> None:
    gone = in_child()
    proc = FakeProc(in_child(start_time=900))  # the restarted container: same number, another process
    expect(Agent(proc).probe(by_inode(gone)), Verdict.DEAD, Evidence.PROC_ABSENT)


@pytest.mark.parametrize("error", [errno.EMFILE, errno.EACCES, errno.EPERM])
def test_absence_by_inode_needs_every_process_read(error: int) -> None:
    gone = in_child()
    proc = FakeProc(FakeProcess(host_pid=77, start_time=3))
    proc.fault("open", 77, oserror(error))
    expect(Agent(proc).probe(by_inode(gone)), Verdict.UNKNOWN, Evidence.PROC_UNREADABLE)


def test_without_pidfs_no_inode_names_a_process_and_absence_is_unknown() -> None:
    proc = FakeProc(FakeProcess(host_pid=77, start_time=3))
    proc.pidfs = False
    expect(Agent(proc).probe(by_inode(in_child())), Verdict.UNKNOWN, Evidence.PROC_UNREADABLE)


@pytest.mark.parametrize(
    "changes",
    [{"start": 499}, {"pid": 2}, {"ns": OTHER_CHILD}],
    ids=["another-start-time", "another-pid", "another-namespace"],
)
def test_the_process_of_the_inode_must_be_the_recorded_one(changes: dict[str, int]) -> None:
    worker = in_child()
    agent = Agent(FakeProc(worker))
    expect(agent.probe(by_inode(worker, **changes)), Verdict.UNKNOWN, Evidence.INCARNATION_CONTRADICTED)
    assert not agent.pidfds.incarnations() and agent.proc.open_fds == set()


def test_a_number_that_changed_hands_since_the_listing_is_looked_up_again() -> None:
    worker = in_child()
    proc = FakeProc(worker)
    agent = Agent(proc)
    agent.index.refresh(reader=proc, proc_pid_namespace=ROOT, with_inodes=True)
    proc.reap(4242)
    proc.add(in_child(start_time=900))  # the number, now another process's
    expect(agent.probe(by_inode(worker)), Verdict.DEAD, Evidence.PROC_ABSENT)


def test_an_agent_in_another_pid_namespace_than_its_proc_cannot_look_up_an_inode() -> None:
    worker = in_child()
    agent = Agent(FakeProc(worker), node=facts(agent_pid_namespace=CHILD))
    expect(agent.probe(by_inode(worker)), Verdict.UNKNOWN, Evidence.PIDFD_UNAVAILABLE)


def test_on_another_boot_the_inode_is_not_used() -> None:
    worker = in_child()
    expect(Agent(FakeProc()).probe(by_inode(worker, boot=OTHER_BOOT)), Verdict.DEAD, Evidence.BOOT_BOUNDARY)


def test_absence_by_namespace_needs_no_link_of_a_process_with_another_pid() -> None:
    """An agent without ptrace access reads no child namespace's link, but every process's own pid
    (NSpid): one whose own pid is another cannot hold the recorded one. Another boot's container
    worker is then over (BootBoundary); while a process with its pid runs, Unknown."""
    other_pid = FakeProcess(host_pid=77, start_time=3, pid_namespace=OTHER_CHILD, nspid=(77, 5))
    proc = FakeProc(other_pid)
    proc.fault("link", 77, *[oserror(errno.EACCES)] * 10)
    expect(Agent(proc).probe(key(pid=1, ns=CHILD, boot=OTHER_BOOT)), Verdict.DEAD, Evidence.BOOT_BOUNDARY)
    same_pid = FakeProcess(host_pid=78, start_time=3, pid_namespace=OTHER_CHILD, nspid=(78, 1))
    proc.add(same_pid)
    proc.fault("link", 78, *[oserror(errno.EACCES)] * 10)
    expect(Agent(proc).probe(key(pid=1, ns=CHILD, boot=OTHER_BOOT)), Verdict.UNKNOWN, Evidence.PROC_UNREADABLE)
