"""Identities on the dev cluster: ServiceAccount tokens (node-bound for agents) and client certs.

Tokens come from the real TokenRequest API. A token "on a node" is bound to a Pod of its
ServiceAccount on that node, as the kubelet mints a Pod's projected token: it carries the Pod's name
and uid and the node's name in its user's extra (`authentication.kubernetes.io/pod-name`,
`.../node-name`), which the admission policies that restrict agents read. A token bound to the Node
object itself speaks for no node there: anyone who may create tokens in a namespace could mint one.
"""

from __future__ import annotations

import pathlib

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.client.kube import api_client
from coroner_dev.devcluster import pki as pki_mod
from coroner_dev.devcluster.cluster import Cluster, write_kubeconfig
from coroner_dev.devcluster.errors import DevClusterError

TOKEN_SECONDS = 24 * 3600


def _ignore_conflict(call: object) -> None:
    try:
        call()  # type: ignore[operator]
    except ApiException as exc:
        if exc.status != 409:
            raise


def ensure_node(cluster: Cluster, *, name: str, boot_id: str | None = None, ready: bool = True) -> k8s.V1Node:
    """Creates a Node object if missing (no kubelet runs unless `up --node`) and sets its boot id and Ready."""
    with api_client(cluster.kubeconfig) as api:
        core = k8s.CoreV1Api(api)
        _ignore_conflict(lambda: core.create_node(k8s.V1Node(metadata=k8s.V1ObjectMeta(name=name))))
        if boot_id is not None or ready:
            status: dict[str, object] = {}
            if boot_id is not None:
                status["nodeInfo"] = {"bootID": boot_id}
            status["conditions"] = [
                {"type": "Ready", "status": "True" if ready else "False", "reason": "CoronerDevCluster"}
            ]
            core.patch_node_status(name, {"status": status})
        node: k8s.V1Node = core.read_node(name)
        return node


def mint_token(
    cluster: Cluster,
    *,
    service_account: str,
    node: str | None = None,
    seconds: int = TOKEN_SECONDS,
) -> pathlib.Path:
    """Mints a token for NS/NAME (bound to a stand-in Pod of it on Node `node` if given, as the kubelet
    binds a Pod's token); returns a kubeconfig path for it."""
    namespace, sep, name = service_account.partition("/")
    if not sep or not namespace or not name:
        raise DevClusterError(
            f"--service-account must be NAMESPACE/NAME, got {service_account!r}",
            fix="for example --service-account coroner-system/coroner-agent",
        )
    with api_client(cluster.kubeconfig) as api:
        core = k8s.CoreV1Api(api)
        _ignore_conflict(lambda: core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace))))
        _ignore_conflict(
            lambda: core.create_namespaced_service_account(
                namespace, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name=name))
            )
        )
        bound = None
        if node is not None:
            if not _node_exists(core, node):
                ensure_node(cluster, name=node, ready=False)
            bound = pod_on_node(core, namespace=namespace, service_account=name, pod=f"{name}-{node}", node=node)
    suffix = f".node-{node}" if node else ""
    return bound_token(cluster, service_account=(namespace, name), bound=bound, seconds=seconds, label=suffix)


def bound_token(
    cluster: Cluster,
    *,
    service_account: tuple[str, str],
    bound: k8s.V1BoundObjectReference | None,
    seconds: int = TOKEN_SECONDS,
    label: str = "",
) -> pathlib.Path:
    """A TokenRequest for the (existing) ServiceAccount (namespace, name), bound to `bound` (a Node or
    a Pod, as the kubelet asks) if given; returns a kubeconfig for it named NS.NAME`label`."""
    namespace, name = service_account
    with api_client(cluster.kubeconfig) as api:
        request = k8s.AuthenticationV1TokenRequest(
            spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=seconds, bound_object_ref=bound)
        )
        answer = k8s.CoreV1Api(api).create_namespaced_service_account_token(name, namespace, request)
        token = answer.status.token  # type: ignore[union-attr]
    user = f"{namespace}.{name}{label}"
    path = cluster.directory / "tokens" / f"{user}.kubeconfig"
    return write_kubeconfig(path, server=cluster.server, ca=cluster.pki.ca_cert, user=user, token=token)


def pod_on_node(
    core: k8s.CoreV1Api, *, namespace: str, service_account: str, pod: str, node: str
) -> k8s.V1BoundObjectReference:
    """Pod NAMESPACE/POD of the ServiceAccount on `node` (made if missing), to bind its tokens to, as the
    kubelet binds a Pod's. It never runs: its image does not exist, and without `up --node` no kubelet
    is there. It meets the restricted Pod Security profile (any namespace admits it), tolerates every
    taint (a NotReady stand-in node does not evict it) and has no grace period, so deleting it or its
    namespace is immediate without a kubelet to confirm it."""
    body = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=pod, namespace=namespace, labels={"coroner.dev/token-stand-in": "true"}),
        spec=k8s.V1PodSpec(
            service_account_name=service_account,
            node_name=node,
            automount_service_account_token=False,
            termination_grace_period_seconds=0,
            tolerations=[k8s.V1Toleration(operator="Exists")],
            security_context=k8s.V1PodSecurityContext(
                run_as_non_root=True, run_as_user=65532, seccomp_profile=k8s.V1SeccompProfile(type="RuntimeDefault")
            ),
            containers=[
                k8s.V1Container(
                    name="stand-in",
                    image="registry.invalid/never-runs:0",
                    security_context=k8s.V1SecurityContext(
                        allow_privilege_escalation=False, capabilities=k8s.V1Capabilities(drop=["ALL"])
                    ),
                )
            ],
        ),
    )
    try:
        created = core.create_namespaced_pod(namespace, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        created = core.read_namespaced_pod(pod, namespace)
    return k8s.V1BoundObjectReference(api_version="v1", kind="Pod", name=pod, uid=created.metadata.uid)  # type: ignore[union-attr]


def _node_exists(core: k8s.CoreV1Api, name: str) -> bool:
    try:
        core.read_node(name)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def user_kubeconfig(cluster: Cluster, *, user: str, groups: tuple[str, ...] = ()) -> pathlib.Path:
    """A kubeconfig for a plain user authenticated by a client certificate (e.g. a read-only human)."""
    cert, key = pki_mod.ensure_client_cert(cluster.pki, user=user, groups=groups)
    return write_kubeconfig(
        cluster.directory / "users" / f"{user}.kubeconfig",
        server=cluster.server,
        ca=cluster.pki.ca_cert,
        user=user,
        cert=cert,
        key=key,
    )
