"""A loopback TLS proxy in front of the real API server that can cut a component off, and see 410s.

Each component whose connectivity a fault controls (an agent, the operator) gets its own proxy: its
kubeconfig's server is rewritten to the proxy's 127.0.0.1 port, and the proxy forwards to the API
server. The proxy terminates TLS with the API server's own serving certificate (issued by the dev
cluster's CA for 127.0.0.1, so clients verify it exactly as they verify the API server) and opens
its own TLS connection upstream; bearer tokens pass through untouched, so the API server sees the
component's real identity.

It parses HTTP/1.1 just enough to forward whole messages (request heads and bodies, response heads,
Content-Length bodies, and chunked bodies chunk by chunk) so that it can:

- ``pass``: forward everything;
- ``drop``: abort every open connection and refuse new ones (connection reset), like a partition
  that kills sockets;
- ``stall``: accept and hold connections but forward nothing in either direction, like a
  partition that blackholes packets (held bytes are delivered when the stall ends);
- ``end_watches``: finish every in-flight watch response cleanly at a chunk boundary (the terminating
  chunk, then close), exactly what the client sees when the server's watch ``timeoutSeconds``
  elapses; the client then resumes from the last resourceVersion it saw;
- count what the fault model needs to see: requests, watch requests that resume from a
  resourceVersion, and 410 (Gone / Expired) answers, as an HTTP status or as a watch ERROR event;
- Sieve's patterns (docs/faults.md), for one component while everything else of it goes through:
  ``hold_events``: withhold the watch events of chosen objects (a lagging view: its writes still
  reach the API server, its reads are fresh), and ``release`` them later, all or only some (the
  ones left out were never delivered: unobserved state); ``tap``: see the status of every write
  of a kind (retirement, attestation, conditions, event, ...) and run an action right after the
  API server answered the n-th successful one, before the component reads the answer (SIGKILL:
  intermediate state); ``rewrite``: change a request body on its way (the detector self-tests'
  broken variants, e.g. a retirement without its ``test`` operations).

Watch responses are forwarded event by event (the stream is re-framed: one chunk per event line),
so that a held event is exactly one event.

Everything runs on one asyncio loop in a daemon thread; the public methods are thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import pathlib
import re
import ssl
import threading
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

MODES = ("pass", "drop", "stall")
_GONE_MARKERS = (b'"code":410', b'"reason":"Expired"', b"too old resource version")
_HEAD_LIMIT = 1 << 20


_OBJECT_PATH = re.compile(r"/namespaces/([^/?]+)/([^/?]+)(?:/([^/?]+))?(?:/([^/?]+))?")
_BODY_LIMIT = 4 << 20


@dataclasses.dataclass
class Request:
    """One request as the proxy saw it; `kind` names the write (None: a read or a watch)."""

    method: str
    path: str
    watch: bool
    resumes: bool
    body: bytes = b""
    namespace: str | None = None
    resource: str | None = None
    name: str | None = None
    kind: str | None = None

    def __post_init__(self) -> None:
        match = _OBJECT_PATH.search(urllib.parse.urlsplit(self.path).path)
        if match:
            self.namespace, self.resource, self.name, sub = match.groups()
        else:
            sub = None
        self.kind = write_kind(self.method, self.resource, sub, self.body)

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


_Request = Request


def write_kind(method: str, resource: str | None, sub: str | None, body: bytes) -> str | None:
    """What a write is, by what it sets: ``retirement``, ``attestation``, ``conditions``,
    ``heartbeat`` (a registration's status), ``create``/``delete`` (a registration), ``event``,
    ``event-update``, ``lease``; None for reads and anything else."""
    if method in ("GET", "HEAD", "OPTIONS"):
        return None
    if resource == "workerregistrations":
        if method == "DELETE":
            return "delete"
        if method == "POST":
            return "create"
        if sub != "status":
            return "registration"
        try:
            parsed = json.loads(body)
        except ValueError:
            return "status"
        keys: set[str] = set()
        if isinstance(parsed, list):  # JSON patch: what the non-test operations set
            for op in parsed:
                if not isinstance(op, dict) or op.get("op") == "test":
                    continue
                path = str(op.get("path", ""))
                if path == "/status" and isinstance(op.get("value"), dict):
                    keys.update(op["value"])
                elif path.startswith("/status/"):
                    keys.add(path.split("/")[2])
        elif isinstance(parsed, dict):
            keys.update((parsed.get("status") or {}) if isinstance(parsed.get("status"), dict) else {})
        for key, kind in (
            ("retirement", "retirement"),
            ("attestation", "attestation"),
            ("conditions", "conditions"),
            ("lastHeartbeatTime", "heartbeat"),
        ):
            if key in keys:
                return kind
        return "status"
    if resource == "events":
        return "event" if method == "POST" else "event-update"
    if resource == "leases":
        return "lease"
    return None


class Tap:
    """Sees every answered request `match` accepts (kind, object, status), and, with `nth`, runs
    `action` once, right after the API server answered the n-th successful (2xx) one and before
    the component reads that answer (the connection is then aborted: the answer never arrives)."""

    def __init__(
        self, match: Callable[[Request], bool], *, nth: int = 0, action: Callable[[Request], None] | None = None
    ) -> None:
        self.match = match
        self.nth = nth
        self.action = action
        self.seen: list[tuple[str | None, str | None, int]] = []
        self.answers: list[tuple[Request, int]] = []
        self.successes = 0
        self.fired = threading.Event()
        self.fired_request: Request | None = None
        self._lock = threading.Lock()
        self._disarmed = False

    def answered(self, request: Request, status: int) -> bool:
        """Records one answer; runs the action if it is the n-th success. True if it fired."""
        self.seen.append((request.kind, request.name, status))
        self.answers.append((request, status))
        if not self.nth or not 200 <= status < 300:
            return False
        with self._lock:
            if self._disarmed or self.fired.is_set():
                return False
            self.successes += 1
            if self.successes != self.nth:
                return False
            self.fired_request = request
            if self.action is not None:
                self.action(request)
            self.fired.set()
            return True

    def disarm(self) -> bool:
        """Never fires from now on (a fault that gave up waiting must not act later, when nothing
        follows its action: trial 909 of the long run, an operator killed and never restarted);
        True if it had fired already."""
        with self._lock:
            self._disarmed = True
            return self.fired.is_set()

    def statuses(self, name: str | None = None) -> list[int]:
        return [status for _, n, status in self.seen if name is None or n == name]


class EventGate:
    """Watch events `match` accepts (the decoded event: ``{"type": ..., "object": ...}``) are
    held (``hold``) or discarded (``drop``) instead of delivered, until the gate is released."""

    def __init__(self, match: Callable[[dict[str, Any]], bool], *, mode: str = "hold") -> None:
        self.match = match
        self.mode = mode
        self.held: list[tuple[_Conn, bytes, dict[str, Any]]] = []
        self.dropped = 0
        self.released = threading.Event()

    def events(self) -> list[dict[str, Any]]:
        return [event for _, _, event in self.held]


def event_of(namespace: str, name: str) -> Callable[[dict[str, Any]], bool]:
    """A gate's match: the events of one object (by namespace and name, whatever its uid)."""

    def match(event: dict[str, Any]) -> bool:
        meta = (event.get("object") or {}).get("metadata") or {}
        return meta.get("namespace") == namespace and meta.get("name") == name

    return match


class _Conn:
    def __init__(self, client_writer: asyncio.StreamWriter) -> None:
        self.client_writer = client_writer
        self.upstream_writer: asyncio.StreamWriter | None = None
        self.pending: asyncio.Queue[_Request] = asyncio.Queue()
        self.in_watch = False
        self.end_requested = asyncio.Event()
        self.tasks: list[asyncio.Task[Any]] = []

    def abort(self) -> None:
        for writer in (self.client_writer, self.upstream_writer):
            if writer is not None:
                with contextlib.suppress(Exception):
                    writer.transport.abort()
        for task in self.tasks:
            task.cancel()


class _Finished(Exception):
    """The response pump finished the client's watch cleanly (end_watches)."""


class ApiProxy:
    """One proxy for one component. ``start()`` binds a free loopback port (``self.port``)."""

    def __init__(
        self,
        *,
        name: str,
        upstream_port: int,
        ca_cert: pathlib.Path,
        serving_cert: pathlib.Path,
        serving_key: pathlib.Path,
    ) -> None:
        self.name = name
        self.upstream_port = upstream_port
        self.port = 0
        self.counters: Counter[str] = Counter()
        self._server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._server_ctx.load_cert_chain(str(serving_cert), str(serving_key))
        self._server_ctx.set_alpn_protocols(["http/1.1"])
        self._client_ctx = ssl.create_default_context(cafile=str(ca_cert))
        self._client_ctx.set_alpn_protocols(["http/1.1"])
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"proxy-{name}", daemon=True)
        self._mode = "pass"
        self._flowing: asyncio.Event | None = None
        self._conns: set[_Conn] = set()
        self._server: asyncio.base_events.Server | None = None
        self._lock = threading.Lock()
        self._taps: list[Tap] = []
        self._rewrites: list[tuple[Callable[[Request], bool], Callable[[bytes], bytes]]] = []
        self._gates: list[EventGate] = []
        self._answers: list[tuple[Callable[[Request], bool], int, int, list[int], bytes | None]] = []

    # --- control (any thread) --------------------------------------------------------------------

    def start(self) -> ApiProxy:
        self._thread.start()
        self._call(self._start())
        return self

    @property
    def mode(self) -> str:
        return self._mode

    def set_mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self._call(self._set_mode(mode))

    def end_watches(self) -> int:
        """Finish every in-flight watch response cleanly; returns how many were asked to end."""
        return int(self._call(self._end_watches()))

    def tap(self, match: Callable[[Request], bool], *, nth: int = 0, action: Any = None) -> Tap:
        """See `Tap`; removed with `untap`."""
        tap = Tap(match, nth=nth, action=action)
        with self._lock:
            self._taps.append(tap)
        return tap

    def untap(self, tap: Tap) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._taps.remove(tap)

    def rewrite(self, match: Callable[[Request], bool], change: Callable[[bytes], bytes]) -> Any:
        """Requests `match` accepts are sent with `change(body)`; returns the handle for `unrewrite`."""
        entry = (match, change)
        with self._lock:
            self._rewrites.append(entry)
        return entry

    def unrewrite(self, entry: Any) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._rewrites.remove(entry)

    def answer(
        self, match: Callable[[Request], bool], status: int, *, times: int = 1, body: bytes | None = None
    ) -> list[int]:
        """The next `times` requests `match` accepts are answered by the proxy itself with `status`
        (a Status body, or `body`), never forwarded: what a restarting API server answers for a
        moment (429 while its storage initializes, 403 before its authorizer has synced), or a read
        answered from an earlier copy. Returns a one-item list counting the answers given (the
        handle for `unanswer`)."""
        given = [0]
        with self._lock:
            self._answers.append((match, status, times, given, body))
        return given

    def unanswer(self, given: list[int]) -> None:
        """Stops the answers `answer` returned `given` for; those requests are forwarded again."""
        with self._lock:
            self._answers = [entry for entry in self._answers if entry[3] is not given]

    def hold_events(self, match: Callable[[dict[str, Any]], bool], *, mode: str = "hold") -> EventGate:
        """From now on, watch events `match` accepts are held (or, mode ``drop``, discarded)."""
        gate = EventGate(match, mode=mode)
        with self._lock:
            self._gates.append(gate)
        return gate

    def release(
        self, gate: EventGate, keep: Callable[[list[dict[str, Any]]], Iterable[int]] | None = None
    ) -> dict[str, int]:
        """Ends the gate: delivers the held events `keep` selects (indexes into the held events, in
        order; default all) on the watch connection each came from; the others are never delivered.
        Returns counts: delivered, withheld (selected out), lost (their connection had closed)."""
        return dict(self._call(self._release(gate, keep)))

    async def _release(
        self, gate: EventGate, keep: Callable[[list[dict[str, Any]]], Iterable[int]] | None
    ) -> dict[str, int]:
        with self._lock, contextlib.suppress(ValueError):
            self._gates.remove(gate)
        held = list(gate.held)
        chosen = set(range(len(held)) if keep is None else keep([event for _, _, event in held]))
        counts = {"delivered": 0, "withheld": 0, "lost": 0, "dropped": gate.dropped}
        for index, (conn, line, _event) in enumerate(held):
            if index not in chosen:
                counts["withheld"] += 1
            elif conn in self._conns:
                conn.client_writer.write(_chunk(line))
                with contextlib.suppress(Exception):
                    await conn.client_writer.drain()
                counts["delivered"] += 1
            else:
                counts["lost"] += 1
        gate.held.clear()
        gate.released.set()
        self._count("events_withheld", counts["withheld"])
        return counts

    def _gate_line(self, conn: _Conn, line: bytes) -> bool:
        """True: a gate took this watch event line (held or dropped); False: deliver it."""
        with self._lock:
            gates = list(self._gates)
        if not gates:
            return False
        try:
            event = json.loads(line)
        except ValueError:
            return False
        if not isinstance(event, dict):
            return False
        for gate in gates:
            if gate.match(event):
                if gate.mode == "drop":
                    gate.dropped += 1
                else:
                    gate.held.append((conn, line, event))
                return True
        return False

    def _holds(self, conn: _Conn) -> bool:
        with self._lock:
            return any(c is conn for gate in self._gates for c, _, _ in gate.held)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counters)

    def close(self) -> None:
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                self._call(self._close(), timeout=10)
            with contextlib.suppress(Exception):
                self._call(self._loop.shutdown_asyncgens(), timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if not self._loop.is_running() and not self._loop.is_closed():
            self._loop.close()

    def _call(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=timeout)

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counters[key] += n

    # --- the loop ----------------------------------------------------------------------------------

    async def _start(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(
            self._handle, host="127.0.0.1", port=0, ssl=self._server_ctx, limit=_HEAD_LIMIT
        )
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _set_mode(self, mode: str) -> None:
        assert self._flowing is not None
        self._mode = mode
        self._count(f"mode_{mode}")
        if mode == "pass":
            self._flowing.set()
        else:
            self._flowing.clear()
        if mode == "drop":
            for conn in list(self._conns):
                conn.abort()
            self._conns.clear()

    async def _end_watches(self) -> int:
        ended = 0
        for conn in list(self._conns):
            if conn.in_watch:
                conn.end_requested.set()
                ended += 1
        self._count("watches_ended", ended)
        return ended

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns):
            conn.abort()
        self._conns.clear()

    async def _wait_flowing(self, conn: _Conn | None = None) -> None:
        """Blocks while stalled; raises ConnectionAbortedError in drop mode."""
        assert self._flowing is not None
        while not self._flowing.is_set():
            if self._mode == "drop":
                raise ConnectionAbortedError("dropped")
            waits = [asyncio.ensure_future(self._flowing.wait())]
            if conn is not None:
                waits.append(asyncio.ensure_future(conn.end_requested.wait()))
            try:
                await asyncio.wait(waits, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waits:
                    waiter.cancel()
            if conn is not None and conn.end_requested.is_set():
                raise _Finished
        if self._mode == "drop":
            raise ConnectionAbortedError("dropped")

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        conn = _Conn(client_writer)
        self._count("connections")
        if self._mode == "drop":
            self._count("refused")
            client_writer.transport.abort()
            return
        self._conns.add(conn)
        try:
            await self._wait_flowing()
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1",
                self.upstream_port,
                ssl=self._client_ctx,
                server_hostname="127.0.0.1",
                limit=_HEAD_LIMIT,
            )
            conn.upstream_writer = upstream_writer
            requests = asyncio.ensure_future(self._pump_requests(conn, client_reader, upstream_writer))
            responses = asyncio.ensure_future(self._pump_responses(conn, upstream_reader, client_writer))
            conn.tasks = [requests, responses]
            await asyncio.wait(conn.tasks, return_when=asyncio.FIRST_COMPLETED)
        except (OSError, ConnectionAbortedError, asyncio.IncompleteReadError, ssl.SSLError, _Finished):
            pass
        finally:
            self._conns.discard(conn)
            conn.abort()

    async def _pump_requests(self, conn: _Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(
            OSError,
            ConnectionAbortedError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ssl.SSLError,
            _Finished,
        ):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, headers = _parse_head(head)
                method, target = [*line.split(" "), "", ""][:2]
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query)
                watch = query.get("watch", ["false"])[0].lower() in ("true", "1")
                resumes = watch and bool(query.get("resourceVersion", [""])[0]) and "sendInitialEvents" not in query
                self._count("requests")
                if watch:
                    self._count("watch_requests")
                    if resumes:
                        self._count("watch_resumes")
                elif method == "GET" and "/workerregistrations" in target:
                    self._count("registration_lists")
                length = headers.get("content-length")
                bodiless = length is None and "transfer-encoding" not in headers
                if not watch and bodiless:
                    canned = self._canned(_Request(method=method, path=target, watch=False, resumes=False))
                    if canned is not None:  # a read answered here
                        conn.client_writer.write(canned)
                        await conn.client_writer.drain()
                        continue
                if watch or length is None or not length.isdigit() or int(length) > _BODY_LIMIT:
                    await conn.pending.put(_Request(method=method, path=target, watch=watch, resumes=resumes))
                    await self._wait_flowing()
                    writer.write(head)
                    await _forward_body(reader, writer, headers, wait=self._wait_flowing, scan=None)
                    await writer.drain()
                    continue
                body = await reader.readexactly(int(length))
                request = _Request(method=method, path=target, watch=watch, resumes=resumes, body=body)
                canned = self._canned(request)
                if canned is not None:  # answered here (the client sends one request at a time)
                    conn.client_writer.write(canned)
                    await conn.client_writer.drain()
                    continue
                with self._lock:
                    rewrites = [change for match, change in self._rewrites if match(request)]
                for change in rewrites:
                    body = change(body)
                if rewrites:
                    self._count("rewritten")
                    head = re.sub(rb"(?im)^content-length:[ \t]*\d+", b"Content-Length: %d" % len(body), head)
                await conn.pending.put(request)
                await self._wait_flowing()
                writer.write(head + body)
                await writer.drain()

    def _canned(self, request: Request) -> bytes | None:
        status, body = 0, None
        with self._lock:
            for match, code, times, given, canned in self._answers:
                if given[0] < times and match(request):
                    given[0] += 1
                    status, body = code, canned
                    break
        if not status:
            return None
        self._count(f"answered_{status}")
        if body is None:
            body = json.dumps(
                {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": status, "message": "fault proxy"}
            ).encode()
        return (
            b"HTTP/1.1 %d Fault\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (status, len(body))
            + body
        )

    def _tapped(self, request: Request, status: int) -> bool:
        """Records the answer in every tap that matches; True if one fired its action."""
        with self._lock:
            taps = [tap for tap in self._taps if tap.match(request)]
        fired = False
        for tap in taps:
            if tap.answered(request, status):
                self._count("tap_fired")
                fired = True
        return fired

    def _scanner(self, request: _Request | None) -> Any:
        """Counts a 410 (Gone / Expired) once per response body."""
        gone = [False]

        def scan(data: bytes) -> None:
            if not gone[0] and any(marker in data for marker in _GONE_MARKERS):
                gone[0] = True
                self._count("gone_410")
                if request is not None and request.watch:
                    self._count("gone_410_watch")

        return scan

    async def _pump_responses(self, conn: _Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, OSError, ssl.SSLError):
                    # Upstream went away between responses: while stalled, hold the client (it must
                    # not learn anything during a blackhole); then close it like a broken server.
                    await self._wait_flowing(conn)
                    return
                line, headers = _parse_head(head)
                parts = line.split(" ")
                status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
                request = conn.pending.get_nowait() if not conn.pending.empty() else None
                if status == 410:
                    self._count("gone_410")
                if request is not None and self._tapped(request, status):
                    conn.abort()  # the component never reads this answer
                    return
                await self._wait_flowing(conn)
                writer.write(head)
                if 100 <= status < 200 or status in (204, 304) or (request is not None and request.method == "HEAD"):
                    await writer.drain()
                    continue
                scan = self._scanner(request)

                conn.in_watch = request is not None and request.watch and status == 200
                try:
                    await _forward_body(
                        reader,
                        writer,
                        headers,
                        wait=lambda: self._wait_flowing(conn),
                        scan=scan,
                        conn=conn,
                        gate=(lambda line: self._gate_line(conn, line)) if conn.in_watch else None,
                        holds=(lambda: self._holds(conn)) if conn.in_watch else None,
                    )
                except _Finished:
                    # Clean end of a watch: the terminating chunk, as after the server's timeout.
                    writer.write(b"0\r\n\r\n")
                    with contextlib.suppress(Exception):
                        await writer.drain()
                    self._count("watches_finished_cleanly")
                    with contextlib.suppress(Exception):
                        writer.close()
                    return
                finally:
                    conn.in_watch = False
                await writer.drain()
                if headers.get("connection", "").lower() == "close":
                    return
        except (OSError, ConnectionAbortedError, asyncio.IncompleteReadError, ssl.SSLError, _Finished):
            return


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _parse_head(head: bytes) -> tuple[str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for raw in lines[1:]:
        if ":" in raw:
            key, _, value = raw.partition(":")
            headers[key.strip().lower()] = value.strip()
    return lines[0], headers


async def _forward_body(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    headers: dict[str, str],
    *,
    wait: Any,
    scan: Any,
    conn: _Conn | None = None,
    gate: Callable[[bytes], bool] | None = None,
    holds: Callable[[], bool] | None = None,
) -> None:
    """Forwards one message body (chunked: chunk by chunk, each after `wait()`).

    With `gate` (a watch response): re-framed event by event, one chunk per newline-terminated
    event line; an event `gate` takes is not written; the stream's end waits until `holds()` is
    False (the held events were released or dropped), so a held event is never overtaken by it.
    """
    if gate is not None and "chunked" in headers.get("transfer-encoding", "").lower():
        await _forward_events(reader, writer, wait=wait, scan=scan, conn=conn, gate=gate, holds=holds)
        return
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            chunk = await _read_chunk(reader, conn)
            if chunk is None:
                # Upstream broke mid-body: while stalled, hold the client until the stall ends
                # (then break it) or the watch is ended cleanly (`wait` raises _Finished).
                await wait()
                if conn is not None and conn.end_requested.is_set():
                    raise _Finished
                raise asyncio.IncompleteReadError(b"", None)
            await wait()
            writer.write(chunk)
            if scan is not None:
                scan(chunk)
            if chunk.startswith(b"0\r\n") or chunk.startswith(b"0;"):
                return
            await writer.drain()
    length = headers.get("content-length")
    if length is not None:
        remaining = int(length)
        while remaining > 0:
            data = await reader.read(min(remaining, 65536))
            if not data:
                raise asyncio.IncompleteReadError(b"", remaining)
            remaining -= len(data)
            await wait()
            writer.write(data)
            if scan is not None:
                scan(data)
        return
    if scan is not None and headers:  # a response without framing: until the server closes
        while data := await reader.read(65536):
            await wait()
            writer.write(data)
            scan(data)
        raise ConnectionAbortedError("closed by server")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


async def _forward_events(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    wait: Any,
    scan: Any,
    conn: _Conn | None,
    gate: Callable[[bytes], bool],
    holds: Callable[[], bool] | None,
) -> None:
    buffer = b""
    while True:
        chunk = await _read_chunk(reader, conn)
        if chunk is None:
            await wait()
            if conn is not None and conn.end_requested.is_set():
                raise _Finished
            raise asyncio.IncompleteReadError(b"", None)
        await wait()
        if chunk.startswith(b"0\r\n") or chunk.startswith(b"0;"):
            if buffer:
                writer.write(_chunk(buffer))
            while holds is not None and holds():
                await asyncio.sleep(0.05)  # the end must not overtake a held event
                if conn is not None and conn.end_requested.is_set():
                    raise _Finished
            writer.write(chunk)
            return
        size_line = chunk.split(b"\r\n", 1)[0]
        buffer += chunk[len(size_line) + 2 : -2]
        if scan is not None:
            scan(chunk)
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip() and gate(line + b"\n"):
                continue
            writer.write(_chunk(line + b"\n"))
        await writer.drain()


async def _read_chunk(reader: asyncio.StreamReader, conn: _Conn | None) -> bytes | None:
    """One whole chunk (size line, data, CRLF; the last chunk with its trailers); None on EOF.

    Reading races `end_requested`: a watch asked to end does so at this boundary (`_Finished`).
    """

    async def read() -> bytes:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            trailers = b""
            while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
                trailers += line
            return size_line + trailers + b"\r\n"
        return size_line + await reader.readexactly(size + 2)

    if conn is None:
        try:
            return await read()
        except (asyncio.IncompleteReadError, OSError, ssl.SSLError):
            return None
    reading = asyncio.ensure_future(read())
    reading.add_done_callback(_retrieve)
    ending = asyncio.ensure_future(conn.end_requested.wait())
    try:
        await asyncio.wait([reading, ending], return_when=asyncio.FIRST_COMPLETED)
    finally:
        ending.cancel()
        if not reading.done() and not conn.end_requested.is_set():
            reading.cancel()
    if conn.end_requested.is_set():
        reading.cancel()
        raise _Finished
    try:
        return reading.result()
    except (asyncio.IncompleteReadError, OSError, ssl.SSLError):
        # Upstream broke mid-watch. While stalled the client must see nothing until the stall ends
        # (then a broken connection) or the watch is ended cleanly.
        return None
