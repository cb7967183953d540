"""Faults of the worker processes themselves: pid reuse, a reboot (boot id change), zombies."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from typing import TYPE_CHECKING

from faults.catalogue.base import Fault, fault
from faults.workers import Worker, read_stat

if TYPE_CHECKING:
    pass


@fault("pid_reuse")
class PidReuse(Fault):
    """Forced pid reuse in a pid namespace (ns_last_pid); the node's agent is down, frozen or up.

    A victim whose launcher recorded its pidfd inode is found by it, so the reuse holds nothing:
    it is retired (ProcAbsent). Without one it is preserved as PidReuseDetected while the reuser runs."""

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

    def _held_by_reuse(self, w: Worker) -> bool:
        return w is self.victim and self.variant in ("terminated", "killed") and "pidfdInode" not in w.incarnation

    def blocked(self, w: Worker) -> frozenset[str] | None:
        return frozenset({"PidReuseDetected"}) if self._held_by_reuse(w) else None

    def heal(self) -> None:
        self.heal_kills_reuser = self.rng.random() < 0.5
        if self.heal_kills_reuser and self.reuser is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.reuser_pid, 9)
            self.trial.note("reuser killed: the reused number is free again")

    def final(self, w: Worker) -> frozenset[str] | None:
        if self._held_by_reuse(w) and read_stat(self.reuser_pid) is not None:
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
        boot_id = str(uuid.uuid4())
        self.trial.plane.retry(lambda: agent.node.reboot(self.trial.plane.cluster, boot_id=boot_id))
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
