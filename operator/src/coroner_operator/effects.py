"""What one reconcile asks to be done, as data: the output of `coroner_operator.step`, and what
came of it (`Outcome`), the input of the step's next call.

kopf's lesson: detect what to do with a pure function, gather the effects, apply them once. An
`Effects` value is the whole of what a reconcile of one registration wants — the executor
(`coroner_operator.executor`) is the only code that turns it into API requests, and it says what
came of each as a value; what follows (a re-read, the conditions after a refusal, the Event, a
retry) is the step's to decide (`step.after`), never the executor's.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from coroner.core import model
from coroner.core.decision import LeaseFacts
from coroner.core.reasons import Reason
from coroner.retire import PortError, RetiredEvent, RetireIntent, RetireResult, RetireWrite

Key = tuple[str, str]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WriteConditions:
    """Set status.conditions: a JSON patch whose first op ``test``s `resource_version`."""

    ops: Sequence[Mapping[str, Any]]
    resource_version: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Delete:
    """Delete a terminal registration whose retention ended, with uid and resourceVersion preconditions."""

    uid: str
    resource_version: str
    terminal: str
    """"Retired" or "Released" (the metric's label)."""
    since: datetime.datetime | None
    retention_seconds: float


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Reread:
    """Read the registration again after a write refused for moving: gone is forgotten, moved is
    reconciled again, and not moved at all (still at `tested`) means the write itself was refused."""

    tested: str | None
    """The resourceVersion the refused write tested."""
    said: str
    """What the API server answered the write (or that it did not)."""
    conflict: bool = False
    """A retirement's compare-and-swap lost: counted once the read shows it moved."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RetireRecord:
    """What a retirement's outcome tells the cache, the metrics and the log (no request)."""

    registration: model.Registration
    """The registration as decided."""
    result: RetireResult
    retired: bool = False
    """It landed: the object as written is cached, the retirement counted and logged."""
    abandoned: bool = False
    """Counted in coroner_retire_abandoned_total under its outcome, and logged."""
    revoked: bool = False
    """The namespace's retire verb is recorded as not granted."""
    leases: Mapping[str, LeaseFacts] | None = None
    """The namespace's live Leases (read for the fence), taken into the cache."""


class RetireFailed(Exception):
    """A retirement that neither landed nor was refused for a reason that a re-decision answers."""

    def __init__(self, result: RetireResult) -> None:
        super().__init__(result.detail)
        self.result = result


class WriteRefused(Exception):
    """A write answered 404/409/422 although the object, read again, is exactly the one it tested:
    nothing moved, so the answer was a refusal (a schema limit, say), not a conflict. Raised for
    the runtime's capped exponential backoff; reconciling again at once would only repeat it."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """The API server's error answer to a conditions write."""

    status: int
    said: str
    error: Exception
    """The error itself (raised for the runtime's backoff when nothing else answers it)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RetireAnswer:
    """The API server's answer to a retirement's compare-and-swap: the object as written, or what it
    said instead (or that it did not answer)."""

    answer: dict[str, Any] | PortError


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReadBack:
    """What a `Reread` found: the resourceVersion of the registration now (None: it is gone)."""

    resource_version: str | None


#: What came of the write (or read) of one `Effects`, as the executor returns it: the answer to a
#: retirement's compare-and-swap, a conditions write's refusal, a re-read's answer; None for
#: nothing to follow up.
Outcome = RetireAnswer | Refusal | ReadBack | None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Effects:
    """Everything one reconcile of `key` asks for; at most one of the three writes.

    * `write_conditions`: the decision changed what the conditions say (level-based: nothing when
      they already say it), or a retirement was refused by admission (Retirable says so);
    * `retire`: the registration is retirable: the reconciler gathers the facts the retire protocol
      needs, read after the decision (the admission policies, the Lease fence, the capability), and
      the step decides on them (`step.retire`): `retire_write` or why nothing is written;
    * `retire_write`: the retirement's compare-and-swap (`coroner.retire.RetireWrite`);
    * `delete`: a terminal registration's retention has ended.

    What follows a write's outcome (`step.after`): `reread`, `event` (the ``Retired`` Event),
    `record` (the cache, the metrics, the log), `requeue` and `fail`.
    """

    key: Key
    reason: Reason | None = None
    """The reason for the `coroner_registrations` gauge: the decision's, or RetireRefusedByAdmission
    for a retirable one whose last retirement admission refused (as doctor counts it); None for a
    terminal registration."""
    write_conditions: WriteConditions | None = None
    retire: RetireIntent | None = None
    delete: Delete | None = None
    requeue_at: datetime.datetime | None = None
    """When the decision can change by the clock alone (the runtime comes back then)."""
    kept: str | None = None
    """A terminal registration kept for lack of a parsable time: why (logged once per version)."""
    retire_write: RetireWrite | None = None
    reread: Reread | None = None
    event: RetiredEvent | None = None
    record: RetireRecord | None = None
    conflict: bool = False
    """A retirement's compare-and-swap lost to a change (coroner_cas_conflicts_total)."""
    requeue: bool = False
    """Reconcile `key` again now (from the cache as the outcome left it)."""
    fail: Exception | None = None
    """Raised once the rest is done, for the runtime's capped backoff."""

    @property
    def writes(self) -> int:
        return sum(x is not None for x in (self.write_conditions, self.retire, self.retire_write, self.delete))
