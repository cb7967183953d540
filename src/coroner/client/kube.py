"""The `kubernetes` package's client, for the human-facing CLI (full kubeconfig support: contexts,
exec credential plugins, `--context`), the dev cluster, the demo and the tests.

The resident processes — the operator, the agent and the launcher (one per worker) — speak the
lighter `coroner.client.rest` instead (see there why).

Pure modules never import this. Clients are built from an explicit kubeconfig when given, from the
in-cluster ServiceAccount when running in a pod, else from the default kubeconfig.
"""

from __future__ import annotations

import os
from typing import Any, cast

import kubernetes
from kubernetes.client import ApiClient

from coroner.core import api
from coroner.core.wire import JSON_PATCH, MERGE_PATCH


def api_client(kubeconfig: str | os.PathLike[str] | None = None) -> ApiClient:
    """An ApiClient for one identity; never shares global configuration between identities."""
    # The kubernetes package's config loaders carry no annotations.
    if kubeconfig:
        return cast(ApiClient, kubernetes.config.new_client_from_config(config_file=str(kubeconfig)))  # type: ignore[no-untyped-call]
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        configuration = kubernetes.client.Configuration()
        kubernetes.config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return ApiClient(configuration)
    return cast(ApiClient, kubernetes.config.new_client_from_config())  # type: ignore[no-untyped-call]


def patch_registration_status(
    client: ApiClient, *, namespace: str, name: str, body: list[dict[str, Any]] | dict[str, Any]
) -> dict[str, Any]:
    """Patches /status; a list is sent as a JSON patch (with its `test`s), a dict as a merge patch.

    The generated client sends every body as a merge patch unless told otherwise, which would turn a
    compare-and-swap JSON patch into a 400; the content type is therefore always explicit here.
    """
    result = kubernetes.client.CustomObjectsApi(client).patch_namespaced_custom_object_status(
        api.GROUP,
        api.VERSION,
        namespace,
        api.PLURAL,
        name,
        body,
        _content_type=JSON_PATCH if isinstance(body, list) else MERGE_PATCH,
    )
    return cast(dict[str, Any], result)
