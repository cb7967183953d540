"""`coroner-agent`: the per-node agent. Runs until SIGTERM; then keeps attesting while it waits
(at most --shutdown-grace-seconds) for its node's live incarnations to exit, sweeps once and exits.
With --metrics-port it serves /metrics, /healthz and /readyz (coroner_agent.health) from its start,
before it first reaches the API server."""

from __future__ import annotations

import asyncio
import logging
import os
import resource
from typing import Any

import click

from coroner.client.rest import Rest
from coroner.core import api
from coroner.runtime import logformat, options
from coroner.runtime.manager import Manager
from coroner_agent.health import AgentMetrics, HealthServer, HealthState, heartbeat
from coroner_agent.kube import AgentApi
from coroner_agent.prober import ProcProber
from coroner_agent.service import Agent
from coroner_agent.settings import AgentSettings

logger = logging.getLogger("coroner.agent")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--node-name", required=True, envvar="NODE_NAME", help="The node this agent serves (downward API).")
@options.kubeconfig
@click.option("--proc-root", default="/proc", show_default=True, help="Where the host's /proc is mounted.")
@click.option("--boot-id-file", default="/proc/sys/kernel/random/boot_id", show_default=True)
@click.option("--machine-id-file", default="/etc/machine-id", show_default=True)
@click.option("--pod-name", default="", envvar="POD_NAME")
@click.option("--system-namespace", default=api.SYSTEM_NAMESPACE, show_default=True)
@click.option("--resync-seconds", type=float, default=30.0, show_default=True)
@click.option("--lease-duration-seconds", type=int, default=30, show_default=True)
@click.option("--renew-seconds", type=float, default=10.0, show_default=True)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Registrations attested at once (probe + attestation write), like the operator's --workers: a mass "
    "death on this node is attested in about one API round-trip per this many deaths.",
)
@click.option("--no-pidfd", is_flag=True, help="Do not pin incarnations with pidfds (resync path only; benchmarks).")
@click.option("--max-pidfds", type=int, default=20000, show_default=True)
@options.seconds(
    "--shutdown-grace-seconds",
    default=40.0,
    help="On SIGTERM, keep serving this long at most while waiting for this node's registrations that are "
    "not attested Dead (nor terminal) to exit, attesting each exit; 0 skips the wait. With "
    "--shutdown-sweep-seconds it must fit in the pod's terminationGracePeriodSeconds.",
)
@options.seconds(
    "--shutdown-sweep-seconds", default=15.0, help="Bound of the final re-probe of every registration after the wait."
)
@options.seconds(
    "--absence-confirm-seconds",
    default=10.0,
    help="A death read from /proc (ProcAbsent, PidNamespaceRecreated, BootBoundary) is attested once seen again this long after it "
    "was first seen; at least the operator's policy absenceConfirmSeconds. A pidfd death needs no wait.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(min=0, max=65535),
    default=None,
    help="Serve /metrics, /healthz and /readyz on this port (the manifests: 9102, named `metrics`); 0 picks a "
    "free one. Off without it.",
)
@click.option(
    "--metrics-bind-address",
    default="0.0.0.0",
    show_default=True,
    help="Address /metrics, /healthz and /readyz listen on (all addresses in a pod; 127.0.0.1 keeps them on this host).",
)
@logformat.option
@options.verbose
def main(
    node_name: str,
    kubeconfig: str | None,
    proc_root: str,
    boot_id_file: str,
    machine_id_file: str,
    pod_name: str,
    system_namespace: str,
    resync_seconds: float,
    lease_duration_seconds: int,
    renew_seconds: float,
    workers: int,
    no_pidfd: bool,
    max_pidfds: int,
    shutdown_grace_seconds: float,
    shutdown_sweep_seconds: float,
    absence_confirm_seconds: float,
    metrics_port: int | None,
    metrics_bind_address: str,
    log_format: str,
    verbose: bool,
) -> None:
    """Attest the death (or life) of this node's registered worker incarnations."""
    configure_logging(log_format=log_format, verbose=verbose)
    settings = AgentSettings(
        node_name=node_name,
        pod_name=pod_name or os.environ.get("HOSTNAME", ""),
        lease_duration_seconds=lease_duration_seconds,
        renew_seconds=renew_seconds,
        resync_seconds=resync_seconds,
        workers=workers,
        shutdown_grace_seconds=shutdown_grace_seconds,
        shutdown_sweep_seconds=shutdown_sweep_seconds,
        absence_confirm_seconds=absence_confirm_seconds,
    )
    prober_options = {
        "node_name": node_name,
        "proc_root": proc_root,
        "boot_id_file": boot_id_file,
        "machine_id_file": machine_id_file,
        "use_pidfd": not no_pidfd,
        "max_pidfds": _raise_fd_limit(max_pidfds),
    }
    metrics = AgentMetrics()
    state = HealthState(lease_duration=lease_duration_seconds)
    server = None
    if metrics_port is not None:
        # Bound before anything else: a port taken is a configuration error, said at once.
        server = HealthServer(
            address=metrics_bind_address, port=metrics_port, metrics=metrics, state=state, before_scrape=lambda: None
        )
    try:
        asyncio.run(
            _run(
                settings=settings,
                kubeconfig=kubeconfig,
                system_namespace=system_namespace,
                prober_options=prober_options,
                metrics=metrics,
                state=state,
                server=server,
            )
        )
    finally:
        if server is not None:
            server.close()


def configure_logging(*, log_format: str, verbose: bool) -> None:
    """text: one line per record; json: one JSON object per line, as the operator's
    (`coroner.runtime.logformat`)."""
    logformat.configure(log_format=log_format, verbose=verbose)


def _raise_fd_limit(wanted: int) -> int:
    """Raises the soft RLIMIT_NOFILE toward the hard limit; returns how many pidfds may be pinned.

    Python starts with the distribution's soft limit (often 1024): at that limit pidfd_open fails
    with EMFILE and every further incarnation could only be Unknown until a resync. Room is kept
    for sockets, /proc reads and the event loop.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, wanted + 1024)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            logger.warning("cannot raise the open-file limit from %s to %s: %s", soft, target, exc)
    return max(0, min(wanted, soft - 256))


async def _run(
    *,
    settings: AgentSettings,
    kubeconfig: str | None,
    system_namespace: str,
    prober_options: dict[str, Any],
    metrics: AgentMetrics,
    state: HealthState,
    server: HealthServer | None,
) -> None:
    async with Manager(name="agent") as manager:
        # The heartbeat and the server first: /healthz answers (true) while the agent still waits for
        # an unreachable API server below; /readyz says it is not ready yet.
        manager.add(heartbeat(state))
        manager.start()
        if server is not None:
            server.start()
            logger.info("serving /metrics, /healthz and /readyz port=%s", server.port)
        agent = await _assemble(
            settings=settings,
            kubeconfig=kubeconfig,
            system_namespace=system_namespace,
            prober_options=prober_options,
            metrics=metrics,
            state=state,
            manager=manager,
        )
        if server is not None:
            server.before_scrape = agent.scrape
        agent.host(manager)
        await manager.run(stop=manager.signalled())


async def _assemble(
    *,
    settings: AgentSettings,
    kubeconfig: str | None,
    system_namespace: str,
    prober_options: dict[str, Any],
    metrics: AgentMetrics,
    state: HealthState,
    manager: Manager,
) -> Agent:
    """The agent over this node's /proc and the API server, its prober closed with the process."""
    node_name = settings.node_name
    # Connections for every attestation in flight, the Lease renewal and the watch.
    rest = Rest.default(kubeconfig, user_agent="coroner-agent", pool_size=settings.workers + 2)
    kube = AgentApi(rest, node_name=node_name, system_namespace=system_namespace)
    identity = await asyncio.to_thread(kube.whoami)
    loop = asyncio.get_running_loop()
    agent_ref: list[Agent] = []
    prober = ProcProber(loop=loop, on_exit=lambda key: agent_ref[0].on_pidfd(key), **prober_options)
    manager.closing(prober.close)
    node_boot = await asyncio.to_thread(kube.node_boot_id)
    if node_boot is not None and node_boot != prober.boot_id():
        logger.warning(
            "boot id disagrees with the Node node=%s nodeBootID=%s agentBootID=%s "
            "(the operator preserves this node's registrations as BootIdentityUnknown)",
            node_name,
            node_boot,
            prober.boot_id(),
        )
    agent = Agent(kube=kube, prober=prober, settings=settings, identity=identity, metrics=metrics, health=state)
    agent_ref.append(agent)
    logger.info(
        "agent started node=%s identity=%s bootId=%s seesEveryProcess=%s pidfd=%s maxPidfds=%s workers=%s",
        node_name,
        identity,
        prober.boot_id(),
        prober.sees_every_process,
        prober_options["use_pidfd"],
        prober_options["max_pidfds"],
        settings.workers,
    )
    return agent
