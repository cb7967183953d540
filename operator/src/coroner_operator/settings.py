"""How the operator runs; the decision's own knobs live in `coroner.core.decision.Policy`."""

from __future__ import annotations

import dataclasses

from coroner.core import api
from coroner.core.held import HELD_GRACE_SECONDS
from coroner.runtime.leader import ElectionConfig
from coroner_operator.eventcorrelator import DEFAULT_BURST, DEFAULT_WINDOW_SECONDS
from coroner_operator.retention import DEFAULT_TERMINAL_RETENTION_SECONDS


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class OperatorSettings:
    workers: int = 8
    """Concurrent reconciles (distinct registrations; one registration is never reconciled twice at once)."""
    resync_seconds: float = 60.0
    """A full re-decision of every cached registration (no API reads) as a safety net."""
    permission_refresh_seconds: float = 5.0
    """How often the `retire` capability is re-checked per namespace; a flip re-queues the namespace."""
    terminal_retention_seconds: float = DEFAULT_TERMINAL_RETENTION_SECONDS
    """Delete terminal (Retired or Released) registrations this long after they became terminal, at
    the first reconcile after that (the sweep, within `resync_seconds`); 0 keeps them forever.
    See `coroner_operator.retention` for the rule."""
    held_grace_seconds: float = HELD_GRACE_SECONDS
    """A registration held Active longer than this by a reason of `coroner.core.held.HELD_REASONS` is
    counted in `coroner_registrations_held` (at each sweep), as doctor's `held` check names it."""
    error_backoff: tuple[float, ...] = (1, 2, 4, 8, 16, 30, 60)
    """Delays before retrying a registration whose reconcile failed unexpectedly (never a hot loop)."""
    system_namespace: str = api.SYSTEM_NAMESPACE
    namespaces: tuple[str, ...] = ()
    """The namespaces whose registrations this operator serves (exact names or globs); none: all."""
    event_posters: int = 2
    """Concurrent Event writers; Events are posted off the reconcile path (a retirement's worker
    moves on once the compare-and-swap write has landed)."""
    event_backlog: int = 10000
    """Events waiting to be posted before reconciles that retire wait for room (never dropped)."""
    event_burst: int = DEFAULT_BURST
    """Events posted one by one per namespace per window; past it similar ones are combined."""
    event_window_seconds: float = DEFAULT_WINDOW_SECONDS
    """The aggregation window (see `coroner_operator.eventcorrelator`)."""
    leader_election: ElectionConfig | None = None
    """With a config, replicas elect a leader on the operator's Lease (`api.OPERATOR_LEASE`) and only
    the leader reconciles, sweeps, retires, deletes and posts Events; None: this process always leads."""
    leader_identity: str = ""
    """This replica's holderIdentity on the leader Lease (the pod name in a Deployment)."""
