"""Shared harness of Coroner's benchmarks: a private dev cluster, Coroner's own processes, real
worker processes, bulk heartbeats, a watch, metric scrapes, and the result file.

Every benchmark starts its own control plane in a temporary directory and stops every process it
started on the way out (try/finally; component and worker processes also carry a parent-death
signal, so even a SIGKILLed benchmark leaves none of them behind). Every loop is bounded in count
and in time. All traffic goes to 127.0.0.1.

Nothing here asserts on time: the benchmarks measure and report.
"""

from __future__ import annotations

import contextlib
import datetime
import heapq
import http.client
import json
import os
import pathlib
import platform
import queue
import random
import re
import resource
import shlex
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import psutil

from coroner.core import api, model
from coroner_dev.devcluster import binaries as binaries_mod
from coroner_dev.devcluster import cluster as cluster_mod
from coroner_dev.devcluster.identities import ensure_node, mint_token

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
MANIFESTS = REPO / "manifests"
BIN = pathlib.Path(sys.executable).parent
REAL_BOOT_ID_FILE = pathlib.Path("/proc/sys/kernel/random/boot_id")
SYSTEM = api.SYSTEM_NAMESPACE
SHARED_MACHINE_NOTE = (
    "measured on a shared 2-core machine: other sessions' tests may have run concurrently, and the "
    "control plane, Coroner's processes, the workers and the benchmark itself all share those 2 cores"
)
#: Longest any sleep worker lives even if everything else fails: workers are bounded too.
WORKER_SECONDS = 3600


def log(message: str) -> None:
    stamp = time.strftime("%H:%M:%S")
    print(f"[{stamp}] {message}", file=sys.stderr, flush=True)


# --- facts about the run -------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    cpu_model = "unknown"
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    return {
        "cpu_model": cpu_model,
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "note": SHARED_MACHINE_NOTE,
    }


def git_commit() -> dict[str, Any]:
    def git(*args: str) -> str:
        result = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30, check=False)
        return result.stdout.strip()

    commit = git("rev-parse", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return {"commit": commit or "unknown", "dirty": dirty}


def versions() -> dict[str, Any]:
    import importlib.metadata as md

    found = {}
    for package in ("coroner", "kopf", "kubernetes", "psutil"):
        with contextlib.suppress(md.PackageNotFoundError):
            found[package] = md.version(package)
    return {
        "kubernetes_control_plane": binaries_mod.K8S_VERSION,
        "etcd": binaries_mod.ETCD_VERSION,
        "git": git_commit(),
        "packages": found,
    }


def command_line() -> str:
    return shlex.join(
        [os.path.relpath(sys.executable, REPO) if sys.executable.startswith(str(REPO)) else sys.executable, *sys.argv]
    )


def raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 65536
    if target > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def percentiles(values_s: Sequence[float]) -> dict[str, Any]:
    """p50/p90/p99/max/min/mean in milliseconds (nearest-rank percentiles) and n."""
    values = sorted(v * 1000.0 for v in values_s)
    n = len(values)
    if n == 0:
        return {"p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None, "min_ms": None, "mean_ms": None, "n": 0}

    def rank(p: float) -> float:
        index = max(0, min(n - 1, int(-(-p * n // 100)) - 1))  # nearest rank: ceil(p/100 * n) - 1
        return round(values[index], 1)

    return {
        "p50_ms": rank(50),
        "p90_ms": rank(90),
        "p99_ms": rank(99),
        "max_ms": round(values[-1], 1),
        "min_ms": round(values[0], 1),
        "mean_ms": round(statistics.fmean(values), 1),
        "n": n,
    }


def write_result(name: str, result: dict[str, Any]) -> pathlib.Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, sort_keys=False) + "\n")
    log(f"wrote {path.relative_to(REPO)}")
    return path


def plot(name: str, draw: Callable[[Any], None]) -> str | None:
    """Draws bench/results/<name>.png with matplotlib if installed; else says so and goes on."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no plot (install it with `.venv/bin/pip install matplotlib`)")
        return None
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.png"
    try:
        draw(plt)
        plt.savefig(path, dpi=110, bbox_inches="tight")
    finally:
        plt.close("all")
    log(f"wrote {path.relative_to(REPO)}")
    return str(path.relative_to(REPO))


# --- raw HTTP to the API server (cheap enough for thousands of requests per second) -------------


class Endpoint:
    """How to reach the API server as one identity: TLS context plus optional bearer token."""

    def __init__(self, *, host: str, port: int, context: ssl.SSLContext, token: str | None = None) -> None:
        self.host = host
        self.port = port
        self.context = context
        self.token = token

    @classmethod
    def admin(cls, cluster: cluster_mod.Cluster) -> Endpoint:
        return cls(host="127.0.0.1", port=cluster.apiserver_port, context=cluster_mod.admin_ssl_context(cluster))

    @classmethod
    def from_token_kubeconfig(cls, cluster: cluster_mod.Cluster, path: pathlib.Path) -> Endpoint:
        config = json.loads(path.read_text())
        token = config["users"][0]["user"]["token"]
        context = ssl.create_default_context(cafile=str(cluster.pki.ca_cert))
        return cls(host="127.0.0.1", port=cluster.apiserver_port, context=context, token=token)

    def connect(self, timeout: float = 30.0) -> http.client.HTTPSConnection:
        assert self.host in ("127.0.0.1", "localhost", "::1"), "benchmarks talk to loopback only"
        return http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=timeout)

    def headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if content_type:
            headers["Content-Type"] = content_type
        return headers


class Http:
    """One keep-alive connection per thread; reconnects once on a broken connection."""

    def __init__(self, endpoint: Endpoint, *, timeout: float = 30.0) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._local = threading.local()

    def _conn(self) -> http.client.HTTPSConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self.endpoint.connect(self.timeout)
            self._local.conn = conn
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
        self._local.conn = None

    def request(
        self, method: str, path: str, body: Any = None, *, content_type: str | None = None
    ) -> tuple[int, bytes]:
        payload = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        if payload is not None and content_type is None:
            content_type = "application/json"
        for attempt in range(2):
            conn = self._conn()
            try:
                conn.request(method, path, body=payload, headers=self.endpoint.headers(content_type))
                response = conn.getresponse()
                data = response.read()
                if response.getheader("Connection", "").lower() == "close":
                    self._drop()
                return response.status, data
            except (http.client.HTTPException, OSError):
                self._drop()
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")

    def json(self, method: str, path: str, body: Any = None, *, content_type: str | None = None) -> Any:
        status, data = self.request(method, path, body, content_type=content_type)
        if status >= 300:
            raise HttpError(status, data)
        return json.loads(data) if data else None

    def close(self) -> None:
        self._drop()


class HttpError(Exception):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:300]!r}")
        self.status = status
        self.body = body


def registrations_path(namespace: str | None = None, name: str | None = None, *, status: bool = False) -> str:
    base = f"/apis/{api.GROUP}/{api.VERSION}"
    path = f"{base}/namespaces/{namespace}/{api.PLURAL}" if namespace else f"{base}/{api.PLURAL}"
    if name:
        path += f"/{name}"
        if status:
            path += "/status"
    return path


def now_text() -> str:
    return model.format_time(datetime.datetime.now(datetime.UTC), fraction=True)


# --- metrics ---------------------------------------------------------------------------------------

_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str, metric: str) -> list[tuple[dict[str, str], float]]:
    """Samples of one metric from Prometheus text format (label sets and values)."""
    samples = []
    prefix = metric + "{"
    for line in text.splitlines():
        if line.startswith(prefix):
            labels_text, _, value = line[len(prefix) :].rpartition("} ")
            samples.append((dict(_LABEL.findall(labels_text)), float(value.split()[0])))
        elif line.startswith(metric + " "):
            samples.append(({}, float(line.split()[1])))
    return samples


RequestKey = tuple[str, str, str, str]  # verb, group, resource, subresource


def apiserver_requests(admin: Http) -> Counter[RequestKey]:
    """apiserver_request_total summed over codes, keyed by (verb, group, resource, subresource)."""
    status, data = admin.request("GET", "/metrics")
    if status != 200:
        raise HttpError(status, data)
    counts: Counter[RequestKey] = Counter()
    for labels, value in parse_prometheus(data.decode(), "apiserver_request_total"):
        key = (
            labels.get("verb", ""),
            labels.get("group", ""),
            labels.get("resource", ""),
            labels.get("subresource", ""),
        )
        counts[key] += int(value)
    return counts


def diff_requests(after: Counter[RequestKey], before: Counter[RequestKey]) -> dict[str, int]:
    out: dict[str, int] = {}
    for key in sorted(set(after) | set(before)):
        delta = after[key] - before[key]
        if delta:
            verb, group, resource_, sub = key
            name = f"{verb} {group + '/' if group else ''}{resource_ or '(non-resource)'}{'/' + sub if sub else ''}"
            out[name] = delta
    return out


WRITE_VERBS = ["create", "update", "patch", "delete", "deletecollection"]
#: Request classes an Attribution tells apart, most specific first: (class, apiGroups, resources,
#: verbs). Reviews (SelfSubjectAccessReview and the like) are `create`s that store nothing: reads.
ATTRIBUTION_CLASSES: list[tuple[str, list[str], list[str], list[str]]] = [
    ("registration_writes", ["coroner.dev"], ["workerregistrations", "workerregistrations/status"], WRITE_VERBS),
    ("lease_writes", ["coordination.k8s.io"], ["leases"], WRITE_VERBS),
    ("event_writes", ["", "events.k8s.io"], ["events"], WRITE_VERBS),
    ("reviews", ["authorization.k8s.io", "authentication.k8s.io"], ["*"], ["create"]),
    ("other_writes", ["*"], ["*"], WRITE_VERBS),
    ("reads", ["*"], ["*"], ["get", "list", "watch"]),
]


class Attribution:
    """Counts the API server's requests by who sent them and what they were, without an audit log:
    one FlowSchema per (identity, request class) that matches only that ServiceAccount's requests
    of that class, mapped to the priority level such requests use anyway (`workload-low`, where the
    suggested `service-accounts` FlowSchema sends every ServiceAccount), with the same
    distinguisher. The API server counts each request it dispatches under its FlowSchema
    (`apiserver_flowcontrol_dispatched_requests_total{flow_schema=...}`), so the counts are the API
    server's own, and the FlowSchemas change no request's priority or queueing.

    `identities`: label -> (namespace, ServiceAccount name). Node-bound agent tokens are the
    coroner-agent ServiceAccount's, so every agent (and the benchmark's emulated agents, which use
    those tokens) counts as `agent`.
    """

    PREFIX = "bench-"
    PRECEDENCE = 50  # after exempt (1) and probes (2), before every suggested FlowSchema (>= 100)
    PRIORITY_LEVEL = "workload-low"

    def __init__(self, admin: Http, identities: dict[str, tuple[str, str]]) -> None:
        self.admin = admin
        self.identities = identities
        for label, (namespace, sa) in identities.items():
            for i, (cls, groups, resources, verbs) in enumerate(ATTRIBUTION_CLASSES):
                rule: dict[str, Any] = {
                    "subjects": [{"kind": "ServiceAccount", "serviceAccount": {"name": sa, "namespace": namespace}}],
                    "resourceRules": [
                        {
                            "verbs": verbs,
                            "apiGroups": groups,
                            "resources": resources,
                            "clusterScope": True,
                            "namespaces": ["*"],
                        }
                    ],
                }
                if cls == "reads":
                    rule["nonResourceRules"] = [{"verbs": ["*"], "nonResourceURLs": ["*"]}]
                body = {
                    "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
                    "kind": "FlowSchema",
                    "metadata": {"name": self.schema(label, cls)},
                    "spec": {
                        "priorityLevelConfiguration": {"name": self.PRIORITY_LEVEL},
                        "matchingPrecedence": self.PRECEDENCE + i,
                        "distinguisherMethod": {"type": "ByUser"},
                        "rules": [rule],
                    },
                }
                status, data = admin.request("POST", "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas", body)
                if status not in (201, 409):
                    raise HttpError(status, data)

    def schema(self, label: str, cls: str) -> str:
        return f"{self.PREFIX}{label}-{cls.replace('_', '-')}"

    def snapshot(self) -> dict[tuple[str, str], int]:
        """(identity, class) -> requests dispatched so far."""
        status, data = self.admin.request("GET", "/metrics")
        if status != 200:
            raise HttpError(status, data)
        by_schema: Counter[str] = Counter()
        for labels, value in parse_prometheus(data.decode(), "apiserver_flowcontrol_dispatched_requests_total"):
            by_schema[labels.get("flow_schema", "")] += int(value)
        return {
            (label, cls): by_schema[self.schema(label, cls)]
            for label in self.identities
            for cls, *_ in ATTRIBUTION_CLASSES
        }

    @staticmethod
    def diff(after: dict[tuple[str, str], int], before: dict[tuple[str, str], int]) -> dict[str, dict[str, int]]:
        """identity -> class -> requests between two snapshots."""
        out: dict[str, dict[str, int]] = {}
        for (label, cls), value in after.items():
            out.setdefault(label, {})[cls] = value - before.get((label, cls), 0)
        return out


def scrape_operator(port: int) -> dict[str, float]:
    """Counters of the operator's own /metrics (flattened 'name{label=value}' -> value)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("coroner_") or " " not in line:
            continue
        name, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            out[name] = float(value)
    return out


def operator_status_writes(metrics: dict[str, float]) -> dict[str, float]:
    return {
        kind: metrics.get(f'coroner_status_writes_total{{kind="{kind}"}}', 0.0) for kind in ("conditions", "retirement")
    }


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- processes -------------------------------------------------------------------------------------


def _pdeathsig(argv: list[str], sig: str) -> list[str]:
    """Prefix with setpriv so the child gets `sig` if the benchmark dies without cleaning up."""
    setpriv = shutil.which("setpriv")
    return [setpriv, f"--pdeathsig={sig}", "--", *argv] if setpriv else argv


class Workers:
    """Real worker processes (`sleep`), all in one process group led by a holder process.

    Killed workers are reaped at once (as a container runtime would), so no zombie stands in
    /proc for a dead worker.
    """

    def __init__(self) -> None:
        self._holder = subprocess.Popen(_pdeathsig(["sleep", str(WORKER_SECONDS)], "KILL"), process_group=0)
        self.pgid = self._holder.pid
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def spawn(self, count: int) -> list[int]:
        pids = []
        for _ in range(count):
            proc = subprocess.Popen(
                _pdeathsig(["sleep", str(WORKER_SECONDS)], "KILL"),
                process_group=self.pgid,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.procs[proc.pid] = proc
            pids.append(proc.pid)
        # setpriv execs sleep in the same process: wait until every one is `sleep` (its incarnation
        # - pid and start time - does not change across exec, but a tidy /proc is nicer to read).
        deadline = time.monotonic() + 30
        for pid in pids:
            while time.monotonic() < deadline:
                try:
                    if pathlib.Path(f"/proc/{pid}/comm").read_text().strip() == "sleep":
                        break
                except OSError:
                    break
                time.sleep(0.001)
        return pids

    def kill(self, pid: int) -> float:
        """SIGKILL one worker; returns the monotonic time just before the signal. Reaps it."""
        proc = self.procs.pop(pid)
        moment = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        proc.wait()
        return moment

    def kill_many(self, pids: Iterable[int]) -> dict[int, float]:
        """SIGKILL all of them as fast as possible, then reap; returns each kill's moment."""
        moments = {}
        procs = []
        for pid in pids:
            proc = self.procs.pop(pid)
            moments[pid] = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            procs.append(proc)
        for proc in procs:
            proc.wait()
        return moments

    def alive(self, pid: int) -> bool:
        proc = self.procs.get(pid)
        return proc is not None and proc.poll() is None

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)
        for proc in [*self.procs.values(), self._holder]:
            with contextlib.suppress(Exception):
                proc.wait(timeout=10)
        self.procs.clear()


class Component:
    """A Coroner process (operator or agent) in its own session, logging to a file."""

    def __init__(self, name: str, argv: list[str], *, log_path: pathlib.Path) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as out:
            self.proc = subprocess.Popen(
                _pdeathsig(argv, "TERM"),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = self.proc.pid  # setpriv execs the component: same pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 60.0) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


class Node:
    """A simulated node: its name, its boot id file, its agent's node-bound token."""

    def __init__(self, bench: Bench, name: str, *, real_boot: bool) -> None:
        self.name = name
        self.boot_id = REAL_BOOT_ID_FILE.read_text().strip() if real_boot else str(uuid.uuid4())
        self.boot_file = bench.dir / f"{name}.boot_id"
        self.boot_file.write_text(self.boot_id + "\n")
        ensure_node(bench.cluster, name=name, boot_id=self.boot_id)
        self.kubeconfig = mint_token(bench.cluster, service_account=f"{SYSTEM}/coroner-agent", node=name)
        self.agent: Component | None = None


class Bench:
    """The benchmark's world: a private control plane with Coroner's manifests, and cleanup."""

    def __init__(self, name: str, *, keep: bool = False) -> None:
        self.name = name
        self.keep = keep
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix=f"coroner-bench-{name}-"))
        self.cluster: cluster_mod.Cluster = None  # type: ignore[assignment]
        self.components: list[Component] = []
        self.workers: Workers | None = None
        self._closers: list[Callable[[], None]] = []
        self.started = time.monotonic()

    def __enter__(self) -> Bench:
        signal.signal(signal.SIGTERM, _raise_interrupt)
        signal.signal(signal.SIGHUP, _raise_interrupt)
        log(f"starting a dev cluster in {self.dir}")
        try:
            # No kube-controller-manager: nothing here needs it, and its own requests would blur the
            # API server's request counts that the benchmarks attribute to Coroner.
            self.cluster = cluster_mod.up(self.dir / "cluster", controller_manager=False)
            self.kubectl("apply", "-k", str(MANIFESTS / "overlays" / "production"))
            self.kubectl("wait", "--for=condition=Established", f"crd/{api.CRD_NAME}", "--timeout=60s")
        except BaseException:
            self.close()
            raise
        self.admin = Http(Endpoint.admin(self.cluster))
        self.load = LoadMonitor().start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def on_close(self, closer: Callable[[], None]) -> None:
        self._closers.append(closer)

    def close(self) -> None:
        # Ctrl-C during cleanup must not leave things half-stopped.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for closer in reversed(self._closers):
                with contextlib.suppress(Exception):
                    closer()
            self._closers.clear()
            # Coroner's processes first: killing the workers under a running agent and operator
            # would only make them attest and retire a thousand deaths on the way out.
            for component in reversed(self.components):
                t0 = time.monotonic()
                with contextlib.suppress(Exception):
                    component.stop()
                if time.monotonic() - t0 > 5:
                    log(f"stopping {component.name} took {time.monotonic() - t0:.0f} s")
            if self.workers is not None:
                self.workers.close()
            if self.cluster is not None:
                with contextlib.suppress(Exception):
                    cluster_mod.down(self.cluster.directory)
            if self.keep:
                log(f"kept {self.dir} (logs in {self.dir}/logs and {self.dir}/cluster/logs)")
            else:
                shutil.rmtree(self.dir, ignore_errors=True)
        finally:
            signal.signal(signal.SIGINT, previous)

    # --- the cluster -------------------------------------------------------------------------

    def kubectl(self, *args: str) -> str:
        command = [str(self.cluster.binary("kubectl")), f"--kubeconfig={self.cluster.kubeconfig}", *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{shlex.join(command)} failed:\n{result.stdout}\n{result.stderr}")
        return result.stdout

    def namespace(self, name: str) -> None:
        status, data = self.admin.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
        if status not in (201, 409):
            raise HttpError(status, data)

    def worker_identity(self, namespaces: Sequence[str]) -> pathlib.Path:
        """A worker ServiceAccount (in the first namespace) bound to coroner-worker in every one."""
        home = namespaces[0]
        for ns in namespaces:
            self.namespace(ns)
            body = {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "bench-worker", "namespace": ns},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "coroner-worker"},
                "subjects": [{"kind": "ServiceAccount", "name": "worker", "namespace": home}],
            }
            status, data = self.admin.request(
                "POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", body
            )
            if status not in (201, 409):
                raise HttpError(status, data)
        return mint_token(self.cluster, service_account=f"{home}/worker")

    def nodes(self, count: int) -> list[Node]:
        """node-1 uses this machine's real boot id, the others a random one (simulated nodes)."""
        return [Node(self, f"node-{i}", real_boot=(i == 1)) for i in range(1, count + 1)]

    # --- Coroner's processes -----------------------------------------------------------------

    def start_operator(self, *extra: str, metrics_port: int) -> Component:
        token = mint_token(self.cluster, service_account=f"{SYSTEM}/coroner-operator")
        argv = [
            str(BIN / "coroner-operator"),
            f"--kubeconfig={token}",
            f"--metrics-port={metrics_port}",
            "--metrics-bind-address=127.0.0.1",
            *extra,
        ]
        component = Component("operator", argv, log_path=self.dir / "logs" / "operator.log")
        self.components.append(component)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not component.running():
                raise RuntimeError(f"the operator exited; see {component.log_path}:\n{tail(component.log_path)}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                scrape_operator(metrics_port)
                return component
            time.sleep(0.2)
        raise RuntimeError(f"the operator did not serve /metrics within 60 s; see {component.log_path}")

    def start_agent(self, node: Node, *extra: str) -> Component:
        argv = [
            str(BIN / "coroner-agent"),
            f"--node-name={node.name}",
            f"--kubeconfig={node.kubeconfig}",
            f"--boot-id-file={node.boot_file}",
            # A benchmark's agents are stopped among live workers (restarts, phase changes, cleanup):
            # a restart, not a node drain, so no waiting for the node's workers to exit on SIGTERM.
            *(["--shutdown-grace-seconds=0"] if agent_supports("--shutdown-grace-seconds") else []),
            *extra,
        ]
        component = Component(f"agent-{node.name}", argv, log_path=self.dir / "logs" / f"agent-{node.name}.log")
        self.components.append(component)
        node.agent = component
        return component

    def stop_component(self, component: Component) -> None:
        component.stop()
        with contextlib.suppress(ValueError):
            self.components.remove(component)

    def spawn_workers(self, count: int) -> list[int]:
        if self.workers is None:
            self.workers = Workers()
        return self.workers.spawn(count)


def _raise_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def tail(path: pathlib.Path, lines: int = 20) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:])
    except OSError:
        return "(no log)"


# --- registering workers ---------------------------------------------------------------------------


#: What the benchmarks register without `--heartbeat` while the product still requires
#: spec.heartbeat (before issue 14's opt-in heartbeats land): a spec no benchmark outlives, and
#: no heartbeat is ever sent. Once `coroner.launcher.register` takes `interval_seconds=None`, no
#: spec.heartbeat is written at all.
STAND_IN_HEARTBEAT = (3600, 10800)


def heartbeats_optional() -> bool:
    """Whether this build's launcher registers without a heartbeat (issue 14: `interval_seconds`
    and `ttl_seconds` default to None, and spec.heartbeat is written only when both are given)."""
    import inspect

    from coroner.launcher import register

    params = inspect.signature(register).parameters
    return "interval_seconds" in params and params["interval_seconds"].default is None


def heartbeat_spec(interval: int | None, ttl: int | None) -> tuple[int | None, int | None, dict[str, Any]]:
    """What to pass `register` for a benchmark that wants heartbeats (both given) or none (both
    None), and a description for the result file's parameters."""
    if interval is not None and ttl is not None:
        return interval, ttl, {"mode": "heartbeats", "interval_seconds": interval, "ttl_seconds": ttl}
    if heartbeats_optional():
        return None, None, {"mode": "none", "spec_heartbeat_written": False}
    stand_in_interval, stand_in_ttl = STAND_IN_HEARTBEAT
    log(
        "this build's launcher still requires a heartbeat spec (issue 14 not landed): registering with "
        f"intervalSeconds={stand_in_interval}, ttlSeconds={stand_in_ttl} and sending no heartbeats"
    )
    return (
        stand_in_interval,
        stand_in_ttl,
        {
            "mode": "none",
            "spec_heartbeat_written": True,
            "stand_in_spec": {"intervalSeconds": stand_in_interval, "ttlSeconds": stand_in_ttl},
            "note": "this build's launcher and CRD still require spec.heartbeat; no heartbeat was sent after "
            "the one register() sends on creation",
        },
    )


_AGENT_HELP: str | None = None


def agent_supports(flag: str) -> bool:
    """Whether this build's coroner-agent accepts `flag` (from its --help, read once)."""
    global _AGENT_HELP
    if _AGENT_HELP is None:
        result = subprocess.run(
            [str(BIN / "coroner-agent"), "--help"], capture_output=True, text=True, timeout=60, check=False
        )
        _AGENT_HELP = result.stdout + result.stderr
    return re.search(rf"(^|\s){re.escape(flag)}([\s=,]|$)", _AGENT_HELP, re.MULTILINE) is not None


def register_all(
    kubeconfig: pathlib.Path,
    items: Sequence[tuple[str, str, int, pathlib.Path]],
    *,
    interval: int | None,
    ttl: int | None,
    threads: int = 8,
) -> list[tuple[str, str]]:
    """Registers each (namespace, node, pid, boot_id_file) exactly as a launcher does:
    `coroner.launcher.probe_incarnation` + `coroner.launcher.register`, with a client for the
    worker ServiceAccount, `threads` requests in flight. interval/ttl None: no heartbeat spec (see
    `heartbeat_spec`; resolve them with it first). Returns (namespace, name) in input order."""
    from concurrent.futures import ThreadPoolExecutor

    from coroner.client.kube import api_client
    from coroner.launcher import probe_incarnation, register

    client = api_client(kubeconfig)
    client.rest_client.pool_manager.connection_pool_kw["maxsize"] = threads
    if (interval is None or ttl is None) and not heartbeats_optional():
        raise ValueError("this build's launcher requires a heartbeat spec: resolve it with heartbeat_spec() first")
    heartbeat = {"interval_seconds": interval, "ttl_seconds": ttl}

    def one(item: tuple[str, str, int, pathlib.Path]) -> tuple[str, str]:
        namespace, node, pid, boot_file = item
        incarnation = probe_incarnation(pid, node_name=node, boot_id_file=str(boot_file))
        registration = register(
            client=client,
            namespace=namespace,
            node_name=node,
            incarnation=incarnation,
            name=f"w-{node}-{pid}",
            role="bench-worker",
            **heartbeat,
        )
        return namespace, registration.name

    try:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            return list(pool.map(one, items))
    finally:
        client.close()


# --- heartbeats ------------------------------------------------------------------------------------


class Heartbeater:
    """Heartbeats many registrations from this process, spread evenly over the interval.

    One scheduler thread hands due heartbeats to a few sender threads (one keep-alive connection
    each). Each heartbeat is the launcher's own: a merge patch of status.lastHeartbeatTime, by
    the worker's identity. `stop_one` stops a worker's heartbeats (called just before it is killed,
    as a dead worker's launcher stops too). Counts every request it sends, so the API server's
    request counts can be corrected for them.
    """

    def __init__(
        self,
        endpoint: Endpoint | None,
        *,
        interval: float,
        senders: int = 32,
        max_seconds: float = 4 * 3600,
        build: Callable[[tuple[str, str]], tuple[Http, str, str, Any, str]] | None = None,
    ) -> None:
        self.http = Http(endpoint) if endpoint is not None else None
        self.build = build or self._heartbeat
        self.last: dict[tuple[str, str], str] = {}
        self.interval = interval
        self.senders = senders
        self.deadline = time.monotonic() + max_seconds
        self._heap: list[tuple[float, int, tuple[str, str]]] = []
        self._seq = 0
        self._active: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._queue: queue.Queue[tuple[tuple[str, str], float] | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self.sent = 0
        self.ok = 0
        self.failed: Counter[str] = Counter()
        self.lags: list[tuple[float, float]] = []  # (due, lag) of every answered request
        self.last_ok_at: dict[tuple[str, str], float] = {}
        self.rtts: list[float] = []

    def start(self, keys: Sequence[tuple[str, str]]) -> None:
        """Starts heartbeating `keys`, first beats spread evenly over one interval from now."""
        now = time.monotonic()
        order = list(keys)
        random.shuffle(order)
        with self._lock:
            for i, key in enumerate(order):
                self._active.add(key)
                self.last_ok_at.setdefault(key, now)  # registered (with a heartbeat) just before
                self._push(now + self.interval * (i + 1) / max(1, len(order)), key)
        self._ensure_threads()
        self._wake.set()

    def _ensure_threads(self) -> None:
        if not self._threads:
            self._threads.append(threading.Thread(target=self._schedule, name="heartbeat-scheduler", daemon=True))
            for i in range(self.senders):
                self._threads.append(threading.Thread(target=self._send_loop, name=f"heartbeat-{i}", daemon=True))
            for thread in self._threads:
                thread.start()

    def add(self, keys: Sequence[tuple[str, str]]) -> None:
        """More registrations, each starting at a random phase (they just heartbeated on creation)."""
        now = time.monotonic()
        with self._lock:
            for key in keys:
                self._active.add(key)
                self.last_ok_at.setdefault(key, now)
                self._push(now + random.uniform(0, self.interval), key)
        self._ensure_threads()
        self._wake.set()

    def stop_one(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._active.discard(key)

    def _push(self, due: float, key: tuple[str, str]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (due, self._seq, key))

    def _schedule(self) -> None:
        while not self._stop.is_set() and time.monotonic() < self.deadline:
            now = time.monotonic()
            with self._lock:
                while self._heap and self._heap[0][0] <= now:
                    due, _, key = heapq.heappop(self._heap)
                    if key in self._active:
                        self._queue.put((key, due))
                        self._push(due + self.interval, key)
                wait = (self._heap[0][0] - now) if self._heap else 1.0
            self._wake.wait(timeout=min(1.0, max(0.0, wait)))
            self._wake.clear()

    def _send_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            key, due = item
            if self._stop.is_set():
                continue  # closing: drop the backlog, send nothing more
            with self._lock:
                if key not in self._active:
                    continue
            http_, method, path, body, content_type = self.build(key)
            started = time.monotonic()
            try:
                status, _ = http_.request(method, path, body, content_type=content_type)
            except Exception as exc:
                with self._lock:
                    self.failed[type(exc).__name__] += 1
                continue
            with self._lock:
                self.sent += 1
                if status == 200:
                    self.ok += 1
                    if isinstance(body, dict) and "lastHeartbeatTime" in (body.get("status") or {}):
                        self.last[key] = body["status"]["lastHeartbeatTime"]
                else:
                    self.failed[str(status)] += 1
                if len(self.lags) < 2_000_000:
                    self.lags.append((due, started - due))
                    self.rtts.append(time.monotonic() - started)
                if status == 200:
                    self.last_ok_at[key] = time.monotonic()

    def _heartbeat(self, key: tuple[str, str]) -> tuple[Http, str, str, Any, str]:
        assert self.http is not None
        namespace, name = key
        body = {"status": {"lastHeartbeatTime": now_text()}}
        return (
            self.http,
            "PATCH",
            registrations_path(namespace, name, status=True),
            body,
            "application/merge-patch+json",
        )

    def counts(self) -> tuple[int, int]:
        """(requests answered so far, of which 200)."""
        with self._lock:
            return self.sent, self.ok

    def lag_summary(self, start: float | None = None, end: float | None = None) -> dict[str, Any]:
        """How late heartbeats left relative to their schedule (all, or those due in [start, end])."""
        with self._lock:
            lags = [lag for due, lag in self.lags if (start is None or due >= start) and (end is None or due <= end)]
            rtts = list(self.rtts[-20000:])
        summary = percentiles(lags)
        rtt = percentiles(rtts)
        return {
            "round_trip_p50_ms_recent": rtt["p50_ms"],
            "round_trip_p99_ms_recent": rtt["p99_ms"],
            "schedule_lag_p50_ms": summary["p50_ms"],
            "schedule_lag_p99_ms": summary["p99_ms"],
            "schedule_lag_max_ms": summary["max_ms"],
            "heartbeats": summary["n"],
            "sent_total": self.sent,
            "ok_total": self.ok,
            "failed_total": dict(self.failed),
        }

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        for _ in range(self.senders):
            self._queue.put(None)
        deadline = time.monotonic() + 30  # a sender may be inside one request (timeout 30 s)
        for thread in self._threads:
            thread.join(timeout=max(0.1, deadline - time.monotonic()))
        if self.http is not None:
            self.http.close()


# --- watching registrations ------------------------------------------------------------------------


class Watch:
    """A list-then-watch of workerregistrations (all namespaces) as admin, in a thread.

    `on_event(type, obj, monotonic_arrival)` runs in the watch thread for the initial list (as
    ADDED) and every event. Re-watches from the last resourceVersion when the server closes the
    stream; relists on 410. Bounded by `max_seconds`.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        on_event: Callable[[str, dict[str, Any], float], None],
        *,
        path: str | None = None,
        max_seconds: float = 4 * 3600,
    ) -> None:
        self.endpoint = endpoint
        self.on_event = on_event
        self.path = path or registrations_path()
        self.deadline = time.monotonic() + max_seconds
        self._stop = threading.Event()
        self._conn: http.client.HTTPSConnection | None = None
        self.synced = threading.Event()
        self.errors = 0
        self.thread = threading.Thread(target=self._run, name="watch", daemon=True)

    def start(self) -> Watch:
        self.thread.start()
        if not self.synced.wait(timeout=120):
            raise RuntimeError("the benchmark's watch did not sync within 120 s")
        return self

    def _list(self) -> str:
        http_ = Http(self.endpoint, timeout=120)
        try:
            body = http_.json("GET", self.path)
        finally:
            http_.close()
        now = time.monotonic()
        for item in body.get("items", []):
            self.on_event("ADDED", item, now)
        return str(body["metadata"]["resourceVersion"])

    def _run(self) -> None:
        rv = None
        while not self._stop.is_set() and time.monotonic() < self.deadline:
            try:
                if rv is None:
                    rv = self._list()
                    self.synced.set()
                rv = self._stream(rv)
            except Exception:
                if self._stop.is_set():
                    return
                self.errors += 1
                time.sleep(min(5.0, 0.2 * self.errors))

    def _stream(self, rv: str) -> str | None:
        conn = self.endpoint.connect(timeout=330)
        self._conn = conn
        try:
            query = f"?watch=1&allowWatchBookmarks=true&timeoutSeconds=300&resourceVersion={rv}"
            conn.request("GET", self.path + query, headers=self.endpoint.headers())
            response = conn.getresponse()
            if response.status != 200:
                response.read()
                return None if response.status == 410 else rv
            buffer = b""
            while not self._stop.is_set():
                chunk = response.read1(1 << 20)
                if not chunk:
                    return rv
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if not line.strip():
                        continue
                    arrived = time.monotonic()
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    kind = event.get("type")
                    if kind == "ERROR":
                        return None if obj.get("code") == 410 else rv
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if kind != "BOOKMARK":
                        self.on_event(kind, obj, arrived)
            return rv
        finally:
            self._conn = None
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        self._stop.set()
        conn = self._conn
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.sock.shutdown(2)  # type: ignore[union-attr]
        self.thread.join(timeout=10)


def summarize(obj: dict[str, Any]) -> dict[str, Any]:
    """What the benchmarks track of one registration."""
    status = obj.get("status") or {}
    attestation = status.get("attestation") or {}
    retirable = next((c for c in status.get("conditions") or [] if c.get("type") == "Retirable"), {})
    return {
        "rv": (obj.get("metadata") or {}).get("resourceVersion"),
        "verdict": attestation.get("verdict"),
        "evidence": attestation.get("evidence"),
        "reason": retirable.get("reason"),
        "retired": "retirement" in status,
        "retired_reason": (status.get("retirement") or {}).get("reason"),
        "observed_time": attestation.get("observedTime"),
        "retired_time": (status.get("retirement") or {}).get("retiredTime"),
    }


#: time.time() - time.monotonic(): turns the wall-clock stamps Coroner writes (observedTime,
#: retiredTime; same machine, same clock) into the benchmark's monotonic time line.
WALL_OFFSET = time.time() - time.monotonic()


def stamp_to_monotonic(text: str | None) -> float | None:
    moment = model.parse_time(text) if text else None
    return None if moment is None else moment.timestamp() - WALL_OFFSET


def stages(tracker: Tracker, killed: dict[tuple[str, str], float]) -> dict[str, Any]:
    """Where the time goes, per kill: the agent's probe (attestation observedTime), the Dead
    attestation seen on the watch, the operator's retirement write (retiredTime), the retirement
    seen on the watch. Coroner's stamps are wall-clock times of this same machine."""
    probe, dead_seen, written, retired_seen = [], [], [], []
    with tracker.cond:
        for key, moment in killed.items():
            observed = tracker.dead_observed.get(key)
            if observed is not None:
                probe.append(observed - moment)
            if key in tracker.dead_at:
                dead_seen.append(tracker.dead_at[key] - moment)
            retired_time = stamp_to_monotonic((tracker.state.get(key) or {}).get("retired_time"))
            if retired_time is not None:
                written.append(retired_time - moment)
            if key in tracker.retired_at:
                retired_seen.append(tracker.retired_at[key] - moment)
    return {
        "kill_to_agent_probe": percentiles(probe),
        "kill_to_dead_attestation_seen": percentiles(dead_seen),
        "kill_to_retirement_write": percentiles(written),
        "kill_to_retired_seen": percentiles(retired_seen),
        "how": "agent probe = the Dead attestation's observedTime; retirement write = retirement.retiredTime "
        "(both written by Coroner with this machine's clock, which has 1 us resolution); 'seen' = arrival "
        "on the benchmark's watch",
    }


class Tracker:
    """Latest summary of every registration, fed by a Watch; wakes waiters on every event."""

    def __init__(self) -> None:
        self.state: dict[tuple[str, str], dict[str, Any]] = {}
        self.deleted: dict[tuple[str, str], float] = {}
        self.retired_at: dict[tuple[str, str], float] = {}
        self.dead_at: dict[tuple[str, str], float] = {}  # first Dead attestation seen
        self.dead_observed: dict[tuple[str, str], float] = {}  # its observedTime (monotonic)
        self.events = 0
        self.cond = threading.Condition()
        self.hooks: list[Callable[[str, dict[str, Any], float], None]] = []

    def on_event(self, kind: str, obj: dict[str, Any], arrived: float) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        for hook in self.hooks:
            hook(kind, obj, arrived)
        with self.cond:
            self.events += 1
            if kind == "DELETED":
                self.state.pop(key, None)
                self.deleted.setdefault(key, arrived)
            else:
                summary = summarize(obj)
                self.state[key] = summary
                if summary["retired"]:
                    self.retired_at.setdefault(key, arrived)
                if summary["verdict"] == "Dead" and key not in self.dead_at:
                    self.dead_at[key] = arrived
                    observed = stamp_to_monotonic(summary["observed_time"])
                    if observed is not None:
                        self.dead_observed[key] = observed
            self.cond.notify_all()

    def wait_until(self, predicate: Callable[[], bool], *, timeout: float, what: str, poll: float = 1.0) -> bool:
        """Waits (bounded) until predicate() holds; logs progress; False on timeout (never raises)."""
        deadline = time.monotonic() + timeout
        next_log = time.monotonic() + 15
        with self.cond:
            while True:
                if predicate():
                    return True
                now = time.monotonic()
                if now >= deadline:
                    log(f"gave up waiting for {what} after {timeout:.0f} s")
                    return False
                if now >= next_log:
                    log(f"still waiting for {what} ...")
                    next_log = now + 15
                self.cond.wait(timeout=min(poll, deadline - now))


class Sampler:
    """psutil samples (rss, cpu seconds, fds) of some pids, every `period` seconds, in a thread."""

    def __init__(self, pids: dict[str, int], *, period: float = 1.0, max_seconds: float = 3600) -> None:
        self.procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.period = period
        self.deadline = time.monotonic() + max_seconds
        self.samples: dict[str, list[tuple[float, float, float, int]]] = {name: [] for name in pids}
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def start(self) -> Sampler:
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set() and time.monotonic() < self.deadline:
            now = time.monotonic()
            for name, proc in self.procs.items():
                with contextlib.suppress(psutil.Error), proc.oneshot():
                    times = proc.cpu_times()
                    self.samples[name].append(
                        (now, proc.memory_info().rss / 2**20, times.user + times.system, proc.num_fds())
                    )
            self._stop.wait(self.period)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=10)


class LoadMonitor:
    """How busy the shared machine was: load average, and CPU used by this benchmark's process tree
    (the benchmark, the control plane, Coroner, the workers) versus everything else on the machine
    (other sessions' work). Sampled every `period` seconds in a thread."""

    def __init__(self, *, period: float = 5.0, max_seconds: float = 4 * 3600) -> None:
        self.period = period
        self.deadline = time.monotonic() + max_seconds
        self.me = psutil.Process()
        self.samples: list[tuple[float, float, float, float]] = []  # t, load1, machine busy cores, ours cores
        self._stop = threading.Event()
        self._ours: dict[int, float] = {}
        self.thread = threading.Thread(target=self._run, name="load-monitor", daemon=True)

    def start(self) -> LoadMonitor:
        self.thread.start()
        return self

    def _ours_seconds(self) -> float:
        procs = [self.me]
        with contextlib.suppress(psutil.Error):
            procs += self.me.children(recursive=True)
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                # A process that exits keeps its last reading here (its last seconds go uncounted).
                self._ours[proc.pid] = times.user + times.system
        return sum(self._ours.values())

    def _run(self) -> None:
        last_t, last_busy, last_ours = time.monotonic(), _busy_seconds(), self._ours_seconds()
        while not self._stop.wait(self.period) and time.monotonic() < self.deadline:
            now, busy, ours = time.monotonic(), _busy_seconds(), self._ours_seconds()
            dt = now - last_t
            self.samples.append((now, os.getloadavg()[0], (busy - last_busy) / dt, max(0.0, (ours - last_ours) / dt)))
            last_t, last_busy, last_ours = now, busy, ours

    def summary(self) -> dict[str, Any]:
        self._stop.set()
        self.thread.join(timeout=10)
        if not self.samples:
            return {}
        loads = [s[1] for s in self.samples]
        busy = [s[2] for s in self.samples]
        ours = [s[3] for s in self.samples]
        other = [max(0.0, b - o) for b, o in zip(busy, ours, strict=True)]
        return {
            "load_average_1m": {
                "min": round(min(loads), 2),
                "mean": round(statistics.fmean(loads), 2),
                "max": round(max(loads), 2),
            },
            "machine_busy_cores_mean": round(statistics.fmean(busy), 2),
            "this_benchmark_cores_mean": round(statistics.fmean(ours), 2),
            "other_work_cores_mean": round(statistics.fmean(other), 2),
            "other_work_cores_max": round(max(other), 2),
            "how": f"sampled every {self.period:g} s over the whole run: machine busy time from /proc/stat; this "
            "benchmark = its own process tree (control plane, Coroner, workers, benchmark); other = the rest",
        }


def _busy_seconds() -> float:
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


class Profile:
    """py-spy sampling one process (raw collapsed stacks) for a fixed time, in the background."""

    def __init__(self, bench: Bench, pid: int, *, name: str, seconds: float) -> None:
        RESULTS.mkdir(parents=True, exist_ok=True)
        self.path = RESULTS / f"{name}.pyspy.txt"
        self.seconds = seconds
        self.proc = subprocess.Popen(
            [
                str(BIN / "py-spy"),
                "record",
                "--format",
                "raw",
                "--nonblocking",
                "--rate",
                "50",
                "--output",
                str(self.path),
                "--pid",
                str(pid),
                "--duration",
                str(max(1, int(seconds))),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        bench.on_close(self.wait)

    def wait(self) -> None:
        try:
            self.proc.wait(timeout=self.seconds + 30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def summary(self) -> dict[str, Any]:
        self.wait()
        return {"file": str(self.path.relative_to(REPO)), **top_frames(self.path)}


def py_spy(bench: Bench, pid: int, *, name: str, seconds: float) -> Profile | None:
    """Starts py-spy on `pid` for `seconds` (None, with a message, when py-spy is not installed)."""
    if not (BIN / "py-spy").exists():
        log("py-spy is not installed: no profile (install it with `.venv/bin/pip install py-spy`)")
        return None
    return Profile(bench, pid, name=name, seconds=seconds)


def top_frames(path: pathlib.Path, *, limit: int = 15) -> dict[str, Any]:
    """From py-spy's raw output: the share of samples in which each function appears (inclusive)
    and is the innermost frame (self), top `limit` of each."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        stack, _, count_text = line.rpartition(" ")
        try:
            count = int(count_text)
        except ValueError:
            continue
        frames = [
            f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0].rsplit("/", 1)[-1] + ")" if " (" in f else f
            for f in stack.split(";")[1:]
        ]  # first frame is the thread
        total += count
        for frame in set(frames):
            inclusive[frame] += count
        if frames:
            own[frames[-1]] += count
    if not total:
        return {}
    return {
        "samples": total,
        "inclusive_percent": {k: round(100 * v / total, 1) for k, v in inclusive.most_common(limit)},
        "self_percent": {k: round(100 * v / total, 1) for k, v in own.most_common(limit)},
    }
