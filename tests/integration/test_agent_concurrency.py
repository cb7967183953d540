"""The agent attests a mass death concurrently: real processes, the real prober (pidfds over the
real /proc), the production Agent (watch handlers, runtime, reconciler, step, executor); only the
API is a stand-in — a port whose attestation patch is slow.

With `workers` at least the number of deaths, every Dead write is in flight at once: the port
holds each one until all of them have arrived (a barrier that a serial agent could never pass),
so the batch costs one slow round-trip, not one per death. With one worker the same deaths are
written strictly one after another. The assertions are on overlap and order, not on durations.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import pathlib
import signal
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from coroner.core.model import Key
from coroner.core.procfs import IncarnationKey
from coroner_agent.prober import ProcProber
from coroner_agent.service import Agent, AgentSettings
from integration.test_probe_real import REAL_BOOT, Node, record

pytestmark = [pytest.mark.procs, pytest.mark.timeout(120)]

DEATHS = 6
#: How long the barrier waits for the rest of the batch before letting a write through anyway (a
#: bound so that a serial agent fails the overlap assertion instead of hanging).
BARRIER_PATIENCE_SECONDS = 20.0


class SlowPort:
    """`coroner_agent.executor.AgentPort` over a dict of bodies. While `barrier` is set, each
    attestation patch waits until `barrier` patches are in flight together; `delay` slows every one."""

    def __init__(self, bodies: dict[Key, dict[str, Any]]) -> None:
        self.bodies = bodies
        self.barrier = 0
        self.delay = 0.0
        self.in_flight = 0
        self.max_in_flight = 0
        self.log: list[tuple[str, str, str]] = []
        """(start|end, name, verdict), in the order they happened."""
        self._full = asyncio.Event()

    def arm(self, *, barrier: int = 0, delay: float = 0.0) -> None:
        self.barrier, self.delay, self.max_in_flight = barrier, delay, 0
        self._full.clear()
        self.log.clear()

    async def patch_status(self, *, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        last = ops[-1]
        attestation = last["value"]["attestation"] if last["path"] == "/status" else last["value"]
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.log.append(("start", name, attestation["verdict"]))
        try:
            if self.barrier:
                if self.in_flight >= self.barrier:
                    self._full.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._full.wait(), timeout=BARRIER_PATIENCE_SECONDS)
            if self.delay:
                await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        stored = copy.deepcopy(self.bodies[(namespace, name)])
        stored["status"]["attestation"] = attestation
        stored["metadata"]["resourceVersion"] = str(int(stored["metadata"]["resourceVersion"]) + 1)
        self.bodies[(namespace, name)] = stored
        self.log.append(("end", name, attestation["verdict"]))
        return stored

    async def get_registration(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        return self.bodies.get((namespace, name))

    async def renew_lease(self, **_: Any) -> None:
        return None


def registration(name: str, incarnation: IncarnationKey, node: Node) -> dict[str, Any]:
    return {
        "apiVersion": "coroner.dev/v1alpha1",
        "kind": "WorkerRegistration",
        "metadata": {
            "name": name, "namespace": "jobs", "uid": f"uid-{name}", "resourceVersion": "1", "generation": 1,
            "creationTimestamp": "2026-11-30T17:00:00Z", "labels": {"coroner.dev/node": node.name},
        },
        "spec": {
            "nodeName": node.name,
            "incarnation": {
                "bootId": incarnation.boot_id, "pidNamespace": str(incarnation.pid_namespace),
                "pid": incarnation.pid, "startTime": str(incarnation.start_time),
            },
            "clientInstanceId": f"inst-{name}",
        },
        "status": {},
    }  # fmt: skip


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Processes that are always killed and reaped afterwards."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*argv: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(argv, start_new_session=True)
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGKILL)
            process.wait(timeout=10)


@pytest.fixture
def node(tmp_path: pathlib.Path) -> Node:
    boot_file = tmp_path / "node-a.boot_id"
    boot_file.write_text(REAL_BOOT + "\n")
    (tmp_path / "machine-id").write_text("0f2e0000000000000000000000000001\n")
    return Node(name="node-a", boot_id_file=boot_file)


async def _until(condition: Callable[[], bool], *, timeout: float = 30.0) -> None:
    """Waits for `condition` (a bound against a hang, not a timing)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def _mass_death(
    node: Node, spawn: Callable[..., Any], *, workers: int, arm: Callable[[SlowPort], None]
) -> list[tuple[str, str, str]]:
    """Starts DEATHS sleepers, lets the agent attest them Alive, arms the port, kills them all at
    once and returns the port's log of the Dead writes."""
    sleepers = {f"w{i}": spawn("sleep", "1000") for i in range(DEATHS)}
    bodies = {("jobs", name): registration(name, record(p.pid, node), node) for name, p in sleepers.items()}

    async def scenario() -> list[tuple[str, str, str]]:
        loop = asyncio.get_running_loop()
        port = SlowPort(bodies)
        agents: list[Agent] = []
        prober = ProcProber(
            node_name=node.name, proc_root="/proc", boot_id_file=str(node.boot_id_file),
            machine_id_file=str(node.boot_id_file.parent / "machine-id"), loop=loop,
            on_exit=lambda key: agents[0].on_pidfd(key),
        )  # fmt: skip
        agent = Agent(
            kube=None,  # type: ignore[arg-type]  # no watch: the list is handed over below
            prober=prober,
            settings=AgentSettings(node_name=node.name, workers=workers),
            identity="agent",
            port=port,
        )
        agents.append(agent)
        tasks = agent.workers()
        try:
            agent.on_relist([copy.deepcopy(b) for b in bodies.values()])
            await _until(lambda: sum(1 for e in port.log if e[0] == "end" and e[2] == "Alive") == DEATHS)
            arm(port)
            for process in sleepers.values():
                process.kill()
            await _until(lambda: sum(1 for e in port.log if e[0] == "end" and e[2] == "Dead") == DEATHS)
            return list(port.log)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            prober.close()

    log = asyncio.run(scenario())
    for process in sleepers.values():
        process.wait(timeout=10)
    assert {(name, verdict) for kind, name, verdict in log if kind == "end"} == {(n, "Dead") for n in sleepers}
    return log


def test_a_mass_death_is_attested_in_one_batch(node: Node, spawn: Callable[..., Any]) -> None:
    """Every Dead write is in flight before any of them is answered: one round-trip for the batch."""
    log = _mass_death(node, spawn, workers=DEATHS + 2, arm=lambda port: port.arm(barrier=DEATHS))
    kinds = [kind for kind, _, _ in log]
    assert kinds == ["start"] * DEATHS + ["end"] * DEATHS, log


def test_one_worker_attests_the_same_deaths_one_after_another(node: Node, spawn: Callable[..., Any]) -> None:
    """The control: with --workers 1 each Dead write waits for the one before it."""
    log = _mass_death(node, spawn, workers=1, arm=lambda port: port.arm(delay=0.05))
    kinds = [kind for kind, _, _ in log]
    assert kinds == ["start", "end"] * DEATHS, log


def test_the_workers_setting_bounds_the_writes_in_flight(node: Node, spawn: Callable[..., Any]) -> None:
    """Fewer workers than deaths: never more writes in flight than workers, and all of them attested."""
    seen: list[SlowPort] = []

    def arm(port: SlowPort) -> None:
        port.arm(delay=0.2)
        seen.append(port)

    _mass_death(node, spawn, workers=3, arm=arm)
    assert seen[0].max_in_flight <= 3
