"""The agent's prober against real processes in a real pid namespace: when the process that took a
dead worker's pid number exits, the registration is probed again at once (the holder's pidfd) and
turns Dead by ProcAbsent — no resync involved (this test never rescans after the first probe).

Pid reuse is forced through the namespace's /proc/sys/kernel/ns_last_pid, as in test_probe_real.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from coroner.core import model
from coroner.core.model import Key
from coroner.core.procfs import IncarnationKey
from coroner.core.reasons import Evidence, Verdict
from coroner_agent.prober import ProcProber
from integration.test_probe_real import NAMESPACE_HELPER, REAL_BOOT, Node, PidNamespace, needs_root, needs_unshare

pytestmark = [pytest.mark.procs, pytest.mark.timeout(60)]


@pytest.fixture
def namespaces(tmp_path: pathlib.Path) -> Iterator[Callable[[], PidNamespace]]:
    """Pid namespaces whose init answers commands (test_probe_real's helper); all killed afterwards."""
    script = tmp_path / "namespace_helper.py"
    script.write_text(NAMESPACE_HELPER)
    started: list[subprocess.Popen[bytes]] = []

    def make() -> PidNamespace:
        process = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, str(script)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        started.append(process)
        return PidNamespace(process)

    try:
        yield make
    finally:
        for process in started:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    stream.close()


@pytest.fixture
def this_node(tmp_path: pathlib.Path) -> Node:
    boot_file = tmp_path / "node-a.boot_id"
    boot_file.write_text(REAL_BOOT + "\n")
    return Node(name="node-a", boot_id_file=boot_file)


def registration(incarnation: IncarnationKey, node: Node) -> model.Registration:
    return model.parse_registration(
        {
            "metadata": {"namespace": "jobs", "name": "old", "creationTimestamp": "2026-11-30T17:00:00Z"},
            "spec": {
                "nodeName": node.name,
                "incarnation": {
                    "bootId": incarnation.boot_id,
                    "pidNamespace": str(incarnation.pid_namespace),
                    "pid": incarnation.pid,
                    "startTime": str(incarnation.start_time),
                },
            },
        }
    )


@needs_root
@needs_unshare
def test_the_exit_of_the_process_holding_a_reused_number_re_probes_at_once(
    this_node: Node, namespaces: Callable[[], PidNamespace], record_property: Callable[[str, object], None]
) -> None:
    node = this_node
    namespace = namespaces()
    old, _ = namespace.spawn(node)
    namespace.ask("kill", old.pid)
    namespace.ask("next-pid", old.pid)
    holder, _ = namespace.spawn(node)
    assert (holder.pid_namespace, holder.pid) == (old.pid_namespace, old.pid)  # premise: the number was reused
    key: Key = ("jobs", "old")

    async def scenario() -> tuple[float, list[tuple[Verdict, Evidence]]]:
        fired: asyncio.Queue[Key] = asyncio.Queue()
        prober = ProcProber(
            node_name=node.name,
            proc_root="/proc",
            boot_id_file=str(node.boot_id_file),
            machine_id_file="/etc/machine-id",
            loop=asyncio.get_running_loop(),
            on_exit=fired.put_nowait,
        )
        try:
            prober.rescan()
            first = prober.probe(key=key, registration=registration(old, node))
            assert (first.verdict, first.evidence) == (Verdict.REUSED, Evidence.START_TIME_DIFFERS), first.detail
            assert prober.watched_reusers == 1 and len(prober.pidfds) == 1
            await asyncio.sleep(0.01)  # the holder's pidfd reader is registered on the loop
            seen: list[tuple[Verdict, Evidence]] = []
            killed = time.perf_counter()
            namespace.ask("kill", holder.pid)  # the namespace's init kills and reaps it
            while True:
                assert await asyncio.wait_for(fired.get(), timeout=1.0) == key
                outcome = prober.probe(key=key, registration=registration(old, node))
                seen.append((outcome.verdict, outcome.evidence))
                # Only Reused (the holder still a zombie: looked at again shortly) may come before Dead.
                assert outcome.verdict in (Verdict.REUSED, Verdict.DEAD), outcome.detail
                if outcome.verdict is Verdict.DEAD:
                    assert outcome.evidence is Evidence.PROC_ABSENT, outcome.detail
                    latency = time.perf_counter() - killed
                    break
            assert len(prober.pidfds) == 0, "the holder's pidfd is closed once nothing watches it"
            return latency, seen
        finally:
            prober.close()

    latency, seen = asyncio.run(scenario())
    record_property("holder_exit_to_dead_probe_seconds", latency)
    print(f"\nholder exit -> Dead (ProcAbsent) probe: {latency * 1e3:.1f} ms after {len(seen)} re-probe(s): {seen}")
    assert latency < 1.0
