"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from coroner.client.kube import api_client
from coroner_dev.devcluster.cluster import Cluster
from support import components, kube


@pytest.fixture(scope="module")
def granted(cluster: Cluster) -> Cluster:
    """The production install (the operator holds `retire`), once per module."""
    components.install(cluster, grant=True)
    return cluster


@pytest.fixture
def agent_a(granted: Cluster, admin: k8s.ApiClient) -> Iterator[k8s.ApiClient]:
    """node-a's agent: its Lease on registration_body's boot and host, and its own identity."""
    components.put_agent_lease(admin, node="node-a", boot_id=kube.BOOT_ID, host_id=kube.HOST_ID)
    with api_client(components.agent_kubeconfig(granted, "node-a")) as client:
        yield client


@pytest.fixture(scope="module")
def plane(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The production install with the operator running, once per module (end-to-end tests)."""
    components.install(cluster, grant=True)
    logs = tmp_path_factory.mktemp("operator")
    with components.process(
        components.operator_argv(components.operator_kubeconfig(cluster)), log=logs / "operator.log"
    ):
        yield cluster
