"""What a measurement window counts: the same counters read before and after it (`Snapshot`) and what
changed between the two (`Delta`). The API server's requests (`apiserver_request_total`), Coroner's
requests by identity and class (`Attribution`, `coroner_attribution`), the operator's metrics, the
benchmark's own heartbeats and the CPU time of named processes (`CpuClock`). steady and massdeath
measure their windows with it."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import psutil

from coroner.client.rest import Rest
from harness.cluster import Attribution, RequestKey, apiserver_requests, diff_requests, scrape_operator
from harness.machine import SYSTEM
from harness.workers import Heartbeater


def coroner_attribution(admin: Rest, worker_namespace: str) -> Attribution:
    """Coroner's three identities: the workers' ServiceAccount (the launcher) in `worker_namespace`,
    every agent token, and the operator's ServiceAccount."""
    return Attribution(
        admin,
        {
            "worker": (worker_namespace, "worker"),
            "agent": (SYSTEM, "coroner-agent"),
            "operator": (SYSTEM, "coroner-operator"),
        },
    )


class CpuClock:
    """User + system CPU seconds of named processes (a pid of 0 is left out), and the benchmark's own
    as `benchmark`."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.procs = {name: psutil.Process(pid) for name, pid in pids.items() if pid}
        self.procs["benchmark"] = psutil.Process()

    def read(self) -> dict[str, float]:
        out = {}
        for name, proc in self.procs.items():
            times = proc.cpu_times()
            out[name] = times.user + times.system
        return out


@dataclasses.dataclass(frozen=True)
class Snapshot:
    heartbeats: int
    requests: Counter[RequestKey]
    identities: dict[tuple[str, str], int]
    operator: dict[str, float]
    cpu: dict[str, float]


def snapshot(
    admin: Rest, *, heartbeater: Heartbeater, attribution: Attribution, operator_port: int, cpu: CpuClock
) -> Snapshot:
    """Every counter, read in this order: heartbeats sent, the API server's requests, the requests by
    identity, the operator's metrics, CPU."""
    heartbeats = heartbeater.counts()[0]
    requests = apiserver_requests(admin)
    identities = attribution.snapshot()
    operator = scrape_operator(operator_port)
    return Snapshot(heartbeats, requests, identities, operator, cpu.read())


@dataclasses.dataclass(frozen=True)
class Delta:
    before: Snapshot
    after: Snapshot

    @property
    def heartbeats(self) -> int:
        return self.after.heartbeats - self.before.heartbeats

    def requests(self) -> dict[str, int]:
        """Every request class the API server counted in the window ('VERB group/resource/sub')."""
        return diff_requests(self.after.requests, self.before.requests)

    def count(self, verb: str, resource: str, sub: str = "", group: str | None = None) -> int:
        """The API server's requests of one verb and resource (any group unless `group`)."""
        return sum(
            v - self.before.requests[k]
            for k, v in self.after.requests.items()
            if k[0] == verb and k[2] == resource and k[3] == sub and (group is None or k[1] == group)
        )

    def by_identity(self) -> dict[str, dict[str, int]]:
        return Attribution.diff(self.after.identities, self.before.identities)

    def operator_status_writes(self) -> dict[str, int]:
        """The operator's own `coroner_status_writes_total` by kind."""

        def written(metrics: dict[str, Any], kind: str) -> float:
            return float(metrics.get(f'coroner_status_writes_total{{kind="{kind}"}}', 0))

        return {
            kind: int(written(self.after.operator, kind) - written(self.before.operator, kind))
            for kind in ("conditions", "retirement")
        }

    def cpu(self, name: str) -> float:
        return self.after.cpu[name] - self.before.cpu[name]
