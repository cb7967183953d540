"""Node loss on the agent side (no death goes unattested when a node goes away), with a real agent process, real workers (`coroner run`) and the real
API server: the drain after SIGTERM attests every death before the agent exits (and never holds
it past the grace), and a Reused registration turns Dead as soon as the process that took its pid
number exits — not at the next resync.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest
from kubernetes import client as k8s

from coroner_dev import fleet
from coroner_dev.devcluster.cluster import Cluster
from integration.test_probe_real import NAMESPACE_HELPER, PidNamespace
from support import components, kube
from support import fleet as fleet_support

pytestmark = [pytest.mark.integration, pytest.mark.procs, pytest.mark.timeout(180)]

REAL_BOOT = pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip()
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="pid namespaces and ns_last_pid need root")


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Cluster:
    """The manifests, plan-only: no operator runs here, so attestations are all there is to see."""
    components.install(cluster, grant=False)
    return cluster


@pytest.fixture
def worker_config(installed: Cluster, namespace: str) -> pathlib.Path:
    return fleet.worker_kubeconfig(installed, namespaces=[namespace])


class AgentProcess:
    def __init__(self, cluster: Cluster, directory: pathlib.Path) -> None:
        self.node = fleet.node(cluster, name=f"node-{uuid.uuid4().hex[:6]}", directory=directory, boot_id=REAL_BOOT)
        self.name = self.node.name
        self.boot_file = self.node.boot_file
        self.log = directory / f"agent-{self.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str) -> subprocess.Popen[bytes]:
        self.proc = fleet.start_agent(node=self.node, log=self.log, extra=extra)
        return self.proc

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def report(self) -> dict[str, int]:
        match = re.search(
            r"shutdown wait done .* waited=(\d+) attested=(\d+) resolvedOtherwise=(\d+) stillAlive=(\d+)", self.text()
        )
        assert match is not None, self.text()[-3000:]
        return dict(
            zip(("waited", "attested", "resolvedOtherwise", "stillAlive"), map(int, match.groups()), strict=True)
        )


@pytest.fixture
def agent(installed: Cluster, tmp_path: pathlib.Path) -> Iterator[AgentProcess]:
    made = AgentProcess(installed, tmp_path)
    try:
        yield made
    finally:
        if made.proc is not None and made.proc.poll() is None:
            made.proc.kill()
            made.proc.wait()


class Worker(fleet_support.Worker):
    @property
    def child(self) -> int:
        """The worker process itself (the launcher's child; through nsenter when in a namespace)."""
        for process in psutil.Process(self.launcher.pid).children(recursive=True):
            if process.name() == "sleep":
                return process.pid
        raise AssertionError(f"worker {self.name} has no running child")


@pytest.fixture
def launch(namespace: str, worker_config: pathlib.Path, tmp_path: pathlib.Path) -> Iterator[Callable[..., Worker]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(name: str, agent: AgentProcess, *, prefix: tuple[str, ...] = ()) -> Worker:
        argv = fleet.run_argv(
            namespace=namespace, node=agent.name, name=name, kubeconfig=worker_config,
            boot_id_file=agent.boot_file, command=("sleep", "600"), heartbeat=(2, 6),
        )  # fmt: skip
        proc = fleet.spawn([*prefix, *argv], log=tmp_path / f"worker-{name}.log", parent_death=signal.SIGKILL)
        started.append(proc)
        return Worker(proc, name)

    yield start
    for proc in started:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def attestation(admin: k8s.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return dict((kube.get_registration(admin, namespace, name).get("status") or {}).get("attestation") or {})


def verdict(admin: k8s.ApiClient, namespace: str, name: str) -> str:
    return str(attestation(admin, namespace, name).get("verdict", ""))


def wait_alive(admin: k8s.ApiClient, namespace: str, *names: str) -> None:
    for name in names:
        kube.wait_for(
            lambda n=name: kube.exists(admin, namespace, n) and verdict(admin, namespace, n) == "Alive",  # type: ignore[misc]
            timeout=30,
            what=f"{name} attested Alive",
        )


# --- the drain after SIGTERM ---------------------------------------------------------------------


def test_deaths_during_the_grace_are_attested_before_the_agent_exits(
    agent: AgentProcess, launch: Callable[..., Worker], admin: k8s.ApiClient, namespace: str
) -> None:
    proc = agent.start("--shutdown-grace-seconds=30")
    workers = {name: launch(name, agent) for name in ("killed", "terminated", "stopped-cleanly")}
    wait_alive(admin, namespace, *workers)
    proc.send_signal(signal.SIGTERM)
    kube.wait_for(lambda: "shutdown: waiting" in agent.text(), timeout=10, what="the agent to start waiting")
    time.sleep(1.0)
    assert proc.poll() is None, "it keeps serving while its workers live"
    deaths = time.monotonic()
    os.kill(workers["killed"].child, signal.SIGKILL)
    os.kill(workers["terminated"].child, signal.SIGTERM)  # to the worker, not to `coroner run`: unclean
    workers["stopped-cleanly"].launcher.send_signal(signal.SIGTERM)  # to `coroner run`: forwarded, clean
    proc.wait(timeout=30)
    exited = time.monotonic() - deaths
    assert exited < 10, f"exited {exited:.1f} s after the deaths: it should not wait out the 30 s grace"
    # Only the agent writes attestations: what is there now was written before it exited.
    for name in ("killed", "terminated"):
        found = attestation(admin, namespace, name)
        assert (found.get("verdict"), found.get("evidence")) == ("Dead", "PidfdExited"), (name, found)
        body = kube.get_registration(admin, namespace, name)
        assert components.condition(body, "Released") is None, f"{name} did not exit cleanly"
    for worker in workers.values():
        worker.launcher.wait(timeout=10)
    assert workers["terminated"].launcher.returncode == 128 + signal.SIGTERM
    assert components.condition(kube.get_registration(admin, namespace, "stopped-cleanly"), "Released") is not None
    report = agent.report()
    assert (report["waited"], report["stillAlive"]) == (3, 0), report
    # The clean exit may be attested Dead before its goodbye lands (then it counts as attested).
    assert report["attested"] >= 2 and report["attested"] + report["resolvedOtherwise"] == 3, report
    print(f"\nlast death -> agent exit: {exited:.2f} s; {report}")


def test_workers_that_never_exit_hold_the_agent_no_longer_than_the_grace(
    agent: AgentProcess, launch: Callable[..., Worker], admin: k8s.ApiClient, namespace: str
) -> None:
    proc = agent.start("--shutdown-grace-seconds=3", "--shutdown-sweep-seconds=5")
    launch("immortal", agent)
    wait_alive(admin, namespace, "immortal")
    begun = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    elapsed = time.monotonic() - begun
    assert 3.0 <= elapsed < 3.0 + 5.0, elapsed
    assert proc.returncode == 0
    assert agent.report() == {"waited": 1, "attested": 0, "resolvedOtherwise": 0, "stillAlive": 1}
    assert verdict(admin, namespace, "immortal") == "Alive"
    print(f"\nSIGTERM -> exit with a live worker and a 3 s grace: {elapsed:.2f} s")


def test_with_nothing_alive_the_agent_exits_at_once(agent: AgentProcess) -> None:
    proc = agent.start("--shutdown-grace-seconds=30")
    kube.wait_for(lambda: "agent started" in agent.text(), timeout=30, what="the agent to start")
    time.sleep(1.0)  # its first list
    begun = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert time.monotonic() - begun < 3.0
    assert agent.report()["waited"] == 0


# --- Reused turns Dead as fast as a death --------------------------------------------------------


@pytest.fixture
def pid_namespace(tmp_path: pathlib.Path) -> Iterator[PidNamespace]:
    script = tmp_path / "namespace_helper.py"
    script.write_text(NAMESPACE_HELPER)
    process = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, str(script)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        yield PidNamespace(process)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()


@needs_root
def test_a_worker_whose_number_another_process_took_is_dead_by_its_pidfd_inode_while_the_other_runs(
    agent: AgentProcess,
    launch: Callable[..., Worker],
    admin: k8s.ApiClient,
    namespace: str,
    pid_namespace: PidNamespace,
    record_property: Callable[[str, object], None],
) -> None:
    """The launcher recorded its worker's pidfd inode, which no later process can have: the dead
    worker's number held by another process is no reason to wait (no `Reused`, which registrations
    without an inode still read: tests/integration/test_probe_real.py and the simulation)."""
    pid_namespace.ask("next-pid", 100)  # any answer proves the namespace's init is up (and pids go on from 100)
    init = psutil.Process(pid_namespace.process.pid).children()[0].pid
    # The worker runs inside the namespace (as in a container) and records the pid it sees there.
    worker = launch("old", agent, prefix=("nsenter", f"--target={init}", "--pid", "--mount", "--"))
    kube.wait_for(lambda: kube.exists(admin, namespace, "old"), timeout=30, what="the registration")
    recorded = kube.get_registration(admin, namespace, "old")["spec"]["incarnation"]
    assert "pidfdInode" in recorded  # premise: this kernel has pidfs and the launcher recorded it
    number = int(recorded["pid"])
    os.kill(worker.child, signal.SIGKILL)  # no agent is running: nobody sees this exit
    worker.launcher.wait(timeout=10)
    pid_namespace.ask("next-pid", number)
    reuser = pid_namespace.ask("spawn")
    assert reuser["pid"] == number  # premise: another process holds the number now
    started = time.monotonic()
    agent.start("--resync-seconds=600", "--absence-confirm-seconds=1")
    kube.wait_for(lambda: verdict(admin, namespace, "old") == "Dead", timeout=30, interval=0.05, what="Dead")
    latency = time.monotonic() - started
    assert attestation(admin, namespace, "old")["evidence"] == "ProcAbsent"
    assert psutil.pid_exists(pid_namespace.host_pid_of(reuser["start"]))  # the other process still runs
    record_property("agent_start_to_dead_attestation_seconds", latency)
    print(f"\nagent start -> Dead (ProcAbsent by pidfd inode) with the number held: {latency:.2f} s")
