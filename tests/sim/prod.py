"""Every production name the simulation drives, imported in one place.

The package layout may move: when a module changes its name, this file is the only one of
the simulation that changes. Nothing here is a copy: each name is the shipped object.
"""

from __future__ import annotations

# The operator as shipped (`app.Operator`: runtime, watch inputs, reconciler, step, executor), its
# API client (`kubeapi.KubeApi`, over the simulation's transport), and the one retire protocol.
from coroner import retire as retire_protocol

# `kubectl coroner apply`: the human's plan and compare-and-swap retirement.
from coroner.cli import plan as cli_plan
from coroner.cli.commands import apply as cli_apply

# The production client's error (what a port raises for an API server's refusal).
from coroner.client.rest import ApiError

# The pure core: vocabulary, model, decision, conditions, /proc parsers, the operator's cache; the
# memos its pure functions are built with (off unless a batch turns them on).
from coroner.core import api, conditions, decision, exits, fingerprint, memo, model, procfs, wire
from coroner.core.decision import AgentFacts, Decision, Facts, Policy, decide, lease_expiry
from coroner.core.decision import facts as decision_facts
from coroner.core.reasons import ConditionType, Evidence, Reason, Verdict
from coroner.core.world import World, lease_facts

# The agent, whole: its API client and port, its prober over a ProcReader and a pidfd table, the
# service (watch handlers, runtime, reconciler, pure step, executor, Lease loop, resync).
from coroner_agent import kube as agent_kube
from coroner_agent import pidfds as agent_pidfds
from coroner_agent import probe as agent_probe
from coroner_agent import prober as agent_prober
from coroner_agent import service as agent_service
from coroner_agent import verdict as agent_verdict
from coroner_operator import app as operator_app
from coroner_operator import kubeapi as operator_kubeapi
from coroner_operator import metrics as operator_metrics
from coroner_operator import settings as operator_settings

__all__ = [
    "AgentFacts",
    "ApiError",
    "ConditionType",
    "Decision",
    "Evidence",
    "Facts",
    "Policy",
    "Reason",
    "Verdict",
    "World",
    "agent_kube",
    "agent_pidfds",
    "agent_probe",
    "agent_prober",
    "agent_service",
    "agent_verdict",
    "api",
    "cli_apply",
    "cli_plan",
    "conditions",
    "decide",
    "decision",
    "decision_facts",
    "exits",
    "fingerprint",
    "lease_expiry",
    "lease_facts",
    "memo",
    "model",
    "operator_app",
    "operator_kubeapi",
    "operator_metrics",
    "operator_settings",
    "procfs",
    "retire_protocol",
    "wire",
]
