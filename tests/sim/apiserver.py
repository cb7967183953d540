"""A model Kubernetes API server: what Coroner's correctness leans on, and nothing more.

- one resourceVersion counter; every write bumps the object's `metadata.resourceVersion`;
- JSON patch with `test` (a failed test is 422), merge patch, server-side apply of a list-map
  keyed by `type` (the launcher's goodbye), update with a resourceVersion precondition (409 when
  stale), delete with `{uid, resourceVersion}` preconditions (409);
- admission as manifests/base decides it, by identity (the subset in docs/simulation.md);
- watches with a per-client lag, bookmarks (a delivery always advances the client's
  resourceVersion), 410 Gone once the client's resourceVersion is older than the compacted log,
  and a client pinned to a lagging replica (reads and events capped at an older resourceVersion);
- every object's full version history, so a lagging replica can serve any past list.

Bodies are immutable once stored: writes copy along the path they change (copy-on-write), and
clients must not mutate what they receive (the production code does not).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from typing import Any

from sim.prod import ConditionType, api

Key = tuple[str, str, str]  # (kind, namespace, name): kind "wreg" or "lease"


class SimApiError(Exception):
    def __init__(self, status: int, reason: str, message: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


def jcopy(value: Any) -> Any:
    """A copy of a JSON value (dicts and lists copied, scalars shared)."""
    if isinstance(value, dict):
        return {k: jcopy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [jcopy(v) for v in value]
    return value


def _tokens(path: str) -> list[str]:
    if not path.startswith("/"):
        raise SimApiError(422, "Invalid", f"bad JSON pointer {path!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _resolve(body: Any, tokens: list[str]) -> Any:
    node = body
    for token in tokens:
        if isinstance(node, dict):
            if token not in node:
                raise KeyError(token)
            node = node[token]
        elif isinstance(node, list):
            node = node[int(token)]
        else:
            raise KeyError(token)
    return node


def apply_json_patch(body: dict[str, Any], ops: list[Mapping[str, Any]]) -> dict[str, Any]:
    """RFC 6902 (test, add, replace, remove) with copy-on-write; a failed test is 422."""
    root = body
    for op in ops:
        kind, tokens = op.get("op"), _tokens(str(op.get("path")))
        if kind == "test":
            try:
                found = _resolve(root, tokens)
            except (KeyError, IndexError, ValueError):
                raise SimApiError(422, "Invalid", f"test of {op['path']} failed: absent") from None
            if found != op.get("value"):
                raise SimApiError(422, "Invalid", f"test of {op['path']} failed")
            continue
        root = dict(root)
        parent = root
        for token in tokens[:-1]:
            child = parent.get(token) if isinstance(parent, dict) else None
            if not isinstance(child, dict):
                raise SimApiError(422, "Invalid", f"{op['path']}: parent {token!r} absent")
            child = dict(child)
            parent[token] = child
            parent = child
        last = tokens[-1]
        if kind in ("add", "replace"):
            if kind == "replace" and last not in parent:
                raise SimApiError(422, "Invalid", f"replace of absent {op['path']}")
            parent[last] = op.get("value")  # built fresh by the writer, and never mutated after
        elif kind == "remove":
            if last not in parent:
                raise SimApiError(422, "Invalid", f"remove of absent {op['path']}")
            del parent[last]
        else:
            raise SimApiError(422, "Invalid", f"unsupported op {kind!r}")
    return root


def _merge(old: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return jcopy(patch)
    out = dict(old) if isinstance(old, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge(out.get(k), v)
    return out


def _conditions(body: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    status = (body or {}).get("status")
    conds = status.get("conditions") if isinstance(status, dict) else None
    return [c for c in conds if isinstance(c, dict)] if isinstance(conds, list) else []


_RETIRED = ConditionType.RETIRED.value
_RELEASED = ConditionType.RELEASED.value


def _true_in(status: Mapping[str, Any], kind: str) -> bool:
    conds = status.get("conditions")
    if not isinstance(conds, list):
        return False
    return any(isinstance(c, dict) and c.get("type") == kind and c.get("status") == "True" for c in conds)


def _true(body: Mapping[str, Any] | None, kind: str) -> bool:
    status = body.get("status") if body else None
    return isinstance(status, dict) and _true_in(status, kind)


def retired(body: Mapping[str, Any] | None) -> bool:
    status = body.get("status") if body else None
    return isinstance(status, dict) and ("retirement" in status or _true_in(status, _RETIRED))


def _state(body: Mapping[str, Any]) -> str:
    """The CRD's rule on status.state (manifests/base/crd.yaml)."""
    return "Retired" if retired(body) else "Released" if released(body) else "Active"


def released(body: Mapping[str, Any] | None) -> bool:
    return _true(body, _RELEASED)


def _status(body: Mapping[str, Any] | None) -> Mapping[str, Any]:
    status = (body or {}).get("status")
    return status if isinstance(status, dict) else {}


class Watcher:
    """One client's watch of one kind: lagged, bookmarked, possibly capped to a lagging replica."""

    def __init__(
        self,
        server: Server,
        *,
        name: str,
        kind: str,
        selector: Callable[[Mapping[str, Any]], bool],
        lag: float,
        on_event: Callable[[str, dict[str, Any]], None],
        on_relist: Callable[[list[dict[str, Any]]], None],
    ) -> None:
        self.server = server
        self.name = name
        self.kind = kind
        self.selector = selector
        self.lag = lag
        self.on_event = on_event
        self.on_relist = on_relist
        self.pos = 0
        self.connected = False
        self.cap: int | None = None
        """A lagging replica: nothing after this resourceVersion is listed or delivered."""
        self.withhold: dict[tuple[str, str], int] = {}
        """Sieve's unobserved state: key -> events still to drop; the cancelling one is delivered."""
        self.stash: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
        self.delivered = 0
        self.bookmarks = 0
        self.gone = 0
        self.dropped = 0
        self.pending = False
        self.release_due = False

    def start(self) -> None:
        """List (from the replica if capped), then watch from the list's resourceVersion."""
        self.connected = True
        self.stash.clear()  # a relist is the whole state: nothing withheld is owed any more
        self.release_due = False
        items, rv = self.server.list(self.kind, self.selector, at_rv=self.cap)
        self.pos = rv
        self.on_relist(items)

    def stop(self) -> None:
        self.connected = False
        self.server.watchers = [w for w in self.server.watchers if w is not self]

    def deliver(self) -> None:
        self.pending = False
        if not self.connected:
            return
        if self.release_due:
            self.release_withheld()
            if not self.connected:
                return
        server = self.server
        if self.pos < server.compacted:
            self.gone += 1  # 410 Gone: the client relists
            self.start()
            return
        target = server.rv if self.cap is None else min(self.cap, server.rv)
        if target <= self.pos:
            return
        start = bisect.bisect_right(server.log_rvs, self.pos)
        seen = False
        for i in range(start, len(server.log)):
            rv, etype, key, body = server.log[i]
            if rv > target:
                break
            if key[0] != self.kind or not self.selector(body):
                continue
            seen = True
            short = (key[1], key[2])
            left = self.withhold.get(short)
            if left is not None:
                if left > 0 and etype != "DELETED":
                    self.withhold[short] = left - 1
                    self.stash[short] = (etype, body)
                    self.dropped += 1
                    continue
                del self.withhold[short]
                self.stash.pop(short, None)
            self.pos = rv
            self.delivered += 1
            self.on_event(etype, body)
            if not self.connected:
                return  # the handler crashed the component
        if not seen:
            self.bookmarks += 1
        self.pos = target  # a bookmark: the client's resourceVersion moves even without events

    def release_withheld(self) -> None:
        """Deliver what is withheld (the fault heals): the latest state of each key, once."""
        self.withhold.clear()
        if not self.connected:
            self.release_due = True  # owed at the next delivery after the watch reconnects
            return
        self.release_due = False
        stash, self.stash = self.stash, {}
        for etype, body in stash.values():
            if self.connected:
                self.on_event(etype, body)


class Server:
    def __init__(self, *, at: Callable[[float, Callable[[], None]], None], clock: Callable[[], float]) -> None:
        self.at = at
        self.clock = clock
        self.rv = 0
        self.uids = 0
        self.objects: dict[Key, dict[str, Any]] = {}
        self.versions: dict[Key, list[tuple[int, dict[str, Any] | None]]] = {}
        self.log: list[tuple[int, str, Key, dict[str, Any]]] = []
        self.log_rvs: list[int] = []
        self.compacted = 0
        self.watchers: list[Watcher] = []
        self.grant = True
        """Whether the retire verb is bound (operators and the human hold it while True)."""
        self.on_write: Callable[[str, str, Key, dict[str, Any] | None, dict[str, Any] | None, int | None], None] = (
            lambda *a: None
        )
        self.on_fence: Callable[[str], None] = lambda namespace: None
        """Called as a retirement's Lease fence read reaches the server, before it is answered."""
        self.counts: dict[str, int] = {}

    # --- reads -----------------------------------------------------------------------------------

    def get(self, kind: str, namespace: str, name: str, *, at_rv: int | None = None) -> dict[str, Any]:
        key = (kind, namespace, name)
        body = self._at(key, at_rv) if at_rv is not None else self.objects.get(key)
        if body is None:
            raise SimApiError(404, "NotFound", f"{kind} {namespace}/{name}")
        return body

    def _at(self, key: Key, rv: int) -> dict[str, Any] | None:
        history = self.versions.get(key, [])
        found = None
        for version_rv, body in history:
            if version_rv > rv:
                break
            found = body
        return found

    def list(
        self, kind: str, selector: Callable[[Mapping[str, Any]], bool], *, at_rv: int | None = None
    ) -> tuple[list[dict[str, Any]], int]:
        if at_rv is None or at_rv >= self.rv:
            items = [b for k, b in self.objects.items() if k[0] == kind and selector(b)]
            return items, self.rv
        items = []
        for key in self.versions:
            if key[0] != kind:
                continue
            body = self._at(key, at_rv)
            if body is not None and selector(body):
                items.append(body)
        return items, at_rv

    def list_leases(self, namespace: str) -> list[dict[str, Any]]:
        """A live LIST of one namespace's Leases: what a retirement's Lease fence reads, after its decision."""
        self.on_fence(namespace)
        items, _ = self.list("lease", lambda b: (b.get("metadata") or {}).get("namespace") == namespace)
        return items

    # --- writes ----------------------------------------------------------------------------------

    def _commit(
        self, identity: str, verb: str, key: Key, old: dict[str, Any] | None, new: dict[str, Any] | None,
        view_rv: int | None = None,
    ) -> dict[str, Any] | None:  # fmt: skip
        self.rv += 1
        etype = "DELETED" if new is None else ("ADDED" if old is None else "MODIFIED")
        if new is not None:
            meta = dict(new.get("metadata") or {})
            meta["resourceVersion"] = str(self.rv)
            new = {**new, "metadata": meta}
            self.objects[key] = new
            event_body = new
        else:
            self.objects.pop(key, None)
            assert old is not None
            event_body = {**old, "metadata": {**old["metadata"], "resourceVersion": str(self.rv)}}
        self.versions.setdefault(key, []).append((self.rv, new))
        self.log.append((self.rv, etype, key, event_body))
        self.log_rvs.append(self.rv)
        self.counts[verb] = self.counts.get(verb, 0) + 1
        self.on_write(identity, verb, key, old, new, view_rv)
        for watcher in self.watchers:
            if watcher.connected and watcher.kind == key[0] and not watcher.pending:
                watcher.pending = True
                self.at(self.clock() + watcher.lag, watcher.deliver)
        return new

    def compact(self, keep: int) -> None:
        """Forget watch history older than the last `keep` resourceVersions (etcd compaction)."""
        floor = self.rv - keep
        if floor <= self.compacted:
            return
        self.compacted = floor
        cut = bisect.bisect_right(self.log_rvs, floor)
        del self.log[:cut]
        del self.log_rvs[:cut]

    def create(self, identity: str, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        meta = body["metadata"]
        key = (kind, meta.get("namespace") or "", meta["name"])
        if key in self.objects:
            raise SimApiError(409, "AlreadyExists", f"{key}")
        self.uids += 1
        stamp = self.stamp()
        new = {**jcopy(body), "metadata": {**jcopy(meta), "uid": f"uid-{self.uids}", "generation": 1,
                                           "creationTimestamp": stamp}}  # fmt: skip
        self._admit(identity, "CREATE", key, None, new)
        out = self._commit(identity, "create", key, None, new)
        assert out is not None
        return out

    def stamp(self) -> str:
        from sim.clock import iso

        return iso(self.clock(), fraction=False)

    def patch(
        self, identity: str, kind: str, namespace: str, name: str, ops: list[Mapping[str, Any]], *,
        view_rv: int | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """A JSON patch of the status subresource (what every Coroner status write is)."""
        key = (kind, namespace, name)
        old = self.objects.get(key)
        if old is None:
            raise SimApiError(404, "NotFound", f"{key}")
        new = apply_json_patch(old, ops)
        new = {**new, "spec": old.get("spec"), "metadata": {**old["metadata"]}}  # status subresource
        self._admit(identity, "UPDATE", key, old, new)
        out = self._commit(identity, "patch", key, old, new, view_rv)
        assert out is not None
        return out

    def annotate(self, identity: str, kind: str, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        """A merge patch of metadata.annotations on the main resource (any other client's write:
        `kubectl annotate`, a GitOps tool): a new resourceVersion, nothing Coroner reads changed."""
        key = (kind, namespace, name)
        old = self.objects[key]
        meta = old["metadata"]
        new = {**old, "metadata": {**meta, "annotations": {**(meta.get("annotations") or {}), **annotations}}}
        self._admit(identity, "UPDATE", key, old, new)
        self._commit(identity, "annotate", key, old, new)

    def merge_status(
        self, identity: str, kind: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any]:
        key = (kind, namespace, name)
        old = self.objects.get(key)
        if old is None:
            raise SimApiError(404, "NotFound", f"{key}")
        new = {**old, "status": _merge(old.get("status"), patch.get("status"))}
        self._admit(identity, "UPDATE", key, old, new)
        out = self._commit(identity, "merge", key, old, new)
        assert out is not None
        return out

    def apply_status(self, identity: str, kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply of status.conditions entries (a list-map keyed by type), no precondition."""
        meta = body["metadata"]
        key = (kind, meta["namespace"], meta["name"])
        old = self.objects.get(key)
        if old is None:
            raise SimApiError(404, "NotFound", f"{key}")
        conds = list(_conditions(old))
        for entry in (body.get("status") or {}).get("conditions") or []:
            conds = [c for c in conds if c.get("type") != entry.get("type")] + [jcopy(entry)]
        applied = {k: jcopy(v) for k, v in (body.get("status") or {}).items() if k != "conditions"}
        new = {**old, "status": {**_status(old), **applied, "conditions": conds}}
        self._admit(identity, "UPDATE", key, old, new)
        out = self._commit(identity, "apply", key, old, new)
        assert out is not None
        return out

    def upsert(self, identity: str, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create, or update with the resourceVersion read (a Lease renewal: GET then PUT)."""
        meta = body["metadata"]
        key = (kind, meta.get("namespace") or "", meta["name"])
        old = self.objects.get(key)
        if old is None:
            return self.create(identity, kind, body)
        sent = meta.get("resourceVersion")
        if sent is not None and sent != old["metadata"]["resourceVersion"]:
            raise SimApiError(409, "Conflict", f"{key}: the object has been modified")
        new = {
            **jcopy(body),
            "metadata": {**old["metadata"], **jcopy(meta), "resourceVersion": old["metadata"]["resourceVersion"]},
        }
        self._admit(identity, "UPDATE", key, old, new)
        out = self._commit(identity, "update", key, old, new)
        assert out is not None
        return out

    def delete(self, identity: str, kind: str, namespace: str, name: str, *, uid: str, resource_version: str) -> None:
        key = (kind, namespace, name)
        old = self.objects.get(key)
        if old is None:
            raise SimApiError(404, "NotFound", f"{key}")
        meta = old["metadata"]
        if meta.get("uid") != uid or meta.get("resourceVersion") != resource_version:
            raise SimApiError(409, "Conflict", "precondition failed")
        self._admit(identity, "DELETE", key, old, None)
        self._commit(identity, "delete", key, old, None)

    # --- admission (manifests/base/admission-policies.yaml and the CRD's rules) ----------------

    def _evidence(self, identity: str, new: dict[str, Any]) -> None:
        """Policy 6, coroner-retire-requires-evidence (process evidence; node evidence is not
        modelled, so it is refused but to a person, who states it: statement Human)."""
        status, spec = _status(new), new.get("spec") or {}
        record = status.get("retirement")
        if not isinstance(record, dict):
            self._refuse("evidence", "a retirement needs status.retirement")
        claimed = record.get("reason")
        if record.get("retiredBy") != identity:
            self._refuse("evidence", f"retiredBy must be the requester {identity}")
        if record.get("attestation") != status.get("attestation"):
            self._refuse("evidence", "status.retirement.attestation must be a verbatim copy of status.attestation")
        if any(c.get("type") == "Retired" and c.get("status") == "True" and c.get("reason") != claimed
               for c in _conditions(new)):  # fmt: skip
            self._refuse("evidence", "the Retired condition must name the evidence")
        person = not (identity.startswith("operator") or identity.startswith("agent:"))
        node_evidence = claimed in ("NodeDeleted", "NodeOutOfService")
        if record.get("statement") is not None and not (node_evidence and person):
            self._refuse("evidence", "status.retirement.statement records a person stating node evidence")
        if node_evidence:
            if not person:
                self._refuse("evidence", "node evidence needs the node-loss component or a person")
            if record.get("statement") != "Human":
                self._refuse("evidence", 'a person\'s node evidence needs status.retirement.statement "Human"')
            return
        if claimed not in ("PidfdExited", "ProcAbsent", "PidNamespaceRecreated", "BootBoundary"):
            self._refuse("evidence", f"{claimed!r} is not death evidence")
        att = status.get("attestation")
        if not isinstance(att, dict):
            self._refuse("evidence", "process evidence needs a Dead attestation")
        inc, attested = spec.get("incarnation") or {}, att.get("incarnation") or {}
        same = all(attested.get(f) == inc.get(f) for f in ("bootId", "pidNamespace", "pid", "startTime", "hostId"))
        if (
            att.get("verdict") != "Dead"
            or (att.get("agent") or {}).get("nodeName") != spec.get("nodeName")
            or not same
            or (att.get("hostId") != inc.get("hostId") and inc.get("hostId") != spec.get("nodeName"))
            or att.get("evidence") != claimed
        ):
            self._refuse(
                "evidence",
                "the attestation is not a Dead one of exactly this incarnation, by its node's agent, on that path",
            )

    def _refuse(self, policy: str, message: str) -> None:
        self.counts[f"refused:{policy}"] = self.counts.get(f"refused:{policy}", 0) + 1
        raise SimApiError(403, "Forbidden", message)

    def holds_retire(self, identity: str) -> bool:
        return self.grant and (identity.startswith("operator") or identity == "human")

    def _admit(self, identity: str, op: str, key: Key, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if key[0] == "lease":
            if identity.startswith("agent:"):
                node = identity.split(":", 1)[1]
                if key[1] != api.SYSTEM_NAMESPACE or key[2] != f"{api.AGENT_LEASE_PREFIX}{node}":
                    raise SimApiError(403, "Forbidden", f"the agent of {node} may only write its own Lease")
            return
        if new is not None:
            labels = (new.get("metadata") or {}).get("labels") or {}
            if labels.get(api.NODE_LABEL, "") != (new.get("spec") or {}).get("nodeName"):
                raise SimApiError(403, "Invalid", "label coroner.dev/node must equal spec.nodeName")
        if old is not None and new is not None:
            if new.get("spec") != old.get("spec"):
                raise SimApiError(422, "Invalid", "spec is immutable")
            old_status, new_status = _status(old), _status(new)
            if "retirement" in old_status and new_status.get("retirement") != old_status["retirement"]:
                raise SimApiError(422, "Invalid", "status.retirement is terminal history")
            if "retirement" in old_status and released(new) and not released(old):
                raise SimApiError(422, "Invalid", "a retired WorkerRegistration cannot be Released")
            if new_status and new_status.get("state", "Active") != _state(new):
                raise SimApiError(422, "Invalid", f"status.state must be {_state(new)}")
        if new is not None and retired(new) and not retired(old):
            if not self.holds_retire(identity):
                raise SimApiError(403, "Forbidden", f"{identity} does not hold the retire verb")
            self._evidence(identity, new)
        if identity.startswith("agent:"):
            node = identity.split(":", 1)[1]
            if op != "UPDATE":
                raise SimApiError(403, "Forbidden", "the agent may only update the status subresource")
            assert old is not None and new is not None
            if (new.get("spec") or {}).get("nodeName") != node:
                raise SimApiError(403, "Forbidden", f"the agent of {node} may not attest another node's registration")
            o, n = _status(old), _status(new)
            for field in ("lastHeartbeatTime", "conditions", "retirement"):
                if o.get(field) != n.get(field):
                    raise SimApiError(403, "Forbidden", "the coroner agent may change only status.attestation")
            return
        if op == "DELETE" and old is not None and not (retired(old) or released(old)):
            # Policy 8: only terminal registrations (no cluster admin is modelled).
            self._refuse("delete", f"{identity} may not delete an Active registration")
        if op == "UPDATE" and old is not None and new is not None:
            if _status(old).get("attestation") != _status(new).get("attestation"):
                raise SimApiError(403, "Forbidden", f"{identity} may not write status.attestation")

            # Policy 4: the heartbeat and Released are the registrant's (the launcher, the only
            # registrant modelled); Retired the operator's, or with status.retirement; no other type.
            def of(body: dict[str, Any], kinds: tuple[str, ...], *, known: bool = True) -> list[Mapping[str, Any]]:
                return [c for c in _conditions(body) if (c.get("type") in kinds) == known]

            owners = ("Released",)
            if identity != "launcher" and (
                _status(old).get("lastHeartbeatTime") != _status(new).get("lastHeartbeatTime")
                or of(old, owners) != of(new, owners)
            ):
                self._refuse("ownership", f"{identity} may not change the heartbeat or Released")
            if (
                of(old, ("Retired",)) != of(new, ("Retired",))
                and not identity.startswith("operator")
                and not ("retirement" not in _status(old) and "retirement" in _status(new))
            ):
                self._refuse("ownership", f"{identity} may not change the Retired condition")
            four = ("Attested", "Retirable", "Retired", "Released")
            if of(old, four, known=False) != of(new, four, known=False):
                self._refuse("ownership", f"{identity} may not add, remove or change other conditions")
            if not identity.startswith("operator"):
                pick = ("Attested", "Retirable")
                if [c for c in _conditions(old) if c.get("type") in pick] != [
                    c for c in _conditions(new) if c.get("type") in pick
                ]:
                    raise SimApiError(403, "Forbidden", f"{identity} may not change Attested or Retirable")
