"""Kubernetes client construction shared by every I/O shell (operator, agent, launcher, CLI).

Pure modules never import this. Clients are built from an explicit kubeconfig when given, from the
in-cluster ServiceAccount when running in a pod, else from the default kubeconfig.
"""

from __future__ import annotations

import os

import kubernetes
from kubernetes.client import ApiClient


def api_client(kubeconfig: str | os.PathLike[str] | None = None) -> ApiClient:
    """An ApiClient for one identity; never shares global configuration between identities."""
    if kubeconfig:
        return kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        configuration = kubernetes.client.Configuration()
        kubernetes.config.load_incluster_config(client_configuration=configuration)
        return ApiClient(configuration)
    return kubernetes.config.new_client_from_config()
