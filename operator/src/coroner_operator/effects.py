"""What one reconcile asks to be done, as data: the output of `coroner_operator.step.reconcile`.

kopf's lesson: detect what to do with a pure function, gather the effects, apply them once. An
`Effects` value is the whole of what a reconcile of one registration wants — the executor
(`coroner_operator.executor`) is the only code that turns it into API requests.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from coroner.core.reasons import Reason
from coroner.retire import RetireIntent

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
class Effects:
    """Everything one reconcile of `key` asks for; at most one of the three writes.

    * `write_conditions`: the decision changed what the conditions say (level-based: nothing when
      they already say it);
    * `retire`: the registration is retirable: run the retire protocol (`coroner.retire`), whose
      last step posts the ``Retired`` Event;
    * `delete`: a terminal registration's retention has ended.
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

    @property
    def writes(self) -> int:
        return sum(x is not None for x in (self.write_conditions, self.retire, self.delete))
