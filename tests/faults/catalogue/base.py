"""The fault model's base: a fault's part in each phase of a trial, and the registry of faults by name.

Every fault of the catalogue is a `Fault` subclass registered with `@fault("name")`; a trial names its
faults as ``name`` or ``name:variant`` (a forced variant; otherwise the fault draws one from its seed).
A fault may also list `mutants`: deliberately broken variants (never drawn, only forced by the
detector self-tests) that break the product's guard at the wire so that a test can prove the
invariant that guard protects is checked.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from faults.trial import Trial
    from faults.workers import Worker

AGENT_DOWN = frozenset({"PidAlive", "AttestationMissing", "AgentUnavailable"})

FAULTS: dict[str, type[Fault]] = {}


def fault(name: str) -> Callable[[type[Fault]], type[Fault]]:
    def register_(cls: type[Fault]) -> type[Fault]:
        cls.name = name
        FAULTS[name] = cls
        return cls

    return register_


class Fault:
    """A fault's part in each phase; the defaults do nothing and block nothing."""

    name = ""
    node_local = False
    cluster_wide = False
    """It touches what every trial shares (operator, API server, grant, every proxy): it runs alone."""
    hold = 0.0
    """Seconds a blocked death must be seen preserved (e.g. until the agent Lease has expired)."""
    shared_round = False
    """Cluster-wide, and can serve several trials at once: in a shared round (runner.Round) every
    lane's trial carries it with the same variant, and one injection (one API server restart)
    serves them all."""
    variants: tuple[str, ...] = ()
    """The variants a shared-round fault draws from (the round draws one for all its trials)."""
    mutants: tuple[str, ...] = ()
    """Broken variants for the detector self-tests: forced only, never drawn."""

    def __init__(self, trial: Trial, rng: random.Random, node: str | None, variant: str | None = None) -> None:
        self.trial = trial
        self.rng = rng
        self.node = node
        self.forced = variant
        self.variant = ""
        self.facts: dict[str, Any] = {}
        self.failures: list[str] = []

    @property
    def label(self) -> str:
        return f"{self.name}[{self.variant}]" if self.variant else self.name

    def pick(self, options: list[str]) -> str:
        """The variant: the forced one (``name:variant`` in a trial's fault list) or a seeded choice."""
        if self.forced is not None:
            if self.forced not in options and self.forced not in self.mutants:
                raise ValueError(f"{self.name} has no variant {self.forced!r}; it has {options}")
            return self.forced
        return self.rng.choice(options)

    def plan(self) -> None: ...
    def arm(self) -> None: ...
    def strike(self) -> None: ...
    def after(self) -> None: ...
    def heal(self) -> None: ...
    def verify(self) -> None: ...

    def blocked(self, w: Worker) -> frozenset[str] | None:
        """Reasons this fault explains for dead `w` while it holds; None: it does not keep `w`."""
        return None

    def final(self, w: Worker) -> frozenset[str] | None:
        """Reasons still explained after the heal (dead `w` may stay active with one of them)."""
        return None

    def survivor(self, w: Worker) -> frozenset[str] | None:
        """The reason a live `w` carries because of this fault (default: PidAlive)."""
        return None

    def disturbs(self, w: Worker) -> bool:
        """True: while this fault holds, `w`'s retirement may be delayed without being explained by
        one fixed reason (it is then judged after the heal only)."""
        return False

    def on_node(self, w: Worker) -> bool:
        return self.node is not None and w.node == self.node


@fault("none")
class NoFault(Fault):
    pass
