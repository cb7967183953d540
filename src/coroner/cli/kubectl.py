"""``kubectl coroner plan | apply | doctor``: the human's view of, and hand on, the registry.

Plan-only clusters (the recommended first install) retire nothing by themselves: a person reviews
``plan``, approves it by its two fingerprints, and ``apply`` retires exactly the approved rows under
that person's own ``retire`` verb — with the operator's facts, the operator's decision and the
operator's compare-and-swap patch, so the human path can be no less safe than the automatic one.
``doctor`` says whether the automatic path works at all.

This module is the I/O shell only: it reads the API, writes the retirements and Events, and turns
every failure into one sentence and an exit code. What to conclude from the reads lives in the
pure `coroner.cli.plan`.

Exit codes: 0 ok; 1 a doctor check failed; 2 usage error, bad input, refusal or unreachable
cluster; 3 apply aborted on drift (nothing written) or a row moved under its write.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Final, NoReturn

import click
import kubernetes
import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.config import ConfigException
from rich.console import Console

from coroner.cli import doctor as diagnosis
from coroner.cli import plan as planning
from coroner.client.kube import api_client, patch_registration_status
from coroner.core import api, model
from coroner.core import wire as retirement
from coroner.core.decision import Policy, decide
from coroner.core.fingerprint import Plan, PlanEntry
from coroner.core.reasons import EventReason
from coroner.core.world import Key, World, lease_facts

EXIT_OK: Final = 0
EXIT_CHECK_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_DRIFT: Final = 3

#: (connect, read) seconds: an unreachable API server is reported, not waited on forever.
_TIMEOUT: Final = (10, 120)
#: LIST page size, as kubectl chunks; the pages of one LIST share one snapshot.
_PAGE: Final = 500
_DEBUG_ENV: Final = "KUBECTL_CORONER_DEBUG"
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


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class Session:
    """One identity's connection to one cluster: every API request of the plugin goes through here."""

    def __init__(self, *, kubeconfig: str | None) -> None:
        try:
            self.client = api_client(kubeconfig)
        except (ConfigException, OSError, ValueError, TypeError) as exc:
            where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
            raise PluginError(
                f"cannot load the kubeconfig {where} ({str(exc).strip() or type(exc).__name__}); pass "
                f"--kubeconfig with a valid file or set KUBECONFIG."
            ) from None
        self.server = str(self.client.configuration.host)
        self.kubeconfig = kubeconfig

    # --- plumbing ------------------------------------------------------------------------------

    def unreachable(self, exc: BaseException) -> PluginError:
        cause = getattr(exc, "reason", None) or exc
        text = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        return PluginError(
            f"cannot reach the Kubernetes API server at {self.server} ({text[:200]}); check that the "
            f"cluster is running and that --kubeconfig (or KUBECONFIG) points at it.",
            unreachable=True,
        )

    def api_error(self, exc: ApiException, *, what: str, fix: str = "", not_found: str = "") -> PluginError:
        if exc.status in (0, None):
            return self.unreachable(exc)
        message = _server_message(exc)
        status = int(exc.status)
        if status == 401:
            return PluginError(
                f"the API server at {self.server} rejected the credentials of the kubeconfig while trying to "
                f"{what} (401 Unauthorized); refresh them or pass another --kubeconfig.",
                status=status,
            )
        if status == 403:
            return PluginError(
                f"forbidden to {what}: {message}; {fix or 'ask a cluster admin for that permission'}.", status=status
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

    def request(
        self, call: Callable[..., Any], *args: Any, what: str, fix: str = "", not_found: str = "", **kwargs: Any
    ) -> Any:
        """One API call with its JSON body decoded; failures become a `PluginError` sentence."""
        try:
            response = call(*args, _preload_content=False, _request_timeout=_TIMEOUT, **kwargs)
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

    def list_all(
        self, call: Callable[..., Any], *args: Any, what: str, fix: str = "", not_found: str = ""
    ) -> list[dict[str, Any]]:
        """Every item of one LIST, page by page (one snapshot: the pages share a resourceVersion)."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            extra = {"_continue": token} if token else {}
            page = self.request(call, *args, what=what, fix=fix, not_found=not_found, limit=_PAGE, **extra)
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue") or None
            if token is None:
                return items

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

    def read_list(self, call: Callable[..., Any], *args: Any, what: str) -> list[dict[str, Any]] | planning.Unreadable:
        try:
            return self.list_all(call, *args, what=what)
        except PluginError as exc:
            if exc.unreachable:
                raise
            return planning.Unreadable(reason=exc.message)

    # --- reads ---------------------------------------------------------------------------------

    def list_registrations(self, *, namespace: str | None) -> list[dict[str, Any]]:
        custom = k8s.CustomObjectsApi(self.client)
        where = "in every namespace" if namespace is None else f"in namespace {namespace}"
        not_installed = (
            f"the WorkerRegistration API (CustomResourceDefinition {api.CRD_NAME}) is not installed on the "
            f"cluster at {self.server}; install it with `kubectl apply -k manifests/overlays/plan-only`."
        )
        if namespace is None:
            return self.list_all(
                custom.list_cluster_custom_object,
                api.GROUP,
                api.VERSION,
                api.PLURAL,
                what=f"list workerregistrations {where}",
                fix=_VIEW_FIX,
                not_found=not_installed,
            )
        return self.list_all(
            custom.list_namespaced_custom_object,
            api.GROUP,
            api.VERSION,
            namespace,
            api.PLURAL,
            what=f"list workerregistrations {where}",
            fix=_VIEW_FIX,
            not_found=not_installed,
        )

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
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": _retire_attributes(namespace=namespace, name=name)},
        }
        return self._review(k8s.AuthorizationV1Api(self.client).create_self_subject_access_review, body)

    def operator_may_retire(self, *, system_namespace: str, namespace: str | None) -> bool | None:
        """SubjectAccessReview for the operator's ServiceAccount (doctor); None when not allowed to ask."""
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": diagnosis.operator_username(system_namespace),
                "groups": [
                    "system:serviceaccounts",
                    f"system:serviceaccounts:{system_namespace}",
                    "system:authenticated",
                ],
                "resourceAttributes": _retire_attributes(namespace=namespace or "", name=None),
            },
        }
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
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
            what="learn who you are (SelfSubjectReview)",
            fix="apply records the retiring user in status.retirement.retiredBy and writes nothing without it",
        )
        username = ((result.get("status") or {}).get("userInfo") or {}).get("username")
        if not username:
            raise PluginError(
                f"the API server at {self.server} did not say who you are (SelfSubjectReview has no username); "
                f"apply records the retiring user and writes nothing without it."
            )
        return str(username)

    # --- writes --------------------------------------------------------------------------------

    def post_event(self, *, body: dict[str, Any], reason: str, message: str, reporter: str) -> None:
        meta = body.get("metadata") or {}
        event = retirement.event_body(
            involved=body,
            reason=reason,
            message=message,
            component=planning.COMPONENT,
            instance=reporter,
            now=_utcnow(),
            suffix=uuid.uuid4().hex[:12],
        )
        self.request(
            k8s.CoreV1Api(self.client).create_namespaced_event,
            meta.get("namespace"),
            event,
            what=f"post the {reason} Event on WorkerRegistration {meta.get('namespace')}/{meta.get('name')}",
        )


def _retire_attributes(*, namespace: str, name: str | None) -> dict[str, str]:
    attributes = {"group": api.GROUP, "resource": api.PLURAL, "verb": api.RETIRE_VERB, "namespace": namespace}
    if name:
        attributes["name"] = name
    return attributes


def _server_message(exc: ApiException) -> str:
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
) -> planning.Listing:
    """One LIST each of registrations, Leases and Nodes, and the retire permission per namespace.

    For one namespace the Leases are two namespaced LISTs (that namespace's protecting Leases and
    the system namespace's agent Leases): the same facts as a cluster-wide LIST, with less RBAC.
    """
    registrations = session.list_registrations(namespace=namespace)
    if namespace is None:
        leases = session.list_leases(namespace=None)
    else:
        leases = session.list_leases(namespace=system_namespace)
        if namespace != system_namespace:
            leases += session.list_leases(namespace=namespace)
    nodes = session.list_nodes()
    namespaces = (
        [namespace]
        if namespace is not None
        else sorted({str((body.get("metadata") or {}).get("namespace") or "") for body in registrations})
    )
    return planning.Listing(
        registrations=registrations,
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
    named = {str((body.get("spec") or {}).get("nodeName") or "") for body in listing.registrations}
    gone: dict[str, datetime.datetime] = {}
    for name in sorted(named - listed - {""}):
        found = session.read(k8s.CoreV1Api(session.client).read_node, name, what=f"get Node {name}")
        if found is None:
            gone[name] = now
    return dataclasses.replace(listing, nodes_gone=gone)


def context_namespace(kubeconfig: str | None) -> str:
    """The namespace of the kubeconfig's current context, as kubectl picks it; else ``default``."""
    try:
        _, active = kubernetes.config.list_kube_config_contexts(config_file=kubeconfig)
    except (ConfigException, OSError, ValueError, TypeError, KeyError):
        return "default"
    return str(((active or {}).get("context") or {}).get("namespace") or "default")


def _scope(*, namespace: str | None, all_namespaces: bool, kubeconfig: str | None) -> str | None:
    if namespace and all_namespaces:
        raise PluginError("use either -n/--namespace or -A/--all-namespaces, not both.")
    if all_namespaces:
        return None
    return namespace or context_namespace(kubeconfig)


def _console() -> Console:
    # A pipe gets 160 columns instead of rich's 80, so that logs keep one row per line.
    wide = sys.stdout.isatty() or "COLUMNS" in os.environ
    return Console(highlight=False, width=None if wide else 160)


def _policy(
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


def _listed_policy(
    listing: planning.Listing, *, node_deletion_evidence: bool | None, node_quarantine_seconds: float | None
) -> planning.PolicyChoice:
    """`_policy` from the operator's Lease as plan and apply LISTed it with the system namespace's Leases."""
    lease = planning.operator_lease_of(listing.leases, system_namespace=listing.system_namespace)
    return _policy(
        lease,
        system_namespace=listing.system_namespace,
        node_deletion_evidence=node_deletion_evidence,
        node_quarantine_seconds=node_quarantine_seconds,
    )


# --- the commands -----------------------------------------------------------------------------


class PluginGroup(click.Group):
    """Turns any failure into one ``error:`` sentence and its exit code; a traceback only on request."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except KeyboardInterrupt:
            raise click.Abort() from None
        except PluginError as exc:
            click.echo(f"error: {exc.message}", err=True)
            raise click.exceptions.Exit(exc.exit_code) from None
        except Exception as exc:
            if os.environ.get(_DEBUG_ENV):
                raise
            click.echo(
                f"error: unexpected {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}; run again with {_DEBUG_ENV}=1 for the "
                f"traceback and report it.",
                err=True,
            )
            raise click.exceptions.Exit(EXIT_USAGE) from None


def _finite(_: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number of seconds.", param=param)
    return value


def _common(command: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None, help="Path to the kubeconfig."),
        click.option(
            "--system-namespace",
            default=api.SYSTEM_NAMESPACE,
            show_default=True,
            help="Where the agent Leases and the operator's Lease live.",
        ),
        click.option(
            "--node-deletion-evidence/--no-node-deletion-evidence",
            default=None,
            help="Override the operator's published policy (a confirmed-gone Node counts as death). Default: "
            "what the operator publishes on its Lease; a value that differs is warned about.",
        ),
        click.option(
            "--node-quarantine-seconds",
            type=click.FloatRange(min=0),
            default=None,
            callback=_finite,
            help="Override the operator's published node-deletion quarantine. Default: what the operator publishes.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _scoped(command: Callable[..., Any]) -> Callable[..., Any]:
    command = click.option("--all-namespaces", "-A", is_flag=True, help="Every namespace.")(command)
    return click.option("--namespace", "-n", default=None, help="The namespace (default: the kubeconfig context's).")(
        command
    )


@click.group(cls=PluginGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """See what Coroner would retire, retire it under your own retire verb, diagnose the install.

    \b
    Exit codes: 0 ok; 1 a doctor check failed; 2 usage error, bad input, refusal or unreachable
    cluster; 3 apply aborted on drift, or a row moved under its write.
    """


@main.command("plan")
@_scoped
@click.option("--output", "-o", type=click.Choice(["table", "json", "yaml"]), default="table", show_default=True)
@_common
def plan_command(
    namespace: str | None,
    all_namespaces: bool,
    output: str,
    kubeconfig: str | None,
    system_namespace: str,
    node_deletion_evidence: bool | None,
    node_quarantine_seconds: float | None,
) -> None:
    """Every registration with its reason, counts by reason, and the fingerprints apply needs. Read-only."""
    scope = _scope(namespace=namespace, all_namespaces=all_namespaces, kubeconfig=kubeconfig)
    session = Session(kubeconfig=kubeconfig)
    listing = gather(
        session,
        namespace=scope,
        system_namespace=system_namespace,
        permission=lambda ns: session.can_retire(namespace=ns),
    )
    now = _utcnow()
    choice = _listed_policy(
        listing, node_deletion_evidence=node_deletion_evidence, node_quarantine_seconds=node_quarantine_seconds
    )
    listing = confirm_gone_nodes(session, listing, policy=choice.policy, now=now)
    plan = planning.decide_all(world=planning.build_world(listing), policy=choice.policy, now=now)
    if output == "table":
        planning.render_plan(
            plan, console=_console(), namespace=scope, retire_permission=listing.retire_permission, policy=choice
        )
    else:
        document = planning.plan_document(
            plan, namespace=scope, now=now, retire_permission=listing.retire_permission, policy=choice
        )
        click.echo(planning.dump(document, output=output), nl=False)


@main.command("apply")
@_scoped
@click.option("--registry-fingerprint", required=True, help="registryFingerprint from the plan you approved.")
@click.option("--candidate-fingerprint", required=True, help="candidateFingerprint from the plan you approved.")
@click.option("--yes", is_flag=True, help="Retire. Without it apply only previews and writes nothing.")
@click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True)
@_common
@click.argument("names", nargs=-1, required=True)
@click.pass_context
def apply_command(
    ctx: click.Context,
    namespace: str | None,
    all_namespaces: bool,
    registry_fingerprint: str,
    candidate_fingerprint: str,
    yes: bool,
    output: str,
    kubeconfig: str | None,
    system_namespace: str,
    node_deletion_evidence: bool | None,
    node_quarantine_seconds: float | None,
    names: tuple[str, ...],
) -> None:
    """Retire NAMES (or NAMESPACE/NAME with -A) of an approved plan, under your own retire verb.

    Re-reads and recomputes the plan; aborts with exit code 3 (RegistryMoved, CandidateSetMoved)
    if it is not the approved one. Replaying a successful apply reports its rows AlreadyRetired
    and exits 0.
    """
    for flag, value in (
        ("--registry-fingerprint", registry_fingerprint),
        ("--candidate-fingerprint", candidate_fingerprint),
    ):
        if not planning.valid_fingerprint(value):
            raise PluginError(
                f"{flag} {value!r} is not a Coroner fingerprint (v1:sha256:<64 hex digits>); copy it from the "
                f"output of `kubectl coroner plan`."
            )
    scope = _scope(namespace=namespace, all_namespaces=all_namespaces, kubeconfig=kubeconfig)
    keys = _keys(names, scope=scope)
    session = Session(kubeconfig=kubeconfig)
    listing = gather(
        session,
        namespace=scope,
        system_namespace=system_namespace,
        permission=lambda ns: session.can_retire(namespace=ns),
    )
    choice = _listed_policy(
        listing, node_deletion_evidence=node_deletion_evidence, node_quarantine_seconds=node_quarantine_seconds
    )
    policy = choice.policy
    now = _utcnow()
    listing = confirm_gone_nodes(session, listing, policy=policy, now=now)
    world = planning.build_world(listing)
    plan = planning.decide_all(world=world, policy=policy, now=now)
    assessment = planning.assess_apply(
        plan=plan,
        names=keys,
        registry_fingerprint=registry_fingerprint,
        candidate_fingerprint=candidate_fingerprint,
    )
    if assessment.abort is not None or assessment.refusals:
        if output == "json":
            document = planning.apply_document(
                assessment=assessment, results=(), preview=not yes, retired_by=None, policy=choice
            )
            click.echo(planning.dump(document, output="json"), nl=False)
        if assessment.abort is not None:
            _exit(ctx, f"apply aborted: {assessment.abort_detail}", code=EXIT_DRIFT)
        *others, last = assessment.refusals
        for sentence in others:
            click.echo(f"error: {sentence}", err=True)
        _exit(ctx, f"{last} Nothing was changed.", code=EXIT_USAGE)

    results = [
        planning.RowResult(
            key=planning.key_of(entry.registration),
            outcome=planning.RowOutcome.ALREADY_RETIRED,
            detail=_already_retired_detail(entry),
            node_name=entry.registration.node_name,
            pid=entry.registration.incarnation.pid,
            evidence=entry.registration.retirement.reason if entry.registration.retirement else None,
        )
        for entry in assessment.already_retired
    ]
    retired_by: str | None = None
    if not yes:
        results += [
            planning.RowResult(
                key=planning.key_of(entry.registration),
                outcome=planning.RowOutcome.WOULD_RETIRE,
                detail=entry.decision.detail,
                node_name=entry.registration.node_name,
                pid=entry.registration.incarnation.pid,
                evidence=entry.row.death_evidence,
            )
            for entry in assessment.to_retire
        ]
    else:
        retired_by = session.whoami() if assessment.to_retire else None
        for entry in assessment.to_retire:
            assert retired_by is not None
            results.append(_retire(session, world=world, entry=entry, policy=policy, retired_by=retired_by))
    results.sort(key=lambda result: result.key)
    if output == "json":
        document = planning.apply_document(
            assessment=assessment, results=results, preview=not yes, retired_by=retired_by, policy=choice
        )
        click.echo(planning.dump(document, output="json"), nl=False)
    else:
        planning.render_apply(
            results=results, console=_console(), preview=not yes, retired_by=retired_by, policy=choice
        )
    code = planning.apply_exit_code(results)
    if code != EXIT_OK:
        failed = [f"{planning.display(r.key)} {r.outcome}" for r in results if not r.outcome.done]
        _exit(ctx, f"apply did not complete: {', '.join(failed)}; run `kubectl coroner plan` to see why.", code=code)


def _already_retired_detail(entry: PlanEntry) -> str:
    record = entry.registration.retirement
    assert record is not None
    when = model.format_time(record.retired_time) if record.retired_time else "an unrecorded time"
    return f"already retired by {record.retired_by or '?'} at {when} ({record.reason}); nothing written."


def _keys(names: Sequence[str], *, scope: str | None) -> list[Key]:
    keys: list[Key] = []
    for name in names:
        namespace, sep, rest = name.partition("/")
        if sep:
            if not namespace or not rest or "/" in rest:
                raise PluginError(f"{name!r} is neither NAME nor NAMESPACE/NAME.")
            if scope is not None and namespace != scope:
                raise PluginError(
                    f"{name!r} is outside the planned namespace {scope}; plan and apply with -n {namespace}, or -A."
                )
            keys.append((namespace, rest))
        elif scope is None:
            raise PluginError(f"with -A, name registrations as NAMESPACE/NAME ({name!r} has no namespace).")
        else:
            keys.append((scope, name))
    return keys


def _retire(session: Session, *, world: World, entry: PlanEntry, policy: Policy, retired_by: str) -> planning.RowResult:
    """One compare-and-swap retirement under the caller's identity, as the operator's steps 2-4."""
    registration = entry.registration
    key = planning.key_of(registration)
    namespace, name = key
    subject = f"WorkerRegistration {namespace}/{name}"

    def result(outcome: planning.RowOutcome, detail: str, evidence: str | None = None) -> planning.RowResult:
        return planning.RowResult(
            key=key,
            outcome=outcome,
            detail=detail,
            node_name=registration.node_name,
            pid=registration.incarnation.pid,
            evidence=evidence,
        )

    try:
        # Step 2a: the capability, again, right before the write: a revocation since the plan wins.
        if session.can_retire(namespace=namespace, name=name) is not True:
            return result(
                planning.RowOutcome.RETIRE_PERMISSION_MISSING,
                f"{retired_by} does not hold the {api.RETIRE_VERB} verb on {subject} now; nothing written.",
            )
        # Step 2b: the Lease fence: decide once more with the Leases as they are right now.
        live = {facts.name: facts for facts in map(lease_facts, session.list_leases(namespace=namespace))}
        now = _utcnow()
        fenced = decide(
            registration=registration,
            facts=world.facts_for(
                key, now=now, leases_override=live, permission_override=True, use_permission_override=True
            ),
            policy=policy,
            now=now,
        )
        if not fenced.retirable:
            return result(
                planning.RowOutcome.RETIRE_ABANDONED,
                f"decided again right before the write: {fenced.reason}: {fenced.detail} Nothing written.",
            )
        ops = planning.retirement_patch(
            body=world.bodies[key], registration=registration, decision=fenced, retired_by=retired_by, now=_utcnow()
        )
    except PluginError as exc:
        return result(planning.RowOutcome.RETIRE_FAILED, f"{exc.message} Nothing written.")
    evidence = fenced.death_evidence.value if fenced.death_evidence else None
    # Step 3: compare-and-swap.
    try:
        patched = patch_registration_status(session.client, namespace=namespace, name=name, body=ops)
    except ApiException as exc:
        message = _server_message(exc)
        if exc.status in (404, 409, 422):
            return result(
                planning.RowOutcome.RETIRE_CONFLICT,
                f"{subject} changed after it was read at resourceVersion {registration.resource_version} "
                f"({exc.status}: {message}): it moved, nothing written; plan again.",
            )
        if exc.status == 403:
            return result(
                planning.RowOutcome.RETIRE_PERMISSION_MISSING, f"the API server refused the retirement: {message}."
            )
        if exc.status in (0, None):
            return result(
                planning.RowOutcome.RETIRE_FAILED,
                f"{session.unreachable(exc).message} Plan again to see whether it landed.",
            )
        return result(planning.RowOutcome.RETIRE_FAILED, f"{exc.status} {exc.reason}: {message}; nothing written.")
    except urllib3.exceptions.HTTPError as exc:
        return result(
            planning.RowOutcome.RETIRE_FAILED,
            f"{session.unreachable(exc).message} Plan again to see whether it landed.",
        )
    # Step 4: the Event. The retirement stands whether or not its Event can be posted.
    try:
        session.post_event(
            body=patched,
            reason=EventReason.RETIRED.value,
            message=f"{evidence}: retired by {retired_by} with kubectl coroner apply: {fenced.detail}",
            reporter=retired_by,
        )
    except PluginError as exc:
        click.echo(f"warning: {subject} was retired but its Event was not posted: {exc.message}", err=True)
    return result(planning.RowOutcome.RETIRED, f"{evidence}: {fenced.detail}", evidence)


@main.command("doctor")
@click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option(
    "--expect-plan-only",
    is_flag=True,
    help="The cluster is deliberately plan-only: the operator should NOT hold retire.",
)
@click.option(
    "--attestation-grace-seconds",
    type=float,
    default=60.0,
    show_default=True,
    help="A registration unattested for longer than this counts as stuck.",
)
@_common
@click.pass_context
def doctor_command(
    ctx: click.Context,
    output: str,
    expect_plan_only: bool,
    attestation_grace_seconds: float,
    kubeconfig: str | None,
    system_namespace: str,
    node_deletion_evidence: bool | None,
    node_quarantine_seconds: float | None,
) -> None:
    """PASS / FAIL / UNKNOWN for each part Coroner needs; exit code 1 if any check FAILs."""
    session = Session(kubeconfig=kubeconfig)
    extensions = k8s.ApiextensionsV1Api(session.client)
    admission = k8s.AdmissionregistrationV1Api(session.client)
    coordination = k8s.CoordinationV1Api(session.client)

    crd = session.read(
        extensions.read_custom_resource_definition, api.CRD_NAME, what=f"get CustomResourceDefinition {api.CRD_NAME}"
    )
    policies = session.read_list(admission.list_validating_admission_policy, what="list ValidatingAdmissionPolicies")
    bindings = session.read_list(
        admission.list_validating_admission_policy_binding, what="list ValidatingAdmissionPolicyBindings"
    )
    operator_lease = session.read(
        coordination.read_namespaced_lease,
        planning.OPERATOR_LEASE,
        system_namespace,
        what=f"get Lease {system_namespace}/{planning.OPERATOR_LEASE}",
    )
    choice = _policy(
        operator_lease,
        system_namespace=system_namespace,
        node_deletion_evidence=node_deletion_evidence,
        node_quarantine_seconds=node_quarantine_seconds,
    )
    nodes = session.read_list(k8s.CoreV1Api(session.client).list_node, what="list nodes")
    leases = session.read_list(coordination.list_lease_for_all_namespaces, what="list leases in every namespace")

    cluster_wide = session.operator_may_retire(system_namespace=system_namespace, namespace=None)
    plan: Plan | planning.Unreadable
    world: World | planning.Unreadable
    per_namespace: dict[str, bool | None] = {}
    try:
        registrations = session.list_registrations(namespace=None)
    except PluginError as exc:
        if exc.unreachable:
            raise
        plan = world = planning.Unreadable(reason=exc.message)
    else:
        namespaces = sorted({str((b.get("metadata") or {}).get("namespace") or "") for b in registrations})
        for ns in namespaces:
            per_namespace[ns] = (
                True if cluster_wide else session.operator_may_retire(system_namespace=system_namespace, namespace=ns)
            )
        if isinstance(leases, planning.Unreadable) or isinstance(nodes, planning.Unreadable):
            missing = leases if isinstance(leases, planning.Unreadable) else nodes
            assert isinstance(missing, planning.Unreadable)
            plan = world = planning.Unreadable(reason=f"the facts to decide them could not be read: {missing.reason}")
        else:
            # Decided with the operator's permission, so the counts are the operator's view.
            listing = planning.Listing(
                registrations=registrations,
                leases=leases,
                nodes=nodes,
                retire_permission=per_namespace,
                system_namespace=system_namespace,
            )
            world = planning.build_world(listing)
            plan = planning.decide_all(world=world, policy=choice.policy, now=_utcnow())

    now = _utcnow()
    checks = [
        diagnosis.check_crd(crd),
        diagnosis.check_admission_policies(policies=policies, bindings=bindings),
        diagnosis.check_operator_alive(lease=operator_lease, system_namespace=system_namespace, now=now),
        diagnosis.check_last_sweep(lease=operator_lease, system_namespace=system_namespace),
        diagnosis.check_retire_grant(
            cluster_wide=cluster_wide,
            per_namespace=per_namespace,
            expect_plan_only=expect_plan_only,
            system_namespace=system_namespace,
        ),
        diagnosis.check_agents(nodes=nodes, leases=leases, system_namespace=system_namespace, now=now, plan=plan),
        diagnosis.check_node_loss(world=world, plan=plan, policy=choice, system_namespace=system_namespace, now=now),
        diagnosis.check_unattested(plan=plan, now=now, grace_seconds=attestation_grace_seconds),
        diagnosis.check_blocked(
            plan=plan, expect_plan_only=expect_plan_only, permission_known=cluster_wide is not None
        ),
    ]
    if output == "json":
        document = diagnosis.doctor_document(checks, now=now, policy=choice)
        click.echo(planning.dump(document, output="json"), nl=False)
    else:
        diagnosis.render_doctor(checks, console=_console(), policy=choice)
    code = diagnosis.doctor_exit_code(checks)
    if code != EXIT_OK:
        failed = [check.name for check in checks if check.status == diagnosis.CheckStatus.FAIL]
        _exit(ctx, f"doctor: check(s) {', '.join(failed)} failed.", code=code)


def _exit(ctx: click.Context, message: str, *, code: int) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    ctx.exit(code)
