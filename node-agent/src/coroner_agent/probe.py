"""The agent's probe: does this exact incarnation live, on this node, on this boot?

`probe` establishes the facts — the process holding the recorded number (through `PidIndex` and
`coroner_agent.proc`), a pidfd pinned to it and verified after opening (`coroner_agent.pidfds`) —
and `coroner_agent.verdict` says what they conclude: `Dead` only from a readable pidfd, /proc
absence or a boot boundary, everything else `Alive`, `Reused` or `Unknown`. A pid that vanished
or was reused between two reads is resolved once more.

Kernel facts this relies on, each measured on this project's kernel (Linux 6.18, pid_max 32768):
a live process's pidfd is not readable; after kill -9 it is, while the process is still an
unreaped zombie (state `Z`, `Threads: 1`), and it stays readable after the reap; after
`pthread_exit` in the main thread with one other thread running, the leader shows `Z` with
`Threads: 2` and its pidfd is *not* readable, until the last thread returns; `pidfd_open` succeeds
on an unreaped zombie and fails with ESRCH once it is reaped, with ENOENT for a non-leader thread
id, with EMFILE at RLIMIT_NOFILE; a pidfd's fdinfo says `Pid: <n>` in the reading /proc's
namespace (2 inside a child namespace for what the host calls 22137) and `Pid: -1` once reaped;
`readlink /proc/<zombie>/ns/pid` still answers, but root gets EACCES for pid 1's here (hence
`procfs.pid_namespace_of`); a forced reuse through `ns_last_pid` gives the new process the same
number, a new start time and a new /proc inode (71328 -> 71337), and a live process keeps its
/proc inode across listings. kill -9 to a `loop.add_reader` callback on the pidfd: 0.2-0.4 ms.
"""

from __future__ import annotations

from coroner.core import api
from coroner.core.exits import Ending, Exit
from coroner.core.procfs import IncarnationKey, ProcessView
from coroner.core.reasons import Evidence, Verdict
from coroner_agent import verdict
from coroner_agent.pidfds import PidfdTable, PinnedPidfd
from coroner_agent.pidindex import PidIndex
from coroner_agent.proc import VANISHED, Changed, LocalNode, ProcReader, Unestablished, read_view
from coroner_agent.verdict import ProbeResult, RecordedIncarnation


def probe(
    *,
    incarnation: RecordedIncarnation,
    registration_node: str | None,
    node: LocalNode,
    reader: ProcReader,
    index: PidIndex,
    pidfds: PidfdTable,
) -> ProbeResult:
    """Attest one incarnation: Dead only from a readable pidfd, /proc absence or a boot boundary."""
    key = verdict.recorded(
        incarnation=incarnation, registration_node=registration_node, node_name=node.node_name, boot_id=node.boot_id
    )
    if isinstance(key, ProbeResult):
        return key
    same_boot = key.boot_id == node.boot_id
    if not same_boot:
        # A pidfd never outlives a boot: one held under another boot id is not this incarnation's.
        pidfds.release(key)
    else:
        held = pidfds.get(key)
        if held is not None:
            return _from_held_pidfd(key=key, held=held, reader=reader, pidfds=pidfds)
    for _attempt in range(2):
        try:
            return _resolve(key=key, same_boot=same_boot, node=node, reader=reader, index=index, pidfds=pidfds)
        except Changed:
            continue  # a pid vanished or was reused between two reads: look again, from scratch
        except Unestablished as exc:
            return verdict.unknown(exc.evidence, exc.detail)
    return verdict.changed_twice(key)


def _from_held_pidfd(*, key: IncarnationKey, held: PinnedPidfd, reader: ProcReader, pidfds: PidfdTable) -> ProbeResult:
    try:
        exited = reader.pidfd_exited(held.fd)
    except OSError as exc:
        # Never happens to a valid pidfd; if it does, the fd proves nothing any more.
        pidfds.release(key)
        return verdict.unknown(
            Evidence.PIDFD_UNAVAILABLE, f"polling the pidfd of host pid {held.host_pid} failed: {exc}"
        )
    if exited:
        return verdict.exited(host_pid=held.host_pid, how=_how_it_ended(reader, held.fd))
    return verdict.runs(host_pid=held.host_pid)


def _how_it_ended(reader: ProcReader, fd: int) -> Exit:
    try:
        return reader.pidfd_exit(fd)
    except OSError:
        return Exit(Ending.UNKNOWN)  # unread is never clean


def _resolve(
    *, key: IncarnationKey, same_boot: bool, node: LocalNode, reader: ProcReader, index: PidIndex, pidfds: PidfdTable
) -> ProbeResult:
    if key.pidfd_inode and same_boot:
        return _resolve_by_inode(key=key, node=node, reader=reader, index=index, pidfds=pidfds)
    view = _find(key=key, proc_pid_namespace=node.proc_pid_namespace, reader=reader, index=index)
    if view is None:
        return _absent(key=key, same_boot=same_boot, node=node)
    if view.start_time != key.start_time:
        why_held = ""
        if same_boot:
            recreated = verdict.namespace_recreated(
                key=key,
                holder=view,
                init=_namespace_init(key=key, holder=view, node=node, reader=reader, index=index),
                holder_on_agent_clock=_on_agent_clock(reader=reader, host_pid=view.host_pid),
            )
            if isinstance(recreated, ProbeResult):
                return recreated
            why_held = f"{recreated}; "
        reuser, exited, note = _watch_reuser(view=view, node=node, reader=reader, pidfds=pidfds)
        return verdict.reused(key=key, view=view, reuser=reuser, reuser_exited=exited, note=why_held + note)
    contradicted = verdict.contradiction(key=key, view=view, same_boot=same_boot, boot_id=node.boot_id)
    if contradicted is not None:
        return contradicted
    return _pin(key=key, view=view, proc_pid_namespace=node.proc_pid_namespace, reader=reader, pidfds=pidfds)


def _absent(*, key: IncarnationKey, same_boot: bool, node: LocalNode) -> ProbeResult:
    return verdict.absent(
        key=key,
        same_boot=same_boot,
        boot_id=node.boot_id,
        sees_every_process=node.sees_every_process,
        agent_pid_namespace=node.agent_pid_namespace,
        proc_pid_namespace=node.proc_pid_namespace,
        proc_hides_processes=node.proc_hides_processes,
    )


def _resolve_by_inode(
    *, key: IncarnationKey, node: LocalNode, reader: ProcReader, index: PidIndex, pidfds: PidfdTable
) -> ProbeResult:
    """The incarnation found by its pidfd inode, which names one process of this boot: no pid
    namespace link is read, so this works for an agent without ptrace access to the process."""
    if node.agent_pid_namespace is None or node.agent_pid_namespace != node.proc_pid_namespace:
        return verdict.unknown(
            Evidence.PIDFD_UNAVAILABLE,
            f"pidfd_open numbers pids in this agent's pid namespace ({node.agent_pid_namespace}), its /proc in "
            f"another ({node.proc_pid_namespace}): the process of pidfd inode {key.pidfd_inode} cannot be looked up",
        )
    host_pid = index.lookup_inode(key.pidfd_inode)
    if host_pid is None:
        # As by namespace: a miss proves nothing until /proc was listed after the incarnation started.
        try:
            index.refresh(reader=reader, proc_pid_namespace=node.proc_pid_namespace, with_inodes=True)
        except OSError as exc:
            raise Unestablished(Evidence.PROC_UNREADABLE, f"cannot list the proc root: {exc}") from exc
        host_pid = index.lookup_inode(key.pidfd_inode)
    if host_pid is None:
        if index.inodes_unclassified:
            raise Unestablished(
                Evidence.PROC_UNREADABLE,
                f"the pidfd inodes of {index.inodes_unclassified} processes could not be read; any of them could "
                f"be the process of pidfd inode {key.pidfd_inode}",
            )
        return _absent(key=key, same_boot=True, node=node)
    return _pin_by_inode(key=key, host_pid=host_pid, node=node, reader=reader, index=index, pidfds=pidfds)


def _pin_by_inode(
    *, key: IncarnationKey, host_pid: int, node: LocalNode, reader: ProcReader, index: PidIndex, pidfds: PidfdTable
) -> ProbeResult:
    """Opens a pidfd for the host pid the index named and keeps it if its inode is the recorded
    one: then it pins exactly the recorded process, whatever holds its number later."""
    try:
        fd = reader.open_pidfd(host_pid)
    except OSError as exc:
        if exc.errno in VANISHED:
            index.forget(host_pid)
            raise Changed from exc
        pidfds.note_unpinned(key)
        return verdict.unknown(Evidence.PIDFD_UNAVAILABLE, f"pidfd_open({host_pid}) failed: {exc}; left to resync")
    try:
        try:
            inode = reader.pidfd_inode(fd)
            mapped = reader.pidfd_pid(fd)
        except OSError as exc:
            pidfds.note_unpinned(key)
            raise Unestablished(Evidence.PIDFD_UNAVAILABLE, f"cannot examine the pidfd of {host_pid}: {exc}") from exc
        if inode != key.pidfd_inode or mapped != host_pid:
            index.forget(host_pid)  # the number changed hands since the listing (or was reaped)
            raise Changed
        view = read_view(
            reader=reader, host_pid=host_pid, proc_pid_namespace=node.proc_pid_namespace, namespace_required=False
        )
        # Still not reaped after the read, so the number was not reused under it: the view is of
        # the pinned process.
        if view is None or reader.pidfd_pid(fd) != host_pid:
            raise Changed
        contradicted = verdict.inode_contradiction(key=key, view=view)
        if contradicted is not None:
            reader.close_pidfd(fd)
            return contradicted
        exited = reader.pidfd_exited(fd)
    except BaseException:
        reader.close_pidfd(fd)
        raise
    return _keep(key=key, fd=fd, host_pid=host_pid, view=view, exited=exited, reader=reader, pidfds=pidfds)


def _find(
    *, key: IncarnationKey, proc_pid_namespace: int | None, reader: ProcReader, index: PidIndex
) -> ProcessView | None:
    """The process holding the recorded (namespace, pid) now, or None if no process does."""
    if key.pid_namespace == api.ROOT_PID_NAMESPACE_INODE:
        # In the root namespace the namespaced pid is the host pid: one lookup, no listing. A pid
        # that does not resolve (ENOENT) is held by no task at all, thread or process.
        return read_view(reader=reader, host_pid=key.pid, proc_pid_namespace=proc_pid_namespace)
    candidate = index.lookup(pid_namespace=key.pid_namespace, namespaced_pid=key.pid)
    if candidate is not None:
        view = read_view(reader=reader, host_pid=candidate, proc_pid_namespace=proc_pid_namespace)
        if view is not None and verdict.holds(view, key):
            return view
        index.forget(candidate)  # stale: that host pid now belongs to someone else, or nobody
    # A miss proves nothing until /proc has been listed after the incarnation started: the index
    # may predate it. So absence is always judged on a listing taken now.
    try:
        index.refresh(reader=reader, proc_pid_namespace=proc_pid_namespace)
    except OSError as exc:
        raise Unestablished(Evidence.PROC_UNREADABLE, f"cannot list the proc root: {exc}") from exc
    candidate = index.lookup(pid_namespace=key.pid_namespace, namespaced_pid=key.pid)
    if candidate is None:
        if index.could_hold(key.pid):
            raise Unestablished(
                Evidence.PROC_UNREADABLE,
                f"{index.unclassified} processes could not be read; one of them could hold pid {key.pid} "
                f"in pid namespace {key.pid_namespace} (an agent without ptrace access reads no other user's "
                "pid namespace: a launcher on Linux 6.9+ records spec.incarnation.pidfdInode, by which it needs "
                "none; else run the agent with components/agent-ptrace)",
            )
        return None
    view = read_view(reader=reader, host_pid=candidate, proc_pid_namespace=proc_pid_namespace)
    if view is None or not verdict.holds(view, key):
        raise Changed  # it changed between the listing and the read
    return view


def _namespace_init(
    *, key: IncarnationKey, holder: ProcessView, node: LocalNode, reader: ProcReader, index: PidIndex
) -> ProcessView | None:
    """Pid 1 of the namespace that now has the recorded inode number, or None if it cannot be read.

    Raises `Changed` when the process the index named is no longer that pid 1 (resolve again)."""
    if key.pid_namespace == api.ROOT_PID_NAMESPACE_INODE:
        return None
    if holder.namespaced_pid == 1:
        return holder
    candidate = index.lookup(pid_namespace=key.pid_namespace, namespaced_pid=1)
    if candidate is None:
        try:
            index.refresh(reader=reader, proc_pid_namespace=node.proc_pid_namespace)
        except OSError:
            return None
        candidate = index.lookup(pid_namespace=key.pid_namespace, namespaced_pid=1)
        if candidate is None:
            return None
    try:
        init = read_view(reader=reader, host_pid=candidate, proc_pid_namespace=node.proc_pid_namespace)
    except Unestablished:
        return None
    if init is None or (init.pid_namespace, init.namespaced_pid) != (key.pid_namespace, 1):
        index.forget(candidate)
        raise Changed
    return init


def _on_agent_clock(*, reader: ProcReader, host_pid: int) -> bool | None:
    """The process is in the agent's own time namespace (None: either link cannot be read)."""
    try:
        return reader.read_time_namespace_link(host_pid) == reader.read_time_namespace_link(reader.self_pid())
    except OSError:
        return None


def _pin(
    *, key: IncarnationKey, view: ProcessView, proc_pid_namespace: int | None, reader: ProcReader, pidfds: PidfdTable
) -> ProbeResult:
    host_pid = view.host_pid
    try:
        fd = reader.open_pidfd(host_pid)
    except OSError as exc:
        if exc.errno in VANISHED:
            raise Changed from exc  # reaped (or the number moved to a thread) since the read
        pidfds.note_unpinned(key)
        return verdict.unknown(
            verdict.unpinnable(view), f"pidfd_open({host_pid}) failed: {exc}; left to resync", host_pid
        )
    try:
        # pidfd_open numbers pids in the agent's namespace, /proc in its own: the fd's pid as the
        # proc root numbers it must be the host pid we read, or the fd pins some other process.
        try:
            pinned_pid = reader.pidfd_pid(fd)
        except OSError as exc:
            pidfds.note_unpinned(key)
            raise Unestablished(
                verdict.unpinnable(view), f"cannot map the pidfd of {host_pid} onto /proc: {exc}"
            ) from exc
        if pinned_pid is None:
            raise Changed  # reaped since the read
        if pinned_pid != host_pid:
            pidfds.note_unpinned(key)
            raise Unestablished(
                verdict.unpinnable(view),
                f"pidfd_open({host_pid}) pinned what /proc calls pid {pinned_pid}: the agent and its /proc "
                f"are in different pid namespaces",
            )
        # The fd pins whatever held the number at open time: the same start time *after* opening
        # proves that was the recorded incarnation (closes the reuse race between read and open).
        after = read_view(reader=reader, host_pid=host_pid, proc_pid_namespace=proc_pid_namespace)
        if after is None or not verdict.holds(after, key) or after.start_time != key.start_time:
            raise Changed
        exited = reader.pidfd_exited(fd)
    except BaseException:
        reader.close_pidfd(fd)
        raise
    return _keep(key=key, fd=fd, host_pid=host_pid, view=after, exited=exited, reader=reader, pidfds=pidfds)


def _keep(
    *,
    key: IncarnationKey,
    fd: int,
    host_pid: int,
    view: ProcessView,
    exited: bool,
    reader: ProcReader,
    pidfds: PidfdTable,
) -> ProbeResult:
    """The verdict of a verified pidfd, which the table keeps (or closes, if it has one already)."""
    if exited:
        how = _how_it_ended(reader, fd)
        if not pidfds.adopt(key, fd=fd, host_pid=host_pid, exited=True):
            reader.close_pidfd(fd)
        return verdict.exited(host_pid=host_pid, state=view.state, how=how)
    kept = pidfds.adopt(key, fd=fd, host_pid=host_pid)
    if not kept:
        reader.close_pidfd(fd)  # a concurrent probe may have pinned it first: one fd per incarnation is enough
        kept = pidfds.get(key) is not None
    return verdict.checked(host_pid=host_pid, view=view, kept=kept, pinned=len(pidfds), limit=pidfds.max_pinned)


def _watch_reuser(
    *, view: ProcessView, node: LocalNode, reader: ProcReader, pidfds: PidfdTable
) -> tuple[IncarnationKey | None, bool, str]:
    """Pins the process that holds a reused number, so that its exit re-probes at once.

    Returns (the holder's incarnation if the table now tracks it, whether its pidfd is already
    readable, a note for the detail). The pin is verified exactly as an Alive one (`_pin`: pidfd
    mapped onto /proc, start time read again after opening), so the table holds one valid pidfd per
    incarnation whichever registration asked for it, within the same `max_pinned` budget. The
    holder's exit only makes the next probe possible: that probe must still find the number free
    (ProcAbsent) or held by yet another process. A holder that vanishes under the pin raises
    `Changed` (resolve again); a holder that cannot be pinned is left to the resync.
    """
    if node.boot_id is None or not view.is_thread_group_leader:
        return None, False, "a thread holds it, not a process: it is looked at again on resync"
    reuser = IncarnationKey(
        boot_id=node.boot_id, pid_namespace=view.pid_namespace, pid=view.namespaced_pid, start_time=view.start_time
    )
    held = pidfds.get(reuser)
    if held is not None:
        try:
            exited = reader.pidfd_exited(held.fd)
        except OSError as exc:
            pidfds.release(reuser)
            return None, False, f"polling the pidfd of that holder failed ({exc}): it is looked at again on resync"
        if exited:
            return reuser, True, "that holder exited and is not reaped yet: looked at again shortly"
        return reuser, False, "that holder is pinned by a pidfd: its exit re-probes this incarnation"
    if pidfds.full:
        pidfds.note_unpinned(reuser)
        return reuser, False, f"that holder is not pinned ({len(pidfds)} pinned, limit {pidfds.max_pinned}): resync"
    try:
        pinned = _pin(key=reuser, view=view, proc_pid_namespace=node.proc_pid_namespace, reader=reader, pidfds=pidfds)
    except Unestablished as exc:
        return reuser, False, f"that holder cannot be pinned ({exc.detail}): resync"
    if pinned.verdict is Verdict.DEAD:
        return reuser, True, "that holder exited and is not reaped yet: looked at again shortly"
    if pinned.verdict is Verdict.ALIVE and pidfds.get(reuser) is not None:
        return reuser, False, "that holder is pinned by a pidfd: its exit re-probes this incarnation"
    return reuser, False, f"that holder is not pinned ({pinned.detail}): resync"
