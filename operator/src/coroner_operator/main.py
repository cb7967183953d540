"""`coroner-operator`: runs the operator (kopf) with its metrics and liveness endpoint."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import pathlib
import socket
import sys
import uuid
from typing import Any

import click
import kopf

from coroner.client.rest import Rest, in_cluster_server
from coroner.core import api, policy_json
from coroner.core.decision import Policy
from coroner.core.held import HELD_GRACE_SECONDS
from coroner.core.world import World
from coroner.runtime import logformat, options
from coroner.runtime.leader import ElectionConfig
from coroner.runtime.manager import Manager, stop_process
from coroner_operator.app import Operator
from coroner_operator.eventcorrelator import DEFAULT_BURST, DEFAULT_WINDOW_SECONDS
from coroner_operator.handlers import Runtime, configure, register
from coroner_operator.health import serve_http
from coroner_operator.kubeapi import KubeApi
from coroner_operator.metrics import Metrics
from coroner_operator.retention import DEFAULT_TERMINAL_RETENTION_SECONDS
from coroner_operator.settings import OperatorSettings

logger = logging.getLogger("coroner.operator")


def build_registry(
    *,
    kubeconfig: str | None,
    policy: Policy,
    settings: OperatorSettings,
    metrics: Metrics,
    runtime: Runtime,
    metrics_port: int | None,
    metrics_address: str = "0.0.0.0",
) -> kopf.OperatorRegistry:
    """A kopf registry with Coroner's handlers, startup and cleanup; one per operator instance."""
    registry = kopf.OperatorRegistry()
    register(registry, runtime)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        if kubeconfig:
            os.environ["KUBECONFIG"] = kubeconfig
            return kopf.login_with_kubeconfig(**kwargs)
        # In a pod: the ServiceAccount (kopf re-reads its rotated token); else the default kubeconfig.
        return in_cluster_login(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings)
        kube = KubeApi(Rest.default(kubeconfig, user_agent="coroner-operator", pool_size=16))
        identity = await _whoami(kube)
        operator = Operator(
            world=World(system_namespace=settings_.system_namespace, intern=sys.intern),
            kube=kube,
            policy=policy,
            metrics=metrics,
            settings=settings_,
            identity=identity,
        )
        runtime.operator = operator
        # A loop that ends is a bug or a dead port: stop the operator loudly (its Deployment restarts
        # it) rather than keep running with, say, no permission refresh.
        runtime.manager = manager = Manager(name="operator", on_failure=stop_process)
        operator.host(manager, indexed=runtime.indexed)
        if metrics_port is not None:
            manager.add(
                serve_http(
                    metrics_address, metrics_port, metrics=metrics, elector=operator.elector, sweeper=operator.sweeper
                )
            )
        manager.start()
        logger.info(
            "operator started identity=%s workers=%s policy=%s",
            identity,
            settings_.workers,
            policy_json.dump_policy(policy),
        )

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        if runtime.manager is not None:
            await runtime.manager.shutdown()

    settings_ = settings
    return registry


async def _whoami(kube: KubeApi) -> str:
    """Who the operator is (recorded as retiredBy). Retried here, with a short backoff, rather than
    failing the startup activity: kopf would retry that only after a minute, and an operator
    started during an API outage would retire nothing for that long once the API is back."""
    delay = 0.5
    while True:
        try:
            return await kube.whoami()
        except Exception as exc:
            logger.warning("cannot ask the API server who this operator is (%r); retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


def configure_logging(*, log_format: str, verbose: bool) -> None:
    """text: one line per record; json: one JSON object per line (`coroner.runtime.logformat`, the
    agent's too) for Coroner's records and kopf's own alike, on the handler kopf sets up (which also
    keeps asyncio's debug records out)."""
    if log_format == "json":
        kopf.configure(verbose=verbose, log_format=kopf.LogFormat.JSON)
        root = logging.getLogger()
        root.setLevel(logging.DEBUG if verbose else logging.INFO)
        for handler in root.handlers:
            handler.setFormatter(logformat.JsonFormatter())
    else:
        logformat.configure(log_format=log_format, verbose=verbose)


def in_cluster_login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's service-account login, at the address the operator's own client uses in a pod
    (`rest.in_cluster_server`): kopf's names `https://kubernetes.default.svc`, which only cluster DNS
    resolves, so the operator's watches would depend on DNS while its writes did not."""
    info = kopf.login_with_service_account(**kwargs)
    if info is None or not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return info
    return dataclasses.replace(info, server=in_cluster_server())


def default_identity() -> str:
    """The leader Lease's holderIdentity: the pod's name (downward API), else unique per process."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{uuid.uuid4()}"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@options.kubeconfig
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    help="Serve only the registrations of these namespaces (repeatable; a glob such as team-* watches every namespace and keeps the matching ones).",
)
@click.option("--all-namespaces", "-A", is_flag=True, help="Serve every namespace (the default without --namespace).")
@click.option("--metrics-port", type=int, default=None, help="Serve /metrics and /healthz on this port.")
@click.option(
    "--metrics-bind-address",
    default="0.0.0.0",
    show_default=True,
    help="Address /metrics and /healthz listen on (all addresses in a pod; 127.0.0.1 keeps them on this host).",
)
@click.option("--workers", type=int, default=8, show_default=True, help="Concurrent reconciles.")
@click.option("--resync-seconds", type=float, default=60.0, show_default=True)
@click.option(
    "--permission-refresh-seconds",
    type=float,
    default=5.0,
    show_default=True,
    help="How often the retire capability is re-checked per namespace (a grant takes effect within this).",
)
@click.option(
    "--node-deletion-evidence/--no-node-deletion-evidence",
    default=False,
    show_default=True,
    help="Accept a Node confirmed gone (live GET 404 or another UID, after a quarantine) as death evidence. "
    "Published with the rest of the policy on the operator's Lease, where kubectl coroner reads it.",
)
@click.option(
    "--node-out-of-service-evidence/--no-node-out-of-service-evidence",
    default=False,
    show_default=True,
    help="Accept the node.kubernetes.io/out-of-service taint (a person's statement that the node is gone) as death "
    "evidence. The API server admits that evidence from the operator only where components/node-loss is "
    "installed, which sets this flag: without it the operator would try retirements the API server refuses.",
)
@click.option(
    "--node-quarantine-seconds",
    type=float,
    default=40.0,
    show_default=True,
    help="How long a Node must have been NotFound before --node-deletion-evidence counts it.",
)
@options.seconds(
    "--terminal-retention-seconds",
    default=DEFAULT_TERMINAL_RETENTION_SECONDS,
    maximum=10 * 365 * 86400,
    refuse_nan=True,
    help="Delete terminal (Retired or Released) registrations this long after they became terminal "
    "(status.retirement.retiredTime, else the Retired or Released condition's lastTransitionTime), at the next "
    "sweep; 0 keeps them forever. Deletes carry uid and resourceVersion preconditions.",
)
@options.seconds(
    "--held-grace-seconds",
    default=HELD_GRACE_SECONDS,
    refuse_nan=True,
    help="Count an active registration in coroner_registrations_held once a reason that may last for ever "
    "(PidReuseDetected, LivenessUnknown, AttestationStale, ...: coroner.core.held) has held it this long, "
    "as kubectl coroner doctor's --held-grace-seconds bounds its held check.",
)
@click.option(
    "--event-burst",
    type=click.IntRange(min=0),
    default=DEFAULT_BURST,
    show_default=True,
    help="Retirement Events posted one by one per namespace per --event-window-seconds; past it, similar ones "
    "(same reason and evidence) are combined into one aggregate Event per window.",
)
@click.option(
    "--event-window-seconds",
    type=click.FloatRange(min=0, min_open=True, max=3600),
    default=DEFAULT_WINDOW_SECONDS,
    callback=lambda _ctx, param, value: options.finite(param, value),
    show_default=True,
    help="The Event aggregation window; an aggregate Event is posted when its window ends.",
)
@click.option("--system-namespace", default=api.SYSTEM_NAMESPACE, show_default=True)
@click.option(
    "--leader-elect/--no-leader-elect",
    default=False,
    show_default=True,
    help=f"Elect a leader among replicas on the Lease <system-namespace>/{api.OPERATOR_LEASE}; only the leader "
    "reconciles, sweeps, retires, deletes and posts Events, a standby keeps its caches warm and takes over "
    "when the leader's Lease expires. The manifests run 2 replicas with it.",
)
@click.option(
    "--leader-elect-identity",
    default=None,
    help="This replica's holderIdentity (default: $POD_NAME, else <hostname>_<random>).",
)
@click.option("--leader-elect-lease-duration", type=click.FloatRange(min=1), default=15.0, show_default=True)
@click.option("--leader-elect-renew-deadline", type=click.FloatRange(min=0.5), default=10.0, show_default=True)
@click.option("--leader-elect-retry-period", type=click.FloatRange(min=0.1), default=2.0, show_default=True)
@logformat.option
@options.verbose
def main(
    kubeconfig: str | None,
    namespaces: tuple[str, ...],
    all_namespaces: bool,
    metrics_port: int | None,
    metrics_bind_address: str,
    workers: int,
    resync_seconds: float,
    permission_refresh_seconds: float,
    node_deletion_evidence: bool,
    node_out_of_service_evidence: bool,
    node_quarantine_seconds: float,
    terminal_retention_seconds: float,
    held_grace_seconds: float,
    event_burst: int,
    event_window_seconds: float,
    system_namespace: str,
    leader_elect: bool,
    leader_elect_identity: str | None,
    leader_elect_lease_duration: float,
    leader_elect_renew_deadline: float,
    leader_elect_retry_period: float,
    log_format: str,
    verbose: bool,
) -> None:
    """Run the Coroner operator: retire stale WorkerRegistrations, never a live one."""
    configure_logging(log_format=log_format, verbose=verbose)
    election = None
    if leader_elect:
        try:
            election = ElectionConfig(
                lease_duration=leader_elect_lease_duration,
                renew_deadline=leader_elect_renew_deadline,
                retry_period=leader_elect_retry_period,
            )
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--leader-elect-*") from exc
    for noisy in ("kopf.objects", "kopf.activities.probe", "kopf._core", "kopf._cogs", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if kubeconfig:
        kubeconfig = str(pathlib.Path(kubeconfig).resolve())
    policy = Policy(
        node_deletion_evidence=node_deletion_evidence,
        node_deletion_quarantine_seconds=node_quarantine_seconds,
        node_out_of_service_evidence=node_out_of_service_evidence,
    )
    settings = OperatorSettings(
        workers=workers,
        resync_seconds=resync_seconds,
        permission_refresh_seconds=permission_refresh_seconds,
        terminal_retention_seconds=terminal_retention_seconds,
        held_grace_seconds=held_grace_seconds,
        event_burst=event_burst,
        event_window_seconds=event_window_seconds,
        system_namespace=system_namespace,
        namespaces=() if all_namespaces else namespaces,
        leader_election=election,
        leader_identity=leader_elect_identity or default_identity(),
    )
    runtime = Runtime()
    registry = build_registry(
        kubeconfig=kubeconfig,
        policy=policy,
        settings=settings,
        metrics=Metrics(),
        runtime=runtime,
        metrics_port=metrics_port,
        metrics_address=metrics_bind_address,
    )
    clusterwide = all_namespaces or not namespaces
    # Agent Leases live in the system namespace: a namespaced operator must watch it too, or every
    # registration would read AgentUnavailable. (Nodes are cluster-scoped and seen only cluster-wide;
    # a namespaced operator then has no node facts: Node boot ids go unchecked and node-deletion
    # evidence is never available, which only ever preserves more.)
    served = () if clusterwide else tuple(dict.fromkeys((*namespaces, system_namespace)))
    # kopf's own identity defaults to getpass.getuser(), which raises for a uid with no passwd entry:
    # the shipped image runs as 65532, which has none. Give it this replica's identity instead.
    kopf.run(
        registry=registry,
        standalone=True,
        clusterwide=clusterwide,
        namespaces=served,
        # kopf's Identity is a NewType of str that kopf does not export.
        identity=settings.leader_identity,  # type: ignore[arg-type]
    )
