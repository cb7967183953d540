"""Builders of raw `WorkerRegistration` objects and decision facts, shaped like the API returns them.

The defaults describe one registration that is retirable at `NOW`: a launcher-minted worker whose
process the agent of its node attested Dead by pidfd after it fell silent. Each test changes the
one thing it is about — through a keyword, or through `paths` for anything else — so that a reason
in a test can only come from that change.
"""

from __future__ import annotations

import copy
import datetime
import functools
import gc
import json
import pathlib
import statistics
import tracemalloc
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import yaml

from coroner.core.api import REGISTERED_BY_ANNOTATION
from coroner.core.decision import AgentFacts, Decision, Facts, LeaseFacts, NodeFacts, Policy, decide
from coroner.core.model import Registration, format_time, parse_registration
from coroner.core.world import World

UTC: Final = datetime.UTC
NOW: Final = datetime.datetime(2026, 11, 30, 18, 0, 0, tzinfo=UTC)
TICK: Final = datetime.timedelta(microseconds=1)

NAMESPACE: Final = "jobs"
NAME: Final = "queue-consumer-7f3a"
NODE: Final = "node-a"
NODE_UID: Final = "3f1c0000-0000-4000-8000-00000000000a"
BOOT: Final = "8d0a4c6e-0000-4000-8000-000000000001"
OTHER_BOOT: Final = "8d0a4c6e-0000-4000-8000-000000000002"
HOST: Final = "0f2e0000000000000000000000000001"
PID_NAMESPACE: Final = "4026531836"
PID: Final = 4242
START_TIME: Final = "123456789"
CLIENT_INSTANCE: Final = "inst-5c2b0000"
SESSION: Final = "s-1"
GENERATION: Final = "1"
INTERVAL: Final = 10
TTL: Final = 30
#: Default silence: past the TTL, so every fast-path window has passed too.
SILENCE: Final = datetime.timedelta(seconds=60)
#: Default attestation age (any age is fine: a death is final; the agent Lease says it is current).
ATTESTATION_AGE: Final = datetime.timedelta(seconds=10)
#: Who created the registration, as admission records it (coroner.dev/registered-by): the worker's
#: ServiceAccount and Pod. Peers made by `make_peer` share it unless told otherwise.
REGISTRANT: Final = (
    "system:serviceaccount:jobs:queue-consumer pod/queue-consumer-0/5f0c0000-0000-4000-8000-000000000001"
)
SQUATTER: Final = "system:serviceaccount:jobs:squatter"


class _Delete:
    def __repr__(self) -> str:
        return "DELETE"


#: In `paths`, removes the key instead of setting it.
DELETE: Final = _Delete()


def stamp(moment: datetime.datetime) -> str:
    """RFC 3339 with microseconds, as the launcher and the agent write times."""
    return format_time(moment, fraction=True)


def set_path(obj: dict[str, Any], path: str, value: object) -> None:
    """Sets (or, with DELETE, removes) a dotted path, creating objects on the way."""
    *parents, leaf = path.split(".")
    node: Any = obj
    for part in parents:
        if not isinstance(node.get(part), dict):
            if value is DELETE:
                return
            node[part] = {}
        node = node[part]
    if value is DELETE:
        node.pop(leaf, None)
    else:
        node[leaf] = copy.deepcopy(value)


def make_registration(
    *,
    namespace: str = NAMESPACE,
    name: str = NAME,
    uid: str | None = None,
    node_name: str = NODE,
    node_uid: str = NODE_UID,
    boot_id: str = BOOT,
    pid_namespace: str = PID_NAMESPACE,
    pid: object = PID,
    start_time: str = START_TIME,
    host_id: str = HOST,
    client_instance_id: str = CLIENT_INSTANCE,
    session_id: str = SESSION,
    generation_id: str = GENERATION,
    interval_seconds: int = INTERVAL,
    ttl_seconds: int = TTL,
    created_at: datetime.datetime = NOW - datetime.timedelta(hours=1),
    heartbeat_at: datetime.datetime | str | None = NOW - SILENCE,
    heartbeat: bool = True,
    attested: bool = True,
    verdict: str = "Dead",
    evidence: str = "PidfdExited",
    observed_at: datetime.datetime | str = NOW - ATTESTATION_AGE,
    first_observed_at: datetime.datetime | str | None = None,
    agent_boot_id: str | None = None,
    conditions: Sequence[Mapping[str, object]] = (),
    registered_by: str | None = REGISTRANT,
    paths: Mapping[str, object] | None = None,
) -> dict[str, Any]:
    """A raw object as ``GET .../workerregistrations/NAME`` returns it; retirable at NOW by default.

    The attestation echoes the registration's incarnation and heartbeat unless told otherwise; set
    ``agent_boot_id`` for BootBoundary (the agent's current boot), ``paths`` for anything else.
    ``heartbeat=False`` is a worker that did not opt into heartbeats: no ``spec.heartbeat``, no
    ``status.lastHeartbeatTime``. ``registered_by=None`` leaves out the registrant annotation.
    """
    if not heartbeat:
        heartbeat_at = None
    heartbeat_raw = stamp(heartbeat_at) if isinstance(heartbeat_at, datetime.datetime) else heartbeat_at
    incarnation = {
        "bootId": boot_id,
        "pidNamespace": pid_namespace,
        "pid": pid,
        "startTime": start_time,
        "hostId": host_id,
    }
    obj: dict[str, Any] = {
        "apiVersion": "coroner.dev/v1alpha1",
        "kind": "WorkerRegistration",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{namespace}-{name}",
            "resourceVersion": "1001",
            "generation": 1,
            "creationTimestamp": format_time(created_at),
            "labels": {"coroner.dev/node": node_name},
        },
        "spec": {
            "nodeName": node_name,
            "nodeUID": node_uid,
            "incarnation": incarnation,
            "clientInstanceId": client_instance_id,
            "sessionId": session_id,
            "generationId": generation_id,
            "role": "queue-consumer",
            "heartbeat": {"intervalSeconds": interval_seconds, "ttlSeconds": ttl_seconds},
        },
        "status": {},
    }
    if registered_by is not None:
        obj["metadata"]["annotations"] = {REGISTERED_BY_ANNOTATION: registered_by}
    if not heartbeat:
        del obj["spec"]["heartbeat"]
    if heartbeat_raw is not None:
        obj["status"]["lastHeartbeatTime"] = heartbeat_raw
    if attested:
        obj["status"]["attestation"] = {
            "verdict": verdict,
            "evidence": evidence,
            "detail": f"{evidence} for pid {pid}",
            "incarnation": dict(incarnation),
            "bootId": agent_boot_id or boot_id,
            "hostId": host_id,
            "observedTime": stamp(observed_at) if isinstance(observed_at, datetime.datetime) else observed_at,
            **(
                {}
                if first_observed_at is None
                else {
                    "firstObservedTime": stamp(first_observed_at)
                    if isinstance(first_observed_at, datetime.datetime)
                    else first_observed_at
                }
            ),
            "heartbeatSeen": heartbeat_raw or "",
            "agent": {
                "nodeName": node_name,
                "podName": f"coroner-agent-{node_name}",
                "identity": "system:serviceaccount:coroner-system:coroner-agent",
            },
        }
    if conditions:
        obj["status"]["conditions"] = [dict(condition) for condition in conditions]
    for path, value in (paths or {}).items():
        set_path(obj, path, value)
    return obj


def make_agent(
    *,
    boot_id: str | None = BOOT,
    host_id: str | None = HOST,
    renewed_at: datetime.datetime | None = NOW - datetime.timedelta(seconds=5),
    lease_duration_seconds: float | None = 40,
) -> AgentFacts:
    """A live agent Lease for the default node (renewed 5 s ago, 40 s duration)."""
    return AgentFacts(
        boot_id=boot_id, host_id=host_id, renew_time=renewed_at, lease_duration_seconds=lease_duration_seconds
    )


def make_node(
    *,
    exists: bool | None = True,
    uid: str | None = NODE_UID,
    boot_id: str | None = BOOT,
    out_of_service: bool = False,
    missing_since: datetime.datetime | None = None,
) -> NodeFacts:
    """The default Node, present and on the incarnation's boot."""
    return NodeFacts(
        exists=exists, uid=uid, boot_id=boot_id, out_of_service=out_of_service, missing_since=missing_since
    )


def make_lease(
    *,
    holder: str | None = NAME,
    namespace: str = NAMESPACE,
    name: str = "work-lock",
    renewed_at: datetime.datetime | None = NOW,
    lease_duration_seconds: float | None = 30,
) -> LeaseFacts:
    """A Lease held by the default registration, renewed at NOW."""
    return LeaseFacts(
        namespace=namespace,
        name=name,
        holder_identity=holder,
        renew_time=renewed_at,
        lease_duration_seconds=lease_duration_seconds,
    )


class _Default:
    pass


_DEFAULT: Final = _Default()


def make_facts(
    *,
    agent: AgentFacts | _Default | None = _DEFAULT,
    node: NodeFacts | _Default | None = _DEFAULT,
    leases: Sequence[LeaseFacts] = (),
    peers: Sequence[Registration] = (),
    retire_permission: bool | None = True,
    admission_unverified: Sequence[str] = (),
) -> Facts:
    """Facts in which the default registration is retirable: live agent, its Node, the grant, the
    admission policies verified."""
    agents = {} if agent is None else {NODE: make_agent() if isinstance(agent, _Default) else agent}
    nodes = {} if node is None else {NODE: make_node() if isinstance(node, _Default) else node}
    return Facts(
        agents=agents,
        nodes=nodes,
        protecting_leases=tuple(leases),
        peers=tuple(peers),
        retire_permission=retire_permission,
        admission_unverified=tuple(admission_unverified),
    )


def make_peer(**overrides: Any) -> Registration:
    """Another registration of the namespace (its own name and uid), parsed."""
    overrides.setdefault("name", "queue-consumer-other")
    return parse_registration(make_registration(**overrides))


def condition(type_: str, status: str, reason: str = "Because") -> dict[str, object]:
    """A stored metav1.Condition."""
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": "",
        "lastTransitionTime": format_time(NOW - datetime.timedelta(minutes=5)),
        "observedGeneration": 1,
    }


def decide_raw(
    obj: object,
    *,
    facts: Facts | None = None,
    policy: Policy | None = None,
    now: datetime.datetime = NOW,
) -> Decision:
    """Parse and decide in one step."""
    return decide(registration=parse_registration(obj), facts=facts or make_facts(), policy=policy or Policy(), now=now)


@functools.cache
def _shipped_admission_policies() -> tuple[dict[str, Any], ...]:
    base = pathlib.Path(__file__).resolve().parents[2] / "manifests" / "base"
    return tuple(
        d
        for file in ("admission-policies.yaml", "crd.yaml")
        for d in yaml.safe_load_all((base / file).read_text())
        if d
    )


def shipped_admission_policies() -> list[dict[str, Any]]:
    """The admission policies and bindings, and the CRD, as manifests/base ships them: what the
    operator lists on a cluster whose policies are intact (a fresh copy each call)."""
    return copy.deepcopy(list(_shipped_admission_policies()))


def make_operator(kube: object, *, settings: Any = None, identity: str = "unknown") -> Any:
    """An `Operator` over the fake `kube`, with an empty World, the default policy and its own
    metrics (`settings`: an `OperatorSettings`, default ones if None)."""
    from coroner.core import api
    from coroner.core.world import World
    from coroner_operator.app import Operator
    from coroner_operator.metrics import Metrics
    from coroner_operator.settings import OperatorSettings

    return Operator(
        world=World(system_namespace=api.SYSTEM_NAMESPACE),
        kube=kube,  # type: ignore[arg-type]
        policy=Policy(),
        metrics=Metrics(),
        settings=settings or OperatorSettings(),
        identity=identity,
    )


def cached(registrations: Sequence[Mapping[str, Any]], *, keep_bodies: bool = True) -> World:
    """Registrations as a plan's reads cache them (`plan.Listing.registrations`; `plan` and `doctor`
    keep no bodies)."""
    world = World(keep_bodies=keep_bodies)
    for body in registrations:
        world.put_registration(dict(body))
    return world


def watched_texts(count: int, **overrides: Any) -> list[str]:
    """`count` registrations as watch events deliver them (JSON texts, each decoded on its own):
    one body (`make_registration(**overrides)`, three conditions, managedFields) under `count` names,
    uids and resourceVersions. What a cache holds per registration is measured on these."""
    conditions = [
        {"type": kind, "status": "True", "reason": "PidAlive", "message": "the agent sees the process alive",
         "lastTransitionTime": "2026-12-01T10:00:00Z", "observedGeneration": 1}
        for kind in ("Attested", "Retirable", "Retired")
    ]  # fmt: skip
    template = make_registration(conditions=conditions, **overrides)
    template["metadata"]["managedFields"] = [{"manager": "agent", "fieldsV1": {"f:status": {}}}] * 3
    texts = []
    for i in range(count):
        body = json.loads(json.dumps(template))
        body["metadata"].update(name=f"w-{i}", uid=f"uid-{i:08d}", resourceVersion=str(1000 + i))
        texts.append(json.dumps(body))
    return texts


def with_junk(body: dict[str, Any], *, annotation_bytes: int = 200 * 1024, labels: int = 2000) -> dict[str, Any]:
    """`body` carrying what its creator may add that Coroner never reads: annotations of
    `annotation_bytes` (the API server allows 256 KiB), `labels` labels, finalizers, owner references
    and managedFields, besides the node label and the registrant annotation."""
    junk = json.loads(json.dumps(body))
    meta = junk["metadata"]
    meta["annotations"] = {**meta.get("annotations", {}), "junk.example/a": "x" * annotation_bytes}
    meta["labels"] = {**meta.get("labels", {}), **{f"junk.example/l{i}": f"v{i}" for i in range(labels)}}
    meta["finalizers"] = [f"junk.example/f{i}" for i in range(100)]
    meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": f"p{i}", "uid": f"u{i}"} for i in range(100)]
    meta["managedFields"] = [{"manager": "junk", "fieldsV1": {"f:metadata": {"f:annotations": {}}}}] * 10
    return junk


def traced_bytes_each(texts: Sequence[str], keep: Callable[[int, dict[str, Any]], None]) -> float:
    """Bytes of memory that `keep` holds on to per text it is given decoded (tracemalloc:
    deterministic for one interpreter): the median over five batches, as a batch that happens to
    grow a structure the whole process shares (the interned strings' table, whose size depends on
    what ran before in the process) is charged that growth once."""
    batches = 5
    size = max(1, len(texts) // batches)
    per_batch = []
    gc.collect()
    tracemalloc.start()
    try:
        for start in range(0, size * batches, size):
            before = tracemalloc.get_traced_memory()[0]
            for i in range(start, min(start + size, len(texts))):
                keep(i, json.loads(texts[i]))
            gc.collect()
            per_batch.append((tracemalloc.get_traced_memory()[0] - before) / size)
    finally:
        tracemalloc.stop()
    return statistics.median(per_batch)
