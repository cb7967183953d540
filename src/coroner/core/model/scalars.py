"""The scalars of the wire: RFC 3339 times (parsed strictly, written in UTC) and pids."""

from __future__ import annotations

import datetime
import functools
import math
import re
from typing import Final

from coroner.core import api, memo

UTC: Final = datetime.UTC


# RFC 3339 (section 5.6): full-date "T" full-time, fraction optional, "Z" or a numeric offset.
# re.ASCII so that \d never accepts non-ASCII digits such as "٣".
_RFC3339: Final = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,32}))?(?:([Zz])|([+-])(\d{2}):(\d{2}))",
    re.ASCII,
)


# Bounded so that int() never meets a string long enough to raise (Python limits int digits).
DIGITS: Final = re.compile(r"[0-9]{1,20}", re.ASCII)


@memo.by_text
def parse_time(value: object) -> datetime.datetime | None:
    """An RFC 3339 timestamp (``Z`` or a numeric offset, optional fraction) as an aware UTC datetime.

    Fractions beyond microseconds are truncated. Anything else — including leap seconds, which
    `datetime` cannot represent, and instants that leave its range once moved to UTC — is None.
    """
    if type(value) is str:
        return _parse_text(value)
    if not isinstance(value, str):
        return None
    return _parse_text.__wrapped__(value)  # a str subclass hashes and compares its own way: not remembered


# A cache of 150,000 registrations holds about seven timestamps each, most of them shared (the
# second a batch was created or decided, a transition time on every condition of one write):
# remembered, they are parsed once and their datetimes shared across the cache's records.
@functools.lru_cache(maxsize=4096)
def _parse_text(value: str) -> datetime.datetime | None:
    match = _RFC3339.fullmatch(value)
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, zulu, sign, off_h, off_m = match.groups()
    try:
        if zulu:
            tz: datetime.tzinfo = UTC
        else:
            if int(off_h) > 23 or int(off_m) > 59:
                return None
            offset = datetime.timedelta(hours=int(off_h), minutes=int(off_m))
            tz = datetime.timezone(-offset if sign == "-" else offset)
        micros = int((fraction or "0")[:6].ljust(6, "0"))
        parsed = datetime.datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second), micros, tzinfo=tz
        )
        return parsed.astimezone(UTC)
    except (ValueError, OverflowError):
        return None


def _format_time_key(value: object, *, fraction: object = False) -> object:
    return (value, fraction) if type(value) is datetime.datetime and type(fraction) is bool else None


@memo.by_key(_format_time_key)
def format_time(value: datetime.datetime, *, fraction: bool = False) -> str:
    """RFC 3339 in UTC ending in ``Z``; seconds precision unless `fraction` (then microseconds).

    A naive datetime is taken to be UTC already.
    """
    moment = value.astimezone(UTC) if value.tzinfo is not None else value
    if type(moment) is datetime.datetime:
        # The C formatter prints the same fields at the same widths (the year to 4 digits); an
        # aware moment is in UTC here, so its offset is "+00:00", replaced by the "Z".
        text = moment.isoformat("T", "microseconds" if fraction else "seconds")
        return (text if moment.tzinfo is None else text[:-6]) + "Z"
    text = (
        f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}"
        f"T{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}"
    )
    if fraction:
        text += f".{moment.microsecond:06d}"
    return text + "Z"


def parse_pid(value: object) -> int | None:
    """A pid as the API may carry it: an int, an integral float (``900.0``) or digits (``"900"``).

    Booleans, fractions, signs, whitespace and values outside 1..PID_MAX_LIMIT are None: a pid the
    kernel could not have issued names no process.
    """
    number = integer(value)
    if number is None or not 1 <= number <= api.PID_MAX_LIMIT:
        return None
    return number


def integer(value: object) -> int | None:
    # bool is an int subclass; True is not the pid 1.
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else None
    if isinstance(value, str) and DIGITS.fullmatch(value):
        return int(value)
    return None
