"""Runs the attest step's `AgentEffects` against the API server, and says what came of each write.

The agent's only writer: the attestation (a JSON patch whose `test` ops pin what the probe relied
on) and the node's Lease renewal, each body built by `coroner.core.wire`, each sent through the
`AgentPort` (`coroner_agent.kube.ApiPort`: in production over a thread pool, in the simulation over
its model API server in virtual time).
Outcomes of an attestation write, one mapping:

* 200 → the answer is cached (it is newer than the watch's copy), counted and logged;
* 409/422 (what the probe relied on moved: a heartbeat landed, the object changed) → read it again:
  gone is forgotten, moved is attested again from a fresh probe;
* 404 → forgotten (its watch event says so too);
* anything else raises (the runtime's backoff retries). An API error delays an attestation; it
  never invents one.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Callable
from typing import Any, Protocol

from coroner.client.rest import ApiError
from coroner.core import kubewire
from coroner.core.model import Key
from coroner_agent.cache import AgentCache
from coroner_agent.effects import AgentEffects, WriteAttestation
from coroner_agent.health import AgentMetrics

logger = logging.getLogger("coroner.agent")


class AgentPort(Protocol):
    """The agent's API requests, awaited. Errors are `coroner.client.rest.ApiError` (a status) or
    anything else (no answer)."""

    async def patch_status(self, *, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]: ...
    async def get_registration(self, *, namespace: str, name: str) -> dict[str, Any] | None: ...
    async def renew_lease(
        self, *, holder: str, duration: int, annotations: dict[str, str], now: datetime.datetime
    ) -> None: ...


@dataclasses.dataclass(eq=False, kw_only=True)
class AgentExecutor:
    port: AgentPort
    cache: AgentCache
    metrics: AgentMetrics
    enqueue: Callable[[Key], None]
    clock: Callable[[], datetime.datetime]
    node_name: str
    attestations_written: int = 0

    async def run(self, effects: AgentEffects) -> None:
        """Runs `effects`' write, if any; raises what the runtime should retry with backoff."""
        if effects.write is not None:
            await self._write(effects.key, effects.write)

    async def _write(self, key: Key, write: WriteAttestation) -> None:
        namespace, name = key
        try:
            written = await self.port.patch_status(namespace=namespace, name=name, ops=[dict(op) for op in write.ops])
        except Exception as exc:
            self.metrics.api_error("attestation", exc)
            if not isinstance(exc, ApiError):
                raise
            if exc.status in (409, 422):
                await self._reread(key)
                return
            if exc.status == 404:
                self.cache.forget(key)
                return
            raise
        self.cache.observe(key, written)
        self.attestations_written += 1
        attestation = write.attestation
        self.metrics.attestations.labels(attestation["verdict"], attestation["evidence"]).inc()
        logger.info(
            "attested workerregistration=%s/%s verdict=%s evidence=%s pid=%s node=%s",
            namespace, name, attestation["verdict"], attestation["evidence"],
            (attestation.get("incarnation") or {}).get("pid"), self.node_name,
        )  # fmt: skip

    async def _reread(self, key: Key) -> None:
        """After a write refused for moving: the object as it is now, attested again (or forgotten)."""
        try:
            fresh = await self.port.get_registration(namespace=key[0], name=key[1])
        except Exception as exc:
            self.metrics.api_error("read", exc)
            raise
        if fresh is None:
            self.cache.forget(key)
        else:
            self.cache.observe(key, fresh)
            self.enqueue(key)

    async def renew_lease(self, *, holder: str, duration: int, boot_id: str | None, host_id: str) -> None:
        """Creates or renews the node's Lease coroner-agent-<node>, now: agent liveness is observable,
        never assumed. Raises what the Lease loop counts and retries."""
        annotations = kubewire.agent_lease_annotations(boot_id=boot_id, host_id=host_id)
        await self.port.renew_lease(holder=holder, duration=duration, annotations=annotations, now=self.clock())
