"""The README's two demos, back to back in one directory, as a new user runs them: each starts from
a clean state of its own (the first's simulated Nodes would otherwise hold the second's agent
DaemonSet rollout on Pods that never schedule). Runs before the session's node cluster starts:
the real-node demo brings up nodes of its own."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tempfile

import pytest

pytestmark = pytest.mark.node


@pytest.mark.timeout(1800)  # a guard against a hang, not a timing claim
def test_make_demo_then_make_demo_real_node_in_the_same_directory() -> None:
    coroner = str(pathlib.Path(sys.executable).parent / "coroner")
    # Short: the kubelet's unix sockets live under it (108 bytes at most), as under `.cluster/demo`.
    # Left in place: a node's directory is removed only by what unmounts it.
    directory = tempfile.mkdtemp(prefix="demo-", dir="/tmp")
    for extra in ((), ("--real-node",)):
        result = subprocess.run(
            [coroner, "demo", "--dir", directory, *extra],
            capture_output=True,
            text=True,
            timeout=1500,
            check=False,
            env={**os.environ, "COLUMNS": "200"},
        )
        assert result.returncode == 0, f"coroner demo {' '.join(extra)}:\n{result.stdout}\n{result.stderr}"
