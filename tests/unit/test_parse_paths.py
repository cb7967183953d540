"""The parser's precomputed problem paths are the paths it would spell out (coroner.core.model.parse)."""

from __future__ import annotations

import pytest

from coroner.core.model import parse

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("index", range(20))
def test_condition_paths(index: int) -> None:
    path = f"status.conditions[{index}]"
    fields = ("type", "status", "reason", "message", "lastTransitionTime", "observedGeneration")
    assert parse._condition_paths(index) == (path, *(f"{path}.{field}" for field in fields))


@pytest.mark.parametrize("prefix", ["spec.incarnation", "status.attestation.incarnation", "x.incarnation"])
def test_incarnation_paths(prefix: str) -> None:
    fields = ("pid", "bootId", "pidNamespace", "startTime", "hostId", "pidfdInode")
    assert parse._incarnation_paths(prefix) == tuple(f"{prefix}.{field}" for field in fields)
