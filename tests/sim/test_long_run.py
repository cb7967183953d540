"""The simulation at scale: the same seeds give the same totals however the run is spread over
processes, split into chunks, stopped and resumed (bench/sim.py --resume), and with or without
the memos of pure production functions (coroner.core.memo)."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import signal
import subprocess
import sys
import time
from types import ModuleType

import pytest

from sim import run

REPO = pathlib.Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_sim", REPO / "bench" / "sim.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _totals(path: pathlib.Path) -> dict[str, object]:
    return run.totals(json.loads(path.read_text())["totals"])


def test_the_totals_do_not_depend_on_processes_or_chunks() -> None:
    one = run.parallel(5_000, 90, jobs=1, chunk=90)
    two = run.parallel(5_000, 90, jobs=2, chunk=7)
    assert one["trials"] == two["trials"] == 90
    assert run.totals(one) == run.totals(two)


def test_the_memos_of_pure_functions_change_nothing() -> None:
    seeds = range(7_000, 7_120)
    assert run.totals(run.batch(seeds, memos=True)) == run.totals(run.batch(seeds, memos=False))


def test_the_failures_kept_are_those_of_the_lowest_seeds_whatever_the_order() -> None:
    def part(*seeds: int) -> dict[str, object]:
        summary = run.empty()
        summary["failures"] = [{"seed": s, "counter": "stale_view"} for s in seeds]
        return summary

    parts = [part(*range(100, 100 + run.MAX_FAILURES)), part(3, 7), part(1)]
    forward, backward = run.empty(), run.empty()
    for p in parts:
        run.merge(forward, p)
    for p in reversed(parts):
        run.merge(backward, p)
    assert forward["failures"] == backward["failures"]
    assert [f["seed"] for f in forward["failures"]][:4] == [1, 3, 7, 100]
    assert len(forward["failures"]) == run.MAX_FAILURES


def test_a_run_stopped_and_resumed_records_what_an_unbroken_one_does(tmp_path: pathlib.Path) -> None:
    bench = _bench()
    common = ["--trials", "120", "--seed", "3000", "--chunk", "10", "--no-mutants"]
    unbroken, broken = tmp_path / "unbroken.json", tmp_path / "broken.json"
    assert bench.main([*common, "--jobs", "2", "--out", str(unbroken)]) == 0
    assert bench.main([*common, "--jobs", "1", "--max-chunks", "3", "--out", str(broken)]) == 0
    partial = json.loads(broken.read_text())
    assert (partial["trials"], partial["complete"], partial["done"]) == (30, False, [[3000, 3030]])
    assert bench.main([*common, "--jobs", "2", "--max-chunks", "5", "--resume", "--out", str(broken)]) == 0
    assert json.loads(broken.read_text())["trials"] == 80
    assert bench.main([*common, "--jobs", "2", "--resume", "--out", str(broken)]) == 0
    whole = json.loads(broken.read_text())
    assert (whole["trials"], whole["complete"], whole["done"]) == (120, True, [[3000, 3120]])
    assert len(whole["segments"]) == 3 and sum(s["trials"] for s in whole["segments"]) == 120
    assert _totals(broken) == _totals(unbroken)
    # Nothing left to run: resuming a finished record changes no total.
    assert bench.main([*common, "--resume", "--out", str(broken)]) == 0
    assert _totals(broken) == _totals(unbroken)


def test_resume_refuses_a_record_of_another_run(tmp_path: pathlib.Path) -> None:
    bench = _bench()
    out = tmp_path / "sim.json"
    assert bench.main(["--trials", "20", "--chunk", "10", "--no-mutants", "--jobs", "1", "--out", str(out)]) == 0
    with pytest.raises(SystemExit, match="--chunk 10"):
        bench.main(["--trials", "20", "--chunk", "5", "--no-mutants", "--resume", "--out", str(out)])
    with pytest.raises(SystemExit, match="not a multiple of its chunk"):
        bench.main(["--trials", "25", "--chunk", "10", "--no-mutants", "--jobs", "1", "--out", str(out)])
        bench.main(["--trials", "40", "--no-mutants", "--resume", "--out", str(out)])
    record = json.loads(out.read_text())
    record["generator"] = "another"
    out.write_text(json.dumps(record))
    with pytest.raises(SystemExit, match="another simulation"):
        bench.main(["--trials", "20", "--chunk", "10", "--no-mutants", "--resume", "--out", str(out)])


@pytest.mark.procs
def test_sigint_stops_a_long_run_keeping_exactly_the_chunks_it_finished(tmp_path: pathlib.Path) -> None:
    """A real run, interrupted as a person (or a session's end) would: what it recorded is exactly the
    sum of the chunks it lists as done, and a resume adds to it without counting any chunk twice."""
    out = tmp_path / "sim.json"
    command = [sys.executable, str(REPO / "bench" / "sim.py"), "--trials", "100000", "--seed", "9000"]
    command += ["--chunk", "10", "--jobs", "2", "--no-mutants", "--out", str(out)]
    started = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        while not out.exists() and started.poll() is None:
            time.sleep(0.05)  # polls for the first chunk's record; asserts nothing about time
        started.send_signal(signal.SIGINT)
        output, _ = started.communicate()
    finally:
        if started.poll() is None:
            started.kill()
    assert started.returncode == 0, output
    record = json.loads(out.read_text())
    assert 0 < record["trials"] < 100000 and not record["complete"]
    resumed = subprocess.run([*command, "--resume", "--max-chunks", "2"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    record = json.loads(out.read_text())
    expected = run.empty()
    for a, b in record["done"]:
        run.merge(expected, run.batch(range(a, b)))
    assert record["trials"] == expected["trials"] == sum(b - a for a, b in record["done"])
    assert run.totals(record["totals"]) == run.totals(expected)
