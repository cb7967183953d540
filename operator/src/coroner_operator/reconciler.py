"""The reconcile of one registration: gather the facts, call the pure step, run its effects.

controller-runtime's `Reconcile(ctx, req) -> (Result, error)`: `Reconciler.reconcile(key)` returns
a `Result` (when to come back) or raises (the runtime, `coroner.runtime.controller`, retries with
backoff); the queue, the timers and the backoff are the runtime's, not this module's.

Level-based and idempotent: each reconcile recomputes the decision from current state, and writes
only when the stored conditions differ from the desired ones. Time-driven re-evaluation is asked
for at exactly the instant the decision says it can change by clock alone (TTL expiry,
corroboration window, staleness, a Node's quarantine), not by a per-object timer.

Three phases, one module each:

1. **gather** (here): the facts from the cache (`World.facts_for`) plus the two live reads the
   decision may need — the namespace's ``retire`` capability the first time it is seen (and the
   admission policies before the first decision, `PermissionRefresher.ensure`, and again right
   before a retirement, `PermissionRefresher.admission_held`), and a
   live GET of a Node missing from the cache once its quarantine ended (like the pod garbage
   collector: only a 404, or another UID, counts as the Node being gone);
2. **decide** (`coroner_operator.step.reconcile`): pure, returns `Effects`;
3. **execute** (`coroner_operator.executor.Executor`): the writes, and what came of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from coroner.core import model
from coroner.core.decision import NodeFacts, Policy
from coroner.core.model import Key
from coroner.core.world import World
from coroner.runtime.controller import Result, detach
from coroner_operator import step
from coroner_operator.effects import Effects
from coroner_operator.executor import Executor
from coroner_operator.kubeapi import KubeApi
from coroner_operator.metrics import DecisionGauge
from coroner_operator.permissions import PermissionRefresher

A = TypeVar("A")
B = TypeVar("B")


class Reconciler:
    def __init__(
        self,
        *,
        world: World,
        kube: KubeApi,
        policy: Policy,
        retention_seconds: float,
        executor: Executor,
        permissions: PermissionRefresher,
        gauge: DecisionGauge,
        clock: Callable[[], datetime.datetime],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.world = world
        self.kube = kube
        self.policy = policy
        self.retention_seconds = retention_seconds
        self.executor = executor
        self.permissions = permissions
        self.gauge = gauge
        self.clock = clock
        self.monotonic = monotonic

    async def reconcile(self, key: Key) -> Result:
        while True:
            decided_at, effects = await self.decide(key)
            if effects is None or effects.retire is None:
                break
            # A retirement waits for reads shared with every retirement decided meanwhile: its
            # worker goes on to the next key, so a burst of deaths is one batch per read, not one
            # per worker.
            detach()
            # The admission policies and the namespace's Lease fence, both read after the decision
            # and sent together: each is a consistent read that may wait for the API server's
            # watch cache to catch up, and sent one after the other they would wait twice. Admission
            # found weakened is recorded, and the registration decided again from it. Both reads
            # are held until the write is answered (the executor lets go of `holds` then), so the
            # next reads serve the whole batch decided meanwhile.
            async with contextlib.AsyncExitStack() as holds:
                verified, fence = await _together(
                    holds.enter_async_context(self.permissions.admission_held(decided_at=decided_at)),
                    self.executor.fence(key[0], decided_at=decided_at, holds=holds),
                )
                if verified:
                    self.gauge.set(key, effects.reason)
                    await self.executor.run(effects, holds=holds, fence=fence)
                    return Result(requeue_at=effects.requeue_at)
        if effects is None:
            self.gauge.set(key, None)
            return Result()
        self.gauge.set(key, effects.reason)
        await self.executor.run(effects)
        return Result(requeue_at=effects.requeue_at)

    async def decide(self, key: Key) -> tuple[float, Effects | None]:
        """Gathers the facts about `key` and returns what the step makes of them (None: not cached),
        and when (`monotonic`) the cache was read for them: the retire fence's and the admission
        policies' reads must be sent after that instant to speak for this decision."""
        registration = self.world.parsed.get(key)
        if registration is None:
            return self.monotonic(), None
        now = self.clock()
        node = None
        if not registration.terminal:
            await self.permissions.ensure(key[0])
            node = await self.confirm_node_gone(registration, now=now)
            # The watch went on while those reads were in flight: decide on what the cache holds
            # now, or on nothing if the registration went meanwhile (its deletion is its last event).
            if key not in self.world.parsed:
                return self.monotonic(), None
            registration = self.world.parsed[key]
        decided_at = self.monotonic()  # before the cache is read: the fence's reads come after it
        body = self.world.bodies[key]
        facts = self.world.facts_for(key, now=now, node=node)
        return decided_at, step.reconcile(
            body=body,
            registration=registration,
            facts=facts,
            policy=self.policy,
            now=now,
            retention_seconds=self.retention_seconds,
        )

    async def confirm_node_gone(self, registration: model.Registration, *, now: datetime.datetime) -> NodeFacts | None:
        """The registration's Node as a live GET found it, where policy opts into node-deletion
        evidence and the Node has been missing from the cache past its quarantine; else None (the
        cache's view stands, and the step asks to come back when the quarantine ends)."""
        node = registration.node_name
        if not node or not self.policy.node_deletion_evidence or node in self.world.nodes:
            return None
        view = self.world.node_view(node, now=now)
        if view.missing_since is None:
            return None
        if now < view.missing_since + datetime.timedelta(seconds=self.policy.node_deletion_quarantine_seconds):
            return None
        live = await self.kube.get_node(name=node)
        if live is not None:
            self.world.put_node(live)
            return None
        return dataclasses.replace(view, exists=False)


async def _together(first: Awaitable[A], second: Awaitable[B]) -> tuple[A, B]:
    """Both results; an error is raised only once both have ended, so neither enters its hold into
    a stack that the error already closed (a hold never let go would stall that read for good)."""
    one, two = await asyncio.gather(first, second, return_exceptions=True)
    for result in (one, two):
        if isinstance(result, BaseException):
            raise result
    return one, two  # type: ignore[return-value]
