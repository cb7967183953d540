"""The CRD's bounds have one Python source: the parser's (and `coroner run`'s) are the CRD's."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import Any

import pytest
import yaml

from coroner.core import api, model, wire
from coroner.core.reasons import Statement

pytestmark = pytest.mark.unit

CRD = pathlib.Path(__file__).resolve().parents[2] / "manifests" / "base" / "crd.yaml"


def schema() -> Mapping[str, Any]:
    crd = next(
        doc for doc in yaml.safe_load_all(CRD.read_text()) if doc and doc.get("kind") == "CustomResourceDefinition"
    )
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == api.VERSION]
    root: Mapping[str, Any] = version["schema"]["openAPIV3Schema"]
    return root


def field(path: str) -> Mapping[str, Any]:
    node = schema()
    for part in path.split("."):
        node = node["properties"][part]
    return node


@pytest.mark.parametrize(
    ("path", "minimum", "maximum"),
    [
        pytest.param("spec.heartbeat.intervalSeconds", 1, model.HEARTBEAT_INTERVAL_MAX, id="interval"),
        pytest.param("spec.heartbeat.ttlSeconds", 1, model.HEARTBEAT_TTL_MAX, id="ttl"),
        pytest.param("spec.incarnation.pid", 1, api.PID_MAX_LIMIT, id="pid"),
    ],
)
def test_the_crd_bounds_are_the_parsers(path: str, minimum: int, maximum: int) -> None:
    assert (field(path)["minimum"], field(path)["maximum"]) == (minimum, maximum)


def test_what_the_agent_writes_fits_the_crd() -> None:
    assert field("status.attestation.detail")["maxLength"] >= wire.ATTESTATION_DETAIL_MAX


def test_the_crds_statements_are_the_vocabularys() -> None:
    assert field("status.retirement.statement")["enum"] == [statement.value for statement in Statement]


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        pytest.param(model.HEARTBEAT_INTERVAL_MAX, True, id="at-the-bound"),
        pytest.param(model.HEARTBEAT_INTERVAL_MAX + 1, False, id="past-the-bound"),
        pytest.param(0, False, id="below"),
    ],
)
def test_the_parser_refuses_what_the_crd_refuses(value: int, valid: bool) -> None:
    from unit.builders import make_registration

    body = make_registration(
        paths={"spec.heartbeat": {"intervalSeconds": value, "ttlSeconds": model.HEARTBEAT_TTL_MAX}}
    )
    parsed = model.parse_registration(body)
    assert (parsed.heartbeat.interval_seconds == value) is valid
