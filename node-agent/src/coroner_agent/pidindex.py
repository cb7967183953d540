"""Which host pid holds (pid namespace inode, namespaced pid): the probe's index of /proc.

/proc has no reverse lookup from a namespaced pid to the host pid; `PidIndex` keeps one current
incrementally, read through the probe's `ProcReader`.
"""

from __future__ import annotations

import dataclasses
import errno
import threading
from typing import Final

from coroner.core import procfs
from coroner.core.procfs import ParseError
from coroner_agent.proc import VANISHED, ProcReader

#: A listing entry whose inode number the kernel could not give (proc_fill_cache falls back to 1).
_NO_GENERATION: Final = 1


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

    The same listing also indexes processes by pidfd inode (`coroner.pidfs`), for incarnations that
    recorded one: a refresh `with_inodes` opens a pidfd for each listed process whose inode it has
    not read under its current generation (one open, fstat and close: no ptrace access needed, no
    /proc file read). `inodes_unclassified` counts those it could not, and guards absence by inode
    as `unclassified` guards the other. A refresh without it opens nothing.
    """

    def __init__(self) -> None:
        self._by_host: dict[int, IndexedProcess] = {}
        self._by_key: dict[tuple[int, int], int] = {}
        self._unclassified: set[int] = set()
        self._refused: dict[int, int] = {}
        """Of the unclassified: those whose ns/pid link was refused (no ptrace access), with the pid
        they have in their own namespace (NSpid's last entry, which every user may read): such a
        process can hold no (namespace, pid) with another pid."""
        self._inodes: dict[int, tuple[int, int]] = {}
        """host pid -> (generation, pidfd inode) of what was read under that generation."""
        self._by_inode: dict[int, int] = {}
        self._inodes_unclassified: set[int] = set()
        self._lock = threading.Lock()
        self.refreshes = 0
        self.reads = 0
        """Processes read (classified or not) over the index's life: its cost, for metrics and tests."""

    def __len__(self) -> int:
        return len(self._by_host)

    @property
    def unclassified(self) -> int:
        return len(self._unclassified)

    def could_hold(self, namespaced_pid: int) -> bool:
        """Some process could not be classified and may hold a (namespace, `namespaced_pid`): one
        whose status could not be read, or whose link was refused while its own pid is that one."""
        with self._lock:
            return any(self._refused.get(host_pid, namespaced_pid) == namespaced_pid for host_pid in self._unclassified)

    @property
    def inodes_unclassified(self) -> int:
        return len(self._inodes_unclassified)

    def lookup(self, *, pid_namespace: int, namespaced_pid: int) -> int | None:
        with self._lock:
            return self._by_key.get((pid_namespace, namespaced_pid))

    def lookup_inode(self, pidfd_inode: int) -> int | None:
        with self._lock:
            return self._by_inode.get(pidfd_inode)

    def forget(self, host_pid: int) -> None:
        """Drop an entry the caller found stale, so the next refresh re-reads that pid."""
        with self._lock:
            self._drop(host_pid)
            self._drop_inode(host_pid)

    def _drop_inode(self, host_pid: int) -> None:
        read = self._inodes.pop(host_pid, None)
        if read is not None and self._by_inode.get(read[1]) == host_pid:
            del self._by_inode[read[1]]
        self._inodes_unclassified.discard(host_pid)

    def _drop(self, host_pid: int) -> None:
        entry = self._by_host.pop(host_pid, None)
        if entry is not None:
            key = (entry.pid_namespace, entry.namespaced_pid)
            if self._by_key.get(key) == host_pid:
                del self._by_key[key]
        self._unclassified.discard(host_pid)
        self._refused.pop(host_pid, None)

    def refresh(self, *, reader: ProcReader, proc_pid_namespace: int | None = None, with_inodes: bool = False) -> None:
        """List the proc root and re-read what is new or changed. OSError: the listing failed.

        `proc_pid_namespace` (LocalNode's) lets processes of the proc root's own namespace be
        classified without their ns/pid link (see `procfs.pid_namespace_of`). `with_inodes` also
        reads pidfd inodes: the caller must have checked that pidfd_open numbers pids as the proc
        root does (the agent and its /proc share a pid namespace), or they would be other processes'.
        """
        listing = dict(reader.list_pids())
        with self._lock:
            for host_pid in [pid for pid in self._inodes if pid not in listing]:
                self._drop_inode(host_pid)
            for host_pid in [pid for pid in self._inodes_unclassified if pid not in listing]:
                self._inodes_unclassified.discard(host_pid)
            if with_inodes:
                for host_pid, generation in listing.items():
                    read = self._inodes.get(host_pid)
                    if read is None or read[0] != generation or generation <= _NO_GENERATION:
                        self._drop_inode(host_pid)
                        self._read_inode(reader=reader, host_pid=host_pid, generation=generation)
            self.refreshes += 1
            for host_pid in [pid for pid in self._by_host if pid not in listing]:
                self._drop(host_pid)
            for host_pid in [pid for pid in self._unclassified if pid not in listing]:
                self._unclassified.discard(host_pid)
                self._refused.pop(host_pid, None)
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
                try:
                    link = reader.read_pid_namespace_link(host_pid)
                except OSError as exc:
                    if exc.errno not in (errno.EACCES, errno.EPERM):
                        raise
                    self._unclassified.add(host_pid)
                    self._refused[host_pid] = status.namespaced_pid
                    return
            pid_namespace = procfs.pid_namespace_of(
                status=status, pid_namespace_link=link, proc_pid_namespace=proc_pid_namespace
            )
        except OSError as exc:
            if exc.errno in VANISHED and self._gone(reader=reader, host_pid=host_pid, generation=generation):
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

    def _read_inode(self, *, reader: ProcReader, host_pid: int, generation: int) -> None:
        try:
            fd = reader.open_pidfd(host_pid)
            try:
                inode = reader.pidfd_inode(fd)
            finally:
                reader.close_pidfd(fd)
        except OSError as exc:
            if exc.errno in VANISHED and self._gone(reader=reader, host_pid=host_pid, generation=generation):
                return  # exited since the listing: it has no inode any more
            self._inodes_unclassified.add(host_pid)
            return
        if inode is None:
            self._inodes_unclassified.add(host_pid)  # no pidfs here: no inode names one process
            return
        # Opened after the listing: if the number changed hands in between, this is a newer
        # process's inode under the old generation; the next refresh reads it again (the listing
        # shows the new generation), and the probe verifies every candidate with a pidfd of its own.
        # A process alive throughout was listed under its own number, so it cannot be missed.
        self._inodes[host_pid] = (generation, inode)
        self._by_inode[inode] = host_pid

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
