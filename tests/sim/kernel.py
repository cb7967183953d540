"""Simulated nodes: processes, pid namespaces, boots, and the /proc the agent's probe reads.

A `SimNode` holds the kernel's truth (which thread groups run, which exited, which were reaped); a
`SimProcReader` is the production `ProcReader` protocol over it, rendering `/proc/<pid>/stat` and
`status` as the kernel prints them so that the production parsers (`coroner.core.procfs`) parse
them. What the sim knows and the probe does not: `SimProcess.alive` is the oracle's ground truth.

Child pid namespaces behave as the kernel's do: one is made with its pid 1 (a container's first
process), takes processes only while that pid 1 lives, and ends when it exits (every process in it
is killed and reaped); its inode number is freed with it and goes to the next namespace made,
lowest free number first (the kernel's nsfs numbers come from an IDA), so a container restarted
on the node usually gets its old namespace's number back — a new namespace under a recycled inode.
"""

from __future__ import annotations

import errno
import random
from collections.abc import Iterable
from typing import Any

from sim.prod import api, exits

ROOT_NS = api.ROOT_PID_NAMESPACE_INODE
#: The inode numbers child pid namespaces get, lowest free first: inode numbers are recycled, even
#: within a boot (probe.py's docstring measures it), and the sim wants such collisions to happen.
CHILD_NS_POOL = (4026532200, 4026532201, 4026532202, 4026532203, 4026532204, 4026532205)
TICKS = 100  # clock ticks per second (USER_HZ)
#: The initial time namespace, whose clocks the agent reads; another one shifts the start times its
#: processes read (CLOCK_BOOTTIME plus its offset).
ROOT_TIME_NS = 4026531834
OTHER_TIME_NS = 4026532300


#: Where pidfd inode numbers start: any offset will do; it keeps them apart from pids and serials.
PIDFS_FIRST_INODE = 100_000
#: The wait status of a process killed by SIGKILL (with its namespace, by its fate, by a reboot).
SIGKILLED = 9


class SimProcess:
    """One thread group. `exited`: the whole group exited (a pidfd is readable); `reaped`: gone."""

    __slots__ = (
        "comm",
        "exited",
        "generation",
        "host_pid",
        "leader_exited",
        "ns",
        "ns_pid",
        "ns_serial",
        "reaped",
        "serial",
        "start_time",
        "threads",
        "time_ns",
        "wait_status",
    )  # fmt: skip

    def __init__(
        self, *, host_pid: int, ns: int, ns_pid: int, start_time: int, generation: int, serial: int, ns_serial: int
    ) -> None:
        self.host_pid = host_pid
        self.ns_serial = ns_serial
        """Which namespace made under `ns` this process is in (0: the root one): the truth the inode hides."""
        self.time_ns = ROOT_TIME_NS
        self.ns = ns
        self.ns_pid = ns_pid
        self.start_time = start_time
        self.threads = 1
        self.leader_exited = False
        self.exited = False
        self.reaped = False
        self.generation = generation
        self.comm = "worker"
        self.serial = serial
        self.wait_status = SIGKILLED
        """How it ended, as its parent's wait gives it (killed, unless it was made to end otherwise)."""

    @property
    def pidfd_inode(self) -> int:
        """pidfs's inode for it: one per process, never reused on the node (its serial, offset)."""
        return PIDFS_FIRST_INODE + self.serial

    @property
    def alive(self) -> bool:
        """Ground truth: some thread of the group runs (a pthread_exit leader's group included)."""
        return not self.exited

    @property
    def state(self) -> str:
        return "Z" if (self.exited or self.leader_exited) else "S"

    def nspid(self, view_ns: int) -> tuple[int, ...]:
        if view_ns == ROOT_NS:
            return (self.host_pid,) if self.ns == ROOT_NS else (self.host_pid, self.ns_pid)
        return (self.ns_pid,)

    def pid_in(self, view_ns: int) -> int:
        return self.host_pid if view_ns == ROOT_NS else self.ns_pid

    def stat(self, view_ns: int, *, clock_offset: int = 0) -> str:
        """As a reader in `view_ns` whose time namespace shifts start times by `clock_offset` ticks sees it."""
        pid = self.pid_in(view_ns)
        threads = 1 if self.exited else self.threads
        after = [self.state, "1", "1", "1", "0", "-1", "4194560", "0", "0", "0", "0", "0", "0", "0", "0", "20", "0"]
        after += [str(threads), "0", str(max(0, self.start_time + clock_offset)), "0", "0"]
        return f"{pid} ({self.comm}) {' '.join(after)}\n"

    def status(self, view_ns: int) -> str:
        pid = self.pid_in(view_ns)
        threads = 1 if self.exited else self.threads
        state = "Z (zombie)" if self.state == "Z" else "S (sleeping)"
        nspid = "\t".join(map(str, self.nspid(view_ns)))
        return (
            f"Name:\t{self.comm}\nState:\t{state}\nTgid:\t{pid}\nPid:\t{pid}\nPPid:\t1\n"
            f"NSpid:\t{nspid}\nThreads:\t{threads}\n"
        )


class SimNode:
    """One machine: a boot id, a host id, and its thread groups by host pid."""

    def __init__(self, *, name: str, rng: random.Random, now: float) -> None:
        self.name = name
        self.rng = rng
        # Ids from small pools (a trial only needs them distinct within itself), so that the files
        # `LocalNode.read` reads are written once per process, not once per trial.
        self.index = int(name.lstrip("n") or 0)
        self.host_id = f"{self.index:016x}{rng.randrange(8):016x}"
        self.boot_id = ""
        self.boots = 0
        self.serials = 0
        self.generations = 1000
        self.namespace_serials = 0
        self.exit_info = False
        """The kernel gives an exit's wait status to a pidfd's holder (`PIDFD_GET_INFO`, Linux 6.15+)."""
        self.boot(now)

    def boot(self, now: float) -> None:
        """A (re)boot: every process is gone, a new boot id, pid numbering and ticks start over."""
        self.boots += 1
        old = self.boot_id
        while self.boot_id == old:  # a reboot never keeps its boot id
            b = f"{self.index:04x}{self.rng.randrange(64):04x}" + "0" * 24
            self.boot_id = f"{b[:8]}-{b[8:12]}-4{b[13:16]}-8{b[17:20]}-{b[20:32]}"
        self.boot_time = now
        for proc in getattr(self, "procs", {}).values():
            proc.exited = proc.reaped = True  # every thread of every process ends with the boot
        self.procs: dict[int, SimProcess] = {}
        self.next_host_pid = 300
        self.next_ns_pid: dict[int, int] = {}
        self.namespaces: dict[int, SimProcess] = {}
        """Each child pid namespace there is, by inode: its pid 1."""
        self.containers: dict[str, SimProcess] = {}
        """Each container's pid 1 (its namespace's), by the container's name."""

    def ticks(self, now: float) -> int:
        return int((now - self.boot_time) * TICKS) + 1

    def new_namespace(self, *, now: float) -> int:
        """A new child pid namespace, with its pid 1: under the lowest inode number not in use."""
        inode = min(i for i in CHILD_NS_POOL if i not in self.namespaces)
        self.next_ns_pid.pop(inode, None)  # a new namespace numbers from 1 again
        self.namespace_serials += 1
        self.namespaces[inode] = self._spawn(now=now, ns=inode, ns_pid=1, ns_serial=self.namespace_serials)
        self.namespaces[inode].comm = "pause"
        return inode

    def container(self, name: str, *, now: float) -> int:
        """The pid namespace of container `name`: its own while its pid 1 lives, else a new one."""
        init = self.containers.get(name)
        if init is None or init.exited:
            init = self.namespaces[self.new_namespace(now=now)]
            self.containers[name] = init
        return init.ns

    def spawn(
        self, *, now: float, ns: int = ROOT_NS, host_pid: int | None = None, ns_pid: int | None = None
    ) -> SimProcess:
        """A new thread group; `host_pid`/`ns_pid` force a number (ns_last_pid), which must be free.
        A child namespace takes new processes only while its pid 1 lives."""
        if ns == ROOT_NS:
            return self._spawn(now=now, ns=ns, host_pid=host_pid, ns_pid=ns_pid, ns_serial=0)
        init = self.namespaces[ns]
        assert init.alive, f"pid namespace {ns} has no pid 1 any more"
        return self._spawn(now=now, ns=ns, host_pid=host_pid, ns_pid=ns_pid, ns_serial=init.ns_serial)

    def _spawn(
        self, *, now: float, ns: int, ns_serial: int, host_pid: int | None = None, ns_pid: int | None = None
    ) -> SimProcess:
        if host_pid is None:
            host_pid = self.next_host_pid
            while host_pid in self.procs:
                host_pid += 1
            self.next_host_pid = host_pid + 1 + self.rng.randrange(3)
        assert host_pid not in self.procs
        if ns == ROOT_NS:
            ns_pid = host_pid
        elif ns_pid is None:
            ns_pid = self.next_ns_pid.get(ns, 1)
            taken = {p.ns_pid for p in self.procs.values() if p.ns == ns}
            while ns_pid in taken:
                ns_pid += 1
            self.next_ns_pid[ns] = ns_pid + 1
        self.serials += 1
        self.generations += 1 + self.rng.randrange(2)
        proc = SimProcess(
            host_pid=host_pid, ns=ns, ns_pid=ns_pid, start_time=self.ticks(now), generation=self.generations,
            serial=self.serials, ns_serial=ns_serial,
        )  # fmt: skip
        self.procs[host_pid] = proc
        return proc

    def exit(self, proc: SimProcess, *, reap: bool = True, status: int = SIGKILLED) -> list[SimProcess]:
        """`proc` exits with wait status `status`; the processes that exited with it are returned
        (itself first). A namespace's pid 1 takes every process of its namespace with it: killed and
        reaped before it."""
        if not proc.exited:
            proc.wait_status = status
        ended = [proc]
        if not proc.exited and self.namespaces.get(proc.ns) is proc:
            for other in [p for p in self.procs.values() if p.ns == proc.ns and p is not proc]:
                if not other.exited:
                    ended.append(other)
                self.reap(other)
        proc.exited = True
        if reap:
            self.reap(proc)
        return ended

    def reap(self, proc: SimProcess) -> None:
        proc.exited = True
        proc.reaped = True
        if self.procs.get(proc.host_pid) is proc:
            del self.procs[proc.host_pid]
            if self.namespaces.get(proc.ns) is proc:
                del self.namespaces[proc.ns]  # its last process: the namespace and its inode number are freed

    def find(self, *, ns: int, ns_pid: int) -> SimProcess | None:
        for proc in self.procs.values():
            if proc.ns == ns and proc.ns_pid == ns_pid:
                return proc
        return None

    def holder(self, *, ns: int, ns_pid: int) -> SimProcess | None:
        """The process that holds pid `ns_pid` in pid namespace `ns`: in the root namespace every
        process holds one, its host pid, wherever it lives; in a child one, only its own."""
        if ns == ROOT_NS:
            return self.procs.get(ns_pid)
        return self.find(ns=ns, ns_pid=ns_pid)


def _enoent(what: str) -> OSError:
    return OSError(errno.ENOENT, f"No such file or directory: {what}")


class SimProcReader:
    """The production `coroner_agent.probe.ProcReader` over a `SimNode`, from one pid namespace.

    `view_ns` is the namespace of the /proc the agent mounted (root for a hostPID agent; its own
    child namespace for a confined one, which then sees only its own container's processes).
    """

    def __init__(self, node: SimNode, *, agent: SimProcess, view_ns: int = ROOT_NS, unprivileged: bool = False) -> None:
        self.node = node
        self.agent = agent
        self.view_ns = view_ns
        self.unprivileged = unprivileged
        """An agent without ptrace access: every other process's ns links answer EACCES."""
        self._fds: dict[int, SimProcess] = {}
        self._next_fd = 3
        self.flaky: Any = None  # sim.components._Window: the trial's random source inside a window of time
        """While set: each read fails with probability `flake` (EACCES, EIO, or ESRCH as if the
        task were released between the path lookup and the read)."""
        self.flake = 0.0

    def _maybe_fail(self, pid: int) -> None:
        if self.flaky is not None and self.flaky.random() < self.flake:
            code = self.flaky.choice((errno.EACCES, errno.EIO, errno.ESRCH))
            raise OSError(code, f"simulated {errno.errorcode[code]} reading /proc/{pid}")

    def _visible(self) -> Iterable[SimProcess]:
        if self.view_ns == ROOT_NS:
            return self.node.procs.values()
        return [p for p in self.node.procs.values() if p.ns == self.view_ns]

    def _proc(self, pid: int) -> SimProcess:
        if self.view_ns == ROOT_NS:
            proc = self.node.procs.get(pid)
        else:
            proc = next((p for p in self.node.procs.values() if p.ns == self.view_ns and p.ns_pid == pid), None)
        if proc is None:
            raise _enoent(f"/proc/{pid}")
        return proc

    def list_pids(self) -> list[tuple[int, int]]:
        return [(p.pid_in(self.view_ns), p.generation) for p in self._visible()]

    def read_stat(self, pid: int) -> str:
        proc = self._proc(pid)
        self._maybe_fail(pid)
        return proc.stat(self.view_ns)

    def read_status(self, pid: int) -> str:
        proc = self._proc(pid)
        self._maybe_fail(pid)
        return proc.status(self.view_ns)

    def _no_ptrace_access(self, proc: SimProcess) -> None:
        if self.unprivileged and proc is not self.agent:
            raise OSError(errno.EACCES, "Permission denied")

    def read_pid_namespace_link(self, pid: int) -> str:
        proc = self._proc(pid)
        self._maybe_fail(pid)
        self._no_ptrace_access(proc)
        return f"pid:[{proc.ns}]"

    def read_time_namespace_link(self, pid: int) -> str:
        proc = self._proc(pid)
        self._maybe_fail(pid)
        self._no_ptrace_access(proc)
        return f"time:[{proc.time_ns}]"

    def self_pid(self) -> int:
        return self.agent.pid_in(self.view_ns)

    def open_pidfd(self, pid: int) -> int:
        try:
            proc = self._proc(pid)
        except OSError as exc:
            raise OSError(errno.ESRCH, "No such process") from exc
        fd = self._next_fd
        self._next_fd += 1
        self._fds[fd] = proc
        return fd

    def pidfd_pid(self, fd: int) -> int | None:
        proc = self._fds.get(fd)
        if proc is None:
            raise OSError(errno.EBADF, "Bad file descriptor")
        return None if proc.reaped else proc.pid_in(self.view_ns)

    def pidfd_exited(self, fd: int) -> bool:
        proc = self._fds.get(fd)
        if proc is None:
            raise OSError(errno.EBADF, "Bad file descriptor")
        return proc.exited

    def pidfd_exit(self, fd: int) -> exits.Exit:
        proc = self._fds.get(fd)
        if proc is None:
            raise OSError(errno.EBADF, "Bad file descriptor")
        if not self.node.exit_info:
            return exits.Exit(exits.Ending.UNKNOWN)
        if not proc.reaped:
            return exits.Exit(exits.Ending.UNREAPED)
        return exits.Exit(exits.ending(proc.wait_status), proc.wait_status)

    def close_pidfd(self, fd: int) -> None:
        self._fds.pop(fd, None)

    def pidfd_inode(self, fd: int) -> int | None:
        proc = self._fds.get(fd)
        if proc is None:
            raise OSError(errno.EBADF, "Bad file descriptor")
        return proc.pidfd_inode

    def proc_mount_options(self) -> tuple[str, ...]:
        return ("rw", "nosuid", "rw")  # a node's /proc as kubelet's runtimes mount it: no hidepid

    def pinned(self) -> list[tuple[int, SimProcess]]:
        return list(self._fds.items())


def describe(proc: SimProcess | None) -> dict[str, Any]:
    if proc is None:
        return {}
    return {"hostPid": proc.host_pid, "ns": proc.ns, "nsPid": proc.ns_pid, "startTime": proc.start_time}
