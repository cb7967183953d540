"""The kernel as the probe reads it: /proc (the real one, or a proc root mounted elsewhere), pidfds,
and this node's own facts.

The I/O goes through `ProcReader`, so every branch of the probe is testable with a fake;
`HostProcReader` is the real one, rooted at a configurable proc root (tests simulate nodes with other
boot-id files). `read_view` reads one process consistently or says why it could not: `Changed` (it
vanished or its number was reused between two reads: resolve again) or `Unestablished` (a fact the
verdict needs cannot be read: the probe answers Unknown with its evidence).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import select
from collections.abc import Iterable
from typing import Final, Protocol

from coroner import pidfs
from coroner.core import api, procfs
from coroner.core.exits import Exit
from coroner.core.procfs import ParseError, ProcessView
from coroner.core.reasons import Evidence
from coroner_agent import verdict

BOOT_ID_FILE: Final = "/proc/sys/kernel/random/boot_id"
MACHINE_ID_FILE: Final = "/etc/machine-id"
#: Always the agent's own /proc, whatever the proc root: pidfd_open numbers pids in *its* namespace.
SELF_PID_NAMESPACE_LINK: Final = "/proc/self/ns/pid"

#: A pid that is not there any more: reading /proc/<pid>/... of a task that exited and was reaped.
VANISHED: Final = frozenset({errno.ENOENT, errno.ESRCH})


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
    def read_time_namespace_link(self, pid: int) -> str:
        """`/proc/<pid>/ns/time`: whose clocks (CLOCK_BOOTTIME, so start times) the process reads."""
        ...

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

    def pidfd_exit(self, fd: int) -> Exit:
        """How the process of a readable pidfd ended (`coroner.pidfs.exit_of`)."""
        ...

    def close_pidfd(self, fd: int) -> None: ...

    def pidfd_inode(self, fd: int) -> int | None:
        """The pidfd's inode (`coroner.pidfs.inode`): one per process on this boot; None where the
        kernel gives no such number."""
        ...

    def proc_mount_options(self) -> tuple[str, ...]:
        """The options of the proc mount that serves the proc root (`procfs.parse_proc_mount_options`)."""
        ...


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

    def read_time_namespace_link(self, pid: int) -> str:
        return os.readlink(self._path(pid, "ns/time"))

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

    def pidfd_exit(self, fd: int) -> Exit:
        return pidfs.exit_of(fd)

    def close_pidfd(self, fd: int) -> None:
        os.close(fd)

    def pidfd_inode(self, fd: int) -> int | None:
        return pidfs.inode(fd)

    def proc_mount_options(self) -> tuple[str, ...]:
        try:
            return procfs.parse_proc_mount_options(
                self._read("/proc/self/mountinfo"), mount_point=os.path.realpath(self.proc_root)
            )
        except ParseError as exc:
            raise OSError(errno.EINVAL, str(exc)) from exc


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
    proc_hides_processes: bool | None
    """The proc root is mounted with hidepid (it may not list a live process, and answers ENOENT
    for it as for no process); None: its mount options could not be read."""

    @property
    def in_root_pid_namespace(self) -> bool:
        return self.agent_pid_namespace == api.ROOT_PID_NAMESPACE_INODE

    @property
    def sees_every_process(self) -> bool:
        """Absence is authoritative only when neither the agent nor its /proc is in a child namespace."""
        return verdict.sees_every_process(
            agent_pid_namespace=self.agent_pid_namespace,
            proc_pid_namespace=self.proc_pid_namespace,
            proc_hides_processes=self.proc_hides_processes,
        )

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
        try:
            hides: bool | None = procfs.hides_processes(reader.proc_mount_options())
        except OSError:
            hides = None
        return cls(
            node_name=node_name,
            boot_id=boot_id,
            host_id=host_id,
            agent_pid_namespace=agent_ns,
            proc_pid_namespace=proc_ns,
            proc_hides_processes=hides,
        )


class Changed(Exception):
    """The process under the probe changed between two reads: resolve again (once)."""


class Unestablished(Exception):
    """A fact the verdict needs cannot be established: the probe answers Unknown with this."""

    def __init__(self, evidence: Evidence, detail: str) -> None:
        super().__init__(detail)
        self.evidence = evidence
        self.detail = detail


def read_view(
    *, reader: ProcReader, host_pid: int, proc_pid_namespace: int | None, namespace_required: bool = True
) -> ProcessView | None:
    """stat, status, (ns link), stat again; None if the pid resolves to no task at the first read.

    Without `namespace_required` (a process found by its pidfd inode), a pid namespace link the
    agent may not read leaves `pid_namespace` 0 instead of Unestablished."""
    try:
        first = reader.read_stat(host_pid)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None  # the path lookup failed: no task holds this number now
        if exc.errno == errno.ESRCH:
            raise Changed from exc  # it existed at open and exited before the read
        raise Unestablished(Evidence.PROC_UNREADABLE, f"cannot read /proc/{host_pid}/stat: {exc}") from exc
    try:
        status_text = reader.read_status(host_pid)
        status = procfs.parse_status(status_text)
        link = None
        if len(status.nspid) > 1 or proc_pid_namespace is None:
            link = _read_link(reader=reader, host_pid=host_pid, required=namespace_required)
        second = reader.read_stat(host_pid)
    except OSError as exc:
        if exc.errno in VANISHED:
            raise Changed from exc
        raise Unestablished(Evidence.PROC_UNREADABLE, f"cannot read /proc/{host_pid}: {exc}") from exc
    except ParseError as exc:
        raise Unestablished(Evidence.PROC_UNREADABLE, f"/proc/{host_pid}/status: {exc}") from exc
    try:
        first_stat, second_stat = procfs.parse_stat(first), procfs.parse_stat(second)
    except ParseError as exc:
        raise Unestablished(Evidence.START_TIME_UNREADABLE, f"/proc/{host_pid}/stat: {exc}") from exc
    if first_stat.start_time != second_stat.start_time or first_stat.pid != second_stat.pid:
        # The number was reused between the reads: status and link may describe either process.
        raise Changed
    try:
        return procfs.process_view(
            stat=second,
            status=status_text,
            pid_namespace_link=link,
            proc_pid_namespace=proc_pid_namespace,
            namespace_required=namespace_required,
        )
    except ParseError as exc:
        raise Unestablished(Evidence.PROC_UNREADABLE, f"/proc/{host_pid}: {exc}") from exc


def _read_link(*, reader: ProcReader, host_pid: int, required: bool = True) -> str | None:
    try:
        return reader.read_pid_namespace_link(host_pid)
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM):
            raise
        # The kernel answers EACCES both when ptrace access is denied and when the task was
        # released after the path lookup; stat tells which (vanished -> ENOENT/ESRCH -> Changed).
        reader.read_stat(host_pid)
        if not required:
            return None
        raise Unestablished(
            Evidence.PID_NAMESPACE_NOT_VISIBLE, f"the pid namespace of host pid {host_pid} cannot be read: {exc}"
        ) from exc
