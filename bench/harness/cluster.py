"""The benchmark's cluster: a private control plane with Coroner's manifests, Coroner's own
processes on it, the API clients (`coroner.client.rest`, as Coroner's components speak), a watch
of the registrations, and the API server's and the operator's metrics."""

from __future__ import annotations

import contextlib
import http.client
import pathlib
import re
import shutil
import signal
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from coroner.client.rest import ApiError, Rest, list_pages, registrations_path, warming_up
from coroner.core import api, kubewire, wire
from coroner_dev import fleet
from coroner_dev.devcluster import cluster as cluster_mod
from coroner_operator.kubeapi import ADMISSION_RESOURCES
from harness.machine import LoadMonitor, log, tail
from harness.workers import Workers

# --- API clients ---------------------------------------------------------------------------------------


def client(kubeconfig: pathlib.Path | str, *, pool_size: int = 16, timeout: float = 30.0) -> Rest:
    """A client for the identity of `kubeconfig` (the admin's, or a minted token's), `pool_size`
    connections kept alive for as many threads."""
    rest = Rest.from_kubeconfig(kubeconfig, pool_size=pool_size, timeout=timeout, user_agent="coroner-bench")
    assert urllib.parse.urlsplit(rest.server).hostname in ("127.0.0.1", "localhost", "::1"), (
        "benchmarks talk to loopback only"
    )
    return rest


def registrant_annotation(client: Rest) -> dict[str, str]:
    """The annotation a registration created by `client` must carry (admission policy
    coroner-registrant-recorded admits exactly the requester), from one SelfSubjectReview, as the
    launcher asks it."""
    named = kubewire.registrant(
        client.request("POST", kubewire.SELF_SUBJECT_REVIEW_PATH, body=dict(kubewire.SELF_SUBJECT_REVIEW))
    )
    if named is None:
        raise ValueError("the API server's SelfSubjectReview named no user")
    return {api.REGISTERED_BY_ANNOTATION: named}


def create(client: Rest, path: str, body: dict[str, Any]) -> None:
    """POSTs `body`; an object that already exists (409) is fine."""
    status, data = client.send("POST", path, body=body)
    if status not in (200, 201, 409):
        raise ApiError(status, "", data.decode(errors="replace"))


def create_admitted(client: Rest, path: str, body: dict[str, Any], *, timeout: float = 120.0) -> dict[str, Any]:
    """POSTs `body`, again while the API server answers a warming-up refusal (`warming_up`: a
    fresh or restarted API server's busy answers and its not-yet-synced 401 and 403), as the
    tests' creates and the launcher do; any other answer is raised."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            created: dict[str, Any] = client.request("POST", path, body=body)
            return created
        except ApiError as error:
            if not warming_up(error) or time.monotonic() > deadline:
                raise
        time.sleep(0.5)


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


def metrics_text(client: Rest) -> str:
    """The API server's /metrics (Prometheus text)."""
    status, data = client.send("GET", "/metrics")
    if status != 200:
        raise ApiError(status, "", data.decode(errors="replace"))
    return data.decode()


def apiserver_requests(admin: Rest) -> Counter[RequestKey]:
    """apiserver_request_total summed over codes, keyed by (verb, group, resource, subresource)."""
    counts: Counter[RequestKey] = Counter()
    for labels, value in parse_prometheus(metrics_text(admin), "apiserver_request_total"):
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


#: The watch cache's wait before a consistent read: a LIST without a resourceVersion is served from
#: the API server's watch cache once the cache has caught up with etcd's current revision, which
#: for a rarely written resource takes a progress notification from etcd (asked for every 100 ms
#: while a read waits).
CACHE_READ_WAIT = "apiserver_watch_cache_read_wait_seconds"
CACHE_READ_WAIT_BOUNDS_MS = (25, 50, 100, 200)


def cache_read_waits(admin: Rest) -> dict[str, dict[str, float]]:
    """`CACHE_READ_WAIT` per resource: its cumulative buckets (``le=<seconds>``), count and sum."""
    text = metrics_text(admin)
    out: dict[str, dict[str, float]] = {}
    for suffix in ("bucket", "count", "sum"):
        for labels, value in parse_prometheus(text, f"{CACHE_READ_WAIT}_{suffix}"):
            group, resource_ = labels.get("group", ""), labels.get("resource", "")
            entry = out.setdefault(f"{group}/{resource_}" if group else resource_, {})
            entry[f"le={labels.get('le')}" if suffix == "bucket" else suffix] = value
    return out


#: The resources the operator reads with a consistent LIST right before a retirement: the Lease
#: fence and the admission kinds it verifies.
RETIREMENT_READS = (
    "coordination.k8s.io/leases",
    *(f"admissionregistration.k8s.io/{plural}" for plural in ADMISSION_RESOURCES.values()),
)


def diff_cache_read_waits(
    after: dict[str, dict[str, float]], before: dict[str, dict[str, float]], *, resources: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Per resource of `resources` read in between: the reads, their mean wait, and the share that
    waited longer than each of `CACHE_READ_WAIT_BOUNDS_MS`."""
    out: dict[str, dict[str, Any]] = {}
    for resource_ in resources:
        now, then = after.get(resource_, {}), before.get(resource_, {})
        reads = now.get("count", 0.0) - then.get("count", 0.0)
        if reads <= 0:
            continue
        longer = {}
        for bound in CACHE_READ_WAIT_BOUNDS_MS:
            key = f"le={bound / 1000:g}"
            if key in now:
                longer[str(bound)] = round(1 - (now[key] - then.get(key, 0.0)) / reads, 3)
        out[resource_] = {
            "reads": int(reads),
            "mean_ms": round(1000 * (now.get("sum", 0.0) - then.get("sum", 0.0)) / reads, 1),
            "share_waiting_over_ms": longer,
        }
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

    def __init__(self, admin: Rest, identities: dict[str, tuple[str, str]]) -> None:
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
                create(admin, "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas", body)

    def schema(self, label: str, cls: str) -> str:
        return f"{self.PREFIX}{label}-{cls.replace('_', '-')}"

    def snapshot(self) -> dict[tuple[str, str], int]:
        """(identity, class) -> requests dispatched so far."""
        by_schema: Counter[str] = Counter()
        for labels, value in parse_prometheus(
            metrics_text(self.admin), "apiserver_flowcontrol_dispatched_requests_total"
        ):
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
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
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


# --- processes -------------------------------------------------------------------------------------


class Component:
    """A Coroner process (operator or agent) started by `coroner_dev.fleet`, logging to a file."""

    def __init__(self, name: str, argv: list[str], *, log_path: pathlib.Path) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.proc = fleet.spawn(argv, log=log_path)
        self.pid = self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 60.0) -> None:
        fleet.stop(self.proc, timeout=timeout)


class Node:
    """A simulated node (`coroner_dev.fleet.Node`: its boot id file, its agent's node-bound token)
    and the agent the benchmark runs for it."""

    def __init__(self, bench: Bench, name: str, *, real_boot: bool) -> None:
        boot_id = fleet.real_boot_id() if real_boot else None
        self.node = fleet.node(bench.cluster, name=name, directory=bench.dir, boot_id=boot_id)
        self.name = name
        self.boot_id = self.node.boot_id
        self.boot_file = self.node.boot_file
        self.kubeconfig = self.node.kubeconfig
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
            self.cluster = fleet.up(directory=self.dir / "cluster", controller_manager=False)
            fleet.install(self.cluster, grant=True)
        except BaseException:
            self.close()
            raise
        self.admin = client(self.cluster.kubeconfig)
        self._wait_for_admission()
        self.load = LoadMonitor().start()
        return self

    def _wait_for_admission(self, timeout: float = 180.0, *, in_a_row: int = 3) -> None:
        """Waits until a registration create gets through admission: right after the CRD is created
        the API server can answer 503 ("Resource kind ... not found") while it learns the CRD's
        schema, and a benchmark's first create would die on it. A server-side dry run of a valid
        registration (the launcher's wire shape, with the admin's registrant annotation) is admitted
        and stores nothing; `in_a_row` admitted answers in a row mean admission
        is ready (one can be followed by another 503 while the schema settles). Creates still go
        through `create_admitted`, which outlasts a late one."""
        probe = wire.registration_body(
            name="admission-probe",
            namespace="default",
            node_name="admission-probe",
            incarnation={
                "bootId": "00000000-0000-4000-8000-000000000000",
                "pidNamespace": "4026531836",
                "pid": 1,
                "startTime": "1",
                "hostId": "admission-probe",
            },
            client_instance_id="admission-probe",
        )
        probe["metadata"].setdefault("annotations", {}).update(registrant_annotation(self.admin))
        deadline = time.monotonic() + timeout
        admitted = 0
        while admitted < in_a_row:
            try:
                self.admin.request("POST", registrations_path("default"), query={"dryRun": "All"}, body=probe)
                admitted += 1
            except ApiError as error:
                if not warming_up(error):
                    raise
                admitted = 0
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.5)

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
        return fleet.kubectl_ok(self.cluster, *args)

    def namespace(self, name: str) -> None:
        create(self.admin, "/api/v1/namespaces", {"metadata": {"name": name}})

    def worker_identity(self, namespaces: Sequence[str]) -> pathlib.Path:
        """A worker ServiceAccount (in the first namespace) bound to coroner-worker in every one."""
        return fleet.worker_kubeconfig(self.cluster, namespaces=namespaces, binding="bench-worker")

    def nodes(self, count: int) -> list[Node]:
        """node-1 uses this machine's real boot id, the others a random one (simulated nodes)."""
        return [Node(self, f"node-{i}", real_boot=(i == 1)) for i in range(1, count + 1)]

    # --- Coroner's processes -----------------------------------------------------------------

    def start_operator(self, *extra: str, metrics_port: int) -> Component:
        argv = fleet.operator_argv(
            kubeconfig=fleet.operator_kubeconfig(self.cluster),
            extra=(f"--metrics-port={metrics_port}", "--metrics-bind-address=127.0.0.1", *extra),
        )
        component = Component("operator", argv, log_path=self.dir / "logs" / "operator.log")
        self.components.append(component)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not component.running():
                raise RuntimeError(f"the operator exited; see {component.log_path}:\n{tail(component.log_path)}")
            with contextlib.suppress(OSError, http.client.HTTPException):  # not serving yet
                scrape_operator(metrics_port)
                return component
            time.sleep(0.2)
        raise RuntimeError(f"the operator did not serve /metrics within 60 s; see {component.log_path}")

    def start_agent(self, node: Node, *extra: str) -> Component:
        argv = fleet.agent_argv(
            kubeconfig=node.kubeconfig,
            node=node.name,
            boot_id_file=node.boot_file,
            # A benchmark's agents are stopped among live workers (restarts, phase changes, cleanup):
            # a restart, not a node drain, so no waiting for the node's workers to exit on SIGTERM.
            extra=("--shutdown-grace-seconds=0", *extra),
        )
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


# --- watching registrations ------------------------------------------------------------------------


class Watch:
    """A list-then-watch of workerregistrations (all namespaces) as admin, in a thread.

    `on_event(type, obj, monotonic_arrival)` runs in the watch thread for the initial list (as
    ADDED) and every event. Re-watches from the last resourceVersion when the server closes the
    stream; relists on 410. Bounded by `max_seconds`.
    """

    #: How long each watch request lasts before the server ends it and it is re-made.
    WATCH_SECONDS = 60

    def __init__(
        self,
        admin: Rest,
        on_event: Callable[[str, dict[str, Any], float], None],
        *,
        path: str | None = None,
        max_seconds: float = 4 * 3600,
    ) -> None:
        self.client = admin
        self.on_event = on_event
        self.path = path or registrations_path()
        self.deadline = time.monotonic() + max_seconds
        self._stop = threading.Event()
        self.synced = threading.Event()
        self.errors = 0
        self.thread = threading.Thread(target=self._run, name="watch", daemon=True)

    #: Objects per page of the initial list (client-go's reflector pages too: one response of
    #: 150,000 registrations is hundreds of megabytes the API server and this process hold at once).
    PAGE = 2000

    def start(self, *, timeout: float = 120.0) -> Watch:
        self.thread.start()
        if not self.synced.wait(timeout=timeout):
            raise RuntimeError(f"the benchmark's watch did not sync within {timeout:g} s")
        return self

    def _list(self) -> str:
        rv = ""
        for page in list_pages(self.client, self.path, limit=self.PAGE):
            now = time.monotonic()
            for item in page.get("items", []):
                self.on_event("ADDED", item, now)
            rv = str(page["metadata"]["resourceVersion"])
        return rv

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
        """Watches from `rv` until the server ends the stream (or close()); the resourceVersion to go
        on from, or None to relist (410 Gone)."""
        query = {"allowWatchBookmarks": True, "resourceVersion": rv}
        try:
            for event in self.client.watch(self.path, query=query, timeout_seconds=self.WATCH_SECONDS):
                arrived = time.monotonic()
                obj = event.get("object") or {}
                kind = event.get("type")
                if kind == "ERROR":
                    return None if obj.get("code") == 410 else rv
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                if kind != "BOOKMARK":
                    self.on_event(kind, obj, arrived)
                if self._stop.is_set():
                    break
        except ApiError as exc:
            return None if exc.status == 410 else rv
        return rv

    def close(self) -> None:
        # The watch thread notices at its next event or bookmark, or when the server ends the
        # stream (WATCH_SECONDS); it is a daemon thread, and nothing waits for it past 10 s.
        self._stop.set()
        self.thread.join(timeout=10)
