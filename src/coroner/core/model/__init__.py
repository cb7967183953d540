"""Typed, immutable records of a `WorkerRegistration`, parsed from what the API server returns.

The decision must be able to read any object the API server can hold — including ones a buggy
launcher, a hostile worker or a hand edit produced — without ever raising: an exception in the
reconcile loop is a hot loop, not a decision. So parsing here is total: a missing or invalid field
becomes ``None`` and is listed in ``Registration.problems`` as ``(field_path, message)``, and the
decision turns those into preserve reasons (unknown is never dead).

Sub-records whose absence is not itself a fact (the incarnation, the heartbeat settings) are always
present, with ``None`` fields when absent; records whose absence *is* a fact (the attestation, the
retirement) are ``None`` when absent.

Modules: `records` (the records and their renderings), `scalars` (times and pids), `parse`
(`parse_registration`, the total reader).
"""

from coroner.core.model.parse import parse_registration
from coroner.core.model.records import (
    HEARTBEAT_INTERVAL_MAX,
    HEARTBEAT_TTL_MAX,
    Attestation,
    Condition,
    Heartbeat,
    Incarnation,
    Key,
    Problem,
    Registration,
    Retirement,
    key_of,
    render_attestation,
    render_incarnation,
)
from coroner.core.model.scalars import UTC, format_time, parse_pid, parse_time

__all__ = [
    "HEARTBEAT_INTERVAL_MAX",
    "HEARTBEAT_TTL_MAX",
    "UTC",
    "Attestation",
    "Condition",
    "Heartbeat",
    "Incarnation",
    "Key",
    "Problem",
    "Registration",
    "Retirement",
    "format_time",
    "key_of",
    "parse_pid",
    "parse_registration",
    "parse_time",
    "render_attestation",
    "render_incarnation",
]
