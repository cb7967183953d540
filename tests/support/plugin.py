"""Running `kubectl coroner` in tests: through the real kubectl, or in-process below argv parsing.

Each `kubectl coroner ...` process starts Python and imports the kubernetes client and the CLI (about
a second each, more on a loaded machine), which across the tests' hundred-odd calls is minutes. So
the tests that prove the kubectl path itself (discovery of the plugin on PATH, usage lines as kubectl
users see them, a terminal through kubectl, completion) run the real `kubectl coroner`; every other
test of what the commands do calls the same click group the `kubectl-coroner` console script calls
(`coroner.cli.kubectl.main`), with the same argv and environment, and gets the same result shape.

In-process, an exception that escapes the group is what a real process would print as a traceback:
it is put on stderr as one, so assertions about "one clear sentence, no traceback" still hold.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import traceback

from click.testing import CliRunner

from coroner.cli import kubectl as plugin_cli
from coroner_dev.devcluster.cluster import Cluster

#: The virtualenv's bin directory: where `pip install -e .` put `kubectl-coroner` for kubectl to find.
BIN = pathlib.Path(sys.executable).parent


def kubectl_coroner(
    cluster: Cluster, *args: str, kubeconfig: pathlib.Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``kubectl coroner ARGS --kubeconfig K`` through the real kubectl, which finds the plugin on PATH."""
    environment = {key: value for key, value in os.environ.items() if key != "KUBECONFIG"}
    environment["PATH"] = f"{BIN}{os.pathsep}{environment.get('PATH', '')}"
    environment.update(env or {})
    command = [str(cluster.binary("kubectl")), "coroner", *args, f"--kubeconfig={kubeconfig}"]
    return subprocess.run(command, capture_output=True, text=True, env=environment, timeout=120, check=False)


def in_process(
    *args: str, kubeconfig: pathlib.Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``kubectl-coroner ARGS --kubeconfig K`` as its console script runs it, in this process: the same
    click group with the same argv, KUBECONFIG unset as `kubectl_coroner` leaves it, stdout and stderr
    apart and neither a terminal."""
    argv = [*args, f"--kubeconfig={kubeconfig}"]
    runner = CliRunner()
    result = runner.invoke(plugin_cli.main, argv, env={"KUBECONFIG": None, **(env or {})}, catch_exceptions=True)
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        info = result.exc_info
        assert info is not None
        stderr += "Traceback (most recent call last):\n" + "".join(traceback.format_exception(*info)[1:])
    return subprocess.CompletedProcess(
        ["kubectl-coroner", *argv], result.exit_code, stdout=result.stdout, stderr=stderr
    )
