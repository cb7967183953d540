"""The Event poster: a retirement's ``Retired`` Event, off the reconcile path, aggregated under bursts.

A retirement's worker moves on once its compare-and-swap has landed: `record` only hands the Event
to the correlator (`coroner_operator.eventcorrelator`, which decides what is posted now and what
is combined into an aggregate) and queues what is due. A few posters write the queue (about, not
exactly, in the order the retirements landed); a tick hands over the aggregates of ended windows.
Nothing is dropped: when the backlog is full, `record` waits for room. A failed write is counted
and logged, never retried: the retirement is in the registration's status already.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable, Mapping
from typing import Any

from coroner_operator.eventcorrelator import EventCorrelator, Outgoing
from coroner_operator.kubeapi import KubeApi, describe
from coroner_operator.metrics import Metrics

logger = logging.getLogger("coroner.operator")


class EventPoster:
    def __init__(
        self,
        *,
        kube: KubeApi,
        metrics: Metrics,
        burst: int,
        window_seconds: float,
        backlog: int,
        clock: Callable[[], datetime.datetime],
    ) -> None:
        self.kube = kube
        self.metrics = metrics
        self.window_seconds = window_seconds
        self.clock = clock
        self.correlator = EventCorrelator(burst=burst, window_seconds=window_seconds)
        self.queue: asyncio.Queue[Outgoing] = asyncio.Queue(backlog)

    async def record(self, *, involved: Mapping[str, Any], reason: str, evidence: str, message: str) -> None:
        """One Event about `involved` (the object as written); waits only when the backlog is full."""
        for outgoing in self.correlator.observe(
            involved=involved, reason=reason, evidence=evidence, message=message, now=self.clock()
        ):
            await self.queue.put(outgoing)

    async def run_poster(self) -> None:
        while True:
            outgoing = await self.queue.get()
            try:
                await self._post(outgoing)
            finally:
                self.queue.task_done()

    async def run_aggregation(self, *, tick_seconds: float = 1.0) -> None:
        """Hands the aggregates of ended windows to the posters (one check a second: cheap, and an
        aggregate is posted at most a tick after its window ends)."""
        while True:
            await asyncio.sleep(min(tick_seconds, self.window_seconds))
            for outgoing in self.correlator.flush(now=self.clock()):
                await self.queue.put(outgoing)

    async def drain(self) -> None:
        """Waits until every Event recorded so far is posted (or failed and logged), aggregates whose
        window has not ended included (tests and shutdown)."""
        for outgoing in self.correlator.flush():
            await self.queue.put(outgoing)
        await self.queue.join()

    async def _post(self, outgoing: Outgoing) -> None:
        kind = "aggregate" if outgoing.aggregated else "individual"
        if outgoing.aggregated:
            self.metrics.events_aggregated.labels(outgoing.reason).inc(outgoing.count)
        try:
            await self.kube.post_event(
                body=dict(outgoing.involved),
                reason=outgoing.reason,
                message=outgoing.message,
                count=outgoing.count,
                first_time=outgoing.first_time if outgoing.aggregated else None,
            )
        except Exception as exc:  # the retirement stands; its Event is best effort, and said so
            self.metrics.event_failures.labels(outgoing.reason).inc()
            meta = outgoing.involved.get("metadata") or {}
            logger.warning(
                "event not posted workerregistration=%s/%s reason=%s kind=%s count=%s error=%s",
                meta.get("namespace"), meta.get("name"), outgoing.reason, kind, outgoing.count, describe(exc),
            )  # fmt: skip
            return
        self.metrics.events_posted.labels(outgoing.reason, kind).inc()
