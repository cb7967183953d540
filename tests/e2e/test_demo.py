"""`coroner demo`, end to end, exactly as the README's first command runs it."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.procs]


def test_the_demo_runs_start_to_finish_and_cleans_up(tmp_path: pathlib.Path) -> None:
    result = subprocess.run(
        [str(pathlib.Path(sys.executable).parent / "coroner"), "demo", "--dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "(before)" in out and "(after)" in out
    after = out.split("(after)", 1)[1]
    rows = {
        line.split()[0]: line.split()
        for line in after.splitlines()
        if line.startswith(("consumer-", "reused-", "batch-"))
    }
    # Columns: NAME STATE NODE PID REASON VERDICT AGE (then, with -o wide, RETIRED HEARTBEAT ...).
    assert rows["consumer-a"][1] == "Retired" and rows["consumer-c"][1] == "Retired"
    assert rows["consumer-b"][1] == "Active" and rows["consumer-d"][1] == "Active"
    assert rows["reused-worker"][1] == "Retired"
    assert rows["batch-job"][1] == "Released"
    assert "FAIL" not in out.split("kubectl coroner doctor", 1)[1]
    assert not (tmp_path / "demo" / "cluster.json").exists(), "the demo stops the control plane it started"
