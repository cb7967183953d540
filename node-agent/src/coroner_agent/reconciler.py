"""The attest of one registration: gather the facts, call the pure step, run its effects.

The agent's `Reconcile(ctx, req) -> (Result, error)`, as the operator's
(`coroner_operator.reconciler`): `AgentReconciler.reconcile(key)` returns a `Result` (when to come
back: the end of a death's confirmation window) or raises (the runtime, `coroner.runtime.
controller`, retries with backoff); the queue, the timers, the backoff and the concurrency are the
runtime's.

Three phases, one module each:

1. **gather** (here): the registration from the cache, the probe of its incarnation (only where
   `step.probe_needed`: an active registration of this node), the node's boot and host ids, the
   first look remembered, and `now` from the injected clock;
2. **decide** (`coroner_agent.step.attest`): pure, returns `AgentEffects`; the agent's own memory
   is kept as it says (the first look; a terminal registration's pins released) before anything
   is sent, so a look taken while a write is in flight already counts;
3. **execute** (`coroner_agent.executor.AgentExecutor`): the write, and what came of it.

The probe runs on the event loop (a few /proc reads and a pidfd poll, no network); what overlaps
between the runtime's workers is the API round-trip of each write.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Protocol

from coroner.core import model
from coroner.core.model import Key
from coroner.runtime.controller import Result
from coroner_agent import step
from coroner_agent.cache import AgentCache
from coroner_agent.effects import AgentEffects
from coroner_agent.executor import AgentExecutor
from coroner_agent.health import AgentMetrics
from coroner_agent.verdict import ProbeResult


class Prober(Protocol):
    """The probes, injected so every branch of the agent is testable without real processes
    (production: `coroner_agent.prober.ProcProber`)."""

    def boot_id(self) -> str | None: ...
    def host_id(self) -> str: ...
    def rescan(self) -> None: ...
    def probe(self, *, key: Key, registration: model.Registration) -> ProbeResult: ...
    def forget(self, *, key: Key) -> None: ...
    def pidfds_held(self) -> int: ...


class AgentReconciler:
    def __init__(
        self,
        *,
        cache: AgentCache,
        prober: Prober,
        attester: step.Attester,
        executor: AgentExecutor,
        metrics: AgentMetrics,
        clock: Callable[[], datetime.datetime],
    ) -> None:
        self.cache = cache
        self.prober = prober
        self.attester = attester
        self.executor = executor
        self.metrics = metrics
        self.clock = clock

    async def reconcile(self, key: Key) -> Result:
        effects = self.effects(key)
        if effects is None:
            return Result()
        await self.executor.run(effects)
        return Result(requeue_at=effects.requeue_at)

    def effects(self, key: Key) -> AgentEffects | None:
        """Gathers the facts about `key` (probing it if the step needs a probe), returns what the
        step makes of them, and keeps the agent's memory as they say (None: not cached)."""
        body = self.cache.bodies.get(key)
        if body is None:
            return None
        registration = model.parse_registration(body)
        probe = None
        if step.probe_needed(registration=registration, node_name=self.attester.node_name):
            started = time.perf_counter()
            probe = self.prober.probe(key=key, registration=registration)
            self.metrics.probe_seconds.observe(time.perf_counter() - started)
        effects = step.attest(
            key=key,
            body=body,
            registration=registration,
            probe=probe,
            attester=self.attester,
            boot_id=self.prober.boot_id(),
            host_id=self.prober.host_id(),
            first_look=self.cache.looks.get(key),
            now=self.clock(),
        )
        if effects.release:
            self.prober.forget(key=key)
        self.cache.note_look(key, effects.first_look)
        return effects
