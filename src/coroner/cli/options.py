"""The options every ``kubectl coroner`` command shares, as click decorators."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import click

from coroner.core import api


def _finite(_: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number of seconds.", param=param)
    return value


def common(command: Callable[..., Any]) -> Callable[..., Any]:
    """--kubeconfig, --system-namespace and the policy overrides."""
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


def scoped(command: Callable[..., Any]) -> Callable[..., Any]:
    """-n/--namespace and -A/--all-namespaces."""
    command = click.option("--all-namespaces", "-A", is_flag=True, help="Every namespace.")(command)
    return click.option("--namespace", "-n", default=None, help="The namespace (default: the kubeconfig context's).")(
        command
    )
