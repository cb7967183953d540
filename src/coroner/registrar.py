"""The registrar: registers the main process of every other container of its Pod, with nothing of
Coroner in their images (a Go binary in a `scratch` image, a JVM, anything).

It runs as a native sidecar (an init container with `restartPolicy: Always`, which the kubelet
starts before the Pod's containers and keeps running beside them) in a Pod with
`shareProcessNamespace: true`, under the Pod's own ServiceAccount token: the registrant the
admission policies see is the Pod's own identity, exactly as for `coroner run` in that Pod
(docs/workers.md). `kubectl coroner inject` adds it to a manifest.

What it reads, all of it readable without ptrace access to the other containers:
- the Pod's processes in its own /proc (the Pod's pid namespace). A container's main process was
  started from outside the namespace (by the runtime), so its parent pid there is 0; of the
  processes so started in one container (its cgroup), the main one started first — a later one is a
  `kubectl exec`. Pid 1 is the Pod's sandbox process; the registrar's own container is skipped.
- each one's incarnation as `coroner run` records it (`procfs.incarnation_from`: stat, status, the
  boot id), its pid namespace being the registrar's own (a process whose `NSpid` has one entry lives
  in the namespace of the /proc that shows it).
- how it ended, from a pidfd opened before the registration: once the runtime has reaped it, the
  kernel's `PIDFD_GET_INFO` gives its wait status (Linux 6.15+). Exit status 0, or death by
  SIGTERM (the kubelet's stop, honoured), is a clean exit: it says goodbye (`Released`). Anything
  else is the node agent's to attest, as today; where the kernel cannot say, it says nothing and logs
  `ExitStatusUnavailable`: unknown is never Released.

It may fail without harm: a registration's name is made from the Pod, the container and the
process's start time, so a restarted registrar registers nothing twice (the create of an existing
name for the same incarnation is idempotent, `launcher.register`), and what it missed while down is
the agent's to attest. One container it cannot register (its name taken, a refusal) is logged and
tried again with a growing delay, while it registers the others; `kubectl coroner doctor` names a
running container of an injected Pod that has no registration.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import re
import select
import threading
import time
from collections.abc import Callable, Iterable
from typing import Final

import urllib3

from coroner import launcher, pidfs
from coroner.client.rest import ApiError, Rest
from coroner.core import procfs
from coroner.core.exits import REAP_WAIT_SECONDS, Ending, ending
from coroner.core.inject import registration_name
from coroner.pidfs import exit_status

logger = logging.getLogger("coroner.registrar")

#: A container whose registration failed is tried again after 1 s, then after twice as long each
#: time, up to a minute: a refusal that lasts (a name taken, the RBAC binding missing) is said once a
#: minute, and one that ends (the binding made) is registered within a minute of it.
RETRY_FIRST_SECONDS: Final = 1.0
RETRY_MAX_SECONDS: Final = 60.0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Seen:
    """One process of the Pod, as the registrar's /proc shows it."""

    pid: int
    ppid: int
    depth: int
    """How many pid namespaces deep from this /proc's (1: its own)."""
    start_time: int
    container: str | None
    """The leaf of its cgroup path (the runtime's container id); None: unreadable."""


_CONTAINER_ID: Final = re.compile(r"(?:cri-containerd-|crio-|docker-)?([0-9a-f]{12,64})(?:\.scope)?", re.ASCII)


def container_of(cgroup: str) -> str | None:
    """The container a process is in, from its /proc/PID/cgroup: the leaf of its cgroup v2 path, else
    of its v1 memory (or pids) hierarchy's, when it is a runtime's container id."""
    paths: dict[str, str] = {}
    for line in cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    for controller in ("", "memory", "pids"):
        path = paths.get(controller, "/")
        if path not in ("", "/"):
            match = _CONTAINER_ID.fullmatch(path.rstrip("/").rsplit("/", 1)[-1])
            return match.group(1) if match else None
    return None


def mains(seen: Iterable[Seen], *, own_pid: int) -> dict[str, Seen]:
    """The main process of each container but the registrar's own: of the processes the runtime
    started in it (parent outside the namespace), in this namespace, the first to start."""
    processes = list(seen)
    own = next((p.container for p in processes if p.pid == own_pid), None)
    found: dict[str, Seen] = {}
    for process in processes:
        if process.pid in (1, own_pid) or process.ppid != 0 or process.depth != 1:
            continue
        if process.container is None or process.container == own:
            continue
        first = found.get(process.container)
        if first is None or (process.start_time, process.pid) < (first.start_time, first.pid):
            found[process.container] = process
    return found


def scan(proc_root: str = "/proc") -> list[Seen]:
    """Every process this /proc shows that could be read (one that exits meanwhile is skipped)."""
    seen = []
    for entry in os.scandir(proc_root):
        if not entry.name.isdigit():
            continue
        root = pathlib.Path(entry.path)
        try:
            stat = procfs.parse_stat((root / "stat").read_bytes())
            status = procfs.parse_status((root / "status").read_bytes())
            cgroup = (root / "cgroup").read_text()
        except (OSError, procfs.ParseError):
            continue
        seen.append(
            Seen(
                pid=int(entry.name),
                ppid=status.ppid,
                depth=len(status.nspid),
                start_time=stat.start_time,
                container=container_of(cgroup),
            )
        )
    return seen


@dataclasses.dataclass(slots=True)
class _Tracked:
    held: launcher.Held
    pidfd: int
    container: str
    pid: int
    start_time: int


@dataclasses.dataclass(frozen=True, slots=True)
class _Failing:
    key: tuple[int, int]
    """The (pid, start time) that failed: another process in the container starts afresh."""
    attempts: int
    next_attempt: float
    """time.monotonic() of the next attempt."""


def _key(process: Seen) -> tuple[int, int]:
    return (process.pid, process.start_time)


class Registrar:
    """Registers each container's main process once, and says goodbye for it on a clean exit."""

    def __init__(
        self,
        *,
        client: Rest,
        namespace: str,
        node_name: str,
        pod_name: str,
        proc_root: str = "/proc",
        boot_id_file: str = "/proc/sys/kernel/random/boot_id",
        machine_id_file: str = "/etc/machine-id",
        reap_wait_seconds: float = REAP_WAIT_SECONDS,
        status_of: Callable[[int], int | None] = exit_status,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.node_name = node_name
        self.pod_name = pod_name
        self.proc_root = proc_root.rstrip("/") or "/"
        self.boot_id_file = boot_id_file
        self.machine_id_file = machine_id_file
        self.reap_wait_seconds = reap_wait_seconds
        self.status_of = status_of
        self.own_pid = int(os.readlink(f"{self.proc_root}/self"))
        self.pid_namespace_link = os.readlink(f"{self.proc_root}/self/ns/pid")
        self.tracked: dict[str, _Tracked] = {}
        """By container: the main process registered and watched now."""
        self.ended: dict[str, tuple[int, int]] = {}
        """By container: the (pid, start time) whose ending was handled, while it is still listed."""
        self.failing: dict[str, _Failing] = {}
        """By container: a main process whose registration failed, and when to try it again."""
        self.endings: list[tuple[str, Ending]] = []
        """(registration name, how it ended), in order: what the registrar saw, for its log and tests."""

    def scan_once(self) -> None:
        """Registers every container main process not registered yet. One container's failure is
        said and tried again later (`_Failing`); the other containers' registrations go on."""
        found = mains(scan(self.proc_root), own_pid=self.own_pid)
        # A process whose ending was handled may still be listed until the runtime reaps it (a
        # zombie stays in its cgroup on cgroup v2): it is not registered again. Forgotten once gone.
        self.ended = {c: key for c, key in self.ended.items() if c in found and key == _key(found[c])}
        self.failing = {c: f for c, f in self.failing.items() if c in found and f.key == _key(found[c])}
        now = time.monotonic()
        for container, process in found.items():
            current = self.tracked.get(container)
            if (current is not None and current.pid == process.pid) or self.ended.get(container) == _key(process):
                continue
            failing = self.failing.get(container)
            if failing is not None and now < failing.next_attempt:
                continue
            try:
                self._register(container, process)
            except (
                launcher.RegistrationError,
                ApiError,
                urllib3.exceptions.HTTPError,
                OSError,
                procfs.ParseError,
            ) as exc:
                self._failed(container, process, failing, exc)
            else:
                self.failing.pop(container, None)

    def _failed(self, container: str, process: Seen, failing: _Failing | None, exc: BaseException) -> None:
        attempts = 1 if failing is None else failing.attempts + 1
        delay = min(RETRY_FIRST_SECONDS * 2 ** (attempts - 1), RETRY_MAX_SECONDS)
        self.failing[container] = _Failing(key=_key(process), attempts=attempts, next_attempt=time.monotonic() + delay)
        name = registration_name(pod_name=self.pod_name, container=container, start_time=process.start_time)
        logger.warning(
            "registration failed workerregistration=%s/%s pid=%d container=%s attempts=%d retry_in=%.0fs: %s",
            self.namespace,
            name,
            process.pid,
            container[:12],
            attempts,
            delay,
            exc,
        )

    def _register(self, container: str, process: Seen) -> None:
        try:
            pidfd = os.pidfd_open(process.pid)
        except OSError:
            return  # gone already: nothing to register, and the next scan looks again
        try:
            incarnation = self._incarnation(process.pid, pidfd_inode=pidfs.inode(pidfd))
            # Not reaped after the reads, so the number was not reused under them: the reads and the
            # pidfd (its inode) are of one process.
            if incarnation is None or incarnation.start_time != process.start_time or pidfs.reaped(pidfd):
                os.close(pidfd)
                return  # the number changed hands since the scan
            held = launcher.register(
                client=self.client,
                namespace=self.namespace,
                node_name=self.node_name,
                incarnation=incarnation,
                name=registration_name(pod_name=self.pod_name, container=container, start_time=process.start_time),
                role=f"container-{container[:12]}",
            )
        except BaseException:
            os.close(pidfd)
            raise
        logger.info(
            "registered workerregistration=%s/%s pid=%d container=%s",
            self.namespace,
            held.name,
            process.pid,
            container[:12],
        )
        previous = self.tracked.pop(container, None)
        if previous is not None:
            os.close(previous.pidfd)
        self.tracked[container] = _Tracked(
            held=held, pidfd=pidfd, container=container, pid=process.pid, start_time=process.start_time
        )

    def _incarnation(self, pid: int, *, pidfd_inode: int | None) -> procfs.ProcessIncarnation | None:
        root = pathlib.Path(self.proc_root) / str(pid)
        try:
            stat, status = (root / "stat").read_bytes(), (root / "status").read_bytes()
            boot_id = pathlib.Path(self.boot_id_file).read_bytes()
        except OSError:
            return None
        try:
            machine_id: bytes | None = pathlib.Path(self.machine_id_file).read_bytes()
        except OSError:
            machine_id = None
        if len(procfs.parse_status(status).nspid) != 1:
            return None  # in a namespace of its own below the Pod's: not the one this registrar names
        return procfs.incarnation_from(
            stat=stat,
            status=status,
            pid_namespace_link=self.pid_namespace_link,
            boot_id=boot_id,
            machine_id=machine_id,
            node_name=self.node_name,
            pidfd_inode=pidfd_inode,
        )

    def wait(self, timeout: float) -> None:
        """Waits up to `timeout` for a registered process to exit, and handles every exit seen."""
        by_fd = {t.pidfd: t for t in self.tracked.values()}
        if not by_fd:
            time.sleep(timeout)
            return
        readable, _, _ = select.select(list(by_fd), [], [], timeout)
        for fd in readable:
            self._ended(by_fd[fd])

    def _ended(self, tracked: _Tracked) -> None:
        deadline = time.monotonic() + self.reap_wait_seconds
        status = self.status_of(tracked.pidfd)
        while status is None and time.monotonic() < deadline:
            time.sleep(0.01)
            status = self.status_of(tracked.pidfd)
        how = ending(status)
        name = tracked.held.name
        if how is Ending.CLEAN:
            launcher.say_goodbye(tracked.held, message=f"the container's main process exited cleanly (status {status})")
        logger.info(
            "exited workerregistration=%s/%s pid=%d ending=%s status=%s",
            self.namespace,
            name,
            tracked.pid,
            how.value,
            status,
        )
        self.endings.append((name, how))
        self.ended[tracked.container] = (tracked.pid, tracked.start_time)
        os.close(tracked.pidfd)
        if self.tracked.get(tracked.container) is tracked:
            del self.tracked[tracked.container]

    def run(self, *, stop: threading.Event, scan_seconds: float = 0.5) -> None:
        """Scans and watches until `stop` is set, then hands over what is left to the agent."""
        while not stop.is_set():
            self.scan_once()
            self.wait(scan_seconds)
        self.wait(0)  # exits already seen (a Pod's containers stop before its sidecar) are still handled
        for tracked in list(self.tracked.values()):
            os.close(tracked.pidfd)
        self.tracked.clear()
        self.client.close()
