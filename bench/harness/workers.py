"""The benchmark's workers: real processes, registered exactly as a launcher registers them, and
(where a benchmark opts in) their heartbeats, sent from this process."""

from __future__ import annotations

import contextlib
import datetime
import heapq
import os
import pathlib
import queue
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from coroner.client.rest import Rest, registrations_path
from coroner.core import model, wire
from coroner_dev import fleet
from harness.results import percentiles

#: Longest any sleep worker lives even if everything else fails: workers are bounded too. Longer
#: than the longest benchmark: steady at 150,000 takes over an hour, and its workers dying of old
#: age during its cold start and takeover were retired (as they should be) and left the count of
#: decided registrations short of the registrations it waited for.
WORKER_SECONDS = 3 * 3600


def now_text() -> str:
    """Now, as Coroner writes times (RFC 3339, microseconds, Z)."""
    return model.format_time(datetime.datetime.now(datetime.UTC), fraction=True)


class Workers:
    """Real worker processes (`sleep`), all in one process group led by a holder process.

    Killed workers are reaped at once (as a container runtime would), so no zombie stands in
    /proc for a dead worker.
    """

    def __init__(self) -> None:
        self._holder = fleet.spawn(
            ["sleep", str(WORKER_SECONDS)], log=None, parent_death=signal.SIGKILL, process_group=0
        )
        self.pgid = self._holder.pid
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def spawn(self, count: int) -> list[int]:
        pids = []
        for _ in range(count):
            proc = fleet.spawn(
                ["sleep", str(WORKER_SECONDS)], log=None, parent_death=signal.SIGKILL, process_group=self.pgid
            )
            self.procs[proc.pid] = proc
            pids.append(proc.pid)
        # setpriv execs sleep in the same process: wait until every one is `sleep` (its incarnation
        # - pid and start time - does not change across exec, but a tidy /proc is nicer to read).
        deadline = time.monotonic() + 30
        for pid in pids:
            while time.monotonic() < deadline:
                try:
                    if pathlib.Path(f"/proc/{pid}/comm").read_text().strip() == "sleep":
                        break
                except OSError:
                    break
                time.sleep(0.001)
        return pids

    def kill(self, pid: int) -> float:
        """SIGKILL one worker; returns the monotonic time just before the signal. Reaps it."""
        proc = self.procs.pop(pid)
        moment = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        proc.wait()
        return moment

    def kill_many(self, pids: Iterable[int]) -> dict[int, float]:
        """SIGKILL all of them as fast as possible, then reap; returns each kill's moment."""
        moments = {}
        procs = []
        for pid in pids:
            proc = self.procs.pop(pid)
            moments[pid] = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            procs.append(proc)
        for proc in procs:
            proc.wait()
        return moments

    def alive(self, pid: int) -> bool:
        proc = self.procs.get(pid)
        return proc is not None and proc.poll() is None

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)
        for proc in [*self.procs.values(), self._holder]:
            with contextlib.suppress(Exception):
                proc.wait(timeout=10)
        self.procs.clear()


# --- registering workers ---------------------------------------------------------------------------


#: What `heartbeat_spec` gives: the spec's interval and TTL (None: no heartbeats), and their
#: description for the result's parameters.
HeartbeatSpec = tuple[int | None, int | None, dict[str, Any]]


def heartbeat_spec(on: bool, interval: int, ttl: int) -> HeartbeatSpec:
    """What to pass `register` for a benchmark whose workers heartbeat (`on`) or not (None, None: no
    spec.heartbeat is written), and a description for the result file's parameters."""
    if on:
        return interval, ttl, {"mode": "heartbeats", "interval_seconds": interval, "ttl_seconds": ttl}
    return None, None, {"mode": "none", "spec_heartbeat_written": False}


def register_all(
    kubeconfig: pathlib.Path,
    items: Sequence[tuple[str, str, int, pathlib.Path]],
    *,
    interval: int | None,
    ttl: int | None,
    threads: int = 8,
) -> list[tuple[str, str]]:
    """Registers each (namespace, node, pid, boot_id_file) exactly as a launcher does:
    `coroner.launcher.probe_incarnation` + `coroner.launcher.register`, with a client for the
    worker ServiceAccount, `threads` requests in flight. interval/ttl None: no heartbeat spec.
    Returns (namespace, name) in input order."""
    from concurrent.futures import ThreadPoolExecutor

    from coroner.launcher import probe_incarnation, register

    client = Rest.from_kubeconfig(kubeconfig, pool_size=threads, user_agent="coroner-launcher")
    heartbeat = {"interval_seconds": interval, "ttl_seconds": ttl}

    def one(item: tuple[str, str, int, pathlib.Path]) -> tuple[str, str]:
        namespace, node, pid, boot_file = item
        incarnation = probe_incarnation(pid, node_name=node, boot_id_file=str(boot_file))
        registration = register(
            client=client,
            namespace=namespace,
            node_name=node,
            incarnation=incarnation,
            name=f"w-{node}-{pid}",
            role="bench-worker",
            **heartbeat,
        )
        return namespace, registration.name

    try:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            return list(pool.map(one, items))
    finally:
        client.close()


# --- heartbeats ------------------------------------------------------------------------------------


class Heartbeater:
    """Heartbeats many registrations from this process, spread evenly over the interval.

    One scheduler thread hands due heartbeats to a few sender threads (one pooled keep-alive
    connection each). Each heartbeat is the launcher's own: a merge patch of status.lastHeartbeatTime, by
    the worker's identity. `stop_one` stops a worker's heartbeats (called just before it is killed,
    as a dead worker's launcher stops too). Counts every request it sends, so the API server's
    request counts can be corrected for them.
    """

    def __init__(
        self,
        kubeconfig: pathlib.Path | None,
        *,
        interval: float,
        senders: int = 32,
        max_seconds: float = 4 * 3600,
        build: Callable[[tuple[str, str]], tuple[Rest, str, str, Any, str]] | None = None,
    ) -> None:
        """`kubeconfig`: the workers' identity, for the launcher's own heartbeat; or None with a
        `build` that says, per key, which client sends what (method, path, body, content type)."""
        self.http = Rest.from_kubeconfig(kubeconfig, pool_size=senders) if kubeconfig is not None else None
        self.build = build or self._heartbeat
        self.last: dict[tuple[str, str], str] = {}
        self.interval = interval
        self.senders = senders
        self.deadline = time.monotonic() + max_seconds
        self._heap: list[tuple[float, int, tuple[str, str]]] = []
        self._seq = 0
        self._active: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._queue: queue.Queue[tuple[tuple[str, str], float] | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self.sent = 0
        self.ok = 0
        self.failed: Counter[str] = Counter()
        self.lags: list[tuple[float, float]] = []  # (due, lag) of every answered request
        self.last_ok_at: dict[tuple[str, str], float] = {}
        self.rtts: list[float] = []

    def start(self, keys: Sequence[tuple[str, str]]) -> None:
        """Starts heartbeating `keys`, first beats spread evenly over one interval from now."""
        now = time.monotonic()
        order = list(keys)
        random.shuffle(order)
        with self._lock:
            for i, key in enumerate(order):
                self._active.add(key)
                self.last_ok_at.setdefault(key, now)  # registered (with a heartbeat) just before
                self._push(now + self.interval * (i + 1) / max(1, len(order)), key)
        self._ensure_threads()
        self._wake.set()

    def _ensure_threads(self) -> None:
        if not self._threads:
            self._threads.append(threading.Thread(target=self._schedule, name="heartbeat-scheduler", daemon=True))
            for i in range(self.senders):
                self._threads.append(threading.Thread(target=self._send_loop, name=f"heartbeat-{i}", daemon=True))
            for thread in self._threads:
                thread.start()

    def add(self, keys: Sequence[tuple[str, str]]) -> None:
        """More registrations, each starting at a random phase (they just heartbeated on creation)."""
        now = time.monotonic()
        with self._lock:
            for key in keys:
                self._active.add(key)
                self.last_ok_at.setdefault(key, now)
                self._push(now + random.uniform(0, self.interval), key)
        self._ensure_threads()
        self._wake.set()

    def stop_one(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._active.discard(key)

    def _push(self, due: float, key: tuple[str, str]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (due, self._seq, key))

    def _schedule(self) -> None:
        while not self._stop.is_set() and time.monotonic() < self.deadline:
            now = time.monotonic()
            with self._lock:
                while self._heap and self._heap[0][0] <= now:
                    due, _, key = heapq.heappop(self._heap)
                    if key in self._active:
                        self._queue.put((key, due))
                        self._push(due + self.interval, key)
                wait = (self._heap[0][0] - now) if self._heap else 1.0
            self._wake.wait(timeout=min(1.0, max(0.0, wait)))
            self._wake.clear()

    def _send_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            key, due = item
            if self._stop.is_set():
                continue  # closing: drop the backlog, send nothing more
            with self._lock:
                if key not in self._active:
                    continue
            http_, method, path, body, content_type = self.build(key)
            started = time.monotonic()
            try:
                status, _ = http_.send(method, path, body=body, content_type=content_type)
            except Exception as exc:
                with self._lock:
                    self.failed[type(exc).__name__] += 1
                continue
            with self._lock:
                self.sent += 1
                if status == 200:
                    self.ok += 1
                    if isinstance(body, dict) and "lastHeartbeatTime" in (body.get("status") or {}):
                        self.last[key] = body["status"]["lastHeartbeatTime"]
                else:
                    self.failed[str(status)] += 1
                if len(self.lags) < 2_000_000:
                    self.lags.append((due, started - due))
                    self.rtts.append(time.monotonic() - started)
                if status == 200:
                    self.last_ok_at[key] = time.monotonic()

    def _heartbeat(self, key: tuple[str, str]) -> tuple[Rest, str, str, Any, str]:
        assert self.http is not None
        namespace, name = key
        return (
            self.http,
            "PATCH",
            registrations_path(namespace, name) + "/status",
            wire.heartbeat_patch(datetime.datetime.now(datetime.UTC)),
            wire.MERGE_PATCH,
        )

    def counts(self) -> tuple[int, int]:
        """(requests answered so far, of which 200)."""
        with self._lock:
            return self.sent, self.ok

    def lag_summary(self, start: float | None = None, end: float | None = None) -> dict[str, Any]:
        """How late heartbeats left relative to their schedule (all, or those due in [start, end])."""
        with self._lock:
            lags = [lag for due, lag in self.lags if (start is None or due >= start) and (end is None or due <= end)]
            rtts = list(self.rtts[-20000:])
        summary = percentiles(lags)
        rtt = percentiles(rtts)
        return {
            "round_trip_p50_ms_recent": rtt["p50_ms"],
            "round_trip_p99_ms_recent": rtt["p99_ms"],
            "schedule_lag_p50_ms": summary["p50_ms"],
            "schedule_lag_p99_ms": summary["p99_ms"],
            "schedule_lag_max_ms": summary["max_ms"],
            "heartbeats": summary["n"],
            "sent_total": self.sent,
            "ok_total": self.ok,
            "failed_total": dict(self.failed),
        }

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        for _ in range(self.senders):
            self._queue.put(None)
        deadline = time.monotonic() + 30  # a sender may be inside one request (timeout 30 s)
        for thread in self._threads:
            thread.join(timeout=max(0.1, deadline - time.monotonic()))
        if self.http is not None:
            self.http.close()
