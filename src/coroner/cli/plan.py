"""``kubectl coroner plan | apply | doctor`` without the I/O: facts, decisions, fingerprints, output.

A human's plan must reach the operator's verdict from the operator's facts, or approving it would
mean nothing. So this module fills the operator's own cache (`coroner.core.world.World`) from LISTed
objects and asks the shared `coroner.core.decision.decide`, and fingerprints rows exactly as
`coroner.core.fingerprint` defines them. Nothing here talks to the API or reads a clock (callers pass
`now`), so the replay rules of ``apply``, the retirement patch and the choice of policy are each a
unit test away. The ``doctor`` checks live in `coroner.cli.doctor`; the I/O shell is
`coroner.cli.kubectl`.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from coroner.core import api, fingerprint, model, policy_json
from coroner.core.decision import Policy
from coroner.core.fingerprint import Plan, PlanEntry, PlanRow
from coroner.core.model import Key
from coroner.core.policy_json import PolicyUnreadable
from coroner.core.reasons import ApplyAbort, Reason
from coroner.core.wire import Writer
from coroner.core.world import World
from coroner.retire import RetireIntent, Retirer

#: The operator's own Lease in the system namespace; it renews it after every sweep.
OPERATOR_LEASE: Final = api.OPERATOR_LEASE
#: Annotation on that Lease holding the decision policy the operator runs with (`coroner.core.policy_json`).
POLICY_ANNOTATION: Final = api.POLICY_ANNOTATION
#: The command-line flags that set a Policy field, by field name; every other field is the operator's.
POLICY_FLAGS: Final = {
    "node_deletion_evidence": "--node-deletion-evidence",
    "node_deletion_quarantine_seconds": "--node-quarantine-seconds",
}
#: Who ``apply`` reports as the author of its Events.
COMPONENT: Final = "kubectl-coroner"

_FINGERPRINT: Final = re.compile(rf"{fingerprint.FINGERPRINT_VERSION}:sha256:[0-9a-f]{{64}}")
#: How many object names a table line shows before "and N more" (JSON always has them all).
_SHOWN_NAMES: Final = 10


def valid_fingerprint(value: str) -> bool:
    """The shape `coroner.core.fingerprint` produces; anything else was mistyped or cut off."""
    return _FINGERPRINT.fullmatch(value) is not None


# --- facts and the plan -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Unreadable:
    """A read that failed (forbidden, not served, ...): the fact is unknown, and this says why."""

    reason: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Listing:
    """What one plan read from the API: one LIST per kind, plus the retire permission per namespace."""

    registrations: World
    """The WorkerRegistrations of the planned scope (one namespace, or all), cached as the operator
    caches them: the plugin puts each LIST page in as it arrives, so raw bodies and the cache's
    compact copies are never all in memory at once. `build_world` adds the other facts."""
    leases: Sequence[Mapping[str, Any]]
    """Raw Leases: the agent Leases of the system namespace and the protecting Leases of the scope."""
    nodes: Sequence[Mapping[str, Any]]
    """Raw Nodes (all of them: a node absent from the LIST is not seen, never "deleted")."""
    retire_permission: Mapping[str, bool | None]
    """Per namespace: whether the deciding identity holds ``retire``; None is unknown (not granted)."""
    system_namespace: str = api.SYSTEM_NAMESPACE
    nodes_gone: Mapping[str, datetime.datetime] = dataclasses.field(default_factory=dict)
    """Nodes named by registrations, absent from the LIST, that a live GET answered NotFound for,
    and when: the node-deletion quarantine counts from there (asked only where policy accepts it)."""


def build_world(listing: Listing) -> World:
    """The operator's cache, filled the way its watches fill it: `listing.registrations`, completed."""
    world = listing.registrations
    for node in listing.nodes:
        world.put_node(node)
    # A complete LIST is what "synced" means to the operator: from here a node that is absent is
    # "not seen", which is still not deleted (only a live GET past the quarantine can say that).
    world.nodes_synced = True
    world.nodes_gone.update(listing.nodes_gone)
    for lease in listing.leases:
        world.put_lease(lease)
    world.retire_permission.update(listing.retire_permission)
    return world


def display(key: Key) -> str:
    """``namespace/name``."""
    return f"{key[0]}/{key[1]}"


def candidates(plan: Plan) -> list[PlanEntry]:
    """The rows a human may retire with ``apply``."""
    return [entry for entry in plan.entries if entry.decision.retirable]


# --- the policy ---------------------------------------------------------------------------------


def person_retirement(
    *, world: World, entry: PlanEntry, policy: Policy, retired_by: str, now: datetime.datetime
) -> tuple[RetireIntent, Retirer]:
    """What `kubectl coroner apply` hands the one retire protocol for a candidate of its plan: the
    retirement as decided on the plan's view, by a person under their own identity."""
    registration = entry.registration
    key = model.key_of(registration)
    intent = RetireIntent(
        body=world.bodies[key],
        registration=registration,
        decision=entry.decision,
        facts=world.facts_for(key, now=now),
        policy=policy,
    )
    return intent, Retirer(name=retired_by, writer=Writer.PERSON, via="kubectl coroner apply")


def operator_lease_of(leases: Iterable[Mapping[str, Any]], *, system_namespace: str) -> Mapping[str, Any] | None:
    """The operator's Lease among LISTed Leases (plan and apply list the system namespace anyway)."""
    for lease in leases:
        meta = lease.get("metadata") or {}
        if meta.get("namespace") == system_namespace and meta.get("name") == OPERATOR_LEASE:
            return lease
    return None


def published_policy(
    lease: Mapping[str, Any] | Unreadable | None, *, system_namespace: str
) -> Policy | PolicyUnreadable:
    """The policy the operator publishes on its Lease, or why it cannot be used."""
    subject = f"Lease {system_namespace}/{OPERATOR_LEASE}"
    if isinstance(lease, Unreadable):
        return PolicyUnreadable(reason=f"{subject} could not be read: {lease.reason}")
    if lease is None:
        return PolicyUnreadable(reason=f"{subject} does not exist (is the operator running?)")
    annotations = (lease.get("metadata") or {}).get("annotations") or {}
    if not isinstance(annotations, Mapping) or POLICY_ANNOTATION not in annotations:
        return PolicyUnreadable(
            reason=f"{subject} has no {POLICY_ANNOTATION} annotation (an operator older than this kubectl-coroner?)"
        )
    parsed = policy_json.parse_policy(annotations[POLICY_ANNOTATION])
    if isinstance(parsed, PolicyUnreadable):
        return PolicyUnreadable(
            reason=f"the {POLICY_ANNOTATION} annotation on {subject} is unreadable: {parsed.reason}"
        )
    return parsed


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyChoice:
    """The policy a command decides with, where it came from, and what a person must be told."""

    policy: Policy
    published: Policy | None
    """The operator's published policy, when it could be read."""
    unreadable: str | None
    """Why the operator's policy could not be read (then `policy` starts from the built-in defaults)."""
    from_flags: tuple[str, ...]
    """camelCase fields set on the command line."""
    lease: str
    """``namespace/name`` of the operator's Lease."""
    warnings: tuple[str, ...]
    """One sentence each, for stderr."""

    @property
    def source(self) -> str:
        """``operator``, ``operator+flags``, ``defaults`` or ``defaults+flags``."""
        base = "operator" if self.published is not None else "defaults"
        overridden = self.published is None or self.policy != self.published
        return f"{base}+flags" if self.from_flags and overridden else base

    def describe(self) -> str:
        """One line for the top of a table."""
        if self.published is not None:
            where = f"the operator's, published on Lease {self.lease}"
        else:
            where = f"the built-in defaults (the operator's could not be read: {self.unreadable})"
        if self.from_flags:
            where += f", with {', '.join(self.from_flags)} from the command line"
        settings = ", ".join(
            f"{key}={_json_value(value)}"
            for key, value in policy_json.policy_document(self.policy).items()
            if value != policy_json.policy_document(Policy())[key]
        )
        return f"Policy: {where} ({settings or 'every field at its default'})."

    def document(self) -> dict[str, Any]:
        """The ``policy`` field of the JSON / YAML documents."""
        return {
            "source": self.source,
            "lease": self.lease,
            "values": policy_json.policy_document(self.policy),
            "published": None if self.published is None else policy_json.policy_document(self.published),
            "unreadable": self.unreadable,
            "fromFlags": list(self.from_flags),
        }


def choose_policy(
    *, published: Policy | PolicyUnreadable, flags: Mapping[str, object | None], system_namespace: str
) -> PolicyChoice:
    """The operator's published policy, with the fields a person set explicitly (`flags`, by field
    name, None where not given) on top; the built-in defaults where it cannot be read. Every
    difference from the operator's policy, and every fallback, is a warning: a plan decided with
    another policy than the operator's shows what the operator will not do.

    Raises ValueError when a flag's value is one Policy refuses (negative, not finite)."""
    lease = f"{system_namespace}/{OPERATOR_LEASE}"
    given = {name: value for name, value in flags.items() if value is not None and name in POLICY_FLAGS}
    base = published if isinstance(published, Policy) else Policy()
    policy = dataclasses.replace(base, **given)  # type: ignore[arg-type]
    from_flags = tuple(policy_json.camel(name) for name in given)
    warnings: list[str] = []
    if isinstance(published, PolicyUnreadable):
        shown = f" and {', '.join(_flag(name, value) for name, value in given.items())}" if given else ""
        advice = (
            ""
            if given
            else f" Pass {' and '.join(POLICY_FLAGS.values())} as the operator runs if it was started with them."
        )
        warnings.append(
            f"the operator's policy could not be read ({published.reason}); deciding with the built-in defaults"
            f"{shown}, which may not be what the operator decides.{advice}"
        )
    else:
        for name, value in given.items():
            theirs = getattr(published, name)
            if theirs != value:
                warnings.append(
                    f"{_flag(name, value)} differs from the operator's published {policy_json.camel(name)}="
                    f"{_json_value(theirs)} (Lease {lease}); deciding with {_json_value(value)}, which may not be "
                    f"what the operator decides."
                )
    return PolicyChoice(
        policy=policy,
        published=published if isinstance(published, Policy) else None,
        unreadable=published.reason if isinstance(published, PolicyUnreadable) else None,
        from_flags=from_flags,
        lease=lease,
        warnings=tuple(warnings),
    )


def _flag(name: str, value: object) -> str:
    flag = POLICY_FLAGS[name]
    if isinstance(value, bool):
        return flag if value else flag.replace("--", "--no-", 1)
    return f"{flag}={_json_value(value)}"


def _json_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


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
    """The caller lost ``retire`` (the review said no, or the verb's policy refused the write); nothing written."""
    RETIRE_REFUSED_BY_ADMISSION = Reason.RETIRE_REFUSED_BY_ADMISSION.value
    """An admission policy (or webhook) other than the verb's refused the write; nothing written."""
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
                f"WorkerRegistration {display(model.key_of(entry.registration))} is not a retirement candidate "
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
    by_key = {model.key_of(entry.registration): entry for entry in plan.entries}
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
    rows = [replayed.get(model.key_of(entry.registration), entry.row) for entry in plan.entries]
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
        model.key_of(entry.registration): row
        for entry in plan.entries
        if model.key_of(entry.registration) not in replayed and (row := replayed_row(entry)) is not None
    }
    if not unnamed:
        return ""
    rows = [{**replayed, **unnamed}.get(model.key_of(entry.registration), entry.row) for entry in plan.entries]
    if (
        fingerprint.registry_fingerprint(rows) != registry_fingerprint
        or fingerprint.candidate_fingerprint(rows) != candidate_fingerprint
    ):
        return ""
    names = " ".join(name for _, name in sorted(unnamed))
    return (
        f"the only change since the plan is the retirement, as planned, of "
        f"{names_text([display(key) for key in sorted(unnamed)])}; name those too ({names}) to replay, or run "
        f"`kubectl coroner plan` again."
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


def apply_command(*, plan: Plan, entries: Sequence[PlanEntry], namespace: str | None) -> str:
    """The ``kubectl coroner apply`` line that retires `entries` of `plan`."""
    scope = "-A" if namespace is None else f"-n {namespace}"
    names = " ".join(
        display(model.key_of(entry.registration)) if namespace is None else entry.registration.name or "?"
        for entry in entries
    )
    return (
        f"kubectl coroner apply {scope} --registry-fingerprint {plan.registry_fingerprint} "
        f"--candidate-fingerprint {plan.candidate_fingerprint} {names}"
    )


# --- a saved plan, and every candidate ----------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class SavedPlan:
    """What ``apply --from-plan`` takes from a plan saved with ``plan -o json`` (or yaml)."""

    registry_fingerprint: str
    candidate_fingerprint: str
    namespace: str | None
    """The planned namespace; None for every namespace (``-A``)."""
    candidates: tuple[Key, ...]
    """The approved set: nothing outside it is retired."""
    policy_flags: Mapping[str, object]
    """The policy fields the plan set on its command line (`POLICY_FLAGS` names), to decide alike."""


def read_saved_plan(document: object, *, source: str) -> SavedPlan:
    """The approval a ``Plan`` document carries; ValueError (one sentence naming `source`) when it
    is not a plan document or any field apply needs is missing or malformed."""

    def bad(what: str) -> ValueError:
        return ValueError(
            f"{source} is not a plan saved with `kubectl coroner plan -o json` ({what}); save one with "
            f"`kubectl coroner plan -o json > plan.json`."
        )

    if not isinstance(document, Mapping):
        raise bad("not a JSON or YAML object")
    if document.get("kind") != "Plan" or document.get("apiVersion") != api.API_VERSION:
        raise bad(f"kind {document.get('kind')!r}, apiVersion {document.get('apiVersion')!r}")
    fingerprints = {}
    for key in ("registryFingerprint", "candidateFingerprint"):
        value = document.get(key)
        if not isinstance(value, str) or not valid_fingerprint(value):
            raise bad(f"{key} is {value!r}")
        fingerprints[key] = value
    scope = document.get("scope")
    if not isinstance(scope, Mapping) or not isinstance(scope.get("allNamespaces"), bool):
        raise bad("no scope")
    namespace = scope.get("namespace")
    if scope["allNamespaces"] != (namespace is None) or not (namespace is None or isinstance(namespace, str)):
        raise bad(f"scope {dict(scope)!r}")
    listed = document.get("candidates")
    if not isinstance(listed, list) or not all(isinstance(item, str) for item in listed):
        raise bad("candidates is not a list of NAMESPACE/NAME")
    keys: list[Key] = []
    for item in listed:
        ns, sep, name = item.partition("/")
        if not sep or not ns or not name or "/" in name or (namespace is not None and ns != namespace):
            raise bad(f"candidate {item!r} is not NAMESPACE/NAME in the planned scope")
        keys.append((ns, name))
    policy = document.get("policy")
    flags: dict[str, object] = {}
    if isinstance(policy, Mapping):
        from_flags = policy.get("fromFlags") or []
        values = policy.get("values") or {}
        if not isinstance(from_flags, list) or not isinstance(values, Mapping):
            raise bad("policy.fromFlags or policy.values is malformed")
        for camel_name in from_flags:
            field = policy_json.FIELD_NAMES.get(str(camel_name))
            if field not in POLICY_FLAGS or camel_name not in values:
                raise bad(f"policy.fromFlags names {camel_name!r}")
            flags[field] = values[camel_name]
    return SavedPlan(
        registry_fingerprint=fingerprints["registryFingerprint"],
        candidate_fingerprint=fingerprints["candidateFingerprint"],
        namespace=namespace,
        candidates=tuple(keys),
        policy_flags=flags,
    )


def all_candidates(plan: Plan, *, registry_fingerprint: str, candidate_fingerprint: str) -> list[Key]:
    """``apply --all-candidates`` without a saved plan: the rows the approved fingerprints pin.

    The candidates of the recomputed plan, when its fingerprints are the approved ones. Otherwise
    — an earlier run retired some of them — those and every row retired as planned since
    (`replayed_row`), if counting all of those as the candidates they were gives exactly the
    approved fingerprints. Else the candidates now, and `assess_apply` aborts on the drift. The
    candidate fingerprint is a hash of the approved set, so whatever matches it is that set.
    """
    now = [model.key_of(entry.registration) for entry in candidates(plan)]
    if plan.registry_fingerprint == registry_fingerprint and plan.candidate_fingerprint == candidate_fingerprint:
        return now
    replayed = {
        model.key_of(entry.registration): row for entry in plan.entries if (row := replayed_row(entry)) is not None
    }
    rows = [replayed.get(model.key_of(entry.registration), entry.row) for entry in plan.entries]
    if (
        replayed
        and fingerprint.registry_fingerprint(rows) == registry_fingerprint
        and fingerprint.candidate_fingerprint(rows) == candidate_fingerprint
    ):
        return sorted([*now, *replayed])
    return now


# --- small pure pieces --------------------------------------------------------------------------


def names_text(names: Sequence[str]) -> str:
    """``a, b, c`` — at most a table line's worth, then ``and N more``."""
    shown = ", ".join(names[:_SHOWN_NAMES])
    more = len(names) - _SHOWN_NAMES
    return f"{shown} and {more} more" if more > 0 else shown
