"""The pure modules do no I/O: checked on their source, so a stray import fails here, not in production.

The decision is shared by the operator and the CLI and must reach the same verdict from the same
inputs; a core that read a clock, a file or the API would not. Which modules are pure is defined
once, by the import-linter contract in pyproject.toml; this test reads it and checks their source
for what import-linter cannot see (clocks, files, prints), with nothing but the standard library.
"""

from __future__ import annotations

import ast
import pathlib
import re
import tomllib

import pytest

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROOTS = {"coroner": ROOT / "src", "coroner_operator": ROOT / "operator/src", "coroner_agent": ROOT / "node-agent/src"}
CONTRACT = "Pure: the core, the retire protocol's logic and the reconcile step do no I/O"


def pure_contract() -> dict[str, list[str]]:
    """The one definition of "pure": the import-linter contract in pyproject.toml."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    return next(c for c in contracts if c["name"] == CONTRACT)


def expand(module: str) -> list[str]:
    """A module, or every module of a package."""
    top = module.split(".")[0]
    path = ROOTS[top].joinpath(*module.split("."))
    if not path.is_dir():
        return [module]
    return sorted(
        ".".join(f.relative_to(ROOTS[top]).with_suffix("").parts).removesuffix(".__init__") for f in path.rglob("*.py")
    )


PURE = sorted({m for source in pure_contract()["source_modules"] for m in expand(source)})
#: What the pure modules may import: computation only, and each other. `asyncio` only to await a
#: port (the retire protocol's); its clocks, sleeps and connections are forbidden calls below.
ALLOWED = {
    "__future__", "asyncio", "collections", "collections.abc", "copy", "dataclasses", "datetime", "enum",
    "functools", "hashlib", "heapq", "itertools", "json", "marshal", "math", "re", "types", "typing",
    "coroner", "coroner.core", "coroner_operator", *PURE,
}  # fmt: skip
FORBIDDEN_CALLS = {
    ("datetime", "now"), ("datetime", "utcnow"), ("datetime", "today"), ("date", "today"),
    ("time", "time"), ("time", "monotonic"), ("time", "sleep"),
    ("asyncio", "sleep"), ("asyncio", "open_connection"), ("asyncio", "create_subprocess_exec"),
    ("asyncio", "to_thread"), ("loop", "time"),
}  # fmt: skip
FORBIDDEN_BUILTINS = {"open", "input", "print", "exec", "eval", "__import__", "breakpoint"}


def source_of(module: str) -> pathlib.Path:
    path = ROOTS[module.split(".")[0]].joinpath(*module.split("."))
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


@pytest.mark.parametrize("module", [*PURE, "coroner"])
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


def test_pure_names_the_decision_the_wire_shapes_and_the_reconcile_step() -> None:
    """The contract is the definition; this pins that it still covers what must be pure."""
    assert {"coroner.core.decision", "coroner.core.wire", "coroner.core.model", "coroner_operator.step"} <= set(PURE)
    assert {"kopf", "kubernetes", "urllib3", "coroner.client", "coroner_operator.executor"} <= set(
        pure_contract()["forbidden_modules"]
    )


def test_the_scan_sees_a_violation() -> None:
    """The scanner itself must not pass everything."""
    tree = ast.parse("import os\nfrom kubernetes import client\nfrom coroner.client import kube\n")
    assert imports_of(tree) - ALLOWED == {"os", "kubernetes", "coroner.client", "coroner.client.kube"}


def test_the_architecture_names_exactly_the_pure_modules_of_the_contract() -> None:
    """docs/architecture.md lists the pure modules: the very ones of the contract, none more or less."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index('"Pure" is defined once') :].split("\n\n", 1)[0]

    named = set(re.findall(r"`(coroner[a-z_.]*)`", section))
    assert named == set(pure_contract()["source_modules"])
