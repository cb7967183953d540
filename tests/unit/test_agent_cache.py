"""The agent keeps each of its node's registrations as the watch last delivered it, with only the
metadata it reads and built from shared strings: a node of 1,000 workers holds 1,000 bodies, each
the size of any other whatever its creator added."""

from __future__ import annotations

import dataclasses
import json

import pytest

from coroner.core import api, model, wire
from coroner_agent.cache import AgentCache
from unit.builders import REGISTRANT, traced_bytes_each, watched_texts, with_junk

pytestmark = pytest.mark.unit


def test_a_cached_body_shares_its_strings_with_the_others() -> None:
    texts = watched_texts(1000, verdict="Alive", evidence="PidfdHeld")
    cache = AgentCache(release=lambda key: None)
    per_body = traced_bytes_each(texts, lambda i, body: cache.observe(("ns", f"w-{i}"), body))
    assert per_body <= 4500, f"{per_body:.0f} bytes per cached body (9,250 with its own strings)"
    first, second = cache.bodies[("ns", "w-0")], cache.bodies[("ns", "w-1")]
    assert "managedFields" not in first["metadata"]
    assert first["spec"]["nodeName"] is second["spec"]["nodeName"]
    assert first == {**json.loads(texts[0]), "metadata": first["metadata"]}, "nothing but metadata dropped"
    assert set(json.loads(texts[0])["metadata"]) - set(first["metadata"]) == {"managedFields"}


def test_what_a_registration_carries_beyond_what_the_agent_reads_is_not_kept() -> None:
    # Any identity that may create registrations may aim them at this node, each with 256 KiB of
    # annotations and labels without number: the cache keeps what the agent reads, at the size of
    # any other registration, and reads from it what it reads from the whole body.
    texts = [json.dumps(with_junk(json.loads(text))) for text in watched_texts(100, verdict="Alive")]
    cache = AgentCache(release=lambda key: None)
    per_body = traced_bytes_each(texts, lambda i, body: cache.observe(("ns", f"w-{i}"), body))
    assert per_body <= 4500, f"{per_body:.0f} bytes per cached body, for {len(texts[0])} bytes decoded"
    whole = json.loads(texts[0])
    kept = cache.bodies[("ns", "w-0")]
    assert kept["metadata"]["labels"] == {api.NODE_LABEL: whole["spec"]["nodeName"]}
    assert kept["metadata"]["annotations"] == {api.REGISTERED_BY_ANNOTATION: REGISTRANT}
    assert model.parse_registration(kept) == dataclasses.replace(
        model.parse_registration(whole), labels=kept["metadata"]["labels"]
    )
    attestation = {"verdict": "Dead", "evidence": "PidfdExited", "heartbeatSeen": whole["status"]["lastHeartbeatTime"]}
    assert wire.attestation_ops(kept, attestation) == wire.attestation_ops(whole, attestation)
