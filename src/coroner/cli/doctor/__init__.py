"""``kubectl coroner doctor`` without the I/O: one pure function per check, and the one list of them.

Each check reads raw objects as the API returned them (or `Unreadable` where a read failed) and
the instant `now`, and says PASS, WARN, FAIL or UNKNOWN in one line that names the failing objects and
the fix. UNKNOWN is a fact that could not be read; it is never shown as zero, and never as a pass.
Registrations are decided exactly as `coroner.cli.plan` decides them, with the policy the operator
publishes. The I/O shell is `coroner.cli.commands.doctor`.

The checks live by family: `install` (the CRD, the admission policies and their content),
`operator_lease` (the operator alive, its last sweep), `operator_memory` (its memory against its limit),
`grant` (the retire verb), `agents`, `node_loss`, `registrations` (unattested, held, blocked, squatting),
`injection` (Pods labelled for the registrar);
`outcome` is what a check says. `CHECKS` below is the one list, in the order doctor shows them.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from coroner.cli.doctor.access import (
    check_node_taint_access,
    check_system_namespace_access,
    check_worker_namespace_access,
)
from coroner.cli.doctor.agents import check_agents
from coroner.cli.doctor.grant import check_retire_grant, operator_identity
from coroner.cli.doctor.injection import check_registrar_injection
from coroner.cli.doctor.install import (
    ADMISSION_POLICIES,
    LEFTOVER_KINDS,
    Admission,
    check_admission_content,
    check_admission_policies,
    check_crd,
    plural_of,
)
from coroner.cli.doctor.mutation import check_admission_mutation
from coroner.cli.doctor.node_loss import check_node_loss
from coroner.cli.doctor.operator_lease import LAST_SWEEP_ANNOTATION, check_last_sweep, check_operator_alive
from coroner.cli.doctor.operator_memory import check_operator_memory
from coroner.cli.doctor.outcome import Check, CheckStatus, doctor_exit_code, failed, passed, warned
from coroner.cli.doctor.rbac import Rbac
from coroner.cli.doctor.registrations import check_blocked, check_held, check_squatting, check_unattested
from coroner.cli.doctor.seccomp import check_agent_seccomp
from coroner.cli.plan import PolicyChoice, Unreadable
from coroner.core.fingerprint import Plan
from coroner.core.held import HELD_GRACE_SECONDS
from coroner.core.world import World

__all__ = [
    "ADMISSION_POLICIES",
    "CHECKS",
    "LAST_SWEEP_ANNOTATION",
    "LEFTOVER_KINDS",
    "Admission",
    "Check",
    "CheckStatus",
    "Findings",
    "Rbac",
    "Unreadable",
    "check_admission_content",
    "check_admission_mutation",
    "check_admission_policies",
    "check_agent_seccomp",
    "check_agents",
    "check_blocked",
    "check_crd",
    "check_held",
    "check_last_sweep",
    "check_node_loss",
    "check_node_taint_access",
    "check_operator_alive",
    "check_operator_memory",
    "check_registrar_injection",
    "check_retire_grant",
    "check_squatting",
    "check_system_namespace_access",
    "check_unattested",
    "check_worker_namespace_access",
    "doctor_exit_code",
    "failed",
    "operator_identity",
    "passed",
    "plural_of",
    "run_checks",
    "warned",
]


#: A fact this doctor run did not read (a `Findings` field's default where callers may leave it out).
NOT_READ: Final = Unreadable(reason="not read")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Findings:
    """Everything one doctor run read (or could not: `Unreadable`) and was asked: every check's input."""

    crd: Mapping[str, Any] | Unreadable | None
    admission: Admission
    """The admission policies and bindings the operator verifies (`coroner.core.admission_digest.KINDS`)
    and those an older release may have left (`LEFTOVER_KINDS`), by kind."""
    operator_lease: Mapping[str, Any] | Unreadable | None
    """The operator's Lease: alive, its last sweep, its policy, and its user as it states it
    (`api.OPERATOR_USER_ANNOTATION`; `operator_identity`)."""
    nodes: Sequence[Mapping[str, Any]] | Unreadable
    leases: Sequence[Mapping[str, Any]] | Unreadable
    """Every Lease of the cluster."""
    world: World | Unreadable
    plan: Plan | Unreadable
    """Every registration decided with the operator's policy and the operator's retire permission."""
    operator_deployments: Sequence[Mapping[str, Any]] | Unreadable
    """The Deployments of the system namespace: the operator's ServiceAccount and so the release's
    namePrefix where its Lease does not state its user (`operator_identity`)."""
    cluster_wide: bool | None
    """Whether the operator holds retire in every namespace; None: could not be reviewed."""
    per_namespace: Mapping[str, bool | None]
    """Whether it holds retire, per namespace with registrations."""
    policy: PolicyChoice
    system_namespace: str
    expect_plan_only: bool
    attestation_grace_seconds: float
    now: datetime.datetime
    held_grace_seconds: float = HELD_GRACE_SECONDS
    """The bound past which `held` names a registration (`coroner.core.held`)."""
    operator_pods: Sequence[Mapping[str, Any]] | Unreadable = ()
    """The operator's Pods in the system namespace (`operator_memory.OPERATOR_POD_SELECTOR`)."""
    operator_metrics: Mapping[str, str | Unreadable] = dataclasses.field(default_factory=dict)
    """Each Running operator Pod's /metrics text, by Pod name, as read through the API server."""
    rbac: Rbac | Unreadable = NOT_READ
    """The cluster's roles and bindings (`access`: who can act as the agents or a worker's Pod)."""
    mutating_webhooks: Sequence[Mapping[str, Any]] | Unreadable = NOT_READ
    """The MutatingWebhookConfigurations (`admission-mutation`, with the admission's mutating policies)."""
    system_daemonsets: Sequence[Mapping[str, Any]] | Unreadable = NOT_READ
    system_configmaps: Sequence[Mapping[str, Any]] | Unreadable = NOT_READ
    """The DaemonSets and ConfigMaps of the system namespace (`agent-seccomp`)."""
    injection_pods: Sequence[Mapping[str, Any]] | Unreadable = NOT_READ
    """The Pods labelled for the registrar's injection, in every namespace (`registrar-injection`)."""


#: The checks, in the order doctor shows them. A new check is one pure function of `Findings`
#: returning a `Check` (built with `passed`, `warned`, `failed` or `unknown`) and one entry here.
CHECKS: Final[tuple[Callable[[Findings], Check], ...]] = (
    lambda f: check_crd(f.crd),
    lambda f: check_admission_policies(admission=f.admission),
    lambda f: check_admission_content(
        admission=f.admission,
        crd=f.crd,
        policy=f.policy,
        system_namespace=f.system_namespace,
        operator_deployments=f.operator_deployments,
        operator_lease=f.operator_lease,
    ),
    lambda f: check_operator_alive(
        lease=f.operator_lease,
        system_namespace=f.system_namespace,
        now=f.now,
        operator_deployments=f.operator_deployments,
    ),
    lambda f: check_last_sweep(lease=f.operator_lease, system_namespace=f.system_namespace),
    lambda f: check_operator_memory(
        pods=f.operator_pods, metrics=f.operator_metrics, system_namespace=f.system_namespace
    ),
    lambda f: check_retire_grant(
        cluster_wide=f.cluster_wide,
        per_namespace=f.per_namespace,
        expect_plan_only=f.expect_plan_only,
        system_namespace=f.system_namespace,
        operator_deployments=f.operator_deployments,
        operator_lease=f.operator_lease,
    ),
    lambda f: check_agents(nodes=f.nodes, leases=f.leases, system_namespace=f.system_namespace, now=f.now, plan=f.plan),
    lambda f: check_node_loss(
        world=f.world, plan=f.plan, policy=f.policy, system_namespace=f.system_namespace, now=f.now
    ),
    lambda f: check_unattested(plan=f.plan, now=f.now, grace_seconds=f.attestation_grace_seconds),
    lambda f: check_held(plan=f.plan, now=f.now, grace_seconds=f.held_grace_seconds),
    lambda f: check_blocked(
        plan=f.plan, expect_plan_only=f.expect_plan_only, permission_known=f.cluster_wide is not None
    ),
    lambda f: check_squatting(plan=f.plan),
    lambda f: check_system_namespace_access(rbac=f.rbac, system_namespace=f.system_namespace),
    lambda f: check_worker_namespace_access(rbac=f.rbac, world=f.world),
    lambda f: check_node_taint_access(
        rbac=f.rbac, out_of_service_evidence=f.policy.policy.node_out_of_service_evidence
    ),
    lambda f: check_admission_mutation(
        webhooks=f.mutating_webhooks, policies=f.admission.get("MutatingAdmissionPolicy", NOT_READ)
    ),
    lambda f: check_agent_seccomp(
        daemonsets=f.system_daemonsets, configmaps=f.system_configmaps, system_namespace=f.system_namespace
    ),
    lambda f: check_registrar_injection(
        pods=f.injection_pods,
        policies=f.admission.get("MutatingAdmissionPolicy", NOT_READ),
        bindings=f.admission.get("MutatingAdmissionPolicyBinding", NOT_READ),
        world=f.world,
        now=f.now,
    ),
)


def run_checks(findings: Findings, checks: Sequence[Callable[[Findings], Check]] = CHECKS) -> list[Check]:
    """Every check of `checks` on one doctor run's findings, in order."""
    return [check(findings) for check in checks]
