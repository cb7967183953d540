"""`coroner dev-cluster install`: the README's install steps, on the dev cluster with real nodes.

A cluster of your own runs `kubectl apply -f install-plan-only.yaml` (or `-production`, or `helm
install`) as it is. The dev cluster cannot: it runs no CNI plugin and no kube-proxy, its API server
listens on loopback only, and no registry is reachable, so Pods of the shipped manifests would wait
in `ContainerCreating` (`failed to find plugin "loopback" in path`). This command installs the same
objects with exactly the dev node's patches on top (`coroner_dev.realnode`, docs/real-node.md:
hostNetwork and the loopback API address, `imagePullPolicy: Never`, the seccomp path, the operator's
metrics port), from this checkout or from a release directory (`make release`'s `dist/`), and
waits until the agents and the operator run:

- `plan-only`, `production`: the kustomize overlay (`manifests/overlays/NAME`, or the release's
  `install-NAME.yaml`) applied server-side, as `kubectl apply` would;
- `chart`: `helm install coroner` of `charts/coroner` (or the release's packaged chart) into
  `coroner-system`, with the `--set` values given, then the same patches with `kubectl patch`
  (what a post-renderer would do).

From a release, its image archives are imported into every node first and named by digest too
(`repository@sha256:...`, the name a registry pull gives an image), since the release's manifests
pin the images by digest and the dev nodes pull nothing.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
from collections.abc import Callable, Sequence

from coroner_dev import realnode
from coroner_dev.devcluster.cluster import Cluster
from coroner_dev.devcluster.errors import DevClusterError

CHOICES = ("plan-only", "production", "chart")
RELEASE_NAME = "coroner"


def release_file(release: pathlib.Path, pattern: str) -> pathlib.Path:
    """The one file of the release directory matching PATTERN."""
    found = sorted(release.glob(pattern))
    if len(found) != 1:
        raise DevClusterError(
            f"{release} holds {len(found)} files matching {pattern}, not one",
            fix="point --release at the directory `make release` wrote (dist/)",
        )
    return found[0]


def import_release_images(cluster: Cluster, release: pathlib.Path) -> None:
    """The release's images (images.json) in every node's containerd, under their tag and their digest."""
    from coroner_dev.devcluster.node import NodeLayout, ctr
    from coroner_dev.devcluster.nodebinaries import ensure_node_binaries

    images = json.loads(release_file(release, "images.json").read_text())["images"]
    binaries = ensure_node_binaries()
    for node in cluster.nodes:
        layout = NodeLayout(directory=cluster.directory, name=node)
        for entry in images.values():
            ctr(layout, binaries, "images", "import", "--local", str(release / entry["archive"]))
            repository = entry["reference"].rsplit(":", 1)[0]
            ctr(layout, binaries, "images", "tag", "--force", entry["reference"], f"{repository}@{entry['digest']}")


def helm(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """helm (built from Go modules, cached) as the cluster's admin."""
    from coroner_dev.devcluster.tools import ensure_tools

    command = [str(ensure_tools().path("helm")), f"--kubeconfig={cluster.kubeconfig}", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0:
        raise DevClusterError(
            f"helm {' '.join(args)} failed (exit {result.returncode}): {result.stderr.strip()[-1500:]}",
            fix="read the message; `helm list -A` shows what is installed",
        )
    return result


def install(
    directory: pathlib.Path,
    what: str,
    *,
    release: pathlib.Path | None = None,
    values: Sequence[str] = (),
    say: Callable[[str], None] = print,
) -> Cluster:
    """Installs WHAT (one of CHOICES) on the dev cluster in DIRECTORY; returns the cluster."""
    from coroner_dev.devcluster import cluster as cluster_mod

    running = cluster_mod.Cluster.load(directory.resolve())
    if running is None or not cluster_mod.is_ready(running):
        raise DevClusterError(
            f"no ready dev cluster in {directory}",
            fix=f"start one with real nodes: coroner dev-cluster up --dir {directory} --node coroner-node-0 "
            "--node coroner-node-1",
        )
    if what not in CHOICES:
        raise DevClusterError(f"cannot install {what!r}", fix=f"choose one of {', '.join(CHOICES)}")
    if values and what != "chart":
        raise DevClusterError("--set is for the chart only", fix=f"coroner dev-cluster install --dir {directory} chart")
    if release is not None:
        say(f"importing the images of {release} into the nodes {', '.join(running.nodes)}")
        import_release_images(running, release)
    if what == "chart":
        chart = release_file(release, "coroner-*.tgz") if release else realnode.repository() / "charts" / "coroner"
        say(f"helm install {RELEASE_NAME} {chart} into {realnode.SYSTEM_NAMESPACE}, then the dev node's patches")
        realnode.prepare_nodes(running)
        settings = [argument for value in values for argument in ("--set", value)]
        # --force-conflicts: the dev node's patches of a previous install own some fields (kubectl
        # patch's field manager); Helm's server-side apply takes them back, and they are re-applied below.
        helm(running, "upgrade", "--install", RELEASE_NAME, str(chart), "--namespace", realnode.SYSTEM_NAMESPACE,
             "--create-namespace", "--force-conflicts", *settings)  # fmt: skip
        realnode.patch_installed(running)
        realnode.rolled_out(running)
    else:
        source = release_file(release, f"install-{what}.yaml") if release else None
        say(f"applying {source or f'manifests/overlays/{what}'} with the dev node's patches (docs/real-node.md)")
        realnode.install(running, base=what, release_file=source)
    return running
