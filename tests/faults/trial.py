"""One seeded trial: workers on simulated nodes, a mix of faults, then the invariant in both directions.

A trial runs in phases on a shared `Plane`:

1. plan     workers on 2-3 nodes (survivors and victims), plus what each fault needs;
2. setup    spawn, register as the worker identity, wait until every one is attested Alive;
3. arm      each fault's pre-death part (stop an agent, revoke the grant, stall a proxy, ...);
4. strike   the victims die (SIGKILL; fault-specific deaths: forced pid reuse, zombies, 500 at once);
5. after    each fault's post-death part (API server restart, operator SIGKILL mid-write, ...);
6. observe  while the faults hold: a dead worker a fault blocks must stay active with a reason that
            fault explains; every other dead worker must be Retired within BOUND;
7. heal     each fault undone (agents healthy, grant restored, one operator, proxies passing);
8. settle   every dead worker is Retired within BOUND of the heal, unless something that is still
            true explains it (a pid still reused, a heartbeat from the future, a malformed object);
9. verify   Events and operator log lines per object, fault-specific proof that it was injected.

Throughout, an observer thread lists the trial's namespace and checks safety on every retirement it
sees: the incarnation was dead (the harness's own pidfd says so, and the retirement time is after
the harness's kill), the retirement never changes, it carries a Dead attestation for exactly its
incarnation by its own node's agent, no heartbeat committed before the decided resourceVersion
contradicts it, and it did not happen while the retire grant was revoked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import re
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.core import api
from faults import plane as plane_mod
from faults.plane import AGENT_SA, LEASE_SECONDS, OPERATOR_SA, Plane, proxied_kubeconfig
from faults.workers import (
    Heartbeater,
    PidNamespace,
    Worker,
    heartbeat,
    now_text,
    parse_time,
    read_stat,
    register,
    spawn,
    wait_child,
)
from support import components, kube

#: Liveness bound: a dead worker whose node's agent is healthy is Retired within this many seconds
#: of its death, or of the end of the fault that kept it (generous: a shared 2-core machine).
BOUND = 30.0
#: The same for 500 deaths in one second (each needs an attestation, a retirement and an Event).
MASS_BOUND = 90.0
MASS_COUNT = 500

AGENT_DOWN = frozenset({"PidAlive", "AttestationMissing", "AgentUnavailable"})
DEATH_EVIDENCE = frozenset({"PidfdExited", "ProcAbsent", "BootBoundary"})
NODE_EVIDENCE = frozenset({"NodeDeleted", "NodeOutOfService"})
RETIRED_LINE = re.compile(r"retired workerregistration=([^/\s]+)/(\S+) .*?resourceVersion=(\d+)")
SAFETY = ("live_retired", "double_retired", "bad_provenance", "admission_breaches", "retired_without_grant")
COUNTERS = (*SAFETY, "dead_left_active", "wrong_reason", "not_injected")

FAULTS: dict[str, type[Fault]] = {}


def fault(name: str) -> Callable[[type[Fault]], type[Fault]]:
    def register_(cls: type[Fault]) -> type[Fault]:
        cls.name = name
        FAULTS[name] = cls
        return cls

    return register_


# --- faults --------------------------------------------------------------------------------------


class Fault:
    """A fault's part in each phase; the defaults do nothing and block nothing."""

    name = ""
    node_local = False
    cluster_wide = False
    """It touches what every trial shares (operator, API server, grant, every proxy): it runs alone."""
    hold = 0.0
    """Seconds a blocked death must be seen preserved (e.g. until the agent Lease has expired)."""

    def __init__(self, trial: Trial, rng: random.Random, node: str | None, variant: str | None = None) -> None:
        self.trial = trial
        self.rng = rng
        self.node = node
        self.forced = variant
        self.variant = ""
        self.facts: dict[str, Any] = {}
        self.failures: list[str] = []

    @property
    def label(self) -> str:
        return f"{self.name}[{self.variant}]" if self.variant else self.name

    def pick(self, options: list[str]) -> str:
        """The variant: the forced one (``name:variant`` in a trial's fault list) or a seeded choice."""
        if self.forced is not None:
            if self.forced not in options:
                raise ValueError(f"{self.name} has no variant {self.forced!r}; it has {options}")
            return self.forced
        return self.rng.choice(options)

    def plan(self) -> None: ...
    def arm(self) -> None: ...
    def strike(self) -> None: ...
    def after(self) -> None: ...
    def heal(self) -> None: ...
    def verify(self) -> None: ...

    def blocked(self, w: Worker) -> frozenset[str] | None:
        """Reasons this fault explains for dead `w` while it holds; None: it does not keep `w`."""
        return None

    def final(self, w: Worker) -> frozenset[str] | None:
        """Reasons still explained after the heal (dead `w` may stay active with one of them)."""
        return None

    def survivor(self, w: Worker) -> frozenset[str] | None:
        """The reason a live `w` carries because of this fault (default: PidAlive)."""
        return None

    def disturbs(self, w: Worker) -> bool:
        """True: while this fault holds, `w`'s retirement may be delayed without being explained by
        one fixed reason (it is then judged after the heal only)."""
        return False

    def on_node(self, w: Worker) -> bool:
        return self.node is not None and w.node == self.node


@fault("none")
class NoFault(Fault):
    pass


@fault("pid_reuse")
class PidReuse(Fault):
    """Forced pid reuse in a pid namespace (ns_last_pid); the node's agent is down, frozen or up."""

    node_local = True

    def plan(self) -> None:
        self.variant = self.pick(["terminated", "killed", "frozen", "running"])
        self.victim = self.trial.add(self.node, "pidns", victim=True, tag="reuse", generic=False)
        self.reuser: subprocess.Popen[bytes] | None = None
        self.reuser_pid = 0

    def arm(self) -> None:
        agent = self.trial.plane.agents[self.node]
        {"terminated": agent.stop, "killed": agent.kill, "frozen": agent.freeze, "running": lambda: None}[
            self.variant
        ]()

    def strike(self) -> None:
        w = self.victim
        number = int(w.incarnation["pid"])
        assert w.pidns is not None
        w.kill()
        if not w.wait_dead():
            self.failures.append("the victim did not die")
            return
        deadline = time.monotonic() + 10
        while w.pidns.holder(number) is not None and time.monotonic() < deadline:
            time.sleep(0.01)  # nsenter reaps it
        self.reuser, self.reuser_pid = w.pidns.reuse(number)
        stat = read_stat(self.reuser_pid)
        self.facts = {"pid": number, "reuser_start": stat[1] if stat else None, "victim_start": w.start_time}
        if stat is None or stat[1] == w.start_time:
            self.failures.append(f"the reuse did not give {number} a new start time")
        self.trial.note(f"pid {number} in {w.pidns.link} reused by host pid {self.reuser_pid}")

    def after(self) -> None:
        agent = self.trial.plane.agents[self.node]
        if self.variant in ("terminated", "killed"):
            agent.start()
        elif self.variant == "frozen":
            time.sleep(self.rng.uniform(0.2, 1.5))
            agent.thaw()

    def blocked(self, w: Worker) -> frozenset[str] | None:
        if w is self.victim and self.variant in ("terminated", "killed"):
            return frozenset({"PidReuseDetected"})
        return None

    def heal(self) -> None:
        self.heal_kills_reuser = self.rng.random() < 0.5
        if self.heal_kills_reuser and self.reuser is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.reuser_pid, 9)
            self.trial.note("reuser killed: the reused number is free again")

    def final(self, w: Worker) -> frozenset[str] | None:
        if w is self.victim and read_stat(self.reuser_pid) is not None and self.variant in ("terminated", "killed"):
            return frozenset({"PidReuseDetected"})
        return None

    def verify(self) -> None:
        body = self.trial.latest(self.victim.name) or {}
        retirement = (body.get("status") or {}).get("retirement") or {}
        if self.variant in ("frozen", "running") and retirement and retirement.get("reason") != "PidfdExited":
            self.failures.append(f"a pinned exit should retire by PidfdExited, got {retirement.get('reason')}")
        self.facts["retirement"] = retirement.get("reason")


@fault("boot_id_change")
class BootIdChange(Fault):
    """A simulated reboot of a node: new boot id in its file and on the Node, agent restarted."""

    node_local = True

    def plan(self) -> None:
        self.variant = self.pick(["deaths-during", "deaths-before-and-after"])
        self.late = self.trial.add(self.node, "sleep", victim=True, tag="after-reboot", generic=False)

    def arm(self) -> None:
        self.trial.plane.agents[self.node].stop()

    def after(self) -> None:
        agent = self.trial.plane.agents[self.node]
        self.facts["old"] = agent.boot_id
        agent.boot_id = str(uuid.uuid4())
        agent.boot_file.write_text(agent.boot_id + "\n")
        self.trial.plane.retry(
            lambda: plane_mod.ensure_node(self.trial.plane.cluster, name=self.node, boot_id=agent.boot_id)
        )
        agent.start()
        self.facts["new"] = agent.boot_id
        self.trial.note(f"{self.node} rebooted: boot id {agent.boot_id}")
        time.sleep(self.rng.uniform(0.5, 2.0))
        self.late.kill()  # registered under the old boot, dies under the new one

    def survivor(self, w: Worker) -> frozenset[str] | None:
        # Processes registered under the old boot that still run are impossible after a real reboot:
        # the agent cannot tell what they are (IncarnationContradicted) and must not retire them.
        return (
            frozenset({"LivenessUnknown"}) if self.on_node(w) and w.registered_boot != self.facts.get("new") else None
        )

    def verify(self) -> None:
        for w in self.trial.dead_on(self.node):
            body = self.trial.latest(w.name) or {}
            reason = ((body.get("status") or {}).get("retirement") or {}).get("reason")
            if reason is not None and reason != "BootBoundary" and w.killed_at and w.killed_at > self.trial.armed_at:
                self.failures.append(f"{w.name} died across the reboot but was retired by {reason}")


@fault("zombie")
class Zombie(Fault):
    """A killed worker its parent never reaps (dead, state Z), and a live process whose main thread
    exited (state Z, threads running: alive); optionally the agent restarts after the death."""

    node_local = True

    def plan(self) -> None:
        self.variant = self.pick(["agent-up", "agent-restarted"])
        self.dead = self.trial.add(self.node, "zombie", victim=True, tag="zombie", generic=False)
        self.leader = self.trial.add(self.node, "zombie_leader", victim=False, tag="zombie-leader", generic=False)

    def arm(self) -> None:
        if self.variant == "agent-restarted":
            self.trial.plane.agents[self.node].stop()

    def strike(self) -> None:
        self.dead.kill()
        self.dead.wait_dead()
        time.sleep(0.05)
        stat = read_stat(self.dead.host_pid)
        self.facts["state_after_kill"] = stat[0] if stat else None
        if stat is None or stat[0] != "Z":
            self.failures.append(f"the killed child is not an unreaped zombie (stat {stat})")

    def after(self) -> None:
        if self.variant == "agent-restarted":
            self.trial.plane.agents[self.node].start()

    def heal(self) -> None:
        stat = read_stat(self.leader.host_pid)
        self.facts["leader_state_before_heal"] = stat[0] if stat else None
        if not self.leader.alive():
            self.failures.append("the zombie leader died on its own")
        self.leader.kill()  # now it is dead for real: it must be retired within BOUND
        self.trial.note("zombie leader killed")

    def verify(self) -> None:
        stat = read_stat(self.dead.host_pid)
        self.facts["state_at_end"] = stat[0] if stat else None


class _AgentDown(Fault):
    node_local = True
    hold = LEASE_SECONDS + 2.0

    def blocked(self, w: Worker) -> frozenset[str] | None:
        return AGENT_DOWN if self.on_node(w) else None


@fault("agent_sigkill")
class AgentSigkill(_AgentDown):
    def arm(self) -> None:
        self.trial.plane.agents[self.node].kill()

    def heal(self) -> None:
        self.trial.plane.agents[self.node].start()


@fault("agent_sigstop")
class AgentSigstop(_AgentDown):
    def arm(self) -> None:
        self.trial.plane.agents[self.node].freeze()

    def heal(self) -> None:
        self.trial.plane.agents[self.node].thaw()


@fault("agent_partition")
class AgentPartition(_AgentDown):
    """The agent cut off from the API server by its proxy: connections reset, or blackholed."""

    def plan(self) -> None:
        self.variant = self.pick(["drop", "stall"])

    def arm(self) -> None:
        self.trial.plane.agents[self.node].proxy.set_mode(self.variant)

    def heal(self) -> None:
        self.trial.plane.agents[self.node].proxy.set_mode("pass")


@fault("agent_restart")
class AgentRestart(Fault):
    """SIGTERM (shutdown sweep) and start again, with deaths just before or during the gap."""

    node_local = True

    def plan(self) -> None:
        self.variant = self.pick(["deaths-while-down", "deaths-then-restart"])

    def arm(self) -> None:
        if self.variant == "deaths-while-down":
            self.trial.plane.agents[self.node].stop()

    def after(self) -> None:
        agent = self.trial.plane.agents[self.node]
        if self.variant == "deaths-then-restart":
            agent.stop()
        agent.start()


@fault("agent_clock_skew")
class AgentClockSkew(Fault):
    """The agent's wall clock ±5 min: skewed observedTime and Lease renewTime."""

    node_local = True

    def plan(self) -> None:
        self.variant = self.pick(["+300", "-300"])

    def arm(self) -> None:
        agent = self.trial.plane.agents[self.node]
        agent.stop()
        agent.start(skew=float(self.variant))
        agent.wait_started()
        time.sleep(1.0)  # its first relist and probes

    def blocked(self, w: Worker) -> frozenset[str] | None:
        # 5 min behind: its Lease is born expired, so its Dead attestations wait for a live agent.
        return frozenset({"AgentUnavailable"}) if self.variant == "-300" and self.on_node(w) else None

    @property
    def hold(self) -> float:  # type: ignore[override]
        return 3.0 if self.variant == "-300" else 0.0

    def heal(self) -> None:
        agent = self.trial.plane.agents[self.node]
        agent.stop()
        agent.start()

    def verify(self) -> None:
        lease = self.trial.plane.retry(
            lambda: k8s.CoordinationV1Api(self.trial.plane.admin).read_namespaced_lease(
                f"{api.AGENT_LEASE_PREFIX}{self.node}", api.SYSTEM_NAMESPACE
            )
        )
        self.facts["lease_renew_after_heal"] = str(lease.spec.renew_time)


@fault("worker_clock_skew")
class WorkerClockSkew(Fault):
    """Heartbeats written ±5 min off by the workers of one node."""

    node_local = True

    def plan(self) -> None:
        self.variant = self.pick(["+300", "-300"])
        for w in self.trial.workers:
            if w.node == self.node and w.kind in ("sleep", "pidns"):
                w.skew = float(self.variant)
                w.tags.add("skewed")

    def arm(self) -> None:
        for w in self.trial.workers:
            if w.skew and w.registered:
                heartbeat(w, client=self.trial.plane.worker_client, namespace=self.trial.namespace)

    def blocked(self, w: Worker) -> frozenset[str] | None:
        # A heartbeat from the future is never expiry: the design waits until it is in the past.
        return frozenset({"HeartbeatNotExpired"}) if self.variant == "+300" and w.skew > 0 else None

    def final(self, w: Worker) -> frozenset[str] | None:
        return self.blocked(w)


@fault("operator_sigkill")
class OperatorSigkill(Fault):
    """SIGKILL the operator in the middle of a burst of retirements, then start a new one."""

    cluster_wide = True

    def plan(self) -> None:
        self.variant = self.pick(["at-first-retirement", "random-delay"])
        for i in range(self.rng.randint(6, 12)):
            self.trial.add(self.trial.rng.choice(self.trial.nodes), "sleep", victim=True, tag=f"burst{i}")

    def after(self) -> None:
        plane = self.trial.plane
        log = plane.operator.log
        if self.variant == "at-first-retirement":
            needle = f"retired workerregistration={self.trial.namespace}/"
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and needle not in log.read_text(errors="replace"):
                time.sleep(0.005)
        else:
            time.sleep(self.rng.uniform(0.0, 0.6))
        plane.kill_operator()
        self.trial.note("operator SIGKILLed")
        time.sleep(self.rng.uniform(0.0, 2.0))
        plane.start_operator()


@fault("two_operators")
class TwoOperators(Fault):
    """A second operator replica racing the first over a burst of deaths."""

    cluster_wide = True

    def plan(self) -> None:
        for i in range(self.rng.randint(8, 16)):
            self.trial.add(self.trial.rng.choice(self.trial.nodes), "sleep", victim=True, tag=f"burst{i}")

    def arm(self) -> None:
        self.second = self.trial.plane.start_operator()
        deadline = time.monotonic() + 60
        while "operator started" not in self.second.log.read_text(errors="replace"):
            if time.monotonic() > deadline:
                self.failures.append("the second operator did not start")
                return
            time.sleep(0.05)
        time.sleep(1.0)  # its watches are listed once its startup handler has run

    def heal(self) -> None:
        self.trial.plane.ensure_one_operator()

    def verify(self) -> None:
        text = "".join(p.read_text(errors="replace") for p in self.trial.plane.operator_logs[-2:])
        self.facts["cas_conflicts"] = text.count(f"retire conflict workerregistration={self.trial.namespace}/")


@fault("apiserver_restart")
class ApiserverRestart(Fault):
    """The kube-apiserver stopped (SIGTERM or a crash) and started again on the same port, right
    after the deaths (retirements race the outage) or before them (the outage is over first)."""

    cluster_wide = True

    def plan(self) -> None:
        self.variant = self.pick(["graceful", "crash", "graceful-before-deaths", "crash-before-deaths"])

    def _restart(self) -> None:
        down = self.trial.plane.restart_apiserver(graceful=self.variant.startswith("graceful"))
        self.facts["seconds"] = round(down, 2)
        self.trial.note(f"kube-apiserver restarted in {down:.1f} s")

    def arm(self) -> None:
        if self.variant.endswith("before-deaths"):
            self._restart()
            time.sleep(3.0)  # clients reconnect and the new server settles before anyone dies

    def after(self) -> None:
        if not self.variant.endswith("before-deaths"):
            self._restart()


@fault("watch_expiry")
class WatchExpiry(Fault):
    """Watches resumed from a resourceVersion the API server no longer has: 410 Gone.

    Every component's proxy blackholes its connections while the API server restarts (its watch
    cache starts afresh, at a newer resourceVersion), workers die meanwhile, then each in-flight watch
    is ended cleanly, as the server's timeoutSeconds would end it: the components resume from the
    last resourceVersion they saw and the real API server answers 410 (counted by the proxies).
    """

    cluster_wide = True

    def plan(self) -> None:
        self.variant = self.pick(["graceful", "crash"])
        self.outage = [
            self.trial.add(
                self.trial.rng.choice(self.trial.nodes), "sleep", victim=True, tag=f"outage{i}", generic=False
            )
            for i in range(2)
        ]

    def after(self) -> None:
        plane = self.trial.plane
        proxies = [a.proxy for a in plane.agents.values()] + [plane.operator_proxy]
        before = {p.name: p.snapshot() for p in proxies}
        modes = {p.name: p.mode for p in proxies}  # a partitioned agent stays partitioned
        for p in proxies:
            p.set_mode("stall")
        time.sleep(0.3)
        down = plane.restart_apiserver(graceful=self.variant == "graceful", during=self._deaths)
        time.sleep(2.0)  # the new server settles (its storage initializes) before clients resume
        ended = sum(p.end_watches() for p in proxies)
        for p in proxies:
            p.set_mode(modes[p.name])
        self.trial.note(f"watches ended cleanly: {ended}; API server down {down:.1f} s")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            gone = {p.name: p.snapshot().get("gone_410", 0) - before[p.name].get("gone_410", 0) for p in proxies}
            if gone.get("operator", 0) > 0 and sum(gone.values()) > gone.get("operator", 0):
                break
            time.sleep(0.2)
        self.facts = {"watches_ended": ended, "gone_410": gone, "seconds": round(down, 2)}

    def _deaths(self) -> None:
        for w in self.outage:
            w.kill()

    def verify(self) -> None:
        gone = self.facts.get("gone_410", {})
        if not gone.get("operator"):
            self.failures.append(f"the operator never received a 410 (proxies saw {gone})")
        if not any(v for k, v in gone.items() if k != "operator"):
            self.failures.append(f"no agent received a 410 (proxies saw {gone})")


@fault("heartbeat_race")
class HeartbeatRace(Fault):
    """Heartbeats still landing after the death, racing the attestation and the retirement; one
    worker is a real `coroner run` launcher whose own heartbeat thread races its child's death."""

    def plan(self) -> None:
        self.racer = self.trial.add(
            self.trial.rng.choice(self.trial.nodes), "sleep", victim=True, tag="racer", generic=False, interval=1, ttl=3
        )
        self.launched = self.trial.add(
            self.trial.rng.choice(self.trial.nodes),
            "launcher",
            victim=True,
            tag="launcher",
            generic=False,
            interval=1,
            ttl=3,
        )

    def strike(self) -> None:
        self.racer.kill()
        self.launched.kill()
        trial = self.trial
        racer = self.racer

        def race() -> None:
            for _ in range(self.rng.randint(1, 5)):
                time.sleep(self.rng.uniform(0.0, 0.4))
                with contextlib.suppress(Exception):
                    heartbeat(racer, client=trial.plane.worker_client, namespace=trial.namespace)
            self.last_beat = time.time()

        self.last_beat = time.time()
        self.thread = threading.Thread(target=race, daemon=True)
        self.thread.start()

    def after(self) -> None:
        self.thread.join(timeout=10)

    def verify(self) -> None:
        self.facts["racing_heartbeats"] = len(self.racer.heartbeats)
        self.facts["reasons_seen"] = sorted(set(self.racer.reasons_seen))


@fault("foreign_attestation")
class ForeignAttestation(Fault):
    """Node A's agent identity speaking for node B: a misconfigured real agent process
    (--node-name B with A's node-bound token), and direct writes with A's token."""

    node_local = True  # self.node is B, the victim node; A is another node

    def plan(self) -> None:
        others = [n for n in self.trial.plane.agents if n != self.node]
        self.source = self.rng.choice(others)
        self.variant = "rogue-agent+direct"
        self.trial.add(self.node, "sleep", victim=False, tag="foreign-target", generic=False)

    def arm(self) -> None:
        plane = self.trial.plane
        source = plane.agents[self.source]
        self.pod = f"rogue-{self.source}-as-{self.node}"
        self.rogue_log = plane.work / f"{self.pod}.log"
        argv = components.agent_argv(
            source.token,
            node=self.node,
            boot_id_file=source.boot_file,
            extra=("--resync-seconds=2", f"--lease-duration-seconds={LEASE_SECONDS}", "--renew-seconds=1"),
        )
        self.rogue = plane_mod._spawn(argv, log=self.rogue_log, env={"POD_NAME": self.pod})
        self.trial.rogue_pods.add(self.pod)
        refused, accepted = self.trial.refusals(self._attempts(plane))
        self.facts.update(refused=refused, accepted=accepted, lease_holders=[])
        # Let the misconfigured agent run until it has tried both: attesting node B's registrations
        # and renewing node B's agent Lease (refused by coroner-agent-renews-own-lease-only since
        # finding 2 was fixed; before, it took the Lease over, and this waited for that).
        lease_name = f"{api.AGENT_LEASE_PREFIX}{self.node}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                holder = (
                    k8s.CoordinationV1Api(plane.admin)
                    .read_namespaced_lease(lease_name, api.SYSTEM_NAMESPACE)
                    .spec.holder_identity
                )
                if holder not in self.facts["lease_holders"]:
                    self.facts["lease_holders"].append(holder)
            log = self.rogue_log.read_text(errors="replace")
            if "attest failed" in log and ("lease renewal failed" in log or self.pod in self.facts["lease_holders"]):
                break
            time.sleep(0.2)

    def _attempts(self, plane: Plane) -> list[tuple[str, Callable[[], Any]]]:
        target = next(w for w in self.trial.workers if w.node == self.node and w.registered)
        own = next((w for w in self.trial.workers if w.node == self.source and w.registered), None)
        client = plane.agent_client(self.source)
        ns = self.trial.namespace
        body = kube.get_registration(plane.admin, ns, target.name)
        forged = components.attestation(body, verdict="Dead", evidence="ProcAbsent", node=self.node)
        forged["agent"]["podName"] = self.pod
        attempts: list[tuple[str, Callable[[], Any]]] = [
            (
                "attest another node (merge)",
                lambda: kube.patch_status(client, ns, target.name, {"status": {"attestation": forged}}),
            ),
            (
                "attest another node (json)",
                lambda: kube.patch_status(
                    client, ns, target.name, [{"op": "add", "path": "/status/attestation", "value": forged}]
                ),
            ),
        ]
        if own is not None:
            attempts += [
                (
                    "agent writes a heartbeat",
                    lambda: kube.patch_status(client, ns, own.name, {"status": {"lastHeartbeatTime": now_text()}}),
                ),
                (
                    "agent writes a retirement",
                    lambda: kube.patch_status(
                        client,
                        ns,
                        own.name,
                        {
                            "status": {
                                "retirement": {"retiredTime": now_text(), "retiredBy": "agent", "reason": "ProcAbsent"}
                            }
                        },
                    ),
                ),
            ]
        return attempts

    def disturbs(self, w: Worker) -> bool:
        return self.on_node(w)  # the rogue renews this node's agent Lease with its own boot id

    def heal(self) -> None:
        plane_mod._terminate(self.rogue)
        text = self.rogue_log.read_text(errors="replace")
        self.facts["rogue_attest_refusals"] = text.count("attest failed")
        self.facts["rogue_forbidden"] = text.count("Forbidden") + text.count("403")
        self.facts["rogue_renewed_lease"] = self.pod in self.facts["lease_holders"]
        if self.facts["rogue_renewed_lease"]:
            self.trial.violation("admission_breaches", None, f"{self.pod} renewed {self.node}'s agent Lease")

    def verify(self) -> None:
        if self.facts.get("accepted"):
            self.failures.append(f"accepted: {self.facts['accepted']}")
        if not self.facts.get("rogue_attest_refusals"):
            self.failures.append("the misconfigured agent never tried to attest (nothing was refused)")
        if "lease renewal failed" not in self.rogue_log.read_text(errors="replace"):
            self.failures.append("the misconfigured agent never tried to renew the other node's Lease")


@fault("worker_attestation")
class WorkerAttestation(Fault):
    """The worker identity tries to write what only the agent (attestation) or a holder of retire
    (retirement) or the operator (Attested/Retirable) may write."""

    def arm(self) -> None:
        plane = self.trial.plane
        ns = self.trial.namespace
        live = next(w for w in self.trial.workers if not w.victim and w.registered and w.kind in ("sleep", "pidns"))
        dead = next(w for w in self.trial.workers if w.victim and w.generic and w.kind in ("sleep", "pidns"))
        client = plane.worker_client

        def attempts_for(w: Worker) -> list[tuple[str, Callable[[], Any]]]:
            body = kube.get_registration(plane.admin, ns, w.name)
            forged = components.attestation(body, verdict="Dead", evidence="PidfdExited")
            retirable = [
                {
                    "type": "Retirable",
                    "status": "True",
                    "reason": "EligibleStaleOrphan",
                    "message": "me",
                    "lastTransitionTime": now_text()[:19] + "Z",
                }
            ]
            return [
                (
                    f"worker attests {w.name}",
                    lambda: kube.patch_status(client, ns, w.name, {"status": {"attestation": forged}}),
                ),
                (
                    f"worker retires {w.name}",
                    lambda: kube.patch_status(
                        client,
                        ns,
                        w.name,
                        {
                            "status": {
                                "retirement": {
                                    "retiredTime": now_text(),
                                    "retiredBy": "worker",
                                    "reason": "PidfdExited",
                                }
                            }
                        },
                    ),
                ),
                (
                    f"worker sets Retirable on {w.name}",
                    lambda: kube.patch_status(
                        client, ns, w.name, [{"op": "add", "path": "/status/conditions", "value": retirable}]
                    ),
                ),
            ]

        self.pending = attempts_for(dead)
        refused, accepted = self.trial.refusals(attempts_for(live))
        self.facts.update(refused=refused, accepted=accepted)

    def strike(self) -> None:
        refused, accepted = self.trial.refusals(self.pending)  # right as the victims die
        self.facts["refused"] += refused
        self.facts["accepted"] += accepted

    def verify(self) -> None:
        if self.facts.get("accepted"):
            self.failures.append(f"accepted: {self.facts['accepted']}")


@fault("grant_revoked")
class GrantRevoked(Fault):
    """kubectl delete clusterrolebinding coroner-operator-retire, mid-run; restored at the heal."""

    cluster_wide = True

    hold = 2.0

    def arm(self) -> None:
        plane = self.trial.plane
        plane.revoke_grant()
        deadline = time.monotonic() + 15
        while plane.retry(lambda: plane.operator_may_retire(self.trial.namespace)):
            if time.monotonic() > deadline:
                self.failures.append("the revocation did not take effect")
                break
            time.sleep(0.1)
        self.trial.grant_revoked = (time.time(), None)

    def blocked(self, w: Worker) -> frozenset[str] | None:
        return frozenset({"RetirePermissionMissing"})

    def heal(self) -> None:
        revoked_at = self.trial.grant_revoked[0] if self.trial.grant_revoked else time.time()
        self.trial.grant_revoked = (revoked_at, time.time())
        self.trial.plane.restore_grant()


@fault("mass_death")
class MassDeath(Fault):
    """500 workers (real `sleep` processes) SIGKILLed within one second."""

    cluster_wide = True

    def plan(self) -> None:
        self.count = self.trial.mass_count
        self.victims = [
            self.trial.add(
                self.trial.nodes[i % len(self.trial.nodes)],
                "sleep",
                victim=True,
                tag=f"mass{i}",
                generic=False,
                interval=10,
                ttl=30,
                heartbeating=False,
            )
            for i in range(self.count)
        ]

    def strike(self) -> None:
        started = time.time()
        for w in self.victims:
            w.kill(reap=False)
        spread = time.time() - started
        for w in self.victims:
            w.reap()
        self.facts["kill_spread_seconds"] = round(spread, 3)
        if spread > 1.0:
            self.failures.append(f"the kills took {spread:.2f} s, not under one second")

    def verify(self) -> None:
        lat = sorted(
            w.retired_seen_at - w.killed_at  # type: ignore[operator]
            for w in self.victims
            if w.retired_seen_at is not None and w.killed_at is not None
        )
        if lat:
            self.facts["retired"] = len(lat)
            self.facts["p50_s"] = round(lat[len(lat) // 2], 2)
            self.facts["max_s"] = round(lat[-1], 2)


@fault("malformed")
class Malformed(Fault):
    """Hand-made objects: a garbled heartbeat, an identity the launcher never minted, and ones
    admission must refuse (label disagreeing with spec.nodeName, a non-numeric start time)."""

    def plan(self) -> None:
        node = self.trial.rng.choice(self.trial.nodes)
        self.garbled = self.trial.add(node, "sleep", victim=True, tag="garbled", heartbeating=False)
        self.untrusted = self.trial.add(node, "sleep", victim=True, tag="untrusted", client_instance_id="handmade-1")

    def arm(self) -> None:
        plane, ns = self.trial.plane, self.trial.namespace
        kube.patch_status(
            plane.worker_client, ns, self.garbled.name, {"status": {"lastHeartbeatTime": "yesterday-ish"}}
        )
        self.garbled.heartbeats.append(("yesterday-ish", 0))
        good = self.untrusted.incarnation
        other = next(n for n in plane.agents if n != self.untrusted.node)

        def body(name: str, label: str, inc: dict[str, Any]) -> dict[str, Any]:
            return {
                "apiVersion": api.API_VERSION,
                "kind": api.KIND,
                "metadata": {"name": name, "labels": {api.NODE_LABEL: label}},
                "spec": {
                    "nodeName": self.untrusted.node,
                    "incarnation": inc,
                    "clientInstanceId": f"inst-{name}",
                    "heartbeat": {"intervalSeconds": 2, "ttlSeconds": 6},
                },
            }

        attempts = [
            (
                "label disagrees with spec.nodeName",
                lambda: kube.create_registration(plane.worker_client, ns, body("mislabeled", other, good)),
            ),
            (
                "non-numeric startTime",
                lambda: kube.create_registration(
                    plane.worker_client, ns, body("nonnumeric", self.untrusted.node, {**good, "startTime": "12a"})
                ),
            ),
        ]
        refused, accepted = self.trial.refusals(attempts, statuses=(403, 422))
        self.facts.update(refused=refused, accepted=accepted)

    def blocked(self, w: Worker) -> frozenset[str] | None:
        if w is self.garbled:
            return frozenset({"UnparsableHeartbeat"})
        if w is self.untrusted:
            return frozenset({"UntrustedIdentityProvenance"})
        return None

    def final(self, w: Worker) -> frozenset[str] | None:
        return self.blocked(w)

    def survivor(self, w: Worker) -> frozenset[str] | None:
        return self.blocked(w)

    def verify(self) -> None:
        if self.facts.get("accepted"):
            self.failures.append(f"accepted: {self.facts['accepted']}")


@fault("selftest")
class SelfTest(Fault):
    """Not a fault of the model: breaks the invariant on purpose (as the cluster admin, who holds
    every verb) so that a test can prove each detector fires. Never drawn by the bench."""

    def arm(self) -> None:
        plane, ns = self.trial.plane, self.trial.namespace
        live = next(w for w in self.trial.workers if not w.victim and w.registered and w.kind in ("sleep", "pidns"))
        body = kube.get_registration(plane.admin, ns, live.name)
        status = body.get("status") or {}
        retirement = {
            "retiredTime": now_text(),
            "retiredBy": "kubernetes-admin",
            "reason": "PidfdExited",
            "decision": "EligibleStaleOrphan",
            "attestation": status.get("attestation"),
        }
        kube.patch_status(
            plane.admin,
            ns,
            live.name,
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": body["metadata"]["resourceVersion"]},
                {"op": "add", "path": "/status/retirement", "value": retirement},
            ],
        )
        for _ in range(2):  # two Retired Events for one object
            event = k8s.CoreV1Event(
                metadata=k8s.V1ObjectMeta(name=f"{live.name}.{uuid.uuid4().hex[:8]}", namespace=ns),
                involved_object=k8s.V1ObjectReference(
                    api_version=api.API_VERSION,
                    kind=api.KIND,
                    name=live.name,
                    namespace=ns,
                    uid=body["metadata"]["uid"],
                ),
                reason="Retired",
                message="selftest",
                type="Normal",
            )
            k8s.CoreV1Api(plane.admin).create_namespaced_event(ns, event)
        # A dead worker on a node no agent serves: it can only stay active.
        self.ghost = self.trial.add(f"ghost-{uuid.uuid4().hex[:6]}", "sleep", victim=True, tag="ghost")
        spawn(self.ghost)
        register(
            self.ghost,
            client=plane.worker_client,
            namespace=ns,
            boot_id_file=plane.agents[self.trial.nodes[0]].boot_file,
        )


# --- the trial -----------------------------------------------------------------------------------


@dataclasses.dataclass
class TrialResult:
    seed: int
    faults: list[str]
    labels: list[str]
    namespace: str
    seconds: float = 0.0
    counts: Counter[str] = dataclasses.field(default_factory=Counter)
    reasons: dict[str, Counter[str]] = dataclasses.field(default_factory=dict)
    evidence: dict[str, Counter[str]] = dataclasses.field(default_factory=dict)
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)
    violations: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    workers: int = 0
    deaths: int = 0
    latencies: list[float] = dataclasses.field(default_factory=list)
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    """Seconds spent in each phase (where a trial's time goes, for the long run's throughput)."""

    @property
    def ok(self) -> bool:
        return not any(self.counts[c] for c in COUNTERS)

    def summary(self) -> str:
        bad = {c: self.counts[c] for c in COUNTERS if self.counts[c]}
        return f"seed={self.seed} faults={self.labels} {self.seconds:.1f}s workers={self.workers} {bad or 'ok'}"


class Trial:
    def __init__(
        self,
        plane: Plane,
        *,
        seed: int,
        faults: list[str],
        index: int = 0,
        mass_count: int = MASS_COUNT,
        poll_interval: float = 0.3,
        pool: list[str] | None = None,
        bound: float = BOUND,
        mass_bound: float = MASS_BOUND,
    ) -> None:
        self.plane = plane
        self.bound = bound
        self.mass_bound = mass_bound
        self.seed = seed
        self.rng = random.Random(seed)
        self.namespace = f"ft{index}-{seed % 100000}-{os.urandom(2).hex()}"
        self.mass_count = mass_count
        self.poll_interval = poll_interval
        self.workers: list[Worker] = []
        self.by_name: dict[str, Worker] = {}
        self.pidns: dict[str, PidNamespace] = {}
        self.rogue_pods: set[str] = set()
        self.grant_revoked: tuple[float, float | None] | None = None
        self.timeline: list[str] = []
        self.started = time.monotonic()
        self.armed_at = 0.0
        self._latest: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        node_names = list(pool or plane.agents)
        self.pool = node_names
        unknown = [f for f in faults if f.partition(":")[0] not in FAULTS]
        if unknown:
            raise ValueError(f"unknown faults {unknown}; known: {sorted(FAULTS)}")
        local = [f for f in faults if FAULTS[f.partition(":")[0]].node_local]
        count = max(len(local), self.rng.choice([2, 3]) if len(node_names) >= 3 else 2)
        if len(local) > len(node_names):
            raise ValueError(f"{len(local)} node-local faults need as many nodes; the plane has {len(node_names)}")
        self.nodes = self.rng.sample(node_names, k=min(count, len(node_names)))
        free = list(self.nodes)
        self.rng.shuffle(free)
        self.faults: list[Fault] = []
        for spec in faults:
            name, _, variant = spec.partition(":")
            node = free.pop() if FAULTS[name].node_local else None
            self.faults.append(FAULTS[name](self, random.Random(self.rng.getrandbits(32)), node, variant or None))
        self.result = TrialResult(seed=seed, faults=list(faults), labels=[], namespace=self.namespace)

    # --- helpers used by faults ------------------------------------------------------------------

    def note(self, text: str) -> None:
        self.timeline.append(f"{time.monotonic() - self.started:7.2f}s {text}")

    def add(
        self,
        node: str | None,
        kind: str,
        *,
        victim: bool,
        tag: str,
        generic: bool = True,
        interval: int | None = None,
        ttl: int | None = None,
        heartbeating: bool = True,
        client_instance_id: str | None = None,
    ) -> Worker:
        node = node or self.rng.choice(self.nodes)
        interval = interval or self.interval
        w = Worker(
            name=f"{tag}-{len(self.workers)}".replace("_", "-").lower(),
            node=node,
            kind=kind,
            victim=victim,
            interval=interval,
            ttl=ttl or 3 * interval,
            heartbeating=heartbeating,
        )
        w.tags.add(tag)
        w.generic = generic
        w.client_instance_id = client_instance_id
        self.workers.append(w)
        self.by_name[w.name] = w
        return w

    def dead_on(self, node: str) -> list[Worker]:
        return [w for w in self.workers if w.node == node and w.dead]

    def latest(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._latest.get(name)

    def refusals(
        self, attempts: list[tuple[str, Callable[[], Any]]], *, statuses: tuple[int, ...] = (403,)
    ) -> tuple[int, list[str]]:
        """Runs writes that admission must refuse; any that succeeds is an admission breach."""
        refused, accepted = 0, []
        for what, call in attempts:
            try:
                call()
            except ApiException as exc:
                if exc.status in statuses:
                    refused += 1
                    continue
                accepted.append(f"{what}: unexpected status {exc.status}")
                continue
            accepted.append(what)
            self.violation("admission_breaches", None, f"admission accepted: {what}")
        return refused, accepted

    def violation(self, counter: str, w: Worker | None, detail: str) -> None:
        self.result.counts[counter] += 1
        self.note(f"VIOLATION {counter}: {detail}")
        if len(self.result.violations) < 50:
            self.result.violations.append(
                {
                    "counter": counter,
                    "worker": w.name if w else None,
                    "detail": detail,
                    "seed": self.seed,
                    "faults": self.result.labels,
                }
            )

    # --- the observer: safety on every retirement it sees ----------------------------------------

    def _observe_once(self) -> None:
        items = kube.custom(self.plane.admin).list_namespaced_custom_object(
            api.GROUP, api.VERSION, self.namespace, api.PLURAL, _request_timeout=20
        )["items"]
        now = time.time()
        with self._lock:
            for obj in items:
                name = obj["metadata"]["name"]
                self._latest[name] = obj
                w = self.by_name.get(name)
                status = obj.get("status") or {}
                reason = next(
                    (c.get("reason") for c in status.get("conditions") or [] if c.get("type") == "Retirable"), None
                )
                if w is not None and reason and (not w.reasons_seen or w.reasons_seen[-1] != reason):
                    w.reasons_seen.append(reason)
                attestation = status.get("attestation") or {}
                if (attestation.get("agent") or {}).get("podName") in self.rogue_pods:
                    self.violation("admission_breaches", w, f"{name} carries an attestation by a rogue agent")
                    self.rogue_pods.discard((attestation.get("agent") or {}).get("podName"))
                retirement = status.get("retirement")
                if retirement is None:
                    continue
                if w is None:
                    self.violation("bad_provenance", None, f"{name}: retired, but the harness never registered it")
                    continue
                if w.retired_seen is None:
                    w.retired_seen, w.retired_seen_at = retirement, now
                    self._check_retirement(w, obj, retirement)
                elif retirement != w.retired_seen:
                    self.violation("double_retired", w, f"{name}: status.retirement changed after it was set")
                    w.retired_seen = retirement

    def _check_retirement(self, w: Worker, obj: dict[str, Any], retirement: dict[str, Any]) -> None:
        name = w.name
        retired_time = parse_time(retirement.get("retiredTime"))
        if w.alive():
            self.violation("live_retired", w, f"{name} retired while its incarnation is alive (harness pidfd)")
        elif w.killed_at is None or retired_time is None or retired_time < w.killed_at:
            self.violation(
                "live_retired", w, f"{name} retired at {retirement.get('retiredTime')}, before the harness killed it"
            )
        if self.grant_revoked is not None and retired_time is not None:
            start, end = self.grant_revoked
            if retired_time > start and (end is None or retired_time < end):
                self.violation("retired_without_grant", w, f"{name} retired while the retire grant was revoked")
        problems = provenance_problems(obj, retirement)
        if problems:
            self.violation("bad_provenance", w, f"{name}: {'; '.join(problems)}")
        self.result.evidence.setdefault("retired_by", Counter())[str(retirement.get("reason"))] += 1

    def _observer(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                self._observe_once()
            self._stop.wait(self.poll_interval)

    def refresh(self) -> None:
        self.plane.retry(self._observe_once, attempts=20)

    def reason(self, w: Worker) -> str | None:
        obj = self.latest(w.name) or {}
        for c in (obj.get("status") or {}).get("conditions") or []:
            if c.get("type") == "Retirable":
                return str(c.get("reason"))
        return None

    def attested(self, w: Worker) -> dict[str, Any]:
        return dict(((self.latest(w.name) or {}).get("status") or {}).get("attestation") or {})

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.1)
        return predicate()

    # --- phases ----------------------------------------------------------------------------------

    def run(self) -> TrialResult:
        started = time.monotonic()
        self.interval = self.rng.choice([1, 2])
        heartbeater: Heartbeater | None = None
        observer = threading.Thread(target=self._observer, name=f"observe-{self.namespace}", daemon=True)
        mark = [started]

        def phase(name: str) -> None:
            now = time.monotonic()
            self.result.phases[name] = self.result.phases.get(name, 0.0) + now - mark[0]
            mark[0] = now

        try:
            self.plane.create_trial_namespace(self.namespace)
            self._plan()
            self.result.labels = [f.label or f.name for f in self.faults] or ["none"]
            self.note(f"plan: nodes={self.nodes} faults={self.result.labels} workers={len(self.workers)}")
            phase("namespace+plan")
            self._setup()
            phase("setup")
            heartbeater = Heartbeater(client=self.plane.worker_client, namespace=self.namespace, workers=self.workers)
            heartbeater.start()
            observer.start()
            self._wait_alive()
            phase("wait_alive")
            self.armed_at = time.time()
            for f in self.faults:
                self.note(f"arm {f.label}")
                f.arm()
            self.note("strike")
            for f in self.faults:
                f.strike()
            for w in self.workers:
                if w.victim and w.generic and not w.dead:
                    w.kill()
            for f in self.faults:
                self.note(f"after {f.label}")
                f.after()
            phase("arm+strike+after")
            self._observe_phase()
            phase("observe")
            for f in reversed(self.faults):
                self.note(f"heal {f.label}")
                f.heal()
            self._heal_plane()
            phase("heal")
            self._settle()
            phase("settle")
            for f in self.faults:
                f.verify()
                if f.failures:
                    for failure in f.failures:
                        self.violation("not_injected", None, f"{f.label}: {failure}")
                self.result.facts[f.label] = f.facts
            self._verify_history()
            phase("verify")
        finally:
            self._stop.set()
            if heartbeater is not None:
                heartbeater.stop()
            with contextlib.suppress(Exception):
                self._heal_plane()
            self.plane.delete_trial_namespace(self.namespace)
            for w in self.workers:
                w.close()
            for ns in self.pidns.values():
                ns.close()
            if observer.is_alive():
                observer.join(timeout=30)
            phase("cleanup")
            self.result.seconds = time.monotonic() - started
            self.result.workers = len(self.workers)
            self.result.deaths = sum(1 for w in self.workers if w.dead)
            if not self.result.ok:
                log = self.plane.work / f"trial-{self.namespace}.log"
                log.write_text("\n".join(self.timeline) + "\n" + json.dumps(self.result.violations, indent=1) + "\n")
                self.result.facts["timeline"] = str(log)
        return self.result

    def _plan(self) -> None:
        for node in self.nodes:
            for _ in range(self.rng.randint(1, 2)):
                self.add(node, self.rng.choice(["sleep", "sleep", "pidns"]), victim=False, tag="live")
            for _ in range(self.rng.randint(1, 2)):
                self.add(node, self.rng.choice(["sleep", "sleep", "pidns"]), victim=True, tag="victim")
        for f in self.faults:
            f.plan()

    def _setup(self) -> None:
        plane = self.plane
        for w in self.workers:
            agent = plane.agents[w.node]
            w.registered_boot = agent.boot_id
            if w.kind == "launcher":
                self._launch(w)
                continue
            pidns = None
            if w.kind == "pidns":
                pidns = self.pidns.get(w.node) or self.pidns.setdefault(w.node, PidNamespace())
            spawn(w, pidns=pidns)
        bulk = [w for w in self.workers if w.kind != "launcher"]

        def reg(w: Worker) -> None:
            plane.retry(
                lambda: register(
                    w,
                    client=plane.worker_client,
                    namespace=self.namespace,
                    boot_id_file=plane.agents[w.node].boot_file,
                    client_instance_id=w.client_instance_id,
                ),
                attempts=5,
            )
            if not w.heartbeating:
                return  # mass workers: no heartbeat history to check, and 500 fewer reads
            body = kube.get_registration(plane.admin, self.namespace, w.name)
            beat = (body.get("status") or {}).get("lastHeartbeatTime")
            if beat:
                w.heartbeats.append((beat, int(body["metadata"]["resourceVersion"])))

        if len(bulk) > 40:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=6) as pool:
                list(pool.map(reg, bulk))
        else:
            for w in bulk:
                reg(w)

    def _launch(self, w: Worker) -> None:
        plane = self.plane
        argv = [
            str(plane_mod.BIN / "coroner"),
            "run",
            "-n",
            self.namespace,
            f"--node-name={w.node}",
            f"--name={w.name}",
            f"--kubeconfig={plane.worker_kubeconfig}",
            f"--interval-seconds={w.interval}",
            f"--ttl-seconds={w.ttl}",
            f"--boot-id-file={plane.agents[w.node].boot_file}",
            "--",
            "sleep",
            "3600",
        ]
        with open(plane.work / f"launcher-{self.namespace}-{w.name}.log", "ab") as out:
            w.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        w.host_pid = wait_child(w.proc.pid, timeout=60)
        stat = read_stat(w.host_pid)
        assert stat is not None
        w.start_time = stat[1]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(ApiException):
                body = kube.get_registration(plane.admin, self.namespace, w.name)
                w.incarnation = body["spec"]["incarnation"]
                if int(w.incarnation["pid"]) != w.host_pid or int(w.incarnation["startTime"]) != w.start_time:
                    raise RuntimeError(f"launcher registered {w.incarnation}, not pid {w.host_pid}")
                w.registered = True
                w.pin()
                return
            time.sleep(0.1)
        raise RuntimeError(f"the launcher of {w.name} did not register within 60 s")

    def _wait_alive(self) -> None:
        timeout = 60.0 + len(self.workers) * 0.2

        def all_alive() -> bool:
            for w in self.workers:
                a = self.attested(w)
                if a.get("verdict") != "Alive" or (a.get("agent") or {}).get("nodeName") != w.node:
                    return False
            return True

        if not self.wait(all_alive, timeout):
            missing = [w.name for w in self.workers if self.attested(w).get("verdict") != "Alive"]
            raise RuntimeError(f"workers not attested Alive within {timeout:.0f} s: {missing[:10]}")
        self.note("all workers attested Alive")

    def _blocked(self, w: Worker) -> frozenset[str] | None:
        sets = [s for f in self.faults if (s := f.blocked(w)) is not None]
        return frozenset().union(*sets) if sets else None

    def _final(self, w: Worker) -> frozenset[str] | None:
        sets = [s for f in self.faults if (s := f.final(w)) is not None]
        return frozenset().union(*sets) if sets else None

    def _retired(self, w: Worker) -> bool:
        return w.retired_seen is not None

    def _observe_phase(self) -> None:
        dead = [w for w in self.workers if w.dead]
        blocked = {w: b for w in dead if (b := self._blocked(w)) is not None}
        disturbed = {w for w in dead if w not in blocked and any(f.disturbs(w) for f in self.faults)}
        free = [w for w in dead if w not in blocked and w not in disturbed]
        phase_start = time.monotonic()
        hold = max([f.hold for f in self.faults] + [0.0])
        bound = self.mass_bound if any(f.name == "mass_death" for f in self.faults) else self.bound

        def settled() -> bool:
            return all(self._retired(w) for w in free) and all(
                self.reason(w) in reasons or self._retired(w) for w, reasons in blocked.items()
            )

        self.wait(lambda: settled() and time.monotonic() - phase_start >= hold, bound + hold)
        with contextlib.suppress(Exception):
            self.refresh()
        for w in free:
            if self._retired(w):
                assert w.retired_seen_at is not None and w.killed_at is not None
                self.result.latencies.append(w.retired_seen_at - w.killed_at)
            elif self._naturally_reused(w):
                self.result.evidence.setdefault("notes", Counter())["natural_pid_reuse_preserved"] += 1
            else:
                self.violation(
                    "dead_left_active",
                    w,
                    f"{w.name} dead, not blocked by any fault, still {self.reason(w)} "
                    f"{bound:.0f} s after the faults' post-death steps",
                )
        for w, reasons in blocked.items():
            reason = self.reason(w)
            for f in self.faults:
                if f.blocked(w) is not None:
                    self.result.reasons.setdefault(f.label.split("[")[0], Counter())[str(reason)] += 1
            if self._retired(w):
                self.violation("wrong_reason", w, f"{w.name} retired although {sorted(reasons)} should hold it")
            elif reason not in reasons:
                self.violation("wrong_reason", w, f"{w.name} preserved as {reason}, expected one of {sorted(reasons)}")
        self.note("observe phase done")

    def _heal_plane(self) -> None:
        plane = self.plane
        for name in self.pool:  # only this trial's nodes: other lanes' trials own theirs
            plane.agents[name].ensure_healthy()
        plane.operator_proxy.set_mode("pass")
        plane.ensure_one_operator()
        if self.grant_revoked is not None and self.grant_revoked[1] is None:
            self.grant_revoked = (self.grant_revoked[0], time.time())
        plane.restore_grant()

    def _naturally_reused(self, w: Worker) -> bool:
        """Preserved as PidReuseDetected because some unrelated process took the dead worker's
        root-namespace pid before the agent looked (the design: preserve until that one exits)."""
        if w.kind not in ("sleep", "zombie_leader") or self.reason(w) != "PidReuseDetected":
            return False
        stat = read_stat(w.host_pid)
        return stat is not None and stat[1] != w.start_time

    def _settle(self) -> None:
        healed = time.monotonic()
        bound = self.mass_bound if any(f.name == "mass_death" for f in self.faults) else self.bound
        dead = [w for w in self.workers if w.dead]
        finals = {w: f for w in dead if (f := self._final(w)) is not None}

        def done() -> bool:
            return all(self._retired(w) or (w in finals and self.reason(w) in finals[w]) for w in dead)

        self.wait(done, bound)
        with contextlib.suppress(Exception):
            self.refresh()
        for w in dead:
            if self._retired(w):
                continue
            reason = self.reason(w)
            if w in finals:
                self.result.reasons.setdefault("final", Counter())[str(reason)] += 1
                if reason not in finals[w]:
                    self.violation(
                        "wrong_reason",
                        w,
                        f"{w.name} preserved as {reason} after the heal, expected {sorted(finals[w])}",
                    )
            elif self._naturally_reused(w):
                self.result.reasons.setdefault("final", Counter())["PidReuseDetected(natural)"] += 1
            else:
                self.violation(
                    "dead_left_active",
                    w,
                    f"{w.name} ({w.kind} on {w.node}) dead and still {reason} {bound:.0f} s after the heal",
                )
        # Survivors: alive, never retired (the observer checks), with the reason their faults explain.
        for w in self.workers:
            if w.dead:
                continue
            if not w.alive():
                self.violation("not_injected", w, f"{w.name} died without the harness killing it")
                continue
            sets = [s for f in self.faults if (s := f.survivor(w)) is not None]
            expected = frozenset().union(*sets) if sets else frozenset({"PidAlive"})
            if not self.wait(lambda w=w, e=expected: self.reason(w) in e, 10.0):
                self.violation("wrong_reason", w, f"live {w.name} is {self.reason(w)}, expected {sorted(expected)}")
            self.result.reasons.setdefault("live", Counter())[str(self.reason(w))] += 1
        self.note(f"settled in {time.monotonic() - healed:.1f} s")

    def _verify_history(self) -> None:
        """Each retirement once: Events per object, operator log lines per object, and no heartbeat
        committed before the decided resourceVersion that the relied-on attestation did not see."""
        events = self.plane.retry(lambda: k8s.CoreV1Api(self.plane.admin).list_namespaced_event(self.namespace).items)
        per_object = Counter(e.involved_object.uid for e in events if e.reason == "Retired")
        for uid, count in per_object.items():
            if count > 1:
                self.violation("double_retired", None, f"{count} Retired Events for object uid {uid}")
        decided: dict[str, list[int]] = {}
        for log in self.plane.operator_logs:
            with contextlib.suppress(OSError):
                for ns, name, rv in RETIRED_LINE.findall(log.read_text(errors="replace")):
                    if ns == self.namespace:
                        decided.setdefault(name, []).append(int(rv))
        for name, rvs in decided.items():
            if len(rvs) > 1:
                self.violation("double_retired", self.by_name.get(name), f"{name} logged as retired {len(rvs)} times")
            w = self.by_name.get(name)
            if w is None or w.retired_seen is None or not w.heartbeats:
                continue
            seen = ((w.retired_seen.get("attestation") or {}).get("heartbeatSeen")) or ""
            before = [value for value, rv in sorted(w.heartbeats, key=lambda h: h[1]) if 0 < rv <= rvs[0]]
            if before and before[-1] != seen:
                self.violation(
                    "bad_provenance",
                    w,
                    f"{name} retired at resourceVersion {rvs[0]} on an attestation that saw "
                    f"heartbeat {seen!r}, but heartbeat {before[-1]!r} was committed before that",
                )
            if w.killed_at is not None and any(rv > rvs[0] for _, rv in w.heartbeats):
                self.result.evidence.setdefault("notes", Counter())["heartbeat_after_retirement"] += 1


def provenance_problems(obj: dict[str, Any], retirement: dict[str, Any]) -> list[str]:
    """Why a retirement is not backed by a Dead attestation for exactly its incarnation, by its
    own node's agent (empty: it is)."""
    problems = []
    spec = obj.get("spec") or {}
    inc = spec.get("incarnation") or {}
    reason = retirement.get("reason")
    if retirement.get("retiredBy") != OPERATOR_SA:
        problems.append(f"retiredBy {retirement.get('retiredBy')!r}")
    if reason in NODE_EVIDENCE:
        problems.append(f"node-level evidence {reason} while that policy is off")
        return problems
    att = retirement.get("attestation") or {}
    if att.get("verdict") != "Dead":
        problems.append(f"attestation verdict {att.get('verdict')!r}")
    if att.get("evidence") not in DEATH_EVIDENCE or att.get("evidence") != reason:
        problems.append(f"evidence {att.get('evidence')!r} / reason {reason!r}")
    for field in ("bootId", "pidNamespace", "pid", "startTime", "hostId"):
        if str((att.get("incarnation") or {}).get(field)) != str(inc.get(field)):
            problems.append(f"attested {field} {(att.get('incarnation') or {}).get(field)!r} != {inc.get(field)!r}")
    agent = att.get("agent") or {}
    if agent.get("nodeName") != spec.get("nodeName"):
        problems.append(f"attested by the agent of {agent.get('nodeName')!r}, not {spec.get('nodeName')!r}")
    if agent.get("identity") != AGENT_SA:
        problems.append(f"attested by identity {agent.get('identity')!r}")
    if not str(agent.get("podName", "")).startswith(f"agent-{spec.get('nodeName')}-"):
        problems.append(f"attested by pod {agent.get('podName')!r}")
    same_boot = att.get("bootId") == inc.get("bootId")
    if (att.get("evidence") == "BootBoundary") == same_boot:
        problems.append(f"{att.get('evidence')} with agent boot {att.get('bootId')} vs incarnation {inc.get('bootId')}")
    return problems


__all__ = ["BOUND", "COUNTERS", "FAULTS", "MASS_BOUND", "SAFETY", "Trial", "TrialResult", "proxied_kubeconfig"]
