"""The sweeper: a full re-decision of every cached registration, every `resync_seconds` (or longer
where the registrations are many: `SWEEP_SECONDS_PER_REGISTRATION`).

A safety net (no API reads: the cache is what is decided from) and the clock of retention (a
terminal registration is deleted at the first reconcile after its retention ends, and the sweep
reconciles every one). Each sweep is recorded on the operator's Lease (`api.LAST_SWEEP_ANNOTATION`:
how many, how many failed and why, by reason, the retire capability per namespace), next to the
decision policy this operator runs with (`api.POLICY_ANNOTATION`) and its own user
(`api.OPERATOR_USER_ANNOTATION`, its SelfSubjectReview at startup), published once before the first
sweep and with every sweep, so `kubectl coroner plan|apply|doctor` decide as the operator does,
`doctor` reviews this operator's grant and admission policies (a Helm namePrefix is in its user)
without listing Deployments, and `doctor` and /healthz can tell that the operator is alive. Under leader election only the leader
sweeps, and the Lease is the leader Lease (`coroner.runtime.leader`): the sweep's annotations ride
on its next renewal.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from coroner.core import api, model, policy_json
from coroner.core.decision import Policy
from coroner.core.held import HELD_GRACE_SECONDS
from coroner.core.model import Key
from coroner.core.world import World
from coroner.runtime.leader import LeaderElector
from coroner_operator.kubeapi import KubeApi, describe
from coroner_operator.metrics import DecisionGauge, Metrics

logger = logging.getLogger("coroner.operator")


#: The sweep interval per cached registration, at least. A sweep re-decides every registration,
#: about 100 us of CPU each (150,000 in ~15 s on one core); one every `resync_seconds` would spend a
#: fifth of a core at 150,000 on a safety net for decisions the events already made. 2 ms each keeps
#: the sweeps near 5% of a core at any size (150,000: every 300 s; up to 30,000 the 60 s default
#: stands). Counted, not timed: a sweep's wall time is mostly waiting (its writes, an API outage),
#: which is no reason to sweep less often.
SWEEP_SECONDS_PER_REGISTRATION = 0.002


class Sweeper:
    def __init__(
        self,
        *,
        world: World,
        kube: KubeApi,
        metrics: Metrics,
        gauge: DecisionGauge,
        policy: Policy,
        enqueue: Callable[[Key], None],
        drain: Callable[[], Awaitable[None]],
        system_namespace: str,
        identity: str,
        resync_seconds: float,
        clock: Callable[[], datetime.datetime],
        elector: LeaderElector | None = None,
        held_grace_seconds: float = HELD_GRACE_SECONDS,
    ) -> None:
        self.world = world
        self.kube = kube
        self.metrics = metrics
        self.gauge = gauge
        self.policy = policy
        self.enqueue = enqueue
        self.drain = drain
        self.system_namespace = system_namespace
        self.identity = identity
        self.resync_seconds = resync_seconds
        self.interval = resync_seconds
        """The pause after the last sweep (`SWEEP_SECONDS_PER_REGISTRATION`); the Lease and /healthz
        allow for it."""
        self.clock = clock
        self.elector = elector
        self.held_grace_seconds = held_grace_seconds
        self.last_sweep: dict[str, Any] | None = None
        self._failures: Counter[str] = Counter()
        self._errors: dict[str, str] = {}

    def record_failure(self, key: Key, exc: BaseException) -> None:
        """A reconcile failed (it is retried with backoff); the sweep's record counts it per namespace."""
        self._failures[key[0]] += 1
        self._errors[key[0]] = describe(exc)[:300]

    async def sweep(self) -> None:
        started = self.clock()
        self._failures.clear()
        self._errors.clear()
        keys = list(self.world.bodies)
        for key in keys:
            self.enqueue(key)
        await self.drain()
        self.interval = max(self.resync_seconds, len(keys) * SWEEP_SECONDS_PER_REGISTRATION)
        terminal = sum(1 for r in self.world.parsed.values() if r.terminal)
        self.metrics.registration_objects.labels("terminal").set(terminal)
        self.metrics.registration_objects.labels("active").set(len(self.world.parsed) - terminal)
        # After the drain every reason is fresh; the bound is passed by the clock, between events.
        self.gauge.count_held(self.world.parsed, now=self.clock(), grace_seconds=self.held_grace_seconds)
        self.last_sweep = {
            "time": model.format_time(self.clock()),
            "startedTime": model.format_time(started),
            "registrations": len(keys),
            "namespaces": len({k[0] for k in keys}),
            "failures": dict(self._failures),
            "errors": dict(self._errors),
            "byReason": self.gauge.by_reason(),
            "retirePermission": dict(self.world.retire_permission),
        }
        await self.write_lease({api.LAST_SWEEP_ANNOTATION: json.dumps(self.last_sweep, sort_keys=True)})

    async def run(self) -> None:
        await self.write_lease({})
        while True:
            if self.elector is not None:
                await self.elector.wait_leader()  # a standby neither sweeps nor records sweeps
            await self.sweep()
            await asyncio.sleep(self.interval)

    async def write_lease(self, annotations: dict[str, str]) -> None:
        """Renews the operator's Lease with `annotations`, the policy and the operator's user (other
        annotations are kept). Under leader election the elector owns the Lease: they go on its next
        write (now, if leading)."""
        annotations = {
            **annotations,
            api.POLICY_ANNOTATION: policy_json.dump_policy(self.policy),
            api.OPERATOR_USER_ANNOTATION: self.identity,
        }
        if self.elector is not None:
            self.elector.publish(annotations)
            return
        try:
            await self.kube.upsert_lease(
                namespace=self.system_namespace,
                name=api.OPERATOR_LEASE,
                holder=self.identity,
                duration=max(1, int(self.interval * 3)),
                annotations=annotations,
            )
        except Exception as exc:  # an API outage must not end the sweeps (nor /healthz's evidence)
            logger.warning("operator lease not written namespace=%s error=%s", self.system_namespace, describe(exc))
