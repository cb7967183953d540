"""How the agent runs: its node, its Lease, its resync, its workers and its shutdown."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AgentSettings:
    node_name: str
    pod_name: str = ""
    lease_duration_seconds: int = 30
    """How long the node Lease stays valid without renewal (the operator's AgentUnavailable bound)."""
    renew_seconds: float = 10.0
    resync_seconds: float = 30.0
    """Full re-probe of every registration of this node (the safety net under pidfd events)."""
    absence_confirm_seconds: float = 10.0
    """A death read from /proc (ProcAbsent, PidNamespaceRecreated, BootBoundary) is attested only once it is seen again this
    long after it was first seen; the attestation records both looks (firstObservedTime,
    observedTime). Must be at least the operator's Policy.absence_confirm_seconds."""
    workers: int = 8
    """Registrations attested at once (probe + attestation write): a mass death on this node costs
    about one API round-trip per `workers` deaths, not one per death."""
    shutdown_grace_seconds: float = 40.0
    """On SIGTERM, how long to keep serving while waiting for this node's registrations that are not
    attested Dead (nor terminal) to be resolved. With `shutdown_sweep_seconds` it must fit in the
    pod's terminationGracePeriodSeconds (manifests/base/agent.yaml: 60 = 40 + 15 + 5 to spare)."""
    shutdown_sweep_seconds: float = 15.0
    """Bound of the final sweep after the wait."""
    shutdown_resync_seconds: float = 2.0
    """While waiting, re-probe what is waited for this often: the deaths of incarnations the agent
    could not pin are otherwise found only by the (30 s) resync."""
