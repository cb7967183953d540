"""The probe as an unprivileged agent runs it: a non-root uid with no capabilities at all, against
root workers in pid namespaces of their own, on this kernel.

Such an agent cannot read another user's `/proc/<pid>/ns/pid` (a ptrace-mode read: EACCES), nor
`/proc/<pid>/root`. It finds a worker by the pidfd inode its launcher recorded (`coroner.pidfs`),
which `pidfd_open` + `fstat` give it without any access to the process. Each test checks its
premise on the real system first (the agent really cannot read the link).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from coroner import launcher, pidfs
from coroner.core.reasons import Evidence, Verdict

pytestmark = [
    pytest.mark.procs,
    pytest.mark.timeout(60),
    pytest.mark.skipif(os.geteuid() != 0, reason="starts workers in pid namespaces and agents as another uid"),
    pytest.mark.skipif(shutil.which("unshare") is None or shutil.which("setpriv") is None, reason="util-linux"),
]

NOBODY = 65534

#: An agent process: probes the incarnations it reads from stdin (one JSON object a line) through
#: the production probe, keeping its index and pidfd table across lines, as the agent does.
AGENT = """
import json, sys
from coroner.core import procfs
from coroner_agent.pidfds import PidfdTable
from coroner_agent.pidindex import PidIndex
from coroner_agent.probe import probe
from coroner_agent.proc import HostProcReader, LocalNode

reader, index, pidfds = HostProcReader(), PidIndex(), PidfdTable()
print(json.dumps({"uid": __import__("os").geteuid()}), flush=True)
for line in sys.stdin:
    fields = json.loads(line)
    node = LocalNode.read(node_name="node-a", reader=reader)
    result = probe(incarnation=procfs.recorded_incarnation(**fields), registration_node="node-a", node=node,
                   reader=reader, index=index, pidfds=pidfds)
    print(json.dumps({"verdict": str(result.verdict), "evidence": str(result.evidence), "detail": result.detail}),
          flush=True)
"""


class UnprivilegedAgent:
    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [
                "setpriv",
                f"--reuid={NOBODY}",
                f"--regid={NOBODY}",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--no-new-privs",
                sys.executable,
                "-c",
                AGENT,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd="/",
        )
        assert json.loads(self._line()) == {"uid": NOBODY}

    def _line(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, f"the agent exited with {self.process.wait()}"
        return line

    def probe(self, incarnation: dict[str, Any]) -> dict[str, str]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(incarnation) + "\n")
        self.process.stdin.flush()
        result: dict[str, str] = json.loads(self._line())
        return result

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture
def agents() -> Iterator[Callable[[], UnprivilegedAgent]]:
    started: list[UnprivilegedAgent] = []

    def start() -> UnprivilegedAgent:
        agent = UnprivilegedAgent()
        started.append(agent)
        return agent

    try:
        yield start
    finally:
        for agent in started:
            agent.close()


@pytest.fixture
def containers() -> Iterator[Callable[[], int]]:
    """Starts a root "container": `sleep` as pid 1 of a new pid namespace; returns its host pid."""
    started: list[subprocess.Popen[bytes]] = []

    def start() -> int:
        outer = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "sleep", "300"], start_new_session=True)
        started.append(outer)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            children = _children(outer.pid)
            if children:
                return children[0]
            time.sleep(0.01)
        raise AssertionError("the container's pid 1 did not start")

    try:
        yield start
    finally:
        for outer in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(outer.pid, signal.SIGKILL)
            outer.wait(timeout=10)


def _children(pid: int) -> list[int]:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{pid}/children") as file:
        return [int(child) for child in file.read().split()]
    return []


def recorded(host_pid: int, *, with_inode: bool = True) -> dict[str, Any]:
    """What the container's launcher records: its own pid, namespace and start time, its inode."""
    incarnation = launcher.probe_incarnation(host_pid, node_name="node-a")
    assert incarnation.pid == 1 and incarnation.pidfd_inode is not None  # premise: a child namespace, pidfs
    fields: dict[str, Any] = {
        "boot_id": incarnation.boot_id,
        "pid_namespace": incarnation.pid_namespace,
        "pid": incarnation.pid,
        "start_time": incarnation.start_time,
    }
    if with_inode:
        fields["pidfd_inode"] = incarnation.pidfd_inode
    return fields


def _unreadable_as_nobody(path: str) -> bool:
    result = subprocess.run(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            "--bounding-set=-all",
            "readlink",
            "-v",
            path,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.returncode != 0 and "Permission denied" in result.stderr


def wait_until_dead(host_pid: int) -> None:
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{host_pid}") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not os.path.exists(f"/proc/{host_pid}")


def test_an_agent_without_ptrace_access_attests_a_live_worker_by_its_pidfd_inode_and_then_its_death(
    agents: Callable[[], UnprivilegedAgent], containers: Callable[[], int]
) -> None:
    worker = containers()
    assert _unreadable_as_nobody(f"/proc/{worker}/ns/pid")  # premise: no ptrace access
    assert _unreadable_as_nobody(f"/proc/{worker}/root")
    incarnation = recorded(worker)
    agent = agents()
    alive = agent.probe(incarnation)
    assert (alive["verdict"], alive["evidence"]) == (str(Verdict.ALIVE), str(Evidence.PIDFD_PINNED)), alive
    os.kill(worker, signal.SIGKILL)
    wait_until_dead(worker)
    dead = agent.probe(incarnation)
    assert (dead["verdict"], dead["evidence"]) == (str(Verdict.DEAD), str(Evidence.PIDFD_EXITED)), dead


def test_a_container_restarted_while_an_unprivileged_agent_was_away_is_absent_by_its_pidfd_inode(
    agents: Callable[[], UnprivilegedAgent], containers: Callable[[], int]
) -> None:
    first = containers()
    incarnation = recorded(first)
    os.kill(first, signal.SIGKILL)
    wait_until_dead(first)
    second = containers()  # the restart: pid 1 again, in a new namespace (maybe under the same inode)
    assert recorded(second)["pid"] == incarnation["pid"]
    agent = agents()  # an agent that never saw the first: no pidfd held for it
    dead = agent.probe(incarnation)
    assert (dead["verdict"], dead["evidence"]) == (str(Verdict.DEAD), str(Evidence.PROC_ABSENT)), dead
    live = agent.probe(recorded(second))
    assert live["verdict"] == str(Verdict.ALIVE), live


def test_a_worker_whose_record_disagrees_with_the_process_of_its_inode_is_unknown(
    agents: Callable[[], UnprivilegedAgent], containers: Callable[[], int]
) -> None:
    """Another clock (a time namespace) or a forged record: the inode's process is not the recorded
    pid and start time. Unknown, never Alive nor Dead on the inode alone."""
    worker = containers()
    incarnation = recorded(worker) | {"start_time": recorded(worker)["start_time"] - 1}
    result = agents().probe(incarnation)
    assert (result["verdict"], result["evidence"]) == (
        str(Verdict.UNKNOWN),
        str(Evidence.INCARNATION_CONTRADICTED),
    ), result


def test_without_a_recorded_inode_an_unprivileged_agent_says_it_cannot_see_the_namespace(
    agents: Callable[[], UnprivilegedAgent], containers: Callable[[], int]
) -> None:
    """An older launcher's registration: the agent needs ns/pid links it may not read. Unknown, with
    the reason, while any process it cannot classify runs; never Dead on what it could not see."""
    worker = containers()
    containers()  # another Pod's worker: while it runs, absence by namespace cannot be read
    incarnation = recorded(worker, with_inode=False)
    alive = agents().probe(incarnation)
    assert (alive["verdict"], alive["evidence"]) == (str(Verdict.UNKNOWN), str(Evidence.PROC_UNREADABLE)), alive
    assert "pidfdInode" in alive["detail"], alive
    os.kill(worker, signal.SIGKILL)
    wait_until_dead(worker)
    gone = agents().probe(incarnation)
    assert gone["verdict"] == str(Verdict.UNKNOWN), gone


def test_the_pidfd_inode_is_one_per_process_and_the_same_through_every_pidfd() -> None:
    """The premise of it all, on this kernel: pidfs, a distinct inode per process, stable per process."""
    assert pidfs.inode_of(os.getpid()) == pidfs.inode_of(os.getpid())
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert pidfs.inode_of(child.pid) not in (None, pidfs.inode_of(os.getpid()))
    finally:
        child.kill()
        child.wait()
