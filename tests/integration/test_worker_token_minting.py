"""A worker's namespace editor speaks as the worker: they mint a token of the worker's ServiceAccount bound
to the worker's own Pod, which reproduces its registrant (`coroner.dev/registered-by`) exactly, and
release the live worker. Accepted (docs/security.md): admission cannot tell two tokens of one Pod apart.
What shows it is `kubectl coroner doctor`'s `worker-namespace-access`, which names every subject that
can mint such a token, exec into the worker's Pod or impersonate its ServiceAccount.

Real API server and admission; the tokens from the real TokenRequest API, one minted by a person bound to
Kubernetes' own `edit` role in the worker's namespace.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.client.kube import api_client
from coroner.core import api
from coroner_dev.devcluster.cluster import Cluster, write_kubeconfig
from coroner_dev.devcluster.identities import user_kubeconfig
from coroner_dev.fleet import bind_worker
from integration.test_admission_ownership import released
from integration.test_kubectl_plugin import as_json, coroner
from support import components, kube, pods

pytestmark = [pytest.mark.integration]

EDITOR = "worker-namespace-editor"
WORKER = "worker"
POD = "worker-0"


@pytest.fixture
def worker(granted: Cluster, admin: k8s.ApiClient, namespace: str) -> Iterator[k8s.ApiClient]:
    """The worker: its Pod's own token (bound to Pod `POD` of ServiceAccount `WORKER`, on node-a)."""
    bind_worker(granted, namespace=namespace, service_account=f"{namespace}/{WORKER}")
    config = pods.pod_token(granted, namespace=namespace, service_account=WORKER, pod=POD, node="node-a")
    try:
        with api_client(config) as client:
            yield client
    finally:
        pods.delete_pod(admin, namespace=namespace, pod=POD)


@pytest.fixture
def editor(granted: Cluster, admin: k8s.ApiClient, namespace: str) -> Iterator[k8s.ApiClient]:
    """A person bound to Kubernetes' own `edit` role in the worker's namespace."""
    binding = k8s.V1RoleBinding(
        metadata=k8s.V1ObjectMeta(name=EDITOR),
        role_ref=k8s.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="edit"),
        subjects=[k8s.RbacV1Subject(kind="User", name=EDITOR, api_group="rbac.authorization.k8s.io")],
    )
    k8s.RbacAuthorizationV1Api(admin).create_namespaced_role_binding(namespace, binding)
    with api_client(user_kubeconfig(granted, user=EDITOR)) as client:
        yield client


def minted_for_the_workers_pod(
    cluster: Cluster, editor: k8s.ApiClient, admin: k8s.ApiClient, namespace: str
) -> k8s.ApiClient:
    """The editor's own TokenRequest for the worker's ServiceAccount, bound to the worker's Pod."""
    bound = k8s.V1BoundObjectReference(api_version="v1", kind="Pod", name=POD, uid=pods.pod_uid(admin, namespace, POD))
    request = k8s.AuthenticationV1TokenRequest(
        spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=600, bound_object_ref=bound)
    )

    def mint() -> str:
        try:
            answer = k8s.CoreV1Api(editor).create_namespaced_service_account_token(WORKER, namespace, request)
        except ApiException as exc:
            if exc.status == 403:  # the RoleBinding not yet in the authorizer's cache
                return ""
            raise
        return str(answer.status.token)  # type: ignore[union-attr]

    token = kube.wait_for(mint, what="the editor's TokenRequest for the worker admitted")
    user = f"{namespace}.{WORKER}.minted"
    path = write_kubeconfig(
        cluster.directory / "tokens" / f"{user}.kubeconfig", server=cluster.server, ca=cluster.pki.ca_cert, user=user,
        token=token,
    )  # fmt: skip
    return api_client(path)


def test_an_editor_minting_the_workers_pod_token_releases_it_and_doctor_names_the_editor(
    granted: Cluster, admin: k8s.ApiClient, namespace: str, worker: k8s.ApiClient, editor: k8s.ApiClient
) -> None:
    def register() -> bool:
        try:
            kube.create_registration(worker, namespace, kube.registration_body(name="live"))
        except ApiException as exc:
            if exc.status == 403:  # its RoleBinding not yet in the authorizer's cache
                return False
            raise
        return True

    kube.wait_for(register, what="the worker's registration admitted")
    registrant = kube.get_registration(admin, namespace, "live")["metadata"]["annotations"][
        api.REGISTERED_BY_ANNOTATION
    ]
    assert f" pod/{POD}/" in registrant

    with minted_for_the_workers_pod(granted, editor, admin, namespace) as forged:
        assert kube.registrant(forged) == registrant  # the very same requester, to admission
        kube.patch_status(forged, namespace, "live", released())
    # The accepted risk, as it stands: the live worker's goodbye, said by someone else, is admitted.
    assert components.condition(kube.get_registration(admin, namespace, "live"), "Released") is not None

    result = coroner(granted, "doctor", "-o", "json", kubeconfig=granted.kubeconfig)
    checks = {check["name"]: check for check in as_json(result)["checks"]}
    check = checks["worker-namespace-access"]
    assert check["status"] == "WARN", check
    assert f"User/{EDITOR}" in check["objects"]
    rows = {row["subject"]: row for row in check["facts"]["namespaces"][namespace]}
    assert "create serviceaccounts/token" in rows[f"User/{EDITOR}"]["can"]
    assert f"namespace {namespace}" in check["summary"]
