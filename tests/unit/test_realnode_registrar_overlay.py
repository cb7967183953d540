"""The real node's test overlay for injected manifests (`coroner_dev.realnode.registrar_on_the_node`):
the registrar's container gets the API server's loopback address, and nothing else changes."""

from __future__ import annotations

import copy
import types
from typing import Any

import pytest

from coroner.core import inject
from coroner_dev import realnode

pytestmark = pytest.mark.unit

CLUSTER: Any = types.SimpleNamespace(apiserver_port=6443)


def deployment(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "template": {"spec": {"containers": [{"name": "w", "image": "x", "env": [{"name": "A", "value": "1"}]}]}}
        },
    }


def test_only_the_registrar_gets_the_api_servers_address_in_every_template_and_the_input_is_unchanged() -> None:
    injected = inject.inject({"apiVersion": "v1", "kind": "List", "items": [deployment("a"), deployment("b")]})
    before = copy.deepcopy(injected)
    changed = realnode.registrar_on_the_node(CLUSTER, injected)
    assert injected == before
    for original, item in zip(injected["items"], changed["items"], strict=True):
        spec, was = item["spec"]["template"]["spec"], original["spec"]["template"]["spec"]
        (registrar,) = spec["initContainers"]
        assert registrar["env"] == [*was["initContainers"][0]["env"], *realnode.api_env(CLUSTER)]
        assert {**registrar, "env": None} == {**was["initContainers"][0], "env": None}
        assert spec["containers"] == was["containers"]
        assert {k: v for k, v in spec.items() if k != "initContainers"} == {
            k: v for k, v in was.items() if k != "initContainers"
        }
    assert realnode.api_env(CLUSTER) == [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"},
    ]


def test_a_manifest_without_the_registrar_is_unchanged() -> None:
    assert realnode.registrar_on_the_node(CLUSTER, deployment("a")) == deployment("a")
