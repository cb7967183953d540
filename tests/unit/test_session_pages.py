"""`Session.cache_registrations`: a streaming list, else a LIST followed page by page, each page
into the World as it comes.

The kubernetes package's calls are replaced by a server scripted event by event or page by page
(the only I/O); the Session, its paging, its fallback and its error sentences are the plugin's own.
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
from coroner.runtime.watch import INITIAL_EVENTS_END
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


class _Stream:
    """A streaming list's answer (urllib3's response): `events` as JSON lines in odd-sized chunks."""

    def __init__(self, status: int, events: list[dict[str, Any]]) -> None:
        self.status, self.reason, self.data = status, "Refused" if status >= 400 else "OK", b"{}"
        self.text = b"".join(json.dumps(e).encode() + b"\n" for e in events)
        self.closed = self.released = False

    def stream(self, amount: int) -> Any:
        return (self.text[i : i + 1000] for i in range(0, len(self.text), 1000))

    def close(self) -> None:
        self.closed = True

    def release_conn(self) -> None:
        self.released = True


def _streaming(plugin: session.Session, monkeypatch: pytest.MonkeyPatch, answer: _Stream) -> list[str]:
    """Streaming lists answered with `answer`; returns the URLs asked for."""
    urls: list[str] = []

    def call_api(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        urls.append(url)
        return type("RESTResponse", (), {"response": answer})()

    monkeypatch.setattr(plugin.client, "call_api", call_api)
    return urls


def _added(items: list[dict[str, Any]], *, end: bool = True) -> list[dict[str, Any]]:
    events = [{"type": "ADDED", "object": item} for item in items]
    mark = {"metadata": {"resourceVersion": "9", "annotations": {INITIAL_EVENTS_END: "true"}}}
    return events + ([{"type": "BOOKMARK", "object": mark}] if end else [])


def _scripted(monkeypatch: pytest.MonkeyPatch, server: Server, plugin: session.Session | None = None) -> None:
    """LISTs answered page by page by `server`; streaming lists refused, as a server without them does."""
    monkeypatch.setattr(session.k8s, "CustomObjectsApi", lambda client: _Custom(server))
    if plugin is not None:
        _streaming(plugin, monkeypatch, _Stream(400, []))


@pytest.mark.parametrize(("n", "pages"), [(0, 1), (3, 1), (4, 1), (5, 2), (21, 6)])
def test_every_registration_of_every_page_is_cached_once(
    plugin: session.Session, monkeypatch: pytest.MonkeyPatch, n: int, pages: int
) -> None:
    server = Server(n)
    _scripted(monkeypatch, server, plugin)
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
    _scripted(monkeypatch, server, plugin)
    world = World()
    plugin.cache_registrations(world, namespace="ns1")
    assert world.namespaces() == ["ns1"]
    assert len(world.parsed) == 7
    assert {args[2] for args, _ in server.calls} == {"ns1"}


def test_a_continue_token_gone_mid_list_is_an_error_naming_the_list_and_the_fix(
    plugin: session.Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = Server(21, gone_after=2)
    _scripted(monkeypatch, server, plugin)
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


@pytest.mark.parametrize("n", [0, 3, 4, 9])
def test_a_streaming_list_is_cached_without_a_list_and_its_connection_is_not_reused(
    plugin: session.Session, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    server = Server(n)
    _scripted(monkeypatch, server)
    answer = _Stream(200, _added(server.items))
    urls = _streaming(plugin, monkeypatch, answer)
    world = World()
    plugin.cache_registrations(world, namespace="ns1")
    assert sorted(world.parsed) == sorted(
        (i["metadata"]["namespace"], i["metadata"]["name"]) for i in server.items
    )  # what the server streamed: it chose the namespace
    assert server.calls == []
    assert len(urls) == 1 and "/namespaces/ns1/workerregistrations?" in urls[0]
    assert "sendInitialEvents=true" in urls[0] and "watch=true" in urls[0]
    assert answer.closed and answer.released


@pytest.mark.parametrize("status", [400, 403, 422])
def test_a_server_without_streaming_lists_or_an_identity_without_watch_is_listed_page_by_page(
    plugin: session.Session, monkeypatch: pytest.MonkeyPatch, status: int
) -> None:
    server = Server(5)
    _scripted(monkeypatch, server)
    answer = _Stream(status, [])
    _streaming(plugin, monkeypatch, answer)
    world = World()
    plugin.cache_registrations(world, namespace=None)
    assert len(world.parsed) == 5 and len(server.calls) == 2
    assert answer.closed and answer.released


def test_a_stream_ended_before_its_end_is_listed_page_by_page_and_keeps_nothing_of_the_stream(
    plugin: session.Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = Server(5)
    _scripted(monkeypatch, server)
    gone = make_registration(namespace="ns9", name="deleted-since", node_name="n1")
    _streaming(plugin, monkeypatch, _Stream(200, _added([gone, *server.items[:2]], end=False)))
    world = World()
    plugin.cache_registrations(world, namespace=None)
    assert sorted(world.parsed) == sorted((i["metadata"]["namespace"], i["metadata"]["name"]) for i in server.items)
    assert len(server.calls) == 2


def test_an_error_event_in_the_stream_is_an_error_naming_the_list_and_the_fix(
    plugin: session.Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    _scripted(monkeypatch, Server(0))
    error = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}}
    _streaming(plugin, monkeypatch, _Stream(200, [error]))
    with pytest.raises(session.PluginError) as caught:
        plugin.cache_registrations(World(), namespace=None)
    assert caught.value.status == 410
    assert "list workerregistrations in every namespace" in caught.value.message
    assert "run the command again" in caught.value.message
