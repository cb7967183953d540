"""kopf wiring: thin handlers that feed the Node and Lease watch events into the cache and the work
queue. (Registrations have the operator's own watch: `Operator.watch_registrations`.)

Nothing here decides anything. Indexes gate the start: kopf invokes no other handler until every
index is populated, so the first Node or Lease event says the cache knows every Node and every
agent Lease (a node absent from a populated cache may be gone; absent from an empty one it is
merely not seen yet): `Runtime.indexed` is set then, and only then is the registration watch
started, so the first reconcile already knows them. Some such event comes soon in any cluster: the
operator renews its own Lease in the system namespace, and its Pod runs on a Node.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any, cast

import kopf

from coroner.core import api
from coroner.runtime.manager import Manager
from coroner_operator.app import Operator

logger = logging.getLogger("coroner.operator")


@dataclasses.dataclass
class Runtime:
    """What the handlers close over; filled in at startup."""

    operator: Operator | None = None
    manager: Manager | None = None
    """Hosts the operator's loops (`coroner.runtime.manager`); shut down at kopf's cleanup."""
    indexed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    """Set at the first Node or Lease event: kopf's indexes (every Node, every Lease) are populated."""


#: The Leases the operator watches: every namespace but kube-node-lease. It needs the agents' Leases
#: (the system namespace) and any Lease a worker holds in its registration's namespace (the worker's
#: own, under any name and without any label Coroner could ask for: a library's leader election
#: Lease, say), so a label selector would be wrong; kube-node-lease holds only the kubelets' node
#: heartbeats, which no registration can hold. (The retire protocol's Lease fence reads the
#: namespace's Leases live anyway, right before a retirement.)
LEASE_FIELD_SELECTOR = "metadata.namespace!=kube-node-lease"


def configure(settings: kopf.OperatorSettings) -> None:
    """kopf's own bookkeeping stays out of status and under the coroner.dev annotation prefix."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.GROUP)
    settings.persistence.diffbase_storage = NoEssenceDiffBaseStorage(prefix=api.GROUP, key="last-handled-configuration")
    # kopf's per-handler Events would drown the ones Coroner posts; keep only its warnings.
    settings.posting.level = logging.WARNING
    # Bounded watches: a silent connection is re-established rather than trusted forever.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.inactivity_timeout = 400
    # Server-side: the Lease watch leaves out kube-node-lease (one Lease per Node, renewed every 10 s
    # by each kubelet: most of a cluster's Lease writes, none of them Coroner's). See LEASE_FIELD_SELECTOR.
    settings.watching.field_selectors["coordination.k8s.io", "leases"] = LEASE_FIELD_SELECTOR


class NoEssenceDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf builds an object's "essence" (a deep copy of the whole body) on every watch event, to
    diff it for change-detecting handlers. Coroner has none (only event handlers and indexes), so
    the essence is never used: skipping the copy saved ~13% of the operator's CPU under 2,000
    deaths at once (bench/massdeath.py --profile)."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()


def register(registry: kopf.OperatorRegistry, runtime: Runtime) -> None:
    """Registers every handler on `registry` (one registry per operator instance)."""

    def operator() -> Operator:
        assert runtime.operator is not None, "handlers run only after startup"
        return runtime.operator

    @kopf.index("v1", "nodes", registry=registry)
    async def nodes_index(body: kopf.Body, name: str, **_: Any) -> dict[str, bool]:
        operator().inputs.on_node(_raw(body), deleted=False)
        return {name: True}

    @kopf.index("coordination.k8s.io", "v1", "leases", registry=registry)
    async def leases_index(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> dict[str, bool]:
        operator().inputs.on_lease(_raw(body), deleted=False)
        return {f"{namespace}/{name}": True}

    def indexed() -> Operator:
        op = operator()
        op.world.mark_nodes_synced()  # indexes are populated before any non-index handler runs
        runtime.indexed.set()
        return op

    @kopf.on.event("v1", "nodes", registry=registry)
    async def node_event(event: kopf.RawEvent, **_: Any) -> None:
        indexed().inputs.on_node(_object(event), deleted=event["type"] == "DELETED")

    @kopf.on.event("coordination.k8s.io", "v1", "leases", registry=registry)
    async def lease_event(event: kopf.RawEvent, **_: Any) -> None:
        indexed().inputs.on_lease(_object(event), deleted=event["type"] == "DELETED")


def _raw(body: kopf.Body) -> dict[str, Any]:
    return {key: body[key] for key in body}


def _object(event: kopf.RawEvent) -> dict[str, Any]:
    return cast(dict[str, Any], event["object"])
