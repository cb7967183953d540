"""The agent's own metrics, its /healthz and /readyz, and the small HTTP server that serves them.

Label values are the words of coroner.core.reasons (verdict, evidence), so an attestation reads the
same in a metric, a registration's status and a log line; no label names a registration.

/healthz answers whether the process is alive and its event loop turning (a heartbeat task stamps
the time every `HEARTBEAT_SECONDS`). It never asks the API server: an API server outage must not
make the kubelet restart every agent of the cluster, which would drop their pidfds (and the deaths
only a pidfd sees without a second look). /readyz answers whether the agent does its job: its node
Lease renewed within the Lease's duration and its registration watch listed once.

The server runs in its own thread (the standard library's, no web framework in the agent image),
so a stuck event loop is answered with a 503 rather than with silence.
"""

from __future__ import annotations

import asyncio
import dataclasses
import http.server
import logging
import threading
import time
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

from coroner.runtime.metrics import process_registry

logger = logging.getLogger("coroner.agent")

#: How often the event loop's heartbeat stamps the time.
HEARTBEAT_SECONDS = 1.0
#: /healthz fails once the loop has not stamped for this long (a loop blocked this long is stuck).
LIVENESS_STALE_SECONDS = 30.0


class AgentMetrics:
    """One registry per agent object (tests run several agents in one interpreter)."""

    def __init__(self, *, process_collectors: bool = True) -> None:
        self.registry, self.build_info = process_registry(process_collectors=process_collectors)
        self.registrations = Gauge(
            "coroner_agent_registrations",
            "Registrations of this agent's node that it watches (active and terminal), as of now.",
            registry=self.registry,
        )
        self.attestations = Counter(
            "coroner_agent_attestations",
            "Attestations written, by verdict and evidence (written on change only, never as a refresh).",
            ["verdict", "evidence"],
            registry=self.registry,
        )
        self.probe_seconds = Histogram(
            "coroner_agent_probe_seconds",
            "How long one probe of one incarnation took (/proc reads and pidfd pinning).",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
            registry=self.registry,
        )
        self.pidfds = Gauge(
            "coroner_agent_pidfds",
            "Pidfds this agent holds open (incarnations pinned, and holders of a Reused registration's number).",
            registry=self.registry,
        )
        self.lease_renewals = Counter(
            "coroner_agent_lease_renewals",
            "Successful renewals (or creations) of this node's agent Lease coroner-agent-<node>.",
            registry=self.registry,
        )
        self.lease_renewal_failures = Counter(
            "coroner_agent_lease_renewal_failures",
            "Failed renewals of this node's agent Lease (retried with backoff; the Lease expires after its "
            "duration without one).",
            registry=self.registry,
        )
        self.lease_renewed = Gauge(
            "coroner_agent_lease_last_renewal_timestamp_seconds",
            "Unix time of the last successful renewal of this node's agent Lease (0: none yet).",
            registry=self.registry,
        )
        self.api_errors = Counter(
            "coroner_agent_api_errors",
            "Failed API calls, by call (list, watch, attestation, read, lease) and status (the HTTP "
            "status, or unreachable when no answer came).",
            ["call", "status"],
            registry=self.registry,
        )

    def api_error(self, call: str, exc: BaseException) -> None:
        self.api_errors.labels(call, error_status(exc)).inc()


def error_status(exc: BaseException) -> str:
    """The `status` label of an API error: its HTTP status, or `unreachable` (no answer at all)."""
    status = getattr(exc, "status", None)
    return str(status) if isinstance(status, int) and 100 <= status < 600 else "unreachable"


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    ok: bool
    text: str


def liveness(*, now: float, last_beat: float | None, started: float, stale_after: float) -> Answer:
    """/healthz from monotonic times: alive while the event loop stamped within `stale_after` (a
    loop that has not stamped yet is given as long from the start). Never the API server's state."""
    since = now - (last_beat if last_beat is not None else started)
    if since <= stale_after:
        return Answer(True, "ok\n")
    return Answer(False, f"event loop heartbeat {since:.1f}s old (limit {stale_after:.0f}s)\n")


def readiness(*, now: float, last_renewal: float | None, lease_duration: float, synced: bool) -> Answer:
    """/readyz from monotonic times: ready while the node Lease was renewed within its duration
    (what the operator reads as a live agent) and the registration watch has listed once."""
    problems = []
    if last_renewal is None:
        problems.append("the node Lease has not been renewed yet")
    elif now - last_renewal > lease_duration:
        problems.append(f"the node Lease was last renewed {now - last_renewal:.1f}s ago (duration {lease_duration:g}s)")
    if not synced:
        problems.append("the registration watch has not listed yet")
    if problems:
        return Answer(False, "; ".join(problems) + "\n")
    return Answer(True, "ok\n")


@dataclasses.dataclass(slots=True)
class HealthState:
    """What /healthz and /readyz read: written by the event loop, read by the server's thread
    (single float and bool assignments only)."""

    lease_duration: float
    started: float = dataclasses.field(default_factory=time.monotonic)
    last_beat: float | None = None
    last_renewal: float | None = None
    synced: bool = False
    stale_after: float = LIVENESS_STALE_SECONDS

    def beat(self) -> None:
        self.last_beat = time.monotonic()

    def renewed(self) -> None:
        self.last_renewal = time.monotonic()

    def live(self) -> Answer:
        return liveness(
            now=time.monotonic(), last_beat=self.last_beat, started=self.started, stale_after=self.stale_after
        )

    def ready(self) -> Answer:
        return readiness(
            now=time.monotonic(), last_renewal=self.last_renewal, lease_duration=self.lease_duration, synced=self.synced
        )


async def heartbeat(state: HealthState) -> None:
    """Stamps the time while the event loop turns: what /healthz reads (never the API server)."""
    while True:
        state.beat()
        await asyncio.sleep(HEARTBEAT_SECONDS)


class HealthServer:
    """/metrics, /healthz and /readyz on one port, in a daemon thread."""

    def __init__(
        self,
        *,
        address: str,
        port: int,
        metrics: AgentMetrics,
        state: HealthState,
        before_scrape: Callable[[], None] = lambda: None,
    ) -> None:
        self.before_scrape = before_scrape
        """Called (in the server's thread) before each scrape, to set the gauges read from state."""
        routes: dict[str, Callable[[], tuple[int, str, bytes]]] = {
            "/metrics": lambda: (200, CONTENT_TYPE_LATEST, _scrape(metrics, self.before_scrape)),
            "/healthz": lambda: _answer(state.live()),
            "/readyz": lambda: _answer(state.ready()),
        }

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                route = routes.get(self.path.split("?", 1)[0])
                status, content_type, body = route() if route else (404, "text/plain", b"not found\n")
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's name
                pass  # every probe and scrape would be a line

        self._server = http.server.ThreadingHTTPServer((address, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="health-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _scrape(metrics: AgentMetrics, before: Callable[[], None]) -> bytes:
    before()
    return generate_latest(metrics.registry)


def _answer(answer: Answer) -> tuple[int, str, bytes]:
    return (200 if answer.ok else 503), "text/plain; charset=utf-8", answer.text.encode()
