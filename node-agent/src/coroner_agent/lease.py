"""The node's agent Lease, renewed every `renew_seconds` for as long as the agent runs (through the
shutdown wait and the final sweep too): what the operator reads as a live agent on this boot.

A failed renewal is retried after a jittered delay (decorrelated, 1 s up to the renew period), so
the agents of a cluster do not retry in lockstep after an API server restart; the Lease expires
after its duration without one, and the operator then reads AgentUnavailable.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import random
from collections.abc import Callable

from coroner.client.rest import ApiError
from coroner.runtime.controller import decorrelated_jitter
from coroner_agent.executor import AgentExecutor
from coroner_agent.health import AgentMetrics, HealthState
from coroner_agent.reconciler import Prober

logger = logging.getLogger("coroner.agent")


class LeaseLoop:
    def __init__(
        self,
        *,
        executor: AgentExecutor,
        prober: Prober,
        metrics: AgentMetrics,
        health: HealthState,
        node_name: str,
        holder: str,
        duration: int,
        renew_seconds: float,
        clock: Callable[[], datetime.datetime],
        rng: random.Random,
    ) -> None:
        self.executor = executor
        self.prober = prober
        self.metrics = metrics
        self.health = health
        self.node_name = node_name
        self.holder = holder
        self.duration = duration
        self.renew_seconds = renew_seconds
        self.clock = clock
        self._rng = rng

    async def renew_once(self) -> None:
        """One renewal of the node's Lease, with this boot's and host's ids (raises on failure)."""
        await self.executor.renew_lease(
            holder=self.holder,
            duration=self.duration,
            boot_id=self.prober.boot_id(),
            host_id=self.prober.host_id(),
        )

    async def run(self) -> None:
        backoff: float | None = None
        while True:
            try:
                await self.renew_once()
            except Exception as exc:
                self.metrics.lease_renewal_failures.inc()
                self.metrics.api_error("lease", exc)
                backoff = decorrelated_jitter(
                    self._rng, base=min(1.0, self.renew_seconds), cap=self.renew_seconds, previous=backoff
                )
                if isinstance(exc, ApiError):
                    logger.warning("lease renewal failed node=%s status=%s", self.node_name, exc.status)
                else:
                    logger.warning("lease renewal failed node=%s error=%r", self.node_name, exc)
                await asyncio.sleep(backoff)
                continue
            backoff = None
            self.metrics.lease_renewals.inc()
            self.metrics.lease_renewed.set(self.clock().timestamp())
            self.health.renewed()
            await asyncio.sleep(self.renew_seconds)
