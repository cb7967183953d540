"""The agent's probes: does this exact incarnation live, on this node, on this boot?

The one rule is that unknown is never dead, so this module only ever *concludes* `Dead` from three
kernel facts and calls everything else `Alive`, `Reused` or `Unknown`:

- `PidfdExited`: a pidfd the agent opened for the incarnation (and verified after opening) is
  readable. The kernel makes a process pidfd readable only when the *whole thread group* has exited
  — not when the leader alone has. That is the zombie trap: a process whose main thread called
  `pthread_exit` shows state `Z` while its other threads run. State `Z` is therefore never read as
  death; only the pidfd is.
- `ProcAbsent`: same boot, the agent sees every process (it and the /proc it reads are both in the
  root pid namespace), and a listing of /proc taken *during this probe* has no process whose pid
  namespace and namespaced pid are the recorded ones. A process can neither leave its pid
  namespace nor change its pid, so a live incarnation would be in that listing.
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

The I/O goes through `ProcReader`, so every branch is testable with a fake; `HostProcReader` is
the real one, rooted at a configurable proc root (tests simulate nodes with other boot-id files).
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import select
import threading
from collections.abc import Callable, Iterable
from typing import Final, Protocol

from coroner.core import api, procfs
from coroner.core.procfs import IncarnationKey, ParseError, ProcessView
from coroner.core.reasons import Evidence, Verdict

ROOT_PID_NAMESPACE: Final = api.ROOT_PID_NAMESPACE_INODE
BOOT_ID_FILE: Final = "/proc/sys/kernel/random/boot_id"
MACHINE_ID_FILE: Final = "/etc/machine-id"
#: Always the agent's own /proc, whatever the proc root: pidfd_open numbers pids in *its* namespace.
SELF_PID_NAMESPACE_LINK: Final = "/proc/self/ns/pid"

#: A pid that is not there any more: reading /proc/<pid>/... of a task that exited and was reaped.
_VANISHED: Final = frozenset({errno.ENOENT, errno.ESRCH})
#: A listing entry whose inode number the kernel could not give (proc_fill_cache falls back to 1).
_NO_GENERATION: Final = 1


# --- the kernel, as the probe sees it ---------------------------------------------------------


class ProcReader(Protocol):
    """Everything the probe reads from the kernel. Errors are OSError with the kernel's errno."""

    def list_pids(self) -> Iterable[tuple[int, int]]:
        """(pid, generation) of every process (thread group) the proc root lists.

        The generation is the directory's inode number: a new process behind a reused pid number
        gets a new one, so an unchanged generation means the cached classification still holds.
        0 or 1 means unknown (always re-read).
        """
        ...

    def read_stat(self, pid: int) -> str: ...
    def read_status(self, pid: int) -> str: ...
    def read_pid_namespace_link(self, pid: int) -> str: ...
    def self_pid(self) -> int:
        """The agent's own pid as the proc root numbers it (OSError: the agent is not visible there)."""
        ...

    def open_pidfd(self, pid: int) -> int:
        """A pidfd for `pid` *as the agent's own pid namespace numbers it* (pidfd_open's rule)."""
        ...

    def pidfd_pid(self, fd: int) -> int | None:
        """The pid the pidfd refers to, as the proc root numbers it; None once reaped."""
        ...

    def pidfd_exited(self, fd: int) -> bool:
        """Readable: the whole thread group exited (a lone exited leader does not count)."""
        ...

    def close_pidfd(self, fd: int) -> None: ...


class HostProcReader:
    """The real /proc (or a proc root mounted elsewhere) and real pidfds."""

    def __init__(self, *, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root.rstrip("/") or "/"

    def _path(self, pid: int, name: str) -> str:
        return f"{self.proc_root}/{pid}/{name}"

    def _read(self, path: str) -> str:
        # One open, read to EOF: procfs renders stat/status whole on the first read, so the text is
        # one consistent snapshot of the task.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
        finally:
            os.close(fd)
        return b"".join(chunks).decode("utf-8", "surrogateescape")

    def list_pids(self) -> list[tuple[int, int]]:
        # getdents gives each entry's inode number for free (no stat per pid): that is what makes
        # an incremental refresh cheap.
        with os.scandir(self.proc_root) as entries:
            return [
                (int(entry.name), entry.inode()) for entry in entries if entry.name.isascii() and entry.name.isdigit()
            ]

    def read_stat(self, pid: int) -> str:
        return self._read(self._path(pid, "stat"))

    def read_status(self, pid: int) -> str:
        return self._read(self._path(pid, "status"))

    def read_pid_namespace_link(self, pid: int) -> str:
        return os.readlink(self._path(pid, "ns/pid"))

    def self_pid(self) -> int:
        return int(os.readlink(f"{self.proc_root}/self"))

    def open_pidfd(self, pid: int) -> int:
        return os.pidfd_open(pid)

    def pidfd_pid(self, fd: int) -> int | None:
        # fdinfo of a pidfd prints its pid in the namespace of the /proc being read: reading it
        # through the proc root maps the agent's numbering onto /proc's, whatever the namespaces.
        try:
            return procfs.parse_pidfd_fdinfo(self._read(f"{self.proc_root}/{self.self_pid()}/fdinfo/{fd}"))
        except ParseError as exc:
            raise OSError(errno.EINVAL, f"fdinfo of fd {fd}: {exc}") from exc

    def pidfd_exited(self, fd: int) -> bool:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return any(events & select.POLLIN for _, events in poller.poll(0))

    def close_pidfd(self, fd: int) -> None:
        os.close(fd)


# --- node facts ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LocalNode:
    """What the agent knows about its own node, read locally right now (boot id, host id, pid
    namespaces); the Node object's facts are `coroner.core.decision.NodeFacts`. Cheap to read: take
    one per probe or scan."""

    node_name: str
    boot_id: str | None
    """None when the boot-id file is unreadable or not a UUID: every probe is then Unknown."""
    host_id: str
    """The machine id, or the node name where the host has none (as the launcher records it)."""
    agent_pid_namespace: int | None
    """Inode of the agent's own pid namespace (None: unreadable)."""
    proc_pid_namespace: int | None
    """Inode of the pid namespace the proc root shows; None: not established (see `read`)."""

    @property
    def in_root_pid_namespace(self) -> bool:
        return self.agent_pid_namespace == ROOT_PID_NAMESPACE

    @property
    def sees_every_process(self) -> bool:
        """Absence is authoritative only when neither the agent nor its /proc is in a child namespace."""
        return self.in_root_pid_namespace and self.proc_pid_namespace == ROOT_PID_NAMESPACE

    @classmethod
    def read(
        cls,
        *,
        node_name: str,
        reader: ProcReader,
        boot_id_file: str = BOOT_ID_FILE,
        machine_id_file: str = MACHINE_ID_FILE,
        self_pid_namespace_link: str = SELF_PID_NAMESPACE_LINK,
    ) -> LocalNode:
        """Read the facts; what cannot be read is None (never a default that could pass for a fact)."""
        try:
            with open(boot_id_file, "rb") as file:
                boot_id: str | None = procfs.parse_boot_id(file.read(4096))
        except (OSError, ParseError):
            boot_id = None
        try:
            with open(machine_id_file, "rb") as file:
                host_id = procfs.parse_machine_id(file.read(4096))
        except (OSError, ParseError):
            host_id = node_name
        try:
            agent_ns: int | None = procfs.parse_pid_namespace_link(os.readlink(self_pid_namespace_link))
        except (OSError, ParseError):
            agent_ns = None
        # Which namespace the proc root shows: it shows the agent (`self` resolves) only if it is the
        # agent's namespace or an ancestor's, and the agent's NSpid there has one entry only if it is
        # the agent's own. (Not pid 1's ns link: here root gets EACCES for it.)
        proc_ns: int | None = None
        try:
            if agent_ns is not None and len(procfs.parse_status(reader.read_status(reader.self_pid())).nspid) == 1:
                proc_ns = agent_ns
        except (OSError, ParseError, ValueError):
            proc_ns = None
        return cls(
            node_name=node_name,
            boot_id=boot_id,
            host_id=host_id,
            agent_pid_namespace=agent_ns,
            proc_pid_namespace=proc_ns,
        )


# --- the index: (pid namespace, namespaced pid) -> host pid ------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class IndexedProcess:
    host_pid: int
    generation: int
    pid_namespace: int
    namespaced_pid: int


class PidIndex:
    """Which host pid holds (pid namespace inode, namespaced pid): /proc has no reverse lookup.

    Built by the first `refresh` (one listing plus two reads per process), then kept current
    incrementally: each later `refresh` is one listing of the proc root (getdents only, about 1 µs
    per process measured here) plus the same two reads for processes that are new or whose
    generation (the /proc/<pid> inode number) changed — a reused pid number gets a new inode, so it
    is re-read, and the entries of vanished pids are dropped. A lookup that hits costs nothing here
    (the probe verifies the candidate with four reads); only a miss or a stale hit refreshes. A
    full read costs about 25 µs per process measured here, so the incremental refresh is what
    keeps a probe from rescanning all of /proc per registration.

    Sound for absence: a process alive now was alive at the listing, under the inode it then had;
    if that inode matched a cached entry, the cached read was of this very process (the inode
    pins the kernel's `struct pid`). The residual assumption is that procfs inode numbers (a
    32-bit counter shared by all pseudo-filesystems) do not wrap between two refreshes.
    Processes whose entries cannot be read are counted in `unclassified`; while any are, absence
    proves nothing (one of them could be the incarnation) and the probe says Unknown.
    """

    def __init__(self) -> None:
        self._by_host: dict[int, IndexedProcess] = {}
        self._by_key: dict[tuple[int, int], int] = {}
        self._unclassified: set[int] = set()
        self._lock = threading.Lock()
        self.refreshes = 0
        self.reads = 0
        """Processes read (classified or not) over the index's life: its cost, for metrics and tests."""

    def __len__(self) -> int:
        return len(self._by_host)

    @property
    def unclassified(self) -> int:
        return len(self._unclassified)

    def lookup(self, *, pid_namespace: int, namespaced_pid: int) -> int | None:
        with self._lock:
            return self._by_key.get((pid_namespace, namespaced_pid))

    def forget(self, host_pid: int) -> None:
        """Drop an entry the caller found stale, so the next refresh re-reads that pid."""
        with self._lock:
            self._drop(host_pid)

    def _drop(self, host_pid: int) -> None:
        entry = self._by_host.pop(host_pid, None)
        if entry is not None:
            key = (entry.pid_namespace, entry.namespaced_pid)
            if self._by_key.get(key) == host_pid:
                del self._by_key[key]
        self._unclassified.discard(host_pid)

    def refresh(self, *, reader: ProcReader, proc_pid_namespace: int | None = None) -> None:
        """List the proc root and re-read what is new or changed. OSError: the listing failed.

        `proc_pid_namespace` (LocalNode's) lets processes of the proc root's own namespace be
        classified without their ns/pid link (see `procfs.pid_namespace_of`).
        """
        listing = dict(reader.list_pids())
        with self._lock:
            self.refreshes += 1
            for host_pid in [pid for pid in self._by_host if pid not in listing]:
                self._drop(host_pid)
            for host_pid in [pid for pid in self._unclassified if pid not in listing]:
                self._unclassified.discard(host_pid)
            for host_pid, generation in listing.items():
                cached = self._by_host.get(host_pid)
                if cached is not None and cached.generation == generation and generation > _NO_GENERATION:
                    continue
                self._drop(host_pid)
                self._classify(
                    reader=reader, host_pid=host_pid, generation=generation, proc_pid_namespace=proc_pid_namespace
                )

    def _classify(self, *, reader: ProcReader, host_pid: int, generation: int, proc_pid_namespace: int | None) -> None:
        self.reads += 1
        try:
            status = procfs.parse_status(reader.read_status(host_pid))
            link = None
            if len(status.nspid) > 1 or proc_pid_namespace is None:
                link = reader.read_pid_namespace_link(host_pid)
            pid_namespace = procfs.pid_namespace_of(
                status=status, pid_namespace_link=link, proc_pid_namespace=proc_pid_namespace
            )
        except OSError as exc:
            if exc.errno in _VANISHED and self._gone(reader=reader, host_pid=host_pid, generation=generation):
                return  # exited since the listing: it holds nothing any more
            self._unclassified.add(host_pid)
            return
        except ParseError:
            self._unclassified.add(host_pid)
            return
        entry = IndexedProcess(
            host_pid=host_pid, generation=generation, pid_namespace=pid_namespace, namespaced_pid=status.namespaced_pid
        )
        self._by_host[host_pid] = entry
        # The two reads are not atomic with the listing: on a (transient) clash the newest read
        # wins, and the probe verifies every candidate before relying on it.
        self._by_key[(pid_namespace, status.namespaced_pid)] = host_pid

    @staticmethod
    def _gone(*, reader: ProcReader, host_pid: int, generation: int) -> bool:
        """Confirms a read's "vanished" against a fresh listing before treating the pid as free.

        A read error alone is one observation; absence is what lets the probe say ProcAbsent, so
        it is only believed when the listing agrees (the pid is gone, or is another /proc inode).
        Found by the property test_a_live_incarnation_is_never_dead: a single transient ESRCH on
        a live process's status made its incarnation ProcAbsent.
        """
        try:
            listing = dict(reader.list_pids())
        except OSError:
            return False
        return listing.get(host_pid) != generation


# --- pidfds --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class PinnedPidfd:
    fd: int
    host_pid: int


class PidfdTable:
    """Pidfds pinned to incarnations, at most `max_pinned` of them; closed when forgotten.

    Incarnations probed `Alive` that could not be pinned (at the limit, or pidfd_open failed with
    EMFILE) are counted in `unpinned`: their deaths are found by the periodic resync, not by an
    event. Thread-safe.
    """

    def __init__(self, *, max_pinned: int = 20000, close: Callable[[int], None] = os.close) -> None:
        self.max_pinned = max_pinned
        self._close = close
        self._pinned: dict[IncarnationKey, PinnedPidfd] = {}
        self._unpinned: set[IncarnationKey] = set()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._pinned)

    @property
    def unpinned(self) -> int:
        """How many live incarnations are known but not pinned (resolved by resync instead)."""
        return len(self._unpinned)

    @property
    def full(self) -> bool:
        return len(self._pinned) >= self.max_pinned

    def get(self, key: IncarnationKey) -> PinnedPidfd | None:
        with self._lock:
            return self._pinned.get(key)

    def adopt(self, key: IncarnationKey, *, fd: int, host_pid: int, exited: bool = False) -> bool:
        """Keep `fd` for `key` (True; the table now owns it) or refuse (False; the caller closes it)."""
        with self._lock:
            if key in self._pinned:
                return False  # one fd per incarnation is enough
            if len(self._pinned) >= self.max_pinned:
                self._unpinned.add(key)
                return False
            entry = PinnedPidfd(fd=fd, host_pid=host_pid)
            self._pinned[key] = entry
            self._unpinned.discard(key)
        self._watch(key, entry, exited=exited)
        return True

    def note_unpinned(self, key: IncarnationKey) -> None:
        with self._lock:
            if key not in self._pinned:
                self._unpinned.add(key)

    def release(self, key: IncarnationKey) -> None:
        """Forget an incarnation: close its pidfd (if any) and stop counting it."""
        with self._lock:
            entry = self._pinned.pop(key, None)
            self._unpinned.discard(key)
        if entry is not None:
            self._dispose(entry)

    def incarnations(self) -> list[IncarnationKey]:
        with self._lock:
            return [*self._pinned, *self._unpinned]

    def close(self) -> None:
        for key in self.incarnations():
            self.release(key)

    # Hooks for the watcher.
    def _watch(self, key: IncarnationKey, entry: PinnedPidfd, *, exited: bool) -> None:
        del key, entry, exited

    def _dispose(self, entry: PinnedPidfd) -> None:
        self._close(entry.fd)


class PidfdWatcher(PidfdTable):
    """Turns pinned pidfds into events: `on_exit(key)` runs on the loop when one becomes readable.

    No polling: each pidfd is registered with `loop.add_reader` (epoll underneath) — measured here,
    kill -9 to callback took 0.24-0.31 ms. A pidfd stays readable forever once its thread group
    exited, so the reader is removed when it fires (or a level-triggered loop would spin), while
    the fd stays in the table: the next probe reads it and says `PidfdExited`. Selector changes and
    closes happen on the loop's thread; an fd is closed only after it left the selector, so a
    reused fd number is never confused with a forgotten one.
    """

    def __init__(
        self,
        *,
        loop: asyncio.AbstractEventLoop,
        on_exit: Callable[[IncarnationKey], None],
        max_pinned: int = 20000,
        close: Callable[[int], None] = os.close,
    ) -> None:
        super().__init__(max_pinned=max_pinned, close=close)
        self._loop = loop
        self._on_exit = on_exit
        self._watched: dict[int, IncarnationKey] = {}
        self.fired = 0

    @property
    def watched(self) -> int:
        return len(self._watched)

    def _in_loop(self, function: Callable[..., None], *args: object) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop or self._loop.is_closed():
            function(*args)
        else:
            self._loop.call_soon_threadsafe(function, *args)

    def _watch(self, key: IncarnationKey, entry: PinnedPidfd, *, exited: bool) -> None:
        if not exited:  # an already-readable fd would only fire at once for a verdict already out
            self._in_loop(self._add_reader, key, entry)

    def _add_reader(self, key: IncarnationKey, entry: PinnedPidfd) -> None:
        if self.get(key) is not entry or self._loop.is_closed():
            return  # released before we got here (_dispose closes it), or shutting down
        self._loop.add_reader(entry.fd, self._fire, key, entry)
        self._watched[entry.fd] = key

    def _fire(self, key: IncarnationKey, entry: PinnedPidfd) -> None:
        self._unwatch(entry)
        self.fired += 1
        self._on_exit(key)

    def _unwatch(self, entry: PinnedPidfd) -> None:
        if self._watched.pop(entry.fd, None) is not None and not self._loop.is_closed():
            self._loop.remove_reader(entry.fd)

    def _dispose(self, entry: PinnedPidfd) -> None:
        self._in_loop(self._unwatch_and_close, entry)

    def _unwatch_and_close(self, entry: PinnedPidfd) -> None:
        self._unwatch(entry)
        self._close(entry.fd)


# --- the probe -----------------------------------------------------------------------------------


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


class _Changed(Exception):
    """The process under the probe changed between two reads: resolve again (once)."""


class _Unestablished(Exception):
    """A fact the verdict needs cannot be established: the probe answers Unknown with this."""

    def __init__(self, evidence: Evidence, detail: str) -> None:
        super().__init__(detail)
        self.evidence = evidence
        self.detail = detail


def _unknown(evidence: Evidence, detail: str, host_pid: int | None = None) -> ProbeResult:
    return ProbeResult(verdict=Verdict.UNKNOWN, evidence=evidence, detail=detail, host_pid=host_pid)


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
    if registration_node != node.node_name:
        return _unknown(
            Evidence.FOREIGN_NODE,
            f"the registration is for node {registration_node!r}; this agent serves {node.node_name!r}",
        )
    try:
        key = procfs.recorded_incarnation(
            boot_id=incarnation.boot_id,
            pid_namespace=incarnation.pid_namespace,
            pid=incarnation.pid,
            start_time=incarnation.start_time,
        )
    except ParseError as exc:
        return _unknown(Evidence.INVALID_INCARNATION, f"the recorded incarnation is invalid: {exc}")
    if node.boot_id is None:
        return _unknown(Evidence.BOOT_ID_UNREADABLE, "this node's boot id cannot be read")
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
        except _Changed:
            continue  # a pid vanished or was reused between two reads: look again, from scratch
        except _Unestablished as exc:
            return _unknown(exc.evidence, exc.detail)
    return _unknown(
        Evidence.PROCESS_CHANGED_DURING_PROBE,
        f"pid {key.pid} in pid namespace {key.pid_namespace} changed under two successive probes",
    )


def _from_held_pidfd(*, key: IncarnationKey, held: PinnedPidfd, reader: ProcReader, pidfds: PidfdTable) -> ProbeResult:
    try:
        exited = reader.pidfd_exited(held.fd)
    except OSError as exc:
        # Never happens to a valid pidfd; if it does, the fd proves nothing any more.
        pidfds.release(key)
        return _unknown(Evidence.PIDFD_UNAVAILABLE, f"polling the pidfd of host pid {held.host_pid} failed: {exc}")
    if exited:
        return ProbeResult(
            verdict=Verdict.DEAD,
            evidence=Evidence.PIDFD_EXITED,
            detail=f"the pidfd of host pid {held.host_pid} is readable: its whole thread group exited",
            host_pid=held.host_pid,
        )
    return ProbeResult(
        verdict=Verdict.ALIVE,
        evidence=Evidence.PIDFD_PINNED,
        detail=f"the pidfd pinned to host pid {held.host_pid} is not readable: its thread group runs",
        host_pid=held.host_pid,
    )


def _resolve(
    *, key: IncarnationKey, same_boot: bool, node: LocalNode, reader: ProcReader, index: PidIndex, pidfds: PidfdTable
) -> ProbeResult:
    view = _find(key=key, proc_pid_namespace=node.proc_pid_namespace, reader=reader, index=index)
    where = f"pid {key.pid} in pid namespace {key.pid_namespace}"
    if view is None:
        if not node.sees_every_process:
            return _unknown(
                Evidence.NOT_ROOT_PID_NAMESPACE,
                f"no process holds {where}, but this agent (pid namespace {node.agent_pid_namespace}) or its "
                f"/proc (pid namespace {node.proc_pid_namespace}) is not the root pid namespace and may not see it",
            )
        if same_boot:
            return ProbeResult(
                verdict=Verdict.DEAD, evidence=Evidence.PROC_ABSENT, detail=f"no process holds {where} on this boot"
            )
        return ProbeResult(
            verdict=Verdict.DEAD,
            evidence=Evidence.BOOT_BOUNDARY,
            detail=f"recorded on boot {key.boot_id}, this is boot {node.boot_id}, and no process holds {where}",
        )
    holder = f"host pid {view.host_pid} (state {view.state}, start time {view.start_time})"
    if view.start_time != key.start_time:
        reuser, exited, note = _watch_reuser(view=view, node=node, reader=reader, pidfds=pidfds)
        return ProbeResult(
            verdict=Verdict.REUSED,
            evidence=Evidence.START_TIME_DIFFERS,
            detail=f"{where} is held by {holder}, not the recorded start time {key.start_time}; {note}",
            host_pid=view.host_pid,
            reuser=reuser,
            reuser_exited=exited,
        )
    if not _holds(view, key) or not view.is_thread_group_leader:
        # Only the root-namespace lookup can get here: the number is held, by something that cannot
        # be the recorded process (a thread, or a task of a child namespace), at the same tick.
        return _unknown(
            Evidence.INCARNATION_CONTRADICTED,
            f"{where} is held by {holder}, a thread of {view.tgid} in pid namespace {view.pid_namespace} "
            f"with the recorded start time",
            view.host_pid,
        )
    if not same_boot:
        return _unknown(
            Evidence.INCARNATION_CONTRADICTED,
            f"recorded on boot {key.boot_id}, this is boot {node.boot_id}, yet {holder} matches the rest "
            f"of the incarnation",
            view.host_pid,
        )
    return _pin(key=key, view=view, proc_pid_namespace=node.proc_pid_namespace, reader=reader, pidfds=pidfds)


def _find(
    *, key: IncarnationKey, proc_pid_namespace: int | None, reader: ProcReader, index: PidIndex
) -> ProcessView | None:
    """The process holding the recorded (namespace, pid) now, or None if no process does."""
    if key.pid_namespace == ROOT_PID_NAMESPACE:
        # In the root namespace the namespaced pid is the host pid: one lookup, no listing. A pid
        # that does not resolve (ENOENT) is held by no task at all, thread or process.
        return _read_view(reader=reader, host_pid=key.pid, proc_pid_namespace=proc_pid_namespace)
    candidate = index.lookup(pid_namespace=key.pid_namespace, namespaced_pid=key.pid)
    if candidate is not None:
        view = _read_view(reader=reader, host_pid=candidate, proc_pid_namespace=proc_pid_namespace)
        if view is not None and _holds(view, key):
            return view
        index.forget(candidate)  # stale: that host pid now belongs to someone else, or nobody
    # A miss proves nothing until /proc has been listed after the incarnation started: the index
    # may predate it. So absence is always judged on a listing taken now.
    try:
        index.refresh(reader=reader, proc_pid_namespace=proc_pid_namespace)
    except OSError as exc:
        raise _Unestablished(Evidence.PROC_UNREADABLE, f"cannot list the proc root: {exc}") from exc
    candidate = index.lookup(pid_namespace=key.pid_namespace, namespaced_pid=key.pid)
    if candidate is None:
        if index.unclassified:
            raise _Unestablished(
                Evidence.PROC_UNREADABLE,
                f"{index.unclassified} processes could not be read; any of them could hold pid {key.pid} "
                f"in pid namespace {key.pid_namespace}",
            )
        return None
    view = _read_view(reader=reader, host_pid=candidate, proc_pid_namespace=proc_pid_namespace)
    if view is None or not _holds(view, key):
        raise _Changed  # it changed between the listing and the read
    return view


def _holds(view: ProcessView, key: IncarnationKey) -> bool:
    return view.pid_namespace == key.pid_namespace and view.namespaced_pid == key.pid


def _read_view(*, reader: ProcReader, host_pid: int, proc_pid_namespace: int | None) -> ProcessView | None:
    """stat, status, (ns link), stat again; None if the pid resolves to no task at the first read."""
    try:
        first = reader.read_stat(host_pid)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None  # the path lookup failed: no task holds this number now
        if exc.errno == errno.ESRCH:
            raise _Changed from exc  # it existed at open and exited before the read
        raise _Unestablished(Evidence.PROC_UNREADABLE, f"cannot read /proc/{host_pid}/stat: {exc}") from exc
    try:
        status_text = reader.read_status(host_pid)
        status = procfs.parse_status(status_text)
        link = None
        if len(status.nspid) > 1 or proc_pid_namespace is None:
            link = _read_link(reader=reader, host_pid=host_pid)
        second = reader.read_stat(host_pid)
    except OSError as exc:
        if exc.errno in _VANISHED:
            raise _Changed from exc
        raise _Unestablished(Evidence.PROC_UNREADABLE, f"cannot read /proc/{host_pid}: {exc}") from exc
    except ParseError as exc:
        raise _Unestablished(Evidence.PROC_UNREADABLE, f"/proc/{host_pid}/status: {exc}") from exc
    try:
        first_stat, second_stat = procfs.parse_stat(first), procfs.parse_stat(second)
    except ParseError as exc:
        raise _Unestablished(Evidence.START_TIME_UNREADABLE, f"/proc/{host_pid}/stat: {exc}") from exc
    if first_stat.start_time != second_stat.start_time or first_stat.pid != second_stat.pid:
        # The number was reused between the reads: status and link may describe either process.
        raise _Changed
    try:
        return procfs.process_view(
            stat=second, status=status_text, pid_namespace_link=link, proc_pid_namespace=proc_pid_namespace
        )
    except ParseError as exc:
        raise _Unestablished(Evidence.PROC_UNREADABLE, f"/proc/{host_pid}: {exc}") from exc


def _read_link(*, reader: ProcReader, host_pid: int) -> str:
    try:
        return reader.read_pid_namespace_link(host_pid)
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM):
            raise
        # The kernel answers EACCES both when ptrace access is denied and when the task was
        # released after the path lookup; stat tells which (vanished -> ENOENT/ESRCH -> _Changed).
        reader.read_stat(host_pid)
        raise _Unestablished(
            Evidence.PID_NAMESPACE_NOT_VISIBLE, f"the pid namespace of host pid {host_pid} cannot be read: {exc}"
        ) from exc


def _pin(
    *, key: IncarnationKey, view: ProcessView, proc_pid_namespace: int | None, reader: ProcReader, pidfds: PidfdTable
) -> ProbeResult:
    host_pid = view.host_pid
    try:
        fd = reader.open_pidfd(host_pid)
    except OSError as exc:
        if exc.errno in _VANISHED:
            raise _Changed from exc  # reaped (or the number moved to a thread) since the read
        pidfds.note_unpinned(key)
        return _unknown(_unpinnable_evidence(view), f"pidfd_open({host_pid}) failed: {exc}; left to resync", host_pid)
    try:
        # pidfd_open numbers pids in the agent's namespace, /proc in its own: the fd's pid as the
        # proc root numbers it must be the host pid we read, or the fd pins some other process.
        try:
            pinned_pid = reader.pidfd_pid(fd)
        except OSError as exc:
            pidfds.note_unpinned(key)
            raise _Unestablished(
                _unpinnable_evidence(view), f"cannot map the pidfd of {host_pid} onto /proc: {exc}"
            ) from exc
        if pinned_pid is None:
            raise _Changed  # reaped since the read
        if pinned_pid != host_pid:
            pidfds.note_unpinned(key)
            raise _Unestablished(
                _unpinnable_evidence(view),
                f"pidfd_open({host_pid}) pinned what /proc calls pid {pinned_pid}: the agent and its /proc "
                f"are in different pid namespaces",
            )
        # The fd pins whatever held the number at open time: the same start time *after* opening
        # proves that was the recorded incarnation (closes the reuse race between read and open).
        after = _read_view(reader=reader, host_pid=host_pid, proc_pid_namespace=proc_pid_namespace)
        if after is None or not _holds(after, key) or after.start_time != key.start_time:
            raise _Changed
        exited = reader.pidfd_exited(fd)
    except BaseException:
        reader.close_pidfd(fd)
        raise
    if exited:
        if not pidfds.adopt(key, fd=fd, host_pid=host_pid, exited=True):
            reader.close_pidfd(fd)
        return ProbeResult(
            verdict=Verdict.DEAD,
            evidence=Evidence.PIDFD_EXITED,
            detail=f"the pidfd of host pid {host_pid} (state {after.state}) is readable: its whole thread group exited",
            host_pid=host_pid,
        )
    shape = f"state {after.state}, {after.threads} threads"
    if after.state == "Z":
        shape += "; its main thread exited, the others run (state Z is not death)"
    if pidfds.adopt(key, fd=fd, host_pid=host_pid):
        detail = f"host pid {host_pid} ({shape}) pinned by a pidfd, start time re-checked after opening"
    elif pidfds.get(key) is not None:
        reader.close_pidfd(fd)  # a concurrent probe pinned it first; one fd per incarnation is enough
        detail = f"host pid {host_pid} ({shape}) pinned by a pidfd, start time re-checked after opening"
    else:
        reader.close_pidfd(fd)
        detail = (
            f"host pid {host_pid} ({shape}) checked through a pidfd, start time re-checked after opening; "
            f"not kept ({len(pidfds)} pinned, limit {pidfds.max_pinned}): its death is found on resync"
        )
    return ProbeResult(verdict=Verdict.ALIVE, evidence=Evidence.PIDFD_PINNED, detail=detail, host_pid=host_pid)


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
    `_Changed` (resolve again); a holder that cannot be pinned is left to the resync.
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
    except _Unestablished as exc:
        return reuser, False, f"that holder cannot be pinned ({exc.detail}): resync"
    if pinned.verdict is Verdict.DEAD:
        return reuser, True, "that holder exited and is not reaped yet: looked at again shortly"
    if pinned.verdict is Verdict.ALIVE and pidfds.get(reuser) is not None:
        return reuser, False, "that holder is pinned by a pidfd: its exit re-probes this incarnation"
    return reuser, False, f"that holder is not pinned ({pinned.detail}): resync"


def _unpinnable_evidence(view: ProcessView) -> Evidence:
    # Without a pidfd, a zombie leader with threads left is the trap: alive, but not provably so here.
    if view.state == "Z" and view.threads > 1:
        return Evidence.ZOMBIE_THREAD_GROUP_ALIVE
    return Evidence.PIDFD_UNAVAILABLE
