"""The agent keeps each of its node's registrations as the watch last delivered it, without its
managedFields and built from shared strings: a node of 1,000 workers holds 1,000 bodies."""

from __future__ import annotations

import gc
import json
import tracemalloc

import pytest

from coroner_agent.cache import AgentCache
from unit.builders import make_registration

pytestmark = pytest.mark.unit


def test_a_cached_body_shares_its_strings_with_the_others() -> None:
    conditions = [
        {"type": kind, "status": "True", "reason": "PidAlive", "message": "the agent sees the process alive",
         "lastTransitionTime": "2026-12-01T10:00:00Z", "observedGeneration": 1}
        for kind in ("Attested", "Retirable", "Retired")
    ]  # fmt: skip
    template = make_registration(conditions=conditions, verdict="Alive", evidence="PidfdHeld")
    template["metadata"]["managedFields"] = [{"manager": "agent", "fieldsV1": {"f:status": {}}}] * 3
    texts = []
    for i in range(1000):
        body = json.loads(json.dumps(template))
        body["metadata"].update(name=f"w-{i}", uid=f"uid-{i:08d}", resourceVersion=str(1000 + i))
        texts.append(json.dumps(body))
    cache = AgentCache(release=lambda key: None)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i, text in enumerate(texts):
            cache.observe(("ns", f"w-{i}"), json.loads(text))
        gc.collect()
        per_body = (tracemalloc.get_traced_memory()[0] - before) / len(texts)
    finally:
        tracemalloc.stop()
    assert per_body <= 6500, f"{per_body:.0f} bytes per cached body (9,350 with its own strings)"
    first, second = cache.bodies[("ns", "w-0")], cache.bodies[("ns", "w-1")]
    assert "managedFields" not in first["metadata"]
    assert first["spec"]["nodeName"] is second["spec"]["nodeName"]
    assert first == {**json.loads(texts[0]), "metadata": first["metadata"]}, "nothing but managedFields dropped"
