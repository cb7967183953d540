"""The one retire protocol: how a registration decided retirable is retired, by the operator or a person.

Used by the operator (its executor's retire effect) and by ``kubectl coroner apply``, over a small
port (`RetirePort`) each of them implements with its own client. Step by step:

1. **Capability review** — ``port.can_retire(namespace, name)``: the ``retire`` verb, asked by a
   request sent after the decision (a revocation since takes effect here). ``False``, or ``None``
   (the review could not be asked), is `PERMISSION_MISSING`; a review that failed (`PortError`) is
   `FAILED`. Unknown is never granted.
2. **Lease fence** — ``port.list_leases(namespace)``, a live read sent after the decision, at the
   same time as the review. If the holders of the namespace's protecting Leases are not the ones
   the decision saw, `LEASE_FENCE_MOVED`: nothing is written, the caller decides again from fresh
   state.
3. **Decide again** — `decide` once more with the live Leases and the granted capability (the
   other facts as decided), at the port's clock: a renewal the cache had not seen yet must not be
   missed. Not retirable any more: `ABANDONED`.
4. **Compare-and-swap** — ``port.patch_status`` with the one retirement patch
   (`coroner.core.wire.retirement_ops`): a JSON patch that first ``test``s the resourceVersion
   decided from (and the attestation relied on, verbatim), then writes the conditions and
   ``status.retirement`` (who retired — the operator's identity or the person's — when, on which
   evidence). The API server answers:
   409 or 422 (a ``test`` failed: it moved) or 404 (it is gone) → `CONFLICT`; 403 (admission
   refused: the grant went since step 1) → `PERMISSION_MISSING`; no answer → `UNREACHABLE` (it may
   have landed: read it again to know); any other status → `FAILED`.
5. **Event** — ``port.post_event`` about the object as written (reason ``Retired``). The
   retirement stands whether or not its Event is posted: a failure is reported in
   `RetireResult.event_error`, never as a failed retirement.

Errors of the reads of steps 1-2 other than "not granted" are `FAILED` (nothing written). One
error mapping: a port raises `PortError` (an HTTP status, or None for no answer) for everything
the API server said or did not say, and `outcome_of_write` is the only place a status becomes an
outcome. Any other exception is a bug and propagates.

Pure but for the awaits on the port: no client, no clock, no logging here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from coroner.core import api, model
from coroner.core.decision import Decision, Facts, LeaseFacts, Policy, decide
from coroner.core.reasons import EventReason
from coroner.core.wire import Writer, retirement_ops
from coroner.core.world import lease_facts


class PortError(Exception):
    """What the API server answered (`status`), or that it did not answer (`status` None)."""

    def __init__(self, status: int | None, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason


class RetirePort(Protocol):
    """The four requests a retirement makes; each implementation maps its client's errors to `PortError`."""

    async def can_retire(self, *, namespace: str, name: str) -> bool | None:
        """May the caller retire `namespace/name` now? None: the review could not be asked."""
        ...

    async def list_leases(self, *, namespace: str) -> Sequence[Mapping[str, Any]]:
        """The Leases of `namespace`, read live (not from a cache)."""
        ...

    async def patch_status(self, *, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        """A JSON patch of the registration's /status; returns the object as written."""
        ...

    async def post_event(self, *, involved: Mapping[str, Any], reason: str, evidence: str, message: str) -> None:
        """Records one Event about `involved` (the registration as written)."""
        ...


class RetireOutcome(enum.StrEnum):
    """How one retirement attempt ended; the words of `kubectl coroner apply`'s rows and the operator's metrics."""

    RETIRED = "Retired"
    """Written: status.retirement and the Retired condition are set."""
    PERMISSION_MISSING = "RetirePermissionMissing"
    """The review said no (or could not be asked), or admission refused the write (403). Nothing written."""
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
    if error.status in (404, 409, 422):
        return RetireOutcome.CONFLICT
    if error.status == 403:
        return RetireOutcome.PERMISSION_MISSING
    return RetireOutcome.FAILED


def event_message(*, evidence: str, detail: str, retirer: Retirer) -> str:
    if retirer.via is None:
        return f"{evidence}: {detail}"
    return f"{evidence}: retired by {retirer.name} with {retirer.via}: {detail}"


async def retire(
    port: RetirePort, intent: RetireIntent, *, retirer: Retirer, clock: Callable[[], datetime.datetime]
) -> RetireResult:
    """Runs steps 1-5 (see the module docstring) for one registration decided retirable."""
    namespace, name = intent.namespace, intent.name
    subject = f"WorkerRegistration {namespace}/{name}"
    # Steps 1 and 2, both sent after the decision, at the same time.
    granted, listed = await asyncio.gather(
        port.can_retire(namespace=namespace, name=name),
        port.list_leases(namespace=namespace),
        return_exceptions=True,
    )
    if isinstance(granted, BaseException) and not isinstance(granted, PortError):
        raise granted
    if isinstance(listed, BaseException) and not isinstance(listed, PortError):
        raise listed
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
    # Step 3.
    now = clock()
    again = decide(registration=intent.registration, facts=fenced(intent.facts, live), policy=intent.policy, now=now)
    if not again.retirable or again.death_evidence is None:
        return RetireResult(
            outcome=RetireOutcome.ABANDONED,
            detail=f"decided again right before the write: {again.reason}: {again.detail} Nothing written.",
            decision=again,
            leases=live,
        )
    # Step 4.
    ops = retirement_ops(
        intent.body, intent.registration, again, retired_by=retirer.name, now=clock(), writer=retirer.writer
    )
    try:
        patched = await port.patch_status(namespace=namespace, name=name, ops=ops)
    except PortError as error:
        outcome = outcome_of_write(error)
        return RetireResult(
            outcome=outcome,
            detail=_write_failed(outcome, error, subject=subject, resource_version=intent.resource_version),
            decision=again,
            leases=live,
            error=error,
        )
    # Step 5.
    evidence = again.death_evidence.value
    event_error: PortError | None = None
    try:
        await port.post_event(
            involved=patched,
            reason=EventReason.RETIRED.value,
            evidence=evidence,
            message=event_message(evidence=evidence, detail=again.detail, retirer=retirer),
        )
    except PortError as error:
        event_error = error
    return RetireResult(
        outcome=RetireOutcome.RETIRED,
        detail=f"{evidence}: {again.detail}",
        decision=again,
        leases=live,
        patched=patched,
        event_error=event_error,
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
    if outcome is RetireOutcome.UNREACHABLE:
        return f"the retirement of {subject} got no answer ({error.message}); it may have landed."
    return f"{_said(error)}; nothing written."
