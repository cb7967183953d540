"""Watch inputs: what the registration watch and a readable pidfd change in the agent's cache, and
which registrations they re-attest.

Nothing here probes, decides or writes: each event goes into `AgentCache`, and the registration it
names is handed to the runtime's queue. The watch itself runs in a thread of its own
(`AgentApi.watch_registrations`, blocking HTTP), which hands each event to the event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from coroner.core import model
from coroner.core.model import Key
from coroner_agent.cache import AgentCache
from coroner_agent.health import AgentMetrics, HealthState
from coroner_agent.kube import AgentApi


class AgentInputs:
    def __init__(
        self,
        *,
        kube: AgentApi,
        cache: AgentCache,
        enqueue: Callable[[Key], None],
        metrics: AgentMetrics,
        health: HealthState,
    ) -> None:
        self.kube = kube
        self.cache = cache
        self.enqueue = enqueue
        self.metrics = metrics
        self.health = health
        self.synced = asyncio.Event()
        """Set once the watch has listed this node's registrations."""
        self.stopped = threading.Event()
        """Set to end the watch thread (at its next event or the end of its stream)."""

    def on_pidfd(self, key: Key) -> None:
        """A watched incarnation's pidfd became readable: its whole thread group exited."""
        self.enqueue(key)

    def on_relist(self, items: list[dict[str, Any]]) -> None:
        seen = set()
        for body in items:
            key = model.key_of(body)
            seen.add(key)
            self.cache.observe(key, body)
            self.enqueue(key)
        for key in set(self.cache.bodies) - seen:
            self.cache.forget(key)
        self.synced.set()
        self.health.synced = True

    def on_event(self, event_type: str, body: dict[str, Any]) -> None:
        key = model.key_of(body)
        if event_type == "DELETED":
            self.cache.forget(key)
            return
        self.cache.observe(key, body)
        self.enqueue(key)

    def start_watch(self, loop: asyncio.AbstractEventLoop) -> threading.Thread:
        thread = threading.Thread(
            target=self.kube.watch_registrations,
            kwargs={
                "loop": loop,
                "on_event": self.on_event,
                "on_relist": self.on_relist,
                "stop": self.stopped,
                "on_error": self.metrics.api_error,
            },
            name="watch-registrations",
            daemon=True,
        )
        thread.start()
        return thread

    def stop_watch(self) -> None:
        self.stopped.set()
