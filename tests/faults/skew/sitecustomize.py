"""Clock skew for one process, for the fault harness only (never imported by Coroner itself).

A component started with PYTHONPATH=tests/faults/skew and CORONER_FAULTS_CLOCK_SKEW_SECONDS=S sees
`datetime.datetime.now()` / `utcnow()` shifted by S seconds, as on a node whose clock is S seconds
off: everything it timestamps (an agent's attestation observedTime, its Lease renewTime) carries the
skew. Monotonic clocks, TLS certificate checks and the kernel are untouched, as they would be by a
wall-clock error alone.
"""

from __future__ import annotations

import datetime as _datetime
import os as _os

_SKEW = _os.environ.get("CORONER_FAULTS_CLOCK_SKEW_SECONDS")

if _SKEW:
    _REAL = _datetime.datetime
    _DELTA = _datetime.timedelta(seconds=float(_SKEW))

    class _SkewedDatetime(_REAL):
        @classmethod
        def _shifted(cls, moment: _datetime.datetime) -> _SkewedDatetime:
            t = moment + _DELTA
            return cls(t.year, t.month, t.day, t.hour, t.minute, t.second, t.microsecond, t.tzinfo, fold=t.fold)

        @classmethod
        def now(cls, tz: _datetime.tzinfo | None = None) -> _SkewedDatetime:  # type: ignore[override]
            return cls._shifted(_REAL.now(tz))

        @classmethod
        def utcnow(cls) -> _SkewedDatetime:  # type: ignore[override]
            return cls._shifted(_REAL.now(_datetime.UTC).replace(tzinfo=None))

    _datetime.datetime = _SkewedDatetime  # type: ignore[misc]
