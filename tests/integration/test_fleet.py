"""The fleet harness's processes: they outlive the thread that started them, and not the harness.

The kernel sends a parent-death signal when the *thread* that forked the child exits; the fault
runner starts agents from short-lived trial threads, so a naive spawn would kill them mid-run.
Real processes, no control plane.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

from coroner_dev import fleet

pytestmark = pytest.mark.skipif(fleet.shutil.which("setpriv") is None, reason="needs util-linux setpriv")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_process_spawned_from_a_thread_outlives_that_thread(tmp_path: pathlib.Path) -> None:
    started: list[subprocess.Popen[bytes]] = []
    thread = threading.Thread(target=lambda: started.append(fleet.spawn(["sleep", "30"], log=tmp_path / "s.log")))
    thread.start()
    thread.join()
    (proc,) = started
    try:
        time.sleep(0.5)  # a parent-death signal would have landed by now
        assert proc.poll() is None, f"the child died with its spawning thread (exit {proc.returncode})"
    finally:
        fleet.stop(proc)
    assert proc.returncode is not None


def test_a_process_does_not_outlive_a_killed_harness(tmp_path: pathlib.Path) -> None:
    pid_file = tmp_path / "pid"
    harness = textwrap.dedent(
        f"""
        import pathlib, threading, time
        from coroner_dev import fleet
        def start():
            proc = fleet.spawn(["sleep", "30"], log=None)
            pathlib.Path({str(pid_file)!r}).write_text(str(proc.pid))
        thread = threading.Thread(target=start)
        thread.start()
        thread.join()
        time.sleep(30)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", harness])
    try:
        deadline = time.monotonic() + 20
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the harness started nothing"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert _alive(child)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(child):
            assert time.monotonic() < deadline, "the child outlived its SIGKILLed harness"
            time.sleep(0.05)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
