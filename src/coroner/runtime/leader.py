"""Leader election on a coordination.k8s.io Lease, with client-go's semantics (its leaderelection
package, re-derived here, not copied):

* **acquire**: a candidate reads the Lease; it may take it when nobody holds it (no Lease, or an
  empty holderIdentity: released), or when the record it sees has not changed for a whole
  `lease_duration` *as measured by its own clock* since it first saw that record (never by
  comparing the holder's renewTime with a local clock: clocks of two pods may disagree). Taking it
  is a PUT carrying the resourceVersion read (a compare-and-swap: of two candidates one wins, the
  other gets a 409) that sets holderIdentity to this candidate, acquireTime and renewTime to now,
  and increments leaseTransitions.
* **renew**: the leader rewrites renewTime every `retry_period` (again a compare-and-swap). When no
  renewal has succeeded for `renew_deadline` (< `lease_duration`), or the Lease shows another
  holder, the leader steps down: it stops leading before any standby may take over.
* **release**: a leader shutting down cleanly empties holderIdentity (and sets a 1 s duration), so
  a standby takes over at its next retry instead of after a whole lease duration.

`attempt` is the pure decision of one try (table-tested); `LeaderElector` is the loop around it,
over a `LeaseStore` (get, create, replace) that the operator implements with its API client.
Waits are jittered (`retry_period` * [1, 1.2)) so standbys do not poll in lockstep.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from coroner.core import kubewire

logger = logging.getLogger("coroner.leader")

#: client-go's JitterFactor: each wait is retry_period * [1, 1 + JITTER).
JITTER = 0.2


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ElectionConfig:
    """client-go's defaults (15 s / 10 s / 2 s); `lease_duration` > `renew_deadline` >
    `retry_period` * 1.2, so a leader that cannot renew stops before a standby may take over."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not self.lease_duration > self.renew_deadline:
            raise ValueError("lease_duration must be greater than renew_deadline")
        if not self.renew_deadline > self.retry_period * (1 + JITTER):
            raise ValueError("renew_deadline must be greater than retry_period * 1.2")
        if self.retry_period <= 0:
            raise ValueError("retry_period must be positive")


@dataclasses.dataclass(frozen=True, slots=True)
class Seen:
    """The Lease record last seen (holder, renewTime, transitions…) and when, by this process's
    monotonic clock, it was first seen in that state."""

    record: tuple[Any, ...]
    since: float


@dataclasses.dataclass(frozen=True, slots=True)
class Create:
    body: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Replace:
    body: dict[str, Any]
    """Carries the resourceVersion read: the PUT is a compare-and-swap."""


@dataclasses.dataclass(frozen=True, slots=True)
class HeldByOther:
    holder: str
    expires_in: float
    """Seconds (this process's clock) until the holder's record is stale unless it changes."""


Step = Create | Replace | HeldByOther


def _record(lease: Mapping[str, Any]) -> tuple[Any, ...]:
    spec = lease.get("spec") or {}
    return (
        spec.get("holderIdentity") or "",
        spec.get("leaseDurationSeconds"),
        spec.get("acquireTime"),
        spec.get("renewTime"),
        spec.get("leaseTransitions"),
    )


def holder_of(lease: Mapping[str, Any] | None) -> str:
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


def attempt(
    lease: Mapping[str, Any] | None,
    *,
    namespace: str,
    name: str,
    identity: str,
    config: ElectionConfig,
    annotations: Mapping[str, str],
    seen: Seen | None,
    now: datetime.datetime,
    mono: float,
) -> tuple[Step, Seen | None]:
    """One try to acquire or renew, given the Lease as just read (None: it does not exist).
    Returns what to write (or that another holds it) and the record seen, with when it was first
    seen by the monotonic clock `mono` (pass it back next time)."""
    duration = max(1, round(config.lease_duration))
    if lease is None:
        body = kubewire.lease_body(
            namespace=namespace, name=name, holder=identity, duration=duration, annotations=annotations, now=now,
            transitions=0,
        )  # fmt: skip
        return Create(body), None
    record = _record(lease)
    if seen is None or seen.record != record:
        seen = Seen(record, mono)
    spec = dict(lease.get("spec") or {})
    holder = str(spec.get("holderIdentity") or "")
    if holder and holder != identity:
        # The holder's own duration counts, measured from when this process saw its last change.
        held_for = float(spec.get("leaseDurationSeconds") or config.lease_duration)
        remaining = seen.since + held_for - mono
        if remaining > 0:
            return HeldByOther(holder, remaining), seen
    body = kubewire.lease_acquisition(lease, holder=identity, duration=duration, annotations=annotations, now=now)
    return Replace(body), seen


def released(lease: Mapping[str, Any], *, now: datetime.datetime) -> dict[str, Any]:
    """The Lease as held by this leader, released (`kubewire.lease_release`)."""
    return kubewire.lease_release(lease, now=now)


class LeaseStore(Protocol):
    async def get_lease(self, *, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def create_lease(self, *, namespace: str, body: dict[str, Any]) -> dict[str, Any]: ...

    async def replace_lease(self, *, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]: ...


class LeaderElector:
    """Runs the election for one identity; `leading` is set while this process leads."""

    def __init__(
        self,
        *,
        store: LeaseStore,
        namespace: str,
        name: str,
        identity: str,
        config: ElectionConfig = ElectionConfig(),
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.config = config
        self.on_change = on_change
        self.clock = clock
        self.monotonic = monotonic
        self.rng = rng or random.Random()
        self.leading = asyncio.Event()
        self._seen: Seen | None = None
        self._held: dict[str, Any] | None = None  # the Lease as last written by this leader
        self._annotations: dict[str, str] = {}
        self._kick = asyncio.Event()
        self.holder: str = ""
        """Who holds the Lease, as last seen (this identity while leading)."""
        self._released = False
        self.last_try: float | None = None
        """When (monotonic) the last try to acquire or renew ended, either way: the loop is alive."""

    @property
    def is_leader(self) -> bool:
        return self.leading.is_set()

    async def wait_leader(self) -> None:
        await self.leading.wait()

    def publish(self, annotations: Mapping[str, str]) -> None:
        """Annotations to carry on the Lease from the next write on (now, if leading)."""
        self._annotations.update(annotations)
        self._kick.set()

    async def try_once(self) -> bool:
        """One try to acquire or renew; True if this process holds the Lease afterwards."""
        try:
            return await self._try_once()
        finally:
            self.last_try = self.monotonic()

    async def _try_once(self) -> bool:
        if self._released:
            return False  # shutting down: never acquires or renews again
        try:
            current = await asyncio.wait_for(
                self.store.get_lease(namespace=self.namespace, name=self.name), timeout=self.config.renew_deadline
            )
            step, self._seen = attempt(
                current,
                namespace=self.namespace,
                name=self.name,
                identity=self.identity,
                config=self.config,
                annotations=self._annotations,
                seen=self._seen,
                now=self.clock(),
                mono=self.monotonic(),
            )
            if isinstance(step, HeldByOther):
                self.holder = step.holder
                return False
            if isinstance(step, Create):
                written = self.store.create_lease(namespace=self.namespace, body=step.body)
            else:
                written = self.store.replace_lease(namespace=self.namespace, name=self.name, body=step.body)
            if self._released:
                written.close()
                return False
            self._held = await asyncio.wait_for(written, timeout=self.config.renew_deadline)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # 409 (another won), an outage: not this time
            logger.info("leader lease %s/%s not acquired or renewed: %r", self.namespace, self.name, exc)
            return False
        self.holder = self.identity
        self._seen = Seen(_record(self._held), self.monotonic())
        return True

    def _wait(self) -> float:
        return self.config.retry_period * (1 + JITTER * self.rng.random())

    async def _sleep_or_kick(self, seconds: float) -> None:
        self._kick.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._kick.wait(), timeout=seconds)

    def _set(self, leading: bool, why: str = "") -> None:
        if leading == self.is_leader:
            return
        if leading:
            self.leading.set()
            logger.info("leader election: %s leads (Lease %s/%s)", self.identity, self.namespace, self.name)
        else:
            self.leading.clear()
            self._held = None
            logger.warning("leader election: %s stopped leading (Lease %s/%s %s)", self.identity, self.namespace,
                           self.name, why)  # fmt: skip
        if self.on_change is not None:
            self.on_change(leading)

    async def run(self) -> None:
        """Forever: acquire, then renew until a renewal misses its deadline, then stand by again."""
        while True:
            while not await self.try_once():
                await asyncio.sleep(self._wait())
            self._set(True)
            last_renewed = self.monotonic()
            while True:
                await self._sleep_or_kick(self.config.retry_period)
                if await self.try_once():
                    last_renewed = self.monotonic()
                    continue
                if self.holder != self.identity or self.monotonic() - last_renewed >= self.config.renew_deadline:
                    break
                # A failed renewal is retried at the retry period until the deadline.
            why = (
                f"taken by {self.holder}"
                if self.holder != self.identity
                else f"not renewed within {self.config.renew_deadline:g}s; standing by"
            )
            self._set(False, why)

    async def release(self) -> None:
        """On a clean shutdown: give the Lease up so a standby takes over at its next retry. From
        then on this elector neither acquires nor renews (its loop may still be running)."""
        self._released = True
        held = self._held
        if not self.is_leader or held is None:
            return
        self._set(False, "released: shutting down")
        try:
            await asyncio.wait_for(
                self.store.replace_lease(
                    namespace=self.namespace, name=self.name, body=released(held, now=self.clock())
                ),
                timeout=self.config.retry_period,
            )
        except Exception as exc:
            logger.info("leader lease %s/%s not released: %r", self.namespace, self.name, exc)
