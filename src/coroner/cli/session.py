"""The I/O shell shared by every ``kubectl coroner`` command: one identity's session with one cluster.

Every API request of the plugin goes through `Session`, which turns each failure into one
`PluginError` sentence naming the object and the fix. `gather` reads the facts a plan is decided
from, exactly as the operator reads them; `listed_policy` and `lease_policy` choose the policy to
decide with (the operator's, published on its Lease). What to conclude from the reads lives in the
pure `coroner.cli.plan` and `coroner.cli.doctor`; how it is shown, in `coroner.cli.render`.

Exit codes: 0 ok; 1 a doctor check failed; 2 usage error, bad input, refusal or unreachable
cluster; 3 apply aborted on drift (nothing written) or a row moved under its write.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, NoReturn

import click
import kubernetes
import urllib3
from kubernetes import client as k8s
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from kubernetes.config import ConfigException

from coroner.cli import plan as planning
from coroner.client.rest import ApiError, json_lines, registrations_path
from coroner.core import api, kubewire
from coroner.core.decision import Policy
from coroner.core.world import World
from coroner.runtime.watch import STREAMING_LIST, IncompleteList, initial_events

EXIT_OK: Final = 0
EXIT_CHECK_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_DRIFT: Final = 3

#: (connect, read) seconds: an unreachable API server is reported, not waited on forever.
DEFAULT_TIMEOUT: Final = (10.0, 120.0)
#: A request the API server did not answer (refused, timed out, reset, TLS failure) is not sent
#: again: each of urllib3's default 3 retries would wait another --request-timeout, and the first
#: unanswered request ends the command. Answers are still followed as before: redirects, and 429/503
#: with Retry-After on reads (up to 3 in all).
_RETRIES: Final = urllib3.Retry(total=3, connect=0, read=0, other=0)
#: LIST page size, as kubectl chunks; the pages of one LIST share one snapshot.
_PAGE: Final = 500
#: How long the API server may take to send a streaming list of the registrations before it ends
#: the stream (and the plugin lists page by page instead).
_STREAM_SECONDS: Final = 900
DEBUG_ENV: Final = "KUBECTL_CORONER_DEBUG"
_DEFAULT_KUBECONFIG: Final = "~/.kube/config"
_POOL: Final = 32
_VIEW_FIX: Final = "ask for the coroner-viewer ClusterRole (get/list workerregistrations) and list on leases and nodes"


class PluginError(Exception):
    """One sentence for a person, naming the object and the fix; `PluginGroup` prints it and exits."""

    def __init__(
        self, message: str, *, exit_code: int = EXIT_USAGE, unreachable: bool = False, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        #: The API server could not be reached at all: no later request can succeed either.
        self.unreachable = unreachable
        #: The HTTP status the API server answered with, when it answered.
        self.status = status


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Connection:
    """Which cluster, as whom, and how patiently: kubectl's connection flags."""

    kubeconfig: str | None = None
    """--kubeconfig; None: KUBECONFIG (its files merged), then ~/.kube/config, then in-cluster."""
    context: str | None = None
    """--context; None: the kubeconfig's current-context."""
    as_user: str | None = None
    """--as: every request impersonates this user (Impersonate-User)."""
    as_groups: tuple[str, ...] = ()
    """--as-group: ... and these groups (one Impersonate-Group header each)."""
    request_timeout: float | None = None
    """--request-timeout in seconds; 0 waits forever; None: `DEFAULT_TIMEOUT`."""

    @property
    def timeout(self) -> float | tuple[float, float] | None:
        """The timeout of one request, as the kubernetes client takes it."""
        if self.request_timeout is None:
            return DEFAULT_TIMEOUT
        return self.request_timeout or None

    def describe_timeout(self) -> str:
        if self.request_timeout is None:
            return f"the default {DEFAULT_TIMEOUT[0]:g}s to connect and {DEFAULT_TIMEOUT[1]:g}s to answer"
        return f"--request-timeout {self.request_timeout:g}s"


class NotStreamed(Exception):
    """The API server serves no streaming list (or ended one early): list page by page."""


class Session:
    """One identity's connection to one cluster: every API request of the plugin goes through here."""

    def __init__(self, connection: Connection | None = None, /, *, kubeconfig: str | None = None) -> None:
        self.connection = connection if connection is not None else Connection(kubeconfig=kubeconfig)
        self.client = _api_client(self.connection)
        self.server = str(self.client.configuration.host)
        self.kubeconfig = self.connection.kubeconfig
        self.timeout = self.connection.timeout

    # --- plumbing ------------------------------------------------------------------------------

    def unreachable(self, exc: BaseException) -> PluginError:
        if _timed_out(exc) or _timed_out(getattr(exc, "reason", None)):
            return PluginError(
                f"the Kubernetes API server at {self.server} did not answer within "
                f"{self.connection.describe_timeout()}; check that the cluster is running, or allow more time "
                f"with --request-timeout.",
                unreachable=True,
            )
        cause = getattr(exc, "reason", None) or exc
        text = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        return PluginError(
            f"cannot reach the Kubernetes API server at {self.server} ({text[:200]}); check that the "
            f"cluster is running and that --kubeconfig (or KUBECONFIG) and --context point at it.",
            unreachable=True,
        )

    def api_error(self, exc: ApiException, *, what: str, fix: str = "", not_found: str = "") -> PluginError:
        if exc.status in (0, None):
            return self.unreachable(exc)
        message = server_message(exc)
        status = int(exc.status)
        if status == 401:
            return PluginError(
                f"the API server at {self.server} rejected the credentials of the kubeconfig while trying to "
                f"{what} (401 Unauthorized); refresh them or pass another --kubeconfig or --context.",
                status=status,
            )
        if status == 403:
            if self.connection.as_user and "impersonate" in message:
                return PluginError(
                    f"forbidden to impersonate {self._impersonated()} (--as): {message}; the identity of the "
                    f"kubeconfig needs the impersonate verb on users (and groups) for --as (and --as-group).",
                    status=status,
                )
            return PluginError(
                f"forbidden to {what}{self._as()}: {message}; {fix or 'ask a cluster admin for that permission'}.",
                status=status,
            )
        if status == 404 and not_found:
            return PluginError(not_found, status=status)
        if status == 410:
            return PluginError(
                f"cannot {what}: the objects changed faster than they could be listed (410 Gone); run the "
                f"command again.",
                status=status,
            )
        return PluginError(f"cannot {what}: {status} {exc.reason}: {message}.", status=status)

    def _impersonated(self) -> str:
        groups = f" in group(s) {', '.join(self.connection.as_groups)}" if self.connection.as_groups else ""
        return f"user {self.connection.as_user}{groups}"

    def _as(self) -> str:
        return f" as {self._impersonated()} (--as)" if self.connection.as_user else ""

    def request(
        self, call: Callable[..., Any], *args: Any, what: str, fix: str = "", not_found: str = "", **kwargs: Any
    ) -> Any:
        """One API call with its JSON body decoded; failures become a `PluginError` sentence."""
        try:
            response = call(*args, _preload_content=False, _request_timeout=self.timeout, **kwargs)
        except ApiException as exc:
            raise self.api_error(exc, what=what, fix=fix, not_found=not_found) from None
        except urllib3.exceptions.HTTPError as exc:
            raise self.unreachable(exc) from None
        try:
            return json.loads(response.data or b"{}")
        except ValueError:
            raise PluginError(
                f"cannot {what}: the API server at {self.server} answered with something not JSON."
            ) from None

    def pages(
        self, call: Callable[..., Any], *args: Any, what: str, fix: str = "", not_found: str = ""
    ) -> Iterator[list[dict[str, Any]]]:
        """The items of one LIST, a page at a time (one snapshot: the pages share a resourceVersion).

        The next page is asked for (and decoded) on a thread while the caller takes in this one: the
        API server serves it meanwhile instead of waiting for the caller, and at most two pages are
        in memory. A failed page raises here, in its turn."""

        def fetch(token: str | None) -> Any:
            extra = {"_continue": token} if token else {}
            return self.request(call, *args, what=what, fix=fix, not_found=not_found, limit=_PAGE, **extra)

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="list-page") as ahead:
            page = fetch(None)
            while True:
                token = (page.get("metadata") or {}).get("continue") or None
                following = ahead.submit(fetch, token) if token is not None else None
                yield page.get("items") or []
                if following is None:
                    return
                page = following.result()

    def list_all(
        self, call: Callable[..., Any], *args: Any, what: str, fix: str = "", not_found: str = ""
    ) -> list[dict[str, Any]]:
        """Every item of one LIST."""
        return [item for page in self.pages(call, *args, what=what, fix=fix, not_found=not_found) for item in page]

    def read(self, call: Callable[..., Any], *args: Any, what: str) -> Any:
        """For doctor: the body, None for 404, or `Unreadable` — only an unreachable cluster raises."""
        try:
            return self.request(call, *args, what=what)
        except PluginError as exc:
            if exc.unreachable:
                raise
            if exc.status == 404:
                return None
            return planning.Unreadable(reason=exc.message)

    def read_list(
        self, call: Callable[..., Any], *args: Any, what: str, not_served: list[dict[str, Any]] | None = None
    ) -> list[dict[str, Any]] | planning.Unreadable:
        """For doctor: the items, or `Unreadable`; `not_served` stands for a 404 (an API the server
        does not serve has no objects) where given — only an unreachable cluster raises."""
        try:
            return self.list_all(call, *args, what=what)
        except PluginError as exc:
            if exc.unreachable:
                raise
            if exc.status == 404 and not_served is not None:
                return not_served
            return planning.Unreadable(reason=exc.message)

    # --- reads ---------------------------------------------------------------------------------

    def cache_registrations(self, world: World, *, namespace: str | None) -> None:
        """Puts every WorkerRegistration of `namespace` (None: every namespace) into `world` as it
        arrives: a streaming list where the API server serves one (as the operator lists them: a
        third of a paged LIST's API server CPU), else a LIST page by page. Raw bodies go once the
        World holds their compact copy, so a large cluster's registrations are never all in memory
        twice."""
        where = "in every namespace" if namespace is None else f"in namespace {namespace}"
        what = f"list workerregistrations {where}"
        not_installed = (
            f"the WorkerRegistration API (CustomResourceDefinition {api.CRD_NAME}) is not installed on the "
            f"cluster at {self.server}; install it with `kubectl apply -k manifests/overlays/plan-only`."
        )
        put: list[tuple[str, str]] = []
        try:
            for page in self.streamed(registrations_path(namespace), what=what, fix=_VIEW_FIX, not_found=not_installed):
                put += (world.put_registration(body) for body in page)
            return
        except NotStreamed:
            for key in put:  # what a stream ended midway brought: the LIST below is the snapshot
                world.forget_registration(key)
        custom = k8s.CustomObjectsApi(self.client)
        call, args = (
            (custom.list_cluster_custom_object, (api.GROUP, api.VERSION, api.PLURAL))
            if namespace is None
            else (custom.list_namespaced_custom_object, (api.GROUP, api.VERSION, namespace, api.PLURAL))
        )
        for page in self.pages(call, *args, what=what, fix=_VIEW_FIX, not_found=not_installed):
            for body in page:
                world.put_registration(body)

    def streamed(self, path: str, *, what: str, fix: str = "", not_found: str = "") -> Iterator[list[dict[str, Any]]]:
        """The objects of one streaming list of `path` (`coroner.runtime.watch.initial_events`), a
        page at a time. Raises `NotStreamed` where the API server serves no streaming list (400 or
        422: an older server, or the WatchList feature off), where the identity may not watch (403:
        it may still list) or where the stream ends before its end."""
        query = {**STREAMING_LIST, "watch": True, "timeoutSeconds": _STREAM_SECONDS}
        try:
            request = self.client.param_serialize(
                method="GET",
                resource_path=path,
                query_params=[(k, "true" if v is True else v) for k, v in query.items()],
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
            response = self.client.call_api(*request, _request_timeout=self.timeout).response
        except urllib3.exceptions.HTTPError as exc:
            raise self.unreachable(exc) from None
        try:
            if response.status in (400, 403, 422):  # 403: list without watch may still be granted
                raise NotStreamed()
            if response.status >= 300:
                refused = ApiException(status=response.status, reason=response.reason, body=response.data.decode())
                raise self.api_error(refused, what=what, fix=fix, not_found=not_found)
            for page, _, _ in initial_events(json_lines(response.stream(64 * 1024)), page_limit=_PAGE):
                yield page
        except IncompleteList:
            raise NotStreamed() from None
        except ApiError as exc:  # an ERROR event in the stream
            raise self.api_error(
                ApiException(status=exc.status, reason=exc.reason, body=exc.body), what=what, fix=fix
            ) from None
        except (urllib3.exceptions.HTTPError, ValueError) as exc:
            raise self.unreachable(exc) from None
        finally:
            response.close()  # the watch goes on after the list: this connection is never reused
            response.release_conn()

    def list_leases(self, *, namespace: str | None) -> list[dict[str, Any]]:
        coordination = k8s.CoordinationV1Api(self.client)
        fix = "the plan needs list on leases.coordination.k8s.io (agent Leases and protecting Leases)"
        if namespace is None:
            return self.list_all(
                coordination.list_lease_for_all_namespaces, what="list leases in every namespace", fix=fix
            )
        return self.list_all(
            coordination.list_namespaced_lease, namespace, what=f"list leases in namespace {namespace}", fix=fix
        )

    def list_nodes(self) -> list[dict[str, Any]]:
        return self.list_all(
            k8s.CoreV1Api(self.client).list_node,
            what="list nodes",
            fix="the plan needs list on nodes (boot ids and node existence) to decide as the operator does",
        )

    def can_retire(self, *, namespace: str, name: str | None = None) -> bool | None:
        """SelfSubjectAccessReview for ``retire``; None when it cannot be asked (unknown ≠ granted)."""
        body = kubewire.self_access_review(namespace=namespace, name=name)
        return self._review(k8s.AuthorizationV1Api(self.client).create_self_subject_access_review, body)

    def operator_may_retire(self, *, user: str, system_namespace: str, namespace: str | None) -> bool | None:
        """SubjectAccessReview for the operator's ServiceAccount `user` (doctor's `operator_identity`), one of
        `system_namespace`; None when not allowed to ask."""
        groups = ["system:serviceaccounts", f"system:serviceaccounts:{system_namespace}", "system:authenticated"]
        body = kubewire.access_review(user=user, groups=groups, namespace=namespace or "")
        return self._review(k8s.AuthorizationV1Api(self.client).create_subject_access_review, body)

    def _review(self, call: Callable[..., Any], body: dict[str, Any]) -> bool | None:
        try:
            result = self.request(call, body, what="review access")
        except PluginError as exc:
            if exc.unreachable:
                raise
            return None
        return bool((result.get("status") or {}).get("allowed"))

    def whoami(self) -> str:
        result = self.request(
            k8s.AuthenticationV1Api(self.client).create_self_subject_review,
            dict(kubewire.SELF_SUBJECT_REVIEW),
            what="learn who you are (SelfSubjectReview)",
            fix="apply records the retiring user in status.retirement.retiredBy and writes nothing without it",
        )
        username = kubewire.reviewed_username(result)
        if not username:
            raise PluginError(
                f"the API server at {self.server} did not say who you are (SelfSubjectReview has no username); "
                f"apply records the retiring user and writes nothing without it."
            )
        return str(username)

    # --- writes --------------------------------------------------------------------------------

    def post_event(self, *, body: dict[str, Any], reason: str, message: str, reporter: str) -> None:
        meta = body.get("metadata") or {}
        event = kubewire.event_body(
            involved=body,
            reason=reason,
            message=message,
            component=planning.COMPONENT,
            instance=reporter,
            now=utcnow(),
            suffix=uuid.uuid4().hex[:12],
        )
        self.request(
            k8s.CoreV1Api(self.client).create_namespaced_event,
            meta.get("namespace"),
            event,
            what=f"post the {reason} Event on WorkerRegistration {meta.get('namespace')}/{meta.get('name')}",
        )


def server_message(exc: ApiException) -> str:
    try:
        message = json.loads(exc.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or exc.reason or exc.body or "no message").strip().rstrip(".")


# --- gathering facts, exactly as the operator does --------------------------------------------


def gather(
    session: Session,
    *,
    namespace: str | None,
    system_namespace: str,
    permission: Callable[[str], bool | None],
    intern: Callable[[str], str] | None = None,
    keep_bodies: bool = True,
) -> planning.Listing:
    """One LIST each of registrations, Leases and Nodes, and the retire permission per namespace.

    The registrations go into the listing's World as their pages arrive (`intern`, `keep_bodies`:
    see `World`; only a command that writes needs the bodies). For one namespace the Leases are
    two namespaced LISTs (that namespace's protecting Leases and the system namespace's agent
    Leases): the same facts as a cluster-wide LIST, with less RBAC.
    """
    listed = World(system_namespace=system_namespace, intern=intern, keep_bodies=keep_bodies)
    session.cache_registrations(listed, namespace=namespace)
    if namespace is None:
        leases = session.list_leases(namespace=None)
    else:
        leases = session.list_leases(namespace=system_namespace)
        if namespace != system_namespace:
            leases += session.list_leases(namespace=namespace)
    nodes = session.list_nodes()
    namespaces = [namespace] if namespace is not None else listed.namespaces()
    return planning.Listing(
        registrations=listed,
        leases=leases,
        nodes=nodes,
        retire_permission={ns: permission(ns) for ns in namespaces},
        system_namespace=system_namespace,
    )


def confirm_gone_nodes(
    session: Session, listing: planning.Listing, *, policy: Policy, now: datetime.datetime
) -> planning.Listing:
    """Where policy accepts node-deletion evidence: a live GET of each Node that registrations name
    and the LIST lacks, as the operator does; NotFound counts as gone from `now` (the quarantine
    counts from there, so `--node-quarantine-seconds 0` is a human's statement that it is gone for
    good). Anything but NotFound leaves the Node unknown."""
    if not policy.node_deletion_evidence:
        return listing
    listed = {str((node.get("metadata") or {}).get("name") or "") for node in listing.nodes}
    gone: dict[str, datetime.datetime] = {}
    for name in sorted(set(listing.registrations.by_node) - listed):
        found = session.read(k8s.CoreV1Api(session.client).read_node, name, what=f"get Node {name}")
        if found is None:
            gone[name] = now
    return dataclasses.replace(listing, nodes_gone=gone)


def _timed_out(exc: object) -> bool:
    """A timeout, not a refusal: urllib3's NewConnectionError (ECONNREFUSED, ...) subclasses its
    ConnectTimeoutError."""
    return isinstance(exc, urllib3.exceptions.TimeoutError) and not isinstance(
        exc, urllib3.exceptions.NewConnectionError
    )


def context_namespace(connection: Connection) -> str:
    """The namespace of the kubeconfig context in use (--context, else current-context), as kubectl
    picks it; else ``default``."""
    try:
        contexts, active = kubernetes.config.list_kube_config_contexts(config_file=connection.kubeconfig)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError, ValueError, TypeError, KeyError):
        return "default"
    if connection.context is not None:
        active = next((c for c in contexts or [] if c.get("name") == connection.context), None)
    return str(((active or {}).get("context") or {}).get("namespace") or "default")


def _api_client(connection: Connection) -> ApiClient:
    """An ApiClient for `connection`, found as kubectl finds it: --kubeconfig, else KUBECONFIG (its
    files merged), else ~/.kube/config, else the pod's ServiceAccount; with its impersonation."""
    configuration = k8s.Configuration()
    in_cluster = (
        connection.kubeconfig is None
        and connection.context is None
        and "KUBECONFIG" not in os.environ
        and not os.path.exists(os.path.expanduser(_DEFAULT_KUBECONFIG))
        and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    )
    where = connection.kubeconfig or os.environ.get("KUBECONFIG") or _DEFAULT_KUBECONFIG
    try:
        if in_cluster:
            kubernetes.config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=connection.kubeconfig,
                context=connection.context,
                client_configuration=configuration,
                persist_config=False,
            )
    except (ConfigException, OSError, ValueError, TypeError, KeyError) as exc:
        text = str(exc).strip() or type(exc).__name__
        if connection.context is not None and connection.context not in _context_names(connection):
            raise PluginError(
                f"the kubeconfig {where} has no context {connection.context!r} (it has "
                f"{', '.join(_context_names(connection)) or 'none'}); pass one of those to --context."
            ) from None
        raise PluginError(
            f"cannot load the kubeconfig {where} ({text}); pass --kubeconfig with a valid file or set KUBECONFIG."
        ) from None
    # apply retires up to 32 rows at a time: one pooled connection each, no "pool is full" warnings.
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize or 0, _POOL)
    configuration.retries = _RETRIES
    client = ApiClient(configuration)
    if connection.as_user:
        client.set_default_header("Impersonate-User", connection.as_user)  # type: ignore[no-untyped-call]
    if connection.as_groups:
        pool = client.rest_client.pool_manager
        client.rest_client.pool_manager = _ImpersonatingPool(pool, groups=connection.as_groups)  # type: ignore[assignment]
    return client


def _context_names(connection: Connection) -> list[str]:
    try:
        contexts, _ = kubernetes.config.list_kube_config_contexts(config_file=connection.kubeconfig)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError, ValueError, TypeError, KeyError):
        return []
    return sorted(str(c.get("name")) for c in contexts or [])


class _ImpersonatingPool:
    """The client's urllib3 pool, adding one ``Impersonate-Group`` header per group to every request
    (the kubernetes client's default headers are a dict: one value per name)."""

    def __init__(self, pool: Any, *, groups: Sequence[str]) -> None:
        self._pool = pool
        self._groups = tuple(groups)

    def request(self, method: str, url: str, *args: Any, headers: Any = None, **kwargs: Any) -> Any:
        merged = urllib3.HTTPHeaderDict(headers or {})
        merged.discard("Impersonate-Group")
        for group in self._groups:
            merged.add("Impersonate-Group", group)
        return self._pool.request(method, url, *args, headers=merged, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


def scope_of(*, namespace: str | None, all_namespaces: bool, connection: Connection) -> str | None:
    """The planned namespace (-n, else the context's), or None for every namespace (-A)."""
    if namespace and all_namespaces:
        raise PluginError("use either -n/--namespace or -A/--all-namespaces, not both.")
    if all_namespaces:
        return None
    return namespace or context_namespace(connection)


def lease_policy(
    lease: Any, *, system_namespace: str, node_deletion_evidence: bool | None, node_quarantine_seconds: float | None
) -> planning.PolicyChoice:
    """The operator's published policy with the flags given on top; every fallback or difference is
    a warning on stderr (stdout stays a clean document)."""
    try:
        choice = planning.choose_policy(
            published=planning.published_policy(lease, system_namespace=system_namespace),
            flags={
                "node_deletion_evidence": node_deletion_evidence,
                "node_deletion_quarantine_seconds": node_quarantine_seconds,
            },
            system_namespace=system_namespace,
        )
    except ValueError as exc:
        raise PluginError(f"{exc}; pass a finite number of seconds >= 0.") from None
    for warning in choice.warnings:
        click.echo(f"warning: {warning}", err=True)
    return choice


def listed_policy(
    listing: planning.Listing, *, node_deletion_evidence: bool | None, node_quarantine_seconds: float | None
) -> planning.PolicyChoice:
    """`lease_policy` from the operator's Lease as plan and apply LISTed it with the system namespace's Leases."""
    lease = planning.operator_lease_of(listing.leases, system_namespace=listing.system_namespace)
    return lease_policy(
        lease,
        system_namespace=listing.system_namespace,
        node_deletion_evidence=node_deletion_evidence,
        node_quarantine_seconds=node_quarantine_seconds,
    )


def fail(ctx: click.Context, message: str, *, code: int) -> NoReturn:
    """One ``error:`` line on stderr and exit `code` (after a document was printed on stdout)."""
    click.echo(f"error: {message}", err=True)
    ctx.exit(code)
