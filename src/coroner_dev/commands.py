"""`coroner dev-cluster` and `coroner demo`: the dev tooling's commands, added to `coroner` where installed."""

from __future__ import annotations

import pathlib
import sys

import click

from coroner_dev.devcluster.errors import DevClusterError


@click.group("dev-cluster")
def dev_cluster() -> None:
    """A real local control plane (etcd + kube-apiserver) built from Go modules."""


_dir_option = click.option(
    "--dir",
    "directory",
    required=True,
    type=click.Path(file_okay=False, path_type=pathlib.Path),
    help="Directory holding the cluster's state, certificates, logs and kubeconfig.",
)


def _fail(exc: DevClusterError) -> None:
    click.echo(f"error: {exc}", err=True)
    sys.exit(1)


@dev_cluster.command("up")
@_dir_option
@click.option("--no-controller-manager", is_flag=True, help="Do not start kube-controller-manager.")
@click.option(
    "--node",
    "nodes",
    multiple=True,
    metavar="NAME",
    help="Also start a real node of this name (repeat for more): kube-scheduler, containerd + runc and a "
    "kubelet, with Coroner's images built and imported (needs root and cgroup v1; minutes the first time).",
)
@click.option(
    "--karpenter",
    "with_karpenter",
    is_flag=True,
    help="Also run Karpenter (built with the dev cloud provider, cached), its CRDs and its chart's RBAC: "
    "its NodeClaims become real dev nodes (needs --node; docs/autoscaling.md).",
)
def dev_cluster_up(
    directory: pathlib.Path, no_controller_manager: bool, nodes: tuple[str, ...], with_karpenter: bool
) -> None:
    """Build (cached) and start the control plane; idempotent; returns once the API is ready."""
    from coroner_dev.devcluster import cluster

    try:
        started = cluster.up(directory, controller_manager=not no_controller_manager, nodes=nodes, progress=click.echo)
        if with_karpenter:
            from coroner_dev.devcluster import karpenter

            started = karpenter.start(started, progress=click.echo)
            click.echo(f"Karpenter running; its NodePools name DevNodeClass {karpenter.NODE_CLASS!r}")
    except DevClusterError as exc:
        _fail(exc)
        return
    click.echo(f"API server ready at {started.server}")
    click.echo(f"export KUBECONFIG={started.kubeconfig}")


@dev_cluster.command("build")
@click.option(
    "--node",
    is_flag=True,
    help="Also the real node's binaries (kubelet, kube-scheduler, containerd, runc, crictl) and Coroner's images.",
)
@click.option("--karpenter", "with_karpenter", is_flag=True, help="Also Karpenter with the dev cloud provider.")
def dev_cluster_build(node: bool, with_karpenter: bool) -> None:
    """Build (or find cached, or take from KUBEBUILDER_ASSETS) the control plane binaries."""
    from coroner_dev.devcluster.binaries import ensure_binaries

    try:
        binaries = ensure_binaries(progress=click.echo)
        click.echo(f"control plane binaries ({binaries.source}): {binaries.directory}")
        if with_karpenter:
            from coroner_dev.devcluster.karpenter import ensure_karpenter

            click.echo(f"Karpenter: {ensure_karpenter(progress=click.echo)}")
        if node:
            from coroner_dev.devcluster.images import ensure_images
            from coroner_dev.devcluster.nodebinaries import ensure_node_binaries

            node_binaries = ensure_node_binaries(progress=click.echo)
            click.echo(f"node binaries: {node_binaries.kubernetes}, {node_binaries.runtime}, {node_binaries.runc_dir}")
            images = ensure_images(progress=click.echo)
            click.echo(f"images ({images.source}): {images.directory}")
    except DevClusterError as exc:
        _fail(exc)


@dev_cluster.command("down")
@_dir_option
def dev_cluster_down(directory: pathlib.Path) -> None:
    """Stop what `up` started in DIR, and nothing else."""
    from coroner_dev.devcluster import cluster

    try:
        stopped = cluster.down(directory)
    except DevClusterError as exc:
        _fail(exc)
        return
    click.echo(f"stopped: {', '.join(stopped)}" if stopped else f"nothing running in {directory}")


@dev_cluster.command("token")
@_dir_option
@click.option("--service-account", required=True, help="NAMESPACE/NAME of the ServiceAccount.")
@click.option(
    "--node",
    default=None,
    help="Bind the token to a stand-in Pod of the ServiceAccount on this Node (both created if missing), as the kubelet binds a Pod's token.",
)
def dev_cluster_token(directory: pathlib.Path, service_account: str, node: str | None) -> None:
    """Mint a ServiceAccount token and print the path of a kubeconfig that uses it."""
    from coroner_dev.devcluster import cluster, identities

    try:
        running = cluster.Cluster.load(directory.resolve())
        if running is None or not cluster.is_ready(running):
            raise DevClusterError(
                f"no ready dev cluster in {directory}",
                fix=f"run `coroner dev-cluster up --dir {directory}` first",
            )
        click.echo(identities.mint_token(running, service_account=service_account, node=node))
    except DevClusterError as exc:
        _fail(exc)


@dev_cluster.command("images")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON summary (references, archives, sizes).")
def dev_cluster_images(as_json: bool) -> None:
    """Build (cached) the agent, operator and registrar images, the test workers' (Python and Go) and
    the pause image with buildah: OCI archives for `ctr -n k8s.io images import --local`."""
    import json

    from coroner_dev.devcluster.images import ensure_images

    try:
        built = ensure_images(progress=lambda message: click.echo(message, err=True))
    except DevClusterError as exc:
        _fail(exc)
        return
    if as_json:
        click.echo(json.dumps(built.summary(), indent=2))
        return
    click.echo(f"images ({built.source}, key {built.key}): {built.directory}")
    for image in built.all():
        click.echo(f"  {image.reference}  {image.archive.name}  {image.uncompressed_bytes / 1e6:.1f} MB")


@dev_cluster.command("install")
@_dir_option
@click.argument("what", type=click.Choice(["plan-only", "production", "chart"]))
@click.option(
    "--release",
    type=click.Path(file_okay=False, exists=True, path_type=pathlib.Path),
    default=None,
    help="Install from this release directory (what `make release` wrote: dist/) instead of this checkout.",
)
@click.option("--set", "values", multiple=True, metavar="KEY=VALUE", help="A chart value (chart only; repeat).")
def dev_cluster_install(
    directory: pathlib.Path, what: str, release: pathlib.Path | None, values: tuple[str, ...]
) -> None:
    """Install Coroner as the README does (WHAT: plan-only, production or chart) on the dev cluster with
    real nodes, with the dev node's patches (docs/real-node.md); returns once the agents and the
    operator run."""
    from coroner_dev import devinstall

    try:
        running = devinstall.install(directory, what, release=release, values=values, say=click.echo)
    except DevClusterError as exc:
        _fail(exc)
        return
    click.echo(f"installed {what}; export KUBECONFIG={running.kubeconfig}")
    expect = (
        ""
        if what == "production" or any(v.startswith("retireGrant.enabled=true") for v in values)
        else " --expect-plan-only"
    )
    click.echo(f"then: kubectl coroner doctor{expect}")


@click.command("demo")
@click.option(
    "--dir",
    "directory",
    default=".cluster/demo",
    show_default=True,
    type=click.Path(file_okay=False, path_type=pathlib.Path),
    help="Where the demo's control plane lives.",
)
@click.option("--keep", is_flag=True, help="Leave the control plane running afterwards.")
@click.option(
    "--real-node",
    is_flag=True,
    help="Run Coroner as it ships: its images, DaemonSet and Deployment under real kubelets + containerd, "
    "workers in Pods (root; the first run builds the node and the images).",
)
def demo(directory: pathlib.Path, keep: bool, real_node: bool) -> None:
    """Run the main job on a local control plane, start to finish, and explain what happens."""
    from coroner_dev.demo import run_demo
    from coroner_dev.demo_node import run_real_node_demo

    try:
        if real_node:
            run_real_node_demo(directory=directory, keep=keep)
        else:
            run_demo(directory=directory, keep=keep)
    except DevClusterError as exc:
        _fail(exc)
