"""Every production name the simulation drives, imported in one place.

The package layout moves (issue 15): when a module changes its name, this file is the only one of
the simulation that changes. Nothing here is a copy: each name is the shipped object.
"""

from __future__ import annotations

# `kubectl coroner apply`: the human's compare-and-swap retirement.
from coroner.cli import plan as cli_plan

# The pure core: vocabulary, model, decision, conditions, /proc parsers, the operator's cache.
from coroner.core import api, conditions, decision, model, procfs, wire
from coroner.core.decision import AgentFacts, Decision, Facts, Policy, decide, lease_expiry
from coroner.core.reasons import ConditionType, Evidence, Reason, Verdict
from coroner.core.world import World, lease_facts

# The agent: the probe over a ProcReader, the attestation's building, confirmation and write rule.
from coroner_agent import probe as agent_probe
from coroner_agent import service as agent_service

# The operator: the conditions and the compare-and-swap patches it writes.
from coroner_operator import status as operator_status

# The operator's reconcile step (effects as data) and the one retire protocol (issue 15), where
# this tree has them: the simulated operator then runs them instead of its mirror of the reconciler.
try:
    from coroner import retire as retire_protocol
    from coroner_operator import step as operator_step
except ImportError:  # an older tree: SimOperator mirrors Reconciler.reconcile
    retire_protocol = None  # type: ignore[assignment]
    operator_step = None  # type: ignore[assignment]

__all__ = [
    "AgentFacts",
    "ConditionType",
    "Decision",
    "Evidence",
    "Facts",
    "Policy",
    "Reason",
    "Verdict",
    "World",
    "agent_probe",
    "agent_service",
    "api",
    "cli_plan",
    "conditions",
    "decide",
    "decision",
    "lease_expiry",
    "lease_facts",
    "model",
    "operator_status",
    "operator_step",
    "procfs",
    "retire_protocol",
    "wire",
]
