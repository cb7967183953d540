"""The operator's retention and Event flags: defaults, the last occurrence winning (how an overlay
changes the base's value by appending), and nonsense refused before anything starts."""

from __future__ import annotations

import click
import pytest

from coroner_operator.main import main as operator_main

pytestmark = pytest.mark.unit

BASE = ["--all-namespaces", "--metrics-port=8080", "--terminal-retention-seconds=86400"]


def params(*args: str) -> dict[str, object]:
    return dict(operator_main.make_context("coroner-operator", list(args)).params)


def test_defaults() -> None:
    p = params()
    assert (p["terminal_retention_seconds"], p["event_burst"], p["event_window_seconds"]) == (86400.0, 10, 60.0)


@pytest.mark.parametrize(
    ("extra", "retention"),
    [
        pytest.param([], 86400.0, id="base"),
        pytest.param(["--terminal-retention-seconds=604800"], 604800.0, id="overlay-appends-7-days"),
        pytest.param(["--terminal-retention-seconds=0"], 0.0, id="overlay-keeps-forever"),
    ],
)
def test_an_appended_flag_overrides_the_base(extra: list[str], retention: float) -> None:
    assert params(*BASE, *extra)["terminal_retention_seconds"] == retention


@pytest.mark.parametrize(
    "bad",
    [
        "--terminal-retention-seconds=-1",
        "--terminal-retention-seconds=inf",
        "--terminal-retention-seconds=nan",
        "--event-burst=-1",
        "--event-window-seconds=0",
    ],
)
def test_nonsense_is_refused(bad: str) -> None:
    with pytest.raises(click.BadParameter):
        params(bad)


@pytest.mark.parametrize(
    ("extra", "deletion", "out_of_service"),
    [
        # The API server admits node evidence from the operator only where components/node-loss is
        # installed (policy 6), so without the component the operator counts neither: otherwise it
        # would try retirements the server refuses and read the refusal as a missing grant.
        pytest.param([], False, False, id="base-counts-no-node-evidence"),
        pytest.param(
            ["--node-deletion-evidence", "--node-quarantine-seconds=300", "--node-out-of-service-evidence"],
            True,
            True,
            id="node-loss-component",
        ),
    ],
)
def test_node_evidence_is_the_components_opt_in(extra: list[str], deletion: bool, out_of_service: bool) -> None:
    p = params(*BASE, *extra)
    assert (p["node_deletion_evidence"], p["node_out_of_service_evidence"]) == (deletion, out_of_service)
