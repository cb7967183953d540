"""How long an operator takes to decide every registration again (its `coroner_registrations`
gauges count all of them): a fresh process (a cold start), and the standby of two leader-elected
replicas once the leader is SIGKILLed (a takeover). bench/steady.py measures both after its
window."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import time
from typing import Any

from coroner.client.rest import ApiError, leases_path
from coroner.core import api
from harness.cluster import Bench, scrape_operator
from harness.machine import SYSTEM, Profile, free_port, py_spy


def decided(port: int) -> int:
    """Registrations the operator on `port` has decided (its `coroner_registrations` gauges)."""
    with contextlib.suppress(OSError, http.client.HTTPException):
        metrics = scrape_operator(port)
        return int(sum(v for k, v in metrics.items() if k.startswith("coroner_registrations{")))
    return 0


def wait_decided(port: int, registrations: int, *, since: float, timeout: float = 900.0) -> float | None:
    deadline = since + timeout
    while time.monotonic() < deadline:
        if decided(port) >= registrations:
            return round(time.monotonic() - since, 1)
        time.sleep(0.5)
    return None


def cold_start(
    bench: Bench, registrations: int, *, profile_name: str | None = None
) -> tuple[float | None, Profile | None]:
    """A fresh operator process -> every registration decided (its gauges count all of them); with
    `profile_name`, py-spy on it from when it serves metrics until it stops (at most 300 s)."""
    port = free_port()
    t0 = time.monotonic()
    operator = bench.start_operator(metrics_port=port)
    profile = None if profile_name is None else py_spy(bench, operator.pid, name=profile_name, seconds=300.0)
    try:
        return wait_decided(port, registrations, since=t0), profile
    finally:
        operator.stop()


def takeover(bench: Bench, registrations: int) -> tuple[float | None, dict[str, Any]]:
    """Two replicas with --leader-elect; the leader, once it decided everything, is SIGKILLed (a
    crash: its Lease is not given up); seconds from the kill until the standby decided everything
    (its Lease expiry, default 15 s, included)."""
    # The operator Lease the single replicas held (without --leader-elect it is written with a
    # long duration, 180 s): a fresh pair of replicas is a new deployment, not a wait for it.
    with contextlib.suppress(ApiError):
        bench.admin.request("DELETE", leases_path(SYSTEM, api.OPERATOR_LEASE))
    ports = [free_port(), free_port()]
    replicas = [
        bench.start_operator("--leader-elect", f"--leader-elect-identity=steady-{i}", metrics_port=port)
        for i, port in enumerate(ports)
    ]
    try:
        leader = None
        deadline = time.monotonic() + 900
        while leader is None and time.monotonic() < deadline:
            for i, port in enumerate(ports):
                with contextlib.suppress(OSError, http.client.HTTPException):
                    if scrape_operator(port).get("coroner_operator_leader", 0) == 1 and decided(port) >= registrations:
                        leader = i
            time.sleep(0.5)
        if leader is None:
            return None, {"error": "no replica led and decided everything within 900 s"}
        standby = 1 - leader
        t_kill = time.monotonic()
        os.killpg(replicas[leader].pid, signal.SIGKILL)
        seconds = wait_decided(ports[standby], registrations, since=t_kill)
        return seconds, {
            "how": "two replicas with --leader-elect (lease 15 s); the leader SIGKILLed once it had decided "
            "everything; seconds from the kill until the standby's coroner_registrations count every registration",
        }
    finally:
        for replica in replicas:
            replica.stop()
