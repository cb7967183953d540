"""How the operator and the agent log: `--log-format=text|json`, one formatter for both.

text (the default): ``%(asctime)s %(levelname)s %(name)s %(message)s``, one line per record.

json: one JSON object per record, the keys the operator's lines have had since it logged through
kopf's JSON formatter (python-json-logger), in this order:

- ``message``: the formatted message;
- ``exc_info``, ``stack_info``: the formatted traceback and stack, where the record has them;
- every attribute given with ``extra=`` (``datetime`` as ISO 8601, bytes as URL-safe base64,
  anything else JSON cannot hold as its ``str``);
- ``logger``: the logger's name (``coroner.agent``, ``coroner.operator``, ``kopf.objects``...);
- ``timestamp``: when the record was made, ISO 8601 in UTC with microseconds;
- ``object``: the Kubernetes object reference kopf attaches to its per-object records, where there is one;
- ``severity``: ``debug``, ``info``, ``warn``, ``error`` or ``fatal``.

Non-ASCII is escaped, so a line never holds a raw newline or a character a log shipper could split on.
The agent's image has neither kopf nor python-json-logger, so this is plain `logging` and `json`.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import enum
import json
import logging
import sys
import traceback
import types
from typing import Any, Final, cast

import click

#: The values of `--log-format`, and its default (the operator's since it had the flag).
LOG_FORMATS: Final = ("text", "json")
DEFAULT: Final = "text"
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s %(message)s"

#: The `--log-format` option of every Coroner process's command.
option: Final = click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    default=DEFAULT,
    show_default=True,
    help="json: one JSON object per line, with the same keys in every Coroner process (and kopf's lines in the "
    "operator's) (coroner.runtime.logformat).",
)

#: A LogRecord's own attributes (never an `extra=` field), and what kopf attaches for its own use.
_RESERVED: Final = frozenset(
    {
        "args",
        "asctime",
        "created",
        "exc_info",
        "exc_text",
        "filename",
        "funcName",
        "levelname",
        "levelno",
        "lineno",
        "module",
        "msecs",
        "message",
        "msg",
        "name",
        "pathname",
        "process",
        "processName",
        "relativeCreated",
        "stack_info",
        "taskName",
        "thread",
        "threadName",
        "k8s_ref",
        "k8s_skip",
        "settings",
    }
)


def severity(levelno: int) -> str:
    """A level as the JSON lines name it."""
    if levelno <= logging.DEBUG:
        return "debug"
    if levelno <= logging.INFO:
        return "info"
    if levelno <= logging.WARNING:
        return "warn"
    return "error" if levelno <= logging.ERROR else "fatal"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, with the keys of the module docstring."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {}
        if isinstance(record.msg, dict):
            record.message = ""
            given: dict[str, Any] = dict(record.msg)
        else:
            record.message = record.getMessage()
            given = {}
        if record.exc_info and not given.get("exc_info"):
            given["exc_info"] = self.formatException(record.exc_info)
        if not given.get("exc_info") and record.exc_text:
            given["exc_info"] = record.exc_text
        if record.stack_info and not given.get("stack_info"):
            given["stack_info"] = self.formatStack(record.stack_info)
        fields["message"] = record.message
        fields.update(given)
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not (isinstance(key, str) and key.startswith("_")):
                fields[key] = value
        fields["logger"] = record.name
        fields["timestamp"] = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
        if hasattr(record, "k8s_ref"):
            fields["object"] = record.k8s_ref
        fields.setdefault("severity", severity(record.levelno))
        return json.dumps(fields, default=_json_default)


def _json_default(value: object) -> object:
    """What json cannot write, as python-json-logger writes it."""
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, BaseException):
        return f"{value.__class__.__name__}: {value}"
    if isinstance(value, types.TracebackType):
        return "".join(traceback.format_tb(value)).strip()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, enum.EnumMeta):
        return [member.value for member in cast("type[enum.Enum]", value)]
    if isinstance(value, bytes | bytearray):
        return base64.urlsafe_b64encode(value).decode("utf8")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, type):
        return value.__name__
    for text in (str, repr):
        try:
            return text(value)
        except Exception:  # an object that cannot say itself must not lose the line
            continue
    return "__could_not_encode__"


def configure(*, log_format: str, verbose: bool) -> None:
    """Log every record at INFO (DEBUG with `verbose`) and above to stderr, in `log_format`."""
    level = logging.DEBUG if verbose else logging.INFO
    if log_format == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
        logging.basicConfig(level=level, handlers=[handler])
    else:
        logging.basicConfig(level=level, format=TEXT_FORMAT)
