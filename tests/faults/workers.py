"""Real worker processes for the fault harness, registered as the worker identity, with a liveness oracle.

Workers are cheap real processes: `sleep` children of the harness (root pid namespace), `sleep`s
inside a pid namespace entered with nsenter (where a number can be forced back with ns_last_pid),
children of a parent that never reaps them (zombies once killed), a process whose main thread
exited while another runs (state Z, alive), and `coroner run` launchers where the launcher itself
matters. Each is registered from the harness with `coroner.launcher.probe_incarnation` + `register`
under the worker ServiceAccount (what `coroner run` does), except launcher workers, which register
themselves.

The oracle is independent of Coroner: the harness opens its own pidfd for every worker right after
registering it (and re-checks the start time after opening), so `alive()` is the kernel's answer
for exactly that incarnation — a zombie leader with running threads is alive, a reaped or reused
pid is not — and every death is one the harness caused and timestamped (`killed_at`, wall clock,
taken *before* the signal).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import os
import pathlib
import select
import signal
import ssl
import subprocess
import sys
import threading
import time
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner import launcher
from coroner.client.kube import patch_registration_status
from coroner.client.rest import Rest
from coroner.core import api, model
from coroner_dev.fleet import PidNamespace, wait_child
from support import kube

SYSTEM_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
#: A process whose main thread calls pthread_exit while a second thread sleeps: /proc shows `Z`
#: with `Threads: 2`, and it is alive (its pidfd is not readable) — the design's zombie trap.
ZOMBIE_LEADER = (
    "import ctypes, threading, time; threading.Thread(target=time.sleep, args=(3600,)).start(); "
    "time.sleep(0.05); ctypes.CDLL(None).pthread_exit(None)"
)


def read_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time) of a host pid, or None if no such process."""
    try:
        text = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def threads_of(pid: int) -> int:
    with contextlib.suppress(OSError, StopIteration, ValueError):
        status = pathlib.Path(f"/proc/{pid}/status").read_text().splitlines()
        return int(next(line.split()[1] for line in status if line.startswith("Threads:")))
    return 0


def now_text(offset: float = 0.0) -> str:
    moment = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=offset)
    return model.format_time(moment, fraction=True)


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclasses.dataclass(eq=False)
class Worker:
    """One registered incarnation and everything the harness knows about it."""

    name: str
    node: str
    kind: str
    victim: bool
    interval: int = 2
    ttl: int = 6
    skew: float = 0.0
    heartbeating: bool = True
    tags: set[str] = dataclasses.field(default_factory=set)
    proc: subprocess.Popen[bytes] | None = None
    host_pid: int = 0
    start_time: int = 0
    pidfd: int = -1
    pidns: PidNamespace | None = None
    incarnation: dict[str, Any] = dataclasses.field(default_factory=dict)
    registered: bool = False
    killed_at: float | None = None
    retired_seen: dict[str, Any] | None = None
    retired_seen_at: float | None = None
    heartbeats: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    """Heartbeats written, with the resourceVersion of the answer."""
    heartbeats_unanswered: set[str] = dataclasses.field(default_factory=set)
    """Heartbeats sent whose answer never came (committed or not: the harness cannot tell)."""
    extra_procs: list[subprocess.Popen[bytes]] = dataclasses.field(default_factory=list)
    reasons_seen: list[str] = dataclasses.field(default_factory=list)
    generic: bool = True
    """Killed by the trial's generic strike (False: a fault kills it, or it lives)."""
    client_instance_id: str | None = None
    """None: launcher-minted; otherwise a hand-made identity."""
    registered_boot: str = ""
    forgotten: bool = False
    """Its registration was deleted (a fault re-created the name for another incarnation): it is
    no longer judged (no retirement is due), and `Trial.by_name` names the new one."""

    @property
    def dead(self) -> bool:
        return self.killed_at is not None

    def alive(self) -> bool:
        """The kernel's answer for exactly this incarnation (the harness's own pidfd)."""
        if self.pidfd < 0:
            stat = read_stat(self.host_pid)
            return stat is not None and stat[1] == self.start_time
        poller = select.poll()
        poller.register(self.pidfd, select.POLLIN)
        return not any(events & select.POLLIN for _, events in poller.poll(0))

    def kill(self, *, reap: bool = True) -> None:
        """SIGKILL, timestamped before the signal. The harness is the parent of `sleep` and
        zombie-leader workers and reaps them, as a real parent would (`zombie` workers' parent never
        does; nsenter and launchers reap their own children)."""
        if self.killed_at is not None:
            return
        self.killed_at = time.time()
        self.heartbeating = False
        if self.pidfd >= 0:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        else:
            os.kill(self.host_pid, signal.SIGKILL)
        if reap:
            self.reap()

    def reap(self) -> None:
        if self.kind in ("sleep", "zombie_leader") and self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)

    def wait_dead(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                return True
            time.sleep(0.005)
        return False

    def pin(self) -> None:
        """Opens the oracle's pidfd and proves it pins the recorded incarnation."""
        fd = os.pidfd_open(self.host_pid)
        stat = read_stat(self.host_pid)
        if stat is None or stat[1] != self.start_time:
            os.close(fd)
            raise RuntimeError(f"{self.name}: pid {self.host_pid} changed while the oracle pinned it")
        self.pidfd = fd

    def close(self) -> None:
        if self.pidfd >= 0:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        for proc in [self.proc, *self.extra_procs]:
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in [self.proc, *self.extra_procs]:
            if proc is not None:
                with contextlib.suppress(Exception):
                    proc.wait(timeout=10)
        if self.pidfd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = -1


def spawn(worker: Worker, *, pidns: PidNamespace | None = None) -> None:
    """Starts the worker's process(es); sets host_pid and start_time."""
    kind = worker.kind
    if kind == "pidns":
        assert pidns is not None
        worker.pidns = pidns
        worker.proc, worker.host_pid = pidns.spawn("sleep", "3600")
    elif kind == "zombie":
        # The parent execs into a sleep that never waits: its killed child stays a zombie.
        worker.proc = subprocess.Popen(["sh", "-c", "sleep 3600 & exec sleep 3601"], start_new_session=True)
        worker.host_pid = wait_child(worker.proc.pid)
    elif kind == "zombie_leader":
        worker.proc = subprocess.Popen([SYSTEM_PYTHON, "-c", ZOMBIE_LEADER], start_new_session=True)
        worker.host_pid = worker.proc.pid
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            stat = read_stat(worker.host_pid)
            if stat is not None and stat[0] == "Z" and threads_of(worker.host_pid) >= 2:
                break
            time.sleep(0.01)
        else:
            raise RuntimeError("the zombie-leader process did not reach state Z with a running thread")
    else:
        worker.proc = subprocess.Popen(["sleep", "3600"], start_new_session=True)
        worker.host_pid = worker.proc.pid
    stat = read_stat(worker.host_pid)
    if stat is None:
        raise RuntimeError(f"{worker.name}: its process exited at once")
    worker.start_time = stat[1]


@functools.cache
def _launcher_client(client: k8s.ApiClient) -> Rest:
    """The client `coroner.launcher.register` takes (Coroner's own), for the identity of `client`."""
    config = client.configuration
    keys = config.api_key or {}
    header = keys.get("BearerToken") or keys.get("authorization") or ""
    token = str(header).removeprefix("Bearer ").strip() or None
    return Rest(config.host, ssl_context=ssl.create_default_context(cafile=config.ssl_ca_cert), token=token)


def register(
    worker: Worker,
    *,
    client: k8s.ApiClient,
    namespace: str,
    boot_id_file: pathlib.Path,
    client_instance_id: str | None = None,
) -> None:
    """Registers the worker's incarnation as the launcher does, then pins the oracle."""
    incarnation = launcher.probe_incarnation(worker.host_pid, node_name=worker.node, boot_id_file=str(boot_id_file))
    if incarnation.start_time != worker.start_time:
        raise RuntimeError(f"{worker.name}: the probed start time differs from the spawned process's")
    worker.incarnation = incarnation.spec()
    if client_instance_id is None:
        launcher.register(
            client=_launcher_client(client),
            namespace=namespace,
            node_name=worker.node,
            incarnation=incarnation,
            name=worker.name,
            interval_seconds=worker.interval,
            ttl_seconds=worker.ttl,
        )
    else:  # a hand-made object: launcher-shaped, but with an identity the launcher never mints
        body = {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "metadata": {"name": worker.name, "namespace": namespace, "labels": {api.NODE_LABEL: worker.node}},
            "spec": {
                "nodeName": worker.node,
                "incarnation": worker.incarnation,
                "clientInstanceId": client_instance_id,
                "heartbeat": {"intervalSeconds": worker.interval, "ttlSeconds": worker.ttl},
            },
        }
        kube.create_registration(client, namespace, body)  # naming its registrant, as admission demands
    worker.registered = True
    worker.pin()


def heartbeat(worker: Worker, *, client: k8s.ApiClient, namespace: str, value: str | None = None) -> None:
    """One heartbeat as the worker writes it (merge patch of status.lastHeartbeatTime), recorded."""
    text = value if value is not None else now_text(worker.skew)
    worker.heartbeats_unanswered.add(text)
    body = patch_registration_status(
        client, namespace=namespace, name=worker.name, body={"status": {"lastHeartbeatTime": text}}
    )
    worker.heartbeats_unanswered.discard(text)
    worker.heartbeats.append((text, int(body["metadata"]["resourceVersion"])))


class Heartbeater(threading.Thread):
    """Heartbeats every live, heartbeating worker of a trial on its interval (with its skew)."""

    def __init__(self, *, client: k8s.ApiClient, namespace: str, workers: list[Worker]) -> None:
        super().__init__(name=f"heartbeat-{namespace}", daemon=True)
        self.client = client
        self.namespace = namespace
        self.workers = workers
        self.stopped = threading.Event()
        self.failures = 0
        self._due: dict[str, float] = {}

    def run(self) -> None:
        while not self.stopped.wait(0.2):
            now = time.monotonic()
            for worker in list(self.workers):
                if not (worker.registered and worker.heartbeating and worker.kind != "launcher"):
                    continue
                due = self._due.setdefault(worker.name, now + worker.interval)
                if now < due:
                    continue
                self._due[worker.name] = now + worker.interval
                try:
                    if worker.heartbeating:
                        heartbeat(worker, client=self.client, namespace=self.namespace)
                except (ApiException, Exception):
                    self.failures += 1

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=10)
