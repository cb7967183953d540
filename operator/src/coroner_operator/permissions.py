"""The permission refresher: whether the operator may retire, kept current.

Two facts, each asked for before the first decision that needs it and again every
`interval_seconds`; a flip reconciles what it may change, so no restart is ever needed:

* the ``retire`` verb, per namespace: the first reconcile in a namespace asks (`ensure`), a flip (a
  grant, or a revocation) reconciles that namespace again. A revocation never waits for this loop:
  admission enforces the verb on the retirement write itself, and the executor records its refusal
  as the capability gone (no review is asked per retirement).
* the admission policies and bindings (the API server's half of every safety rule): listed, and compared by content with what
  the manifests ship (`coroner.core.admission_digest.compare`). While one is missing or differs, or
  they cannot be read (unknown is never intact), every decision that would retire says
  AdmissionPoliciesUnverified instead: the operator fails closed. Any change (what is missing or
  differing, or restored) reconciles every registration again. Right before each retirement the
  reconciler asks once more (`admission_held`: a read sent after the decision, shared by every
  retirement decided before it and held by each until its write is answered, so a burst of deaths
  costs one read per batch), so nothing is retired once a weakening is visible in the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from coroner.core import admission_digest, api
from coroner.core.model import Key
from coroner.core.world import World
from coroner.runtime.leader import LeaderElector
from coroner_operator.freshread import FreshRead
from coroner_operator.kubeapi import KubeApi, describe

logger = logging.getLogger("coroner.operator")


class PermissionRefresher:
    def __init__(
        self,
        *,
        kube: KubeApi,
        world: World,
        enqueue: Callable[[Key], None],
        interval_seconds: float,
        system_namespace: str = api.SYSTEM_NAMESPACE,
        node_evidence: bool = False,
        identity: str = "",
        verified: Callable[[bool], None] = lambda _: None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.world = world
        self.enqueue = enqueue
        self.interval_seconds = interval_seconds
        self.system_namespace = system_namespace
        # The evidence policy as components/node-loss patches it admits node evidence from the
        # operator: verified only where this operator uses node evidence (the component sets the
        # flags); for one that does not, it is a rule weaker than it needs.
        self.alternates: Mapping[tuple[str, str], str] = admission_digest.accepted_alternates(
            node_evidence=node_evidence
        )
        self.name_prefix = api.name_prefix_of(identity, system_namespace=system_namespace)
        self.verified = verified
        """Told after each read whether the policies are verified (the operator's gauge)."""
        self._admission_checked = False
        self._admission_lock = asyncio.Lock()
        self._admission_reads: FreshRead[str, tuple[str, ...]] = FreshRead(self._read_admission, clock=monotonic)
        # The last comparison and the object versions it compared: an unchanged listing (the API
        # server gives an object a new resourceVersion at every change) is not digested again.
        self._compared: tuple[tuple[tuple[str, str, str], ...], tuple[str, ...]] | None = None

    async def ensure(self, namespace: str) -> None:
        """Asks what was never asked before a decision needs it (an answer, even "unknown")."""
        if not self._admission_checked:
            async with self._admission_lock:
                if not self._admission_checked:
                    await self.refresh_admission()
        if namespace not in self.world.retire_permission:
            self.world.set_retire_permission(namespace, await self.kube.can_retire(namespace=namespace))

    async def refresh(self) -> None:
        await self.refresh_admission()
        for namespace in self.world.namespaces():
            allowed = await self.kube.can_retire(namespace=namespace)
            if self.world.set_retire_permission(namespace, allowed):
                logger.info("retire capability namespace=%s granted=%s", namespace, allowed)
                for key in self.world.keys_in_namespace(namespace):
                    self.enqueue(key)

    async def refresh_admission(self) -> None:
        """Lists and compares the admission policies; a change reconciles every registration."""
        self._record(await self._read_admission(""))

    async def admission_verified(self, *, decided_at: float) -> bool:
        """Right before a retirement: are the policies verified by a read sent after the decision
        taken at `decided_at` (a `time.monotonic()` reading)? One read answers every retirement
        decided before it was sent (`FreshRead`); what it found is recorded like a refresh's."""
        why = await self._admission_reads.get("", decided_at=decided_at)
        self._record(why)
        return not why

    @contextlib.asynccontextmanager
    async def admission_held(self, *, decided_at: float) -> AsyncIterator[bool]:
        """`admission_verified`, and the next read waits until this caller (a retirement, whose
        write happens inside the block) leaves it: the reads form batches (`FreshRead.hold`)."""
        async with self._admission_reads.hold("", decided_at=decided_at) as why:
            self._record(why)
            yield not why

    async def _read_admission(self, _: str) -> tuple[str, ...]:
        """What keeps the policies from being verified (empty: nothing); never raises."""
        try:
            listed = await self.kube.list_admission_policies()
        except Exception as exc:  # HTTP or connection error alike: unknown is never intact
            return (f"the admission policies could not be read ({describe(exc)})",)
        versions = _versions(listed)
        if versions is not None and self._compared is not None and self._compared[0] == versions:
            return self._compared[1]
        comparison = admission_digest.compare(
            listed, alternates=self.alternates, system_namespace=self.system_namespace, name_prefix=self.name_prefix
        )
        why = tuple(comparison.names())
        if versions is not None:
            self._compared = (versions, why)
        return why

    def _record(self, why: tuple[str, ...]) -> None:
        self._admission_checked = True
        self.verified(not why)
        if not self.world.set_admission_unverified(why):
            return
        if why:
            logger.warning("admission policies not verified, retiring nothing: %s", "; ".join(why))
        else:
            logger.info("admission policies verified as shipped")
        for namespace in self.world.namespaces():
            for key in self.world.keys_in_namespace(namespace):
                self.enqueue(key)

    async def run(self, *, elector: LeaderElector | None = None) -> None:
        """Refreshes every `interval_seconds`. Under leader election a standby asks nothing (its
        reconciles are gated, so nobody would decide with the answers: they would only double the
        API load), and a replica that comes to lead asks at once."""
        while True:
            if elector is not None and not elector.is_leader:
                await elector.wait_leader()
            else:
                await asyncio.sleep(self.interval_seconds)
                if elector is not None and not elector.is_leader:
                    continue
            await self.refresh()


def _versions(listed: list[dict[str, Any]]) -> tuple[tuple[str, str, str], ...] | None:
    """(kind, uid, resourceVersion) of each object listed, in order; None if one lacks them."""
    versions = []
    for item in listed:
        meta = item.get("metadata") or {}
        uid, version = meta.get("uid"), meta.get("resourceVersion")
        if not uid or not version:
            return None
        versions.append((str(item.get("kind")), str(uid), str(version)))
    return tuple(versions)
