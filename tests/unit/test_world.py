"""The facts cache keeps its indexes in step with the registrations it holds."""

from __future__ import annotations

import pytest

from coroner.core.world import World
from unit.builders import make_registration

pytestmark = pytest.mark.unit


def test_namespace_index_follows_puts_and_forgets() -> None:
    world = World()
    for namespace, name in (("a", "w1"), ("a", "w2"), ("b", "w1")):
        world.put_registration(make_registration(namespace=namespace, name=name))
    world.put_registration(make_registration(namespace="a", name="w1"))  # an update, not a new key
    assert world.namespaces() == ["a", "b"]
    assert world.keys_in_namespace("a") == [("a", "w1"), ("a", "w2")]
    world.forget_registration(("b", "w1"))
    assert world.namespaces() == ["a"] and world.keys_in_namespace("b") == []


def test_peers_are_found_by_shared_identity_only() -> None:
    world = World()
    world.put_registration(make_registration(namespace="a", name="w1", client_instance_id="inst-1", pid=10))
    world.put_registration(make_registration(namespace="a", name="w2", client_instance_id="inst-1", pid=11))
    world.put_registration(
        make_registration(namespace="a", name="w3", client_instance_id="inst-3", pid=12, session_id="s-3")
    )
    assert [p.name for p in world.peers_of(("a", "w1"))] == ["w2"]
    assert world.peers_of(("a", "w3")) == []
