"""`coroner demo`: the main job, start to finish, on the local control plane."""

from __future__ import annotations

import pathlib
import subprocess

import click

from coroner.devcluster import cluster as cluster_mod

DEFAULT_DIR = pathlib.Path(".cluster/demo")


def run_demo(*, directory: pathlib.Path, keep: bool) -> None:
    """Placeholder until the full demo lands: starts the control plane and shows what it serves."""
    running = cluster_mod.up(directory, progress=click.echo)
    try:
        kubectl = str(running.binary("kubectl"))
        repo = pathlib.Path(__file__).resolve().parents[2]
        subprocess.run(
            [
                kubectl,
                f"--kubeconfig={running.kubeconfig}",
                "apply",
                "-f",
                str(repo / "manifests/base/crd.yaml"),
            ],
            check=True,
        )
        subprocess.run([kubectl, f"--kubeconfig={running.kubeconfig}", "get", "nodes,crd"], check=True)
    finally:
        if not keep:
            cluster_mod.down(directory)
