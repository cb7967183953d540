"""The agent's API side: its node Lease, the watch of its node's registrations, attestation writes.

Blocking HTTP calls (`coroner.client.rest`, not the kubernetes package: see there why) run in
threads; watch events are handed to the event loop. An API outage delays attestations; it never
produces one (unknown is never dead).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from coroner.client.rest import ApiError, Rest, busy_or_unavailable, registrations_path, upsert_lease
from coroner.core import api, kubewire
from coroner.core.wire import JSON_PATCH
from coroner.core.world import trimmed
from coroner.runtime.blocking import Blocking
from coroner.runtime.watch import Handoff, reflect

logger = logging.getLogger("coroner.agent")

#: How long a 401/403 to "who am I" is taken for a warming-up API server before it is final.
IDENTITY_REFUSAL_PATIENCE_SECONDS = 60.0


class AgentApi:
    """One identity (the agent's ServiceAccount), one node."""

    def __init__(self, rest: Rest, *, node_name: str, system_namespace: str = api.SYSTEM_NAMESPACE):
        self.rest = rest
        self.node_name = node_name
        self.system_namespace = system_namespace

    @property
    def selector(self) -> str:
        return f"{api.NODE_LABEL}={self.node_name}"

    def whoami(self, *, refusal_patience_seconds: float = IDENTITY_REFUSAL_PATIENCE_SECONDS) -> str:
        """The agent's username (recorded in attestations). Retried while the API server is
        unreachable, busy (429, 5xx) or still warming up (401, 403: an authenticator or authorizer
        not yet synced after a restart) — an agent must come up with its node and name itself, not
        crash-loop or record 'unknown' for its whole life (docs/faults.md, finding 5). A refusal
        that outlasts `refusal_patience_seconds` is taken as final: the identity is informational
        (admission checks the real requester), so the agent goes on as 'unknown' and says why."""
        delay = 0.5
        refused_since: float | None = None
        while True:
            try:
                answer = self.rest.request(
                    "POST", kubewire.SELF_SUBJECT_REVIEW_PATH, body=dict(kubewire.SELF_SUBJECT_REVIEW)
                )
            except ApiError as exc:
                if exc.status in (401, 403):
                    refused_since = time.monotonic() if refused_since is None else refused_since
                    if time.monotonic() - refused_since >= refusal_patience_seconds:
                        logger.error(
                            "the API server refuses to say who this agent is node=%s status=%s for %.0fs; "
                            "attestations will record identity 'unknown' (check the agent's token and that "
                            "SelfSubjectReview is allowed to it)",
                            self.node_name, exc.status, refusal_patience_seconds,
                        )  # fmt: skip
                        return "unknown"
                elif not busy_or_unavailable(exc.status):
                    return "unknown"  # answered, but not with an identity: informational only
                logger.warning("API server not ready node=%s error=%r; retrying in %.1fs", self.node_name, exc, delay)
            except Exception as exc:
                logger.warning("API server unreachable node=%s error=%r; retrying in %.1fs", self.node_name, exc, delay)
            else:
                return kubewire.reviewed_username(answer) or "unknown"
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def node_boot_id(self) -> str | None:
        """Node.status.nodeInfo.bootID, for the cross-check; None when unreadable or absent."""
        try:
            node = self.rest.request("GET", f"/api/v1/nodes/{self.node_name}")
        except Exception:  # only a logged cross-check: unknown leaves it unchecked
            return None
        boot_id = ((node.get("status") or {}).get("nodeInfo") or {}).get("bootID")
        return str(boot_id) if boot_id else None

    def get_registration(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.rest.request("GET", registrations_path(namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def patch_status(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        """The attestation's JSON patch (`wire.attestation_ops`, built by the attest step)."""
        return self.rest.request(
            "PATCH", registrations_path(namespace, name) + "/status", body=ops, content_type=JSON_PATCH
        )

    def renew_lease(
        self, *, holder: str, duration: int, annotations: dict[str, str], now: datetime.datetime | None = None
    ) -> None:
        """Creates or renews coroner-agent-<node>: agent liveness is observable, never assumed."""
        name = f"{api.AGENT_LEASE_PREFIX}{self.node_name}"
        upsert_lease(
            self.rest, namespace=self.system_namespace, name=name, holder=holder, duration=duration,
            annotations=annotations, now=now,
        )  # fmt: skip

    def watch_registrations(
        self,
        *,
        loop: asyncio.AbstractEventLoop,
        on_event: Callable[[str, dict[str, Any]], None],
        on_relist: Callable[[list[dict[str, Any]]], None],
        stop: threading.Event,
        timeout_seconds: int = 300,
        on_error: Callable[[str, BaseException], None] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        """List-then-watch this node's registrations forever in this (worker) thread
        (`coroner.runtime.watch.reflect`). Events are handed to the event loop, never called here; a
        relist is handed over whole once its last page is read (one node's registrations), each
        registration as the cache keeps it (`trimmed`, as soon as it is decoded)."""
        handoff = Handoff(loop, stop=stop)
        listed: list[dict[str, Any]] = []

        def on_page(items: list[dict[str, Any]], first: bool, last: bool, _: str) -> None:
            if first:
                listed.clear()
            listed.extend(items)
            if last:
                handoff(on_relist, list(listed))

        reflect(
            self.rest, registrations_path(), query={"labelSelector": self.selector}, stop=stop,
            on_page=on_page, on_event=lambda event_type, obj: handoff(on_event, event_type, obj),
            on_error=on_error, rng=rng, timeout_seconds=timeout_seconds, what=f"node={self.node_name}", keep=trimmed,
        )  # fmt: skip


class ApiPort:
    """`coroner_agent.executor.AgentPort` over an `AgentApi`: each blocking call awaited through
    `blocking` (production: a `ThreadPool` sized for the agent's concurrent attestations plus its
    Lease renewal, as the event loop's default pool is min(32, CPUs + 4) threads: on a 2-core node
    it would cap the attestations in flight at 6, whatever the agent's --workers say; the
    simulation: its API latency in virtual time)."""

    def __init__(self, api: AgentApi, *, blocking: Blocking) -> None:
        self.api = api
        self.blocking = blocking

    async def patch_status(self, *, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        return await self.blocking.run(lambda: self.api.patch_status(namespace, name, ops))

    async def get_registration(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        return await self.blocking.run(lambda: self.api.get_registration(namespace, name))

    async def renew_lease(
        self, *, holder: str, duration: int, annotations: dict[str, str], now: datetime.datetime
    ) -> None:
        await self.blocking.run(
            lambda: self.api.renew_lease(holder=holder, duration=duration, annotations=annotations, now=now)
        )

    def close(self) -> None:
        self.blocking.close()
