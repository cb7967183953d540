"""The permission refresher: whether the operator holds ``retire``, per namespace, kept current.

The first reconcile in a namespace asks (`ensure`); every `interval_seconds` every namespace is
asked again, and a flip (a grant, or a revocation) reconciles that namespace again: a plan-only
cluster that grants the verb starts retiring without a restart. The retire protocol asks once more
right before each write, so a revocation never waits for this loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from coroner.core.model import Key
from coroner.core.world import World
from coroner_operator.kubeapi import KubeApi

logger = logging.getLogger("coroner.operator")


class PermissionRefresher:
    def __init__(self, *, kube: KubeApi, world: World, enqueue: Callable[[Key], None], interval_seconds: float) -> None:
        self.kube = kube
        self.world = world
        self.enqueue = enqueue
        self.interval_seconds = interval_seconds

    async def ensure(self, namespace: str) -> None:
        """Asks once for a namespace never asked about (the decision needs an answer, even "unknown")."""
        if namespace not in self.world.retire_permission:
            self.world.set_retire_permission(namespace, await self.kube.can_retire(namespace=namespace))

    async def refresh(self) -> None:
        for namespace in self.world.namespaces():
            allowed = await self.kube.can_retire(namespace=namespace)
            if self.world.set_retire_permission(namespace, allowed):
                logger.info("retire capability namespace=%s granted=%s", namespace, allowed)
                for key in self.world.keys_in_namespace(namespace):
                    self.enqueue(key)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_seconds)
            await self.refresh()
