"""The operator's only door to the API server besides kopf's watches.

Blocking kubernetes-client calls run in a bounded thread pool so that the event loop (and with it
every watch) never stalls on one slow request. Each method is one API request; the reconciler
composes them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import functools
import logging
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner import api
from coroner.kube import patch_registration_status

T = TypeVar("T")

logger = logging.getLogger("coroner.operator")


class KubeApi:
    """Async facade over one ApiClient (one identity)."""

    def __init__(self, client: k8s.ApiClient, *, workers: int = 16) -> None:
        self.client = client
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kubeapi")
        self._custom = k8s.CustomObjectsApi(client)
        self._core = k8s.CoreV1Api(client)
        self._coordination = k8s.CoordinationV1Api(client)
        self._authz = k8s.AuthorizationV1Api(client)
        self._authn = k8s.AuthenticationV1Api(client)

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def whoami(self) -> str:
        review = await self._run(self._authn.create_self_subject_review, k8s.V1SelfSubjectReview())
        return str(review.status.user_info.username)

    async def can_retire(self, *, namespace: str, name: str | None = None) -> bool:
        """SelfSubjectAccessReview for the `retire` verb; errors are "not allowed" (unknown ≠ granted)."""
        review = k8s.V1SelfSubjectAccessReview(
            spec=k8s.V1SelfSubjectAccessReviewSpec(
                resource_attributes=k8s.V1ResourceAttributes(
                    group=api.GROUP, resource=api.PLURAL, verb=api.RETIRE_VERB, namespace=namespace, name=name
                )
            )
        )
        try:
            result = await self._run(self._authz.create_self_subject_access_review, review)
        except Exception as exc:  # HTTP or connection error alike: unknown is never granted
            logger.warning("retire capability unknown namespace=%s error=%r", namespace, exc)
            return False
        return bool(result.status.allowed)

    async def get_registration(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            body: dict[str, Any] = await self._run(
                self._custom.get_namespaced_custom_object, api.GROUP, api.VERSION, namespace, api.PLURAL, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return body

    async def patch_status(self, *, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        return await self._run(patch_registration_status, self.client, namespace=namespace, name=name, body=ops)

    async def delete_registration(self, *, namespace: str, name: str, resource_version: str) -> None:
        options = k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(resource_version=resource_version))
        await self._run(
            self._custom.delete_namespaced_custom_object,
            api.GROUP,
            api.VERSION,
            namespace,
            api.PLURAL,
            name,
            body=options,
        )

    async def list_leases(self, *, namespace: str) -> list[dict[str, Any]]:
        """A live read of the Leases in one namespace (the fence right before a retirement)."""
        result = await self._run(self._coordination.list_namespaced_lease, namespace)
        return [self.client.sanitize_for_serialization(item) for item in result.items]

    async def get_node(self, *, name: str) -> dict[str, Any] | None:
        """A live GET of a Node: None only for a real 404 (errors propagate; unknown is not gone)."""
        try:
            node = await self._run(self._core.read_node, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        body: dict[str, Any] = self.client.sanitize_for_serialization(node)
        return body

    async def post_event(
        self,
        *,
        body: dict[str, Any],
        reason: str,
        message: str,
        event_type: str = "Normal",
        component: str = "coroner-operator",
    ) -> None:
        meta = body.get("metadata") or {}
        now = datetime.datetime.now(datetime.UTC)
        event = k8s.CoreV1Event(
            metadata=k8s.V1ObjectMeta(
                name=f"{meta.get('name')}.{uuid.uuid4().hex[:12]}", namespace=meta.get("namespace")
            ),
            involved_object=k8s.V1ObjectReference(
                api_version=api.API_VERSION,
                kind=api.KIND,
                name=meta.get("name"),
                namespace=meta.get("namespace"),
                uid=meta.get("uid"),
                resource_version=meta.get("resourceVersion"),
            ),
            reason=reason,
            message=message[:1024],
            type=event_type,
            source=k8s.V1EventSource(component=component),
            reporting_component=component,
            reporting_instance=component,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        await self._run(self._core.create_namespaced_event, meta.get("namespace"), event)

    async def upsert_lease(
        self, *, namespace: str, name: str, holder: str, duration: int, annotations: dict[str, str]
    ) -> None:
        """Creates or renews a Lease (the operator's own heartbeat, read by `kubectl coroner doctor`)."""
        now = datetime.datetime.now(datetime.UTC)
        try:
            lease = await self._run(self._coordination.read_namespaced_lease, name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = k8s.V1Lease(
                metadata=k8s.V1ObjectMeta(name=name, namespace=namespace, annotations=annotations),
                spec=k8s.V1LeaseSpec(
                    holder_identity=holder, lease_duration_seconds=duration, renew_time=now, acquire_time=now
                ),
            )
            await self._run(self._coordination.create_namespaced_lease, namespace, body)
            return
        lease.metadata.annotations = {**(lease.metadata.annotations or {}), **annotations}
        lease.spec.holder_identity = holder
        lease.spec.lease_duration_seconds = duration
        lease.spec.renew_time = now
        await self._run(self._coordination.replace_namespaced_lease, name, namespace, lease)
