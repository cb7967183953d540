"""The launcher's goodbye is one server-side apply of its own condition and the state it makes, nothing else."""

from __future__ import annotations

import pytest

from coroner.core import api
from coroner.core.wire import release_apply

pytestmark = pytest.mark.unit

RELEASED = {"type": "Released", "status": "True", "reason": "CleanExit", "message": "m", "lastTransitionTime": "t"}


def test_it_applies_exactly_the_released_condition_and_state() -> None:
    body = release_apply(name="w", namespace="jobs", condition=RELEASED)
    assert body == {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": "w", "namespace": "jobs"},
        "status": {"conditions": [RELEASED], "state": "Released"},
    }
    assert "resourceVersion" not in body["metadata"], "no precondition: the API server guards it"
