"""Tokens as pods really get them: a ServiceAccount token bound to a Pod object on a node.

Without `up --node` the dev cluster has no kubelet, so the Pod is only an object (scheduled by setting spec.nodeName,
never run: `coroner_dev.devcluster.identities.pod_on_node`, which says why its deletion is immediate); the token
comes from the real TokenRequest API with a Pod boundObjectRef, exactly as the
kubelet asks for a projected token. Since Kubernetes 1.30 such a token carries the pod's name and
uid and the node's name and uid in the user's extra (`authentication.kubernetes.io/pod-name`,
`.../pod-uid`, `.../node-name`, `.../node-uid`), which the admission policies read.
"""

from __future__ import annotations

import pathlib

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.client.kube import api_client
from coroner_dev.devcluster.cluster import Cluster
from coroner_dev.devcluster.identities import bound_token, ensure_node, pod_on_node

TOKEN_SECONDS = 3600


def pod_token(cluster: Cluster, *, namespace: str, service_account: str, pod: str, node: str) -> pathlib.Path:
    """A kubeconfig for a token of NAMESPACE/SERVICE_ACCOUNT bound to Pod NAMESPACE/POD on NODE.

    Creates the Node (if missing), the ServiceAccount (if missing) and the Pod (if missing)."""
    ensure_node(cluster, name=node)
    with api_client(cluster.kubeconfig) as api:
        core = k8s.CoreV1Api(api)
        try:
            core.create_namespaced_service_account(
                namespace, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name=service_account))
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
        bound = pod_on_node(core, namespace=namespace, service_account=service_account, pod=pod, node=node)
    return bound_token(
        cluster, service_account=(namespace, service_account), bound=bound, seconds=TOKEN_SECONDS, label=f".pod-{pod}"
    )


def delete_pod(admin: k8s.ApiClient, *, namespace: str, pod: str) -> None:
    """Deletes the Pod at once: with no kubelet nothing would ever confirm a graceful deletion, and
    its namespace would stay Terminating. Its tokens stop working (they are bound to its uid)."""
    try:
        k8s.CoreV1Api(admin).delete_namespaced_pod(pod, namespace, grace_period_seconds=0)
    except ApiException as exc:
        if exc.status != 404:
            raise


def pod_uid(admin: k8s.ApiClient, namespace: str, pod: str) -> str:
    return str(k8s.CoreV1Api(admin).read_namespaced_pod(pod, namespace).metadata.uid)
