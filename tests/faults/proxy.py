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
  resourceVersion, and 410 (Gone / Expired) answers, as an HTTP status or as a watch ERROR event.

Everything runs on one asyncio loop in a daemon thread; the public methods are thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import pathlib
import ssl
import threading
import urllib.parse
from collections import Counter
from typing import Any

MODES = ("pass", "drop", "stall")
_GONE_MARKERS = (b'"code":410', b'"reason":"Expired"', b"too old resource version")
_HEAD_LIMIT = 1 << 20


@dataclasses.dataclass
class _Request:
    method: str
    path: str
    watch: bool
    resumes: bool


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
                await conn.pending.put(_Request(method=method, path=target, watch=watch, resumes=resumes))
                await self._wait_flowing()
                writer.write(head)
                await _forward_body(reader, writer, headers, wait=self._wait_flowing, scan=None)
                await writer.drain()

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
                await self._wait_flowing(conn)
                writer.write(head)
                if 100 <= status < 200 or status in (204, 304) or (request is not None and request.method == "HEAD"):
                    await writer.drain()
                    continue
                scan = self._scanner(request)

                conn.in_watch = request is not None and request.watch and status == 200
                try:
                    await _forward_body(
                        reader, writer, headers, wait=lambda: self._wait_flowing(conn), scan=scan, conn=conn
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
) -> None:
    """Forwards one message body (chunked: chunk by chunk, each after `wait()`)."""
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
