"""List-then-watch (`coroner.runtime.watch.reflect`) against a scripted server, and what the
operator makes of a relist (`WatchInputs.on_list_page`): a registration the list no longer holds
was deleted while no watch ran, unless the operator's cached body is newer than the list."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from coroner.client.rest import ApiError
from coroner.runtime.watch import INITIAL_EVENTS_END, Handoff, IncompleteList, initial_events, reflect
from coroner_operator.app import Operator
from coroner_operator.watches import serves, watch_scopes
from unit.builders import make_operator, make_registration

pytestmark = pytest.mark.unit


def obj(name: str, rv: int) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": str(rv)}}


class Server:
    """Lists `objects` two a page at resourceVersion `rv`; each watch plays the next script (a list
    of events, or an exception raised when the watch is opened); the last one stops the reflector.
    With `streaming`, a watch with sendInitialEvents first sends `objects` and the end bookmark
    (without, it is refused as a server without streaming lists refuses it)."""

    def __init__(self, objects: list[dict[str, Any]], rv: int, scripts: list[Any], stop: threading.Event) -> None:
        self.objects, self.rv, self.scripts, self.stop = objects, rv, list(scripts), stop
        self.lists: list[dict[str, Any]] = []
        self.watches: list[dict[str, Any]] = []
        self.fail_list_page: int | None = None
        self.streaming = False
        self.cut_stream = False
        self.streams: list[dict[str, Any]] = []

    def request(self, method: str, path: str, *, query: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.lists.append(dict(query))
        start = int(query.get("continue", 0))
        if self.fail_list_page == start:
            self.fail_list_page = None
            raise ConnectionResetError("list cut")
        end = start + query["limit"]
        meta: dict[str, Any] = {"resourceVersion": str(self.rv)}
        if end < len(self.objects):
            meta["continue"] = str(end)
        return {"items": self.objects[start:end], "metadata": meta}

    def watch(self, path: str, *, query: dict[str, Any], timeout_seconds: int) -> Iterator[dict[str, Any]]:
        if query.get("sendInitialEvents"):
            self.streams.append(dict(query))
            if not self.streaming:  # what a server without streaming lists answers
                raise ApiError(422, "Invalid", "sendInitialEvents is forbidden for watch")
            for o in self.objects:
                yield {"type": "ADDED", "object": o}
            if self.cut_stream:
                self.cut_stream = False
                return
            end = {"metadata": {"resourceVersion": str(self.rv), "annotations": {INITIAL_EVENTS_END: "true"}}}
            yield {"type": "BOOKMARK", "object": end}
        else:
            self.watches.append(dict(query))
        script = self.scripts.pop(0)
        if isinstance(script, BaseException):
            self.stop.set() if not self.scripts else None
            raise script
        yield from script
        if not self.scripts:
            self.stop.set()


class Record:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.waits: list[float] = []

    def page(self, items: list[dict[str, Any]], first: bool, last: bool, rv: str) -> None:
        self.calls.append(("page", [i["metadata"]["name"] for i in items], first, last, rv))

    def event(self, event_type: str, body: dict[str, Any]) -> None:
        self.calls.append((event_type, body["metadata"]["name"]))


class RecordingStop(threading.Event):
    def __init__(self, record: Record) -> None:
        super().__init__()
        self.record = record

    def wait(self, timeout: float | None = None) -> bool:
        self.record.waits.append(timeout or 0.0)
        return self.is_set()


def run(server: Server, record: Record, errors: list[tuple[str, str]] | None = None) -> None:
    reflect(
        server,  # type: ignore[arg-type]
        "/x", query={"labelSelector": "a=b"}, stop=server.stop, on_page=record.page, on_event=record.event,
        on_error=None if errors is None else lambda call, exc: errors.append((call, type(exc).__name__)),
        rng=random.Random(1), page_limit=2,
    )  # fmt: skip


def test_pages_then_events_then_a_watch_from_the_last_resource_version_seen() -> None:
    record = Record()
    stop = RecordingStop(record)
    scripts = [
        [{"type": "MODIFIED", "object": obj("a", 11)}, {"type": "BOOKMARK", "object": obj("", 12)}],
        [{"type": "DELETED", "object": obj("b", 13)}],
    ]
    server = Server([obj("a", 1), obj("b", 2), obj("c", 3)], 10, scripts, stop)
    run(server, record)
    assert record.calls == [
        ("page", ["a", "b"], True, False, "10"),
        ("page", ["c"], False, True, "10"),
        ("MODIFIED", "a"),
        ("DELETED", "b"),
    ]
    # The bookmark moved the position without being delivered; the selector rides every call.
    assert [w["resourceVersion"] for w in server.watches] == ["10", "12"]
    assert all(q["labelSelector"] == "a=b" for q in server.lists + server.watches)
    assert all(w["allowWatchBookmarks"] for w in server.watches)
    assert record.waits == []


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming-list", "paged-list"])
def test_each_object_is_kept_as_keep_makes_it_before_any_page_or_event_holds_it(streaming: bool) -> None:
    # What a creator adds to an object (annotations, here) is dropped as each is decoded, so that a
    # page of them is never held whole.
    kept: list[str] = []

    def keep(body: dict[str, Any]) -> dict[str, Any]:
        kept.append(body["metadata"]["name"])
        return {"metadata": {k: v for k, v in body["metadata"].items() if k != "annotations"}}

    stop = threading.Event()
    junk = [{**o, "metadata": {**o["metadata"], "annotations": {"x": "y" * 1000}}} for o in (obj("a", 1), obj("b", 2))]
    server = Server(junk, 10, [[{"type": "MODIFIED", "object": junk[0]}]], stop)
    server.streaming = streaming
    seen: list[dict[str, Any]] = []
    reflect(
        server,  # type: ignore[arg-type]
        "/x", stop=stop, on_page=lambda items, *_: seen.extend(items), on_event=lambda _, body: seen.append(body),
        page_limit=2, keep=keep,
    )  # fmt: skip
    assert kept == ["a", "b", "a"]
    assert [body["metadata"] for body in seen] == [
        obj("a", 1)["metadata"],
        obj("b", 2)["metadata"],
        obj("a", 1)["metadata"],
    ]


def test_a_410_relists_at_once_and_any_other_failure_after_a_backoff_reported_as_what_failed() -> None:
    record = Record()
    stop = RecordingStop(record)
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
    scripts: list[Any] = [[gone], ConnectionResetError("watch cut"), []]
    server = Server([obj("a", 1)], 10, scripts, stop)
    errors: list[tuple[str, str]] = []
    run(server, record, errors)
    assert [c for c in record.calls if c[0] == "page"] == [("page", ["a"], True, True, "10")] * 3
    assert errors == [("watch", "ConnectionResetError")]
    assert len(record.waits) == 1 and 0.5 <= record.waits[0] <= 30.0


def test_a_list_cut_midway_is_started_again_from_its_first_page() -> None:
    record = Record()
    stop = RecordingStop(record)
    server = Server([obj("a", 1), obj("b", 2), obj("c", 3)], 10, [[]], stop)
    server.fail_list_page = 2
    errors: list[tuple[str, str]] = []
    run(server, record, errors)
    pages = [c for c in record.calls if c[0] == "page"]
    assert pages == [
        ("page", ["a", "b"], True, False, "10"),
        ("page", ["a", "b"], True, False, "10"),
        ("page", ["c"], False, True, "10"),
    ]
    assert errors == [("list", "ConnectionResetError")]


def test_a_streaming_list_is_handed_over_in_pages_and_its_stream_goes_on_as_the_watch() -> None:
    record = Record()
    stop = RecordingStop(record)
    server = Server([obj("a", 1), obj("b", 2), obj("c", 3)], 10, [[{"type": "DELETED", "object": obj("b", 13)}]], stop)
    server.streaming = True
    server.scripts.insert(0, [{"type": "MODIFIED", "object": obj("a", 11)}])  # the stream's own, after the end
    run(server, record)
    assert record.calls == [
        ("page", ["a", "b"], True, False, "2"),
        ("page", ["c"], False, True, "10"),
        ("MODIFIED", "a"),
        ("DELETED", "b"),
    ]
    assert server.lists == []  # no LIST at all
    (stream,) = server.streams
    assert stream["resourceVersionMatch"] == "NotOlderThan" and stream["allowWatchBookmarks"]
    assert stream["labelSelector"] == "a=b"
    assert [w["resourceVersion"] for w in server.watches] == ["11"]  # after the stream ended, from where it was


def test_a_server_without_streaming_lists_is_listed_page_by_page_at_once_and_not_asked_again() -> None:
    record = Record()
    stop = RecordingStop(record)
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
    server = Server([obj("a", 1)], 10, [[gone], []], stop)
    errors: list[tuple[str, str]] = []
    run(server, record, errors)
    assert len(server.streams) == 1 and len(server.lists) == 2
    assert errors == [] and record.waits == []


def test_a_streaming_list_that_outlasts_its_watch_is_listed_page_by_page_from_then_on() -> None:
    record = Record()
    stop = RecordingStop(record)
    server = Server([obj("a", 1), obj("b", 2), obj("c", 3)], 10, [[]], stop)
    server.streaming = server.cut_stream = True  # the server ends the stream before the end marker
    errors: list[tuple[str, str]] = []
    run(server, record, errors)
    pages = [c for c in record.calls if c[0] == "page"]
    # The cut list's first page was handed over; the next list starts again from a first page.
    assert pages == [
        ("page", ["a", "b"], True, False, "2"),
        ("page", ["a", "b"], True, False, "10"),
        ("page", ["c"], False, True, "10"),
    ]
    assert len(server.streams) == 1 and len(server.lists) == 2
    assert errors == [] and record.waits == []


def test_an_error_status_is_reported_with_the_call_that_met_it() -> None:
    record = Record()
    stop = RecordingStop(record)
    server = Server([], 10, [ApiError(403, "Forbidden", "no"), []], stop)
    errors: list[tuple[str, str]] = []
    run(server, record, errors)
    assert errors == [("watch", "ApiError")]


def test_the_handoff_runs_each_call_on_the_loop_and_holds_the_thread_to_its_window() -> None:
    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        handoff = Handoff(loop, stop=stop, window=2)
        ran: list[int] = []
        handed = threading.Event()

        def producer() -> None:
            for i in range(5):
                handoff(ran.append, i)
            handed.set()

        thread = threading.Thread(target=producer)
        thread.start()
        await asyncio.sleep(0.2)
        assert not handed.is_set() or len(ran) == 5  # the loop was free: it may have run them all
        await asyncio.to_thread(thread.join, 5)
        await asyncio.sleep(0)
        return ran

    assert asyncio.run(main()) == [0, 1, 2, 3, 4]


def test_a_stopped_handoff_does_not_wait_for_a_full_window() -> None:
    loop = asyncio.new_event_loop()  # never run: nothing handed over is ever handled
    stop = threading.Event()
    handoff = Handoff(loop, stop=stop, window=1)
    handoff(lambda: None)
    stop.set()
    handoff(lambda: None)  # returns within its next second instead of waiting for a slot
    loop.close()


# --- the operator's relist ------------------------------------------------------------------------


class NoKube:
    async def can_retire(self, **_: Any) -> bool:
        return False


def operator() -> Operator:
    operator: Operator = make_operator(NoKube())
    return operator


def registration(name: str, rv: int, namespace: str = "jobs") -> dict[str, Any]:
    body = make_registration(namespace=namespace, name=name, uid=f"uid-{name}", attested=False)
    body["metadata"]["resourceVersion"] = str(rv)
    return body


def active_deletions(op: Operator) -> float:
    return op.metrics.registry.get_sample_value("coroner_active_registration_deletions_total") or 0.0


def test_a_relist_forgets_what_it_no_longer_holds_but_not_a_body_newer_than_the_list() -> None:
    op = operator()
    for name, rv in (("kept", 5), ("deleted", 6), ("written-after-the-list", 30)):
        op.inputs.on_registration(registration(name, rv), deleted=False)
    op.inputs.on_list_page([registration("kept", 5)], first=True, last=False, resource_version="20")
    assert set(op.world.bodies) == {("jobs", "kept"), ("jobs", "deleted"), ("jobs", "written-after-the-list")}
    op.inputs.on_list_page([registration("new", 19)], first=False, last=True, resource_version="20")
    assert {name for _, name in op.world.bodies} == {"kept", "new", "written-after-the-list"}
    assert active_deletions(op) == 1  # counted and logged as any deletion of an active one


def test_a_relist_begun_again_forgets_the_pages_of_the_one_cut_short() -> None:
    op = operator()
    op.inputs.on_registration(registration("a", 5), deleted=False)
    op.inputs.on_list_page([registration("a", 5)], first=True, last=False, resource_version="20")
    op.inputs.on_list_page([], first=True, last=True, resource_version="21")
    assert op.world.bodies == {}


def test_a_namespaces_relist_forgets_only_that_namespaces_registrations() -> None:
    """One watch per served namespace: each relists on its own, and the end of one namespace's list
    says nothing about another's registrations (nor does a list interleaved with it)."""
    op = operator()
    for namespace in ("a", "b"):
        op.inputs.on_registration(registration("gone", 5, namespace), deleted=False)
    op.inputs.on_list_page([], first=True, last=False, resource_version="20", namespace="a")
    op.inputs.on_list_page([registration("w", 7, "b")], first=True, last=True, resource_version="20", namespace="b")
    assert ("a", "gone") in op.world.bodies and ("b", "gone") not in op.world.bodies
    op.inputs.on_list_page([], first=False, last=True, resource_version="20", namespace="a")
    assert set(op.world.bodies) == {("b", "w")}


@pytest.mark.parametrize(
    ("patterns", "scopes"),
    [
        ((), (None,)),
        (("a",), ("a",)),
        (("b", "a", "b"), ("a", "b")),
        (("a", "team-*"), (None,)),
        (("team-?",), (None,)),
        (("[ab]",), (None,)),
    ],
)
def test_exact_namespaces_are_watched_one_by_one_and_a_glob_watches_every_namespace(
    patterns: tuple[str, ...], scopes: tuple[str | None, ...]
) -> None:
    assert watch_scopes(patterns) == scopes


@pytest.mark.parametrize(
    ("patterns", "namespace", "served"),
    [
        ((), "anything", True),
        (("a",), "a", True),
        (("a",), "ab", False),
        (("team-*",), "team-x", True),
        (("team-*",), "Team-x", False),
        (("a", "team-*"), "b", False),
    ],
)
def test_serves_matches_exact_names_and_globs(patterns: tuple[str, ...], namespace: str, served: bool) -> None:
    assert serves(patterns, namespace) is served


@pytest.mark.parametrize(("n", "pages"), [(0, [0]), (2, [2]), (3, [3, 0]), (7, [3, 3, 1])])
def test_initial_events_come_in_pages_and_leave_the_watch_that_follows_to_the_caller(n: int, pages: list[int]) -> None:
    end = {"metadata": {"resourceVersion": "99", "annotations": {INITIAL_EVENTS_END: "true"}}}
    events = iter(
        [{"type": "ADDED", "object": obj(f"o{i}", i + 1)} for i in range(n)]
        + [{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "50"}}}]  # not the end: skipped
        + [{"type": "BOOKMARK", "object": end}, {"type": "MODIFIED", "object": obj("o0", 100)}]
    )
    got = list(initial_events(events, page_limit=3))
    assert [len(page) for page, _, _ in got] == pages
    assert [last for _, last, _ in got] == [False] * (len(pages) - 1) + [True]
    assert got[-1][2] == "99"
    assert [o["metadata"]["name"] for page, _, _ in got for o in page] == [f"o{i}" for i in range(n)]
    assert next(events)["type"] == "MODIFIED"


@pytest.mark.parametrize(
    ("events", "raised"),
    [
        ([], IncompleteList),
        ([{"type": "ADDED", "object": obj("a", 1)}], IncompleteList),
        ([{"type": "MODIFIED", "object": obj("a", 1)}], ApiError),
        ([{"type": "ERROR", "object": {"code": 410, "reason": "Expired"}}], ApiError),
    ],
)
def test_initial_events_without_their_end_raise(events: list[dict[str, Any]], raised: type[Exception]) -> None:
    with pytest.raises(raised):
        list(initial_events(iter(events), page_limit=3))
