"""Leader election among the operator's replicas (`--leader-elect`), on the operator's Lease
(`api.OPERATOR_LEASE`, `coroner.runtime.leader`).

Every replica watches and keeps its cache (World), queue and permission answers warm; only the
leader's workers reconcile (the runtime's gate) and only the leader sweeps, so retirements,
deletions, condition writes and Events come from one replica at a time. Without election the one
replica always leads.
"""

from __future__ import annotations

from coroner.core import api
from coroner.runtime.leader import LeaderElector
from coroner_operator.kubeapi import KubeApi
from coroner_operator.metrics import DecisionGauge, Metrics
from coroner_operator.settings import OperatorSettings


class Leadership:
    def __init__(
        self, *, kube: KubeApi, settings: OperatorSettings, identity: str, metrics: Metrics, gauge: DecisionGauge
    ) -> None:
        self.metrics = metrics
        self.gauge = gauge
        self.elector: LeaderElector | None = None
        if settings.leader_election is not None:
            self.elector = LeaderElector(
                store=kube,
                namespace=settings.system_namespace,
                name=api.OPERATOR_LEASE,
                identity=settings.leader_identity or identity,
                config=settings.leader_election,
                on_change=self.changed,
            )
        metrics.leader.set(1 if self.elector is None else 0)

    @property
    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader

    def changed(self, leading: bool) -> None:
        self.metrics.leader.set(1 if leading else 0)
        if not leading:
            # The decision gauges are the leader's: a replica that stopped leading stops reporting
            # them, so `sum(coroner_registrations)` over both replicas counts each registration once.
            self.gauge.clear()
            for state in ("active", "terminal"):
                self.metrics.registration_objects.labels(state).set(0)

    async def release(self) -> None:
        """A clean shutdown gives the leader Lease up, so a standby takes over at its next retry."""
        if self.elector is not None:
            await self.elector.release()
