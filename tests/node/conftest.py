"""The real node: one dev cluster with a kubelet, containerd and runc (`coroner dev-cluster up --node`),
Coroner's images built here and imported, and the shipped production overlay installed through the
one test overlay (`coroner_dev.realnode`). One per pytest run: the node's first start builds and
imports the images, and every test here shares it.

Set CORONER_TEST_NODE_CLUSTER_DIR to reuse a running node cluster between runs (it is then left
running).
"""

from __future__ import annotations

import os
import pathlib
import uuid
from collections.abc import Iterator

import pytest

from coroner_dev import realnode
from coroner_dev.devcluster import cluster as cluster_mod
from coroner_dev.devcluster.cluster import Cluster
from support.nodes import NODES, kubectl, wait_for


@pytest.fixture(scope="session")
def node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reuse = os.environ.get("CORONER_TEST_NODE_CLUSTER_DIR")
    directory = pathlib.Path(reuse) if reuse else tmp_path_factory.mktemp("node-cluster")
    started = cluster_mod.up(directory, nodes=NODES, progress=print)
    try:
        realnode.install(started)
        yield started
    finally:
        if not reuse:
            cluster_mod.down(directory)


@pytest.fixture
def worker_namespace(node_cluster: Cluster) -> Iterator[str]:
    """A namespace with the worker ServiceAccount bound to the shipped ClusterRole coroner-worker."""
    name = f"w-{uuid.uuid4().hex[:8]}"
    kubectl(node_cluster, "create", "namespace", name)
    realnode.apply_objects(node_cluster, realnode.worker_rbac(name))
    wait_for(
        lambda: (
            kubectl(node_cluster, "-n", name, "get", "serviceaccount", "coroner-worker", check=False).returncode == 0
        ),
        timeout=30,
        what="the worker ServiceAccount",
    )
    try:
        yield name
    finally:
        kubectl(node_cluster, "delete", "namespace", name, "--wait=false", check=False)
