"""``kubectl coroner version``: this plugin's version, the cluster's, and the Coroner API it serves."""

from __future__ import annotations

import importlib.metadata
import platform
from typing import Any

import click
from kubernetes import client as k8s

from coroner.cli import options, render
from coroner.cli.session import Connection, PluginError, Session
from coroner.core import api


def client_version() -> dict[str, str]:
    """The installed distribution that holds this package (whatever its name), and Python's."""
    distributions = importlib.metadata.packages_distributions().get("coroner") or []
    version = "unknown"
    for distribution in distributions:
        try:
            version = importlib.metadata.version(distribution)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    return {
        "version": version,
        "distribution": distributions[0] if distributions else "unknown",
        "apiVersion": api.API_VERSION,
        "python": platform.python_version(),
    }


@click.command("version")
@click.option("--client", "client_only", is_flag=True, help="Only this plugin's version; no request is made.")
@options.output
@options.connection
def version_command(client_only: bool, output: str, connection: Connection) -> None:
    """Print this plugin's version and, unless --client, the cluster's Kubernetes version and the
    versions of the Coroner API (coroner.dev) it serves."""
    client = client_version()
    server: dict[str, Any] | None = None
    served: list[str] | None = None
    error: PluginError | None = None
    if not client_only:
        try:
            session = Session(connection)
            raw = session.request(k8s.VersionApi(session.client).get_code, what="get the server version")
            server = {key: raw.get(key) for key in ("gitVersion", "major", "minor", "platform")}
            groups = session.request(k8s.ApisApi(session.client).get_api_versions, what="discover the API groups")
            served = [
                str(version.get("version"))
                for group in groups.get("groups") or []
                if isinstance(group, dict) and group.get("name") == api.GROUP
                for version in group.get("versions") or []
                if isinstance(version, dict)
            ]
        except PluginError as exc:
            error = exc
    document = {
        "apiVersion": api.API_VERSION,
        "kind": "Version",
        "clientVersion": client,
        "serverVersion": server,
        "servedApiVersions": served,
    }

    def table(console: Any, wide: bool) -> None:
        detail = f" ({client['distribution']}, Python {client['python']})" if wide else ""
        console.print(f"Client Version: {client['version']}{detail}", highlight=False, markup=False)
        if server is not None:
            detail = f" ({server.get('platform')})" if wide else ""
            console.print(f"Server Version: {server.get('gitVersion')}{detail}", highlight=False, markup=False)
        if served is not None:
            state = (
                f"served: {', '.join(f'{api.GROUP}/{v}' for v in served)}"
                if served
                else f"not installed (no {api.GROUP} API group)"
            )
            supported = "" if api.VERSION in served or not served else f"; this plugin speaks {api.API_VERSION}"
            console.print(f"Coroner API: {state}{supported}", highlight=False, markup=False)

    render.emit(output, document=lambda: document, table=table, names=[f"kubectl-coroner/{client['version']}"])
    if error is not None:
        raise error
