"""Every production name the simulation drives, imported in one place.

The package layout may move: when a module changes its name, this file is the only one of
the simulation that changes. Nothing here is a copy: each name is the shipped object.
"""

from __future__ import annotations

# The operator: its watch inputs, its reconcile step (effects as data), the one retire protocol.
from coroner import retire as retire_protocol

# `kubectl coroner apply`: the human's compare-and-swap retirement.
from coroner.cli import plan as cli_plan

# The pure core: vocabulary, model, decision, conditions, /proc parsers, the operator's cache.
from coroner.core import api, conditions, decision, fingerprint, model, procfs, wire
from coroner.core.decision import AgentFacts, Decision, Facts, Policy, decide, lease_expiry
from coroner.core.decision import facts as decision_facts
from coroner.core.reasons import ConditionType, Evidence, Reason, Verdict
from coroner.core.world import World, lease_facts

# The agent: the probe over a ProcReader, the attestation's building, confirmation and write rule.
from coroner_agent import probe as agent_probe
from coroner_agent import service as agent_service
from coroner_operator import inputs as operator_inputs
from coroner_operator import step as operator_step

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
    "decision_facts",
    "fingerprint",
    "lease_expiry",
    "lease_facts",
    "model",
    "operator_inputs",
    "operator_step",
    "procfs",
    "retire_protocol",
    "wire",
]
