"""The benchmarks' measure of a child command's own peak memory (`harness.machine.timed_child`):
what the child used, not what the benchmark holds (bench/steady.py holds every registration's body
while it times `kubectl coroner plan -A`)."""

from __future__ import annotations

import pathlib
import sys

import pytest

pytestmark = pytest.mark.unit

# bench/ on the path only for this import: it holds a `faults.py` that would shadow the fault
# tests' `faults` package for every test module collected after this one.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
try:
    from harness import machine
finally:
    del sys.path[0]


def test_a_small_child_of_a_large_parent_is_measured_small() -> None:
    held = bytearray(400 * 1024 * 1024)
    for i in range(0, len(held), 4096):  # touched: resident in this process
        held[i] = 1
    seconds, peak_mb = machine.timed_child([sys.executable, "-c", "import time; time.sleep(0.3)"])
    assert seconds is not None and peak_mb is not None
    assert peak_mb < 100, f"a sleeping interpreter measured {peak_mb} MiB: the parent's 400 MiB leaked in"
    del held


def test_a_large_child_is_measured_large() -> None:
    grow = "b = bytearray(300 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1\nimport time; time.sleep(0.2)"
    _, peak_mb = machine.timed_child([sys.executable, "-c", grow])
    assert peak_mb is not None and 300 <= peak_mb < 400


def test_a_failing_child_measures_nothing() -> None:
    assert machine.timed_child([sys.executable, "-c", "raise SystemExit(3)"]) == (None, None)
