"""Workers whose images hold nothing of Coroner, on the real node: the registrar.

Every worker here is `localhost/coroner-dev/go-worker:dev`, a static Go binary alone in a `scratch`
image (images/go-worker: no shell, no Python, no Coroner), in the manifests of examples/ exactly as
docs/workers.md shows them (tests/unit/test_examples.py holds the two equal). They are made image-free
workers both ways a user does it: `kubectl coroner inject -f examples/NAME.yaml` through the real
kubectl (its output compared with `coroner.core.inject`'s), and at admission, examples/statefulset.yaml's
label with manifests/components/registrar-injection installed. Either way the Pod gets
`shareProcessNamespace: true` and the native sidecar `coroner-registrar`
(`ghcr.io/coroner-dev/coroner-registrar:v0.1.0`, built here from images/registrar.Dockerfile and
imported into the node like the agent's image). The registrar registers the main process of each
other container under the Pod's own ServiceAccount (`worker`, bound to `coroner-worker` by
examples/rbac.yaml) and says goodbye for it when it exits 0 or by SIGTERM; every other death is the
agent's to attest. The OOM test alone runs a variant of examples/pod.yaml (a memory limit, and the
worker told to exceed it), injected by `coroner.core.inject`.

The test overlay (`on_this_node`) changes only what this node needs: the examples' namespace
`workers` becomes the test's own; their Pods get `hostNetwork` (no CNI here) and this node's
selector; the registrar's container gets the API server's loopback address, as the agent, the
operator and `coroner run` workers do here (`realnode.registrar_on_the_node`; for the policy, the
same two variables added to its mutation, `injection_component_on_the_node`). Nothing else of the
examples or the injection changes.

The host is used as a person with root on the node would use it: a container's processes are found
by their cgroup (the container id the kubelet reports is the leaf of their cgroup path), killed with
SIGKILL, and their incarnation read from /proc. "A container's start" is its main process's start
time as the kernel records it (/proc/PID/stat, 10 ms ticks since boot, read on this machine's wall
clock); "registered" and "attested Alive" are the moments a watch of the namespace's registrations
(`kubectl get --watch`) first shows the registration, and first shows it with verdict Alive; the
agent's own `observedTime` of that first Alive is recorded beside it. Each time is printed and
recorded with `record_property`.

A clean exit's goodbye (the registrar's `Released`) races the agent's Dead attestation of the same
exit and the operator's retirement (`PidfdExited`), as `coroner run`'s does (docs/cli.md): both are
true endings, and the product guarantees one of them, never which. So where a container exits
cleanly (a rollout restart, a completed Job, a deleted Pod) these tests assert that each old
incarnation is terminal, `Released` with CleanExit or else `Retired` with PidfdExited and dead, and
that no live incarnation is retired; they count and print how often each ending happened. They run
before test_3_node_loss, which ends the worker node.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime
import json
import os
import pathlib
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest
import yaml

from coroner.core import inject, procfs
from coroner_dev import realnode
from coroner_dev.devcluster.cluster import Cluster
from support.nodes import NODE, get_json, kubectl, registrations, state, verdict, wait_for
from support.plugin import BIN

pytestmark = [
    pytest.mark.node,
    # The measured times are recorded with record_property, which pytest's default junit family
    # (xunit2) warns about under --junitxml; they are written all the same.
    pytest.mark.filterwarnings("ignore:record_property is incompatible:pytest.PytestWarning"),
]

Registration = dict[str, Any]
WORKER = "worker"
#: The registrar registers a container's main process within its scan interval (0.5 s) of the start;
#: the agent attests it within its own interval. Generous bounds for a loaded machine.
REGISTERED_WITHIN_SECONDS = 30.0
TERMINAL_WITHIN_SECONDS = 60.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
INJECTION_COMPONENT = ROOT / "manifests" / "components" / "registrar-injection" / "registrar-injection.yaml"


# ---------------------------------------------------------------------------------------------
# Manifests: examples/ as docs/workers.md shows them, injected by `kubectl coroner inject` or at
# admission, then the test overlay.


def example(name: str) -> list[dict[str, Any]]:
    """The documents of examples/NAME.yaml, as written."""
    return list(yaml.safe_load_all((EXAMPLES / f"{name}.yaml").read_text()))


def on_this_node(cluster: Cluster, document: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The test overlay (`realnode.example_on_the_node`): the test's own namespace (for the example's
    `workers`), `hostNetwork` and this node for its Pods (no CNI here), and the registrar's container
    given the API server's loopback address."""
    return realnode.example_on_the_node(cluster, document, namespace=namespace, node=NODE)


def apply_here(cluster: Cluster, namespace: str, documents: Iterable[dict[str, Any]]) -> None:
    """The documents through the test overlay, applied; the example's RBAC first."""
    rbac = [on_this_node(cluster, d, namespace) for d in example("rbac")]
    realnode.apply_objects(cluster, [*rbac, *(on_this_node(cluster, d, namespace) for d in documents)])


def kubectl_coroner_inject(cluster: Cluster, path: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """`kubectl coroner inject -f PATH` through the real kubectl, which finds the plugin on PATH."""
    environment = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    command = [str(cluster.binary("kubectl")), "coroner", "inject", "-f", str(path)]
    return subprocess.run(command, capture_output=True, text=True, env=environment, timeout=120, check=False)


def injected_example(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    """`kubectl coroner inject -f examples/NAME.yaml`, as docs/workers.md says to run it: what it printed."""
    path = EXAMPLES / f"{name}.yaml"
    result = kubectl_coroner_inject(cluster, path)
    assert result.returncode == 0, result.stderr
    for document in example(name):
        assert f"{inject.describe(document)} injected ({path}, document 1)" in result.stderr, result.stderr
    printed = list(yaml.safe_load_all(result.stdout))
    assert printed == [inject.inject(d) for d in example(name)]  # the CLI prints what the function returns
    return printed


def run_injected(cluster: Cluster, namespace: str, *objects: dict[str, Any]) -> None:
    """A variant of an example (for what no example shows: an OOM kill) with the registrar injected by
    `coroner.core.inject` (what `kubectl coroner inject` prints), through the test overlay, applied."""
    apply_here(cluster, namespace, [inject.inject(o) for o in objects])


def variant(document: dict[str, Any], *, name: str, env: dict[str, str], memory: str) -> dict[str, Any]:
    """examples/pod.yaml renamed, with environment and a memory limit for its worker."""
    changed = copy.deepcopy(document)
    changed["metadata"]["name"] = name
    changed["metadata"]["labels"]["app"] = name
    (container,) = changed["spec"]["containers"]
    container["env"] = [{"name": key, "value": value} for key, value in env.items()]
    container["resources"] = {"limits": {"memory": memory}, "requests": {"memory": memory}}
    return changed


def injection_component_on_the_node(cluster: Cluster) -> list[dict[str, Any]]:
    """manifests/components/registrar-injection with the test overlay's one difference: the registrar
    it injects is given the API server's loopback address too (the env that `registrar_on_the_node`
    adds to an injected manifest, added here to the policy's mutation, the only place a Pod created
    from a labelled template gets its registrar)."""
    documents = list(yaml.safe_load_all(INJECTION_COMPONENT.read_text()))
    (policy,) = [d for d in documents if d["kind"] == "MutatingAdmissionPolicy"]
    mutation = policy["spec"]["mutations"][0]["jsonPatch"]
    last_env = 'fieldPath: "metadata.namespace"}}}\n'
    assert mutation["expression"].count(last_env) == 1, "the policy's env list changed: update this overlay"
    added = ",\n".join(
        f'Object.spec.initContainers.env{{name: "{e["name"]}", value: "{e["value"]}"}}'
        for e in realnode.api_env(cluster)
    )
    mutation["expression"] = mutation["expression"].replace(last_env, last_env[:-1] + ",\n" + added + "\n")
    return documents


@contextlib.contextmanager
def injection_at_admission(cluster: Cluster, namespace: str) -> Any:
    """The component installed (through the test overlay) until the API server injects a labelled Pod
    of `namespace` (a server-side dry run), removed afterwards."""
    documents = injection_component_on_the_node(cluster)
    realnode.apply_objects(cluster, documents)
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe", "namespace": namespace, "labels": {inject.INJECT_LABEL: "true"}},
        # examples/rbac.yaml's ServiceAccount, applied before (admission looks it up).
        "spec": {"serviceAccountName": "worker", "containers": [{"name": WORKER, "image": realnode.GO_WORKER_IMAGE}]},
    }

    def injected() -> bool:
        result = realnode.kubectl(
            cluster, "create", "--dry-run=server", "-o", "json", "-f", "-", stdin=json.dumps(probe), check=False
        )
        if result.returncode != 0:
            return False
        inits = json.loads(result.stdout)["spec"].get("initContainers") or []
        return any(c["name"] == inject.CONTAINER_NAME for c in inits)

    try:
        wait_for(injected, timeout=60, what="the injection policy in force")
        yield
    finally:
        for document in documents:
            kubectl(
                cluster, "delete", document["kind"], document["metadata"]["name"], "--ignore-not-found", check=False
            )


# ---------------------------------------------------------------------------------------------
# The host's view.


def container_id(status: dict[str, Any]) -> str:
    """The runtime's id of a container status's container (`containerd://<id>`)."""
    return str(status["containerID"]).partition("://")[2]


@dataclasses.dataclass(frozen=True, slots=True)
class HostProcess:
    """A container's main process as the host sees it."""

    host_pid: int
    pid: int
    """In its (the Pod's) pid namespace."""
    pid_namespace: str
    start_time: int
    started_at: float
    """Its start on this machine's wall clock (from its start time in ticks since boot)."""
    boot_id: str


def host_process(pid: int) -> HostProcess:
    status = procfs.parse_status(pathlib.Path(f"/proc/{pid}/status").read_bytes())
    stat = procfs.parse_stat(pathlib.Path(f"/proc/{pid}/stat").read_bytes())
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - stat.start_time / CLK_TCK
    return HostProcess(
        host_pid=pid,
        pid=int(status.nspid[-1]),
        pid_namespace=str(os.stat(f"/proc/{pid}/ns/pid").st_ino),
        start_time=stat.start_time,
        started_at=time.time() - age,
        boot_id=pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Worker:
    """One running worker container: its Pod, its container and its main process."""

    pod: str
    uid: str
    container: str
    process: HostProcess

    @property
    def registration(self) -> str:
        """The registration the registrar names after it."""
        return inject.registration_name(pod_name=self.pod, container=self.container, start_time=self.process.start_time)


def pods_of(cluster: Cluster, namespace: str, app: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get_json(cluster, "-n", namespace, "pods", "-l", f"app={app}")["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def container_status(pod_object: dict[str, Any], name: str) -> dict[str, Any] | None:
    statuses = [
        *pod_object["status"].get("initContainerStatuses", []),
        *pod_object["status"].get("containerStatuses", []),
    ]
    return next((s for s in statuses if s["name"] == name), None)


def running_worker(pod_object: dict[str, Any]) -> Worker | None:
    """The Pod's worker container and its main process, when it and the registrar run."""
    registrar = container_status(pod_object, inject.CONTAINER_NAME)
    worker = container_status(pod_object, WORKER)
    if not registrar or "running" not in registrar["state"] or not worker or "running" not in worker["state"]:
        return None
    cid = container_id(worker)
    pid = realnode.container_main_pid(cid)
    if pid is None:
        return None
    return Worker(
        pod=pod_object["metadata"]["name"], uid=pod_object["metadata"]["uid"], container=cid, process=host_process(pid)
    )


def running_workers(cluster: Cluster, namespace: str, app: str, count: int, *, timeout: float = 120) -> list[Worker]:
    def every_one() -> list[Worker] | None:
        found = [running_worker(p) for p in pods_of(cluster, namespace, app)]
        workers = [w for w in found if w is not None]
        return workers if len(found) == count and len(workers) == count else None

    return wait_for(every_one, timeout=timeout, what=f"{count} running {app} worker(s) and their registrars")


# ---------------------------------------------------------------------------------------------
# The registrations, watched.


class Watch(threading.Thread):
    """`kubectl get workerregistrations --watch -o json` of one namespace: when each registration was
    first seen, first seen attested Alive (with the agent's observedTime of that attestation), and
    every state it was seen in; this machine's wall clock."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        super().__init__(daemon=True, name=f"watch-{namespace}")
        self.process = subprocess.Popen(
            [
                str(cluster.binary("kubectl")),
                f"--kubeconfig={cluster.kubeconfig}",
                "-n",
                namespace,
                "get",
                "workerregistrations",
                "--watch",
                "-o",
                "json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.lock = threading.Lock()
        self.seen: dict[str, float] = {}
        self.alive: dict[str, float] = {}
        self.alive_observed: dict[str, float] = {}
        self.states: dict[str, list[str]] = {}

    def run(self) -> None:
        assert self.process.stdout is not None
        buffer: list[str] = []
        for line in self.process.stdout:
            buffer.append(line)
            if line.rstrip("\n") != "}":  # kubectl prints each object indented; its last line is "}"
                continue
            try:
                body = json.loads("".join(buffer))
            except ValueError:
                continue
            buffer.clear()
            self.saw(body, time.time())

    def saw(self, body: Registration, now: float) -> None:
        name = body["metadata"]["name"]
        with self.lock:
            self.seen.setdefault(name, now)
            states = self.states.setdefault(name, [])
            if state(body) and (not states or states[-1] != state(body)):
                states.append(state(body))
            if verdict(body) == "Alive" and name not in self.alive:
                self.alive[name] = now
                observed = body["status"]["attestation"]["observedTime"]
                self.alive_observed[name] = datetime.datetime.fromisoformat(observed).timestamp()

    def stop(self) -> None:
        self.process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        self.join(timeout=10)  # the reader reaches the end of kubectl's output
        if self.process.stdout is not None:
            self.process.stdout.close()

    def times(self, worker: Worker) -> tuple[float, float, float] | None:
        """(start -> registered, start -> attested Alive, start -> the agent's observedTime of it)."""
        name = worker.registration
        with self.lock:
            if name not in self.seen or name not in self.alive:
                return None
            start = worker.process.started_at
            return self.seen[name] - start, self.alive[name] - start, self.alive_observed[name] - start


def by_name(items: list[Registration]) -> dict[str, Registration]:
    return {r["metadata"]["name"]: r for r in items}


def describe(registration: Registration) -> str:
    status = registration.get("status", {})
    attestation = status.get("attestation", {})
    return (
        f"{registration['metadata']['name']} (incarnation {registration['spec']['incarnation']}): "
        f"state={state(registration) or '-'} verdict={attestation.get('verdict', '-')} "
        f"evidence={attestation.get('evidence', '-')} retirement={status.get('retirement', {}).get('reason', '-')}"
    )


def wait_registrations(
    cluster: Cluster, namespace: str, predicate: Callable[[dict[str, Registration]], bool], *, timeout: float, what: str
) -> dict[str, Registration]:
    """Polls the namespace's registrations (by name) until PREDICATE holds; a timeout says each one's state."""

    def holds() -> dict[str, Registration] | None:
        items = by_name(registrations(cluster, namespace))
        return items if items and predicate(items) else None

    try:
        return wait_for(holds, timeout=timeout, what=what)
    except AssertionError as exc:
        lines = "\n".join(describe(r) for r in registrations(cluster, namespace))
        raise AssertionError(f"{exc}; the registrations:\n{lines}") from None


def active_and_alive(items: dict[str, Registration], names: Iterable[str]) -> bool:
    return all(n in items and state(items[n]) == "Active" and verdict(items[n]) == "Alive" for n in names)


def terminal(registration: Registration) -> bool:
    return state(registration) in ("Released", "Retired")


def assert_registered_as_the_host_sees_it(registration: Registration, worker: Worker) -> None:
    """The registration is the worker's main process: its pid in the Pod's namespace, that namespace,
    its start time and the boot; on this node, under the registrar's role for its container."""
    incarnation = registration["spec"]["incarnation"]
    process = worker.process
    assert int(incarnation["pid"]) == process.pid, describe(registration)
    assert str(incarnation["pidNamespace"]) == process.pid_namespace, describe(registration)
    assert str(incarnation["startTime"]) == str(process.start_time), describe(registration)
    assert incarnation["bootId"] == process.boot_id, describe(registration)
    assert registration["spec"]["nodeName"] == NODE
    assert registration["spec"]["role"] == f"container-{worker.container[:12]}"
    # Not the sandbox (pid 1 of the Pod's namespace), and not in a namespace of its own: the Pod's.
    assert process.pid != 1
    assert realnode.incarnation_pid(registration) == process.host_pid


def assert_clean_ending(registration: Registration) -> str:
    """A clean exit's registration: Released (CleanExit), or, where the agent's Dead attestation and
    the retirement won the race with the goodbye, Retired (PidfdExited) and not running. Returns which."""
    assert terminal(registration), describe(registration)
    conditions = {c["type"]: c for c in registration["status"]["conditions"]}
    if state(registration) == "Released":
        assert conditions["Released"]["reason"] == "CleanExit", describe(registration)
        assert "retirement" not in registration["status"], describe(registration)
    else:
        assert registration["status"]["retirement"]["reason"] == "PidfdExited", describe(registration)
    assert realnode.incarnation_pid(registration) is None, describe(registration)
    return state(registration)


def assert_no_live_one_retired(items: Iterable[Registration]) -> None:
    for r in items:
        if state(r) == "Retired":
            assert realnode.incarnation_pid(r) is None, f"a live incarnation retired: {describe(r)}"


def record_times(
    record_property: Callable[[str, object], None], watch: Watch, workers: Iterable[Worker], *, label: str
) -> list[tuple[float, float, float]]:
    measured = []
    for worker in workers:
        times = wait_for(lambda w=worker: watch.times(w), timeout=30, what=f"the watch's view of {worker.registration}")
        registered, alive, observed = times
        print(
            f"{label} {worker.pod}: container start -> registered {registered:.3f} s, -> attested Alive "
            f"{alive:.3f} s (agent's observedTime {observed:.3f} s)"
        )
        record_property(f"start_to_registered_seconds[{label}/{worker.pod}]", round(registered, 3))
        record_property(f"start_to_alive_seconds[{label}/{worker.pod}]", round(alive, 3))
        record_property(f"start_to_alive_observed_seconds[{label}/{worker.pod}]", round(observed, 3))
        measured.append(times)
    return measured


@contextlib.contextmanager
def watching(cluster: Cluster, namespace: str) -> Any:
    watch = Watch(cluster, namespace)
    watch.start()
    try:
        yield watch
    finally:
        watch.stop()


# ---------------------------------------------------------------------------------------------
# The tests.


def test_a_deployment_of_scratch_go_workers_is_registered_each_as_the_host_sees_it_and_a_killed_one_is_retired(
    node_cluster: Cluster, worker_namespace: str, record_property: Callable[[str, object], None]
) -> None:
    realnode.rolled_out(node_cluster)
    ns = worker_namespace
    with watching(node_cluster, ns) as watch:
        apply_here(node_cluster, ns, injected_example(node_cluster, "deployment"))
        workers = running_workers(node_cluster, ns, "web", 3)
        names = {w.registration for w in workers}
        items = wait_registrations(
            node_cluster,
            ns,
            lambda items: active_and_alive(items, names),
            timeout=REGISTERED_WITHIN_SECONDS + 60,
            what="each web container's main process registered and attested Alive",
        )
        # One registration per container main process: none for the registrar, the sandbox (pid 1)
        # or anything else.
        assert set(items) == names, sorted(items)
        for worker in workers:
            assert_registered_as_the_host_sees_it(items[worker.registration], worker)
        record_times(record_property, watch, workers, label="deployment")

        # kill -9 from the host: the agent attests it (the registrar leaves unclean exits to it).
        victim, *others = workers
        os.kill(victim.process.host_pid, signal.SIGKILL)
        retired = wait_registrations(
            node_cluster,
            ns,
            lambda items: terminal(items[victim.registration]),
            timeout=TERMINAL_WITHIN_SECONDS,
            what="the killed worker's registration terminal",
        )[victim.registration]
        assert state(retired) == "Retired", describe(retired)
        assert retired["status"]["retirement"]["reason"] == "PidfdExited", describe(retired)
        assert retired["status"]["attestation"]["agent"]["nodeName"] == NODE

        # The kubelet restarts the container: a new container, a new main process, a new registration.
        def restarted() -> Worker | None:
            (again,) = [p for p in pods_of(node_cluster, ns, "web") if p["metadata"]["name"] == victim.pod]
            worker = running_worker(again)
            return worker if worker is not None and worker.container != victim.container else None

        fresh = wait_for(restarted, timeout=120, what="the killed container restarted")
        items = wait_registrations(
            node_cluster,
            ns,
            lambda items: active_and_alive(items, [fresh.registration, *(w.registration for w in others)]),
            timeout=REGISTERED_WITHIN_SECONDS + 60,
            what="the restarted container's new incarnation registered and Alive, the others still Alive",
        )
        assert set(items) == {*names, fresh.registration}, sorted(items)
        assert_registered_as_the_host_sees_it(items[fresh.registration], fresh)
        assert state(items[victim.registration]) == "Retired"
        for worker in others:
            assert "retirement" not in items[worker.registration]["status"]
        record_times(record_property, watch, [fresh], label="restarted")
        assert watch.states[victim.registration][0] == "Active", watch.states[victim.registration]


def test_a_rollout_restart_ends_every_old_incarnation_cleanly_and_retires_no_live_one(
    node_cluster: Cluster, worker_namespace: str, record_property: Callable[[str, object], None]
) -> None:
    """The kubelet stops each old Pod's worker with SIGTERM (honoured: exit 0), then its registrar. Each
    old incarnation is Released, or Retired (PidfdExited) where the agent's attestation of the exit
    and the retirement beat the goodbye (module docstring): counted, printed, recorded."""
    realnode.rolled_out(node_cluster)
    ns = worker_namespace
    apply_here(node_cluster, ns, injected_example(node_cluster, "deployment"))
    endings: dict[str, int] = {"Released": 0, "Retired": 0}
    current = running_workers(node_cluster, ns, "web", 3)
    for rollout in (1, 2):
        old = {w.registration for w in current}
        wait_registrations(
            node_cluster,
            ns,
            lambda items, old=old: active_and_alive(items, old),
            timeout=REGISTERED_WITHIN_SECONDS + 60,
            what=f"rollout {rollout}: every web worker registered and Alive",
        )
        kubectl(node_cluster, "-n", ns, "rollout", "restart", "deployment/web")
        kubectl(node_cluster, "-n", ns, "rollout", "status", "deployment/web", "--timeout=180s", timeout=200)
        current = running_workers(node_cluster, ns, "web", 3)
        new = {w.registration for w in current}
        assert not new & old
        items = wait_registrations(
            node_cluster,
            ns,
            lambda items, old=old, new=new: (
                all(n in items and terminal(items[n]) for n in old) and active_and_alive(items, new)
            ),
            timeout=TERMINAL_WITHIN_SECONDS + 60,
            what=f"rollout {rollout}: every old incarnation terminal, every new one registered and Alive",
        )
        for name in sorted(old):
            ending = assert_clean_ending(items[name])
            endings[ending] += 1
            print(f"rollout {rollout}: {describe(items[name])}")
        assert_no_live_one_retired(items.values())
        for worker in current:
            assert_registered_as_the_host_sees_it(items[worker.registration], worker)
    print(f"rollout restarts: old incarnations Released {endings['Released']}, Retired {endings['Retired']}")
    record_property("clean_exits_released", endings["Released"])
    record_property("clean_exits_retired", endings["Retired"])


def test_an_oom_killed_worker_is_retired_and_every_restart_is_registered_active(
    node_cluster: Cluster, worker_namespace: str
) -> None:
    """A 32 MiB limit, and the worker allocates 128 MiB 8 s after each start: the kernel's OOM killer
    SIGKILLs it each time, the kubelet restarts it (with its back-off)."""
    realnode.rolled_out(node_cluster)
    ns = worker_namespace
    with watching(node_cluster, ns) as watch:
        (solo,) = example("pod")
        run_injected(
            node_cluster,
            ns,
            variant(
                solo,
                name="hog",
                env={"GO_WORKER_ALLOCATE_MIB": "128", "GO_WORKER_ALLOCATE_AFTER_SECONDS": "8"},
                memory="32Mi",
            ),
        )

        def two_retired_and_one_running(items: dict[str, Registration]) -> bool:
            running = [r for r in items.values() if realnode.incarnation_pid(r) is not None]
            return sum(state(r) == "Retired" for r in items.values()) >= 2 and any(
                state(r) == "Active" and verdict(r) == "Alive" for r in running
            )

        items = wait_registrations(
            node_cluster,
            ns,
            two_retired_and_one_running,
            timeout=240,
            what="two OOM-killed incarnations of hog Retired, and its restarted one running Active and Alive",
        )
        hog = get_json(node_cluster, "-n", ns, "pod", "hog")
        status = container_status(hog, WORKER)
        assert status is not None and status["restartCount"] >= 2, status
        assert status["lastState"]["terminated"]["reason"] == "OOMKilled", status
        assert status["lastState"]["terminated"]["exitCode"] == 128 + signal.SIGKILL, status
        for r in items.values():
            if state(r) == "Retired":
                assert r["status"]["retirement"]["reason"] == "PidfdExited", describe(r)
                assert realnode.incarnation_pid(r) is None, describe(r)
            else:
                assert state(r) == "Active" and realnode.incarnation_pid(r) is not None, describe(r)
        assert_no_live_one_retired(items.values())
        # Every run was registered Active, and attested Alive while it ran, before it was retired.
        with watch.lock:
            for name in items:
                assert watch.states[name][0] == "Active", (name, watch.states[name])
                if state(items[name]) == "Retired":
                    assert name in watch.alive and watch.alive[name] < watch.seen[name] + 30, name
        print("OOM:", "; ".join(f"{n}: {' -> '.join(watch.states[n])}" for n in sorted(items)))
    kubectl(node_cluster, "-n", ns, "delete", "pod", "hog", "--wait=false")


def test_a_job_that_completes_ends_its_registration_cleanly(
    node_cluster: Cluster, worker_namespace: str, record_property: Callable[[str, object], None]
) -> None:
    """Exit 0 after 6 s: the registrar's goodbye (Released), or the agent's PidfdExited if it wins the race."""
    realnode.rolled_out(node_cluster)
    ns = worker_namespace
    apply_here(node_cluster, ns, injected_example(node_cluster, "job"))
    (worker,) = running_workers(node_cluster, ns, "batch", 1, timeout=90)
    items = wait_registrations(
        node_cluster,
        ns,
        lambda items: worker.registration in items,
        timeout=REGISTERED_WITHIN_SECONDS,
        what="the Job's worker registered",
    )
    assert_registered_as_the_host_sees_it(items[worker.registration], worker)
    wait_for(
        lambda: get_json(node_cluster, "-n", ns, "job", "batch")["status"].get("succeeded") == 1,
        timeout=120,
        what="the Job complete",
    )
    items = wait_registrations(
        node_cluster,
        ns,
        lambda items: terminal(items[worker.registration]),
        timeout=TERMINAL_WITHIN_SECONDS,
        what="the completed Job's registration terminal",
    )
    assert set(items) == {worker.registration}
    ending = assert_clean_ending(items[worker.registration])
    print(f"job: {describe(items[worker.registration])}")
    record_property("job_ending", ending)


def test_a_deleted_pod_injected_by_kubectl_coroner_inject_ends_cleanly(
    node_cluster: Cluster, worker_namespace: str, record_property: Callable[[str, object], None]
) -> None:
    """examples/pod.yaml through `kubectl coroner inject -f` (the real kubectl finding the plugin),
    then the test overlay, then `kubectl apply`; the Pod deleted: SIGTERM, exit 0, goodbye."""
    realnode.rolled_out(node_cluster)
    ns = worker_namespace
    apply_here(node_cluster, ns, injected_example(node_cluster, "pod"))

    (worker,) = running_workers(node_cluster, ns, "solo", 1)
    items = wait_registrations(
        node_cluster,
        ns,
        lambda items: active_and_alive(items, [worker.registration]),
        timeout=REGISTERED_WITHIN_SECONDS + 60,
        what="the solo worker registered and Alive",
    )
    assert set(items) == {worker.registration}
    assert_registered_as_the_host_sees_it(items[worker.registration], worker)
    kubectl(node_cluster, "-n", ns, "delete", "pod", "solo", "--wait=true", timeout=90)
    items = wait_registrations(
        node_cluster,
        ns,
        lambda items: terminal(items[worker.registration]),
        timeout=TERMINAL_WITHIN_SECONDS,
        what="the deleted Pod's registration terminal",
    )
    ending = assert_clean_ending(items[worker.registration])
    print(f"deleted pod: {describe(items[worker.registration])}")
    record_property("deleted_pod_ending", ending)


def test_a_registrar_killed_from_the_host_retires_nothing_and_registers_nothing_twice(
    node_cluster: Cluster, worker_namespace: str
) -> None:
    """The registrar container's process SIGKILLed: the kubelet restarts the sidecar, the new registrar
    finds each worker's registration under the same name (the create is idempotent), and the workers,
    which never stopped, stay Active and Alive."""
    realnode.rolled_out(node_cluster)
    ns = worker_namespace
    apply_here(node_cluster, ns, injected_example(node_cluster, "deployment"))
    workers = running_workers(node_cluster, ns, "web", 3)
    names = {w.registration for w in workers}
    wait_registrations(
        node_cluster,
        ns,
        lambda items: active_and_alive(items, names),
        timeout=REGISTERED_WITHIN_SECONDS + 60,
        what="every web worker registered and Alive",
    )
    killed = {}
    for p in pods_of(node_cluster, ns, "web"):
        status = container_status(p, inject.CONTAINER_NAME)
        assert status is not None
        cid = container_id(status)
        pid = realnode.container_main_pid(cid)
        assert pid is not None, f"no registrar process of {p['metadata']['name']}"
        assert "registrar" in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        killed[p["metadata"]["name"]] = cid
        os.kill(pid, signal.SIGKILL)

    def registrars_restarted() -> bool:
        for p in pods_of(node_cluster, ns, "web"):
            status = container_status(p, inject.CONTAINER_NAME)
            if (
                status is None
                or "running" not in status["state"]
                or container_id(status) == killed[p["metadata"]["name"]]
            ):
                return False
        return True

    wait_for(registrars_restarted, timeout=120, what="each killed registrar restarted by the kubelet")
    # The new registrars scan within 0.5 s of their start; give them many scans.
    time.sleep(10)
    items = wait_registrations(
        node_cluster,
        ns,
        lambda items: active_and_alive(items, names),
        timeout=60,
        what="every worker still Active and Alive",
    )
    assert set(items) == names, sorted(items)  # nothing registered twice
    for worker in workers:
        r = items[worker.registration]
        assert "retirement" not in r["status"], describe(r)
        assert_registered_as_the_host_sees_it(r, worker)
    for p in pods_of(node_cluster, ns, "web"):
        worker_status = container_status(p, WORKER)
        assert worker_status is not None and worker_status["restartCount"] == 0, worker_status
    # The restarted registrar still says goodbye: a deleted Pod ends cleanly (Released, or the race).
    first = workers[0]
    kubectl(node_cluster, "-n", ns, "delete", "pod", first.pod, "--wait=true", timeout=90)
    items = wait_registrations(
        node_cluster,
        ns,
        lambda items: terminal(items[first.registration]),
        timeout=TERMINAL_WITHIN_SECONDS,
        what="the deleted Pod's registration terminal",
    )
    print(f"after the registrar's restart, deleted pod: {describe(items[first.registration])}")
    assert_clean_ending(items[first.registration])
    assert_no_live_one_retired(items.values())


def test_a_statefulset_labelled_for_injection_at_admission_is_registered(
    node_cluster: Cluster, worker_namespace: str
) -> None:
    """examples/statefulset.yaml as written (its Pod template labelled coroner.dev/inject=true), through
    the test overlay, applied while manifests/components/registrar-injection is installed: the API
    server injects the registrar into its Pod."""
    realnode.rolled_out(node_cluster)
    ns = worker_namespace
    apply_here(node_cluster, ns, [])  # examples/rbac.yaml
    with injection_at_admission(node_cluster, ns):
        apply_here(node_cluster, ns, example("statefulset"))
        (worker,) = running_workers(node_cluster, ns, "db", 1)
        (db,) = pods_of(node_cluster, ns, "db")
        assert db["metadata"]["annotations"][inject.INJECTED_ANNOTATION] == inject.INJECTION_VERSION
    assert worker.pod == "db-0"
    items = wait_registrations(
        node_cluster,
        ns,
        lambda items: active_and_alive(items, [worker.registration]),
        timeout=REGISTERED_WITHIN_SECONDS + 60,
        what="the StatefulSet's worker registered and Alive",
    )
    assert set(items) == {worker.registration}
    assert_registered_as_the_host_sees_it(items[worker.registration], worker)
