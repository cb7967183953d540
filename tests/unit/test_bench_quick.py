"""`make bench-quick` (bench/quick.py) runs every benchmark, with flags each benchmark has: a new
benchmark or a renamed flag fails here, not in the middle of `make check`."""

from __future__ import annotations

import importlib.util
import pathlib
import re
from types import ModuleType

import pytest

pytestmark = pytest.mark.unit

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"


def _quick() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_quick", BENCH / "quick.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_benchmark_is_run() -> None:
    quick = _quick()
    scripts = {p.stem for p in BENCH.glob("*.py")}
    assert scripts - quick.NOT_BENCHMARKS == set(quick.BENCHMARKS)


def test_every_flag_given_is_one_the_benchmark_declares() -> None:
    quick = _quick()
    for name, argv in quick.BENCHMARKS.items():
        declared = set(re.findall(r"""["'](--[a-z][a-z-]*)["']""", (BENCH / f"{name}.py").read_text()))
        flags = {arg for arg in argv if arg.startswith("--")}
        assert flags <= declared, (name, sorted(flags - declared))


def test_results_go_to_the_directory_given_never_over_the_recorded_ones() -> None:
    quick = _quick()
    for name, argv in quick.BENCHMARKS.items():
        if "--out" in argv:
            assert argv[argv.index("--out") + 1].startswith("{out}/"), name
        else:
            assert argv[argv.index("--name") + 1] == f"quick-{name}", name
