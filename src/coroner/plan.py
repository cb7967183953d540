"""``kubectl coroner plan | apply | doctor`` without the I/O: facts, decisions, fingerprints, output.

A human's plan must reach the operator's verdict from the operator's facts, or approving it would
mean nothing. So this module fills the operator's own cache (`coroner.world.World`) from LISTed
objects and asks the shared `coroner.decision.decide`, and fingerprints rows exactly as
`coroner.fingerprint` defines them. Nothing here talks to the API or reads a clock (callers pass
`now`), so the replay rules of ``apply``, the retirement patch and every ``doctor`` check are each a
unit test away. The I/O shell is `coroner.kubectl_plugin`.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import yaml
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from coroner import api, conditions, fingerprint, model, retirement
from coroner.decision import Decision, Policy, decide
from coroner.fingerprint import Plan, PlanEntry, PlanRow
from coroner.reasons import ApplyAbort, ConditionType, Reason
from coroner.world import Key, World, agent_facts_from_lease, lease_facts, node_facts

#: The operator's own Lease in the system namespace; it renews it after every sweep.
OPERATOR_LEASE: Final = api.OPERATOR_LEASE
#: Annotation on that Lease holding the last sweep's outcome as JSON.
LAST_SWEEP_ANNOTATION: Final = api.LAST_SWEEP_ANNOTATION
#: The ServiceAccount the manifests run the operator as.
OPERATOR_SERVICE_ACCOUNT: Final = "coroner-operator"
#: The ValidatingAdmissionPolicies of manifests/base/admission-policies.yaml, each bound by a
#: binding of the same name; doctor names the missing ones.
ADMISSION_POLICIES: Final = (
    "coroner-node-label-matches-spec",
    "coroner-retire-requires-capability",
    "coroner-agent-attests-own-node-only",
    "coroner-status-fields-by-identity",
    "coroner-agent-renews-own-lease-only",
)
#: Who ``apply`` reports as the author of its Events.
COMPONENT: Final = "kubectl-coroner"

_FINGERPRINT: Final = re.compile(rf"{fingerprint.FINGERPRINT_VERSION}:sha256:[0-9a-f]{{64}}")
#: How many object names a table line shows before "and N more" (JSON always has them all).
_SHOWN_NAMES: Final = 10


def operator_username(system_namespace: str = api.SYSTEM_NAMESPACE) -> str:
    """The operator's user name as the API server authenticates its ServiceAccount."""
    return f"system:serviceaccount:{system_namespace}:{OPERATOR_SERVICE_ACCOUNT}"


def valid_fingerprint(value: str) -> bool:
    """The shape `coroner.fingerprint` produces; anything else was mistyped or cut off."""
    return _FINGERPRINT.fullmatch(value) is not None


# --- facts and the plan -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Listing:
    """What one plan read from the API: one LIST per kind, plus the retire permission per namespace."""

    registrations: Sequence[Mapping[str, Any]]
    """Raw WorkerRegistrations of the planned scope (one namespace, or all)."""
    leases: Sequence[Mapping[str, Any]]
    """Raw Leases: the agent Leases of the system namespace and the protecting Leases of the scope."""
    nodes: Sequence[Mapping[str, Any]]
    """Raw Nodes (all of them: a node absent from the LIST is not seen, never "deleted")."""
    retire_permission: Mapping[str, bool | None]
    """Per namespace: whether the deciding identity holds ``retire``; None is unknown (not granted)."""
    system_namespace: str = api.SYSTEM_NAMESPACE


def build_world(listing: Listing) -> World:
    """The operator's cache, filled the way its watches fill it."""
    world = World(system_namespace=listing.system_namespace)
    for node in listing.nodes:
        world.put_node(node)
    # A complete LIST is what "synced" means to the operator: from here a node that is absent is
    # "not seen", which is still not deleted (only a live GET past the quarantine can say that).
    world.nodes_synced = True
    for lease in listing.leases:
        world.put_lease(lease)
    for body in listing.registrations:
        world.put_registration(dict(body))
    world.retire_permission.update(listing.retire_permission)
    return world


def decide_all(*, world: World, policy: Policy, now: datetime.datetime) -> Plan:
    """Every registration of `world` decided as the operator decides it; pure, like `decide`."""
    entries = []
    for key in sorted(world.parsed):
        registration = world.parsed[key]
        decision = decide(registration=registration, facts=world.facts_for(key, now=now), policy=policy, now=now)
        entries.append(
            PlanEntry(
                registration=registration,
                decision=decision,
                row=fingerprint.plan_row(registration=registration, decision=decision),
            )
        )
    return assemble(entries)


def assemble(entries: Iterable[PlanEntry]) -> Plan:
    """A `Plan` of decided entries: counts for every reason (zero included) and both fingerprints."""
    ordered = tuple(sorted(entries, key=lambda entry: key_of(entry.registration)))
    rows = [entry.row for entry in ordered]
    tally: dict[Reason, int] = dict.fromkeys(Reason, 0)
    for entry in ordered:
        tally[entry.decision.reason] += 1
    return Plan(
        entries=ordered,
        counts=tally,
        registry_fingerprint=fingerprint.registry_fingerprint(rows),
        candidate_fingerprint=fingerprint.candidate_fingerprint(rows),
    )


def key_of(registration: model.Registration) -> Key:
    """(namespace, name) of a parsed registration."""
    return (registration.namespace or "", registration.name or "")


def display(key: Key) -> str:
    """``namespace/name``."""
    return f"{key[0]}/{key[1]}"


def candidates(plan: Plan) -> list[PlanEntry]:
    """The rows a human may retire with ``apply``."""
    return [entry for entry in plan.entries if entry.decision.retirable]


# --- apply --------------------------------------------------------------------------------------


class RowOutcome(enum.StrEnum):
    """What ``apply`` did, or would do, with one named row."""

    WOULD_RETIRE = "WouldRetire"
    """Preview (no ``--yes``): eligible, nothing written."""
    RETIRED = "Retired"
    """Retired by this run under compare-and-swap."""
    ALREADY_RETIRED = "AlreadyRetired"
    """Replay: already retired with the evidence the plan showed; nothing written, not drift."""
    RETIRE_CONFLICT = "RetireConflict"
    """The object changed between the read and the write (409/422/404): it moved; nothing written."""
    RETIRE_ABANDONED = "RetireAbandoned"
    """Decided again right before the write (live Leases) and no longer eligible; nothing written."""
    RETIRE_PERMISSION_MISSING = "RetirePermissionMissing"
    """The caller lost ``retire`` (or admission refused the write); nothing written."""
    RETIRE_FAILED = "RetireFailed"
    """The write failed for another reason; nothing is known to have changed."""

    @property
    def moved(self) -> bool:
        """The world moved under this row: drift found at write time."""
        return self in (RowOutcome.RETIRE_CONFLICT, RowOutcome.RETIRE_ABANDONED)

    @property
    def done(self) -> bool:
        """The row ended in the state apply was asked for (or would, in a preview)."""
        return self in (RowOutcome.WOULD_RETIRE, RowOutcome.RETIRED, RowOutcome.ALREADY_RETIRED)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ApplyAssessment:
    """``apply``'s reading of a freshly recomputed plan against the fingerprints a human approved."""

    abort: ApplyAbort | None
    """Set when the recomputed plan is not the approved one: nothing may be written."""
    abort_detail: str
    to_retire: tuple[PlanEntry, ...]
    """Named rows that are eligible now."""
    already_retired: tuple[PlanEntry, ...]
    """Named rows retired since the plan, with the evidence it showed (a replay)."""
    unknown: tuple[Key, ...]
    """Named rows that do not exist in the planned scope."""
    not_candidates: tuple[PlanEntry, ...]
    """Named rows that exist but are not eligible."""
    registry_fingerprint: str
    """The recomputed registry fingerprint, with replayed rows as planned."""
    candidate_fingerprint: str

    @property
    def refusals(self) -> list[str]:
        """One sentence per named row apply will not act on."""
        sentences = [
            f"WorkerRegistration {display(key)} does not exist; check the name against `kubectl coroner plan`."
            for key in self.unknown
        ]
        for entry in self.not_candidates:
            reason = entry.decision.reason
            sentences.append(
                f"WorkerRegistration {display(key_of(entry.registration))} is not a retirement candidate "
                f"({reason}): {entry.decision.detail}"
            )
        return sentences


def replayed_row(entry: PlanEntry) -> PlanRow | None:
    """The row as it was planned, for a registration retired since as that plan said; else None.

    A registration retired with ``decision: EligibleStaleOrphan`` and evidence E was, when it was
    retired, the eligible row with death evidence E: exactly the candidate row a plan showed. Its
    retirement moves both fingerprints (its reason is now AlreadyTerminal), so without this a
    replayed apply could never tell its own success from drift.
    """
    registration = entry.registration
    retirement = registration.retirement
    if not registration.retired or retirement is None or not retirement.reason:
        return None
    if retirement.decision != Reason.ELIGIBLE_STALE_ORPHAN.value:
        return None
    return dataclasses.replace(entry.row, reason=Reason.ELIGIBLE_STALE_ORPHAN, death_evidence=retirement.reason)


def assess_apply(
    *,
    plan: Plan,
    names: Sequence[Key],
    registry_fingerprint: str,
    candidate_fingerprint: str,
) -> ApplyAssessment:
    """Compare a recomputed plan with the approved fingerprints and sort the named rows.

    Replay: a *named* row that has since been retired as planned (`replayed_row`) counts as the
    planned candidate row, so re-running a successful apply finds no drift and reports the row
    ``AlreadyRetired``. Every other change — a new, changed, retired-by-someone-else or vanished
    row, a flipped reason — is drift. The candidate set is compared first: if what would be retired
    moved, that is the abort reason (``CandidateSetMoved``); otherwise any other row that moved
    aborts with ``RegistryMoved``.
    """
    by_key = {key_of(entry.registration): entry for entry in plan.entries}
    to_retire: list[PlanEntry] = []
    already: list[PlanEntry] = []
    unknown: list[Key] = []
    not_candidates: list[PlanEntry] = []
    replayed: dict[Key, PlanRow] = {}
    for key in dict.fromkeys(names):
        entry = by_key.get(key)
        if entry is None:
            unknown.append(key)
            continue
        row = replayed_row(entry)
        if row is not None:
            replayed[key] = row
            already.append(entry)
        elif entry.decision.retirable:
            to_retire.append(entry)
        else:
            not_candidates.append(entry)
    rows = [replayed.get(key_of(entry.registration), entry.row) for entry in plan.entries]
    registry_now = fingerprint.registry_fingerprint(rows)
    candidates_now = fingerprint.candidate_fingerprint(rows)
    abort: ApplyAbort | None = None
    detail = ""
    fix = (
        "the cluster changed since the plan, or the plan was made on another cluster, for another "
        "namespace scope or by another identity; run `kubectl coroner plan` again, review it, and "
        "apply with its fingerprints. Nothing was changed."
    )
    if abort_hint := _unnamed_replay_hint(
        plan=plan,
        replayed=replayed,
        registry_fingerprint=registry_fingerprint,
        candidate_fingerprint=candidate_fingerprint,
    ):
        fix = f"{abort_hint} Nothing was changed."
    if candidates_now != candidate_fingerprint:
        abort = ApplyAbort.CANDIDATE_SET_MOVED
        detail = (
            f"{abort}: the retirement candidates are not the ones approved (candidate fingerprint "
            f"{candidate_fingerprint} approved, {candidates_now} now); {fix}"
        )
    elif registry_now != registry_fingerprint:
        abort = ApplyAbort.REGISTRY_MOVED
        detail = (
            f"{abort}: the registry is not the one approved (registry fingerprint {registry_fingerprint} "
            f"approved, {registry_now} now); {fix}"
        )
    return ApplyAssessment(
        abort=abort,
        abort_detail=detail,
        to_retire=tuple(to_retire),
        already_retired=tuple(already),
        unknown=tuple(unknown),
        not_candidates=tuple(not_candidates),
        registry_fingerprint=registry_now,
        candidate_fingerprint=candidates_now,
    )


def _unnamed_replay_hint(
    *, plan: Plan, replayed: Mapping[Key, PlanRow], registry_fingerprint: str, candidate_fingerprint: str
) -> str:
    """Advice when the only drift is candidates retired as planned but not named this time.

    Retiring one plan's candidates over several runs is legitimate, but replay counts only named
    rows (fingerprints hash content, so which rows were candidates cannot be read back from them).
    One extra recomputation tells whether naming the other retired rows would match exactly.
    """
    unnamed = {
        key_of(entry.registration): row
        for entry in plan.entries
        if key_of(entry.registration) not in replayed and (row := replayed_row(entry)) is not None
    }
    if not unnamed:
        return ""
    rows = [{**replayed, **unnamed}.get(key_of(entry.registration), entry.row) for entry in plan.entries]
    if (
        fingerprint.registry_fingerprint(rows) != registry_fingerprint
        or fingerprint.candidate_fingerprint(rows) != candidate_fingerprint
    ):
        return ""
    names = " ".join(name for _, name in sorted(unnamed))
    return (
        f"the only change since the plan is the retirement, as planned, of "
        f"{_names([display(key) for key in sorted(unnamed)])}; name those too ({names}) to replay, or run "
        f"`kubectl coroner plan` again."
    )


def retirement_patch(
    *,
    body: Mapping[str, Any],
    registration: model.Registration,
    decision: Decision,
    retired_by: str,
    now: datetime.datetime,
) -> list[dict[str, Any]]:
    """The compare-and-swap JSON patch that retires one registration, as the operator writes it.

    ``test`` the resourceVersion read and the attestation relied on (verbatim), then set the
    ``Retired`` condition and ``status.retirement``. The other conditions are written back exactly
    as stored: the admission policy coroner-status-fields-by-identity refuses anyone but the
    operator a change to ``Attested`` or ``Retirable``, and re-rendering them could change them.
    """
    if not decision.retirable or decision.death_evidence is None:
        raise ValueError(f"{registration.display_name} is {decision.reason}, not retirable; nothing to patch")
    evidence = decision.death_evidence.value
    status = body.get("status")
    stored_status: Mapping[str, Any] | None = status if isinstance(status, Mapping) else None
    raw_attestation = None if stored_status is None else stored_status.get("attestation")
    stored_conditions = [] if stored_status is None else stored_status.get("conditions")
    if not isinstance(stored_conditions, list):
        stored_conditions = []
    updated = conditions.set_condition(
        registration.conditions,
        type=ConditionType.RETIRED,
        status=True,
        reason=evidence,
        message=f"retired by {retired_by} with kubectl coroner apply: {decision.detail}",
        observed_generation=registration.generation,
        now=now,
    )
    retired = conditions.find_condition(updated, type=ConditionType.RETIRED)
    assert retired is not None  # set_condition always leaves one of its type
    rendered = conditions.render_condition(retired)
    written = [
        rendered if isinstance(item, Mapping) and item.get("type") == ConditionType.RETIRED.value else item
        for item in stored_conditions
    ]
    if rendered not in written:
        written.append(rendered)
    return retirement.status_ops(
        body=body,
        resource_version=str(registration.resource_version),
        conditions=written,
        retirement=retirement.retirement_record(
            decision=decision, retired_by=retired_by, now=now, attestation=raw_attestation
        ),
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class RowResult:
    """One named row of an ``apply`` run."""

    key: Key
    outcome: RowOutcome
    detail: str
    node_name: str | None = None
    pid: int | None = None
    evidence: str | None = None


def apply_exit_code(results: Sequence[RowResult]) -> int:
    """3 when a row moved under the write (drift), 2 when one was refused or failed, else 0."""
    if any(result.outcome.moved for result in results):
        return 3
    if any(not result.outcome.done for result in results):
        return 2
    return 0


# --- doctor -------------------------------------------------------------------------------------


class CheckStatus(enum.StrEnum):
    """A doctor check's outcome; UNKNOWN is a fact that could not be read, never a pass."""

    PASS = "PASS"
    FAIL = "FAIL"
    UNKNOWN = "UNKNOWN"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Check:
    """One doctor check: its status, one line for a person, the objects it names, its facts."""

    name: str
    status: CheckStatus
    summary: str
    objects: tuple[str, ...] = ()
    facts: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Unreadable:
    """A read that failed (forbidden, not served, ...): the fact is unknown, and this says why."""

    reason: str


def check_crd(crd: Mapping[str, Any] | Unreadable | None) -> Check:
    """The WorkerRegistration CRD exists, is Established and serves our version."""
    name = "crd"
    subject = f"CustomResourceDefinition/{api.CRD_NAME}"
    if isinstance(crd, Unreadable):
        return Check(name=name, status=CheckStatus.UNKNOWN, summary=f"{subject} could not be read: {crd.reason}")
    if crd is None:
        return Check(
            name=name,
            status=CheckStatus.FAIL,
            summary=f"{subject} is not installed; install it with `kubectl apply -k manifests/overlays/plan-only`.",
            objects=(subject,),
        )
    established = _condition_status(crd.get("status"), "Established")
    served = [
        version.get("name")
        for version in (crd.get("spec") or {}).get("versions") or []
        if isinstance(version, Mapping) and version.get("served")
    ]
    if established != "True":
        return Check(
            name=name,
            status=CheckStatus.FAIL,
            summary=f"{subject} is not Established (status {established or 'absent'}); see `kubectl describe crd {api.CRD_NAME}`.",
            objects=(subject,),
            facts={"established": established, "servedVersions": served},
        )
    if api.VERSION not in served:
        return Check(
            name=name,
            status=CheckStatus.FAIL,
            summary=f"{subject} does not serve {api.VERSION} (serves {', '.join(map(str, served)) or 'nothing'}); re-apply the manifests.",
            objects=(subject,),
            facts={"established": established, "servedVersions": served},
        )
    return Check(
        name=name,
        status=CheckStatus.PASS,
        summary=f"{subject} is Established and serves {api.VERSION}.",
        facts={"established": established, "servedVersions": served},
    )


def check_admission_policies(
    *,
    policies: Sequence[Mapping[str, Any]] | Unreadable,
    bindings: Sequence[Mapping[str, Any]] | Unreadable,
) -> Check:
    """The ValidatingAdmissionPolicies exist, each bound with validationActions Deny."""
    name = "admission-policies"
    for listed in (policies, bindings):
        if isinstance(listed, Unreadable):
            return Check(
                name=name, status=CheckStatus.UNKNOWN, summary=f"admission policies could not be read: {listed.reason}"
            )
    assert not isinstance(policies, Unreadable) and not isinstance(bindings, Unreadable)
    present = {_name(policy) for policy in policies}
    bound: dict[str, list[str]] = {}
    for binding in bindings:
        spec = binding.get("spec") or {}
        actions = spec.get("validationActions") or []
        if "Deny" in actions:
            bound.setdefault(str(spec.get("policyName") or ""), []).append(_name(binding))
    missing = [f"ValidatingAdmissionPolicy/{policy}" for policy in ADMISSION_POLICIES if policy not in present]
    missing += [f"ValidatingAdmissionPolicyBinding/{policy}" for policy in ADMISSION_POLICIES if policy not in bound]
    facts = {"policies": sorted(p for p in present if p in ADMISSION_POLICIES), "boundPolicies": sorted(bound)}
    if missing:
        return Check(
            name=name,
            status=CheckStatus.FAIL,
            summary=f"missing (or not bound with Deny): {_names(missing)}; re-apply the manifests "
            f"(`kubectl apply -k manifests/overlays/plan-only`).",
            objects=tuple(missing),
            facts=facts,
        )
    return Check(
        name=name,
        status=CheckStatus.PASS,
        summary=f"all {len(ADMISSION_POLICIES)} policies present and bound with Deny.",
        facts=facts,
    )


def check_operator_alive(
    *, lease: Mapping[str, Any] | Unreadable | None, system_namespace: str, now: datetime.datetime
) -> Check:
    """The operator's Lease was renewed within its own duration."""
    name = "operator-alive"
    subject = f"Lease {system_namespace}/{OPERATOR_LEASE}"
    if isinstance(lease, Unreadable):
        return Check(name=name, status=CheckStatus.UNKNOWN, summary=f"{subject} could not be read: {lease.reason}")
    if lease is None:
        return Check(
            name=name,
            status=CheckStatus.FAIL,
            summary=f"{subject} does not exist: the operator has never completed a sweep here; check "
            f"`kubectl -n {system_namespace} get deploy coroner-operator` and its logs.",
            objects=(subject,),
        )
    facts = lease_facts(lease)
    until = _expiry(facts.renew_time, facts.lease_duration_seconds)
    renewed = "never" if facts.renew_time is None else model.format_time(facts.renew_time)
    recorded = {"holderIdentity": facts.holder_identity, "renewTime": renewed, "expires": _stamp(until)}
    if until is None or now >= until:
        return Check(
            name=name,
            status=CheckStatus.FAIL,
            summary=f"{subject} (holder {facts.holder_identity or '?'}) was last renewed {renewed} and has "
            f"{'no computable expiry' if until is None else 'expired at ' + model.format_time(until)}: the "
            f"operator is not running or not completing sweeps; check its pod and logs.",
            objects=(subject,),
            facts=recorded,
        )
    return Check(
        name=name,
        status=CheckStatus.PASS,
        summary=f"{subject} held by {facts.holder_identity or '?'}, renewed {renewed}, valid until "
        f"{model.format_time(until)}.",
        facts=recorded,
    )


def check_last_sweep(*, lease: Mapping[str, Any] | Unreadable | None, system_namespace: str) -> Check:
    """The outcome of the operator's last sweep, per namespace, as it recorded it."""
    name = "last-sweep"
    subject = f"Lease {system_namespace}/{OPERATOR_LEASE}"
    if isinstance(lease, Unreadable):
        return Check(name=name, status=CheckStatus.UNKNOWN, summary=f"{subject} could not be read: {lease.reason}")
    annotations = ((lease or {}).get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(LAST_SWEEP_ANNOTATION)
    if raw is None:
        return Check(
            name=name,
            status=CheckStatus.UNKNOWN,
            summary=f"the last sweep's outcome was never recorded ({subject} has no {LAST_SWEEP_ANNOTATION} "
            f"annotation): unknown, not zero.",
        )
    try:
        sweep = json.loads(raw)
    except ValueError:
        sweep = None
    if not isinstance(sweep, Mapping) or not isinstance(sweep.get("failures"), Mapping):
        return Check(
            name=name,
            status=CheckStatus.UNKNOWN,
            summary=f"the {LAST_SWEEP_ANNOTATION} annotation on {subject} is not a sweep record.",
        )
    failures = {str(ns): count for ns, count in sweep["failures"].items() if _positive(count)}
    recorded_errors = sweep.get("errors")
    errors: Mapping[str, Any] = recorded_errors if isinstance(recorded_errors, Mapping) else {}
    facts = {
        "time": sweep.get("time"),
        "registrations": sweep.get("registrations"),
        "namespaces": sweep.get("namespaces"),
        "failures": failures,
        "errors": dict(errors),
        "byReason": sweep.get("byReason"),
    }
    at = sweep.get("time") or "an unrecorded time"
    if failures:
        named = [
            f"{namespace}: {failures[namespace]} failed ({errors.get(namespace, 'no error recorded')})"
            for namespace in sorted(failures)
        ]
        return Check(
            name=name,
            status=CheckStatus.FAIL,
            summary=f"the last sweep at {at} failed in namespace(s) {'; '.join(named)}.",
            objects=tuple(f"namespace/{namespace}" for namespace in sorted(failures)),
            facts=facts,
        )
    counted = sweep.get("registrations")
    of = f"{counted} registrations" if isinstance(counted, int) else "an unrecorded number of registrations"
    return Check(
        name=name,
        status=CheckStatus.PASS,
        summary=f"the last sweep at {at} decided {of} with no failures.",
        facts=facts,
    )


def check_retire_grant(
    *,
    cluster_wide: bool | None,
    per_namespace: Mapping[str, bool | None],
    expect_plan_only: bool,
    system_namespace: str,
    unknown_reason: str = "",
) -> Check:
    """Whether the operator holds ``retire`` (SubjectAccessReview), against what was expected.

    `cluster_wide` answers for every namespace; `per_namespace` for those holding registrations
    (a grant may be a RoleBinding). None means the review could not be made.
    """
    name = "retire-grant"
    user = operator_username(system_namespace)
    if cluster_wide is None:
        return Check(
            name=name,
            status=CheckStatus.UNKNOWN,
            summary=f"could not review whether {user} holds retire{': ' + unknown_reason if unknown_reason else ''} "
            f"(needs create on subjectaccessreviews).",
        )
    lacking = sorted(ns for ns, allowed in per_namespace.items() if allowed is not True)
    unknown = sorted(ns for ns, allowed in per_namespace.items() if allowed is None)
    granted_everywhere = cluster_wide or not lacking
    facts = {
        "user": user,
        "clusterWide": cluster_wide,
        "namespacesWithoutGrant": lacking,
        "expectPlanOnly": expect_plan_only,
    }
    if unknown:
        return Check(
            name=name,
            status=CheckStatus.UNKNOWN,
            summary=f"could not review retire for {user} in namespace(s) {_names(unknown)}.",
            facts=facts,
        )
    if expect_plan_only:
        if cluster_wide or (per_namespace and not lacking):
            return Check(
                name=name,
                status=CheckStatus.FAIL,
                summary=f"{user} holds retire but the cluster is expected to be plan-only; remove the "
                f"retire-grant component (or run doctor without --expect-plan-only).",
                objects=(user,),
                facts=facts,
            )
        return Check(
            name=name,
            status=CheckStatus.PASS,
            summary=f"{user} does not hold retire: plan-only, as expected.",
            facts=facts,
        )
    if cluster_wide:
        return Check(
            name=name, status=CheckStatus.PASS, summary=f"{user} holds retire in every namespace.", facts=facts
        )
    if granted_everywhere and per_namespace:
        return Check(
            name=name,
            status=CheckStatus.PASS,
            summary=f"{user} holds retire in every namespace with registrations ({len(per_namespace)}).",
            facts=facts,
        )
    where = f" in namespace(s) {_names(lacking)}" if lacking else ""
    return Check(
        name=name,
        status=CheckStatus.FAIL,
        summary=f"{user} does not hold retire{where}: the operator runs plan-only; grant it with the "
        f"retire-grant component (`kubectl apply -k manifests/overlays/production`), or pass "
        f"--expect-plan-only if that is intended.",
        objects=(user,),
        facts=facts,
    )


def check_agents(
    *,
    nodes: Sequence[Mapping[str, Any]] | Unreadable,
    leases: Sequence[Mapping[str, Any]] | Unreadable,
    system_namespace: str,
    now: datetime.datetime,
) -> Check:
    """Every Ready node has a live agent Lease whose boot id is the Node's (where it publishes one)."""
    name = "agents"
    if isinstance(nodes, Unreadable):
        return Check(name=name, status=CheckStatus.UNKNOWN, summary=f"Nodes could not be listed: {nodes.reason}")
    if isinstance(leases, Unreadable):
        return Check(
            name=name, status=CheckStatus.UNKNOWN, summary=f"agent Leases could not be listed: {leases.reason}"
        )
    agents = {}
    for lease in leases:
        meta = lease.get("metadata") or {}
        lease_name = str(meta.get("name") or "")
        if meta.get("namespace") == system_namespace and lease_name.startswith(api.AGENT_LEASE_PREFIX):
            agents[lease_name[len(api.AGENT_LEASE_PREFIX) :]] = agent_facts_from_lease(lease)
    ready = sorted((_name(node), node) for node in nodes if _condition_status(node.get("status"), "Ready") == "True")
    problems: dict[str, str] = {}
    for node_name, node in ready:
        agent = agents.get(node_name)
        lease_ref = f"Lease {system_namespace}/{api.AGENT_LEASE_PREFIX}{node_name}"
        if agent is None:
            problems[node_name] = f"no agent ({lease_ref} not found)"
            continue
        until = _expiry(agent.renew_time, agent.lease_duration_seconds)
        if until is None or now >= until:
            state = "has no computable expiry" if until is None else f"expired at {model.format_time(until)}"
            problems[node_name] = f"agent not live ({lease_ref} {state})"
            continue
        node_boot = node_facts(node).boot_id
        if agent.boot_id is None:
            problems[node_name] = f"agent publishes no boot id ({lease_ref})"
        elif node_boot is not None and node_boot != agent.boot_id:
            problems[node_name] = f"agent boot id {agent.boot_id} differs from the Node's bootID {node_boot}"
    facts = {"readyNodes": [n for n, _ in ready], "problems": problems}
    if problems:
        described = "; ".join(f"{node}: {problem}" for node, problem in sorted(problems.items())[:_SHOWN_NAMES])
        more = len(problems) - _SHOWN_NAMES
        return Check(
            name=name,
            status=CheckStatus.FAIL,
            summary=f"{len(problems)} of {len(ready)} Ready node(s) lack a healthy agent: {described}"
            f"{f'; and {more} more' if more > 0 else ''}. Check the coroner-agent DaemonSet pods on them.",
            objects=tuple(f"node/{node}" for node in sorted(problems)),
            facts=facts,
        )
    return Check(
        name=name,
        status=CheckStatus.PASS,
        summary=f"every Ready node ({len(ready)}) has a live agent on the Node's boot.",
        facts=facts,
    )


def blocked(entry: PlanEntry) -> bool:
    """Dead by evidence the decision accepted, yet preserved by a line where time alone will not help.

    Death evidence is established before the agent, heartbeat, conflict, Lease and permission lines
    of the conjunction; of those, only HeartbeatNotExpired resolves by the clock. The others need
    someone to act (grant retire, repair an agent, release a Lease, resolve a conflict).
    """
    decision = entry.decision
    return (
        decision.death_evidence is not None
        and not decision.retirable
        and decision.reason not in (Reason.HEARTBEAT_NOT_EXPIRED, Reason.ALREADY_TERMINAL)
    )


def check_unattested(*, plan: Plan | Unreadable, now: datetime.datetime, grace_seconds: float) -> Check:
    """Active registrations still without their agent's attestation after a grace period."""
    name = "unattested"
    if isinstance(plan, Unreadable):
        return Check(name=name, status=CheckStatus.UNKNOWN, summary=f"registrations could not be read: {plan.reason}")
    grace = datetime.timedelta(seconds=grace_seconds)
    stuck = [
        entry
        for entry in plan.entries
        if entry.decision.reason == Reason.ATTESTATION_MISSING
        and (entry.registration.creation_time is None or now - entry.registration.creation_time >= grace)
    ]
    named = [display(key_of(entry.registration)) for entry in stuck]
    facts = {"count": len(stuck), "graceSeconds": grace_seconds, "registrations": named}
    if stuck:
        nodes = sorted({entry.registration.node_name or "?" for entry in stuck})
        return Check(
            name=name,
            status=CheckStatus.FAIL,
            summary=f"{len(stuck)} registration(s) unattested for over {grace_seconds:g}s: {_names(named)} "
            f"(node(s) {_names(nodes)}); check the agents of those nodes.",
            objects=tuple(f"workerregistration/{n}" for n in named),
            facts=facts,
        )
    return Check(
        name=name,
        status=CheckStatus.PASS,
        summary=f"0 of {len(plan.entries)} registration(s) unattested for over {grace_seconds:g}s.",
        facts=facts,
    )


def check_blocked(*, plan: Plan | Unreadable, expect_plan_only: bool, permission_known: bool = True) -> Check:
    """Registrations the operator would retire but for something a person must fix.

    `plan` must be decided with the operator's retire permission; where that permission could not
    be reviewed (`permission_known` False), RetirePermissionMissing rows are unknown, not blocked.
    """
    name = "blocked"
    if isinstance(plan, Unreadable):
        return Check(name=name, status=CheckStatus.UNKNOWN, summary=f"registrations could not be read: {plan.reason}")
    found = [entry for entry in plan.entries if blocked(entry)]
    by_reason: dict[str, list[str]] = {}
    for entry in found:
        by_reason.setdefault(entry.decision.reason.value, []).append(display(key_of(entry.registration)))
    waiting = (
        by_reason.pop(Reason.RETIRE_PERMISSION_MISSING.value, []) if expect_plan_only or not permission_known else []
    )
    expected = waiting if permission_known else []
    unknown = [] if permission_known else waiting
    facts = {
        "count": sum(len(names) for names in by_reason.values()),
        "byReason": by_reason,
        "expectedPlanOnly": expected,
        "operatorPermissionUnknown": unknown,
    }
    if by_reason:
        described = "; ".join(f"{reason} {len(names)}: {_names(names)}" for reason, names in sorted(by_reason.items()))
        return Check(
            name=name,
            status=CheckStatus.FAIL,
            summary=f"{facts['count']} dead registration(s) preserved by a fixable cause: {described}. "
            f"`kubectl coroner plan` explains each.",
            objects=tuple(f"workerregistration/{n}" for names in by_reason.values() for n in names),
            facts=facts,
        )
    if unknown:
        return Check(
            name=name,
            status=CheckStatus.UNKNOWN,
            summary=f"{len(unknown)} dead registration(s) wait for the retire verb, and whether the operator "
            f"holds it could not be reviewed: {_names(unknown)}.",
            objects=tuple(f"workerregistration/{n}" for n in unknown),
            facts=facts,
        )
    tail = f" ({len(expected)} waiting for retire, plan-only as expected)" if expected else ""
    return Check(
        name=name,
        status=CheckStatus.PASS,
        summary=f"0 of {len(plan.entries)} registration(s) retirable-but-blocked{tail}.",
        facts=facts,
    )


def doctor_exit_code(checks: Sequence[Check]) -> int:
    """1 when any check FAILs; UNKNOWN alone does not fail (it is reported, not guessed)."""
    return 1 if any(check.status == CheckStatus.FAIL for check in checks) else 0


# --- output -------------------------------------------------------------------------------------


def plan_document(
    plan: Plan,
    *,
    namespace: str | None,
    now: datetime.datetime,
    retire_permission: Mapping[str, bool | None],
) -> dict[str, Any]:
    """The plan as ``-o json`` / ``-o yaml`` print it."""
    return {
        "apiVersion": api.API_VERSION,
        "kind": "Plan",
        "scope": {"namespace": namespace, "allNamespaces": namespace is None},
        "generatedTime": model.format_time(now, fraction=True),
        "registryFingerprint": plan.registry_fingerprint,
        "candidateFingerprint": plan.candidate_fingerprint,
        "counts": {reason.value: count for reason, count in plan.counts.items()},
        "total": len(plan.entries),
        "retirePermission": {ns: allowed for ns, allowed in sorted(retire_permission.items())},
        "candidates": [display(key_of(entry.registration)) for entry in candidates(plan)],
        "registrations": [_entry_document(entry) for entry in plan.entries],
    }


def _entry_document(entry: PlanEntry) -> dict[str, Any]:
    registration, decision = entry.registration, entry.decision
    attestation = registration.attestation
    return {
        "namespace": registration.namespace,
        "name": registration.name,
        "uid": registration.uid,
        "nodeName": registration.node_name,
        "pid": registration.incarnation.pid,
        "verdict": entry.row.verdict,
        "attestationEvidence": None
        if attestation is None or attestation.evidence is None
        else str(attestation.evidence),
        "reason": decision.reason.value,
        "retirable": decision.retirable,
        "deathEvidence": entry.row.death_evidence,
        "detail": decision.detail,
        "facts": dict(decision.evidence),
    }


def apply_document(
    *,
    assessment: ApplyAssessment,
    results: Sequence[RowResult],
    preview: bool,
    retired_by: str | None,
) -> dict[str, Any]:
    """An apply run as ``-o json`` prints it."""
    return {
        "apiVersion": api.API_VERSION,
        "kind": "ApplyResult",
        "preview": preview,
        "retiredBy": retired_by,
        "abort": None if assessment.abort is None else assessment.abort.value,
        "abortDetail": assessment.abort_detail or None,
        "registryFingerprint": assessment.registry_fingerprint,
        "candidateFingerprint": assessment.candidate_fingerprint,
        "refusals": assessment.refusals,
        "rows": [
            {
                "namespace": result.key[0],
                "name": result.key[1],
                "outcome": result.outcome.value,
                "nodeName": result.node_name,
                "pid": result.pid,
                "evidence": result.evidence,
                "detail": result.detail,
            }
            for result in results
        ],
    }


def doctor_document(checks: Sequence[Check], *, now: datetime.datetime) -> dict[str, Any]:
    """A doctor run as ``-o json`` prints it."""
    return {
        "apiVersion": api.API_VERSION,
        "kind": "DoctorReport",
        "generatedTime": model.format_time(now, fraction=True),
        "healthy": doctor_exit_code(checks) == 0,
        "checks": [
            {
                "name": check.name,
                "status": check.status.value,
                "summary": check.summary,
                "objects": list(check.objects),
                "facts": dict(check.facts),
            }
            for check in checks
        ],
    }


def dump(document: Mapping[str, Any], *, output: str) -> str:
    """JSON (indented, stable key order) or YAML."""
    if output == "yaml":
        return yaml.safe_dump(_plain(document), sort_keys=False, default_flow_style=False)
    return json.dumps(document, indent=2, default=str) + "\n"


_REASON_STYLE: Final = {Reason.ELIGIBLE_STALE_ORPHAN: "bold green", Reason.ALREADY_TERMINAL: "dim"}
_OUTCOME_STYLE: Final = {
    RowOutcome.RETIRED: "bold green",
    RowOutcome.WOULD_RETIRE: "green",
    RowOutcome.ALREADY_RETIRED: "dim",
}
_STATUS_STYLE: Final = {CheckStatus.PASS: "green", CheckStatus.FAIL: "bold red", CheckStatus.UNKNOWN: "yellow"}


def render_plan(
    plan: Plan,
    *,
    console: Console,
    namespace: str | None,
    retire_permission: Mapping[str, bool | None],
) -> None:
    """The human table: every registration, counts by reason, fingerprints, and the apply line."""
    scope = "all namespaces" if namespace is None else f"namespace {namespace}"
    table = Table(title=Text(f"Coroner plan: {scope}"), box=box.SIMPLE_HEAD, title_justify="left")
    if namespace is None:
        table.add_column("NAMESPACE", no_wrap=True)
    table.add_column("NAME", no_wrap=True)
    table.add_column("NODE", no_wrap=True)
    table.add_column("PID", justify="right", no_wrap=True)
    table.add_column("VERDICT", no_wrap=True)
    table.add_column("REASON", no_wrap=True)
    table.add_column("DETAIL", overflow="fold", ratio=1, min_width=20)
    for entry in plan.entries:
        registration = entry.registration
        reason = entry.decision.reason
        cells = [
            Text(registration.name or "?"),
            Text(registration.node_name or "?"),
            Text("?" if registration.incarnation.pid is None else str(registration.incarnation.pid)),
            Text(entry.row.verdict or "-"),
            Text(reason.value, style=_REASON_STYLE.get(reason, "yellow")),
            Text(entry.decision.detail),
        ]
        if namespace is None:
            cells.insert(0, Text(registration.namespace or "?"))
        table.add_row(*cells)
    if plan.entries:
        console.print(table)
    else:
        console.print(Text(f"No WorkerRegistrations in {scope}."))
    counted = [f"{reason.value} {count}" for reason, count in plan.counts.items() if count]
    console.print(Text(f"Counts ({len(plan.entries)} total): {', '.join(counted) or 'none'}"))
    console.print(Text(f"registryFingerprint:  {plan.registry_fingerprint}"))
    console.print(Text(f"candidateFingerprint: {plan.candidate_fingerprint}"))
    lacking = sorted(ns for ns, allowed in retire_permission.items() if allowed is not True)
    if lacking:
        console.print(
            Text(
                f"You do not hold the {api.RETIRE_VERB} verb in {_names(lacking)}: dead orphans there show "
                f"{Reason.RETIRE_PERMISSION_MISSING} and apply cannot retire them.",
                style="yellow",
            )
        )
    eligible = candidates(plan)
    if eligible:
        console.print(Text("To retire the candidates (add --yes after reviewing the preview):"))
        console.print(
            Text(apply_command(plan=plan, entries=eligible, namespace=namespace), style="bold"), soft_wrap=True
        )
    else:
        console.print(Text("No retirement candidates."))


def apply_command(*, plan: Plan, entries: Sequence[PlanEntry], namespace: str | None) -> str:
    """The ``kubectl coroner apply`` line that retires `entries` of `plan`."""
    scope = "-A" if namespace is None else f"-n {namespace}"
    names = " ".join(
        display(key_of(entry.registration)) if namespace is None else entry.registration.name or "?"
        for entry in entries
    )
    return (
        f"kubectl coroner apply {scope} --registry-fingerprint {plan.registry_fingerprint} "
        f"--candidate-fingerprint {plan.candidate_fingerprint} {names}"
    )


def render_apply(*, results: Sequence[RowResult], console: Console, preview: bool, retired_by: str | None) -> None:
    """The human table of one apply run."""
    if preview:
        title = "Coroner apply: preview (nothing written)"
    elif retired_by is None:
        title = "Coroner apply: nothing left to retire"
    else:
        title = f"Coroner apply as {retired_by}"
    table = Table(title=Text(title), box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("NAMESPACE", no_wrap=True)
    table.add_column("NAME", no_wrap=True)
    table.add_column("NODE", no_wrap=True)
    table.add_column("PID", justify="right", no_wrap=True)
    table.add_column("OUTCOME", no_wrap=True)
    table.add_column("DETAIL", overflow="fold", ratio=1, min_width=20)
    for result in results:
        table.add_row(
            Text(result.key[0]),
            Text(result.key[1]),
            Text(result.node_name or "?"),
            Text("?" if result.pid is None else str(result.pid)),
            Text(result.outcome.value, style=_OUTCOME_STYLE.get(result.outcome, "bold red")),
            Text(result.detail),
        )
    console.print(table)
    if preview and any(result.outcome == RowOutcome.WOULD_RETIRE for result in results):
        console.print(Text("Nothing was changed. Run the same command with --yes to retire these rows."))


def render_doctor(checks: Sequence[Check], *, console: Console) -> None:
    """The human table of one doctor run."""
    table = Table(title=Text("Coroner doctor"), box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("CHECK", no_wrap=True)
    table.add_column("STATUS", no_wrap=True)
    table.add_column("DETAIL", overflow="fold", ratio=1, min_width=20)
    for check in checks:
        table.add_row(
            Text(check.name), Text(check.status.value, style=_STATUS_STYLE[check.status]), Text(check.summary)
        )
    console.print(table)


# --- small pure pieces --------------------------------------------------------------------------


def _condition_status(status: object, condition_type: str) -> str | None:
    if not isinstance(status, Mapping):
        return None
    for item in status.get("conditions") or []:
        if isinstance(item, Mapping) and item.get("type") == condition_type:
            value = item.get("status")
            return value if isinstance(value, str) else None
    return None


def _name(body: Mapping[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("name") or "")


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_SHOWN_NAMES])
    more = len(names) - _SHOWN_NAMES
    return f"{shown} and {more} more" if more > 0 else shown


def _positive(count: object) -> bool:
    return isinstance(count, int | float) and not isinstance(count, bool) and count > 0


def _expiry(renew_time: datetime.datetime | None, duration: float | None) -> datetime.datetime | None:
    """renewTime + leaseDurationSeconds, or None where either is unknown (never "live")."""
    if renew_time is None or duration is None or not math.isfinite(duration):
        return None
    try:
        return renew_time + datetime.timedelta(seconds=duration)
    except OverflowError:
        return None


def _stamp(moment: datetime.datetime | None) -> str | None:
    return None if moment is None else model.format_time(moment)


def _plain(value: object) -> object:
    """JSON-shaped builtins only, so YAML never writes Python tags (enums, tuples, proxies)."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, enum.Enum):
        return value.value
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
