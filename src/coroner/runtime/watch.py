"""List-then-watch of one collection (client-go's reflector), for the processes that cache it: the
operator (every registration) and the agent (its node's).

`reflect` runs in a thread of its own: it lists the collection page by page, then watches from
the list's resourceVersion (with bookmarks, so a quiet watch still moves it), re-watches when the
server ends a stream, and lists again after a 410 or any failure, after a decorrelated-jitter
backoff (0.5 s up to 30 s: after an API server restart the watchers of a cluster relist spread
out, not in lockstep). It decides nothing: each page and each event goes to its caller's callbacks,
which `Handoff` carries onto an event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
from collections.abc import Callable, Mapping
from typing import Any

from coroner.client.rest import ApiError, Rest, list_pages
from coroner.runtime.controller import decorrelated_jitter

logger = logging.getLogger("coroner.watch")

#: Objects per LIST page: a collection of 150,000 is never one response held decoded at once.
PAGE_LIMIT = 500


def reflect(
    rest: Rest,
    path: str,
    *,
    query: Mapping[str, Any] | None = None,
    stop: threading.Event,
    on_page: Callable[[list[dict[str, Any]], bool, bool, str], None],
    on_event: Callable[[str, dict[str, Any]], None],
    on_error: Callable[[str, BaseException], None] | None = None,
    rng: random.Random | None = None,
    timeout_seconds: int = 300,
    page_limit: int = PAGE_LIMIT,
    what: str = "",
) -> None:
    """List-then-watch `path` until `stop` is set; call it in a thread of its own.

    `on_page(items, first, last, resource_version)` gets each page of a (re)list in order (`first`
    starts one, `last` ends it, with the snapshot's resourceVersion; a list that fails midway is
    started again from its first page); `on_event(type, object)` each ADDED, MODIFIED or DELETED
    after it. A failed list or watch is reported to `on_error` ("list" or "watch", the error)."""
    rng = rng or random.Random()
    backoff: float | None = None
    while not stop.is_set():
        call = "list"
        try:
            resource_version = _list(rest, path, query=query, page_limit=page_limit, on_page=on_page, stop=stop)
            if resource_version is None:
                return
            backoff = None
            call = "watch"
            while not stop.is_set():
                watch_query = {**(query or {}), "resourceVersion": resource_version, "allowWatchBookmarks": True}
                for event in rest.watch(path, query=watch_query, timeout_seconds=timeout_seconds):
                    if stop.is_set():
                        return
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        raise ApiError(int(obj.get("code") or 500), str(obj.get("reason") or ""), json.dumps(obj))
                    resource_version = str((obj.get("metadata") or {}).get("resourceVersion") or resource_version)
                    if event.get("type") != "BOOKMARK":
                        on_event(str(event.get("type")), obj)
        except ApiError as exc:
            if exc.status == 410:  # the watch fell behind the server's history: list again at once
                continue
            if on_error is not None:
                on_error(call, exc)
            backoff = decorrelated_jitter(rng, base=0.5, cap=30.0, previous=backoff)
            logger.warning("%s failed %s status=%s; relisting in %.1fs", call, what, exc.status, backoff)
            stop.wait(backoff)
        except Exception as exc:  # connection errors: back off and relist, never guess
            if on_error is not None:
                on_error(call, exc)
            backoff = decorrelated_jitter(rng, base=0.5, cap=30.0, previous=backoff)
            logger.warning("%s failed %s error=%r; relisting in %.1fs", call, what, exc, backoff)
            stop.wait(backoff)


def _list(
    rest: Rest,
    path: str,
    *,
    query: Mapping[str, Any] | None,
    page_limit: int,
    on_page: Callable[[list[dict[str, Any]], bool, bool, str], None],
    stop: threading.Event,
) -> str | None:
    """One list, handed over page by page; its resourceVersion (None if stopped midway)."""
    first, resource_version = True, ""
    for page in list_pages(rest, path, query=query, limit=page_limit):
        if stop.is_set():
            return None
        metadata = page.get("metadata") or {}
        resource_version = str(metadata.get("resourceVersion") or "")
        on_page(list(page.get("items") or []), first, not metadata.get("continue"), resource_version)
        first = False
    return resource_version


class Handoff:
    """Carries calls from a watch thread onto an event loop, at most `window` of them waiting.

    A thread that reads faster than the loop handles what it read waits for the loop, so a relist
    of a large collection is never held decoded at once, and the loop's callback queue never grows
    without bound while a burst of events is handled."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, stop: threading.Event, window: int = 8) -> None:
        self.loop = loop
        self.stop = stop
        self._slots = threading.BoundedSemaphore(window)

    def __call__(self, fn: Callable[..., None], *args: Any) -> None:
        while not self._slots.acquire(timeout=1.0):
            if self.stop.is_set():
                return

        def run() -> None:
            try:
                fn(*args)
            finally:
                self._slots.release()

        try:
            self.loop.call_soon_threadsafe(run)
        except RuntimeError:  # the loop is closed: the process is stopping
            self._slots.release()
            self.stop.set()
