"""Each image installs exactly what its processes import, from a hashed lock, and nothing else.

The agent runs on every node and is pulled on every scale-up; the operator runs once, and carries
the CLI too, for the chart's `helm test` (doctor in the cluster). Each is built from
`images/<name>.lock` (made by `make locks`) plus the project with `--no-deps`. These
tests read the source, the pyproject and the locks: a new import that the lock does not carry, a
lock that lost its hashes, or a heavy package creeping into the agent fails here, not at a pull.
"""

from __future__ import annotations

import ast
import importlib.metadata
import pathlib
import re
import sys
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROOTS = {
    "coroner": ROOT / "src",
    "coroner_dev": ROOT / "src",
    "coroner_agent": ROOT / "node-agent/src",
    "coroner_operator": ROOT / "operator/src",
}
#: image -> (the extras it installs, none for the base dependencies alone; the modules its processes
#: start from)
IMAGES: dict[str, tuple[tuple[str, ...], list[str]]] = {
    "agent": (("agent",), ["coroner_agent.main", "coroner.cli.main"]),  # the agent, and `coroner run` in workers
    # the operator, and `kubectl-coroner doctor` for the chart's helm test
    "operator": (("operator", "cli"), ["coroner_operator.main", "coroner.cli.kubectl"]),
    "registrar": ((), ["coroner.cli.main", "coroner.registrar"]),  # `coroner registrar`
}
#: Never in the agent's image: what it never imports, and what made it ~200 MB.
NOT_IN_AGENT = {"kopf", "kubernetes", "rich", "cryptography", "psutil", "aiohttp"}


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def lock(image: str) -> dict[str, str]:
    """name -> version, asserting every pin carries at least one hash."""
    text = (ROOT / "images" / f"{image}.lock").read_text()
    pins: dict[str, str] = {}
    for block in re.split(r"\n(?=\S)", text):
        match = re.match(r"([A-Za-z0-9_.-]+)==([^\s;\\]+)", block)
        if not match:
            continue
        assert "--hash=sha256:" in block, f"images/{image}.lock pins {match[1]} without a hash"
        pins[canonicalize_name(match[1])] = match[2]
    return pins


def module_file(module: str) -> pathlib.Path | None:
    top = module.split(".")[0]
    if top not in ROOTS:
        return None
    path = ROOTS[top].joinpath(*module.split("."))
    if path.is_dir():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").exists() else None


def reachable_imports(starts: list[str]) -> tuple[set[str], set[str]]:
    """(our modules reachable from `starts`, the top-level third-party packages they import)."""
    seen: set[str] = set()
    external: set[str] = set()
    todo = list(starts)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = module_file(module)
        assert path is not None, module
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            for name in names:
                top = name.split(".")[0]
                if top in ROOTS:
                    if module_file(name) is not None:
                        todo.append(name)
                elif top not in sys.stdlib_module_names and top != "__future__":
                    external.add(top)
    return seen, external


def distribution_of(package: str) -> str:
    found = importlib.metadata.packages_distributions().get(package)
    assert found, f"no installed distribution provides the import {package!r}"
    return canonicalize_name(found[0])


def requirements(extras: tuple[str, ...]) -> list[str]:
    project = pyproject()["project"]
    return [*project["dependencies"], *(r for extra in extras for r in project["optional-dependencies"][extra])]


def declared(extras: tuple[str, ...]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements(extras)}


@pytest.mark.parametrize("image", IMAGES)
def test_every_import_of_the_process_is_declared_and_locked(image: str) -> None:
    extras, starts = IMAGES[image]
    modules, external = reachable_imports(starts)
    assert not any(m.startswith("coroner_dev") for m in modules), "the dev cluster is not in any image"
    pins = lock(image)
    for package in sorted(external):
        distribution = distribution_of(package)
        assert distribution in declared(extras), f"{image}: imports {package} ({distribution}), not declared"
        assert distribution in pins, f"{image}: imports {package} ({distribution}), not in images/{image}.lock"


@pytest.mark.parametrize("image", IMAGES)
def test_every_declared_dependency_is_locked_at_a_version_it_allows(image: str) -> None:
    extras, _ = IMAGES[image]
    pins = lock(image)
    for text in requirements(extras):
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"images/{image}.lock lacks {name}: run `make locks`"
        assert requirement.specifier.contains(pins[name]), f"images/{image}.lock has {name}=={pins[name]}"


def test_the_agent_image_carries_none_of_the_heavy_packages() -> None:
    assert not NOT_IN_AGENT & set(lock("agent"))


def test_the_operator_process_imports_none_of_the_clis_packages() -> None:
    """The kubernetes package and rich are in the operator image for the helm test's doctor only."""
    _, external = reachable_imports(["coroner_operator.main"])
    assert not {"kubernetes", "rich"} & external


def test_the_registrar_image_carries_the_base_dependencies_alone() -> None:
    """It runs in every Pod that has it: nothing but what `coroner registrar` imports."""
    base = {canonicalize_name(Requirement(r).name) for r in pyproject()["project"]["dependencies"]}
    assert set(lock("registrar")) == base


def test_every_declared_runtime_dependency_is_imported_somewhere() -> None:
    """Nothing declared and unused (tests and bench have their own extras)."""
    _, external = reachable_imports(
        ["coroner_agent.main", "coroner_operator.main", "coroner.cli.main", "coroner.cli.kubectl"]
    )
    used = {distribution_of(p) for p in external}
    project = pyproject()["project"]
    optional = project["optional-dependencies"]
    runtime = [*project["dependencies"], *optional["agent"], *optional["operator"], *optional["cli"]]
    for text in runtime:
        name = canonicalize_name(Requirement(text).name)
        assert name in used, f"{name} is declared but no shipped process imports it"


@pytest.mark.parametrize("image", IMAGES)
def test_the_dockerfile_installs_its_lock_with_hashes_and_only_its_roots(image: str) -> None:
    text = (ROOT / "images" / f"{image}.Dockerfile").read_text()
    assert f"--require-hashes --only-binary=:all: -r {image}.lock" in text
    assert "--no-deps ." in text
    assert "coroner_dev" not in text and "COPY src ./src" not in text


def test_coroner_run_works_where_the_dev_tooling_is_not_installed() -> None:
    """In an image `coroner` has only `run`; in a dev install also `dev-cluster` and `demo`."""
    import subprocess

    hidden = "import sys; sys.modules['coroner_dev'] = None\nfrom coroner.cli.main import main\nmain(['--help'])"
    image = subprocess.run([sys.executable, "-c", hidden], capture_output=True, text=True, check=True).stdout
    dev = subprocess.run([sys.executable, "-m", "coroner.cli.main", "--help"], capture_output=True, text=True).stdout
    assert "run " in image and "demo" not in image and "dev-cluster" not in image
    assert all(word in dev for word in ("run ", "demo", "dev-cluster"))
