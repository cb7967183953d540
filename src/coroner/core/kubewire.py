"""The bodies of Kubernetes' own objects Coroner sends, built in one pure module (as
`coroner.core.wire` builds the WorkerRegistration's):

- Events about a registration (`event_body`);
- Leases, the agent's and the operator's (`lease_body`, `lease_renewal`, `agent_lease_annotations`;
  the operator's leader election: `lease_acquisition`, `lease_release`);
- the reads that are requests: who am I (`SELF_SUBJECT_REVIEW`, read back by `reviewed_username`
  and `registrant`), may this identity retire (`self_access_review`, `access_review`), and the
  delete of exactly what was read (`delete_options`).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from typing import Any

from coroner.core import api, model

#: Who am I: a SelfSubjectReview (POST it to this path) answers with the requester's user info.
SELF_SUBJECT_REVIEW_PATH = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
SELF_SUBJECT_REVIEW: Mapping[str, str] = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}

#: The user-info extras of a token bound to a pod (a projected ServiceAccount token).
_POD_NAME = "authentication.kubernetes.io/pod-name"
_POD_UID = "authentication.kubernetes.io/pod-uid"


def reviewed_username(answer: Mapping[str, Any]) -> str | None:
    """The username a SelfSubjectReview answered with; None when it names none."""
    username = ((answer.get("status") or {}).get("userInfo") or {}).get("username")
    return str(username) if username else None


def registrant(answer: Mapping[str, Any]) -> str | None:
    """The requester as the admission policies spell it (variable `requester` of
    coroner-registrant-recorded): the username, plus `` pod/<name>/<uid>`` when the token is bound to
    a pod (pods that share a ServiceAccount are told apart). None when the answer names no user."""
    username = reviewed_username(answer)
    if username is None:
        return None
    extra = ((answer.get("status") or {}).get("userInfo") or {}).get("extra") or {}
    pod_uid = extra.get(_POD_UID) or []
    if not pod_uid:
        return username
    pod_name = extra.get(_POD_NAME) or [""]
    return f"{username} pod/{pod_name[0]}/{pod_uid[0]}"


def event_body(
    *,
    involved: Mapping[str, Any],
    reason: str,
    message: str,
    component: str,
    instance: str,
    now: datetime.datetime,
    suffix: str,
    event_type: str = "Normal",
    count: int = 1,
    first_time: datetime.datetime | None = None,
) -> dict[str, Any]:
    """A core/v1 Event about a WorkerRegistration (the object as written), named `<name>.<suffix>`.

    `count` > 1 (with `first_time`) is an aggregate: that many similar Events combined into one
    (coroner_operator.eventcorrelator), shown by kubectl as "(x<count> over <first..now>)"."""
    meta = involved.get("metadata") or {}
    stamp = model.format_time(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta.get('name')}.{suffix}", "namespace": meta.get("namespace")},
        "involvedObject": {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "reason": reason,
        "message": message[:1024],
        "type": event_type,
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": instance[:128],
        "firstTimestamp": stamp if first_time is None else model.format_time(first_time),
        "lastTimestamp": stamp,
        "count": max(1, count),
    }


# --- Leases ------------------------------------------------------------------------------------------


def agent_lease_annotations(*, boot_id: str | None, host_id: str) -> dict[str, str]:
    """The agent Lease's annotations: the boot and the host its attestations come from (the operator
    reads them back in `coroner.core.world.lease_facts`)."""
    return {api.AGENT_LEASE_BOOT_ID: boot_id or "", api.AGENT_LEASE_HOST_ID: host_id}


def lease_body(
    *,
    namespace: str,
    name: str,
    holder: str,
    duration: int,
    annotations: Mapping[str, str],
    now: datetime.datetime,
    transitions: int | None = None,
) -> dict[str, Any]:
    """A new coordination.k8s.io Lease (the agent's liveness, the operator's heartbeat), acquired now;
    with `transitions` (an elected Lease: the operator's leader) it counts its holders' changes."""
    stamp = model.format_time(now, fraction=True)
    spec: dict[str, Any] = {"holderIdentity": holder, "leaseDurationSeconds": duration}
    spec.update(acquireTime=stamp, renewTime=stamp)
    if transitions is not None:
        spec["leaseTransitions"] = transitions
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations)},
        "spec": spec,
    }


def lease_renewal(
    lease: Mapping[str, Any], *, holder: str, duration: int, annotations: Mapping[str, str], now: datetime.datetime
) -> dict[str, Any]:
    """The Lease as read, renewed now: holder and duration set, annotations merged, and its
    resourceVersion kept, so that the PUT is a compare-and-swap a concurrent writer makes fail."""
    renewed = dict(lease)
    metadata = dict(renewed.get("metadata") or {})
    metadata["annotations"] = {**(metadata.get("annotations") or {}), **annotations}
    spec = dict(renewed.get("spec") or {})
    spec.update(holderIdentity=holder, leaseDurationSeconds=duration, renewTime=model.format_time(now, fraction=True))
    renewed["metadata"], renewed["spec"] = metadata, spec
    return renewed


def lease_acquisition(
    lease: Mapping[str, Any], *, holder: str, duration: int, annotations: Mapping[str, str], now: datetime.datetime
) -> dict[str, Any]:
    """An elected Lease as read, acquired or renewed now by `holder` with client-go's semantics: taken
    from another holder (or from none) it is acquired now and counts one more transition; renewed by
    its holder it keeps both. The resourceVersion read is kept (a compare-and-swap)."""
    spec = lease.get("spec") or {}
    previous, transitions = str(spec.get("holderIdentity") or ""), int(spec.get("leaseTransitions") or 0)
    acquired = lease_renewal(lease, holder=holder, duration=duration, annotations=annotations, now=now)
    if previous != holder:
        acquired["spec"].update(acquireTime=acquired["spec"]["renewTime"], leaseTransitions=transitions + 1)
    elif not spec.get("acquireTime"):
        acquired["spec"]["acquireTime"] = acquired["spec"]["renewTime"]
    return acquired


def lease_release(lease: Mapping[str, Any], *, now: datetime.datetime) -> dict[str, Any]:
    """The Lease as held, released: no holder, a 1 s duration (client-go's ReleaseOnCancel) so a
    standby takes it at its next retry, resourceVersion kept (never releases another's Lease)."""
    spec = dict(lease.get("spec") or {})
    stamp = model.format_time(now, fraction=True)
    spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=stamp, acquireTime=stamp)
    return {**lease, "spec": spec}


# --- access reviews and deletes -----------------------------------------------------------------------

#: Where a SelfSubjectAccessReview is POSTed.
SELF_ACCESS_REVIEW_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


def _retire_attributes(*, namespace: str, name: str | None) -> dict[str, str]:
    attributes = {"group": api.GROUP, "resource": api.PLURAL, "verb": api.RETIRE_VERB, "namespace": namespace}
    if name:
        attributes["name"] = name
    return attributes


def self_access_review(*, namespace: str, name: str | None = None) -> dict[str, Any]:
    """May the requester retire registrations in `namespace` (or the one named): a SelfSubjectAccessReview."""
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": _retire_attributes(namespace=namespace, name=name)},
    }


def access_review(*, user: str, groups: Iterable[str], namespace: str) -> dict[str, Any]:
    """May `user` (in `groups`) retire registrations in `namespace`: a SubjectAccessReview, which
    answers for another identity (doctor reviewing the operator's grant)."""
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": list(groups),
            "resourceAttributes": _retire_attributes(namespace=namespace, name=None),
        },
    }


def delete_options(*, uid: str, resource_version: str) -> dict[str, Any]:
    """A delete that holds only for the object as read: the server refuses it (409) if another object
    now has the name (uid) or this one changed since (resourceVersion)."""
    return {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "preconditions": {"uid": uid, "resourceVersion": resource_version},
    }
