"""The floors bench/latency.py compares a kill's retirement with, sampled one write at a time during
its kill windows, on registrations nobody else touches (in a namespace the operator does not watch):
a status patch's trip to the benchmark's watch, and a death's own two writes (`harness.floor`)."""

from __future__ import annotations

import threading
import time
from typing import Any

from coroner.client.rest import registrations_path
from coroner.core import wire
from harness.cluster import Bench, client, create_admitted, registrant_annotation
from harness.floor import FloorCopy, FloorWriters
from harness.machine import log
from harness.results import Tracker
from harness.workers import now_text


class FloorProbe:
    """The floors, sampled one write at a time at 4 Hz, on registrations nobody else touches.

    - heartbeat: a status JSON patch by the admin (a heartbeat time) -> its event on the watch, on
      one registration; the floor is twice that.
    - two writes (once `arm` gave it copies): a death's two writes on a copy of a registration
      Coroner retired (`harness.floor`), the agent's Dead attestation -> its event, then the
      operator's retirement -> its event. Samples alternate between the two."""

    def __init__(self, bench: Bench, tracker: Tracker, *, namespace: str, period: float = 0.25) -> None:
        self.namespace = namespace
        self.http = client(bench.cluster.kubeconfig)
        self.period = period
        self.samples: list[float] = []
        self.round_trips: list[float] = []
        self.pairs: list[tuple[float, float]] = []
        """Two-write samples: (attestation -> its event, retirement -> its event)."""
        self.pair_errors: dict[str, int] = {}
        self._copies: list[FloorCopy] = []
        self._writers: FloorWriters | None = None
        self._arrivals: dict[str, float] = {}
        self._cond = threading.Condition()
        self._running = threading.Event()
        self._stop = threading.Event()
        body = {
            "apiVersion": "coroner.dev/v1alpha1",
            "kind": "WorkerRegistration",
            "metadata": {
                "name": "floor",
                "labels": {"coroner.dev/node": "floor-node"},
                "annotations": registrant_annotation(bench.admin),
            },
            "spec": {
                "nodeName": "floor-node",
                "incarnation": {
                    "bootId": "00000000-0000-4000-8000-000000000000",
                    "pidNamespace": "4026531836",
                    "pid": 1,
                    "startTime": "1",
                    "hostId": "floor-node",
                },
                "clientInstanceId": "floor-probe",
                "heartbeat": {"intervalSeconds": 10, "ttlSeconds": 30},
            },
        }
        create_admitted(bench.admin, registrations_path(self.namespace), body)
        beat = {"status": {"lastHeartbeatTime": now_text()}}
        patched = bench.admin.request(
            "PATCH",
            registrations_path(self.namespace, "floor") + "/status",
            body=beat,
            content_type="application/merge-patch+json",
        )
        self.rv = patched["metadata"]["resourceVersion"]
        tracker.hooks.append(self._hook)
        self.thread = threading.Thread(target=self._run, name="floor", daemon=True)
        self.thread.start()

    def arm(self, writers: FloorWriters, copies: list[FloorCopy]) -> None:
        """Alternate two-write samples on `copies` (each retires one) with the heartbeat ones."""
        with self._cond:
            self._writers = writers
            self._copies = list(copies)
            self._arrivals.clear()  # the copies' preparation: nobody waits for those

    def _hook(self, kind: str, obj: dict[str, Any], arrived: float) -> None:
        meta = obj.get("metadata") or {}
        if meta.get("namespace") == self.namespace and kind == "MODIFIED":
            with self._cond:
                self._arrivals[str(meta.get("resourceVersion"))] = arrived
                self._cond.notify_all()

    def _seen(self, rv: str) -> float | None:
        """When the event of the write that made `rv` arrived on the watch (None: not in 10 s)."""
        with self._cond:
            self._cond.wait_for(lambda: rv in self._arrivals, timeout=10)
            return self._arrivals.pop(rv, None)

    def measure(self, on: bool) -> None:
        (self._running.set if on else self._running.clear)()

    def _run(self) -> None:
        deadline = time.monotonic() + 4 * 3600
        pair_next = False
        while not self._stop.is_set() and time.monotonic() < deadline and len(self.samples) < 100_000:
            if not self._running.wait(timeout=0.5):
                continue
            if pair_next and self._copies and self._writers is not None:
                self._two_writes(self._writers, self._copies.pop())
            else:
                self._heartbeat()
            pair_next = not pair_next
            self._stop.wait(self.period)

    def _heartbeat(self) -> None:
        ops = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": self.rv},
            {"op": "add", "path": "/status/lastHeartbeatTime", "value": now_text()},
        ]
        sent = time.monotonic()
        try:
            patched = self.http.request(
                "PATCH", registrations_path(self.namespace, "floor") + "/status", body=ops, content_type=wire.JSON_PATCH
            )
        except Exception:
            return
        answered = time.monotonic()
        self.rv = str(patched["metadata"]["resourceVersion"])
        arrived = self._seen(self.rv)
        if arrived is not None:
            self.samples.append(arrived - sent)
            self.round_trips.append(answered - sent)

    def _two_writes(self, writers: FloorWriters, floor: FloorCopy) -> None:
        try:
            sent = time.monotonic()
            attested = writers.attest(floor)
            attested_seen = self._seen(str(attested["metadata"]["resourceVersion"]))
            if attested_seen is None:
                return
            retired = writers.retire(floor, attested)
            retired_seen = self._seen(str(retired["metadata"]["resourceVersion"]))
        except Exception as exc:
            label = str(getattr(exc, "status", type(exc).__name__))
            self.pair_errors[label] = self.pair_errors.get(label, 0) + 1
            if self.pair_errors[label] == 1:
                log(f"floor: a two-write sample failed: {exc}")
            return
        if retired_seen is not None:
            self.pairs.append((attested_seen - sent, retired_seen - attested_seen))

    def close(self) -> None:
        self._stop.set()
        self._running.set()
        self.thread.join(timeout=15)
        self.http.close()
