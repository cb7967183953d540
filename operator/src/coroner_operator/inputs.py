"""Watch inputs: what a watch event changes in the cache, and which registrations it re-decides.

Nothing here decides or writes to the API: each event goes into `World` through its own methods,
and the registrations whose decision may have changed are handed to the runtime's queue.

One timer per node watches its agent Lease's expiry (`watch_agent_expiry`): every decision that
relied on the agent being live (a PidAlive, a Dead verdict's agent line, a live agent blocking
node-level evidence) changes when it expires; each renewal moves the timer, and the routine renewal
of a live agent re-decides nothing else (it would be O(registrations) of work per renewal for
decisions that cannot change).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from typing import Any

from coroner.core import model
from coroner.core.decision import lease_expiry
from coroner.core.model import Key
from coroner.core.world import World, resource_version_number
from coroner.runtime.controller import Controller
from coroner_operator.executor import Executor
from coroner_operator.metrics import DecisionGauge, Metrics

logger = logging.getLogger("coroner.operator")


class WatchInputs:
    def __init__(
        self,
        *,
        world: World,
        controller: Controller[Key],
        executor: Executor,
        gauge: DecisionGauge,
        clock: Callable[[], datetime.datetime],
        on_deleted: Callable[[model.Registration], None] = lambda registration: None,
    ) -> None:
        """`on_deleted` is told of each registration deleted (as last seen), after it is forgotten."""
        self.world = world
        self.controller = controller
        self.executor = executor
        self.gauge = gauge
        self.clock = clock
        self.on_deleted = on_deleted
        self._listed: dict[str | None, set[Key]] = {}

    def on_registration(self, body: dict[str, Any], *, deleted: bool) -> None:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if deleted:
            self._deleted(key, model.parse_registration(body))
            return
        # Peers' decisions depend on this one (ClientInstanceConflict, ConflictingIdentity), both
        # the peers it had and the peers it has now.
        peers = self._peers(key)
        # An event older than a body we wrote ourselves is skipped (see World.observe_registration).
        if not self.world.observe_registration(body):
            return
        self.controller.enqueue(key)
        for peer in sorted(peers | self._peers(key)):
            self.controller.enqueue(peer)

    def _deleted(self, key: Key, last: model.Registration) -> None:
        peers = self._peers(key)
        self.world.forget_registration(key)
        self.gauge.set(key, None)
        self.executor.forget(key)
        self.on_deleted(last)
        for peer in sorted(peers):
            self.controller.enqueue(peer)

    def _peers(self, key: Key) -> set[Key]:
        return {(p.namespace or "", p.name or "") for p in self.world.peers_of(key)}

    def on_list_page(
        self,
        items: list[dict[str, Any]],
        *,
        first: bool,
        last: bool,
        resource_version: str,
        namespace: str | None = None,
    ) -> None:
        """One page of a (re)list of the registrations of `namespace` (None: of every namespace
        served). After the last, a cached registration of that scope the list did not hold was
        deleted while no watch ran (unless its cached body is newer than the list: a write of the
        operator's own answered after the list's snapshot). Each scope's relist is its own: one
        watch per namespace relists on its own schedule."""
        if first:
            self._listed[namespace] = set()
        listed = self._listed.setdefault(namespace, set())
        for body in items:
            listed.add(model.key_of(body))
            self.on_registration(body, deleted=False)
        if not last:
            return
        del self._listed[namespace]
        listed_at = int(resource_version) if resource_version.isdigit() else -1
        scope = self.world.bodies if namespace is None else self.world.keys_in_namespace(namespace)
        gone = [
            (key, self.world.parsed[key])
            for key in scope
            if key not in listed and resource_version_number(self.world.bodies[key]) <= listed_at
        ]
        for key, seen_last in gone:
            self._deleted(key, seen_last)

    def on_lease(self, body: dict[str, Any], *, deleted: bool) -> None:
        if not deleted and self.world.is_routine_agent_renewal(body, now=self.clock()):
            _, node = self.world.put_lease(body)
            if node is not None:
                self.watch_agent_expiry(node)
            return
        kind, subject = self.world.forget_lease(body) if deleted else self.world.put_lease(body)
        if kind == "agent" and subject is not None:
            self.watch_agent_expiry(subject)
            for key in self.world.keys_on_node(subject):
                self.controller.enqueue(key)
        elif kind == "lease" and subject is not None:
            holder = (body.get("spec") or {}).get("holderIdentity")
            for key in self.world.keys_in_namespace(subject):
                r = self.world.parsed.get(key)
                if r is not None and holder in (r.name, r.session_id, r.client_instance_id):
                    self.controller.enqueue(key)

    def on_node(self, body: dict[str, Any], *, deleted: bool) -> None:
        name = str(body["metadata"]["name"])
        if deleted:
            self.world.forget_node(name, now=self.clock())
        else:
            self.world.put_node(body)
        for key in self.world.keys_on_node(name):
            self.controller.enqueue(key)

    def watch_agent_expiry(self, node: str) -> None:
        """Re-decide `node`'s registrations when its agent Lease expires, unless renewed before."""
        facts = self.world.agents.get(node)
        until = None if facts is None else lease_expiry(facts.renew_time, facts.lease_duration_seconds)
        token = ("agent-lease-expiry", node)
        if until is None or until <= self.clock():
            # Unknown or already past: the Lease event that brought it re-decides the node itself.
            self.controller.cancel_alarm(token)
            return
        self.controller.alarm(token, until, lambda: self._agent_expired(node, until))

    def _agent_expired(self, node: str, when: datetime.datetime) -> None:
        logger.info("agent lease expired node=%s expiredAt=%s", node, model.format_time(when))
        for key in self.world.keys_on_node(node):
            self.controller.enqueue(key)


def report_active_deletion(metrics: Metrics, registration: model.Registration) -> None:
    """A registration deleted while active is counted and logged: its retention deletes only
    terminal ones, and admission lets only a cluster admin, the namespace controller or the
    garbage collector delete an active one; the record of a possibly live worker is gone."""
    if registration.terminal:
        return
    logger.warning(
        "active registration deleted namespace=%s name=%s registered-by=%s: not by Coroner (its retention "
        "deletes only terminal ones); by a cluster admin, the namespace controller or the garbage collector",
        registration.namespace,
        registration.name,
        registration.registered_by or "(unrecorded)",
    )
    metrics.active_deletions.inc()  # after the line: whoever sees the count finds it logged
