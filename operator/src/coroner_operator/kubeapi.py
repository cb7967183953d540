"""The operator's only door to the API server besides kopf's watches.

Blocking HTTP calls (`coroner.client.rest`, JSON over urllib3: see there why not the kubernetes
package) run in a bounded thread pool (`coroner.runtime.blocking.ThreadPool`, the default
`Blocking`) so that the event loop (and with it every watch) never stalls on one slow request. Each
method is one API request; the reconciler composes them. The deterministic simulation (tests/sim)
gives a `Rest` over its model API server and a `Blocking` that answers in virtual time: everything
else here is what it runs.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import logging
import uuid
from collections.abc import Callable
from typing import Any, Final, TypeVar

from coroner.client.rest import ApiError, Rest, leases_path, registrations_path, upsert_lease
from coroner.core import admission_digest, api, kubewire
from coroner.core.wire import JSON_PATCH
from coroner.retire import PortError
from coroner.runtime.blocking import Blocking, ThreadPool
from coroner.runtime.controller import utcnow

T = TypeVar("T")

#: The resource of each admission kind `coroner.core.admission_digest` compares (the ClusterRole
#: grants get/list on exactly these, in admissionregistration.k8s.io/v1).
ADMISSION_RESOURCES: Final = {
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
}
assert tuple(ADMISSION_RESOURCES) == admission_digest.KINDS

logger = logging.getLogger("coroner.operator")


class KubeApi:
    """Async facade over one Rest client (one identity)."""

    def __init__(
        self,
        rest: Rest,
        *,
        workers: int = 16,
        blocking: Blocking | None = None,
        clock: Callable[[], datetime.datetime] = utcnow,
    ) -> None:
        self.rest = rest
        self._blocking: Blocking = blocking if blocking is not None else ThreadPool(workers=workers)
        self.clock = clock
        """The time written into the Events and the Lease renewals this client sends."""

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await self._blocking.run(functools.partial(fn, *args, **kwargs))

    async def _request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        return await self._run(self.rest.request, method, path, **kwargs)

    def close(self) -> None:
        self._blocking.close()

    async def whoami(self) -> str:
        answer = await self._request("POST", kubewire.SELF_SUBJECT_REVIEW_PATH, body=dict(kubewire.SELF_SUBJECT_REVIEW))
        username = kubewire.reviewed_username(answer)
        if username is None:
            raise ValueError(f"the API server's SelfSubjectReview named no user: {answer!r}")
        return username

    async def can_retire(self, *, namespace: str, name: str | None = None) -> bool:
        """SelfSubjectAccessReview for the `retire` verb; errors are "not allowed" (unknown ≠ granted)."""
        review = kubewire.self_access_review(namespace=namespace, name=name)
        try:
            result = await self._request("POST", kubewire.SELF_ACCESS_REVIEW_PATH, body=review)
        except Exception as exc:  # HTTP or connection error alike: unknown is never granted
            logger.warning("retire capability unknown namespace=%s error=%r", namespace, exc)
            return False
        return (result.get("status") or {}).get("allowed") is True

    async def list_admission_policies(self) -> list[dict[str, Any]]:
        """Every admission policy and binding of the kinds Coroner ships, and the WorkerRegistration
        CRD, each with its `kind` (a list's items carry none). Errors propagate: the caller reads them as "not verified"."""

        async def crd() -> dict[str, Any] | None:
            # The CRD, verified with them (its status subresource and rules); absent, it is missing.
            try:
                return await self._request(
                    "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{api.CRD_NAME}"
                )
            except ApiError as exc:
                if exc.status != 404:
                    raise
                return None

        # All at once: a retirement waits for this read, so its requests must not queue behind
        # each other (the lists may each wait for the API server's watch cache to catch up).
        listed, definition = await asyncio.gather(
            asyncio.gather(
                *(self._request("GET", f"/apis/admissionregistration.k8s.io/v1/{plural}")
                  for plural in ADMISSION_RESOURCES.values())
            ),
            crd(),
        )  # fmt: skip
        objects = [
            {**item, "kind": kind}
            for kind, result in zip(ADMISSION_RESOURCES, listed, strict=True)
            for item in result.get("items") or []
        ]
        if definition is not None:
            objects.append({**definition, "kind": admission_digest.CRD_KIND})
        return objects

    async def get_registration(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._request("GET", registrations_path(namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def patch_status(
        self, *, namespace: str, name: str, ops: list[dict[str, Any]], decided_on: str | None = None
    ) -> dict[str, Any]:
        """A JSON patch of /status (never a merge patch: its `test`s are the compare-and-swap).

        `decided_on`, for a retirement, is the resourceVersion of the view it was decided on: not
        sent (the `test`s are what the write relies on), only logged; a port that records writes
        (the simulation's stale-view oracle) reads it here."""
        if decided_on is not None:
            logger.debug("retirement write namespace=%s name=%s decided_on=%s", namespace, name, decided_on)
        return await self._request(
            "PATCH", registrations_path(namespace, name) + "/status", body=ops, content_type=JSON_PATCH
        )

    async def delete_registration(self, *, namespace: str, name: str, uid: str, resource_version: str) -> None:
        """Deletes exactly the registration as read: the server refuses (409) if another object now
        has the name (uid) or this one changed since (resourceVersion), so nothing is deleted on a
        stale read. A 404 propagates too (already gone)."""
        options = kubewire.delete_options(uid=uid, resource_version=resource_version)
        await self._request("DELETE", registrations_path(namespace, name), body=options)

    async def list_leases(self, *, namespace: str) -> list[dict[str, Any]]:
        """A live read of the Leases in one namespace (the fence right before a retirement)."""
        result = await self._request("GET", leases_path(namespace))
        return list(result.get("items") or [])

    async def get_lease(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        """A live GET of one Lease (the leader Lease); None only for a 404."""
        try:
            return await self._request("GET", leases_path(namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def create_lease(self, *, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._request("POST", leases_path(namespace), body=body)

    async def replace_lease(self, *, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """A PUT carrying the body's resourceVersion: a compare-and-swap (409 if it moved)."""
        return await self._request("PUT", leases_path(namespace, name), body=body)

    async def get_node(self, *, name: str) -> dict[str, Any] | None:
        """A live GET of a Node: None only for a real 404 (errors propagate; unknown is not gone)."""
        try:
            return await self._request("GET", f"/api/v1/nodes/{name}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def post_event(
        self,
        *,
        body: dict[str, Any],
        reason: str,
        message: str,
        event_type: str = "Normal",
        component: str = "coroner-operator",
        count: int = 1,
        first_time: datetime.datetime | None = None,
    ) -> None:
        """Creates one core/v1 Event about `body`; `count` > 1 is an aggregate of that many."""
        event = kubewire.event_body(
            involved=body,
            reason=reason,
            message=message,
            component=component,
            instance=component,
            now=self.clock(),
            suffix=uuid.uuid4().hex[:12],
            event_type=event_type,
            count=count,
            first_time=first_time,
        )
        namespace = (body.get("metadata") or {}).get("namespace")
        await self._request("POST", f"/api/v1/namespaces/{namespace}/events", body=event)

    async def upsert_lease(
        self, *, namespace: str, name: str, holder: str, duration: int, annotations: dict[str, str]
    ) -> None:
        """Creates or renews a Lease (the operator's own heartbeat, read by `kubectl coroner doctor`)."""
        await self._run(
            upsert_lease, self.rest, namespace=namespace, name=name, holder=holder, duration=duration,
            annotations=annotations, now=self.clock(),
        )  # fmt: skip


def describe(exc: BaseException) -> str:
    """One line naming an error; for API errors, the server's own message (it names the fix)."""
    if isinstance(exc, ApiError):
        return f"{exc.status} {exc.reason}: {exc.message}"
    if isinstance(exc, PortError):
        return f"{exc.status} {exc.reason}: {exc.message}" if exc.status is not None else f"unreachable: {exc.message}"
    return f"{type(exc).__name__}: {exc}"
