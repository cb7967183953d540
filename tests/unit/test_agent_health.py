"""The agent's /healthz, /readyz and /metrics (coroner_agent.health): liveness is the event loop
turning and never the API server; readiness is the node Lease renewed within its duration and the
watch listed; series are counted in the words of coroner.core.reasons, with bounded labels."""

from __future__ import annotations

import asyncio
import random
import urllib.error
import urllib.request
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from coroner.client.rest import ApiError
from coroner.core.reasons import Evidence, Verdict
from coroner_agent.health import AgentMetrics, HealthServer, HealthState, error_status, liveness, readiness
from coroner_agent.kube import AgentApi
from coroner_agent.service import Agent, AgentSettings
from unit.test_agent_confirmation import ABSENT, ALIVE, EXITED, KEY, ScriptedProber
from unit.test_agent_shutdown import NODE, FakeKube, registration

pytestmark = pytest.mark.unit

times = st.floats(min_value=0, max_value=1e6, allow_nan=False)


@pytest.mark.parametrize(
    ("now", "last_beat", "started", "ok"),
    [
        (100.0, 99.0, 0.0, True),  # stamped a second ago
        (100.0, 70.0, 0.0, True),  # exactly the limit
        (100.0, 69.0, 0.0, False),  # a loop stuck for 31 s
        (10.0, None, 0.0, True),  # not stamped yet, just started
        (100.0, None, 0.0, False),  # never stamped since the start
    ],
)
def test_liveness_table(now: float, last_beat: float | None, started: float, ok: bool) -> None:
    assert liveness(now=now, last_beat=last_beat, started=started, stale_after=30.0).ok is ok


@pytest.mark.parametrize(
    ("last_renewal", "synced", "ok", "says"),
    [
        (95.0, True, True, "ok"),
        (70.0, True, True, "ok"),  # renewed exactly one duration ago: the Lease is still live
        (69.0, True, False, "last renewed 31.0s ago"),
        (None, True, False, "not been renewed yet"),
        (95.0, False, False, "has not listed yet"),
        (None, False, False, "not been renewed yet; the registration watch"),
    ],
)
def test_readiness_table(last_renewal: float | None, synced: bool, ok: bool, says: str) -> None:
    answer = readiness(now=100.0, last_renewal=last_renewal, lease_duration=30.0, synced=synced)
    assert answer.ok is ok
    assert says in answer.text


@given(now=times, last_renewal=times, beat=times, duration=st.floats(min_value=1, max_value=3600))
def test_liveness_never_reads_the_lease_and_readiness_needs_a_live_one(
    now: float, last_renewal: float, beat: float, duration: float
) -> None:
    """However long ago the Lease was renewed (the API server down for any time), liveness is only
    the heartbeat; readiness is false once the Lease would have expired."""
    live = liveness(now=now, last_beat=beat, started=0.0, stale_after=30.0)
    assert live.ok is (now - beat <= 30.0)
    ready = readiness(now=now, last_renewal=last_renewal, lease_duration=duration, synced=True)
    assert ready.ok is (now - last_renewal <= duration)


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (ApiError(409, "Conflict", ""), "409"),
        (ApiError(503, "ServiceUnavailable", ""), "503"),
        (ConnectionRefusedError(), "unreachable"),
        (TimeoutError(), "unreachable"),
    ],
)
def test_api_error_status_label_is_bounded(error: BaseException, status: str) -> None:
    assert error_status(error) == status


def sample(metrics: AgentMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def _families(metrics: AgentMetrics) -> dict[str, Any]:
    from prometheus_client import generate_latest

    return {f.name: f for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())}


def test_every_series_is_registered_with_build_info_and_the_process_collectors() -> None:
    families = _families(AgentMetrics())
    for name in (
        "coroner_build_info",
        "coroner_agent_registrations",
        "coroner_agent_attestations",
        "coroner_agent_probe_seconds",
        "coroner_agent_pidfds",
        "coroner_agent_lease_renewals",
        "coroner_agent_lease_renewal_failures",
        "coroner_agent_lease_last_renewal_timestamp_seconds",
        "coroner_agent_api_errors",
        "process_resident_memory_bytes",
        "python_info",
    ):
        assert name in families, name


async def _attest(script: list[tuple[Verdict, Evidence]], metrics: AgentMetrics, *, settle: float) -> FakeKube:
    kube = FakeKube([registration("w", pid=42)])
    agent = Agent(
        kube=kube,  # type: ignore[arg-type]
        prober=ScriptedProber(script),
        settings=AgentSettings(node_name=NODE, absence_confirm_seconds=0.1),
        identity="agent",
        metrics=metrics,
    )
    agent.on_relist([kube.bodies[KEY]])
    assert agent.health.synced
    workers = agent.workers()
    await asyncio.sleep(settle)
    for worker in workers:
        worker.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    return kube


def test_attestations_are_counted_by_verdict_and_evidence_when_written() -> None:
    metrics = AgentMetrics(process_collectors=False)
    kube = asyncio.run(_attest([ALIVE, EXITED], metrics, settle=0.05))
    assert [w[1] for w in kube.writes] == ["Alive"]
    assert (
        sample(
            metrics,
            "coroner_agent_attestations_total",
            verdict=Verdict.ALIVE.value,
            evidence=Evidence.PIDFD_PINNED.value,
        )
        == 1
    )
    assert sample(metrics, "coroner_agent_probe_seconds_count") == 1


def test_a_proc_absence_counts_once_when_confirmed_with_its_first_look() -> None:
    metrics = AgentMetrics(process_collectors=False)
    kube = asyncio.run(_attest([ABSENT, ABSENT], metrics, settle=0.4))
    assert [w[1] for w in kube.writes] == ["Dead"]
    written = kube.bodies[KEY]["status"]["attestation"]
    assert written["firstObservedTime"] < written["observedTime"]
    assert sample(metrics, "coroner_agent_attestations_total", verdict="Dead", evidence="ProcAbsent") == 1


class FlakyKube(FakeKube):
    """Lease renewals fail while `down` is set (an unreachable API server)."""

    down = False

    def renew_lease(self, *, holder: str, duration: int, annotations: dict[str, str], now: Any = None) -> None:
        if self.down:
            raise ConnectionRefusedError("API server down")
        super().renew_lease(holder=holder, duration=duration, annotations=annotations, now=now)


def test_lease_renewals_failures_and_readiness_follow_the_api_server_while_liveness_stays() -> None:
    metrics = AgentMetrics(process_collectors=False)
    kube = FlakyKube([])
    settings = AgentSettings(node_name=NODE, renew_seconds=0.02, lease_duration_seconds=1)
    state = HealthState(lease_duration=0.2)  # a short Lease, so that it expires within the test
    agent = Agent(
        kube=kube, prober=ScriptedProber([ALIVE]), settings=settings, identity="a", metrics=metrics, health=state
    )  # type: ignore[arg-type]
    agent.on_relist([])

    async def scenario() -> tuple[bool, bool, bool, bool]:
        lease = asyncio.create_task(agent.lease.run())
        while sample(metrics, "coroner_agent_lease_renewals_total") < 2:
            await asyncio.sleep(0.01)
        ready_before = state.ready().ok
        kube.down = True
        failures_seen = sample(metrics, "coroner_agent_lease_renewal_failures_total")
        while state.ready().ok:  # the Lease's duration passes without a renewal
            state.beat()
            await asyncio.sleep(0.02)
        state.beat()
        live_while_down = state.live().ok
        assert sample(metrics, "coroner_agent_lease_renewal_failures_total") > failures_seen
        kube.down = False
        while not state.ready().ok:
            await asyncio.sleep(0.02)
        lease.cancel()
        await asyncio.gather(lease, return_exceptions=True)
        return ready_before, live_while_down, state.ready().ok, state.live().ok

    ready_before, live_while_down, ready_after, live_after = asyncio.run(scenario())
    assert ready_before and live_while_down and ready_after and live_after
    assert sample(metrics, "coroner_agent_api_errors_total", call="lease", status="unreachable") >= 1
    assert sample(metrics, "coroner_agent_lease_last_renewal_timestamp_seconds") > 0


def test_the_server_answers_metrics_healthz_and_readyz_over_http() -> None:
    metrics = AgentMetrics(process_collectors=False)
    state = HealthState(lease_duration=30)
    scraped: list[int] = []
    server = HealthServer(
        address="127.0.0.1", port=0, metrics=metrics, state=state, before_scrape=lambda: scraped.append(1)
    ).start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        state.beat()
        with urllib.request.urlopen(base + "/healthz") as answer:
            assert answer.status == 200
        with pytest.raises(urllib.error.HTTPError) as not_ready:
            urllib.request.urlopen(base + "/readyz")
        assert not_ready.value.code == 503
        not_ready.value.close()
        state.renewed()
        state.synced = True
        with urllib.request.urlopen(base + "/readyz") as answer:
            assert answer.status == 200
        with urllib.request.urlopen(base + "/metrics") as answer:
            assert b"coroner_build_info{" in answer.read()
        assert scraped == [1]
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(base + "/nothing")
        assert missing.value.code == 404
        missing.value.close()
    finally:
        server.close()


class _DownRest:
    """Every request fails as an unreachable API server does."""

    def request(self, *_: Any, **__: Any) -> Any:
        raise ConnectionRefusedError("API server down")


class _RecordingStop:
    """A stop event that records each backoff the watch waits, and stops it after `limit` waits."""

    def __init__(self, limit: int) -> None:
        self.waits: list[float] = []
        self.limit = limit

    def is_set(self) -> bool:
        return len(self.waits) >= self.limit

    def wait(self, timeout: float) -> bool:
        self.waits.append(timeout)
        return self.is_set()


def test_the_watch_relists_after_a_jittered_backoff_and_counts_each_failure() -> None:
    """Decorrelated jitter between 0.5 s and 30 s: agents cut off together do not relist in lockstep."""
    errors: list[tuple[str, str]] = []
    delays: list[list[float]] = []
    loop = asyncio.new_event_loop()
    for seed in (1, 2):
        stop = _RecordingStop(limit=12)
        AgentApi(_DownRest(), node_name=NODE).watch_registrations(  # type: ignore[arg-type]
            loop=loop,
            on_event=lambda *_: None,
            on_relist=lambda *_: None,
            stop=stop,  # type: ignore[arg-type]
            on_error=lambda call, exc: errors.append((call, error_status(exc))),
            rng=random.Random(seed),
        )
        assert all(0.5 <= d <= 30.0 for d in stop.waits), stop.waits
        delays.append(stop.waits)
    loop.close()
    assert delays[0] != delays[1], "two agents' backoffs differ"
    assert max(delays[0]) > 0.5 * 3, "the backoff grows"
    assert set(errors) == {("list", "unreachable")} and len(errors) == 24
