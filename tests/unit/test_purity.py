"""The pure cores do no I/O: checked on their source, so a stray import fails here, not in production.

The decision is shared by the operator and the CLI and must reach the same verdict from the same
inputs; a core that read a clock, a file or the API would not. The import-linter contract in
pyproject.toml says the same for the tool; this test needs nothing but the standard library.
"""

from __future__ import annotations

import ast
import pathlib
import tomllib

import pytest

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "coroner"

PURE = [
    "coroner.core.model",
    "coroner.core.decision",
    "coroner.core.fingerprint",
    "coroner.core.conditions",
    "coroner.core.reasons",
    "coroner.core.procfs",
    "coroner.core.wire",
    "coroner.core.policy_json",
    "coroner.core.admission_digest",
    # The operator's cache, filled from watches and LISTs by its callers; the one decide-all
    # (coroner.core.fingerprint) decides over it.
    "coroner.core.world",
]
#: What the pure cores may import: computation only, and each other.
ALLOWED = {
    "__future__", "collections", "collections.abc", "copy", "dataclasses", "datetime", "enum", "functools",
    "hashlib", "itertools", "json", "math", "re", "types", "typing",
    "coroner", "coroner.core", "coroner.core.api", *PURE,
}  # fmt: skip
FORBIDDEN_CALLS = {
    ("datetime", "now"), ("datetime", "utcnow"), ("datetime", "today"), ("date", "today"),
    ("time", "time"), ("time", "monotonic"), ("time", "sleep"),
}  # fmt: skip
FORBIDDEN_BUILTINS = {"open", "input", "print", "exec", "eval", "__import__", "breakpoint"}


def source_of(module: str) -> pathlib.Path:
    relative = module.split(".")[1:]
    path = PACKAGE.joinpath(*relative)
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def imports_of(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative imports hide what is imported"
            base = node.module or ""
            found.add(base)
            # `from coroner.core import api` imports the module coroner.core.api.
            found |= {
                f"{base}.{alias.name}" for alias in node.names if base in {"coroner", "coroner.core", "coroner.client"}
            }
    return found


@pytest.mark.parametrize("module", [*PURE, "coroner.core.api", "coroner"])
def test_imports_only_computation(module: str) -> None:
    imported = imports_of(ast.parse(source_of(module).read_text()))
    assert imported <= ALLOWED, f"{module} imports {sorted(imported - ALLOWED)}"


@pytest.mark.parametrize("module", PURE)
def test_reads_no_clock_and_no_file(module: str) -> None:
    tree = ast.parse(source_of(module).read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        function = node.func
        if isinstance(function, ast.Name):
            assert function.id not in FORBIDDEN_BUILTINS, f"{module}:{node.lineno} calls {function.id}()"
        elif isinstance(function, ast.Attribute):
            owner = function.value
            name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
            assert (name, function.attr) not in FORBIDDEN_CALLS, (
                f"{module}:{node.lineno} calls {name}.{function.attr}()"
            )


def test_the_import_linter_contract_names_every_pure_core() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    pure_contract = next(c for c in contracts if "kopf" in c.get("forbidden_modules", []))
    assert set(PURE) <= set(pure_contract["source_modules"])
    assert {"kopf", "kubernetes", "psutil"} <= set(pure_contract["forbidden_modules"])


def test_the_scan_sees_a_violation() -> None:
    """The scanner itself must not pass everything."""
    tree = ast.parse("import os\nfrom kubernetes import client\nfrom coroner.client import kube\n")
    assert imports_of(tree) - ALLOWED == {"os", "kubernetes", "coroner.client", "coroner.client.kube"}
