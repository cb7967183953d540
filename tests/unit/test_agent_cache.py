"""The agent keeps each of its node's registrations as the watch last delivered it, without its
managedFields and built from shared strings: a node of 1,000 workers holds 1,000 bodies."""

from __future__ import annotations

import json

import pytest

from coroner_agent.cache import AgentCache
from unit.builders import traced_bytes_each, watched_texts

pytestmark = pytest.mark.unit


def test_a_cached_body_shares_its_strings_with_the_others() -> None:
    texts = watched_texts(1000, verdict="Alive", evidence="PidfdHeld")
    cache = AgentCache(release=lambda key: None)
    per_body = traced_bytes_each(texts, lambda i, body: cache.observe(("ns", f"w-{i}"), body))
    assert per_body <= 4500, f"{per_body:.0f} bytes per cached body (9,250 with its own strings)"
    first, second = cache.bodies[("ns", "w-0")], cache.bodies[("ns", "w-1")]
    assert "managedFields" not in first["metadata"]
    assert first["spec"]["nodeName"] is second["spec"]["nodeName"]
    assert first == {**json.loads(texts[0]), "metadata": first["metadata"]}, "nothing but managedFields dropped"
