"""The decision: may this registration be retired, and if not, exactly why not.

One pure function, `decide`, is shared by the operator and by ``kubectl coroner plan`` so that a
human's plan and the operator's action can never disagree. It evaluates the conjunction of the
design (docs/architecture.md, "The one function that decides") line by line in its fixed order; the
first line that fails names the one `Reason` the registration lands in. Every way a fact can be
missing, stale, unparsable or contradictory fails some line: unknown is never dead.

The I/O shells gather `Facts` (agent and node facts, protecting Leases, peer registrations, the
retire permission) and pass the clock in as `now`; nothing here reads a clock, a file or the API.

Modules: `facts` (the inputs and the Policy), `known` (the registration as the conjunction reads
it), `trail` (the Decision and the evidence it records), `node` (node-level evidence),
`conjunction` (`decide` itself).
"""

from coroner.core.decision.conjunction import decide
from coroner.core.decision.facts import AgentFacts, Facts, LeaseFacts, NodeFacts, Policy, lease_expiry
from coroner.core.decision.known import AGENT_DEATH_EVIDENCE, same_registrant, squatters
from coroner.core.decision.trail import Decision, JSONValue

__all__ = [
    "AGENT_DEATH_EVIDENCE",
    "AgentFacts",
    "Decision",
    "Facts",
    "JSONValue",
    "LeaseFacts",
    "NodeFacts",
    "Policy",
    "decide",
    "lease_expiry",
    "same_registrant",
    "squatters",
]
