"""The agent's API side: its node Lease, the watch of its node's registrations, attestation writes.

Blocking kubernetes-client calls run in threads; watch events are handed to the event loop. An API
outage delays attestations; it never produces one (unknown is never dead).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from coroner import api
from coroner.kube import patch_registration_status

logger = logging.getLogger("coroner.agent")


def attestation_ops(body: dict[str, Any], attestation: dict[str, Any]) -> list[dict[str, Any]]:
    """A JSON patch that writes `attestation` only if what the probe relied on still holds.

    The agent relied on the heartbeat it read (recorded as heartbeatSeen): the patch `test`s that
    value, so a heartbeat that lands between the probe and the write turns the write into a 422
    and a fresh probe, instead of an attestation that contradicts the newest heartbeat.
    """
    status = body.get("status")
    seen = attestation.get("heartbeatSeen")
    if isinstance(status, dict) and isinstance(status.get("lastHeartbeatTime"), str):
        return [
            {"op": "test", "path": "/status/lastHeartbeatTime", "value": seen},
            {"op": "add", "path": "/status/attestation", "value": attestation},
        ]
    resource_version = str((body.get("metadata") or {}).get("resourceVersion"))
    if isinstance(status, dict):
        return [
            {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
            {"op": "add", "path": "/status/attestation", "value": attestation},
        ]
    return [
        {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
        {"op": "add", "path": "/status", "value": {"attestation": attestation}},
    ]


class AgentApi:
    """One identity (the agent's ServiceAccount), one node."""

    def __init__(self, client: k8s.ApiClient, *, node_name: str, system_namespace: str = api.SYSTEM_NAMESPACE):
        self.client = client
        self.node_name = node_name
        self.system_namespace = system_namespace
        self._custom = k8s.CustomObjectsApi(client)
        self._coordination = k8s.CoordinationV1Api(client)
        self._core = k8s.CoreV1Api(client)

    @property
    def selector(self) -> str:
        return f"{api.NODE_LABEL}={self.node_name}"

    def whoami(self) -> str:
        """The agent's username (recorded in attestations). Retried while the API server is
        unreachable: an agent must come up with its node, not crash-loop through an outage."""
        delay = 0.5
        while True:
            try:
                review = k8s.AuthenticationV1Api(self.client).create_self_subject_review(k8s.V1SelfSubjectReview())
            except ApiException as exc:
                if exc.status is not None and exc.status < 500:
                    return "unknown"  # answered, but not allowed to say: informational only
            except Exception as exc:
                logger.warning("API server unreachable node=%s error=%r; retrying in %.1fs", self.node_name, exc, delay)
            else:
                return str(review.status.user_info.username)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def node_boot_id(self) -> str | None:
        """Node.status.nodeInfo.bootID, for the cross-check; None when unreadable or absent."""
        try:
            node = self._core.read_node(self.node_name)
        except Exception:  # only a logged cross-check: unknown leaves it unchecked
            return None
        info = node.status.node_info if node.status else None
        return (info.boot_id or None) if info else None

    def list_registrations(self) -> tuple[list[dict[str, Any]], str]:
        result = self._custom.list_cluster_custom_object(
            api.GROUP, api.VERSION, api.PLURAL, label_selector=self.selector
        )
        return list(result.get("items", [])), str(result["metadata"]["resourceVersion"])

    def get_registration(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            body: dict[str, Any] = self._custom.get_namespaced_custom_object(
                api.GROUP, api.VERSION, namespace, api.PLURAL, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return body

    def write_attestation(self, body: dict[str, Any], attestation: dict[str, Any]) -> dict[str, Any]:
        meta = body["metadata"]
        return patch_registration_status(
            self.client, namespace=meta["namespace"], name=meta["name"], body=attestation_ops(body, attestation)
        )

    def renew_lease(self, *, holder: str, duration: int, annotations: dict[str, str]) -> None:
        """Creates or renews coroner-agent-<node>: agent liveness is observable, never assumed."""
        name = f"{api.AGENT_LEASE_PREFIX}{self.node_name}"
        now = datetime.datetime.now(datetime.UTC)
        try:
            lease = self._coordination.read_namespaced_lease(name, self.system_namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self._coordination.create_namespaced_lease(
                self.system_namespace,
                k8s.V1Lease(
                    metadata=k8s.V1ObjectMeta(name=name, annotations=annotations),
                    spec=k8s.V1LeaseSpec(
                        holder_identity=holder, lease_duration_seconds=duration, acquire_time=now, renew_time=now
                    ),
                ),
            )
            return
        lease.metadata.annotations = {**(lease.metadata.annotations or {}), **annotations}
        lease.spec.holder_identity = holder
        lease.spec.lease_duration_seconds = duration
        lease.spec.renew_time = now
        self._coordination.replace_namespaced_lease(name, self.system_namespace, lease)

    def watch_registrations(
        self,
        *,
        loop: asyncio.AbstractEventLoop,
        on_event: Callable[[str, dict[str, Any]], None],
        on_relist: Callable[[list[dict[str, Any]]], None],
        stop: threading.Event,
        timeout_seconds: int = 300,
    ) -> None:
        """List-then-watch forever in this (worker) thread; a 410 or a dropped watch relists.

        Events are delivered on the event loop via call_soon_threadsafe, never called here.
        """
        backoff = 0.5
        while not stop.is_set():
            try:
                items, resource_version = self.list_registrations()
                loop.call_soon_threadsafe(on_relist, items)
                backoff = 0.5
                while not stop.is_set():
                    stream = k8s_watch.Watch()
                    for event in stream.stream(
                        self._custom.list_cluster_custom_object,
                        api.GROUP,
                        api.VERSION,
                        api.PLURAL,
                        label_selector=self.selector,
                        resource_version=resource_version,
                        timeout_seconds=timeout_seconds,
                        allow_watch_bookmarks=True,
                    ):
                        if stop.is_set():
                            stream.stop()
                            break
                        obj = event["object"]
                        resource_version = str(obj.get("metadata", {}).get("resourceVersion", resource_version))
                        if event["type"] == "BOOKMARK":
                            continue
                        if event["type"] == "ERROR":
                            raise ApiException(status=obj.get("code", 500), reason=obj.get("reason"))
                        loop.call_soon_threadsafe(on_event, event["type"], obj)
            except ApiException as exc:
                if exc.status != 410:
                    logger.warning(
                        "watch failed node=%s status=%s; relisting in %.1fs", self.node_name, exc.status, backoff
                    )
                    stop.wait(backoff)
                    backoff = min(backoff * 2, 30.0)
            except Exception as exc:  # connection errors: back off and relist, never guess
                logger.warning("watch failed node=%s error=%r; relisting in %.1fs", self.node_name, exc, backoff)
                with contextlib.suppress(Exception):
                    stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
