"""Doctor's operator checks, both read off the operator's Lease: is it alive, and how did its last sweep go."""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from coroner.cli.doctor.grant import operator_identity
from coroner.cli.doctor.outcome import Check, failed, kubectl_name, passed, stamp, unknown
from coroner.cli.plan import OPERATOR_LEASE, Unreadable
from coroner.core import api, model
from coroner.core.decision import lease_expiry
from coroner.core.world import lease_facts

#: Annotation on the operator's Lease holding the last sweep's outcome as JSON.
LAST_SWEEP_ANNOTATION: Final = api.LAST_SWEEP_ANNOTATION


def check_operator_alive(
    *,
    lease: Mapping[str, Any] | Unreadable | None,
    system_namespace: str,
    now: datetime.datetime,
    operator_deployments: Sequence[Mapping[str, Any]] | Unreadable = (),
) -> Check:
    """The operator's Lease was renewed within its own duration. The Deployment the fix names is the
    release's, `<namePrefix>coroner-operator` (`operator_identity` of `operator_deployments`: with no
    Lease, no user stated on it)."""
    name = "operator-alive"
    subject = f"Lease {system_namespace}/{OPERATOR_LEASE}"
    if isinstance(lease, Unreadable):
        return unknown(name, f"{subject} could not be read: {lease.reason}")
    if lease is None:
        prefix = operator_identity(operator_deployments, system_namespace=system_namespace).name_prefix
        return failed(
            name,
            f"{subject} does not exist: the operator has never completed a sweep here; check "
            f"`kubectl -n {system_namespace} get deploy {prefix}coroner-operator` and its logs.",
            objects=(subject,),
            names=(kubectl_name("Lease", OPERATOR_LEASE),),
        )
    facts = lease_facts(lease)
    until = lease_expiry(facts.renew_time, facts.lease_duration_seconds)
    renewed = "never" if facts.renew_time is None else model.format_time(facts.renew_time)
    recorded = {"holderIdentity": facts.holder_identity, "renewTime": renewed, "expires": stamp(until)}
    if until is None or now >= until:
        return failed(
            name,
            f"{subject} (holder {facts.holder_identity or '?'}) was last renewed {renewed} and has "
            f"{'no computable expiry' if until is None else 'expired at ' + model.format_time(until)}: the "
            f"operator is not running or not completing sweeps; check its pod and logs.",
            objects=(subject,),
            names=(kubectl_name("Lease", OPERATOR_LEASE),),
            facts=recorded,
        )
    return passed(
        name,
        f"{subject} held by {facts.holder_identity or '?'}, renewed {renewed}, valid until {model.format_time(until)}.",
        facts=recorded,
    )


def check_last_sweep(*, lease: Mapping[str, Any] | Unreadable | None, system_namespace: str) -> Check:
    """The outcome of the operator's last sweep, per namespace, as it recorded it."""
    name = "last-sweep"
    subject = f"Lease {system_namespace}/{OPERATOR_LEASE}"
    if isinstance(lease, Unreadable):
        return unknown(name, f"{subject} could not be read: {lease.reason}")
    annotations = ((lease or {}).get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(LAST_SWEEP_ANNOTATION)
    if raw is None:
        return unknown(
            name,
            f"the last sweep's outcome was never recorded ({subject} has no {LAST_SWEEP_ANNOTATION} "
            f"annotation): unknown, not zero.",
        )
    try:
        sweep = json.loads(raw)
    except ValueError:
        sweep = None
    if not isinstance(sweep, Mapping) or not isinstance(sweep.get("failures"), Mapping):
        return unknown(name, f"the {LAST_SWEEP_ANNOTATION} annotation on {subject} is not a sweep record.")
    failures = {str(ns): count for ns, count in sweep["failures"].items() if _positive(count)}
    recorded_errors = sweep.get("errors")
    errors: Mapping[str, Any] = recorded_errors if isinstance(recorded_errors, Mapping) else {}
    facts = {
        "time": sweep.get("time"),
        "registrations": sweep.get("registrations"),
        "namespaces": sweep.get("namespaces"),
        "failures": failures,
        "errors": dict(errors),
        "byReason": sweep.get("byReason"),
    }
    at = sweep.get("time") or "an unrecorded time"
    if failures:
        named = [
            f"{namespace}: {failures[namespace]} failed ({errors.get(namespace, 'no error recorded')})"
            for namespace in sorted(failures)
        ]
        return failed(
            name,
            f"the last sweep at {at} failed in namespace(s) {'; '.join(named)}.",
            objects=tuple(f"namespace/{namespace}" for namespace in sorted(failures)),
            facts=facts,
        )
    counted = sweep.get("registrations")
    of = f"{counted} registrations" if isinstance(counted, int) else "an unrecorded number of registrations"
    return passed(name, f"the last sweep at {at} decided {of} with no failures.", facts=facts)


def _positive(count: object) -> bool:
    return isinstance(count, int | float) and not isinstance(count, bool) and count > 0
