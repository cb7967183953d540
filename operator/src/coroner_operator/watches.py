"""The registration watch: list-then-watch the served registrations (`coroner.runtime.watch.reflect`;
one watch per namespace named by the served patterns, else one of every namespace), each in a
thread of its own, each page and event handed to `WatchInputs` on the event loop.

The operator's own watch, not kopf's: kopf keeps a memory record per object and starts a task per
object on every event, which at 150,000 registrations cost several GB during the initial list.
(kopf watches the Nodes and the Leases: `coroner_operator.handlers`.)
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import threading
from typing import Any

from coroner.client.rest import Rest, registrations_path
from coroner.core.world import trimmed
from coroner.runtime.watch import Handoff, reflect
from coroner_operator.collector import ListingPause
from coroner_operator.inputs import WatchInputs


async def watch_registrations(rest: Rest, *, inputs: WatchInputs, patterns: tuple[str, ...]) -> None:
    """Runs the watches that serve `patterns` until cancelled (a thread stops at its next event or
    the end of its stream); a watch thread's failure (a bug) is raised here."""
    loop = asyncio.get_running_loop()
    stop = threading.Event()
    ended: asyncio.Future[None] = loop.create_future()
    handoff = Handoff(loop, stop=stop)
    pause = ListingPause()

    def end(error: BaseException | None) -> None:
        if ended.done():
            return
        if error is None:
            ended.set_result(None)
        else:
            ended.set_exception(error)

    def run(namespace: str | None) -> None:
        # Only a watch of every namespace serving a glob sees what it does not serve.
        filtered = namespace is None and bool(patterns)

        def on_page(items: list[dict[str, Any]], first: bool, last: bool, resource_version: str) -> None:
            if filtered:
                items = [body for body in items if serves(patterns, body["metadata"]["namespace"])]

            def ingest() -> None:
                if first:
                    pause.begin(namespace)
                inputs.on_list_page(
                    items, first=first, last=last, resource_version=resource_version, namespace=namespace
                )
                if last:
                    pause.end(namespace)

            handoff(ingest)

        def on_event(event_type: str, body: dict[str, Any]) -> None:
            if not filtered or serves(patterns, body["metadata"]["namespace"]):
                handoff(lambda: inputs.on_registration(body, deleted=event_type == "DELETED"))

        error: BaseException | None = None
        try:
            reflect(
                rest, registrations_path(namespace), stop=stop, on_page=on_page, on_event=on_event,
                what=f"registrations in {namespace}" if namespace else "registrations", keep=trimmed,
            )  # fmt: skip
        except BaseException as exc:  # a bug: the loop's failure stops the operator
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: the process is stopping
            loop.call_soon_threadsafe(end, error)

    for namespace in watch_scopes(patterns):
        threading.Thread(
            target=run, args=(namespace,), name=f"watch-registrations-{namespace or 'all'}", daemon=True
        ).start()
    try:
        await ended
    finally:
        stop.set()
        pause.close()


def watch_scopes(patterns: tuple[str, ...]) -> tuple[str | None, ...]:
    """The registration watches that serve `patterns`: one per namespace when every pattern names
    one exactly (a namespaced operator needs no cluster-wide read), else one of every namespace
    (None), filtered by `serves`: a glob can match a namespace created later."""
    if not patterns or any(ch in p for p in patterns for ch in "*?["):
        return (None,)
    return tuple(sorted(set(patterns)))


def serves(patterns: tuple[str, ...], namespace: str) -> bool:
    """Whether an operator serving `patterns` (exact names or globs; none: all) serves `namespace`."""
    return not patterns or any(fnmatch.fnmatchcase(namespace, p) for p in patterns)
