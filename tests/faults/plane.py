"""The fault harness's control plane: a dedicated real cluster, the operator(s) and one agent per
simulated node, all as local processes that faults can kill, freeze, restart, skew or cut off.

Everything here is reused across trials (starting a control plane or an agent costs seconds); a
fault restarts only what it must, and `heal()`-style methods put each piece back. Every process is
started by this module, recorded, and stopped by `Plane.close()`; cluster-scoped objects it changes
(the retire ClusterRoleBinding, Nodes it creates) are restored or deleted there too.

The API server restart (`restart_apiserver`) works from the dev cluster's own record: it finds the
kube-apiserver in DIR/cluster.json by (pid, start time), reads its argv from /proc, stops it, starts
it again with the same argv (same port, same certificates, same etcd: tokens stay valid because the
ServiceAccount issuer names the port) and rewrites cluster.json with the new (pid, start time).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import signal
import socket
import subprocess
import threading
import time
import uuid
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.client.kube import api_client
from coroner.core import api
from coroner_dev import fleet
from coroner_dev.devcluster import cluster as cluster_mod
from coroner_dev.devcluster.cluster import Cluster
from faults.canary import Canary
from faults.proxy import ApiProxy
from support import kube

BIN = fleet.BIN
SKEW_PATH = pathlib.Path(__file__).resolve().parent / "skew"
WORKER_NAMESPACE = "coroner-faults"
WORKER_SA = "worker"
OPERATOR_SA = f"system:serviceaccount:{api.SYSTEM_NAMESPACE}:coroner-operator"
AGENT_SA = f"system:serviceaccount:{api.SYSTEM_NAMESPACE}:coroner-agent"
RETIRE_BINDING = fleet.RETIRE_BINDING

#: Agent Lease timing used by the harness (short, so that "agent gone" is observable in seconds).
LEASE_SECONDS = 5
RENEW_SECONDS = 1.0
RESYNC_SECONDS = 2.0


def proxied_kubeconfig(source: pathlib.Path, port: int, target: pathlib.Path) -> pathlib.Path:
    """A copy of a token kubeconfig whose server is the proxy on 127.0.0.1:port."""
    raw = json.loads(source.read_text())
    for item in raw["clusters"]:
        item["cluster"]["server"] = f"https://127.0.0.1:{port}"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(raw, indent=2) + "\n")
    target.chmod(0o600)
    return target


def _port_bindable(port: int) -> bool:
    """Whether a listener could bind the port as the API server does (Go sets SO_REUSEADDR, so
    connections left in TIME_WAIT by the old server do not count; another listener does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class Agent:
    """One simulated node: its boot-id file, its Node object, its proxy, its agent process."""

    def __init__(self, plane: Plane, name: str, boot_id: str | None) -> None:
        self.plane = plane
        self.name = name
        self.node = fleet.node(plane.cluster, name=name, directory=plane.work, boot_id=boot_id)
        self.token, self.boot_file = self.node.kubeconfig, self.node.boot_file
        self.proxy = plane.new_proxy(f"agent-{name}")
        self.kubeconfig = proxied_kubeconfig(self.token, self.proxy.port, plane.work / f"agent-{name}.kubeconfig")
        self.log = plane.work / f"agent-{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.frozen = False
        self.skew: float = 0.0
        self.incarnations = 0

    @property
    def boot_id(self) -> str:
        """The simulated node's boot id (`reboot` changes it)."""
        return self.node.boot_id

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def healthy(self) -> bool:
        return self.running and not self.frozen and self.proxy.mode == "pass" and self.skew >= 0

    def start(self, *, skew: float = 0.0) -> None:
        assert not self.running, f"agent {self.name} already running"
        self.incarnations += 1
        self.skew = skew
        env = {"POD_NAME": f"agent-{self.name}-{self.incarnations}"}
        if skew:
            # Prepended: a run from a copy of the tree puts its own sources on PYTHONPATH too.
            path = os.pathsep.join(filter(None, (str(SKEW_PATH), os.environ.get("PYTHONPATH"))))
            env |= {"PYTHONPATH": path, "CORONER_FAULTS_CLOCK_SKEW_SECONDS": str(skew)}
        self.proc = fleet.start_agent(
            node=self.node,
            kubeconfig=self.kubeconfig,
            log=self.log,
            env=env,
            extra=(
                f"--resync-seconds={RESYNC_SECONDS}",
                f"--lease-duration-seconds={LEASE_SECONDS}",
                f"--renew-seconds={RENEW_SECONDS}",
                # Trials restart agents among live workers: a restart, not a node drain.
                "--shutdown-grace-seconds=0",
            ),
        )
        self.frozen = False

    def wait_started(self, timeout: float = 60.0) -> None:
        """Until this incarnation has logged its start (it has read its node facts and identity)."""
        deadline = time.monotonic() + timeout
        while self.log.read_text(errors="replace").count("agent started") < self.incarnations:
            if not self.running or time.monotonic() > deadline:
                raise RuntimeError(f"the agent of {self.name} did not start; see {self.log}")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM: the agent runs its shutdown sweep, then exits."""
        fleet.stop(self.proc, timeout=30)
        self.proc = None
        self.frozen = False

    def kill(self) -> None:
        if self.proc is not None:
            fleet.kill(self.proc)
        self.proc = None
        self.frozen = False

    def freeze(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        if self.proc is not None and self.frozen:
            os.kill(self.proc.pid, signal.SIGCONT)
        self.frozen = False

    def ensure_healthy(self) -> None:
        """Back to normal: unfrozen, connected, unskewed, running."""
        self.thaw()
        if self.proxy.mode != "pass":
            self.proxy.set_mode("pass")
        if self.skew:
            self.stop()
        if not self.running:
            self.start()

    def reboot(self) -> str:
        """A simulated reboot: a new boot id in the boot-id file and on the Node; restarts the agent."""
        was_running = self.running
        self.stop()
        boot_id = str(uuid.uuid4())
        self.plane.retry(lambda: self.node.reboot(self.plane.cluster, boot_id=boot_id))
        if was_running:
            self.start()
        return self.boot_id


#: Leader election as the manifests run it (2 replicas, --leader-elect), on the harness's short clock
#: (like the agents' Leases: a takeover observable in seconds, not client-go's 15 s).
LEADER_ELECTION = (
    "--leader-elect",
    "--leader-elect-lease-duration=5",
    "--leader-elect-renew-deadline=3",
    "--leader-elect-retry-period=1",
)


class Operator:
    def __init__(self, plane: Plane, index: int, *, leader_elect: bool = False) -> None:
        self.index = index
        self.identity = f"operator-{plane.suffix}-{index}"
        self.log = plane.work / f"{self.identity}.log"
        extra = LEADER_ELECTION if leader_elect else ()
        self.proc = fleet.start_operator(
            kubeconfig=plane.operator_kubeconfig,
            log=self.log,
            extra=("--permission-refresh-seconds=1", *extra),
            env={"POD_NAME": self.identity},
        )

    @property
    def leads(self) -> bool:
        """Its log says it leads, and not since that it stopped (a plain operator never says either)."""
        text = self.log.read_text(errors="replace")
        return text.rfind(f"{self.identity} leads") > text.rfind(f"{self.identity} stopped leading")

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        fleet.kill(self.proc)

    def stop(self) -> None:
        fleet.stop(self.proc, timeout=30)


@dataclasses.dataclass
class Plane:
    """The dedicated control plane and Coroner's components for a fault run."""

    directory: pathlib.Path
    node_count: int = 3
    keep_cluster: bool = False

    def __post_init__(self) -> None:
        self.directory = self.directory.resolve()
        self.work = self.directory / "faults"
        self.work.mkdir(parents=True, exist_ok=True)
        self.proxies: list[ApiProxy] = []
        self.agents: dict[str, Agent] = {}
        self.operators: list[Operator] = []
        self.operator_logs: list[pathlib.Path] = []
        self._operator_index = 0
        self.retire_binding: dict[str, Any] | None = None
        self.apiserver_restarts = 0
        self.lock = threading.Lock()
        self.suffix = uuid.uuid4().hex[:4]

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> Plane:
        self.cluster = fleet.up(directory=self.directory / "cluster")
        self.admin = api_client(self.cluster.kubeconfig)
        fleet.install(self.cluster, grant=True)
        self.retire_binding = k8s.RbacAuthorizationV1Api(self.admin).read_cluster_role_binding(RETIRE_BINDING).to_dict()
        core = k8s.CoreV1Api(self.admin)
        with contextlib.suppress(ApiException):
            core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=WORKER_NAMESPACE)))
        self.worker_kubeconfig = fleet.worker_kubeconfig(
            self.cluster, namespaces=[WORKER_NAMESPACE], service_account=WORKER_SA
        )
        self.worker_client = api_client(self.worker_kubeconfig)
        self.operator_proxy = self.new_proxy("operator")
        self.operator_kubeconfig = proxied_kubeconfig(
            fleet.operator_kubeconfig(self.cluster), self.operator_proxy.port, self.work / "operator.kubeconfig"
        )
        for index in range(self.node_count):
            name = f"fnode-{self.suffix}-{index}"
            self.agents[name] = Agent(self, name, fleet.real_boot_id() if index == 0 else None)
            self.agents[name].start()
        self.start_operator()
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Every agent has published its Lease and the operator has started."""
        coordination = k8s.CoordinationV1Api(self.admin)
        deadline = time.monotonic() + timeout
        for agent in self.agents.values():
            while True:
                try:
                    lease = coordination.read_namespaced_lease(
                        f"{api.AGENT_LEASE_PREFIX}{agent.name}", api.SYSTEM_NAMESPACE
                    )
                    if (lease.metadata.annotations or {}).get(api.AGENT_LEASE_BOOT_ID) == agent.boot_id:
                        break
                except ApiException:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the agent of {agent.name} published no Lease within {timeout:.0f} s")
                time.sleep(0.1)
        while "operator started" not in self.operator.log.read_text(errors="replace"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the operator did not start within {timeout:.0f} s")
            time.sleep(0.1)

    def close(self) -> None:
        errors: list[str] = []
        for operator in self.operators:
            with contextlib.suppress(Exception):
                operator.stop()
        for agent in self.agents.values():
            with contextlib.suppress(Exception):
                agent.thaw()
                agent.stop()
        try:
            self.restore_grant()
        except Exception as exc:
            errors.append(f"restore grant: {exc!r}")
        core = k8s.CoreV1Api(self.admin)
        for name in self.agents:
            with contextlib.suppress(Exception):
                core.delete_node(name)
            with contextlib.suppress(Exception):
                k8s.CoordinationV1Api(self.admin).delete_namespaced_lease(
                    f"{api.AGENT_LEASE_PREFIX}{name}", api.SYSTEM_NAMESPACE
                )
        for proxy in self.proxies:
            proxy.close()
        with contextlib.suppress(Exception):
            self.worker_client.close()
            self.admin.close()
        if not self.keep_cluster:
            cluster_mod.down(self.directory / "cluster")
        if errors:
            raise RuntimeError("; ".join(errors))

    def new_proxy(self, name: str) -> ApiProxy:
        proxy = ApiProxy(
            name=name,
            upstream_port=self.cluster.apiserver_port,
            ca_cert=self.cluster.pki.ca_cert,
            serving_cert=self.cluster.pki.serving_cert,
            serving_key=self.cluster.pki.serving_key,
        ).start()
        self.proxies.append(proxy)
        return proxy

    # --- operators -------------------------------------------------------------------------------

    def start_operator(self, *, leader_elect: bool = False) -> Operator:
        self._operator_index += 1
        operator = Operator(self, self._operator_index, leader_elect=leader_elect)
        self.operators.append(operator)
        self.operator_logs.append(operator.log)
        return operator

    @property
    def operator(self) -> Operator:
        return self.operators[0]

    def kill_operator(self) -> None:
        """SIGKILL the primary operator (no cleanup, mid-whatever-it-was-doing)."""
        self.operators.pop(0).kill()

    def ensure_one_operator(self) -> None:
        for operator in self.operators[1:]:
            operator.stop()
        self.operators = [o for o in self.operators[:1] if o.running]
        if not self.operators:
            self.start_operator()

    def replace_operators(self, count: int, *, leader_elect: bool) -> list[Operator]:
        """Stops every operator and starts `count` new ones (the same image, the same identity)."""
        for operator in self.operators:
            operator.stop()
        self.operators = []
        if leader_elect:
            # A plain operator's Lease names no elector and lasts 3 resyncs (minutes): as on a fresh
            # install, the replicas find none (an upgrade from a plain operator waits it out once).
            with contextlib.suppress(ApiException):
                k8s.CoordinationV1Api(self.admin).delete_namespaced_lease(api.OPERATOR_LEASE, api.SYSTEM_NAMESPACE)
        return [self.start_operator(leader_elect=leader_elect) for _ in range(count)]

    # --- the retire grant ------------------------------------------------------------------------

    def revoke_grant(self) -> None:
        with contextlib.suppress(ApiException):
            k8s.RbacAuthorizationV1Api(self.admin).delete_cluster_role_binding(RETIRE_BINDING)

    def restore_grant(self) -> None:
        rbac = k8s.RbacAuthorizationV1Api(self.admin)
        assert self.retire_binding is not None
        body = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": RETIRE_BINDING, "labels": self.retire_binding["metadata"].get("labels")},
            "roleRef": {
                "apiGroup": self.retire_binding["role_ref"]["api_group"],
                "kind": self.retire_binding["role_ref"]["kind"],
                "name": self.retire_binding["role_ref"]["name"],
            },
            "subjects": [
                {"kind": s["kind"], "name": s["name"], "namespace": s["namespace"]}
                for s in self.retire_binding["subjects"]
            ],
        }
        try:
            rbac.create_cluster_role_binding(body)
        except ApiException as exc:
            if exc.status != 409:
                raise

    @contextlib.contextmanager
    def admission_lifted(self, prefix: str = "coroner-") -> Any:
        """Coroner's admission policies unbound for the duration (their bindings deleted, then
        created again): only for the detector self-tests, which must get a broken write past every
        guard to show that the oracle behind them sees it. Never used by a drawn fault."""
        admission = k8s.AdmissionregistrationV1Api(self.admin)
        bindings = [
            b
            for b in self.retry(lambda: admission.list_validating_admission_policy_binding().items)
            if b.metadata.name.startswith(prefix)
        ]
        bodies = []
        for binding in bindings:
            body = self.admin.sanitize_for_serialization(binding)
            body["metadata"] = {k: v for k, v in body["metadata"].items() if k in ("name", "labels", "annotations")}
            bodies.append(body)
        canary = Canary(self.admin, self.retry)
        canary.bind()
        for binding in bindings:
            self.retry(lambda name=binding.metadata.name: admission.delete_validating_admission_policy_binding(name))
        canary.unbind()  # deleted after them: once the API server lets go of it, it let go of them
        try:
            yield
        finally:
            for body in bodies:
                try:
                    self.retry(lambda body=body: admission.create_validating_admission_policy_binding(body))
                except ApiException as exc:
                    if exc.status != 409:
                        raise
            canary.bind()  # written after them: once it is enforced, they are

    def operator_may_retire(self, namespace: str) -> bool:
        return self._may(OPERATOR_SA, api.SYSTEM_NAMESPACE, api.RETIRE_VERB, namespace)

    def _may(self, user: str, user_namespace: str, verb: str, namespace: str) -> bool:
        """The API server's own authorizer, asked by SubjectAccessReview (what its requests will meet)."""
        review = k8s.V1SubjectAccessReview(
            spec=k8s.V1SubjectAccessReviewSpec(
                user=user,
                groups=["system:serviceaccounts", f"system:serviceaccounts:{user_namespace}"],
                resource_attributes=k8s.V1ResourceAttributes(
                    group=api.GROUP, resource=api.PLURAL, verb=verb, namespace=namespace
                ),
            )
        )
        result = k8s.AuthorizationV1Api(self.admin).create_subject_access_review(review)
        return bool(result.status.allowed)

    # --- the API server --------------------------------------------------------------------------

    def restart_apiserver(self, *, graceful: bool, down_seconds: float = 0.0, during: Any = None) -> float:
        """Stops the recorded kube-apiserver and starts it again with the same argv; returns seconds down.

        graceful: SIGTERM, then SIGKILL after 5 s (this build keeps running ~15 s after a SIGTERM
        while long watches are open); otherwise SIGKILL at once (a crash). `during` is called while it
        is down.
        """
        directory = self.directory / "cluster"
        recorded = Cluster.load(directory)
        assert recorded is not None, f"no cluster.json in {directory}"
        old = next(p for p in recorded.processes if p.name == "kube-apiserver")
        if not old.alive():
            raise RuntimeError(f"the recorded kube-apiserver (pid {old.pid}) is not the running one")
        argv = [a.decode() for a in pathlib.Path(f"/proc/{old.pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")]
        if not old.alive():  # the cmdline read must be of the recorded incarnation
            raise RuntimeError("the kube-apiserver exited while its argv was read")
        started = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.kill(old.pid, signal.SIGTERM if graceful else signal.SIGKILL)
        deadline = time.monotonic() + (5.0 if graceful else 0.0)
        while old.alive() and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(old.pid, os.WNOHANG)
            time.sleep(0.05)
        if old.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(old.pid, signal.SIGKILL)
        for _ in range(600):
            if not old.alive():
                break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"kube-apiserver pid {old.pid} did not exit")
        for _ in range(100):  # reap it if this process started it (it is a zombie until then)
            try:
                if os.waitpid(old.pid, os.WNOHANG)[0] == old.pid:
                    break
            except ChildProcessError:
                break
            time.sleep(0.05)
        if during is not None:
            during()
        if down_seconds:
            time.sleep(down_seconds)
        new = None
        for _attempt in range(50):  # the port may linger for a moment after a SIGKILL
            if _port_bindable(recorded.apiserver_port):
                new = cluster_mod._spawn("kube-apiserver", argv, log=directory / "logs" / "kube-apiserver.log")
                break
            time.sleep(0.2)
        if new is None:
            raise RuntimeError(
                f"port {recorded.apiserver_port} stayed busy; a restart on another port would invalidate every "
                f"token (the ServiceAccount issuer names the port)"
            )
        processes = tuple(new if p.name == "kube-apiserver" else p for p in recorded.processes)
        updated = dataclasses.replace(recorded, processes=processes)
        (directory / cluster_mod.STATE_FILE).write_text(json.dumps(updated.to_json(), indent=2) + "\n")
        self.cluster = updated
        deadline = time.monotonic() + 180
        while not cluster_mod.is_ready(updated):
            if not new.alive():
                raise RuntimeError(f"the restarted kube-apiserver exited; see {directory / 'logs'}")
            if time.monotonic() > deadline:
                raise RuntimeError("the restarted kube-apiserver did not become ready within 180 s")
            time.sleep(0.1)
        self.apiserver_restarts += 1
        return time.monotonic() - started

    # --- helpers ---------------------------------------------------------------------------------

    def retry(self, call: Any, *, attempts: int = 60, delay: float = 0.5) -> Any:
        """Retries a harness-side API call through transient failures (API server restarts)."""
        last: Exception | None = None
        for _ in range(attempts):
            try:
                return call()
            except ApiException as exc:
                if exc.status not in (0, 429, 500, 502, 503, 504) and exc.status is not None:
                    raise
                last = exc
            except Exception as exc:
                last = exc
            time.sleep(delay)
        raise RuntimeError(f"gave up after {attempts} attempts: {last!r}")

    def create_trial_namespace(self, name: str) -> None:
        core = k8s.CoreV1Api(self.admin)
        self.retry(lambda: core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name))))
        self.retry(
            lambda: fleet.bind_worker(self.cluster, namespace=name, service_account=f"{WORKER_NAMESPACE}/{WORKER_SA}")
        )
        # The authorizer's RBAC cache learns of the binding a moment later: until it has, the worker's
        # first create is a 403 (seen as a flake of the findings tests, which register without retry).
        deadline = time.monotonic() + 30
        worker = f"system:serviceaccount:{WORKER_NAMESPACE}:{WORKER_SA}"
        while not self.retry(lambda: self._may(worker, WORKER_NAMESPACE, "create", name)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker binding in {name} is not effective after 30 s")
            time.sleep(0.05)

    def delete_trial_namespace(self, name: str) -> None:
        custom = kube.custom(self.admin)
        with contextlib.suppress(Exception):
            self.retry(
                lambda: custom.delete_collection_namespaced_custom_object(api.GROUP, api.VERSION, name, api.PLURAL),
                attempts=10,
            )
        with contextlib.suppress(Exception):
            self.retry(lambda: k8s.CoreV1Api(self.admin).delete_namespace(name), attempts=10)

    def operator_client(self) -> k8s.ApiClient:
        """The operator's identity, straight to the API server (the detector self-tests' mutants)."""
        if getattr(self, "_operator_client", None) is None:
            self._operator_client = api_client(fleet.operator_kubeconfig(self.cluster))
        return self._operator_client

    def agent_client(self, node: str) -> k8s.ApiClient:
        """The agent's own node-bound identity, straight to the API server (for refusal checks)."""
        return api_client(self.agents[node].token)
