"""`KubeApi`'s two injected ports: how a blocking request is awaited (`Blocking`) and the clock of
the bodies it builds. The deterministic simulation runs the production client through both."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from coroner_operator.kubeapi import KubeApi

pytestmark = pytest.mark.unit

T = TypeVar("T")
THEN = datetime.datetime(2026, 12, 1, 12, 0, 0, tzinfo=datetime.UTC)


class Recorder:
    """A `Rest` that records what it is asked and answers with an empty object."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []

    def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> dict[str, Any]:
        self.requests.append((method, path, body))
        if method == "GET" and "/leases/" in path:
            return {"metadata": {"name": path.rsplit("/", 1)[1], "resourceVersion": "7"}, "spec": {}}
        return {}


class Inline:
    """A `Blocking` that runs each call on the loop's thread and counts them."""

    def __init__(self) -> None:
        self.calls = 0
        self.closed = False

    async def run(self, call: Callable[[], T]) -> T:
        self.calls += 1
        return call()

    def close(self) -> None:
        self.closed = True


def test_requests_go_through_the_given_blocking_and_bodies_carry_the_given_clock() -> None:
    rest, blocking = Recorder(), Inline()
    kube = KubeApi(rest, blocking=blocking, clock=lambda: THEN)  # type: ignore[arg-type]
    involved = {"metadata": {"namespace": "jobs", "name": "w", "uid": "u"}, "kind": "WorkerRegistration"}

    async def scenario() -> None:
        await kube.post_event(body=involved, reason="Retired", message="gone")
        await kube.upsert_lease(namespace="coroner-system", name="coroner-operator", holder="op", duration=180,
                                annotations={})  # fmt: skip

    asyncio.run(scenario())
    kube.close()
    assert blocking.calls == 2 and blocking.closed
    (_, events_path, event), (_, _, _), (put, _, lease) = rest.requests
    assert events_path == "/api/v1/namespaces/jobs/events"
    assert event["lastTimestamp"] == "2026-12-01T12:00:00Z"
    assert put == "PUT" and lease["spec"]["renewTime"].startswith("2026-12-01T12:00:00")


class Gate:
    """A `Blocking` that holds every call until `expected` of them are waiting at once."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.waiting = 0
        self.most_at_once = 0
        self.all_in: asyncio.Event | None = None

    async def run(self, call: Callable[[], T]) -> T:
        if self.all_in is None:
            self.all_in = asyncio.Event()
        self.waiting += 1
        self.most_at_once = max(self.most_at_once, self.waiting)
        if self.waiting == self.expected:
            self.all_in.set()
        # Sent one after the other, each times out alone: `most_at_once` says so.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.all_in.wait(), timeout=1.0)
        self.waiting -= 1
        return call()

    def close(self) -> None:
        pass


def test_the_admission_read_sends_the_policies_the_bindings_and_the_crd_at_once() -> None:
    # A retirement waits for this read: requests sent one after the other would add a round trip
    # (and each list may wait for the API server's watch cache) to every retirement.
    rest, blocking = Recorder(), Gate(expected=3)
    kube = KubeApi(rest, blocking=blocking, clock=lambda: THEN)  # type: ignore[arg-type]

    objects = asyncio.run(kube.list_admission_policies())
    assert blocking.most_at_once == 3
    assert sorted(path.rsplit("/", 1)[1] for _, path, _ in rest.requests) == [
        "validatingadmissionpolicies",
        "validatingadmissionpolicybindings",
        "workerregistrations.coroner.dev",
    ]
    assert [o["kind"] for o in objects] == ["CustomResourceDefinition"]
