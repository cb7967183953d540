"""The `coroner` command: the worker launcher (`coroner run`); in a dev install also the dev cluster and the demo."""

from __future__ import annotations

import importlib.metadata
import sys

import click

from coroner.core.model import HEARTBEAT_INTERVAL_MAX, HEARTBEAT_TTL_MAX


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Coroner: retires stale WorkerRegistrations, and never a live one."""


@main.command("run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--namespace", "-n", required=True, help="Namespace of the WorkerRegistration.")
@click.option("--node-name", required=True, envvar="NODE_NAME", help="The node this worker runs on.")
@click.option("--name", default=None, help="Registration name (default: ROLE-<random>).")
@click.option("--role", default="", help="Free-text role recorded in spec.role (default: the command's name).")
@click.option("--kubeconfig", default=None, type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--interval-seconds",
    default=None,
    type=click.IntRange(1, HEARTBEAT_INTERVAL_MAX),
    help="Opt into heartbeats every N seconds (with --ttl-seconds): a second, worker-side witness "
    "next to the node agent's. Default: none; the agent's pidfd and node Lease are the liveness.",
)
@click.option(
    "--ttl-seconds",
    default=None,
    type=click.IntRange(1, HEARTBEAT_TTL_MAX),
    help="With --interval-seconds: silence this long counts toward expiry.",
)
@click.option("--boot-id-file", default="/proc/sys/kernel/random/boot_id", show_default=True, hidden=True)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run_command(
    namespace: str,
    node_name: str,
    name: str | None,
    role: str,
    kubeconfig: str | None,
    interval_seconds: int | None,
    ttl_seconds: int | None,
    boot_id_file: str,
    command: tuple[str, ...],
) -> None:
    """Launch COMMAND as a registered worker: register once, release on a clean exit."""
    from coroner.launcher import RegistrationError, run

    if (interval_seconds is None) != (ttl_seconds is None):
        raise click.BadParameter("heartbeats need both --interval-seconds and --ttl-seconds (or neither)")
    if interval_seconds is not None and ttl_seconds is not None and ttl_seconds < interval_seconds:
        raise click.BadParameter("--ttl-seconds must be at least --interval-seconds")
    try:
        status = run(
            command,
            namespace=namespace,
            node_name=node_name,
            kubeconfig=kubeconfig,
            name=name,
            role=role,
            interval_seconds=interval_seconds,
            ttl_seconds=ttl_seconds,
            boot_id_file=boot_id_file,
        )
    except RegistrationError as exc:
        click.echo(f"coroner: error: {exc}", err=True)
        sys.exit(125)
    sys.exit(status)


@main.command("registrar")
@click.option("--namespace", "-n", required=True, envvar="POD_NAMESPACE", help="The Pod's namespace.")
@click.option("--node-name", required=True, envvar="NODE_NAME", help="The node the Pod runs on.")
@click.option("--pod-name", required=True, envvar="POD_NAME", help="The Pod's name (registrations are named after it).")
@click.option("--kubeconfig", default=None, type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--scan-seconds",
    default=0.5,
    show_default=True,
    type=click.FloatRange(0.05, 10.0),
    help="How often the Pod's processes are listed for a container (re)started since.",
)
@click.option("--proc-root", default="/proc", show_default=True, hidden=True)
@click.option("--boot-id-file", default="/proc/sys/kernel/random/boot_id", show_default=True, hidden=True)
def registrar_command(
    namespace: str,
    node_name: str,
    pod_name: str,
    kubeconfig: str | None,
    scan_seconds: float,
    proc_root: str,
    boot_id_file: str,
) -> None:
    """Register the main process of every other container of this Pod (a native sidecar in a Pod
    with shareProcessNamespace: true; `kubectl coroner inject` adds it)."""
    import logging
    import signal
    import threading

    from coroner.launcher import RegistrationError, client_for
    from coroner.registrar import Registrar

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        registrar = Registrar(
            client=client_for(kubeconfig),
            namespace=namespace,
            node_name=node_name,
            pod_name=pod_name,
            proc_root=proc_root,
            boot_id_file=boot_id_file,
        )
        registrar.run(stop=stop, scan_seconds=scan_seconds)
    except RegistrationError as exc:
        click.echo(f"coroner registrar: error: {exc}", err=True)
        sys.exit(125)


#: The entry point group of commands other distributions add to `coroner` (pyproject.toml's
#: `[project.entry-points."coroner.commands"]`: the dev tooling's `dev-cluster` and `demo`).
COMMANDS_GROUP = "coroner.commands"


def add_plugin_commands(group: click.Group) -> None:
    """Adds the commands of the entry point group, found through the installed packages' metadata, so
    that the shipped CLI imports no layer above it. A command whose package is not installed is left
    out: the images install the same metadata but copy only the packages they ship. Any other import
    error is a bug and propagates."""
    for entry in importlib.metadata.entry_points(group=COMMANDS_GROUP):
        try:
            command = entry.load()
        except ModuleNotFoundError as exc:
            if exc.name is None or not (entry.module == exc.name or entry.module.startswith(f"{exc.name}.")):
                raise
            continue
        group.add_command(command)


add_plugin_commands(main)

if __name__ == "__main__":
    main()
