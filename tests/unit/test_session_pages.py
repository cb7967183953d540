"""`Session.cache_registrations`: a LIST followed page by page, each page into the World as it comes.

The kubernetes package's list call is replaced by a server scripted page by page (the only I/O);
the Session, its paging and its error sentences are the plugin's own.
"""

from __future__ import annotations

import json
import pathlib
import threading
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from coroner.cli import session
from coroner.core.world import World
from unit.builders import make_registration

pytestmark = pytest.mark.unit


class _Response:
    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body).encode()


class Server:
    """Registrations spread over namespaces, answered `limit` at a time with continue tokens;
    `gone_after` pages, the token has expired (410), as a compacted etcd answers."""

    def __init__(self, n: int, *, gone_after: int | None = None) -> None:
        self.items = [make_registration(namespace=f"ns{i % 3}", name=f"r{i}", node_name=f"n{i % 7}") for i in range(n)]
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.gone_after = gone_after

    def list(self, *args: Any, **kwargs: Any) -> _Response:
        self.calls.append((args, kwargs))
        if self.gone_after is not None and len(self.calls) > self.gone_after:
            raise ApiException(status=410, reason="Gone")
        start = int(kwargs.get("_continue") or 0)
        end = start + kwargs["limit"]
        items = [i for i in self.items if args[2] == i["metadata"]["namespace"]] if len(args) == 4 else self.items
        meta = {"resourceVersion": "7", **({"continue": str(end)} if end < len(items) else {})}
        return _Response({"items": items[start:end], "metadata": meta})


class _Custom:
    def __init__(self, server: Server) -> None:
        self.list_cluster_custom_object = server.list
        self.list_namespaced_custom_object = server.list


@pytest.fixture
def plugin(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> session.Session:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    monkeypatch.setattr(session, "_PAGE", 4)
    return session.Session(kubeconfig=str(path))


def _scripted(monkeypatch: pytest.MonkeyPatch, server: Server) -> None:
    monkeypatch.setattr(session.k8s, "CustomObjectsApi", lambda client: _Custom(server))


@pytest.mark.parametrize(("n", "pages"), [(0, 1), (3, 1), (4, 1), (5, 2), (21, 6)])
def test_every_registration_of_every_page_is_cached_once(
    plugin: session.Session, monkeypatch: pytest.MonkeyPatch, n: int, pages: int
) -> None:
    server = Server(n)
    _scripted(monkeypatch, server)
    world = World()
    plugin.cache_registrations(world, namespace=None)
    assert len(server.calls) == pages
    assert sorted(world.parsed) == sorted((i["metadata"]["namespace"], i["metadata"]["name"]) for i in server.items)
    assert world.namespaces() == sorted({i["metadata"]["namespace"] for i in server.items})
    assert all(kwargs["limit"] == 4 for _, kwargs in server.calls)
    assert "_continue" not in server.calls[0][1]
    assert [kwargs.get("_continue") for _, kwargs in server.calls[1:]] == [str(4 * k) for k in range(1, pages)]


def test_one_namespace_is_listed_in_that_namespace_only(
    plugin: session.Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = Server(21)
    _scripted(monkeypatch, server)
    world = World()
    plugin.cache_registrations(world, namespace="ns1")
    assert world.namespaces() == ["ns1"]
    assert len(world.parsed) == 7
    assert {args[2] for args, _ in server.calls} == {"ns1"}


def test_a_continue_token_gone_mid_list_is_an_error_naming_the_list_and_the_fix(
    plugin: session.Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = Server(21, gone_after=2)
    _scripted(monkeypatch, server)
    with pytest.raises(session.PluginError) as caught:
        plugin.cache_registrations(World(), namespace=None)
    assert caught.value.status == 410
    assert "list workerregistrations in every namespace" in caught.value.message
    assert "run the command again" in caught.value.message


def test_the_next_page_is_asked_for_while_the_caller_takes_in_this_one(
    plugin: session.Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API server serves page k+1 while the plugin caches page k; nothing is asked for past the
    last page, and every page arrives once, in order."""
    server = Server(10)
    asked = threading.Event()
    listed = server.list

    def list_(*args: Any, **kwargs: Any) -> _Response:
        answer = listed(*args, **kwargs)
        if len(server.calls) == 2:
            asked.set()
        return answer

    custom = _Custom(server)
    custom.list_cluster_custom_object = list_
    monkeypatch.setattr(session.k8s, "CustomObjectsApi", lambda client: custom)
    pages = plugin.pages(custom.list_cluster_custom_object, "g", "v", "p", what="list")
    first = next(pages)
    assert asked.wait(10), "page 2 was not asked for while page 1 was being taken in"
    rest = list(pages)
    assert [i["metadata"]["name"] for page in [first, *rest] for i in page] == [f"r{i}" for i in range(10)]
    assert len(server.calls) == 3


def test_a_page_that_fails_ahead_raises_in_its_turn_and_a_caller_may_stop_early(
    plugin: session.Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = Server(21, gone_after=2)
    _scripted(monkeypatch, server)
    custom = _Custom(server)
    pages = plugin.pages(custom.list_cluster_custom_object, "g", "v", "p", what="list")
    assert len(next(pages)) == 4 and len(next(pages)) == 4
    with pytest.raises(session.PluginError) as caught:
        next(pages)
    assert caught.value.status == 410
    server = Server(21)
    early = plugin.pages(_Custom(server).list_cluster_custom_object, "g", "v", "p", what="list")
    next(early)
    early.close()  # waits for the page asked for ahead, asks for none after it
    assert len(server.calls) == 2
