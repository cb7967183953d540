"""Session fixtures: one real control plane (etcd + kube-apiserver) for every integration test.

Set CORONER_TEST_CLUSTER_DIR to reuse a running dev cluster between runs (it is then left
running); otherwise a fresh one is started in a temporary directory and stopped at the end.
"""

from __future__ import annotations

import os
import pathlib
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from coroner.client.kube import api_client
from coroner_dev.devcluster import cluster as cluster_mod
from coroner_dev.devcluster.cluster import Cluster
from support import kube


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reuse = os.environ.get("CORONER_TEST_CLUSTER_DIR")
    directory = pathlib.Path(reuse) if reuse else tmp_path_factory.mktemp("cluster")
    started = cluster_mod.up(directory)
    try:
        yield started
    finally:
        if not reuse:
            cluster_mod.down(directory)


@pytest.fixture(scope="session")
def admin(cluster: Cluster) -> Iterator[k8s.ApiClient]:
    with api_client(cluster.kubeconfig) as client:
        yield client


@pytest.fixture(scope="session")
def coroner_api(cluster: Cluster) -> Cluster:
    """The CRD and admission policies installed (idempotent across the session)."""
    kube.install_api(cluster)
    return cluster


@pytest.fixture
def namespace(admin: k8s.ApiClient) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = k8s.CoreV1Api(admin)
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        core.delete_namespace(name)
