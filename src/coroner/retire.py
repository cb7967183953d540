"""The one retire protocol: how a registration decided retirable is retired, by the operator or a person.

Pure functions and the one write, shared by the operator (its reconciler gathers the reads, its
step decides, its executor sends the write) and by ``kubectl coroner apply`` (`coroner.cli.commands.
apply.retire`, over the person's session). Each caller reads through a small port (`RetirePort`)
implemented with its own client. Step by step:

1. **Capability** — ``port.can_retire(namespace, name)``: the ``retire`` verb. ``kubectl coroner
   apply`` asks the API server (a SelfSubjectAccessReview sent after the decision); the operator
   answers from its periodic per-namespace review, because admission
   (``coroner-retire-requires-capability``) checks the verb on the write itself, and its refusal
   is `PERMISSION_MISSING` at step 4: a revocation bites at the next write either way. ``False``,
   or ``None`` (the review could not be asked), is `PERMISSION_MISSING`; a review that failed
   (`PortError`) is `FAILED`. Unknown is never granted.
2. **Lease fence** — ``port.list_leases(namespace)``, a live read sent after the decision, at the
   same time as the review. If the holders of the namespace's protecting Leases are not the ones
   the decision saw, `LEASE_FENCE_MOVED`: nothing is written, the caller decides again from fresh
   state.
3. **Decide again** — `decide` once more with the live Leases and the granted capability (the
   other facts as decided), at the caller's clock: a renewal the cache had not seen yet must not
   be missed. Not retirable any more: `ABANDONED`. Steps 1-3 on the reads' answers are the pure
   `retirement`, which returns the write (`RetireWrite`) or why nothing is written.
4. **Compare-and-swap** — `write`, the protocol's one request: ``port.patch_status`` with the one
   retirement patch (`coroner.core.wire.retirement_ops`): a JSON patch that first ``test``s the
   resourceVersion decided from (and the attestation relied on, verbatim), then writes the
   conditions and ``status.retirement`` (who retired — the operator's identity or the person's —
   when, on which evidence). The API server answers (`written`, pure):
   an admission controller's refusal, in the API server's words (a ValidatingAdmissionPolicy's
   "... with binding ... denied request: ...", 403 or 422 by the validation's ``reason``, or a
   webhook's "admission webhook ... denied the request") → `REFUSED_BY_ADMISSION`, naming the policy
   and what it said — but for policy ``coroner-retire-requires-capability``, whose refusal means the
   ``retire`` verb went since step 1 → `PERMISSION_MISSING`, as is any other 403 (RBAC); 409 or 422
   (a ``test`` failed: it moved) or 404 (it is gone) → `CONFLICT`; no answer → `UNREACHABLE` (it
   may have landed: read it again to know); any other status → `FAILED`.
5. **Event** — `retired_event`, about the object as written (reason ``Retired``), posted by the
   caller. The retirement stands whether or not its Event is posted: a failure is reported in
   `RetireResult.event_error`, never as a failed retirement.

Errors of the reads of steps 1-2 other than "not granted" are `FAILED` (nothing written). One
error mapping: a port raises `PortError` (an HTTP status, or None for no answer) for everything
the API server said or did not say, and `outcome_of_write` is the only place a status becomes an
outcome. Any other exception is a bug and propagates.

Pure but for `write`'s await on the port: no client, no clock, no logging here.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from coroner.core import api, model
from coroner.core.admission_digest import CAPABILITY_POLICY
from coroner.core.decision import Decision, Facts, LeaseFacts, Policy, decide
from coroner.core.reasons import EventReason, Reason
from coroner.core.wire import Writer, retirement_ops
from coroner.core.world import lease_facts


class PortError(Exception):
    """What the API server answered (`status`), or that it did not answer (`status` None)."""

    def __init__(self, status: int | None, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionRefusal:
    """An admission controller's refusal of a write, read from the API server's message."""

    kind: str
    """``ValidatingAdmissionPolicy`` or ``admission webhook``."""
    name: str
    """The policy's (or the webhook's) name."""
    binding: str | None
    """The policy binding that applied it (None for a webhook)."""
    message: str
    """What the policy said (its message, or messageExpression's value)."""

    def describe(self) -> str:
        """``ValidatingAdmissionPolicy NAME (binding BINDING)``, or ``admission webhook NAME``."""
        return f"{self.kind} {self.name}" + ("" if self.binding is None else f" (binding {self.binding})")


#: How kube-apiserver words a refusal by a ValidatingAdmissionPolicy (the Status message, after
#: ``<resource> "<name>" is forbidden: ``) and by a validating webhook.
_POLICY_DENIAL = re.compile(
    r"ValidatingAdmissionPolicy '(?P<name>[^']+)' with binding '(?P<binding>[^']*)' denied request: (?P<said>.*)",
    re.DOTALL,
)
_WEBHOOK_DENIAL = re.compile(r'admission webhook "(?P<name>[^"]+)" denied the request(?::\s*(?P<said>.*))?', re.DOTALL)


def admission_refusal(error: PortError) -> AdmissionRefusal | None:
    """The admission refusal `error` reports, if the API server answered one (a 4xx naming it)."""
    if error.status is None or not 400 <= error.status < 500:
        return None
    if found := _POLICY_DENIAL.search(error.message):
        kind, binding = "ValidatingAdmissionPolicy", found["binding"]
    elif found := _WEBHOOK_DENIAL.search(error.message):
        kind, binding = "admission webhook", None
    else:
        return None
    return AdmissionRefusal(kind=kind, name=found["name"], binding=binding, message=(found["said"] or "").strip())


class RetireWritePort(Protocol):
    """The one request a retirement writes with: the compare-and-swap (`write`)."""

    async def patch_status(self, *, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        """A JSON patch of the registration's /status; returns the object as written."""
        ...


class RetirePort(RetireWritePort, Protocol):
    """The four requests a retirement makes; each implementation maps its client's errors to `PortError`."""

    async def can_retire(self, *, namespace: str, name: str) -> bool | None:
        """May the caller retire `namespace/name` now? None: the review could not be asked."""
        ...

    async def list_leases(self, *, namespace: str) -> Sequence[Mapping[str, Any]]:
        """The Leases of `namespace`, read live (not from a cache)."""
        ...

    async def post_event(self, *, involved: Mapping[str, Any], reason: str, evidence: str, message: str) -> None:
        """Records one Event about `involved` (the registration as written)."""
        ...


class RetireOutcome(enum.StrEnum):
    """How one retirement attempt ended; the words of `kubectl coroner apply`'s rows and the operator's metrics."""

    RETIRED = "Retired"
    """Written: status.retirement and the Retired condition are set."""
    PERMISSION_MISSING = "RetirePermissionMissing"
    """The review said no (or could not be asked), or the write was refused for the missing ``retire``
    verb (RBAC, or policy coroner-retire-requires-capability). Nothing written."""
    REFUSED_BY_ADMISSION = Reason.RETIRE_REFUSED_BY_ADMISSION.value
    """An admission policy (or webhook) other than the verb's refused the write: the grant is there,
    what was written is not admitted (`RetireResult.refusal` names the policy). Nothing written."""
    LEASE_FENCE_MOVED = "LeaseFenceMoved"
    """The protecting Leases changed holders since the decision. Nothing written."""
    ABANDONED = "RetireAbandoned"
    """Decided again with the live Leases and no longer retirable. Nothing written."""
    CONFLICT = "RetireConflict"
    """The object changed (409/422) or went (404) since it was read. Nothing written."""
    UNREACHABLE = "RetireUnreachable"
    """The write got no answer: it may or may not have landed."""
    FAILED = "RetireFailed"
    """A read before the write, or the write, failed otherwise. Nothing written."""

    @property
    def written(self) -> bool | None:
        """Whether the retirement is in the object: True, False, or None (unknown)."""
        if self is RetireOutcome.RETIRED:
            return True
        return None if self is RetireOutcome.UNREACHABLE else False


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RetireIntent:
    """A decision to retire one registration, with everything it was decided from."""

    body: Mapping[str, Any]
    """The registration as read (the patch's ``test``s come from it)."""
    registration: model.Registration
    decision: Decision
    facts: Facts
    policy: Policy

    @property
    def namespace(self) -> str:
        return self.registration.namespace or ""

    @property
    def name(self) -> str:
        return self.registration.name or ""

    @property
    def resource_version(self) -> str | None:
        """The resourceVersion the write ``test``s: the one decided from."""
        return self.registration.resource_version


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Retirer:
    """Who retires: recorded as ``status.retirement.retiredBy`` and named in the Event."""

    name: str
    """The API identity (the operator's ServiceAccount, or the person's user name)."""
    writer: Writer = Writer.OPERATOR
    """Which conditions the patch may write (see `coroner.core.wire.Writer`)."""
    via: str | None = None
    """How a person retired (``kubectl coroner apply``), named in the Event; None for the operator."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RetireResult:
    outcome: RetireOutcome
    detail: str
    """One sentence: what happened, for a log line or a row of apply."""
    decision: Decision | None = None
    """The decision made again at step 3 (None if the attempt ended before it)."""
    leases: Mapping[str, LeaseFacts] | None = None
    """The live Lease read of step 2, by name (None if the attempt ended before it)."""
    patched: dict[str, Any] | None = None
    """The object as written (RETIRED only)."""
    error: PortError | None = None
    """The API server's answer that ended the attempt (or the missing answer)."""
    refusal: AdmissionRefusal | None = None
    """REFUSED_BY_ADMISSION: which policy refused the write, and what it said."""
    event_error: PortError | None = None
    """RETIRED, but its Event was not posted."""

    @property
    def evidence(self) -> str | None:
        """The evidence path of the retirement (RETIRED only)."""
        if self.outcome is not RetireOutcome.RETIRED or self.decision is None or self.decision.death_evidence is None:
            return None
        return self.decision.death_evidence.value


def holders(leases: Mapping[str, LeaseFacts] | Sequence[LeaseFacts]) -> frozenset[tuple[str, str | None]]:
    """What the Lease fence compares: each protecting Lease and who holds it (renewals do not count)."""
    values = leases.values() if isinstance(leases, Mapping) else leases
    return frozenset((facts.name, facts.holder_identity) for facts in values)


def fenced(facts: Facts, leases: Mapping[str, LeaseFacts]) -> Facts:
    """The facts decided again at step 3: the live Leases, the capability just granted, the rest as decided."""
    return dataclasses.replace(facts, protecting_leases=tuple(leases.values()), retire_permission=True)


def outcome_of_write(error: PortError) -> RetireOutcome:
    """The one mapping of the compare-and-swap's failures to outcomes."""
    if error.status is None:
        return RetireOutcome.UNREACHABLE
    refusal = admission_refusal(error)
    if refusal is not None:
        if refusal.kind == CAPABILITY_POLICY[0] and refusal.name == CAPABILITY_POLICY[1]:
            return RetireOutcome.PERMISSION_MISSING  # the verb went since the review: it is what it says
        return RetireOutcome.REFUSED_BY_ADMISSION
    if error.status in (404, 409, 422):
        return RetireOutcome.CONFLICT
    if api.admission_not_ready(error.status, error.message):
        return RetireOutcome.FAILED  # a restarting API server's admission, not a revocation: retried
    if error.status == 403:
        return RetireOutcome.PERMISSION_MISSING
    return RetireOutcome.FAILED


def event_message(*, evidence: str, detail: str, retirer: Retirer) -> str:
    if retirer.via is None:
        return f"{evidence}: {detail}"
    return f"{evidence}: retired by {retirer.name} with {retirer.via}: {detail}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RetireWrite:
    """Step 4's request: the compare-and-swap patch of a registration decided retirable on the live Leases."""

    intent: RetireIntent
    decision: Decision
    """The decision made on the live Leases (step 3): what the patch records."""
    leases: Mapping[str, LeaseFacts]
    """The live Lease read of step 2, by name."""
    ops: list[dict[str, Any]]
    """`coroner.core.wire.retirement_ops`: its first op ``test``s the resourceVersion decided from."""


def retirement(
    intent: RetireIntent,
    *,
    granted: bool | PortError | None,
    listed: Sequence[Mapping[str, Any]] | PortError,
    retirer: Retirer,
    now: datetime.datetime,
) -> RetireWrite | RetireResult:
    """Steps 1-3 (see the module docstring) on what the reads of steps 1 and 2 answered, both sent
    after the decision of `intent`: the write to send, or why nothing is written."""
    namespace = intent.namespace
    subject = f"WorkerRegistration {namespace}/{intent.name}"
    if isinstance(granted, PortError):  # the review itself failed: unknown, so not granted either
        return RetireResult(
            outcome=RetireOutcome.FAILED,
            detail=f"the {api.RETIRE_VERB} verb on {subject} could not be reviewed ({_said(granted)}); "
            "nothing written.",
            error=granted,
        )
    if granted is not True:  # False, or None (the review could not be asked): never granted
        return RetireResult(
            outcome=RetireOutcome.PERMISSION_MISSING,
            detail=f"{retirer.name} does not hold the {api.RETIRE_VERB} verb on {subject} now; nothing written.",
        )
    if isinstance(listed, PortError):
        return RetireResult(
            outcome=RetireOutcome.FAILED,
            detail=f"the Leases of namespace {namespace} could not be read ({_said(listed)}); nothing written.",
            error=listed,
        )
    live = {facts.name: facts for facts in map(lease_facts, listed)}
    if holders(live) != holders(intent.facts.protecting_leases):
        return RetireResult(
            outcome=RetireOutcome.LEASE_FENCE_MOVED,
            detail=f"the protecting Leases of namespace {namespace} changed holders since the decision; "
            "nothing written.",
            leases=live,
        )
    # Step 3: decided on the live Leases; the decision the patch records.
    again = decide(registration=intent.registration, facts=fenced(intent.facts, live), policy=intent.policy, now=now)
    if not again.retirable or again.death_evidence is None:
        return RetireResult(
            outcome=RetireOutcome.ABANDONED,
            detail=f"decided again right before the write: {again.reason}: {again.detail} Nothing written.",
            decision=again,
            leases=live,
        )
    ops = retirement_ops(
        intent.body, intent.registration, again, retired_by=retirer.name, now=now, writer=retirer.writer
    )
    return RetireWrite(intent=intent, decision=again, leases=live, ops=ops)


async def write(port: RetireWritePort, request: RetireWrite) -> RetireResult:
    """Step 4, the one write of the protocol: sends `request`'s compare-and-swap through `port` and
    says what came of it (`outcome_of_write`, the one mapping of its failures)."""
    intent = request.intent
    try:
        patched = await port.patch_status(namespace=intent.namespace, name=intent.name, ops=request.ops)
    except PortError as error:
        return written(request, error)
    return written(request, patched)


def written(request: RetireWrite, answer: dict[str, Any] | PortError) -> RetireResult:
    """What the API server's answer to `request` means: RETIRED with the object as written, or the
    outcome its error maps to."""
    again, live = request.decision, request.leases
    if isinstance(answer, PortError):
        outcome = outcome_of_write(answer)
        subject = f"WorkerRegistration {request.intent.namespace}/{request.intent.name}"
        return RetireResult(
            outcome=outcome,
            detail=_write_failed(outcome, answer, subject=subject, resource_version=request.intent.resource_version),
            decision=again,
            leases=live,
            error=answer,
            refusal=admission_refusal(answer) if outcome is RetireOutcome.REFUSED_BY_ADMISSION else None,
        )
    evidence = again.death_evidence.value if again.death_evidence is not None else "Unknown"
    return RetireResult(
        outcome=RetireOutcome.RETIRED, detail=f"{evidence}: {again.detail}", decision=again, leases=live, patched=answer
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RetiredEvent:
    """Step 5: the ``Retired`` Event about the object as written."""

    involved: Mapping[str, Any]
    reason: str
    evidence: str
    message: str


def retired_event(result: RetireResult, *, retirer: Retirer) -> RetiredEvent | None:
    """The Event a RETIRED result is announced by (None for any other outcome). The retirement
    stands whether or not it is posted."""
    if result.outcome is not RetireOutcome.RETIRED or result.patched is None or result.decision is None:
        return None
    evidence = result.evidence or "Unknown"
    return RetiredEvent(
        involved=result.patched,
        reason=EventReason.RETIRED.value,
        evidence=evidence,
        message=event_message(evidence=evidence, detail=result.decision.detail, retirer=retirer),
    )


def _said(error: PortError) -> str:
    if error.status is None:
        return f"no answer: {error.message}"
    return f"{error.status}{' ' + error.reason if error.reason else ''}: {error.message}"


def _write_failed(outcome: RetireOutcome, error: PortError, *, subject: str, resource_version: str | None) -> str:
    if outcome is RetireOutcome.CONFLICT:
        return (
            f"{subject} changed after it was read at resourceVersion {resource_version} "
            f"({error.status}: {error.message}): it moved, nothing written."
        )
    if outcome is RetireOutcome.PERMISSION_MISSING:
        return f"the API server refused the retirement: {error.message}."
    refusal = admission_refusal(error)
    if outcome is RetireOutcome.REFUSED_BY_ADMISSION and refusal is not None:
        said = refusal.message.rstrip(".") or "no message"
        return f"{refusal.describe()} refused the retirement of {subject} ({error.status}): {said}; nothing written."
    if outcome is RetireOutcome.UNREACHABLE:
        return f"the retirement of {subject} got no answer ({error.message}); it may have landed."
    return f"{_said(error)}; nothing written."
