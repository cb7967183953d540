"""The reconcile of one registration: gather the facts, call the pure step, run its effects, and
call the step again on what came of them until nothing follows.

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
3. **execute** (`coroner_operator.executor.Executor`): the writes, each outcome returned as a value,
   and the step's next call (`step.after`) decides what follows from it.

A retirable registration's `Effects` ask for the facts its retirement is decided on, read after
the decision: the admission policies and the namespace's Lease fence (fresh reads, batched
`FreshRead.hold`s), and the namespace's retire capability; gathered here, the step decides on them
once (`step.retire`) and returns the compare-and-swap as an effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from coroner.core import model
from coroner.core.decision import NodeFacts, Policy
from coroner.core.model import Key
from coroner.core.world import World
from coroner.retire import PortError
from coroner.runtime.controller import Result, detach
from coroner_operator import step
from coroner_operator.effects import Effects
from coroner_operator.executor import Executor, port_call
from coroner_operator.freshread import FreshRead
from coroner_operator.kubeapi import KubeApi
from coroner_operator.metrics import DecisionGauge
from coroner_operator.permissions import PermissionRefresher

A = TypeVar("A")
B = TypeVar("B")

#: A namespace's Leases as a live read found them, or what kept the read from answering.
Fence = Sequence[Mapping[str, Any]] | PortError


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
        # Right before a retirement: the Lease fence, read once for every retirement in the namespace
        # decided before the read started (and held by each until its write is answered).
        self.lease_reads: FreshRead[str, list[dict[str, Any]]] = FreshRead(
            lambda ns: self.kube.list_leases(namespace=ns), clock=monotonic
        )

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
                    self.fence(key[0], decided_at=decided_at, holds=holds),
                )
                if verified:
                    self.gauge.set(key, effects.reason)
                    granted, fence = await _retire_facts(lambda: self.world.retire_permission.get(key[0]), fence)
                    retiring = step.retire(
                        effects, granted=granted, fence=fence, retirer=self.executor.retirer, now=self.clock()
                    )
                    if retiring.retire_write is None:
                        await holds.aclose()  # nothing to write: the reads may serve the next batch now
                    await self.execute(retiring, holds=holds)
                    return Result(requeue_at=effects.requeue_at)
        if effects is None:
            self.gauge.set(key, None)
            return Result()
        self.gauge.set(key, effects.reason)
        await self.execute(effects)
        return Result(requeue_at=effects.requeue_at)

    async def execute(self, effects: Effects, *, holds: contextlib.AsyncExitStack | None = None) -> None:
        """Runs `effects`, then what the step makes of each outcome, until nothing follows; raises
        what the last of them leaves failed (the runtime retries it with backoff)."""
        while True:
            outcome = await self.executor.run(effects, holds=holds)
            follow = step.after(effects, outcome, retirer=self.executor.retirer, now=self.clock())
            if follow is None:
                if effects.fail is not None:
                    raise effects.fail
                return
            effects = follow

    async def fence(self, namespace: str, *, decided_at: float, holds: contextlib.AsyncExitStack) -> Fence:
        """The Leases of `namespace` from a read sent no earlier than `decided_at` (a
        `time.monotonic()` reading taken before the cache was read), held in `holds` (the next read
        of the namespace waits until the retirement lets go of it); or what the API server said
        instead (the retire protocol's FAILED)."""
        held = self.lease_reads.hold(namespace, decided_at=decided_at)
        try:
            result: list[dict[str, Any]] = await port_call(holds.enter_async_context(held))
        except PortError as error:
            return error
        return result

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


async def _retire_facts(granted: Callable[[], bool | None], fence: Fence) -> tuple[bool | None, Fence]:
    """The retire protocol's two facts, the capability and the Lease fence, answered as its port
    answers them (`kubectl coroner apply` sends a review and a Lease read at once): here the
    capability is the namespace's cached review (admission checks the verb on the write itself)
    and the fence the read just answered. Both are taken a turn of the event loop later, after
    every task already ready (a capability refresh answered meanwhile is seen), so retirements
    and their reads interleave with the rest in the order the simulation's seeds were drawn for."""
    return await asyncio.gather(_later(granted), _later(lambda: fence))


async def _later(answer: Callable[[], A]) -> A:
    return answer()


async def _together(first: Awaitable[A], second: Awaitable[B]) -> tuple[A, B]:
    """Both results; an error is raised only once both have ended, so neither enters its hold into
    a stack that the error already closed (a hold never let go would stall that read for good)."""
    one, two = await asyncio.gather(first, second, return_exceptions=True)
    for result in (one, two):
        if isinstance(result, BaseException):
            raise result
    return one, two  # type: ignore[return-value]
