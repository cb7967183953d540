"""The probe's verdicts: which kernel facts make an incarnation `Dead`, and what everything else is.

The one rule is that unknown is never dead, so only three kernel facts ever *conclude* `Dead`, and
everything else is `Alive`, `Reused` or `Unknown`:

- `PidfdExited`: a pidfd the agent opened for the incarnation (and verified after opening) is
  readable. The kernel makes a process pidfd readable only when the *whole thread group* has exited
  — not when the leader alone has. That is the zombie trap: a process whose main thread called
  `pthread_exit` shows state `Z` while its other threads run. State `Z` is therefore never read as
  death; only the pidfd is.
- `ProcAbsent`: same boot, the agent sees every process (it and the /proc it reads are both in the
  root pid namespace), and a listing of /proc taken *during this probe* has no process whose pid
  namespace and namespaced pid are the recorded ones. A process can neither leave its pid
  namespace nor change its pid, so a live incarnation would be in that listing.
  An incarnation that recorded its pidfd inode (`coroner.pidfs`: one per process, never reused
  within a boot) is looked up by that instead, on the same boot: absent when no listed process
  has it. No ns/pid link is read, so an agent without ptrace access over the worker can say it.
- `PidNamespaceRecreated`: same boot, the recorded (pid namespace, pid) is held by a process with
  another start time, and the namespace that now has the recorded inode number has a pid 1 that
  started after the incarnation did. A pid namespace's pid 1 is its first process (the kernel
  refuses any other number until pid 1 exists) and the namespace takes no process after pid 1 has
  died, so every process of a namespace started at or after its pid 1: the incarnation never lived
  in this namespace. Inode numbers are unique among live namespaces, so the one it lived in under
  that number is freed, which needs every process in it gone. A container restarted while its
  agent was away is this case: its new namespace often gets the freed inode number, and its worker
  the same pid. The holder must be in the agent's time namespace (the launcher read the start time
  on its child's clock; another clock could make a live worker's own record look earlier). A pid 1
  that cannot be read, or that started in the same clock tick, concludes nothing: `Reused`.
- `BootBoundary`: the recorded boot id is not the current one and the recorded (pid namespace,
  pid) is unoccupied on this boot, under the same visibility rule. Pid namespace inode numbers are
  recycled (across boots, and even within one: measured, two successive `unshare --pid` got the
  same inode) and the root namespace is always 4026531836, so after a reboot the pair may by chance
  name some unrelated process; then the verdict is `Reused` (it preserves, and clears once that
  process exits) or, if even the start time matches, `Unknown` (`IncarnationContradicted`).

`Alive` needs as much: the process was found with the recorded start time, a pidfd was opened for
it, the pidfd's pid as the proc root numbers it (its fdinfo) is the host pid that was read, the
start time read again *after* opening still matches, and the pidfd is not readable. `Reused` is
the recorded number held by a process with another start time. Anything short of these is
`Unknown`, with evidence naming what could not be established; a pid that vanished or was reused
between two reads is resolved once more, then `ProcessChangedDuringProbe`.

Pure: each function here turns facts the probe established (`coroner_agent.probe`, reading through
`coroner_agent.proc` and pinning through `coroner_agent.pidfds`) into a `ProbeResult`; no I/O.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from coroner.core import api, procfs
from coroner.core.exits import Exit
from coroner.core.procfs import IncarnationKey, ParseError, ProcessView
from coroner.core.reasons import Evidence, Verdict


class RecordedIncarnation(Protocol):
    """The incarnation fields of a registration (`coroner.core.model.Incarnation`, or an IncarnationKey)."""

    @property
    def boot_id(self) -> object: ...
    @property
    def pid_namespace(self) -> object: ...
    @property
    def pid(self) -> object: ...
    @property
    def start_time(self) -> object: ...
    @property
    def pidfd_inode(self) -> object: ...


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProbeResult:
    verdict: Verdict
    evidence: Evidence
    detail: str
    host_pid: int | None = None
    """The host pid the probe matched (Alive, Dead by pidfd, Reused), when it found one."""
    reuser: IncarnationKey | None = None
    """Reused: the incarnation that holds the recorded number now, which the pidfd table tracks
    (pinned, or counted unpinned at its limit). Its exit frees the number, so it is the moment to
    probe the recorded incarnation again; it proves nothing about it by itself."""
    reuser_exited: bool = False
    """Reused, and the pidfd of that holder is readable: it exited but is not reaped yet, so the
    number is still held (by a zombie). No event will come for it: the caller looks again soon."""
    exit: Exit | None = None
    """PidfdExited: how the process ended, as far as the kernel says (a clean exit is given the
    time its registrant needs to say goodbye, `coroner_agent.step`)."""


def unknown(evidence: Evidence, detail: str, host_pid: int | None = None) -> ProbeResult:
    """Unknown: a fact the verdict needs was not established (`evidence` names which)."""
    return ProbeResult(verdict=Verdict.UNKNOWN, evidence=evidence, detail=detail, host_pid=host_pid)


def sees_every_process(
    *, agent_pid_namespace: int | None, proc_pid_namespace: int | None, proc_hides_processes: bool | None
) -> bool:
    """Absence is authoritative only when neither the agent nor its /proc is in a child namespace,
    and that /proc is known to hide no process (no hidepid)."""
    return (
        agent_pid_namespace == api.ROOT_PID_NAMESPACE_INODE
        and proc_pid_namespace == api.ROOT_PID_NAMESPACE_INODE
        and proc_hides_processes is False
    )


def recorded(
    *, incarnation: RecordedIncarnation, registration_node: str | None, node_name: str, boot_id: str | None
) -> IncarnationKey | ProbeResult:
    """The incarnation to probe, or Unknown where no probe on this node can say anything of it."""
    if registration_node != node_name:
        return unknown(
            Evidence.FOREIGN_NODE,
            f"the registration is for node {registration_node!r}; this agent serves {node_name!r}",
        )
    try:
        key = procfs.recorded_incarnation(
            boot_id=incarnation.boot_id,
            pid_namespace=incarnation.pid_namespace,
            pid=incarnation.pid,
            start_time=incarnation.start_time,
            pidfd_inode=incarnation.pidfd_inode,
        )
    except ParseError as exc:
        return unknown(Evidence.INVALID_INCARNATION, f"the recorded incarnation is invalid: {exc}")
    if boot_id is None:
        return unknown(Evidence.BOOT_ID_UNREADABLE, "this node's boot id cannot be read")
    return key


def holds(view: ProcessView, key: IncarnationKey) -> bool:
    """`view` is the process numbered as the incarnation was (whatever its start time)."""
    return view.pid_namespace == key.pid_namespace and view.namespaced_pid == key.pid


def absent(
    *,
    key: IncarnationKey,
    same_boot: bool,
    boot_id: str | None,
    sees_every_process: bool,
    agent_pid_namespace: int | None,
    proc_pid_namespace: int | None,
    proc_hides_processes: bool | None,
) -> ProbeResult:
    """No process holds the recorded (pid namespace, pid), or has the recorded pidfd inode, in a
    listing taken during this probe."""
    where = f"pid {key.pid} in pid namespace {key.pid_namespace}"
    if key.pidfd_inode and same_boot:
        where = f"pidfd inode {key.pidfd_inode} (pid {key.pid} in pid namespace {key.pid_namespace})"
    in_root = api.ROOT_PID_NAMESPACE_INODE == agent_pid_namespace == proc_pid_namespace
    if not sees_every_process and not in_root:
        return unknown(
            Evidence.NOT_ROOT_PID_NAMESPACE,
            f"no process holds {where}, but this agent (pid namespace {agent_pid_namespace}) or its "
            f"/proc (pid namespace {proc_pid_namespace}) is not the root pid namespace and may not see it",
        )
    if not sees_every_process:
        hidden = "is mounted with hidepid" if proc_hides_processes else "has mount options that cannot be read"
        return unknown(
            Evidence.PROC_HIDES_PROCESSES,
            f"no process holds {where} in this agent's /proc, but that /proc {hidden} and may not show "
            "every process: mount it without hidepid",
        )
    if same_boot:
        held = "has" if key.pidfd_inode else "holds"
        return ProbeResult(
            verdict=Verdict.DEAD, evidence=Evidence.PROC_ABSENT, detail=f"no process {held} {where} on this boot"
        )
    return ProbeResult(
        verdict=Verdict.DEAD,
        evidence=Evidence.BOOT_BOUNDARY,
        detail=f"recorded on boot {key.boot_id}, this is boot {boot_id}, and no process holds {where}",
    )


def _holder(view: ProcessView) -> str:
    return f"host pid {view.host_pid} (state {view.state}, start time {view.start_time})"


def reused(
    *, key: IncarnationKey, view: ProcessView, reuser: IncarnationKey | None, reuser_exited: bool, note: str
) -> ProbeResult:
    """The recorded number is held by a process with another start time (`note`: what watches it)."""
    return ProbeResult(
        verdict=Verdict.REUSED,
        evidence=Evidence.START_TIME_DIFFERS,
        detail=f"pid {key.pid} in pid namespace {key.pid_namespace} is held by {_holder(view)}, not the "
        f"recorded start time {key.start_time}; {note}",
        host_pid=view.host_pid,
        reuser=reuser,
        reuser_exited=reuser_exited,
    )


def namespace_recreated(
    *, key: IncarnationKey, holder: ProcessView, init: ProcessView | None, holder_on_agent_clock: bool | None
) -> ProbeResult | str:
    """Dead when the namespace now numbered as the recorded one began after the incarnation (its pid
    1 started later), on the same boot; otherwise why that cannot be concluded (for `Reused`'s detail).

    `holder` holds the recorded number with another start time; `init` is pid 1 of the namespace
    that now has the recorded inode (None: there is none, or it could not be read);
    `holder_on_agent_clock`: the holder is in the agent's time namespace (None: unreadable)."""
    if key.pid_namespace == api.ROOT_PID_NAMESPACE_INODE:
        return "the host's pid namespace lasts the whole boot"
    if init is None:
        return f"pid 1 of pid namespace {key.pid_namespace} cannot be read, so its age is not known"
    if holder_on_agent_clock is not True:
        state = "is in another time namespace" if holder_on_agent_clock is False else "has an unreadable time namespace"
        return f"host pid {holder.host_pid} {state}, so its start times may not be on the recorded clock"
    if init.start_time <= key.start_time:
        return (
            f"its pid 1 (host pid {init.host_pid}) started at {init.start_time}, not after the recorded start time, "
            f"so the namespace may be the incarnation's own"
        )
    return ProbeResult(
        verdict=Verdict.DEAD,
        evidence=Evidence.PID_NAMESPACE_RECREATED,
        detail=f"pid {key.pid} in pid namespace {key.pid_namespace} is held by {_holder(holder)}, and that "
        f"namespace's pid 1 (host pid {init.host_pid}) started at {init.start_time}, after the recorded start "
        f"time {key.start_time}: it is a new namespace under a recycled inode number, and the incarnation's own "
        f"namespace, with every process in it, is gone",
        host_pid=holder.host_pid,
    )


def contradiction(
    *, key: IncarnationKey, view: ProcessView, same_boot: bool, boot_id: str | None
) -> ProbeResult | None:
    """Unknown when the holder of the number, with the recorded start time, cannot be the recorded
    process; None when it is that process, to be pinned (only a pidfd then says Alive or Dead)."""
    if not holds(view, key) or not view.is_thread_group_leader:
        # Only the root-namespace lookup can get here: the number is held, by something that cannot
        # be the recorded process (a thread, or a task of a child namespace), at the same tick.
        return unknown(
            Evidence.INCARNATION_CONTRADICTED,
            f"pid {key.pid} in pid namespace {key.pid_namespace} is held by {_holder(view)}, a thread of "
            f"{view.tgid} in pid namespace {view.pid_namespace} with the recorded start time",
            view.host_pid,
        )
    if not same_boot:
        return unknown(
            Evidence.INCARNATION_CONTRADICTED,
            f"recorded on boot {key.boot_id}, this is boot {boot_id}, yet {_holder(view)} matches the rest "
            f"of the incarnation",
            view.host_pid,
        )
    return None


def inode_contradiction(*, key: IncarnationKey, view: ProcessView) -> ProbeResult | None:
    """Unknown when the process with the recorded pidfd inode is not numbered, or did not start, as
    the registration records (another clock, or a record that names two processes); None when it
    agrees, to be judged by its pidfd. Its pid namespace is compared where it could be read."""
    if (
        view.is_thread_group_leader
        and view.namespaced_pid == key.pid
        and view.start_time == key.start_time
        and view.pid_namespace in (0, key.pid_namespace)
    ):
        return None
    shown = "unreadable" if view.pid_namespace == 0 else str(view.pid_namespace)
    return unknown(
        Evidence.INCARNATION_CONTRADICTED,
        f"the process of pidfd inode {key.pidfd_inode} is {_holder(view)}, pid {view.namespaced_pid} in pid "
        f"namespace {shown}; the registration records pid {key.pid} in pid namespace {key.pid_namespace} with "
        f"start time {key.start_time}",
        view.host_pid,
    )


def exited(*, host_pid: int, state: str | None = None, how: Exit | None = None) -> ProbeResult:
    """Dead: the incarnation's pidfd is readable, so its whole thread group exited (`how`: its exit
    status, as far as the kernel says)."""
    shown = f"host pid {host_pid}" if state is None else f"host pid {host_pid} (state {state})"
    said = "" if how is None else f"; {how.describe()}"
    return ProbeResult(
        verdict=Verdict.DEAD,
        evidence=Evidence.PIDFD_EXITED,
        detail=f"the pidfd of {shown} is readable: its whole thread group exited{said}",
        host_pid=host_pid,
        exit=how,
    )


def runs(*, host_pid: int) -> ProbeResult:
    """Alive: the pidfd pinned earlier to the incarnation is not readable."""
    return ProbeResult(
        verdict=Verdict.ALIVE,
        evidence=Evidence.PIDFD_PINNED,
        detail=f"the pidfd pinned to host pid {host_pid} is not readable: its thread group runs",
        host_pid=host_pid,
    )


def checked(*, host_pid: int, view: ProcessView, kept: bool, pinned: int, limit: int) -> ProbeResult:
    """Alive: a pidfd opened now, verified after opening, is not readable (`kept`: the table holds it)."""
    shape = f"state {view.state}, {view.threads} threads"
    if view.state == "Z":
        shape += "; its main thread exited, the others run (state Z is not death)"
    if kept:
        detail = f"host pid {host_pid} ({shape}) pinned by a pidfd, start time re-checked after opening"
    else:
        detail = (
            f"host pid {host_pid} ({shape}) checked through a pidfd, start time re-checked after opening; "
            f"not kept ({pinned} pinned, limit {limit}): its death is found on resync"
        )
    return ProbeResult(verdict=Verdict.ALIVE, evidence=Evidence.PIDFD_PINNED, detail=detail, host_pid=host_pid)


def unpinnable(view: ProcessView) -> Evidence:
    """Why a process that could not be pinned stays Unknown."""
    # Without a pidfd, a zombie leader with threads left is the trap: alive, but not provably so here.
    if view.state == "Z" and view.threads > 1:
        return Evidence.ZOMBIE_THREAD_GROUP_ALIVE
    return Evidence.PIDFD_UNAVAILABLE


def changed_twice(key: IncarnationKey) -> ProbeResult:
    """Unknown: the process under the probe changed during two successive resolutions."""
    return unknown(
        Evidence.PROCESS_CHANGED_DURING_PROBE,
        f"pid {key.pid} in pid namespace {key.pid_namespace} changed under two successive probes",
    )
