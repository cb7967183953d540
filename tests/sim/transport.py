"""The API transport port: the model API server behind the client interface production uses.

`SimRest` is a `coroner.client.rest.Rest` as far as its callers can tell — `request(method, path,
body=..., content_type=...)` returns the decoded JSON of a success and raises `ApiError` for an
error status — but each request is answered by `sim.apiserver.Server`, as one identity. `Latency`
is the `coroner.runtime.blocking.Blocking` that awaits it: the request reaches the server one API
latency after it is sent (drawn from the trial's seed) and its answer is back at that instant; a
component that died meanwhile never sends it (`sim.loop`: the callback belongs to its life).

So the production `KubeApi` and `AgentApi` (every request they build, every status they read an
answer from) and everything above them run as shipped; only the bytes on the wire are not there.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from coroner.client.rest import ApiError
from sim.apiserver import Server, SimApiError
from sim.prod import api, operator_kubeapi

if TYPE_CHECKING:
    from sim.loop import SimLoop

T = TypeVar("T")

_REGISTRATIONS = f"/apis/{api.GROUP}/{api.VERSION}/namespaces/"
_LEASES = "/apis/coordination.k8s.io/v1/namespaces/"
_ACCESS_REVIEW = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
_ADMISSION = "/apis/admissionregistration.k8s.io/v1/"
_ADMISSION_PLURALS = {
    "validatingadmissionpolicies": "ValidatingAdmissionPolicy",
    "validatingadmissionpolicybindings": "ValidatingAdmissionPolicyBinding",
    "mutatingadmissionpolicies": "MutatingAdmissionPolicy",
    "mutatingadmissionpolicybindings": "MutatingAdmissionPolicyBinding",
}
_MANIFEST = Path(__file__).resolve().parents[2] / "manifests" / "base" / "admission-policies.yaml"
_CRD_MANIFEST = _MANIFEST.with_name("crd.yaml")
_CRD = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{api.CRD_NAME}"
#: libyaml's safe loader where PyYAML was built with it (the same documents, in a tenth of the time:
#: each process of a batch reads the manifests once).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def _installed_policies() -> dict[str, list[dict[str, Any]]]:
    """The shipped admission policies and bindings, as the model API server lists them (by plural):
    installed as manifests/base ships them, each with a uid and a resourceVersion that never change
    (no fault of the simulation edits them)."""
    by_kind: dict[str, list[dict[str, Any]]] = {kind: [] for kind in _ADMISSION_PLURALS.values()}
    for index, document in enumerate(d for d in yaml.load_all(_MANIFEST.read_text(), Loader=_LOADER) if d):
        meta = {**document.get("metadata", {}), "uid": f"admission-{index}", "resourceVersion": "1"}
        by_kind[document["kind"]].append({key: value for key, value in document.items() if key != "kind"} | {
            "metadata": meta})  # fmt: skip
    return {plural: by_kind[kind] for plural, kind in _ADMISSION_PLURALS.items()}


@functools.cache
def _installed_crd() -> dict[str, Any]:
    """The shipped WorkerRegistration CRD, as the model API server serves it (verified with the
    admission policies; no fault of the simulation edits it)."""
    document = yaml.load(_CRD_MANIFEST.read_text(), Loader=_LOADER)
    meta = {**document.get("metadata", {}), "uid": "crd", "resourceVersion": "1"}
    return {key: value for key, value in document.items() if key != "kind"} | {"metadata": meta}


class SimRest:
    """The requests Coroner's operator and agents send, answered by the model API server as `identity`."""

    def __init__(
        self,
        server: Server,
        *,
        identity: str,
        wrote: Callable[[], None] = lambda: None,
        reachable: Callable[[], bool] = lambda: True,
    ) -> None:
        self.server = server
        self.identity = identity
        self.wrote = wrote
        """Called after each status write of a registration that landed (Sieve's crash-after-write)."""
        self.reachable = reachable
        """False while a partition cuts this identity off: its requests get no answer."""
        self.view_rv: int | None = None
        """The resourceVersion the request's writer decided on (the oracles' record, never sent)."""
        self.events = 0

    def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> dict[str, Any]:
        """`Rest.request`: the query, content type and timeout change nothing here (every status
        write is a JSON patch, as `KubeApi` and `AgentApi` send it)."""
        if not self.reachable():
            raise ConnectionError(f"{self.identity} is cut off from the API server")
        try:
            return self._answer(method, path, body)
        except SimApiError as exc:
            raise ApiError(exc.status, exc.reason, exc.message) from None

    def _answer(self, method: str, path: str, body: Any) -> dict[str, Any]:
        server = self.server
        if path.startswith(_REGISTRATIONS):
            namespace, _plural, name, *sub = path[len(_REGISTRATIONS) :].split("/")
            if method == "GET":
                return server.get("wreg", namespace, name)  # a quorum read: fresh even from a lagging replica
            if method == "PATCH" and sub == ["status"]:
                written = server.patch(self.identity, "wreg", namespace, name, body, view_rv=self.view_rv)
                self.wrote()
                return written
            if method == "DELETE":
                preconditions = (body or {}).get("preconditions") or {}
                server.delete(self.identity, "wreg", namespace, name, uid=preconditions.get("uid", ""),
                              resource_version=preconditions.get("resourceVersion", ""))  # fmt: skip
                return {}
        elif path.startswith(_LEASES):
            namespace, _plural, *named = path[len(_LEASES) :].split("/")
            if method == "GET" and not named:
                return {"items": server.list_leases(namespace), "metadata": {"resourceVersion": str(server.rv)}}
            if method == "GET":
                return server.get("lease", namespace, named[0])
            if method == "POST":
                return server.create(self.identity, "lease", body)
            if method == "PUT":
                return server.upsert(self.identity, "lease", body)
        elif path == _ACCESS_REVIEW and method == "POST":
            return {"status": {"allowed": server.holds_retire(self.identity)}}
        elif path == _CRD and method == "GET":
            return _installed_crd()
        elif path.startswith(_ADMISSION) and method == "GET":
            return {"items": _installed_policies()[path[len(_ADMISSION) :]]}
        elif path.startswith("/api/v1/namespaces/") and path.endswith("/events") and method == "POST":
            self.events += 1
            return dict(body)
        elif path.startswith("/api/v1/nodes/") and method == "GET":
            raise SimApiError(404, "NotFound", "nodes are not modelled")
        raise SimApiError(405, "MethodNotAllowed", f"{method} {path} is not modelled")


class Latency:
    """`coroner.runtime.blocking.Blocking` in virtual time: a call reaches the server `latency()`
    seconds after it was sent, and its answer (or error) is back at that instant."""

    def __init__(self, loop: SimLoop, rest: SimRest, *, latency: Callable[[], float]) -> None:
        self.loop = loop
        self.rest = rest
        self.latency = latency
        self.decided_on: int | None = None
        """The view the next call's retirement was decided on (`RecordingKubeApi`), taken by `run`."""

    async def run(self, call: Callable[[], T]) -> T:
        future: asyncio.Future[T] = self.loop.create_future()
        view_rv, self.decided_on = self.decided_on, None

        def arrive() -> None:
            if future.cancelled():
                return
            self.rest.view_rv = view_rv
            try:
                result = call()
            except Exception as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)
            finally:
                self.rest.view_rv = None

        self.loop.call_at(self.loop.time() + self.latency(), arrive)
        return await future

    def close(self) -> None:
        """Nothing to release: no threads, no sockets."""


class RecordingKubeApi(operator_kubeapi.KubeApi):
    """The production `KubeApi` (the operator's API port), whose retirement writes also tell the
    transport the view they were decided on (`decided_on`, which production logs and does not send):
    the `stale_view` oracle's record. `KubeApi.patch_status` hands its request to `Latency.run`
    before it first waits, so the view goes with that very request."""

    def __init__(self, rest: SimRest, *, latency: Latency, **options: Any) -> None:
        super().__init__(rest, blocking=latency, **options)  # type: ignore[arg-type]
        self.latency = latency

    async def patch_status(
        self, *, namespace: str, name: str, ops: list[dict[str, Any]], decided_on: str | None = None
    ) -> dict[str, Any]:
        self.latency.decided_on = int(decided_on) if decided_on is not None else None
        return await super().patch_status(namespace=namespace, name=name, ops=ops, decided_on=decided_on)
