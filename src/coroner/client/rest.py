"""Coroner's HTTP client for the Kubernetes API: the few requests its resident processes make, over urllib3.

The agent runs on every node and the launcher (`coroner run`) beside every worker, so their memory
is paid once per node and once per worker, and the operator's CPU per request bounds how fast it
retires a mass death. The `kubernetes` package imports every generated model of the whole API on
start (about 32 MB of RSS, measured with `resource.getrusage` after import; a `coroner run`
launcher measured 50.6 MB RSS with it, 30.7 MB with this client) and validates every call's
arguments with pydantic; the agent, the operator and the launcher need a dozen requests and one
watch between them, so they speak JSON over urllib3 themselves (kopf keeps its own aiohttp client
for the operator's watches). The human-facing CLI uses the `kubernetes` package
(`coroner.client.kube`), whose full kubeconfig support (contexts, exec plugins) matters there;
the benchmarks use this client. Credentials come from a kubeconfig (server, CA,
bearer token or token file, client certificate) or, in a pod, from the ServiceAccount files, whose
bound token the kubelet rotates: the token file is re-read every minute, as client-go does.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import http
import json
import os
import pathlib
import ssl
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import urllib3
import yaml

from coroner.core import api, kubewire
from coroner.core.wire import JSON

#: Where a pod finds its ServiceAccount credentials (a test points it elsewhere).
SERVICE_ACCOUNT_DIR = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_SECONDS = 60.0
#: A kept-alive connection the server (or a proxy) has closed fails the next request sent on it:
#: retry that, as the kubernetes client's urllib3 does. Read errors are retried only for idempotent
#: methods (urllib3's default set: GET, PUT, DELETE, ...), never a POST or a PATCH, whose first
#: attempt may have landed; HTTP error statuses are returned, not retried.
RETRIES = urllib3.Retry(total=3, connect=3, read=2, status=0, redirect=0, backoff_factor=0.1)


_REASONS = {status.value: status.phrase for status in http.HTTPStatus}


class ApiError(Exception):
    """An HTTP error status from the API server (or a watch ERROR event), with its Status body."""

    def __init__(self, status: int, reason: str = "", body: str = "") -> None:
        super().__init__(f"({status}) {reason}: {body[:500]}")
        self.status = status
        self.reason = reason
        self.body = body

    @property
    def message(self) -> str:
        with contextlib.suppress(ValueError, AttributeError):
            return str(json.loads(self.body).get("message") or self.body)
        return self.body


def busy_or_unavailable(status: int) -> bool:
    """429 and 5xx: the API server is overloaded, restarting or not serving the resource yet."""
    return status == 429 or status >= 500


def warming_up(error: ApiError) -> bool:
    """Answers an API server gives every client for a moment after it (re)starts, and that a client
    may therefore wait out (bounded): busy or unavailable, 401 (the token authenticator not yet
    synced: docs/faults.md, finding 5) and the admission plugin's 403 "not yet ready to handle
    request". Any other 403 (RBAC, an admission policy's denial) is an answer, not a moment."""
    if busy_or_unavailable(error.status) or error.status == 401:
        return True
    return api.admission_not_ready(error.status, error.message)


def in_cluster_server() -> str:
    """The API server a pod reaches, as client-go's in-cluster config finds it: the Service address
    the kubelet puts in KUBERNETES_SERVICE_HOST/PORT (never a DNS name, which needs cluster DNS)."""
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    host = f"[{host}]" if ":" in host else host
    return f"https://{host}:{port}"


class Rest:
    """One identity against one API server; thread-safe (urllib3's pool)."""

    def __init__(
        self,
        server: str,
        *,
        ssl_context: ssl.SSLContext,
        token: str | None = None,
        token_file: str | os.PathLike[str] | None = None,
        timeout: float = 30.0,
        user_agent: str = "coroner",
        pool_size: int = 8,
    ) -> None:
        self.server = server.rstrip("/")
        self._token = token
        self._token_file = pathlib.Path(token_file) if token_file else None
        self._token_read_at = -TOKEN_REREAD_SECONDS
        self._lock = threading.Lock()
        self._timeout = timeout
        self.user_agent = user_agent
        self._pool = urllib3.PoolManager(num_pools=2, maxsize=pool_size, ssl_context=ssl_context)

    # --- construction ----------------------------------------------------------------------------

    @classmethod
    def from_kubeconfig(cls, path: str | os.PathLike[str], **options: Any) -> Rest:
        """The current context of a kubeconfig: token, tokenFile or client certificate; CA by file or data."""
        config = yaml.safe_load(pathlib.Path(path).read_text()) or {}
        base = pathlib.Path(path).resolve().parent

        def named(kind: str, name: str | None) -> dict[str, Any]:
            for entry in config.get(kind) or []:
                if entry.get("name") == name:
                    return dict(entry.get(kind[:-1]) or {})
            raise ValueError(f"kubeconfig {path}: no {kind[:-1]} named {name!r}")

        context = named("contexts", config.get("current-context"))
        cluster = named("clusters", context.get("cluster"))
        user = named("users", context.get("user"))

        def file(value: str) -> str:
            return str(base / value)

        for plugin in ("exec", "auth-provider"):
            if user.get(plugin):
                raise ValueError(
                    f"kubeconfig {path}: user {context.get('user')!r} authenticates with {plugin!r}, which Coroner's "
                    "components do not run; give them a ServiceAccount token (token or tokenFile) or a client "
                    "certificate"
                )
        ctx = ssl.create_default_context()
        if cluster.get("insecure-skip-tls-verify"):
            raise ValueError(f"kubeconfig {path}: insecure-skip-tls-verify is not supported by Coroner")
        if cluster.get("certificate-authority-data"):
            ctx.load_verify_locations(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
        elif cluster.get("certificate-authority"):
            ctx.load_verify_locations(cafile=file(cluster["certificate-authority"]))
        if user.get("client-certificate-data") or user.get("client-certificate"):
            _load_client_certificate(ctx, user, file)
        token_file = file(user["tokenFile"]) if user.get("tokenFile") else None
        return cls(str(cluster["server"]), ssl_context=ctx, token=user.get("token"), token_file=token_file, **options)

    @classmethod
    def in_cluster(cls, **options: Any) -> Rest:
        ctx = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT_DIR / "ca.crt"))
        return cls(in_cluster_server(), ssl_context=ctx, token_file=SERVICE_ACCOUNT_DIR / "token", **options)

    @classmethod
    def default(cls, kubeconfig: str | os.PathLike[str] | None, **options: Any) -> Rest:
        """Like `coroner.client.kube.api_client`: the given kubeconfig, else in-cluster, else ~/.kube/config."""
        if kubeconfig:
            return cls.from_kubeconfig(kubeconfig, **options)
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            return cls.in_cluster(**options)
        path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or "~/.kube/config"
        return cls.from_kubeconfig(pathlib.Path(path).expanduser(), **options)

    def close(self) -> None:
        """Closes the pooled connections (a new request opens new ones)."""
        self._pool.clear()

    # --- requests --------------------------------------------------------------------------------

    def send(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = JSON,
        timeout: float | None = None,
    ) -> tuple[int, bytes]:
        """One request, answered as (HTTP status, body bytes): no error for an error status, and
        no JSON decoding (a /metrics scrape, or a caller that counts statuses)."""
        response = self._pool.request(
            method,
            self._url(path, query),
            body=None if body is None else json.dumps(body).encode(),
            headers=self._headers(content_type if body is not None else None),
            timeout=urllib3.Timeout(connect=10.0, read=timeout or self._timeout),
            retries=RETRIES,
        )
        return response.status, response.data

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = JSON,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """One request; an error status raises ApiError, a success returns the decoded JSON body."""
        status, data = self.send(method, path, query=query, body=body, content_type=content_type, timeout=timeout)
        if status >= 400:
            raise ApiError(status, _REASONS.get(status, ""), data.decode(errors="replace"))
        result: dict[str, Any] = json.loads(data or b"{}")
        return result

    def watch(self, path: str, *, query: dict[str, Any], timeout_seconds: int) -> Iterator[dict[str, Any]]:
        """The events of a watch (`watch=true`), one per line, until the server ends the stream."""
        response = self._pool.request(
            "GET",
            self._url(path, {**query, "watch": "true", "timeoutSeconds": timeout_seconds}),
            headers=self._headers(None),
            timeout=urllib3.Timeout(connect=10.0, read=timeout_seconds + 30.0),
            retries=RETRIES,
            preload_content=False,
        )
        ended = False
        try:
            if response.status >= 400:
                raise ApiError(response.status, response.reason or "", response.read().decode(errors="replace"))
            yield from json_lines(response.stream(64 * 1024))
            ended = True
        finally:
            if not ended and response.status < 400:
                response.close()  # left early: the server is still streaming; never reuse that connection
            response.release_conn()

    def _url(self, path: str, query: dict[str, Any] | None) -> str:
        if not query:
            return self.server + path
        pairs = {k: ("true" if v is True else "false" if v is False else v) for k, v in query.items() if v is not None}
        return f"{self.server}{path}?{urllib.parse.urlencode(pairs)}"

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": JSON, "User-Agent": self.user_agent}
        if content_type:
            headers["Content-Type"] = content_type
        token = self._current_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _current_token(self) -> str | None:
        if self._token_file is None:
            return self._token
        with self._lock:
            if time.monotonic() - self._token_read_at >= TOKEN_REREAD_SECONDS or not self._token:
                self._token = self._token_file.read_text().strip()
                self._token_read_at = time.monotonic()
            return self._token


def _load_client_certificate(ctx: ssl.SSLContext, user: dict[str, Any], file: Any) -> None:
    """ssl loads a certificate chain only from files: data fields go through a private temp dir."""
    if user.get("client-certificate") and user.get("client-key"):
        ctx.load_cert_chain(file(user["client-certificate"]), file(user["client-key"]))
        return
    with tempfile.TemporaryDirectory(prefix="coroner-") as tmp:
        cert, key = pathlib.Path(tmp, "tls.crt"), pathlib.Path(tmp, "tls.key")
        cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
        key.touch(mode=0o600)
        key.write_bytes(base64.b64decode(user["client-key-data"]))
        ctx.load_cert_chain(str(cert), str(key))


def json_lines(chunks: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The JSON documents of a stream of one per line (a watch's events), however it is chunked."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)


def list_pages(
    client: Rest, path: str, *, query: Mapping[str, Any] | None = None, limit: int = 500, timeout: float = 120.0
) -> Iterator[dict[str, Any]]:
    """One LIST, page by page (`limit` objects each; the pages are one snapshot, and the last one's
    metadata carries its resourceVersion): a large collection is never one response that the API
    server and the reader hold at once."""
    token: str | None = None
    while True:
        page_query = {**(query or {}), "limit": limit, **({"continue": token} if token else {})}
        page = client.request("GET", path, query=page_query, timeout=timeout)
        yield page
        token = (page.get("metadata") or {}).get("continue") or None
        if token is None:
            return


def registrations_path(namespace: str | None = None, name: str | None = None) -> str:
    """WorkerRegistrations: all namespaces, one namespace, or one object (append "/status" for its status)."""
    scope = f"/namespaces/{namespace}" if namespace else ""
    return f"/apis/{api.GROUP}/{api.VERSION}{scope}/{api.PLURAL}" + (f"/{name}" if name else "")


def leases_path(namespace: str, name: str | None = None) -> str:
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    return f"{path}/{name}" if name else path


def upsert_lease(
    client: Rest,
    *,
    namespace: str,
    name: str,
    holder: str,
    duration: int,
    annotations: dict[str, str],
    now: datetime.datetime | None = None,
) -> None:
    """Creates or renews a Lease (the agent's liveness, the operator's own heartbeat): renewTime `now`
    (the wall clock by default), the given holder and duration, annotations merged. The renewal is a
    PUT carrying the resourceVersion read: a compare-and-swap, so a concurrent writer makes it fail,
    not vanish."""
    now = now if now is not None else datetime.datetime.now(datetime.UTC)
    try:
        lease = client.request("GET", leases_path(namespace, name))
    except ApiError as exc:
        if exc.status != 404:
            raise
        created = kubewire.lease_body(
            namespace=namespace, name=name, holder=holder, duration=duration, annotations=annotations, now=now
        )
        client.request("POST", leases_path(namespace), body=created)
        return
    renewed = kubewire.lease_renewal(lease, holder=holder, duration=duration, annotations=annotations, now=now)
    client.request("PUT", leases_path(namespace, name), body=renewed)
