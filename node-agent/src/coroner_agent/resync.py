"""The resync: every `resync_seconds`, a fresh look at the node (one /proc listing, its boot id) and
a re-probe of every registration of it. The safety net under the pidfd events, and the only path
for the incarnations the agent could not pin; the shutdown wait uses it, faster, for what it waits
for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from coroner.core.model import Key
from coroner_agent.cache import AgentCache
from coroner_agent.reconciler import Prober


class Resync:
    def __init__(
        self,
        *,
        cache: AgentCache,
        prober: Prober,
        enqueue: Callable[[Key], None],
        interval_seconds: float,
        offload: Callable[[Callable[[], None]], Awaitable[None]],
    ) -> None:
        """`offload` runs the prober's rescan (a listing of the whole proc root) off the event loop."""
        self.cache = cache
        self.prober = prober
        self.enqueue = enqueue
        self.interval_seconds = interval_seconds
        self._offload = offload

    async def once(self, keys: set[Key] | None = None) -> None:
        """A fresh look at the node and a re-probe of `keys` (all)."""
        await self._offload(self.prober.rescan)
        for key in list(self.cache.bodies) if keys is None else keys:
            self.enqueue(key)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_seconds)
            await self.once()
