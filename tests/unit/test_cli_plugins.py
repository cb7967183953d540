"""`coroner`'s commands from other distributions (the dev tooling's `dev-cluster` and `demo`) are found
by the entry point group `coroner.commands`, never by importing a package of a higher layer by name:
the shipped CLI imports nothing of `coroner_dev`, and where `coroner_dev` is not installed (the
images copy only the roots they ship, with the same package metadata) its commands are left out."""

from __future__ import annotations

import ast
import importlib.metadata
import pathlib

import click
import pytest

from coroner.cli import main as cli_main

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_dev_commands_are_the_entry_points_of_the_group() -> None:
    found = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=cli_main.COMMANDS_GROUP)}
    assert found == {"dev-cluster": "coroner_dev.commands:dev_cluster", "demo": "coroner_dev.commands:demo"}
    assert {"dev-cluster", "demo"} <= set(cli_main.main.commands)


def test_the_cli_never_names_a_package_of_a_higher_layer() -> None:
    tree = ast.parse((ROOT / "src/coroner/cli/main.py").read_text())
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert not [s for s in strings if "coroner_dev" in s]
    imported = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "import_module"]
    assert not imported


def _entry(value: str, name: str = "x") -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(name=name, value=value, group=cli_main.COMMANDS_GROUP)


def test_a_command_whose_package_is_not_installed_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    entries = [_entry("coroner_not_shipped.commands:gone", "gone"), _entry("coroner.cli.main:main", "again")]
    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda *, group: entries if group == cli_main.COMMANDS_GROUP else []
    )
    group = click.Group("coroner")
    cli_main.add_plugin_commands(group)
    assert set(group.commands) == {"main"}


def test_a_broken_command_module_is_an_error_not_a_missing_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the plugin's own package being absent skips it: an import error inside it is a bug."""
    entries = [_entry("coroner.cli.main:no_such_command")]
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda *, group: entries)
    with pytest.raises(AttributeError):
        cli_main.add_plugin_commands(click.Group("coroner"))
