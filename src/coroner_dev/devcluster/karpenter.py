"""Karpenter as a process of the dev cluster, its cloud being this machine's dev nodes.

Karpenter's core (`sigs.k8s.io/karpenter`, `KARPENTER_VERSION`) is built with the dev cloud provider
(testenv/karpenter: a Go module of its own, modelled on Karpenter's kwok provider) and cached like
the kubelet, under `<cache>/karpenter/<version>-<digest>/`; the digest covers the module's go.mod,
go.sum and its own sources. Karpenter needs a newer Go than the rest (`TOOLCHAIN`): the go command
fetches that toolchain from the module proxy on the first build.

`start` installs what Karpenter's own release installs, from the very module it was built from:
its CRDs (`pkg/apis/crds`: NodePool, NodeClaim, NodeOverlay, CapacityBuffer) and the RBAC of its
shipped chart (`kwok/charts`, rendered by `helm template`: its ServiceAccount, ClusterRoles, Roles
and bindings), plus the dev cloud's NodeClass (`DevNodeClass`, one named `NODE_CLASS`) and the one
ClusterRole that reads it, as kwok's chart has one for its own. Karpenter runs under that
ServiceAccount's token, with leader election in kube-system as shipped, and is recorded among the
cluster's processes: `down` stops it first, then terminates every instance it launched
(`karpenter_instances`). Its metrics and health ports are free ports on this machine.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import yaml

from coroner_dev.devcluster import gobuild, identities, karpenter_instances
from coroner_dev.devcluster.cluster import Cluster, _spawn, free_port, http_get, save, stop_process, wait_ready
from coroner_dev.devcluster.errors import DevClusterError

KARPENTER_VERSION = "v1.15.0"
#: Karpenter v1.15 needs Go 1.26.9 or later.
TOOLCHAIN = "go1.27.3"
MODULE = "sigs.k8s.io/karpenter"
PROCESS = "karpenter"
NAMESPACE = "kube-system"
SERVICE_ACCOUNT = "karpenter"
NODE_CLASS = "dev"
#: The kinds of the chart that are its RBAC (the rest runs Karpenter in a Pod, which the dev cluster
#: does not: no CNI reaches the API server from a Pod's network).
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
READY_TIMEOUT = 120.0
#: Where `start` notes the free port Karpenter serves /metrics on.
METRICS_PORT_FILE = "karpenter-metrics-port"


def module_dir() -> pathlib.Path:
    return gobuild.testenv_dir() / "karpenter"


def karpenter_build() -> gobuild.GoBuild:
    return gobuild.GoBuild(
        title="Karpenter with the dev cloud provider",
        module=module_dir(),
        packages={"karpenter": "coroner.dev/testenv/karpenter"},
        cache_dir="karpenter",
        versions=f"karpenter-{KARPENTER_VERSION}",
        ldflags=f"-s -w -X sigs.k8s.io/karpenter/pkg/operator.Version={KARPENTER_VERSION}",
        announce=f"building Karpenter {KARPENTER_VERSION} with the dev cloud provider (toolchain {TOOLCHAIN}, fetched by "
        "the go command the first time); the first build takes 8-10 minutes on 2 shared cores",
        go_missing_fix="install Go >= 1.21 (it fetches the toolchain Karpenter needs) and put it on PATH",
        override="CORONER_KARPENTER_DIR",
        # One package compiled at a time: the machine's cores are shared with everything else.
        env={"GOTOOLCHAIN": TOOLCHAIN, "GOFLAGS": "-mod=mod -p=1"},
        sources=("*.go", "*/*.go", "*/*/*.go"),
    )


def ensure_karpenter(*, progress: Callable[[str], None] | None = None) -> pathlib.Path:
    """The Karpenter binary, built (once, under a lock) when none is cached."""
    say = progress or (lambda message: print(message, file=sys.stderr))
    directory, _ = gobuild.ensure(karpenter_build(), say=say)
    return directory / "karpenter"


def module_source() -> pathlib.Path:
    """Karpenter's module as the module cache holds it (downloaded by the go command if missing)."""
    go = shutil.which("go")
    if go is None:
        raise DevClusterError("the Go toolchain (`go`) is not on PATH", fix="install Go and put it on PATH")
    result = subprocess.run(
        [go, "mod", "download", "-json", f"{MODULE}@{KARPENTER_VERSION}"],
        cwd=module_dir(),
        env={**os.environ, "GOTOOLCHAIN": TOOLCHAIN},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if result.returncode != 0:
        raise DevClusterError(
            f"go mod download {MODULE}@{KARPENTER_VERSION} failed: {result.stderr.strip()[-800:]}",
            fix="check that the Go module proxy is reachable (GOPROXY)",
        )
    return pathlib.Path(json.loads(result.stdout)["Dir"])


def crds(source: pathlib.Path) -> list[pathlib.Path]:
    """Karpenter's own CRDs, then the dev cloud's NodeClass."""
    return sorted((source / "pkg" / "apis" / "crds").glob("*.yaml")) + sorted((module_dir() / "crds").glob("*.yaml"))


def chart_rbac(source: pathlib.Path, *, helm: pathlib.Path) -> list[dict[str, Any]]:
    """The RBAC objects of Karpenter's shipped chart, rendered for namespace NAMESPACE."""
    rendered = subprocess.run(
        [str(helm), "template", "karpenter", str(source / "kwok" / "charts"), "--namespace", NAMESPACE],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if rendered.returncode != 0:
        raise DevClusterError(
            f"helm template of Karpenter's chart failed: {rendered.stderr.strip()[-800:]}",
            fix=f"read the chart under {source / 'kwok' / 'charts'}",
        )
    return [o for o in yaml.safe_load_all(rendered.stdout) if o and o.get("kind") in RBAC_KINDS]


def node_class_rbac() -> list[dict[str, Any]]:
    """Reading the dev cloud's NodeClass: the one grant the chart cannot know of."""
    name = "karpenter-devcloud"
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": [
                {
                    "apiGroups": ["devcloud.coroner.dev"],
                    "resources": ["devnodeclasses"],
                    "verbs": ["get", "list", "watch"],
                },
                {
                    "apiGroups": ["devcloud.coroner.dev"],
                    "resources": ["devnodeclasses", "devnodeclasses/status"],
                    "verbs": ["patch", "update"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}],
        },
    ]


def install(cluster: Cluster) -> None:
    """Karpenter's CRDs, its chart's RBAC, the dev NodeClass and its grant."""
    from coroner_dev import realnode
    from coroner_dev.devcluster.tools import ensure_tools

    source = module_source()
    for crd in crds(source):
        realnode.kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", str(crd))
    realnode.kubectl(
        cluster, "wait", "--for=condition=Established", "--timeout=60s", *(f"-f={c}" for c in crds(source))
    )
    objects = chart_rbac(source, helm=ensure_tools().path("helm")) + node_class_rbac()
    objects.append(
        {"apiVersion": "devcloud.coroner.dev/v1alpha1", "kind": "DevNodeClass", "metadata": {"name": NODE_CLASS}}
    )
    document = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    realnode.kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=document)


def environment(cluster: Cluster, *, kubeconfig: pathlib.Path, metrics: int, health: int) -> dict[str, str]:
    """Karpenter's settings (as its chart's Deployment sets them) and the dev cloud's two, over this
    process's environment: the instances it boots find the same caches (CORONER_CACHE_DIR, say)."""
    return {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "SYSTEM_NAMESPACE": NAMESPACE,
        "LEADER_ELECTION_NAMESPACE": NAMESPACE,
        "METRICS_PORT": str(metrics),
        "HEALTH_PROBE_PORT": str(health),
        "LOG_LEVEL": "debug",
        "CORONER_DEVCLOUD_COMMAND": json.dumps(
            [sys.executable, "-m", karpenter_instances.MODULE, "--dir", str(cluster.directory)]
        ),
        "CORONER_DEVCLOUD_RECORDS": str(karpenter_instances.records_dir(cluster.directory)),
    }


def start(cluster: Cluster, *, progress: Callable[[str], None] | None = None) -> Cluster:
    """Installs and starts Karpenter for CLUSTER (which must have real nodes); returns the cluster
    with Karpenter recorded among its processes, once Karpenter reports ready."""
    if not cluster.nodes:
        raise DevClusterError("Karpenter's nodes need the node binaries", fix="start the cluster with --node NAME")
    running = next((p for p in cluster.processes if p.name == PROCESS and p.alive()), None)
    if running is not None:
        return cluster
    from coroner_dev.devcluster.images import ensure_images

    binary = ensure_karpenter(progress=progress)
    built = ensure_images(progress=progress)
    karpenter_instances.use_images(
        cluster.directory,
        archives=[(i.reference, i.archive) for i in sorted(built.all(), key=lambda i: i is not built.pause)],
        sandbox=built.pause.reference,
    )
    install(cluster)
    kubeconfig = identities.mint_token(cluster, service_account=f"{NAMESPACE}/{SERVICE_ACCOUNT}")
    health, metrics = free_port(), free_port()
    log = cluster.directory / "logs" / "karpenter.log"
    process = _spawn(
        PROCESS,
        [str(binary)],
        log=log,
        env=environment(cluster, kubeconfig=kubeconfig, metrics=metrics, health=health),
    )
    (cluster.directory / METRICS_PORT_FILE).write_text(f"{metrics}\n")
    try:
        wait_ready(
            "Karpenter",
            lambda: http_get(host="127.0.0.1", port=health, path="/readyz", context=None)[0] == 200,
            process=process,
            log=log,
            timeout=READY_TIMEOUT,
        )
    except BaseException:
        stop_process(process)
        raise
    cluster = dataclasses.replace(cluster, processes=(*cluster.processes, process))
    save(cluster)
    return cluster


def metrics(cluster: Cluster) -> str:
    """The text of the running Karpenter's /metrics (its eviction requests by response code, say)."""
    port = int((cluster.directory / METRICS_PORT_FILE).read_text())
    status, body = http_get(host="127.0.0.1", port=port, path="/metrics", context=None)
    if status != 200:
        raise DevClusterError(f"Karpenter's /metrics answered {status}", fix=f"read {cluster.directory / 'logs'}")
    return body.decode()


def stop(directory: pathlib.Path) -> list[str]:
    """Stops Karpenter in the cluster in DIR, then terminates every instance it launched (so nothing
    launches one again meanwhile); returns the instances terminated."""
    directory = directory.resolve()
    cluster = Cluster.load(directory)
    if cluster is not None:
        for process in (p for p in cluster.processes if p.name == PROCESS):
            stop_process(process)
        save(dataclasses.replace(cluster, processes=tuple(p for p in cluster.processes if p.name != PROCESS)))
    return karpenter_instances.terminate_all(directory)


def node_pool(name: str, *, cpu_limit: str = "2", expire_after: str = "Never") -> dict[str, Any]:
    """A NodePool of dev instances (`dev.host`), at most CPU_LIMIT CPUs of them (one node per 2), whose
    nodes expire after EXPIRE_AFTER, never consolidated by itself (whoever applies it decides when a
    node goes, or patches its disruption)."""
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "spec": {
                    "nodeClassRef": {"group": "devcloud.coroner.dev", "kind": "DevNodeClass", "name": NODE_CLASS},
                    "requirements": [
                        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["dev.host"]}
                    ],
                    "expireAfter": expire_after,
                }
            },
            "limits": {"cpu": cpu_limit},
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "Never"},
        },
    }
