"""The operator's /metrics (Prometheus), /healthz and /readyz, on --metrics-port.

/healthz: the leader is alive while its sweep loop keeps completing sweeps; a standby while its
election loop keeps trying (a healthy standby is healthy: restarting it would only lose its warm
cache). /readyz: 200 for a leader and a standby alike, the body says which (a standby must count as
available, or a PodDisruptionBudget would block every drain of the leader's node).
"""

from __future__ import annotations

import asyncio
import datetime
import time

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from coroner.runtime.controller import utcnow
from coroner.runtime.leader import LeaderElector
from coroner_operator.metrics import Metrics
from coroner_operator.sweeper import Sweeper


async def serve_http(
    address: str, port: int, *, metrics: Metrics, elector: LeaderElector | None, sweeper: Sweeper
) -> None:
    """Serves until cancelled."""
    started = utcnow()

    async def metrics_view(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="leader\n" if elector is None or elector.is_leader else "standby\n")

    async def healthz(_: web.Request) -> web.Response:
        if elector is not None and not elector.is_leader:
            tried = elector.last_try
            window = elector.config.lease_duration * 2 + elector.config.renew_deadline
            if tried is None and utcnow() - started < datetime.timedelta(seconds=window + 60):
                return web.Response(text="starting\n")
            if tried is not None and time.monotonic() - tried < window:
                return web.Response(text=f"ok standby (leader {elector.holder or '?'})\n")
            return web.Response(status=503, text="the leader election loop has not tried recently\n")
        limit = datetime.timedelta(seconds=sweeper.interval * 3 + 60)
        last = sweeper.last_sweep
        if last is None and utcnow() - started < limit:
            return web.Response(text="starting\n")
        if last is not None and utcnow() - datetime.datetime.fromisoformat(last["time"].replace("Z", "+00:00")) < limit:
            return web.Response(text="ok\n")
        return web.Response(status=503, text="no completed sweep recently\n")

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics_view), web.get("/healthz", healthz), web.get("/readyz", readyz)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, address, port)
    await site.start()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
