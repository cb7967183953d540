"""The probe against real processes on this kernel: the claims the fake tests assume, checked.

Every test first checks its premise on the real system (that the zombie really shows `Z`, that
the forced reuse really produced the same pid) so that a kernel that behaves differently fails
loudly here instead of making a verdict test pass for the wrong reason. Every process started is
killed and reaped by a fixture finalizer; processes inside a pid namespace die with its init.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest

from coroner.core import api, procfs
from coroner.core.procfs import IncarnationKey
from coroner.core.reasons import Evidence, Verdict
from coroner_agent.pidfds import PidfdTable, PidfdWatcher
from coroner_agent.pidindex import PidIndex
from coroner_agent.probe import probe
from coroner_agent.proc import HostProcReader, LocalNode
from coroner_agent.verdict import ProbeResult

pytestmark = [pytest.mark.procs, pytest.mark.timeout(60)]

REAL_BOOT = procfs.parse_boot_id(pathlib.Path("/proc/sys/kernel/random/boot_id").read_text())
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="pid namespaces and ns_last_pid need root")
needs_unshare = pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare")


# --- fixtures: processes that are always cleaned up ----------------------------------------------


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(*argv: str, **options: Any) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(argv, start_new_session=True, **options)
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait(timeout=10)  # reaps the zombies the tests leave on purpose
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    stream.close()


@dataclasses.dataclass
class Node:
    """One simulated node: a name and a boot-id file; real /proc."""

    name: str
    boot_id_file: pathlib.Path

    @property
    def boot_id(self) -> str:
        return procfs.parse_boot_id(self.boot_id_file.read_text())

    def reboot(self) -> str:
        boot = str(uuid.uuid4())
        self.boot_id_file.write_text(boot + "\n")
        return boot


@pytest.fixture
def node(tmp_path: pathlib.Path) -> Node:
    boot_file = tmp_path / "node-a.boot_id"
    boot_file.write_text(REAL_BOOT + "\n")
    return Node(name="node-a", boot_id_file=boot_file)


class Agent:
    """What an agent process holds across probes: an index and a pidfd table."""

    def __init__(self, node: Node, *, pidfds: PidfdTable | None = None) -> None:
        self.node = node
        self.reader = HostProcReader()
        self.index = PidIndex()
        self.pidfds = pidfds if pidfds is not None else PidfdTable()

    def facts(self) -> LocalNode:
        # Re-read per probe, as the boot-id file of a simulated node may change under the test.
        return LocalNode.read(node_name=self.node.name, reader=self.reader, boot_id_file=str(self.node.boot_id_file))

    def probe(self, incarnation: IncarnationKey, *, registration_node: str | None = None) -> ProbeResult:
        return probe(
            incarnation=incarnation,
            registration_node=self.node.name if registration_node is None else registration_node,
            node=self.facts(),
            reader=self.reader,
            index=self.index,
            pidfds=self.pidfds,
        )

    def close(self) -> None:
        self.pidfds.close()


@pytest.fixture
def agents() -> Iterator[Callable[..., Agent]]:
    made: list[Agent] = []

    def make(node: Node, **options: Any) -> Agent:
        agent = Agent(node, **options)
        made.append(agent)
        return agent

    try:
        yield make
    finally:
        for agent in made:
            agent.close()


def record(pid: int, node: Node) -> IncarnationKey:
    """The incarnation as the launcher records it for its child (host view, same parser)."""
    root = pathlib.Path(f"/proc/{pid}")
    return procfs.incarnation_from(
        stat=(root / "stat").read_bytes(),
        status=(root / "status").read_bytes(),
        pid_namespace_link=os.readlink(root / "ns" / "pid"),
        boot_id=node.boot_id_file.read_text(),
        machine_id=None,
        node_name=node.name,
    ).key


def state_of(pid: int) -> tuple[str, int]:
    view = procfs.parse_stat(pathlib.Path(f"/proc/{pid}/stat").read_bytes())
    threads = procfs.parse_status(pathlib.Path(f"/proc/{pid}/status").read_bytes()).threads
    return view.state, threads


def wait_for(condition: Callable[[], bool], *, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def expect(result: ProbeResult, verdict: Verdict, evidence: Evidence) -> None:
    assert (result.verdict, result.evidence) == (verdict, evidence), result.detail


# --- Alive, Dead ----------------------------------------------------------------------------------


def test_a_live_sleep_stays_alive(
    spawn: Callable[..., subprocess.Popen[bytes]], node: Node, agents: Callable[..., Agent]
) -> None:
    sleeper = spawn("sleep", "1000")
    incarnation = record(sleeper.pid, node)
    agent = agents(node)
    for _ in range(10):
        result = agent.probe(incarnation)
        expect(result, Verdict.ALIVE, Evidence.PIDFD_PINNED)
        assert result.host_pid == sleeper.pid
        expect(agents(node).probe(incarnation), Verdict.ALIVE, Evidence.PIDFD_PINNED)  # unpinned agents too
        time.sleep(0.05)
    assert len(agent.pidfds) == 1


def test_kill_is_an_event_within_a_second(
    spawn: Callable[..., subprocess.Popen[bytes]], node: Node, record_property: Callable[[str, object], None]
) -> None:
    async def scenario() -> list[float]:
        loop = asyncio.get_running_loop()
        exits: asyncio.Queue[tuple[IncarnationKey, float]] = asyncio.Queue()
        watcher = PidfdWatcher(loop=loop, on_exit=lambda key: exits.put_nowait((key, time.perf_counter())))
        agent = Agent(node, pidfds=watcher)
        latencies = []
        try:
            for _ in range(10):
                sleeper = spawn("sleep", "1000")
                incarnation = record(sleeper.pid, node)
                expect(agent.probe(incarnation), Verdict.ALIVE, Evidence.PIDFD_PINNED)
                await asyncio.sleep(0.01)  # the reader is registered on the loop
                assert watcher.watched == 1
                killed = time.perf_counter()
                os.kill(sleeper.pid, signal.SIGKILL)
                key, fired = await asyncio.wait_for(exits.get(), timeout=1.0)
                latencies.append(fired - killed)
                assert key == incarnation
                expect(agent.probe(incarnation), Verdict.DEAD, Evidence.PIDFD_EXITED)
                sleeper.wait()
                expect(agent.probe(incarnation), Verdict.DEAD, Evidence.PIDFD_EXITED)  # reaped: still the pidfd
                watcher.release(key)
                assert watcher.watched == 0
        finally:
            watcher.close()
        return latencies

    latencies = asyncio.run(scenario())
    record_property("kill_to_pidfd_event_seconds", latencies)
    print(f"\nkill -9 -> PidfdWatcher callback: {', '.join(f'{s * 1e3:.3f}' for s in latencies)} ms")
    assert max(latencies) < 1.0, latencies


def test_a_process_reaped_before_the_probe_is_absent(
    spawn: Callable[..., subprocess.Popen[bytes]], node: Node, agents: Callable[..., Agent]
) -> None:
    sleeper = spawn("sleep", "1000")
    incarnation = record(sleeper.pid, node)
    sleeper.kill()
    sleeper.wait()
    result = agents(node).probe(incarnation)
    assert result.verdict is not Verdict.ALIVE
    # Unless another process took the number in between (then Reused), nothing holds it.
    if result.verdict is Verdict.REUSED:
        pytest.skip(f"pid {sleeper.pid} was reused by the system before the probe")
    expect(result, Verdict.DEAD, Evidence.PROC_ABSENT)


def test_an_unreaped_zombie_is_dead(
    spawn: Callable[..., subprocess.Popen[bytes]], node: Node, agents: Callable[..., Agent]
) -> None:
    sleeper = spawn("sleep", "1000")
    incarnation = record(sleeper.pid, node)
    os.kill(sleeper.pid, signal.SIGKILL)  # and no wait(): its parent (this test) does not reap it yet
    wait_for(lambda: state_of(sleeper.pid)[0] == "Z")
    assert state_of(sleeper.pid) == ("Z", 1)  # premise: a zombie, still in /proc
    result = agents(node).probe(incarnation)
    expect(result, Verdict.DEAD, Evidence.PIDFD_EXITED)
    assert result.host_pid == sleeper.pid


PTHREAD_EXIT = r"""
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
static void *worker(void *arg) {
    char buf[16];
    (void)arg;
    while (read(0, buf, sizeof buf) > 0) { }  /* runs until stdin closes */
    return NULL;
}
int main(void) {
    pthread_t thread;
    if (pthread_create(&thread, NULL, worker, NULL) != 0) return 1;
    printf("ready\n");
    fflush(stdout);
    pthread_exit(NULL);  /* the main thread leaves; the thread group lives on */
}
"""


@pytest.fixture(scope="module")
def pthread_exit_program(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("needs a C compiler for the pthread_exit program")
    directory = tmp_path_factory.mktemp("pthread-exit")
    (directory / "main.c").write_text(PTHREAD_EXIT)
    subprocess.run([gcc, "-O2", "-pthread", "-o", str(directory / "main"), str(directory / "main.c")], check=True)
    return directory / "main"


def test_a_zombie_leader_whose_threads_run_is_never_dead(
    spawn: Callable[..., subprocess.Popen[bytes]],
    node: Node,
    agents: Callable[..., Agent],
    pthread_exit_program: pathlib.Path,
) -> None:
    worker = spawn(str(pthread_exit_program), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert worker.stdout is not None and worker.stdin is not None
    assert worker.stdout.readline() == b"ready\n"
    wait_for(lambda: state_of(worker.pid) == ("Z", 2))  # premise: state Z, Threads: 2 — the trap
    incarnation = record(worker.pid, node)
    pinned = agents(node)
    for _ in range(10):
        expect(pinned.probe(incarnation), Verdict.ALIVE, Evidence.PIDFD_PINNED)
        expect(agents(node).probe(incarnation), Verdict.ALIVE, Evidence.PIDFD_PINNED)
        time.sleep(0.02)
    assert state_of(worker.pid) == ("Z", 2)
    worker.stdin.close()  # the last thread returns; the group exits; nobody reaps it yet
    wait_for(lambda: state_of(worker.pid) == ("Z", 1))
    wait_for(lambda: pinned.probe(incarnation).verdict is Verdict.DEAD, timeout=2.0)
    expect(pinned.probe(incarnation), Verdict.DEAD, Evidence.PIDFD_EXITED)
    expect(agents(node).probe(incarnation), Verdict.DEAD, Evidence.PIDFD_EXITED)


# --- pid namespaces -------------------------------------------------------------------------------

#: Runs as pid 1 of a new pid namespace; spawns, kills and forces pid reuse on request, and reports
#: what a worker there sees of itself (its pid, its pid namespace, its start time).
NAMESPACE_HELPER = r"""
import json, os, subprocess, sys, time
children = {}
def seen(pid):
    stat = open(f"/proc/{pid}/stat").read()
    return {"pid": pid, "start": stat[stat.rindex(")") + 2:].split()[19], "ns": os.readlink(f"/proc/{pid}/ns/pid")}
for line in sys.stdin:
    command, *arguments = line.split()
    if command == "spawn":
        child = subprocess.Popen(["sleep", "1000"])
        children[child.pid] = child
        reply = seen(child.pid)
    elif command == "kill":
        child = children.pop(int(arguments[0]))
        child.kill()
        child.wait()
        reply = {"reaped": child.pid}
    elif command == "next-pid":
        with open("/proc/sys/kernel/ns_last_pid", "w") as last:
            last.write(str(int(arguments[0]) - 1))
        time.sleep(0.03)  # at least one clock tick: a reused pid must get a new start time
        reply = {}
    print(json.dumps(reply), flush=True)
"""


class PidNamespace:
    """A pid namespace (with its own /proc) whose init answers commands."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process

    def ask(self, *command: object) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write((" ".join(map(str, command)) + "\n").encode())
        self.process.stdin.flush()
        reply: dict[str, Any] = json.loads(self.process.stdout.readline())
        return reply

    def spawn(self, node: Node) -> tuple[IncarnationKey, dict[str, Any]]:
        """A worker, recorded from inside, as a launcher in the namespace would record it."""
        seen = self.ask("spawn")
        return (
            procfs.recorded_incarnation(
                boot_id=node.boot_id,
                pid_namespace=procfs.parse_pid_namespace_link(seen["ns"]),
                pid=seen["pid"],
                start_time=seen["start"],
            ),
            seen,
        )

    def end(self) -> None:
        """Kills the namespace's init (and so every process in it) and waits until all are reaped,
        which frees the namespace and its inode number."""
        namespace = self.host_namespace()
        self.process.kill()  # unshare: --kill-child takes the init with it
        self.process.wait(timeout=10)
        wait_for(lambda: not any(_in_namespace(pid, namespace) for pid in _host_pids()), timeout=10)

    def host_namespace(self) -> int:
        init = psutil.Process(self.process.pid).children()[0].pid
        return procfs.parse_pid_namespace_link(os.readlink(f"/proc/{init}/ns/pid"))

    def host_pid_of(self, start_time: str) -> int:
        """Ground truth from outside (psutil, not the probe): the host pid of the worker."""
        for child in psutil.Process(self.process.pid).children(recursive=True):
            stat = pathlib.Path(f"/proc/{child.pid}/stat").read_text()
            if child.name() == "sleep" and stat[stat.rindex(")") + 2 :].split()[19] == start_time:
                return child.pid
        raise AssertionError("worker not found")


def _host_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _in_namespace(pid: int, namespace: int) -> bool:
    try:
        return procfs.parse_pid_namespace_link(os.readlink(f"/proc/{pid}/ns/pid")) == namespace
    except OSError:
        return False


@pytest.fixture
def pid_namespaces(tmp_path: pathlib.Path, spawn: Callable[..., subprocess.Popen[bytes]]) -> Callable[[], PidNamespace]:
    script = tmp_path / "namespace_helper.py"
    script.write_text(NAMESPACE_HELPER)

    def make() -> PidNamespace:
        # --kill-child: if unshare dies, so does the namespace's init, and with it every process in it.
        process = spawn(
            "unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, str(script),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        return PidNamespace(process)

    return make


@needs_root
@needs_unshare
def test_forced_pid_reuse_is_reused_never_dead_nor_alive(
    node: Node, agents: Callable[..., Agent], pid_namespaces: Callable[[], PidNamespace]
) -> None:
    namespace = pid_namespaces()
    old, _ = namespace.spawn(node)
    assert old.pid_namespace != api.ROOT_PID_NAMESPACE_INODE
    watching = agents(node)
    expect(watching.probe(old), Verdict.ALIVE, Evidence.PIDFD_PINNED)
    namespace.ask("kill", old.pid)
    namespace.ask("next-pid", old.pid)
    new, _ = namespace.spawn(node)
    assert (new.pid_namespace, new.pid) == (old.pid_namespace, old.pid)  # premise: the number was reused
    assert new.start_time != old.start_time

    result = agents(node).probe(old)
    expect(result, Verdict.REUSED, Evidence.START_TIME_DIFFERS)
    assert result.host_pid == namespace.host_pid_of(str(new.start_time))
    for _ in range(5):
        assert agents(node).probe(old).verdict is Verdict.REUSED
    expect(agents(node).probe(new), Verdict.ALIVE, Evidence.PIDFD_PINNED)
    # The agent that pinned the old incarnation knows more: its pidfd fired, whoever has the number now.
    expect(watching.probe(old), Verdict.DEAD, Evidence.PIDFD_EXITED)


@needs_root
@needs_unshare
def test_a_worker_in_its_own_pid_namespace_is_resolved_through_nspid(
    node: Node, agents: Callable[..., Agent], pid_namespaces: Callable[[], PidNamespace]
) -> None:
    first, second = pid_namespaces(), pid_namespaces()
    one, _ = first.spawn(node)
    two, _ = second.spawn(node)
    assert one.pid == two.pid and one.pid_namespace != two.pid_namespace  # both see themselves as the same pid
    agent = agents(node)
    for namespace, incarnation in ((first, one), (second, two)):
        result = agent.probe(incarnation)
        expect(result, Verdict.ALIVE, Evidence.PIDFD_PINNED)
        assert result.host_pid == namespace.host_pid_of(str(incarnation.start_time))
    first.ask("kill", one.pid)
    expect(agents(node).probe(one), Verdict.DEAD, Evidence.PROC_ABSENT)
    expect(agent.probe(one), Verdict.DEAD, Evidence.PIDFD_EXITED)
    expect(agents(node).probe(two), Verdict.ALIVE, Evidence.PIDFD_PINNED)


@needs_root
@needs_unshare
def test_a_worker_whose_pid_namespace_was_recreated_under_its_inode_and_pid_is_dead(
    node: Node, agents: Callable[..., Agent], pid_namespaces: Callable[[], PidNamespace]
) -> None:
    """A container restarted while its agent was away: the new container's pid namespace often gets
    the freed inode number, and its worker the same pid, so the recorded number is held by a live
    process of another namespace. That namespace's pid 1 started after the incarnation did, which no
    process of the incarnation's own namespace can have: that namespace, and the worker, are gone."""
    namespace = pid_namespaces()
    old, _ = namespace.spawn(node)
    namespace.end()
    for _attempt in range(200):  # the kernel hands a freed nsfs inode number to the next namespace made
        namespace = pid_namespaces()
        new, _ = namespace.spawn(node)
        if new.pid_namespace == old.pid_namespace:
            break
        namespace.end()
    else:
        pytest.fail(f"no new pid namespace got inode {old.pid_namespace} back in 200 tries")
    assert (new.pid_namespace, new.pid) == (old.pid_namespace, old.pid)  # premise: the same (inode, pid)
    assert new.start_time > old.start_time

    result = agents(node).probe(old)
    expect(result, Verdict.DEAD, Evidence.PID_NAMESPACE_RECREATED)
    assert result.host_pid == namespace.host_pid_of(str(new.start_time))
    expect(agents(node).probe(new), Verdict.ALIVE, Evidence.PIDFD_PINNED)
    # Within the one namespace a reused number stays Reused: its pid 1 is older than both.
    namespace.ask("kill", new.pid)
    namespace.ask("next-pid", new.pid)
    newer, _ = namespace.spawn(node)
    assert (newer.pid_namespace, newer.pid) == (new.pid_namespace, new.pid)
    expect(agents(node).probe(new), Verdict.REUSED, Evidence.START_TIME_DIFFERS)


# --- boots and nodes ------------------------------------------------------------------------------


def test_a_boot_id_change_is_a_boot_boundary(
    spawn: Callable[..., subprocess.Popen[bytes]], node: Node, agents: Callable[..., Agent]
) -> None:
    node.reboot()  # a boot id of its own, so the test never depends on the real one
    sleeper, survivor = spawn("sleep", "1000"), spawn("sleep", "1000")
    old, alive = record(sleeper.pid, node), record(survivor.pid, node)
    agent = agents(node)
    expect(agent.probe(old), Verdict.ALIVE, Evidence.PIDFD_PINNED)
    sleeper.kill()
    sleeper.wait()
    node.reboot()
    result = agent.probe(old)
    if result.verdict is Verdict.REUSED:
        pytest.skip(f"pid {sleeper.pid} was reused by the system before the probe")
    expect(result, Verdict.DEAD, Evidence.BOOT_BOUNDARY)
    assert len(agent.pidfds) == 0  # the pidfd of another boot was let go
    expect(agents(node).probe(old), Verdict.DEAD, Evidence.BOOT_BOUNDARY)
    # A process that matches everything but the boot id: the record or the node is wrong. Not Dead.
    expect(agents(node).probe(alive), Verdict.UNKNOWN, Evidence.INCARNATION_CONTRADICTED)


def test_two_simulated_nodes_speak_only_for_themselves(
    spawn: Callable[..., subprocess.Popen[bytes]], tmp_path: pathlib.Path, agents: Callable[..., Agent]
) -> None:
    node_a = Node(name="node-a", boot_id_file=tmp_path / "a.boot_id")
    node_b = Node(name="node-b", boot_id_file=tmp_path / "b.boot_id")
    node_a.reboot()
    node_b.reboot()
    worker = spawn("sleep", "1000")
    on_b = record(worker.pid, node_b)
    expect(agents(node_a).probe(on_b, registration_node="node-b"), Verdict.UNKNOWN, Evidence.FOREIGN_NODE)
    expect(agents(node_b).probe(on_b, registration_node="node-b"), Verdict.ALIVE, Evidence.PIDFD_PINNED)
    worker.kill()
    worker.wait()
    expect(agents(node_a).probe(on_b, registration_node="node-b"), Verdict.UNKNOWN, Evidence.FOREIGN_NODE)


def test_node_facts_of_this_machine(node: Node) -> None:
    facts = LocalNode.read(node_name=node.name, reader=HostProcReader(), boot_id_file=str(node.boot_id_file))
    assert facts.boot_id == REAL_BOOT
    assert facts.in_root_pid_namespace == (os.readlink("/proc/self/ns/pid") == f"pid:[{api.ROOT_PID_NAMESPACE_INODE}]")
    # This machine's /proc is mounted without hidepid (the hidepid test mounts its own).
    assert facts.proc_hides_processes is False
    assert facts.sees_every_process == facts.in_root_pid_namespace


# Run as nobody over a proc root the caller mounted: probes the incarnation given and prints what
# the proc root shows of it, the node's facts, and the verdict.
HIDDEN_PROBE = """
import json, os, sys
from coroner.core.procfs import IncarnationKey
from coroner_agent.pidfds import PidfdTable
from coroner_agent.pidindex import PidIndex
from coroner_agent.probe import probe
from coroner_agent.proc import HostProcReader, LocalNode

root, boot, namespace, pid, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
reader = HostProcReader(proc_root=root)
node = LocalNode.read(node_name="n", reader=reader)
incarnation = IncarnationKey(boot_id=boot, pid_namespace=namespace, pid=pid, start_time=start)
result = probe(incarnation=incarnation, registration_node="n", node=node, reader=reader, index=PidIndex(), pidfds=PidfdTable())
print(json.dumps({"shown": os.path.exists(f"{root}/{pid}"), "hides": node.proc_hides_processes,
                  "verdict": result.verdict.value, "evidence": result.evidence.value}))
"""


@needs_root
@needs_unshare
@pytest.mark.parametrize("hidepid", ["invisible", "off"])
def test_a_process_a_hidepid_proc_hides_is_not_absent(
    spawn: Callable[..., subprocess.Popen[bytes]], hidepid: str
) -> None:
    """A proc mounted with hidepid=invisible answers ENOENT for a process its reader may not ptrace,
    as it does for no process: an agent reading it (here as nobody) must not call that absence."""
    sleeper = spawn("sleep", "300")
    incarnation = procfs.incarnation_from(
        stat=pathlib.Path(f"/proc/{sleeper.pid}/stat").read_text(),
        status=pathlib.Path(f"/proc/{sleeper.pid}/status").read_text(),
        pid_namespace_link=os.readlink(f"/proc/{sleeper.pid}/ns/pid"),
        boot_id=REAL_BOOT,
        machine_id=None,
        node_name="n",
    )
    # A private mount namespace: the proc mount is gone with the command. Its mount point is one
    # nobody can reach (pytest's directories are root's only).
    mount_and_probe = (
        'mount -t proc -o "hidepid=$1" proc "$2" && shift 2 && '
        'exec setpriv --reuid=65534 --regid=65534 --clear-groups "$@"'
    )
    with tempfile.TemporaryDirectory(prefix="coroner-proc-") as root:
        os.chmod(root, 0o755)
        result = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount_and_probe, "sh", hidepid, root,
             sys.executable, "-c", HIDDEN_PROBE, root, REAL_BOOT, str(incarnation.pid_namespace), str(incarnation.pid),
             str(incarnation.start_time)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    if hidepid == "invisible":
        assert seen == {"shown": False, "hides": True, "verdict": "Unknown", "evidence": "ProcHidesProcesses"}, seen
    else:  # the control: the same reader, user and process, with nothing hidden
        assert seen == {"shown": True, "hides": False, "verdict": "Alive", "evidence": "PidfdPinned"}, seen


def test_the_index_refresh_is_incremental_on_this_machine() -> None:
    reader = HostProcReader()
    facts = LocalNode.read(node_name="n", reader=reader)
    index = PidIndex()
    index.refresh(reader=reader, proc_pid_namespace=facts.proc_pid_namespace)
    first = index.reads
    assert first >= len(index) > 0 and index.unclassified == 0
    index.refresh(reader=reader, proc_pid_namespace=facts.proc_pid_namespace)
    # Only processes started (or whose /proc inode was recycled) in between are read again.
    assert index.reads - first < max(5, first // 4)
