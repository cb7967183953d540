"""`coroner demo`: the main job, start to finish, on a real local control plane.

It starts the dev cluster, installs the production manifests, runs the operator and one agent per
simulated node as local processes, launches real workers with `coroner run`, SIGKILLs some, forces
a pid reuse in a pid namespace, lets one exit cleanly, and shows what Coroner concluded — then
stops everything it started.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from kubernetes import client as k8s
from rich.console import Console

from coroner.client.kube import api_client
from coroner.core import api
from coroner_dev import fleet
from coroner_dev.devcluster import cluster as cluster_mod

NAMESPACE = "demo"
#: batch-job, a worker on the Python API: it registers itself, works, and says goodbye (Released)
#: before it exits. A `coroner run` launcher says goodbye after its child exited, racing that exit's
#: attestation and retirement (Retired is as true an ending then; the demo shows the other one).
BATCH_JOB = """
import time
from coroner.launcher import registered
with registered(namespace={namespace!r}, node_name={node!r}, kubeconfig={kubeconfig!r}, name="batch-job", role="batch"):
    time.sleep(4)
"""

console = Console(highlight=False, width=max(100, shutil.get_terminal_size((120, 40)).columns))


def say(text: str) -> None:
    console.print(f"[bold cyan]==>[/] {text}")


class DemoError(Exception):
    """A step of the demo failed; the message says which and why."""


class Demo:
    def __init__(self, *, directory: pathlib.Path) -> None:
        self.directory = directory.resolve()
        self.work = self.directory / "demo"
        self.processes = fleet.Processes()
        self.cluster: cluster_mod.Cluster | None = None
        self.pidns: fleet.PidNamespace | None = None

    # --- plumbing ------------------------------------------------------------------------------

    def kubectl(self, *args: str, show: bool = False) -> str:
        assert self.cluster is not None
        result = fleet.kubectl(self.cluster, *args)
        if result.returncode != 0:
            raise DemoError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        if show:
            print(result.stdout.rstrip(), flush=True)  # kubectl's own table, unwrapped
        return result.stdout

    def stop_all(self) -> None:
        self.processes.stop_all()
        if self.pidns is not None:
            self.pidns.close()

    def registrations(self) -> list[dict[str, Any]]:
        assert self.cluster is not None
        with api_client(self.cluster.kubeconfig) as client:
            result = k8s.CustomObjectsApi(client).list_namespaced_custom_object(
                api.GROUP, api.VERSION, NAMESPACE, api.PLURAL
            )
        return list(result["items"])  # type: ignore[index]

    def wait_for(self, what: str, predicate: Any, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.2)
        raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")

    def by_name(self, name: str) -> dict[str, Any]:
        return next(r for r in self.registrations() if r["metadata"]["name"] == name)

    # --- the story -----------------------------------------------------------------------------

    def run(self) -> None:
        started = time.monotonic()
        say("Starting a real control plane: etcd + kube-apiserver + kube-controller-manager on loopback")
        with console.status("building (first time only) and starting the control plane ..."):
            self.cluster = fleet.up(directory=self.directory, progress=lambda m: console.print(f"    {m}"))
        console.print(f"    API server ready at {self.cluster.server} (Kubernetes v1.37.2, RBAC and admission on)")

        say(
            "Installing Coroner: kubectl apply -k manifests/overlays/production (CRD, RBAC, admission policies, retire grant)"
        )
        fleet.install(self.cluster, grant=True)

        say("Simulating two nodes on this machine, each with its own boot id, each with its own agent")
        boots = {"node-1": fleet.real_boot_id(), "node-2": None}
        self.nodes = {
            node: fleet.node(self.cluster, name=node, directory=self.work, boot_id=boot) for node, boot in boots.items()
        }
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        for name, member in self.nodes.items():
            self._start_agent(member)
            console.print(f"    {name}: boot id {member.boot_id[:8]}…, agent started with a token bound to Node {name}")

        say("Starting the operator (its ServiceAccount holds the retire verb through the retire-grant component)")
        self.processes.add(
            fleet.start_operator(
                kubeconfig=fleet.operator_kubeconfig(self.cluster),
                log=self.work / "operator.log",
                extra=("--permission-refresh-seconds=2",),
            )
        )

        say(
            "Launching real workers with `coroner run`, and batch-job on the Python API "
            "(each registers its own process incarnation)"
        )
        worker_config = fleet.worker_kubeconfig(self.cluster, namespaces=[NAMESPACE])
        launchers: dict[str, subprocess.Popen[bytes]] = {}
        plan = [
            ("consumer-a", "node-1", ["sleep", "3600"]),
            ("consumer-b", "node-1", ["sleep", "3600"]),
            ("consumer-c", "node-2", ["sleep", "3600"]),
            ("consumer-d", "node-2", ["sleep", "3600"]),
        ]
        for name, node, command in plan:
            launchers[name] = self.processes.add(
                fleet.run_worker(
                    namespace=NAMESPACE,
                    node=self.nodes[node],
                    name=name,
                    kubeconfig=worker_config,
                    log=self.work / f"worker-{name}.log",
                    command=command,
                )
            )
        # node-1 has this machine's boot id, the one `registered()` reads for the process itself.
        self.processes.add(
            fleet.spawn(
                [
                    sys.executable,
                    "-c",
                    BATCH_JOB.format(namespace=NAMESPACE, node="node-1", kubeconfig=str(worker_config)),
                ],
                log=self.work / "worker-batch-job.log",
                parent_death=signal.SIGKILL,
            )
        )
        pidns = self._start_pid_namespace_worker(worker_config, self.nodes["node-2"].boot_file)
        self.wait_for("every worker to be registered and attested Alive", lambda: self._all_alive(6), timeout=30)
        self.wait_for(
            "the operator's first decisions",
            lambda: all(self._reason(r["metadata"]["name"]) for r in self.registrations()),
            timeout=30,
        )
        console.print()
        console.print("[bold]kubectl get registrations -n demo[/]  (before)")
        self.kubectl("get", "registrations", "-n", NAMESPACE, show=True)
        console.print()

        say("pid reuse while node-2's agent restarts: reused-worker (in its own pid namespace) is killed")
        console.print("    and a stranger takes its pid number before the agent is back to see the exit")
        fleet.stop(self.agents["node-2"], timeout=30)
        self._force_pid_reuse(pidns)
        self._start_agent(self.nodes["node-2"])
        self.wait_for("reused-worker to be retired", lambda: self._retired({"reused-worker"}), timeout=30)
        console.print(
            "    node-2's agent is back: no process has the dead worker's pidfd inode, whoever holds its number now"
            " → retired (ProcAbsent); the stranger is never mistaken for it"
        )
        say("kill -9 consumer-a (node-1) and consumer-c (node-2): processes die without saying goodbye")
        killed_at = time.monotonic()
        for name in ("consumer-a", "consumer-c"):
            self._kill_worker_child(launchers[name])
        say("batch-job finishes its work, marks its registration Released, and exits")
        self.wait_for("the retirements", lambda: self._retired({"consumer-a", "consumer-c"}), timeout=30)
        console.print(
            f"    consumer-a and consumer-c were retired {time.monotonic() - killed_at:.2f} s after the kill "
            "(pidfd exit event → attestation → compare-and-swap retirement)"
        )
        self.wait_for("batch-job to be released", lambda: self._released("batch-job"), timeout=20)
        console.print()
        console.print("[bold]kubectl get registrations -n demo -o wide[/]  (after)")
        self.kubectl("get", "registrations", "-n", NAMESPACE, "-o", "wide", show=True)
        console.print()
        console.print("What happened:")
        console.print("  • consumer-a, consumer-c: STATE=Retired — their node's agent saw the exact incarnation exit.")
        console.print("  • consumer-b, consumer-d: alive, attested Alive (pinned by a pidfd) — never retired.")
        console.print("  • reused-worker: STATE=Retired although its pid number now belongs to another process: its")
        console.print("    launcher recorded the process's pidfd inode, which no other process ever has (docs/api.md).")
        console.print("  • batch-job: said goodbye before it exited (Released); nothing to retire.")
        console.print()
        say("kubectl coroner doctor")
        doctor = subprocess.run(
            [str(fleet.BIN / "kubectl-coroner"), "doctor", f"--kubeconfig={self.cluster.kubeconfig}"],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "COLUMNS": "160"},
        )
        print((doctor.stdout or doctor.stderr).rstrip(), flush=True)
        console.print()
        say(f"Done in {time.monotonic() - started:.1f} s. Logs of every process: {self.work}")

    def _all_alive(self, count: int) -> bool:
        items = self.registrations()
        alive = [r for r in items if (r.get("status") or {}).get("attestation", {}).get("verdict") == "Alive"]
        return len(items) >= count and len(alive) >= count - 1  # batch-job may already be gone

    def _retired(self, names: set[str]) -> bool:
        return all("retirement" in (self.by_name(n).get("status") or {}) for n in names)

    def _released(self, name: str) -> bool:
        conditions = (self.by_name(name).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Released" and c["status"] == "True" for c in conditions)

    def _reason(self, name: str) -> str | None:
        conditions = (self.by_name(name).get("status") or {}).get("conditions") or []
        return next((c["reason"] for c in conditions if c["type"] == "Retirable"), None)

    def _start_agent(self, node: fleet.Node) -> None:
        self.agents[node.name] = self.processes.add(
            fleet.start_agent(
                node=node,
                log=self.work / f"agent-{node.name}.log",
                # The demo restarts node-2's agent while its workers live on: no drain wait.
                extra=("--resync-seconds=5", "--shutdown-grace-seconds=0"),
                env={"POD_NAME": f"coroner-agent-{node.name}"},
            )
        )

    def _kill_worker_child(self, launcher: subprocess.Popen[bytes]) -> None:
        for child in fleet.children(launcher.pid):
            os.kill(child, signal.SIGKILL)

    def _start_pid_namespace_worker(self, worker_config: pathlib.Path, boot_file: pathlib.Path) -> fleet.PidNamespace:
        """A pid namespace whose init just waits; the worker runs inside it via nsenter."""
        self.pidns = fleet.PidNamespace()
        run = fleet.run_argv(
            namespace=NAMESPACE,
            node="node-2",
            name="reused-worker",
            kubeconfig=worker_config,
            boot_id_file=boot_file,
            command=("sleep", "3600"),
        )
        self.pidns.spawn(*run, log=self.work / "worker-reused-worker.log")
        return self.pidns

    def _force_pid_reuse(self, pidns: fleet.PidNamespace) -> None:
        number = int(self.by_name("reused-worker")["spec"]["incarnation"]["pid"])
        victim = pidns.holder(number)
        assert victim is not None, "the worker in the pid namespace is not running"
        os.kill(victim, signal.SIGKILL)
        self.wait_for("the worker to exit", lambda: pidns.holder(number) != victim, timeout=10)
        pidns.reuse(number)


def run_demo(*, directory: pathlib.Path, keep: bool) -> None:
    """Runs the demo; stops every process it started (and the control plane unless `keep`)."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        console.print("[yellow]note:[/] the pid-reuse step needs root and util-linux `unshare`")
    # Every run starts from an empty registry: stop a control plane left running by `--keep` (or by
    # the other demo in the same directory) and drop its data, so nothing of an earlier run remains.
    cluster_mod.reset(directory)
    shutil.rmtree(directory / "demo", ignore_errors=True)
    demo = Demo(directory=directory)
    try:
        demo.run()
    except (DemoError, RuntimeError) as exc:
        console.print(f"[bold red]demo failed:[/] {exc}")
        console.print(f"logs of every process it started: {demo.work}")
        raise SystemExit(1) from exc
    finally:
        demo.stop_all()
        if not keep:
            cluster_mod.down(directory)
