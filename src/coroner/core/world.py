"""What is known of the cluster, as facts for the decision: the informer-style cache.

Every decision is made from this cache — never a LIST per event. It holds the latest parsed record
of each registration (and of its raw body what a write reads back, `slim`), the agent Lease facts
per node, the Node facts, the protecting Leases per namespace, and indexes that find a
registration's possible peers (same clientInstanceId, same incarnation, same session) without
scanning the namespace.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, cast

from coroner.core import api, model
from coroner.core.decision import AgentFacts, Facts, LeaseFacts, NodeFacts, lease_expiry

# One Key, one key_of, one RFC 3339 parser (strict: what does not parse is unknown), in model.
from coroner.core.model import Key, key_of, parse_time

#: Strings up to this long are shared across cached bodies (`World.intern`): names of kinds,
#: reasons, node names, boot and host ids, timestamps repeat across thousands of registrations.
_SHARED_STRING_MAX = 128


#: What is read of a registration (`model.parse_registration`, the writes' preconditions), besides
#: its metadata: its spec and status, which the CRD's schema bounds (every string has a maxLength,
#: every list a maxItems, unknown fields are pruned), and its kind.
_READ_FIELDS = ("apiVersion", "kind", "spec", "status")
#: What is read of its metadata: the rest (managedFields, finalizers, owner references, every other
#: label and annotation) is never read, and whoever creates a registration may fill it.
_READ_METADATA = ("namespace", "name", "uid", "resourceVersion", "generation", "creationTimestamp")
_READ_LABELS = (api.NODE_LABEL,)
_READ_ANNOTATIONS = (api.REGISTERED_BY_ANNOTATION,)


def trimmed(body: Mapping[str, Any]) -> dict[str, Any]:
    """A registration as the agent and the operator keep it, whatever it carries: only what is read.

    Its metadata is what a creator may fill past any bound the CRD sets (256 KiB of annotations,
    labels without a count, managedFields besides): kept whole, a few hundred registrations aimed at
    one node would take its agent past its memory limit. Applied as each object is decoded from the
    watch (`coroner.runtime.watch.reflect`'s `keep`), and again by every cache that stores one."""
    kept = {field: body[field] for field in _READ_FIELDS if field in body}
    meta = body.get("metadata")
    if not isinstance(meta, Mapping):  # the parser says what is wrong with it
        if "metadata" in body:
            kept["metadata"] = meta
        return kept
    metadata = {field: meta[field] for field in _READ_METADATA if field in meta}
    for field, read in (("labels", _READ_LABELS), ("annotations", _READ_ANNOTATIONS)):
        values = meta.get(field)
        if isinstance(values, Mapping):
            metadata[field] = {name: values[name] for name in read if name in values}
        elif field in meta:  # not a mapping (never from the API server): the parser flags it
            metadata[field] = values
    kept["metadata"] = metadata
    return kept


#: What the cache keeps of a registration's metadata besides its parsed record: its key and version.
_KEPT_METADATA = ("namespace", "name", "resourceVersion")


def slim(body: Mapping[str, Any]) -> dict[str, Any]:
    """The body as the cache keeps it beside its parsed record: what the writes read back, verbatim
    (``status``: the stored conditions a write keeps, the attestation a retirement tests) and the
    object's namespace, name and resourceVersion. The rest (spec, labels, annotations,
    managedFields) is in the parsed record or never read."""
    meta = body.get("metadata")
    kept: dict[str, Any] = {
        "metadata": {k: meta[k] for k in _KEPT_METADATA if k in meta} if isinstance(meta, Mapping) else {}
    }
    if "status" in body:
        kept["status"] = body["status"]
    return kept


def shared(value: object, intern: Callable[[str], str]) -> object:
    """`value` (decoded JSON) rebuilt from shared strings: every key, and every string up to
    `_SHARED_STRING_MAX` long. A body decoded from JSON holds its own copy of each; a cache of
    thousands of bodies holds the same few hundred (the operator's `World`, the agent's cache)."""
    if isinstance(value, dict):
        # Leaves are handled inline, not by a call each: this runs on every registration a list
        # or watch brings, and most of a body's values are leaves. Exact types: only a str proper
        # can be interned.
        out = {}
        for k, v in value.items():
            if type(v) is str:
                if len(v) <= _SHARED_STRING_MAX:
                    v = intern(v)
            elif isinstance(v, (dict, list)):
                v = shared(v, intern)
            out[intern(k) if type(k) is str else k] = v
        return out
    if isinstance(value, list):
        return [shared(v, intern) for v in value]
    if type(value) is str and len(value) <= _SHARED_STRING_MAX:
        return intern(value)
    return value


def _index_add(index: dict[Any, Key | set[Key]], entry: Any, key: Key) -> None:
    members = index.get(entry)
    if members is None or members == key:
        index[entry] = key
    elif isinstance(members, set):
        members.add(key)
    else:
        index[entry] = {members, key}


def _index_remove(index: dict[Any, Key | set[Key]], entry: Any, key: Key) -> None:
    members = index.get(entry)
    if isinstance(members, set):
        members.discard(key)
        if len(members) == 1:
            index[entry] = next(iter(members))
    elif members == key:
        del index[entry]


def _index_members(index: dict[Any, Key | set[Key]], entry: Any) -> Collection[Key]:
    """The keys under `entry` (the index's own set: read it, never change it)."""
    members = index.get(entry)
    if members is None:
        return ()
    return members if isinstance(members, set) else (members,)


def resource_version_number(body: Mapping[str, Any]) -> int:
    """metadata.resourceVersion as a number (-1 when absent or not a number)."""
    try:
        return int((body.get("metadata") or {})["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return -1


def agent_facts_from_lease(body: Mapping[str, Any]) -> AgentFacts:
    """Agent Lease → facts; garbage fields become None (unknown), never a default that looks live."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    annotations = meta.get("annotations") or {}
    duration = spec.get("leaseDurationSeconds")
    return AgentFacts(
        boot_id=annotations.get(api.AGENT_LEASE_BOOT_ID) or None,
        host_id=annotations.get(api.AGENT_LEASE_HOST_ID) or None,
        renew_time=parse_time(spec.get("renewTime")),
        lease_duration_seconds=duration if isinstance(duration, int) and duration > 0 else None,
    )


def lease_facts(body: Mapping[str, Any]) -> LeaseFacts:
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    duration = spec.get("leaseDurationSeconds")
    return LeaseFacts(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        holder_identity=spec.get("holderIdentity") or None,
        renew_time=parse_time(spec.get("renewTime")),
        lease_duration_seconds=duration if isinstance(duration, int) else None,
    )


def node_facts(body: Mapping[str, Any]) -> NodeFacts:
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    taints = spec.get("taints") or []
    return NodeFacts(
        exists=True,
        uid=meta.get("uid") or None,
        boot_id=((status.get("nodeInfo") or {}).get("bootID")) or None,
        out_of_service=any(isinstance(t, Mapping) and t.get("key") == api.OUT_OF_SERVICE_TAINT for t in taints),
        missing_since=None,
    )


@dataclasses.dataclass
class World:
    """The cache. Mutated only from the operator's event loop thread."""

    system_namespace: str = api.SYSTEM_NAMESPACE
    bodies: dict[Key, dict[str, Any]] = dataclasses.field(default_factory=dict)
    parsed: dict[Key, model.Registration] = dataclasses.field(default_factory=dict)
    agents: dict[str, AgentFacts] = dataclasses.field(default_factory=dict)
    nodes: dict[str, NodeFacts] = dataclasses.field(default_factory=dict)
    nodes_synced: bool = False
    node_missing_since: dict[str, datetime.datetime] = dataclasses.field(default_factory=dict)
    nodes_gone: dict[str, datetime.datetime] = dataclasses.field(default_factory=dict)
    """Nodes a live GET answered NotFound for, and when (the CLI's view; the operator confirms its
    own per decision, after the quarantine). Only these read exists=False."""
    leases: dict[str, dict[str, LeaseFacts]] = dataclasses.field(default_factory=lambda: defaultdict(dict))
    retire_permission: dict[str, bool | None] = dataclasses.field(default_factory=dict)
    admission_unverified: tuple[str, ...] = ()
    """Why the admission policies are not verified as shipped (`Facts.admission_unverified`): set
    by the operator's refresher; empty for a caller that does not check them (the CLI)."""
    # The peer indexes hold one Key where one registration has the entry (nearly always: a worker's
    # clientInstanceId and incarnation are its own), a set only where several share it: a set per
    # registration per index was a tenth of the cache at 150,000 registrations.
    by_instance: dict[tuple[str, str], Key | set[Key]] = dataclasses.field(default_factory=dict)
    by_incarnation: dict[tuple[str, ...], Key | set[Key]] = dataclasses.field(default_factory=dict)
    by_session: dict[tuple[str, str, str], Key | set[Key]] = dataclasses.field(default_factory=dict)
    by_node: dict[str, Key | set[Key]] = dataclasses.field(default_factory=dict)
    by_namespace: dict[str, set[Key]] = dataclasses.field(default_factory=lambda: defaultdict(set))
    intern: Callable[[str], str] | None = dataclasses.field(default=None, repr=False, compare=False)
    """Shares the keys and short strings of what is cached (the parsed records and `slim` bodies)
    across registrations: the operator passes `sys.intern`; None keeps each body's own strings. A
    body decoded from JSON holds its own copy of every key and string; at 150,000 registrations
    the copies were half of what the cache held per registration."""
    keep_bodies: bool = dataclasses.field(default=True, repr=False, compare=False)
    """Whether `bodies` keeps each registration's `slim` body. A reader that never writes (``plan``,
    ``doctor``) leaves it empty: only a write (the operator's, ``apply``'s) reads them back, and
    at 150,000 registrations they were 260 MB of the 1.2 GB ``plan -A`` built."""

    # --- registrations -------------------------------------------------------------------------

    def put_registration(self, body: dict[str, Any]) -> Key:
        key = key_of(body)
        self.forget_registration(key)
        body = trimmed(body)  # the record keeps labels: only the one that is read
        if self.intern is not None:  # parsed from shared strings, so that the record shares them too
            body = cast(dict[str, Any], shared(body, self.intern))
        registration = model.parse_registration(body, raw_attestation=False)
        if self.keep_bodies:
            self.bodies[key] = slim(body)
        self.parsed[key] = registration
        for index, index_key in self._index_keys(key, registration):
            _index_add(index, index_key, key)
        self.by_namespace[key[0]].add(key)
        return key

    def forget_registration(self, key: Key) -> None:
        registration = self.parsed.pop(key, None)
        self.bodies.pop(key, None)
        if registration is None:
            return
        for index, index_key in self._index_keys(key, registration):
            _index_remove(index, index_key, key)
        members = self.by_namespace.get(key[0])
        if members is not None:
            members.discard(key)
            if not members:
                del self.by_namespace[key[0]]

    def _index_keys(self, key: Key, r: model.Registration) -> list[tuple[dict[Any, Key | set[Key]], Any]]:
        keys = self._peer_index_keys(key, r)
        if r.node_name:
            keys.append((self.by_node, r.node_name))
        return keys

    def _peer_index_keys(self, key: Key, r: model.Registration) -> list[tuple[dict[Any, Key | set[Key]], Any]]:
        """The index entries of `r` that name its possible peers (every index but `by_node`)."""
        namespace = key[0]
        keys: list[tuple[dict[Any, Key | set[Key]], Any]] = []
        if r.client_instance_id:
            keys.append((self.by_instance, (namespace, r.client_instance_id)))
        inc = r.incarnation
        if inc is not None:
            keys.append(
                (
                    self.by_incarnation,
                    (
                        namespace,
                        r.node_name or "",
                        inc.boot_id or "",
                        inc.pid_namespace or "",
                        str(inc.pid),
                        inc.start_time or "",
                    ),
                )
            )
        if r.session_id and r.generation_id:
            keys.append((self.by_session, (namespace, r.session_id, r.generation_id)))
        return keys

    def peers_of(self, key: Key) -> list[model.Registration]:
        """Registrations that might share identity evidence with `key`: the only peers decide needs."""
        registration = self.parsed.get(key)
        if registration is None:
            return []
        found: set[Key] = set()
        for index, index_key in self._peer_index_keys(key, registration):
            found.update(_index_members(index, index_key))
        found.discard(key)
        if not found:  # the common case: no other registration shares an entry
            return []
        return [self.parsed[k] for k in sorted(found) if k in self.parsed]

    def keys_on_node(self, node: str) -> list[Key]:
        return sorted(_index_members(self.by_node, node))

    def keys_in_namespace(self, namespace: str) -> list[Key]:
        # Indexed: every Lease renewal in a namespace asks this, so it must not scan the registry.
        return sorted(self.by_namespace.get(namespace, ()))

    def namespaces(self) -> list[str]:
        return sorted(self.by_namespace)

    def observe_registration(self, body: dict[str, Any]) -> bool:
        """Caches `body` unless the cached version is newer (by resourceVersion); True if cached.

        A body the operator wrote (the answer to its patch) or read live is at least as new as the
        watch's; a watch event older than it is skipped. Numeric resourceVersion order is only an
        optimisation here; correctness comes from the compare-and-swap writes."""
        cached = self.bodies.get(key_of(body))
        if cached is not None and resource_version_number(body) < resource_version_number(cached):
            return False
        self.put_registration(body)
        return True

    # --- the retire capability -----------------------------------------------------------------

    def set_retire_permission(self, namespace: str, allowed: bool | None) -> bool:
        """Records whether the `retire` verb is held in `namespace`; True if that changed."""
        changed = namespace not in self.retire_permission or self.retire_permission[namespace] != allowed
        self.retire_permission[namespace] = allowed
        return changed

    # --- the admission policies ----------------------------------------------------------------

    def set_admission_unverified(self, why: Iterable[str]) -> bool:
        """Records what keeps the admission policies from being verified (empty: verified); True
        if that changed, which may change the decision of every registration."""
        why = tuple(why)
        changed = why != self.admission_unverified
        self.admission_unverified = why
        return changed

    # --- leases and nodes ----------------------------------------------------------------------

    def put_lease(self, body: Mapping[str, Any]) -> tuple[str, str | None]:
        """Returns ("agent", node) for an agent Lease, ("lease", namespace) for a protecting one."""
        facts = lease_facts(body)
        if facts.namespace == self.system_namespace and facts.name.startswith(api.AGENT_LEASE_PREFIX):
            node = facts.name[len(api.AGENT_LEASE_PREFIX) :]
            self.agents[node] = agent_facts_from_lease(body)
            return "agent", node
        if facts.namespace == self.system_namespace:
            return "system", None
        self.leases[facts.namespace][facts.name] = facts
        return "lease", facts.namespace

    def is_routine_agent_renewal(self, body: Mapping[str, Any], *, now: datetime.datetime) -> bool:
        """An agent Lease update that only moves the expiry of an agent that is live at `now`.

        No decision changes by it: one that stopped at the agent line saw the agent live and still
        does, with the same boot and host; every one that depends on the expiry is re-decided by the
        node's one expiry timer (the reconciler's `watch_agent_expiry`), which the renewal moves. Anything else about the agent —
        first sight, a boot or host id, a duration, a renewal after the Lease had expired — is not
        routine, and re-decides every registration on the node."""
        facts = lease_facts(body)
        if facts.namespace != self.system_namespace or not facts.name.startswith(api.AGENT_LEASE_PREFIX):
            return False
        old = self.agents.get(facts.name[len(api.AGENT_LEASE_PREFIX) :])
        if old is None:
            return False
        new = agent_facts_from_lease(body)
        old_until = lease_expiry(old.renew_time, old.lease_duration_seconds)
        new_until = lease_expiry(new.renew_time, new.lease_duration_seconds)
        return (
            old_until is not None
            and new_until is not None
            and now < old_until <= new_until
            and dataclasses.replace(old, renew_time=new.renew_time) == new
        )

    def forget_lease(self, body: Mapping[str, Any]) -> tuple[str, str | None]:
        facts = lease_facts(body)
        if facts.namespace == self.system_namespace and facts.name.startswith(api.AGENT_LEASE_PREFIX):
            node = facts.name[len(api.AGENT_LEASE_PREFIX) :]
            self.agents.pop(node, None)
            return "agent", node
        self.leases.get(facts.namespace, {}).pop(facts.name, None)
        return "lease", facts.namespace

    def replace_leases(self, namespace: str, leases: Mapping[str, LeaseFacts]) -> None:
        """The protecting Leases of `namespace` as a live read found them (a retirement's fence)."""
        self.leases[namespace] = dict(leases)

    def mark_nodes_synced(self) -> None:
        """The Node cache is populated: a Node absent from it from now on may be gone."""
        self.nodes_synced = True

    def put_node(self, body: Mapping[str, Any]) -> str:
        name = str((body.get("metadata") or {}).get("name") or "")
        self.nodes[name] = node_facts(body)
        self.node_missing_since.pop(name, None)
        self.nodes_gone.pop(name, None)
        return name

    def forget_node(self, name: str, *, now: datetime.datetime) -> None:
        self.nodes.pop(name, None)
        self.node_missing_since.setdefault(name, now)

    def node_view(self, name: str, *, now: datetime.datetime) -> NodeFacts:
        """The Node as the cache knows it. Absent from a synced cache is "not seen", not "deleted":
        only a live GET (done by the reconciler) may turn that into exists=False."""
        if name in self.nodes:
            return self.nodes[name]
        if name in self.nodes_gone:
            return NodeFacts(exists=False, missing_since=self.nodes_gone[name])
        since = self.node_missing_since.setdefault(name, now) if self.nodes_synced else None
        return NodeFacts(exists=None, uid=None, boot_id=None, out_of_service=False, missing_since=since)

    # --- facts ---------------------------------------------------------------------------------

    def facts_for(self, key: Key, *, now: datetime.datetime, node: NodeFacts | None = None) -> Facts:
        """The facts `decide` needs about `key`, from the cache. `node` stands in for the cached view
        of the registration's Node where a live read confirmed more than the cache knows (the
        operator's confirmation that the Node is gone). A retirement's fence replaces the Leases and
        the permission with what it read live: `coroner.retire.fenced` (the facts are a frozen
        dataclass; `dataclasses.replace` is the override)."""
        registration = self.parsed[key]
        node_name = registration.node_name or ""
        nodes: dict[str, NodeFacts] = {}
        if node_name:
            nodes[node_name] = node or self.node_view(node_name, now=now)
        agents = {node_name: self.agents[node_name]} if node_name in self.agents else {}
        return Facts(
            agents=agents,
            nodes=nodes,
            protecting_leases=tuple(self.leases.get(key[0], {}).values()),
            peers=tuple(self.peers_of(key)),
            retire_permission=self.retire_permission.get(key[0]),
            admission_unverified=self.admission_unverified,
        )
