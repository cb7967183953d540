"""Coroner's shipped manifests on the dev cluster's real node: the one test overlay, the install, and
worker Pods.

The overlay is the shipped one (`manifests/overlays/production` or `plan-only`) plus only what this
machine's node needs, each said where it is patched:
- `hostNetwork` and the API server's loopback address for the agent and the operator: the dev node
  runs no CNI plugin and no kube-proxy, so the `kubernetes` Service's ClusterIP reaches nothing and
  the API server listens on loopback only (in-cluster config reads KUBERNETES_SERVICE_HOST/PORT,
  which a container's own env overrides);
- `imagePullPolicy: Never`: the images are built here and imported, no registry is reachable;
- the agent's seccomp hostPath: the dev nodes' kubelets resolve profiles under the cluster directory;
- the operator's metrics port: every dev node shares this machine's network namespace, so a fixed
  port would keep the second replica from binding (and the scheduler from placing it on the same
  node); the test overlay lets each take a free port (`--metrics-port=0`) and drops the port and
  its probes. Why the first node is labeled a control-plane node: `install`.

The chart's `helm test` Pod (charts/coroner/templates/tests/doctor.yaml) is created by `helm test`
itself, after any patch could be made: a MutatingAdmissionPolicy of the dev cluster's own
(`helm_test_pods`, applied by `patch_installed`) gives it the same `hostNetwork` and API server address
at admission.

Workloads with the registrar injected (`coroner.core.inject`, `kubectl coroner inject`) get the same
API server address in its container, and nothing else (`registrar_on_the_node`); their Pods need
`hostNetwork` as every Pod here does. The manifests of examples/ get those, their namespace and the
node (`example_on_the_node`).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import time
from typing import Any

from coroner.core import api, inject, procfs
from coroner_dev.devcluster import imagerecipe
from coroner_dev.devcluster.cluster import Cluster
from coroner_dev.devcluster.errors import DevClusterError
from coroner_dev.devcluster.node import NodeLayout

SYSTEM_NAMESPACE = api.SYSTEM_NAMESPACE
WORKER_IMAGE = imagerecipe.WORKER_REFERENCE
#: A worker with nothing of Coroner in its image (a static Go binary in `scratch`, images/go-worker).
GO_WORKER_IMAGE = imagerecipe.GO_WORKER_REFERENCE


def repository() -> pathlib.Path:
    """The checkout whose manifests are installed."""
    for parent in pathlib.Path(__file__).resolve().parents:
        if (parent / "manifests" / "overlays" / "production").is_dir():
            return parent
    raise DevClusterError("cannot find manifests/overlays/production", fix="run from a checkout of coroner")


def api_env(cluster: Cluster) -> list[dict[str, str]]:
    return [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": str(cluster.apiserver_port)},
    ]


def overlay_patches(cluster: Cluster, *, seccomp_root: pathlib.Path) -> list[dict[str, Any]]:
    """The patches of the test overlay, as kustomize `patches` entries."""
    agent = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "coroner-agent", "namespace": SYSTEM_NAMESPACE},
        "spec": {
            "template": {
                "spec": {
                    "hostNetwork": True,
                    "initContainers": [{"name": "install-seccomp-profile", "imagePullPolicy": "Never"}],
                    "containers": [{"name": "agent", "imagePullPolicy": "Never", "env": api_env(cluster)}],
                    "volumes": [
                        {
                            "name": "kubelet-seccomp",
                            "hostPath": {"path": str(seccomp_root), "type": "DirectoryOrCreate"},
                        }
                    ],
                }
            }
        },
    }
    operator = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "coroner-operator", "namespace": SYSTEM_NAMESPACE},
        "spec": {
            "template": {
                "spec": {
                    "hostNetwork": True,
                    "containers": [
                        {
                            "name": "operator",
                            "imagePullPolicy": "Never",
                            "env": api_env(cluster),
                            "ports": None,
                            "livenessProbe": None,
                            "readinessProbe": None,
                        }
                    ],
                }
            }
        },
    }
    # The last --metrics-port wins.
    metrics = [{"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--metrics-port=0"}]
    return [
        {"patch": json.dumps(agent)},
        {"patch": json.dumps(operator)},
        {"target": {"kind": "Deployment", "name": "coroner-operator"}, "patch": json.dumps(metrics)},
    ]


def write_overlay(
    cluster: Cluster,
    *,
    base: str = "production",
    components: tuple[str, ...] = (),
    operator_args: tuple[str, ...] = (),
    release_file: pathlib.Path | None = None,
) -> pathlib.Path:
    """Writes the test overlay over `manifests/overlays/BASE` (plus `manifests/components/C` for each of
    COMPONENTS, as a user's own overlay adds them, and OPERATOR_ARGS appended to the operator's)
    into the cluster directory. With RELEASE_FILE (a release's `install-BASE.yaml`), over that file
    instead (copied in: kustomize reads files only under its own directory)."""
    layout = NodeLayout(directory=cluster.directory, name=cluster.nodes[-1])
    directory = cluster.directory / "overlays" / "-".join((base, *components, *(["release"] if release_file else [])))
    directory.mkdir(parents=True, exist_ok=True)
    manifests = repository() / "manifests"
    resource = os.path.relpath(manifests / "overlays" / base, directory)
    if release_file is not None:
        shutil.copyfile(release_file, directory / release_file.name)
        resource = release_file.name
    patches = overlay_patches(cluster, seccomp_root=layout.shared_seccomp_root)
    if operator_args:
        appended = [{"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": a} for a in operator_args]
        patches.append({"target": {"kind": "Deployment", "name": "coroner-operator"}, "patch": json.dumps(appended)})
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [resource],
        "components": [os.path.relpath(manifests / "components" / c, directory) for c in components],
        "patches": patches,
    }
    (directory / "kustomization.yaml").write_text(json.dumps(kustomization, indent=2) + "\n")
    return directory


def patch_installed(cluster: Cluster) -> None:
    """Applies the test overlay's patches to an installation made some other way (`helm install`):
    what a post-renderer would do, with `kubectl patch`; and the admission of its `helm test` Pod."""
    layout = NodeLayout(directory=cluster.directory, name=cluster.nodes[-1])
    agent, operator, metrics = overlay_patches(cluster, seccomp_root=layout.shared_seccomp_root)
    for kind, name, patch, kind_of_patch in (
        ("daemonset", "coroner-agent", agent, "strategic"),
        ("deployment", "coroner-operator", operator, "strategic"),
        ("deployment", "coroner-operator", metrics, "json"),
    ):
        kubectl(cluster, "-n", SYSTEM_NAMESPACE, "patch", kind, name, f"--type={kind_of_patch}", "-p", patch["patch"])
    helm_test_pods(cluster)


#: The dev cluster's own policy for the chart's `helm test` Pod (named without "coroner": it is no
#: part of an install, and an uninstall's check for leftovers does not count it).
HELM_TEST_POLICY = "dev-node-helm-test-pods"


def helm_test_pods(cluster: Cluster, *, timeout: float = 60) -> None:
    """A MutatingAdmissionPolicy (and binding) giving the chart's `helm test` Pods, labelled
    app.kubernetes.io/name=coroner-doctor-test, `hostNetwork` and the API server's loopback address
    as `overlay_patches` gives the workloads; returns once the API server enforces it (a policy is
    loaded a moment after it is created: a server-side dry run of such a Pod says when)."""
    env = ", ".join(
        f'Object.spec.containers.env{{name: "{item["name"]}", value: "{item["value"]}"}}' for item in api_env(cluster)
    )
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": HELM_TEST_POLICY},
        "spec": {
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "matchConstraints": {
                "resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
                ],
                "objectSelector": {"matchLabels": {"app.kubernetes.io/name": "coroner-doctor-test"}},
            },
            "mutations": [
                {
                    "patchType": "JSONPatch",
                    "jsonPatch": {
                        "expression": (
                            '[JSONPatch{op: "add", path: "/spec/hostNetwork", value: true}, '
                            f'JSONPatch{{op: "add", path: "/spec/containers/0/env", value: [{env}]}}]'
                        )
                    },
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": HELM_TEST_POLICY},
        "spec": {"policyName": HELM_TEST_POLICY},
    }
    apply_objects(cluster, [policy, binding])
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "helm-test-probe", "labels": {"app.kubernetes.io/name": "coroner-doctor-test"}},
        "spec": {"containers": [{"name": "doctor", "image": WORKER_IMAGE}]},
    }
    deadline = time.monotonic() + timeout
    while True:
        made = kubectl(
            cluster, "-n", SYSTEM_NAMESPACE, "create", "--dry-run=server", "-o", "json", "-f", "-",
            stdin=json.dumps(probe),
        )  # fmt: skip
        if json.loads(made.stdout)["spec"].get("hostNetwork"):
            return
        if time.monotonic() > deadline:
            raise DevClusterError(
                f"the MutatingAdmissionPolicy {HELM_TEST_POLICY} was not enforced within {timeout:g} s",
                fix=f"read the API server's log under {cluster.directory / 'logs'}",
            )
        time.sleep(0.5)


def rolled_out(cluster: Cluster, *, timeout: float = 240) -> None:
    """Waits until the agent DaemonSet and the operator Deployment are rolled out."""
    for kind in ("daemonset/coroner-agent", "deployment/coroner-operator"):
        kubectl(
            cluster,
            "-n",
            SYSTEM_NAMESPACE,
            "rollout",
            "status",
            kind,
            f"--timeout={int(timeout)}s",
            timeout=timeout + 10,
        )


def kubectl(
    cluster: Cluster, *args: str, check: bool = True, timeout: float = 120, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The real kubectl as the cluster's admin."""
    result = subprocess.run(
        [str(cluster.binary("kubectl")), f"--kubeconfig={cluster.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and result.returncode != 0:
        raise DevClusterError(
            f"kubectl {' '.join(args)} failed (exit {result.returncode}): {result.stderr.strip()[-1500:]}",
            fix=f"read the logs under {cluster.directory / 'logs'}",
        )
    return result


def prepare_nodes(cluster: Cluster) -> None:
    """Refuses a cluster with no real node; labels the first of several a control-plane node."""
    if not cluster.nodes:
        raise DevClusterError("this cluster has no real node", fix="start it with `coroner dev-cluster up --node NAME`")
    if len(cluster.nodes) > 1:
        # Every dev node shares this machine's one network namespace, where only one agent can bind
        # its metrics port: the first node is the control-plane node the agent's affinity avoids.
        kubectl(cluster, "label", "node", cluster.nodes[0], f"{api.CONTROL_PLANE_LABEL}=", "--overwrite")


def install(
    cluster: Cluster,
    *,
    base: str = "production",
    components: tuple[str, ...] = (),
    operator_args: tuple[str, ...] = (),
    timeout: float = 240,
    release_file: pathlib.Path | None = None,
) -> None:
    """Applies the overlay and waits until the agent DaemonSet and the operator Deployment are rolled out."""
    prepare_nodes(cluster)
    directory = write_overlay(
        cluster, base=base, components=components, operator_args=operator_args, release_file=release_file
    )
    # Part of a first apply is refused until the CRD it creates is served (what names its kind):
    # apply again until all of it lands, as a GitOps tool's next sync would.
    for attempt in range(30):
        result = kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-k", str(directory), check=False)
        if result.returncode == 0:
            break
        time.sleep(2)
        if attempt == 29:
            raise DevClusterError(
                f"kubectl apply -k {directory} failed for a minute: {result.stderr.strip()[-1500:]}",
                fix=f"read the message; the cluster's logs are under {cluster.directory / 'logs'}",
            )
    rolled_out(cluster, timeout=timeout)


def host_pid(namespace: str, number: int) -> int | None:
    """The host pid of the process numbered NUMBER in pid namespace NAMESPACE (`pid:[inode]`), if any:
    how a person with root on the node finds a container's process from a registration's incarnation."""
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, StopIteration, ValueError):
            if os.readlink(entry / "ns" / "pid") != namespace:
                continue
            status = (entry / "status").read_text().splitlines()
            nspid = next(line.split()[1:] for line in status if line.startswith("NSpid:"))
            if int(nspid[-1]) == number:
                return int(entry.name)
    return None


def in_container(pid: int, cid: str) -> bool:
    """Whether process PID is in container CID: the leaf of one of its cgroup paths (the kubelet's
    cgroupfs layout, `.../pod<uid>/<container id>`) is the id."""
    try:
        lines = pathlib.Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return False
    return any(line.rsplit("/", 1)[-1] == cid for line in lines)


def container_main_pid(cid: str) -> int | None:
    """The host pid of container CID's main process (the runtime's id, `containerd://<id>` without the
    scheme): of its processes, the first whose parent is not in it (the runtime's shim; a `kubectl exec`
    also has its parent outside, but starts later)."""
    pids = sorted(int(e.name) for e in pathlib.Path("/proc").iterdir() if e.name.isdigit())
    for pid in (pid for pid in pids if in_container(pid, cid)):
        with contextlib.suppress(OSError, procfs.ParseError):
            if not in_container(procfs.parse_status(pathlib.Path(f"/proc/{pid}/status").read_bytes()).ppid, cid):
                return pid
    return None


def incarnation_pid(registration: dict[str, Any]) -> int | None:
    """The host pid of a registration's very incarnation, if it is still running: its (pidNamespace,
    pid) held by a process with its startTime. A namespace's inode is reused once the namespace is
    gone (a restarted container's new pid namespace often gets the old inode back), so the pair alone
    can name a stranger."""
    incarnation = registration["spec"]["incarnation"]
    pid = host_pid(f"pid:[{incarnation['pidNamespace']}]", int(incarnation["pid"]))
    if pid is None:
        return None
    try:
        stat = procfs.parse_stat(pathlib.Path(f"/proc/{pid}/stat").read_bytes())
    except (OSError, procfs.ParseError):
        return None
    return pid if str(stat.start_time) == str(incarnation["startTime"]) else None


def worker_pod(
    name: str,
    *,
    namespace: str,
    node: str,
    cluster: Cluster,
    command: list[str],
    restart_policy: str = "Never",
    service_account: str = "coroner-worker",
) -> dict[str, Any]:
    """A Pod whose container runs `coroner run -- COMMAND` in its own pid namespace (as any worker's
    Pod does), registering itself on `node` with role NAME: each run of the container is a new
    incarnation and a new registration (`<role>-<random>`), as when the kubelet restarts it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {
            "nodeName": node,
            "serviceAccountName": service_account,
            "restartPolicy": restart_policy,
            "hostNetwork": True,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 20,
            "containers": [
                {
                    "name": "worker",
                    "image": WORKER_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["coroner", "run", "--namespace", namespace, "--role", name, "--", *command],
                    "env": [
                        *api_env(cluster),
                        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    ],
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }


def registrar_on_the_node(cluster: Cluster, document: dict[str, Any]) -> dict[str, Any]:
    """An injected manifest (`coroner.core.inject`'s or `kubectl coroner inject`'s output) as the test
    overlay runs it here: every `coroner-registrar` container, in every Pod template of the document
    (a List's too), given the API server's loopback address (`api_env`); nothing else changes. A copy."""
    changed: dict[str, Any] = json.loads(json.dumps(document))

    def visit(value: Any) -> None:
        if isinstance(value, dict):
            for container in value.get("initContainers") or []:
                if isinstance(container, dict) and container.get("name") == inject.CONTAINER_NAME:
                    container["env"] = [*(container.get("env") or []), *api_env(cluster)]
            for child in value.values():
                visit(child)
        elif isinstance(value, list):
            for child in value:
                visit(child)

    visit(changed)
    return changed


def example_on_the_node(cluster: Cluster, document: dict[str, Any], *, namespace: str, node: str) -> dict[str, Any]:
    """A document of examples/ (injected or not) as the test overlay runs it here: in `namespace` (for
    the examples' `workers`, a RoleBinding's subjects too), its Pod template with `hostNetwork` and
    `node`'s selector, and the registrar given the API server's address (`registrar_on_the_node`). A copy."""
    changed: dict[str, Any] = json.loads(json.dumps(document))
    changed["metadata"]["namespace"] = namespace
    for subject in changed.get("subjects") or []:
        subject["namespace"] = namespace
    path = inject.template_path(changed)
    if path is not None:
        template = changed
        for key in path:
            template = template[key]
        template["spec"]["hostNetwork"] = True
        template["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return registrar_on_the_node(cluster, changed)


def worker_rbac(namespace: str, *, service_account: str = "coroner-worker") -> list[dict[str, Any]]:
    """The worker ServiceAccount in NAMESPACE bound to the shipped ClusterRole `coroner-worker`."""
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": service_account, "namespace": namespace}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": service_account, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "coroner-worker"},
            "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
        },
    ]


def apply_objects(cluster: Cluster, objects: list[dict[str, Any]]) -> None:
    """`kubectl apply` of OBJECTS (as one List)."""
    kubectl(cluster, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))


def pool_deployment(
    cluster: Cluster,
    name: str,
    *,
    namespace: str,
    pool: str,
    replicas: int,
    command: list[str] | None = None,
    grace_seconds: int | None = None,
) -> dict[str, Any]:
    """A Deployment of `coroner run` workers (`worker_pod`) that only a node of Karpenter's NodePool
    POOL can run, each asking for a little CPU and memory so the pool sizes nodes for them."""
    pod = worker_pod(
        name,
        namespace=namespace,
        node="",
        cluster=cluster,
        command=command or ["sleep", "3600"],
        restart_policy="Always",
    )
    spec = pod["spec"]
    del spec["nodeName"]
    spec["nodeSelector"] = {"karpenter.sh/nodepool": pool}
    if grace_seconds is not None:
        spec["terminationGracePeriodSeconds"] = grace_seconds
    spec["containers"][0]["resources"] = {"requests": {"cpu": "50m", "memory": "64Mi"}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }
