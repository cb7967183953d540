"""Prometheus metrics of the operator. Label values are the reason codes of coroner.reasons, so a
reason reads the same in a metric, a condition, an Event and a log line."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    """One registry per operator instance (tests run several operators in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
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
        self.cas_conflicts = Counter(
            "coroner_cas_conflicts",
            "Retirement writes refused because the object moved (409/422): re-read and decided again.",
            registry=self.registry,
        )
        self.retire_abandoned = Counter(
            "coroner_retire_abandoned",
            "Retirement attempts abandoned before the write (permission or Lease fence moved).",
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
