"""The fault proxy's pure parts, without a cluster: what kind of write a request is, a patch without
its preconditions, and the watch stream re-framed event by event (held events withheld)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from faults.catalogue.sieve import _attested_start, strip_tests
from faults.proxy import Request, Tap, _forward_events, event_of

REG = "/apis/coroner.dev/v1alpha1/namespaces/ns/workerregistrations/w"
TEST = {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}


def _patch(*ops: dict[str, Any]) -> bytes:
    return json.dumps(list(ops)).encode()


@pytest.mark.parametrize(
    ("method", "path", "body", "kind"),
    [
        ("GET", REG, b"", None),
        (
            "PATCH",
            REG + "/status",
            _patch(TEST, {"op": "add", "path": "/status/retirement", "value": {}}),
            "retirement",
        ),
        (
            "PATCH",
            REG + "/status",
            _patch(TEST, {"op": "add", "path": "/status", "value": {"conditions": [], "retirement": {}}}),
            "retirement",
        ),
        (
            "PATCH",
            REG + "/status",
            _patch(TEST, {"op": "add", "path": "/status/attestation", "value": {}}),
            "attestation",
        ),
        ("PATCH", REG + "/status", _patch({"op": "test", "path": "/status/attestation", "value": {}}), "status"),
        (
            "PATCH",
            REG + "/status",
            _patch(TEST, {"op": "add", "path": "/status/conditions", "value": []}),
            "conditions",
        ),
        ("PATCH", REG + "/status", b'{"status": {"lastHeartbeatTime": "x"}}', "heartbeat"),
        ("PATCH", REG + "/status?fieldManager=x", b"not json", "status"),
        ("DELETE", REG, b"", "delete"),
        ("POST", "/apis/coroner.dev/v1alpha1/namespaces/ns/workerregistrations", b"{}", "create"),
        ("POST", "/api/v1/namespaces/ns/events", b"{}", "event"),
        ("PATCH", "/api/v1/namespaces/ns/events/e", b"{}", "event-update"),
        ("PUT", "/apis/coordination.k8s.io/v1/namespaces/coroner-system/leases/l", b"{}", "lease"),
        ("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", b"{}", None),
    ],
)
def test_write_kind(method: str, path: str, body: bytes, kind: str | None) -> None:
    request = Request(method=method, path=path, watch=False, resumes=False, body=body)
    assert request.kind == kind


def test_request_names_its_object() -> None:
    request = Request(method="PATCH", path=REG + "/status?x=1", watch=False, resumes=False, body=b"[]")
    assert (request.namespace, request.resource, request.name) == ("ns", "workerregistrations", "w")


def test_strip_tests_keeps_everything_else() -> None:
    add = {"op": "add", "path": "/status/retirement", "value": {"a": 1}}
    assert json.loads(strip_tests(_patch(TEST, add, TEST))) == [add]
    assert strip_tests(b'{"status": {}}') == b'{"status": {}}'
    assert strip_tests(b"garbage") == b"garbage"


def test_event_of_matches_by_namespace_and_name() -> None:
    match = event_of("ns", "w")
    assert match({"type": "MODIFIED", "object": {"metadata": {"namespace": "ns", "name": "w", "uid": "1"}}})
    assert not match({"type": "MODIFIED", "object": {"metadata": {"namespace": "ns", "name": "v"}}})
    assert not match({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}})


class _Sink:
    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        return None


def _dechunk(data: bytes) -> list[bytes]:
    chunks = []
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        chunks.append(rest[:size])
        data = rest[size + 2 :]
    return chunks


async def _run(stream: bytes, held: set[str]) -> list[bytes]:
    reader = asyncio.StreamReader()
    reader.feed_data(stream)
    reader.feed_eof()
    sink = _Sink()

    async def wait() -> None:
        return None

    def gate(line: bytes) -> bool:
        return json.loads(line)["object"]["metadata"]["name"] in held

    await _forward_events(reader, sink, wait=wait, scan=None, conn=None, gate=gate, holds=None)  # type: ignore[arg-type]
    assert sink.data.endswith(b"0\r\n\r\n")
    return _dechunk(sink.data)


@given(
    names=st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=8),
    cuts=st.lists(st.integers(min_value=1, max_value=400), max_size=10),
    held=st.sets(st.sampled_from(["a", "b", "c"])),
)
def test_watch_stream_reframed_event_by_event(names: list[str], cuts: list[int], held: set[str]) -> None:
    events = [
        json.dumps({"type": "MODIFIED", "object": {"metadata": {"name": n, "resourceVersion": str(i)}}}).encode()
        + b"\n"
        for i, n in enumerate(names)
    ]
    payload = b"".join(events)
    # The server's chunk boundaries fall anywhere, also inside an event.
    points = sorted({c % len(payload) for c in cuts} - {0})
    pieces = [payload[a:b] for a, b in zip([0, *points], [*points, len(payload)], strict=True)]
    stream = b"".join(b"%x\r\n" % len(p) + p + b"\r\n" for p in pieces) + b"0\r\n\r\n"
    out = asyncio.run(_run(stream, held))
    assert out == [e for e, n in zip(events, names, strict=True) if n not in held]


ATT = {"verdict": "Dead", "incarnation": {"pid": "7", "startTime": "123"}}


@pytest.mark.parametrize(
    "ops",
    [
        [TEST, {"op": "add", "path": "/status/attestation", "value": ATT}],
        [TEST, {"op": "add", "path": "/status", "value": {"attestation": ATT}}],
        [
            TEST,
            {"op": "add", "path": "/status/conditions", "value": []},
            {"op": "add", "path": "/status/retirement", "value": {"reason": "PidfdExited", "attestation": ATT}},
        ],
        [TEST, {"op": "add", "path": "/status", "value": {"conditions": [], "retirement": {"attestation": ATT}}}],
    ],
)
def test_the_incarnation_a_write_is_about(ops: list[dict[str, Any]]) -> None:
    request = Request(method="PATCH", path=REG + "/status", watch=False, resumes=False, body=_patch(*ops))
    assert _attested_start(request) == "123"


def test_a_write_about_no_incarnation() -> None:
    request = Request(
        method="PATCH",
        path=REG + "/status",
        watch=False,
        resumes=False,
        body=_patch(TEST, {"op": "add", "path": "/status/conditions", "value": []}),
    )
    assert _attested_start(request) is None


def test_a_tap_fires_once_at_the_nth_success_and_never_once_disarmed() -> None:
    """The long run's trial 909: crash_after_write gave up waiting for a retirement, but its tap
    stayed armed and killed the operator at a later retirement, with nobody to start a new one."""
    write = Request(method="PATCH", path="/x", watch=False, resumes=False, kind="retirement", name="w")
    fired: list[Request] = []
    tap = Tap(lambda _r: True, nth=2, action=fired.append)
    assert not tap.answered(write, 422) and not tap.answered(write, 200)
    assert tap.answered(write, 200) and fired == [write] and tap.disarm()
    assert not tap.answered(write, 200) and fired == [write]
    late = Tap(lambda _r: True, nth=1, action=fired.append)
    assert not late.disarm()
    assert not late.answered(write, 200) and not late.fired.is_set() and fired == [write]
