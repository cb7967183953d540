"""The options every ``kubectl coroner`` command shares, as click decorators.

kubectl's own flags do not reach a plugin (``kubectl --context X coroner`` is refused by kubectl),
so each command takes them itself, spelled as kubectl spells them: ``--kubeconfig``, ``--context``,
``--as``, ``--as-group``, ``--request-timeout``, ``-n``/``-A`` and ``-o``.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from typing import Any, Final

import click
import kubernetes

from coroner.cli.session import Connection
from coroner.core import api

#: Every command prints with one ``-o``, as kubectl does.
OUTPUTS: Final = ("table", "wide", "json", "yaml", "name")

_DURATION: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h)")
_UNIT_SECONDS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """kubectl's ``--request-timeout``: ``0`` (no timeout), a plain number of seconds, or a Go
    duration of ``h``/``m``/``s``/``ms`` parts (``1m30s``, ``500ms``). Raises ValueError."""
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        position, seconds = 0, 0.0
        for match in _DURATION.finditer(text):
            if match.start() != position:
                break
            seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
            position = match.end()
        if position != len(text) or not text:
            raise ValueError(f"{text!r} is not a duration (e.g. 0, 30, 30s, 1m, 1m30s, 500ms)") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{text!r} is not a duration >= 0")
    return seconds


def _timeout(_: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param=param) from None


def _contexts(ctx: click.Context, incomplete: str) -> list[str]:
    """The kubeconfig's context names, for completing --context."""
    try:
        contexts, _ = kubernetes.config.list_kube_config_contexts(config_file=ctx.params.get("kubeconfig"))  # type: ignore[no-untyped-call]
    except Exception:  # completion offers nothing rather than a traceback in the shell
        return []
    return sorted(str(c.get("name")) for c in contexts or [] if str(c.get("name", "")).startswith(incomplete))


def finite(_: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number of seconds.", param=param)
    return value


_CONNECTION_OPTIONS: Final = (
    click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None, help="Path to the kubeconfig."),
    click.option(
        "--context",
        default=None,
        shell_complete=lambda ctx, _, incomplete: _contexts(ctx, incomplete),
        help="The kubeconfig context to use (default: its current-context).",
    ),
    click.option("--as", "as_user", default=None, metavar="USER", help="Username to impersonate for every request."),
    click.option(
        "--as-group",
        "as_groups",
        multiple=True,
        metavar="GROUP",
        help="Group to impersonate (repeat for several); needs --as.",
    ),
    click.option(
        "--request-timeout",
        default=None,
        callback=_timeout,
        metavar="DURATION",
        help="How long to wait for one API request: 0 for no limit, else 30s, 1m, ... (default: 10s to "
        "connect and 120s to answer).",
    ),
)


def connection(command: Callable[..., Any]) -> Callable[..., Any]:
    """kubectl's connection flags, passed to the command as one ``connection: Connection``."""

    @functools.wraps(command)
    def wrapper(
        *args: Any,
        kubeconfig: str | None,
        context: str | None,
        as_user: str | None,
        as_groups: tuple[str, ...],
        request_timeout: float | None,
        **kwargs: Any,
    ) -> Any:
        if as_groups and not as_user:
            raise click.UsageError("--as-group needs --as: impersonating groups needs a user to impersonate.")
        found = Connection(
            kubeconfig=kubeconfig,
            context=context,
            as_user=as_user,
            as_groups=as_groups,
            request_timeout=request_timeout,
        )
        return command(*args, connection=found, **kwargs)

    decorated: Callable[..., Any] = wrapper
    for option in reversed(_CONNECTION_OPTIONS):
        decorated = option(decorated)
    return decorated


def policy(command: Callable[..., Any]) -> Callable[..., Any]:
    """--system-namespace and the policy overrides."""
    options = [
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
            callback=finite,
            help="Override the operator's published node-deletion quarantine. Default: what the operator publishes.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def common(command: Callable[..., Any]) -> Callable[..., Any]:
    """The connection flags, --system-namespace and the policy overrides."""
    return connection(policy(command))


def scoped(command: Callable[..., Any]) -> Callable[..., Any]:
    """-n/--namespace and -A/--all-namespaces."""
    command = click.option("--all-namespaces", "-A", is_flag=True, help="Every namespace.")(command)
    return click.option("--namespace", "-n", default=None, help="The namespace (default: the kubeconfig context's).")(
        command
    )


def output(command: Callable[..., Any]) -> Callable[..., Any]:
    """-o table|wide|json|yaml|name, the same for every command."""
    return click.option(
        "--output",
        "-o",
        type=click.Choice(OUTPUTS),
        default="table",
        show_default=True,
        help="table (for people), wide (more columns), json or yaml (one document), name (one object per line).",
    )(command)
