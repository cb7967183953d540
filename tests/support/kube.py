"""Test-side access to the real dev cluster: kubectl, manifests, identities, waiting."""

from __future__ import annotations

import json
import pathlib
import subprocess
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.client.kube import patch_registration_status
from coroner.core import api, kubewire
from coroner_dev import fleet
from coroner_dev.devcluster.cluster import Cluster

REPO = fleet.REPO
MANIFESTS = fleet.MANIFESTS

T = TypeVar("T")


def kubectl(
    cluster: Cluster,
    *args: str,
    kubeconfig: pathlib.Path | None = None,
    check: bool = True,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Runs the real kubectl built with the control plane; with `check`, a failure fails the test."""
    result = fleet.kubectl(cluster, *args, kubeconfig=kubeconfig, stdin=stdin)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(result.args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def wait_for(predicate: Callable[[], T | None], *, timeout: float = 30.0, interval: float = 0.05, what: str = "") -> T:
    """Polls until predicate returns something truthy; a test-side wait, never product logic."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}; last value: {last!r}")


install_api = fleet.install_api
wait_for_crd = fleet.wait_for_api


#: The boot and host of registration_body's incarnations (an agent Lease with them is their agent's).
BOOT_ID = "8d0a4c6e-3b1f-4c1e-9a56-0d6f0c1b2a3e"
HOST_ID = "0f2e7a1c9d8b4e6f8a7b6c5d4e3f2a1b"


def registration_body(
    *,
    name: str,
    node: str = "node-a",
    pid: int = 4242,
    start_time: str = "123456789",
    boot_id: str = BOOT_ID,
    pid_namespace: str = str(api.ROOT_PID_NAMESPACE_INODE),
    host_id: str = HOST_ID,
    client_instance_id: str | None = None,
    interval: int | None = 10,
    ttl: int | None = 30,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A raw WorkerRegistration as the launcher would create it (with heartbeats unless interval is None)."""
    body = {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": name, "labels": labels if labels is not None else {api.NODE_LABEL: node}},
        "spec": {
            "nodeName": node,
            "incarnation": {
                "bootId": boot_id,
                "pidNamespace": pid_namespace,
                "pid": pid,
                "startTime": start_time,
                "hostId": host_id,
            },
            "clientInstanceId": client_instance_id or f"inst-{name}",
            **({} if interval is None else {"heartbeat": {"intervalSeconds": interval, "ttlSeconds": ttl}}),
        },
    }
    return body


def custom(client: k8s.ApiClient) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(client)


#: Each client's registrant, asked once: a client's credentials do not change while it lives.
_REGISTRANTS: weakref.WeakKeyDictionary[k8s.ApiClient, str] = weakref.WeakKeyDictionary()


def registrant(client: k8s.ApiClient) -> str:
    """Who the API server sees as `client`, spelled as the admission policies spell the requester
    (`kubewire.registrant`, from one SelfSubjectReview, as the launcher asks it; once per client)."""
    named = _REGISTRANTS.get(client)
    if named is None:
        review = k8s.AuthenticationV1Api(client).create_self_subject_review(dict(kubewire.SELF_SUBJECT_REVIEW))
        named = kubewire.registrant(client.sanitize_for_serialization(review))
        assert named is not None, review
        _REGISTRANTS[client] = named
    return named


def create_registration(client: k8s.ApiClient, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    """Creates as the launcher does: naming its registrant (coroner.dev/registered-by, the
    requester, which policy coroner-registrant-recorded demands) unless `body` already names one.
    Again while the API server answers 503 (it can, some moments after the CRD is re-created)."""
    annotations = body.setdefault("metadata", {}).setdefault("annotations", {})
    annotations.setdefault(api.REGISTERED_BY_ANNOTATION, registrant(client))
    deadline = time.monotonic() + 30
    while True:
        try:
            created: dict[str, Any] = custom(client).create_namespaced_custom_object(
                api.GROUP, api.VERSION, namespace, api.PLURAL, body
            )
            return created
        except ApiException as exc:
            if exc.status != 503 or time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def get_registration(client: k8s.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = custom(client).get_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL, name
    )
    return obj


def exists(client: k8s.ApiClient, namespace: str, name: str) -> bool:
    """Whether the registration is there (a 404 is False; any other error propagates)."""
    try:
        get_registration(client, namespace, name)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def patch_status(client: k8s.ApiClient, namespace: str, name: str, body: Any) -> dict[str, Any]:
    """A list body is sent as a JSON patch, a dict as a merge patch (the client picks the type)."""
    return patch_registration_status(client, namespace=namespace, name=name, body=body)


def api_error_body(exc: Exception) -> dict[str, Any]:
    body = getattr(exc, "body", None) or "{}"
    try:
        parsed: dict[str, Any] = json.loads(body)
    except ValueError:
        return {"message": str(body)}
    return parsed
