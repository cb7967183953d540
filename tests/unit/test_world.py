"""The facts cache keeps its indexes in step with the registrations it holds."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coroner.core import model
from coroner.core.world import World, shared
from unit.builders import NAMESPACE, REGISTRANT, make_registration, traced_bytes_each, watched_texts, with_junk

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


def test_the_cache_keeps_a_registration_compactly() -> None:
    """What the operator keeps per registration at 150,000 of them: its parsed record, and of the
    body only what a write reads back (status, and the object's name and version), its keys and
    short strings shared (interned) across registrations instead of one copy each. Measured with tracemalloc (deterministic for one
    interpreter); the same body decoded per registration, as watch events deliver them."""
    import sys

    from coroner.core import api

    texts = watched_texts(2000)
    world = World(system_namespace=api.SYSTEM_NAMESPACE, intern=sys.intern)  # as the operator's
    per_registration = traced_bytes_each(texts, lambda i, body: world.put_registration(body))
    assert per_registration <= 4500, f"{per_registration:.0f} bytes per registration (7,900 with its own strings)"
    first, second = (
        world.bodies[(NAMESPACE, "w-0")],
        world.bodies[(NAMESPACE, "w-1")],
    )
    assert set(first) == {"metadata", "status"}, "the rest is in the parsed record"
    assert set(first["metadata"]) == {"namespace", "name", "resourceVersion"}
    assert next(iter(first["status"])) is next(iter(second["status"])), "keys are shared"


def test_what_a_registration_carries_beyond_what_is_read_is_not_kept() -> None:
    """Whatever metadata a registration's creator adds (256 KiB of annotations, labels without
    number, finalizers, owner references), the operator keeps it at the size of any other: what is
    read of the metadata is the node label and the registrant annotation."""
    import sys

    from coroner.core import api

    texts = [json.dumps(with_junk(json.loads(text))) for text in watched_texts(100)]
    world = World(system_namespace=api.SYSTEM_NAMESPACE, intern=sys.intern)
    per_registration = traced_bytes_each(texts, lambda i, body: world.put_registration(body))
    assert per_registration <= 4500, f"{per_registration:.0f} bytes per registration of {len(texts[0])} decoded"
    whole = json.loads(texts[0])
    record = world.parsed[(NAMESPACE, "w-0")]
    assert record.labels == {api.NODE_LABEL: whole["spec"]["nodeName"]}
    assert record.registered_by == REGISTRANT
    assert record == dataclasses.replace(model.parse_registration(whole, raw_attestation=False), labels=record.labels)
    reader = World()  # plan's and doctor's: no shared strings, no bodies kept
    reader.put_registration(json.loads(texts[0]))
    assert reader.parsed[(NAMESPACE, "w-0")] == record


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=200),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


@given(_JSON)
def test_shared_values_equal_the_decoded_ones_and_share_their_strings(value: object) -> None:
    """`shared` changes which objects a body holds, never what it says: every key and every
    string of up to 128 characters is the interned one."""
    import sys

    def strings(v: object) -> list[tuple[str, bool]]:  # (string, whether it must be shared)
        if isinstance(v, dict):
            return [(k, True) for k in v] + [s for item in v.values() for s in strings(item)]
        if isinstance(v, list):
            return [s for item in v for s in strings(item)]
        return [(v, len(v) <= 128)] if isinstance(v, str) else []

    out = shared(value, sys.intern)
    assert out == value
    assert all(s is sys.intern(s) for s, must in strings(out) if must)


_OPS = st.lists(
    st.tuples(
        st.booleans(),  # put (True) or forget
        st.sampled_from(["w1", "w2", "w3", "w4"]),
        st.sampled_from(["inst-1", "inst-2"]),
        st.sampled_from([10, 11]),
        st.sampled_from(["node-a", "node-b"]),
        st.sampled_from(["s-1", "s-2"]),
    ),
    max_size=30,
)


@given(_OPS)
def test_the_indexes_agree_with_a_scan_after_any_puts_and_forgets(
    ops: list[tuple[bool, str, str, int, str, str]],
) -> None:
    """Whatever the order of puts and forgets, each registration's peers and each node's keys are
    exactly what a scan of the cached records finds (an index entry holds one Key or a set)."""
    world = World()
    for put, name, instance, pid, node, session in ops:
        if put:
            world.put_registration(
                make_registration(
                    namespace="a", name=name, client_instance_id=instance, pid=pid, node_name=node, session_id=session
                )
            )
        else:
            world.forget_registration(("a", name))
    records = world.parsed
    for key, r in records.items():
        scanned = {
            k
            for k, o in records.items()
            if k != key
            and (
                o.client_instance_id == r.client_instance_id
                or (o.node_name, o.incarnation) == (r.node_name, r.incarnation)
                or (o.session_id, o.generation_id) == (r.session_id, r.generation_id)
            )
        }
        assert {(p.namespace, p.name) for p in world.peers_of(key)} == scanned
    for node in ("node-a", "node-b"):
        assert world.keys_on_node(node) == sorted(k for k, r in records.items() if r.node_name == node)
    for index in (world.by_instance, world.by_incarnation, world.by_session, world.by_node):
        assert all(not isinstance(v, set) or len(v) > 1 for v in index.values()), "a lone member is a Key"
