"""What one attest step asks to be done, as data: the output of `coroner_agent.step.attest`.

The agent's counterpart of `coroner_operator.effects`: an `AgentEffects` value is the whole of what
one look at one registration wants — the executor (`coroner_agent.executor`) is the only code that
turns its write into an API request, and the reconciler (`coroner_agent.reconciler`) keeps the
agent's own memory (the first look at a death, the pins of a terminal registration) as it says.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

Key = tuple[str, str]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FirstLook:
    """The first sighting of an incarnation's absence, awaiting the confirming second look.

    `look` is what was seen: "absent" (nobody, or another process, holds the recorded number) or
    "boot-over" (the recorded boot ended and the number is free)."""

    look: str
    at: datetime.datetime


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WriteAttestation:
    """Set status.attestation: a JSON patch (`wire.attestation_ops`) whose `test` ops pin what the
    probe relied on (the heartbeat seen and the uid, or the resourceVersion)."""

    ops: Sequence[Mapping[str, Any]]
    attestation: Mapping[str, Any]
    """The attestation the patch writes (its verdict and evidence label the metric and the log)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AgentEffects:
    """Everything one attest step of `key` asks for; at most one write.

    * `write`: the attestation says something the stored one does not (level-based: nothing when it
      already says it — never a periodic refresh);
    * `requeue_at`: a death read from /proc seen once: look again when its confirmation window ends;
    * `first_look`: the first look to remember after this step (None: forget any);
    * `release`: the registration is terminal: unpin its incarnation, nothing more to say.
    """

    key: Key
    write: WriteAttestation | None = None
    requeue_at: datetime.datetime | None = None
    first_look: FirstLook | None = None
    release: bool = False
