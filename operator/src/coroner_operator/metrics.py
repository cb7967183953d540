"""Prometheus metrics of the operator. Label values are the reason codes of coroner.core.reasons, so a
reason reads the same in a metric, a condition, an Event and a log line."""

from __future__ import annotations

import datetime
from collections import Counter as CountOf
from collections.abc import Hashable, Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from coroner.core.held import HELD_REASONS, held_past
from coroner.core.model import Registration
from coroner.core.reasons import Reason
from coroner.runtime.metrics import process_registry


class Metrics:
    """One registry per operator instance (tests run several operators in one process)."""

    def __init__(self, *, process_collectors: bool = True) -> None:
        self.registry, self.build_info = process_registry(process_collectors=process_collectors)
        self.leader = Gauge(
            "coroner_operator_leader",
            "1 while this operator replica holds the leader Lease and reconciles; 0 while it stands by "
            "(without --leader-elect the only replica always leads).",
            registry=self.registry,
        )
        self.admission_verified = Gauge(
            "coroner_admission_policies_verified",
            "1 while every admission policy and binding Coroner ships is present with its content; 0 while one "
            "is missing, differs or cannot be read, or before the first read: the operator retires nothing then "
            "(AdmissionPoliciesUnverified). Every replica reads them.",
            registry=self.registry,
        )
        self.retirements = Counter(
            "coroner_retirements",
            "Registrations retired, by the evidence path that authorized the retirement.",
            ["evidence"],
            registry=self.registry,
        )
        self.registrations = Gauge(
            "coroner_registrations",
            "Active registrations by the reason code of their latest decision.",
            ["reason"],
            registry=self.registry,
        )
        self.registrations_held = Gauge(
            "coroner_registrations_held",
            "Active registrations held past --held-grace-seconds (600) by a reason that may last for ever "
            "(coroner.core.held.HELD_REASONS), by that reason, as of the last sweep: what kubectl coroner doctor's "
            "held check names (alert CoronerRegistrationsHeld).",
            ["reason"],
            registry=self.registry,
        )
        self.cas_conflicts = Counter(
            "coroner_cas_conflicts",
            "Retirement writes refused because the object moved (409/422): re-read and decided again.",
            registry=self.registry,
        )
        self.retire_abandoned = Counter(
            "coroner_retire_abandoned",
            "Retirement attempts abandoned, by cause: before the write (RetirePermissionMissing, LeaseFenceMoved), "
            "or refused at the write by an admission policy other than the verb's (RetireRefusedByAdmission).",
            ["cause"],
            registry=self.registry,
        )
        self.death_to_retirement = Histogram(
            "coroner_death_to_retirement_seconds",
            "From the attestation's observedTime (the agent saw the death) to the retirement write.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=self.registry,
        )
        self.reconcile_errors = Counter(
            "coroner_reconcile_errors",
            "Reconciles that failed with an unexpected error (retried with backoff).",
            registry=self.registry,
        )
        self.status_writes = Counter(
            "coroner_status_writes",
            "Status writes by kind: conditions (a decision changed) or retirement.",
            ["kind"],
            registry=self.registry,
        )
        self.terminal_deletions = Counter(
            "coroner_terminal_deletions",
            "Terminal registrations deleted after --terminal-retention-seconds, by what made them terminal "
            "(Retired or Released).",
            ["terminal"],
            registry=self.registry,
        )
        self.active_deletions = Counter(
            "coroner_active_registration_deletions",
            "Registrations seen deleted while active (neither Retired nor Released). Nothing in Coroner deletes "
            "one, and admission (coroner-delete-only-terminal) refuses it to everyone but cluster admins, the "
            "namespace controller and the garbage collector: each is a record of a possibly live worker gone "
            "without evidence (alert CoronerActiveRegistrationDeleted). Every replica counts what it sees.",
            registry=self.registry,
        )
        self.registration_objects = Gauge(
            "coroner_registration_objects",
            "WorkerRegistration objects the operator sees, active or terminal (kept until their retention "
            "ends), as of the last sweep: the object count the cluster holds.",
            ["state"],
            registry=self.registry,
        )
        self.events_posted = Counter(
            "coroner_events_posted",
            "Event writes by kind: individual (one retirement) or aggregate (several similar ones combined).",
            ["reason", "kind"],
            registry=self.registry,
        )
        self.events_aggregated = Counter(
            "coroner_events_aggregated",
            "Events combined into an aggregate Event instead of written one by one (each counted once, "
            "when its aggregate is posted).",
            ["reason"],
            registry=self.registry,
        )
        self.event_failures = Counter(
            "coroner_event_failures",
            "Event writes that failed (the retirement stands; the write is logged, not retried).",
            ["reason"],
            registry=self.registry,
        )


class DecisionGauge:
    """`coroner_registrations`: each active registration counted once, under its latest decision's reason
    (`Effects.reason`: RetireRefusedByAdmission where admission refused its last retirement); and
    `coroner_registrations_held`, counted at each sweep from the registrations whose reason is one of
    `HELD_REASONS` (kept apart, so a sweep looks at those only, not at every registration)."""

    def __init__(self, metrics: Metrics) -> None:
        self._gauge = metrics.registrations
        self._held_gauge = metrics.registrations_held
        self._reasons: dict[Hashable, Reason] = {}
        self._holding: dict[Hashable, Reason] = {}

    def set(self, key: Hashable, reason: Reason | None) -> None:
        """`key`'s latest reason; None takes it out (terminal, or gone)."""
        if self._reasons.get(key) is reason:  # unchanged (every sweep, for nearly every key)
            return
        old = self._reasons.pop(key, None)
        self._holding.pop(key, None)
        if old is not None:
            self._gauge.labels(old.value).dec()
        if reason is not None:
            self._reasons[key] = reason
            self._gauge.labels(reason.value).inc()
            if reason in HELD_REASONS:
                self._holding[key] = reason

    def clear(self) -> None:
        """Counts nothing (a replica that stopped leading: the leader's series are the cluster's)."""
        for key in list(self._reasons):
            self.set(key, None)
        for reason in HELD_REASONS:
            self._held_gauge.labels(reason.value).set(0)

    def count_held(
        self, registrations: Mapping[Any, Registration], *, now: datetime.datetime, grace_seconds: float
    ) -> dict[str, int]:
        """Sets `coroner_registrations_held` (every reason of `HELD_REASONS`, zero included) from the
        cached `registrations`: those whose latest reason has held them past `grace_seconds`
        (`coroner.core.held.held_past`). No request: the cache and the clock only."""
        counted: CountOf[str] = CountOf()
        for key, reason in self._holding.items():
            registration = registrations.get(key)
            if registration is not None and held_past(reason, registration, now=now, grace_seconds=grace_seconds):
                counted[reason.value] += 1
        for reason in HELD_REASONS:
            self._held_gauge.labels(reason.value).set(counted[reason.value])
        return dict(counted)

    def by_reason(self) -> dict[str, int]:
        return dict(CountOf(r.value for r in self._reasons.values()))
