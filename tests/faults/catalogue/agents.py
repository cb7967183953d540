"""Faults of a node's agent (killed, frozen, cut off, restarted, clock skewed) and of a node's workers' clocks."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from kubernetes import client as k8s

from coroner.core import api
from faults.catalogue.base import AGENT_DOWN, Fault, fault
from faults.plane import LEASE_SECONDS
from faults.workers import Worker, heartbeat

if TYPE_CHECKING:
    pass


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
            # Only heartbeating workers: a heartbeat written for one that is not (malformed's
            # garbled one) would replace what another fault wrote there (long run, seed 733484445).
            if w.node == self.node and w.kind in ("sleep", "pidns") and w.heartbeating:
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
