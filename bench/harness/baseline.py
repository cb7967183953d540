"""The baseline bench/latency.py measures Coroner against: no Coroner at all, a naive TTL reaper that
lists plain registrations every sweep and deletes those whose heartbeat is older than the TTL."""

from __future__ import annotations

import contextlib
import datetime
import random
import threading
import time

from coroner.client.rest import registrations_path
from coroner.core import model
from harness.cluster import Bench, client


class TtlReaper:
    """The naive baseline: every sweep, list the namespace and delete registrations silent >= TTL."""

    def __init__(self, bench: Bench, *, namespace: str, ttl: float, sweep: float) -> None:
        self.http = client(bench.cluster.kubeconfig, timeout=120)
        self.namespace = namespace
        self.ttl = ttl
        self.sweep = sweep
        self.sweeps = 0
        self.deleted = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="ttl-reaper", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + 4 * 3600
        # A random phase, as any cron-like reaper has relative to the deaths it finds.
        self._stop.wait(random.uniform(0, self.sweep))
        while not self._stop.is_set() and time.monotonic() < deadline:
            started = time.monotonic()
            with contextlib.suppress(Exception):
                self._sweep_once()
            self.sweeps += 1
            self._stop.wait(max(0.0, self.sweep - (time.monotonic() - started)))

    def _sweep_once(self) -> None:
        items = self.http.request("GET", registrations_path(self.namespace))["items"]
        now = datetime.datetime.now(datetime.UTC)
        for item in items:
            status = item.get("status") or {}
            beat = model.parse_time(status.get("lastHeartbeatTime")) if status.get("lastHeartbeatTime") else None
            if beat is None:
                beat = model.parse_time(item["metadata"]["creationTimestamp"])
            if beat is not None and (now - beat).total_seconds() >= self.ttl:
                status_code, _ = self.http.send("DELETE", registrations_path(self.namespace, item["metadata"]["name"]))
                if status_code in (200, 202):
                    self.deleted += 1

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=30)
        self.http.close()
