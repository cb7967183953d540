"""The launcher's goodbye is guarded by the conditions it replaces, not by the resourceVersion."""

from __future__ import annotations

import pytest

from coroner.retirement import release_ops

pytestmark = pytest.mark.unit

RELEASED = [{"type": "Released", "status": "True", "reason": "WorkerExited"}]
OLD = [{"type": "Retirable", "status": "False", "reason": "PidAlive"}]


def test_with_conditions_it_tests_exactly_those_and_replaces_them() -> None:
    body = {"metadata": {"resourceVersion": "7"}, "status": {"conditions": OLD, "attestation": {"verdict": "Dead"}}}
    assert release_ops(body=body, conditions=OLD + RELEASED) == [
        {"op": "test", "path": "/status/conditions", "value": OLD},
        {"op": "replace", "path": "/status/conditions", "value": OLD + RELEASED},
    ]


@pytest.mark.parametrize("status", [None, {}, {"conditions": []}, {"lastHeartbeatTime": "t"}])
def test_without_conditions_it_falls_back_to_the_resource_version(status: object) -> None:
    body = {"metadata": {"resourceVersion": "7"}, **({} if status is None else {"status": status})}
    ops = release_ops(body=body, conditions=RELEASED)
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    assert ops[-1]["value"] in (RELEASED, {"conditions": RELEASED})
