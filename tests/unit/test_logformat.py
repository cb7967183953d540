"""`--log-format`: the operator and the agent log through one formatter (`coroner.runtime.logformat`),
json with the keys the operator's lines had under kopf's JSON formatter, text as before."""

from __future__ import annotations

import datetime
import io
import json
import logging
import sys
from typing import Any

import pytest
from click.testing import CliRunner
from kopf._core.actions.loggers import ObjectJsonFormatter

from coroner.runtime import logformat
from coroner_agent import main as agent_main
from coroner_operator import main as operator_main

pytestmark = pytest.mark.unit

REF = {"apiVersion": "coroner.dev/v1alpha1", "kind": "WorkerRegistration", "name": "w", "namespace": "jobs"}


def record(
    message: object = "attested %s", *, level: int = logging.INFO, exc_info: Any = None, extra: Any = None
) -> logging.LogRecord:
    args = ("w",) if isinstance(message, str) and "%s" in message else ()
    made = logging.getLogger("coroner.agent").makeRecord(
        "coroner.agent", level, __file__, 1, message, args, exc_info, extra=extra
    )
    made.created = datetime.datetime(2026, 11, 30, 18, 0, 0, 123456, tzinfo=datetime.UTC).timestamp()
    return made


def failing() -> Any:
    try:
        raise ValueError("no pidfd")
    except ValueError:
        return sys.exc_info()


RECORDS = [
    pytest.param(lambda: record(), id="plain"),
    pytest.param(lambda: record(level=logging.DEBUG), id="debug"),
    pytest.param(lambda: record(level=logging.WARNING), id="warn"),
    pytest.param(lambda: record(level=logging.CRITICAL), id="fatal"),
    pytest.param(lambda: record(extra={"node": "node-a", "count": 3}), id="extra"),
    pytest.param(lambda: record(extra={"when": datetime.datetime(2026, 1, 1)}), id="extra-datetime"),
    pytest.param(lambda: record(extra={"k8s_ref": REF, "k8s_skip": False, "settings": object()}), id="kopf-object"),
    pytest.param(lambda: record(exc_info=failing()), id="exception"),
    pytest.param(lambda: record('ünïcode ✓ "quoted"'), id="unicode"),
    pytest.param(lambda: record({"verdict": "Dead"}), id="a-dict-message"),
]


def test_the_json_keys() -> None:
    line = logformat.JsonFormatter().format(record(extra={"k8s_ref": REF, "node": "node-a"}, exc_info=failing()))
    document = json.loads(line)
    assert list(document) == ["message", "exc_info", "node", "logger", "timestamp", "object", "severity"]
    assert document["message"] == "attested w"
    assert document["logger"] == "coroner.agent"
    assert document["timestamp"] == "2026-11-30T18:00:00.123456+00:00"
    assert document["object"] == REF
    assert document["severity"] == "info"
    assert document["exc_info"].startswith("Traceback") and "ValueError: no pidfd" in document["exc_info"]
    assert "\n" not in line


@pytest.mark.parametrize("make", RECORDS)
def test_the_operator_lines_are_what_kopf_wrote(make: Any) -> None:
    """The operator logged through kopf's JSON formatter with the logger's name added: the same text."""
    ours, theirs = make(), make()
    theirs.logger = theirs.name  # what the operator's filter added for kopf's formatter
    assert logformat.JsonFormatter().format(ours) == ObjectJsonFormatter().format(theirs)


@pytest.mark.parametrize("command", [agent_main.main, operator_main.main], ids=["agent", "operator"])
def test_both_take_the_flag_with_the_same_default(command: Any) -> None:
    option = next(p for p in command.params if p.name == "log_format")
    assert list(option.type.choices) == list(logformat.LOG_FORMATS) == ["text", "json"]
    assert option.default == logformat.DEFAULT == "text"
    refused = CliRunner().invoke(command, ["--log-format", "yaml"])
    assert refused.exit_code == 2 and "--log-format" in refused.output


@pytest.mark.parametrize(
    "configure", [agent_main.configure_logging, operator_main.configure_logging], ids=["agent", "operator"]
)
def test_json_makes_every_root_handler_use_the_one_formatter(configure: Any) -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        root.handlers[:] = []
        configure(log_format="json", verbose=False)
        assert root.handlers and all(type(h.formatter) is logformat.JsonFormatter for h in root.handlers)
        stream = io.StringIO()
        root.handlers[0].setStream(stream)  # type: ignore[attr-defined]
        logging.getLogger("coroner.test").info("one line")
        assert json.loads(stream.getvalue())["message"] == "one line"
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
