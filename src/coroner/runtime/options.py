"""The flags the operator's and the agent's commands share, declared once (`--log-format` is
`coroner.runtime.logformat.option`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

#: `--kubeconfig`: without it, the in-cluster ServiceAccount, else the default kubeconfig.
kubeconfig: Final = click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False), default=None)

#: `--verbose`: DEBUG records too.
verbose: Final = click.option("--verbose", "-v", is_flag=True)


def finite(param: click.Parameter, value: float) -> float:
    """FloatRange lets NaN through (every comparison with it is False); refuse it here."""
    if math.isnan(value):
        raise click.BadParameter("must be a number, not NaN", param=param)
    return value


def seconds(
    name: str,
    *,
    default: float,
    help: str,  # noqa: A002 - click's name
    maximum: float | None = None,
    refuse_nan: bool = False,
) -> Callable[[F], F]:
    """A duration flag: seconds, at least 0 (at most `maximum`), its default shown."""
    return click.option(
        name,
        type=click.FloatRange(min=0, max=maximum),
        default=default,
        show_default=True,
        help=help,
        callback=(lambda _ctx, param, value: finite(param, value)) if refuse_nan else None,
    )
