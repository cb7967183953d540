"""The status writes of the operator, `kubectl coroner apply` and the launcher.

Every status write the operator and `apply` make is a JSON patch that first `test`s the
resourceVersion it decided from (and, for a retirement, the attestation it relied on, verbatim):
if anything moved, the server answers 422 and the writer re-reads and decides again. Never a blind
write, never a merge patch (which would replace the whole conditions list and could erase what
another writer added). The one exception is the launcher's goodbye (`release_apply`), a
server-side apply of its own condition that the API server keeps off retired registrations.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from coroner.core import api, model
from coroner.core.decision import Decision


def retirement_record(
    *, decision: Decision, retired_by: str, now: datetime.datetime, attestation: object | None
) -> dict[str, Any]:
    """`status.retirement`: when, by whom, on which evidence path, and the attestation relied on."""
    record: dict[str, Any] = {
        "retiredTime": model.format_time(now, fraction=True),
        "retiredBy": retired_by,
        "reason": decision.death_evidence.value if decision.death_evidence else "Unknown",
        "decision": decision.reason.value,
    }
    if attestation is not None:
        record["attestation"] = attestation
    return record


def status_ops(
    *,
    body: Mapping[str, Any],
    resource_version: str,
    conditions: list[dict[str, Any]],
    retirement: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Sets status.conditions (and status.retirement) only if the object is still as it was read."""
    status = body.get("status")
    ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion", "value": resource_version}]
    if retirement is not None and isinstance(status, Mapping) and status.get("attestation") is not None:
        # The attestation relied on must be exactly the one read; with node-level evidence there is
        # none, and the resourceVersion test alone guards that none appeared.
        ops.append({"op": "test", "path": "/status/attestation", "value": status["attestation"]})
    if not isinstance(status, Mapping):
        value: dict[str, Any] = {"conditions": conditions}
        if retirement is not None:
            value["retirement"] = retirement
        ops.append({"op": "add", "path": "/status", "value": value})
        return ops
    ops.append({"op": "add", "path": "/status/conditions", "value": conditions})
    if retirement is not None:
        ops.append({"op": "add", "path": "/status/retirement", "value": retirement})
    return ops


#: The field manager of the launcher's goodbye; it owns exactly the Released condition.
RELEASE_FIELD_MANAGER = "coroner-launcher"


def release_apply(*, name: str, namespace: str, condition: Mapping[str, object]) -> dict[str, Any]:
    """The worker's goodbye: a server-side apply of the Released condition alone, one request.

    ``status.conditions`` is a list-map keyed by ``type``, so the apply merges this one entry and
    leaves every other condition as it is: no read first, no precondition, and so no race with the
    agent's Dead attestation of the very exit being reported (a compare-and-swap goodbye had to
    read first and then lost to the attestation and the retirement it allows). What keeps it off a
    retired registration is the API server itself: the CRD refuses Released on a registration
    whose status.retirement is set (a transition rule), and a retirement's compare-and-swap fails
    on a registration whose goodbye landed first.
    """
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "status": {"conditions": [dict(condition)]},
    }


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
