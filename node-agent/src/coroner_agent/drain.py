"""The agent's shutdown: after SIGTERM (the node is draining or shutting down, or the pod is
replaced) it does not stop at once. Everything keeps running exactly as before — registration
watch, pidfd events, Lease renewal, attest workers, plus a faster resync of what it waits for —
until every registration of its node that is neither attested Dead nor terminal has been resolved,
or the grace has passed, whichever is first. Each exit is attested as it happens. Then one final
sweep re-probes everything. Nothing alive: it goes straight to the sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable

from coroner.core import model
from coroner.core.model import Key
from coroner.core.reasons import Verdict
from coroner.runtime.controller import Controller
from coroner_agent.cache import AgentCache
from coroner_agent.executor import AgentExecutor

logger = logging.getLogger("coroner.agent")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DrainReport:
    """What the wait after SIGTERM saw (one log line)."""

    waited: int
    """Registrations of this node waited for: not attested Dead and not terminal, at any time."""
    attested: int
    """Of those, attested Dead by the time the wait ended."""
    resolved_otherwise: int
    """Of those, terminal without a Dead attestation (Released, retired) or deleted."""
    still_alive: int
    """Of those, still neither attested Dead nor terminal when the wait ended (grace ran out)."""
    seconds: float


class Drain:
    def __init__(
        self,
        *,
        cache: AgentCache,
        controller: Controller[Key],
        executor: AgentExecutor,
        synced: asyncio.Event,
        resync: Callable[[set[Key] | None], Awaitable[None]],
        stop_watch: Callable[[], None],
        node_name: str,
        resync_seconds: float,
    ) -> None:
        """`resync(keys)` re-probes `keys` (None: all) after a fresh look at the node; while waiting,
        what is waited for is re-probed every `resync_seconds`."""
        self.cache = cache
        self.controller = controller
        self.executor = executor
        self.synced = synced
        self.resync = resync
        self.stop_watch = stop_watch
        self.node_name = node_name
        self.resync_seconds = resync_seconds

    def awaited(self) -> set[Key]:
        """This node's registrations that are neither terminal nor attested Dead: what a shutdown
        waits for. An unattested one counts (its first probe may be Dead or Alive); a registration
        whose spec names another node does not (this agent never speaks for it)."""
        return {key for key in self.cache.bodies if self._is_awaited(key)}

    def _is_awaited(self, key: Key) -> bool:
        body = self.cache.bodies.get(key)
        if body is None:
            return False
        registration = model.parse_registration(body)
        if registration.terminal or registration.node_name != self.node_name:
            return False
        attestation = registration.attestation
        return attestation is None or attestation.verdict != Verdict.DEAD

    def _attested_dead(self, key: Key) -> bool:
        body = self.cache.bodies.get(key)
        if body is None:
            return False
        attestation = model.parse_registration(body).attestation
        return attestation is not None and attestation.verdict == Verdict.DEAD

    async def wait(self, *, grace: float) -> DrainReport:
        """Keep serving until nothing is awaited or `grace` seconds have passed.

        Everything else keeps running meanwhile (watch, pidfd events, workers, Lease); this only
        watches the outcome — incrementally, re-reading only the registrations that changed, so a
        mass death on a large node costs O(changes), not O(registrations) per change — and
        re-probes what it waits for every `resync_seconds`.
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + max(0.0, grace)
        if not self.synced.is_set():
            # Not listed yet: nothing is known to wait for. Wait for the list within the grace.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.synced.wait(), timeout=max(0.0, deadline - loop.time()))
        cache = self.cache
        cache.dirty = set()
        try:
            pending = self.awaited()
            waited = set(pending)
            next_resync = loop.time() + self.resync_seconds
            while True:
                now = loop.time()
                if not pending or now >= deadline:
                    break
                if now >= next_resync:
                    await self.resync(set(pending))
                    next_resync = loop.time() + self.resync_seconds
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(cache.changed.wait(), timeout=min(deadline, next_resync) - now)
                cache.changed.clear()
                dirty, cache.dirty = cache.dirty, set()
                for key in dirty:
                    if self._is_awaited(key):
                        pending.add(key)
                        waited.add(key)
                    else:
                        pending.discard(key)
        finally:
            cache.dirty = None
        attested = sum(1 for key in waited - pending if self._attested_dead(key))
        return DrainReport(
            waited=len(waited),
            attested=attested,
            resolved_otherwise=len(waited - pending) - attested,
            still_alive=len(pending),
            seconds=loop.time() - started,
        )

    async def sweep(self, *, timeout: float) -> int:
        """Before the node goes: re-probe everything and attest what can be confirmed."""
        self.stop_watch()
        before = self.executor.attestations_written
        await self.resync(None)
        try:
            await asyncio.wait_for(self.controller.drain(), timeout=timeout)
        except TimeoutError:
            logger.warning("shutdown sweep timed out node=%s pending=%s", self.node_name, self.controller.queue.pending)
        return self.executor.attestations_written - before

    async def shutdown(self, *, grace: float, sweep_seconds: float) -> None:
        """The wait, then the sweep, each said in one line; the lease is renewed until the end."""
        logger.info("shutdown: waiting for this node's live incarnations node=%s grace=%.1fs", self.node_name, grace)
        report = await self.wait(grace=grace)
        logger.info(
            "shutdown wait done node=%s waited=%d attested=%d resolvedOtherwise=%d stillAlive=%d seconds=%.2f",
            self.node_name,
            report.waited,
            report.attested,
            report.resolved_otherwise,
            report.still_alive,
            report.seconds,
        )
        written = await self.sweep(timeout=sweep_seconds)
        logger.info("shutdown sweep done node=%s attestations=%s", self.node_name, written)
