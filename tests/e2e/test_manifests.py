"""The manifests, applied with the real kubectl, and the identities they create, exercised for real.

Each identity gets a token from the TokenRequest API for the manifests' own ServiceAccounts
(node-bound for agents), so these tests prove what a cluster admin gets from `kubectl apply -k`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.client.kube import api_client
from coroner.core import api, wire
from coroner_dev.devcluster.cluster import Cluster
from coroner_dev.devcluster.identities import mint_token
from support import components, kube
from support.fleet import worker_kubeconfig

pytestmark = pytest.mark.e2e

SYSTEM = api.SYSTEM_NAMESPACE
OPERATOR = f"system:serviceaccount:{SYSTEM}:coroner-operator"
AGENT = f"system:serviceaccount:{SYSTEM}:coroner-agent"
OVERLAYS = kube.MANIFESTS / "overlays"


def apply_overlay(cluster: Cluster, name: str, *extra: str) -> str:
    return kube.kubectl(cluster, "apply", "-k", str(OVERLAYS / name), *extra).stdout


def can_i(
    cluster: Cluster, verb: str, resource: str, *, who: str, namespace: str = "default", subresource: str = ""
) -> str:
    extra = [f"--subresource={subresource}"] if subresource else []
    result = kube.kubectl(cluster, "auth", "can-i", verb, resource, "-n", namespace, f"--as={who}", *extra, check=False)
    return result.stdout.strip()


@pytest.fixture
def plan_only(cluster: Cluster) -> Iterator[Cluster]:
    apply_overlay(cluster, "plan-only")
    kube.wait_for_crd(cluster)
    # The retire grant is removed by deleting the component's objects, exactly as reverting the
    # GitOps commit that added it would prune them.
    kube.kubectl(cluster, "delete", "clusterrolebinding", "coroner-operator-retire", "--ignore-not-found")
    yield cluster


def _retire_patch() -> dict[str, object]:
    return {
        "status": {
            "retirement": {"retiredBy": "test", "reason": "ProcAbsent"},
            "conditions": [
                {
                    "type": "Retired",
                    "status": "True",
                    "reason": "ProcAbsent",
                    "message": "forged",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
            "state": "Retired",
        }
    }


def test_overlays_apply_twice_in_either_order_and_server_dry_run(plan_only: Cluster) -> None:
    for overlay in ("plan-only", "production", "production", "plan-only"):
        apply_overlay(plan_only, overlay)
        dry = apply_overlay(plan_only, overlay, "--dry-run=server")
        assert "(server dry run)" in dry
    kube.kubectl(plan_only, "delete", "clusterrolebinding", "coroner-operator-retire", "--ignore-not-found")


#: kubectl's three-way strategic merge always sends a field whose patch strategy is `replace` (a
#: PodDisruptionBudget's spec.selector), so the PDB reads `configured` on every client-side apply; the
#: API server changes nothing (its generation stays).
ALWAYS_PATCHED = "poddisruptionbudget.policy/coroner-operator"


def generations(cluster: Cluster, overlay: str) -> dict[str, int]:
    """metadata.generation (moved by a spec change, never by status) of every object the overlay applies."""
    listed = json.loads(kube.kubectl(cluster, "get", "-k", str(OVERLAYS / overlay), "-o", "json").stdout)
    return {
        f"{item['kind']}/{item['metadata']['name']}": item["metadata"].get("generation", 0) for item in listed["items"]
    }


@pytest.mark.parametrize("overlay", ["plan-only", "production"])
def test_a_re_apply_of_unchanged_manifests_configures_nothing(plan_only: Cluster, overlay: str) -> None:
    """The admission policies read `configured` on every apply of unchanged manifests (their rules
    lacked the `scope: "*"` the API server fills in, in an atomic list) while `kubectl diff` was empty."""
    apply_overlay(plan_only, overlay)  # this overlay's last-applied configuration
    before = generations(plan_only, overlay)
    again = apply_overlay(plan_only, overlay).splitlines()
    configured = [line.removesuffix(" configured") for line in again if line.endswith(" configured")]
    assert set(configured) <= {ALWAYS_PATCHED}, "\n".join(again)
    assert all(line.endswith((" unchanged", " configured")) for line in again), "\n".join(again)
    assert generations(plan_only, overlay) == before
    diff = kube.kubectl(plan_only, "diff", "-k", str(OVERLAYS / overlay), check=False)
    assert diff.returncode == 0 and diff.stdout == "", diff.stdout + diff.stderr
    kube.kubectl(plan_only, "delete", "clusterrolebinding", "coroner-operator-retire", "--ignore-not-found")


def test_can_i_answers_as_documented(plan_only: Cluster) -> None:
    resource = f"{api.PLURAL}.{api.GROUP}"
    assert can_i(plan_only, "retire", resource, who=OPERATOR) == "no"
    assert can_i(plan_only, "retire", resource, who=AGENT) == "no"
    assert can_i(plan_only, "patch", resource, who=AGENT, subresource="status") == "yes"
    assert can_i(plan_only, "create", resource, who=AGENT) == "no"
    # Deleting terminal registrations after their retention (preconditioned on uid and resourceVersion).
    assert can_i(plan_only, "delete", resource, who=OPERATOR) == "yes"
    assert can_i(plan_only, "delete", resource, who=AGENT) == "no"
    assert can_i(plan_only, "delete", "leases.coordination.k8s.io", who=OPERATOR) == "no"
    apply_overlay(plan_only, "production")
    try:
        assert can_i(plan_only, "retire", resource, who=OPERATOR) == "yes"
        assert can_i(plan_only, "retire", resource, who=AGENT) == "no"
    finally:
        kube.kubectl(plan_only, "delete", "clusterrolebinding", "coroner-operator-retire")
    assert can_i(plan_only, "retire", resource, who=OPERATOR) == "no"


def test_agent_of_node_a_cannot_attest_for_node_b(plan_only: Cluster, admin: k8s.ApiClient, namespace: str) -> None:
    mine = kube.create_registration(admin, namespace, kube.registration_body(name="on-a", node="node-a"))
    theirs = kube.create_registration(admin, namespace, kube.registration_body(name="on-b", node="node-b"))
    with api_client(mint_token(plan_only, service_account=f"{SYSTEM}/coroner-agent", node="node-a")) as agent:
        kube.patch_status(
            agent, namespace, "on-a", {"status": {"attestation": components.attestation(mine, node="node-a")}}
        )
        with pytest.raises(ApiException) as raised:
            kube.patch_status(
                agent, namespace, "on-b", {"status": {"attestation": components.attestation(theirs, node="node-a")}}
            )
        assert raised.value.status in (403, 422)
        assert 'the agent of node "node-a" may not attest' in kube.api_error_body(raised.value)["message"]
        # Nor may it touch anything but the attestation, even on its own node.
        with pytest.raises(ApiException) as raised:
            kube.patch_status(agent, namespace, "on-a", {"status": {"lastHeartbeatTime": "2026-01-01T00:00:00Z"}})
        assert "may change only status.attestation" in kube.api_error_body(raised.value)["message"]
        with pytest.raises(ApiException):
            kube.patch_status(agent, namespace, "on-a", _retire_patch())
    assert "attestation" not in kube.get_registration(admin, namespace, "on-b").get("status", {})


def test_an_agent_token_without_node_binding_cannot_attest(
    plan_only: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    mine = kube.create_registration(admin, namespace, kube.registration_body(name="on-a", node="node-a"))
    agent_config = mint_token(plan_only, service_account=f"{SYSTEM}/coroner-agent")
    with api_client(agent_config) as agent, pytest.raises(ApiException) as raised:
        kube.patch_status(
            agent, namespace, "on-a", {"status": {"attestation": components.attestation(mine, node="node-a")}}
        )
    assert raised.value.status in (403, 422)


def test_worker_cannot_attest_or_retire_but_can_heartbeat_and_release(
    plan_only: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    worker_config = worker_kubeconfig(plan_only, namespace)
    with api_client(worker_config) as worker:
        created = kube.wait_for(
            lambda: _try_create(worker, namespace, kube.registration_body(name="w1")), what="worker RBAC"
        )
        kube.patch_status(worker, namespace, "w1", {"status": {"lastHeartbeatTime": "2026-01-01T00:00:00Z"}})
        with pytest.raises(ApiException) as raised:
            kube.patch_status(
                worker, namespace, "w1", {"status": {"attestation": components.attestation(created, node="node-a")}}
            )
        assert "only the coroner agent" in kube.api_error_body(raised.value)["message"]
        # A forged retirement is refused twice over (no verb, no evidence: whichever policy the
        # API server evaluates first answers); one with the real evidence still needs the verb.
        with pytest.raises(ApiException) as raised:
            kube.patch_status(worker, namespace, "w1", _retire_patch())
        assert raised.value.status in (403, 422)
        with api_client(components.agent_kubeconfig(plan_only, "node-a")) as agent:
            components.attest(agent, namespace, "w1", evidence="PidfdExited")
        evidenced = _evidenced_retirement(admin, namespace, "w1")
        (retirement,) = [op for op in evidenced if op["path"] == "/status/retirement"]
        retirement["value"]["retiredBy"] = f"system:serviceaccount:{namespace}:worker"
        with pytest.raises(ApiException) as raised:
            kube.patch_status(worker, namespace, "w1", evidenced)
        assert "requires the retire verb" in kube.api_error_body(raised.value)["message"]
        released = [
            {
                "type": "Released",
                "status": "True",
                "reason": "CleanExit",
                "message": "bye",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ]
        kube.patch_status(worker, namespace, "w1", {"status": {"conditions": released, "state": "Released"}})
    status = kube.get_registration(admin, namespace, "w1")["status"]
    assert "retirement" not in status and status["attestation"]["agent"]["nodeName"] == "node-a"


def _try_create(client: k8s.ApiClient, namespace: str, body: dict[str, object]) -> dict[str, object] | None:
    try:
        return kube.create_registration(client, namespace, body)
    except ApiException as exc:
        if exc.status == 403:
            return None
        raise


def test_operator_retires_only_while_the_component_is_applied(
    plan_only: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    # Each retirement carries its evidence (policy coroner-retire-requires-evidence): the agent of
    # node-a attested the death, and the operator's record copies that attestation.
    with api_client(components.agent_kubeconfig(plan_only, "node-a")) as agent:
        for name in ("first", "second"):
            kube.create_registration(admin, namespace, kube.registration_body(name=name))
            components.attest(agent, namespace, name, evidence="PidfdExited")
    with api_client(mint_token(plan_only, service_account=f"{SYSTEM}/coroner-operator")) as operator:
        with pytest.raises(ApiException) as raised:
            kube.patch_status(operator, namespace, "first", _evidenced_retirement(admin, namespace, "first"))
        assert "requires the retire verb" in kube.api_error_body(raised.value)["message"]
        apply_overlay(plan_only, "production")
        kube.wait_for(lambda: _retires(operator, admin, namespace, "first"), what="the grant to take effect")
        kube.kubectl(plan_only, "delete", "clusterrolebinding", "coroner-operator-retire")
        # Revocation takes effect on the next write, with no restart of anything.
        kube.wait_for(lambda: not _retires(operator, admin, namespace, "second"), what="the revocation to take effect")
    assert "retirement" not in kube.get_registration(admin, namespace, "second").get("status", {})


def _evidenced_retirement(admin: k8s.ApiClient, namespace: str, name: str) -> list[dict[str, object]]:
    """The operator's compare-and-swap retirement of a registration its node's agent attested Dead."""
    body = kube.get_registration(admin, namespace, name)
    attestation = body["status"]["attestation"]
    retired = {**_retire_patch()["status"]["conditions"][0], "reason": attestation["evidence"]}  # type: ignore[index]
    return wire.status_ops(
        body=body,
        resource_version=body["metadata"]["resourceVersion"],
        conditions=[retired],
        retirement={"retiredBy": OPERATOR, "reason": attestation["evidence"], "attestation": attestation},
    )


def _retires(client: k8s.ApiClient, admin: k8s.ApiClient, namespace: str, name: str) -> bool:
    try:
        kube.patch_status(client, namespace, name, _evidenced_retirement(admin, namespace, name))
    except ApiException as exc:
        if exc.status in (403, 422):
            return False
        raise
    return True


def test_delete_overlays_leaves_nothing_behind(cluster: Cluster) -> None:
    apply_overlay(cluster, "production")
    kube.kubectl(cluster, "delete", "-k", str(OVERLAYS / "production"), "--wait=true", "--timeout=120s")
    kube.kubectl(cluster, "delete", "-k", str(OVERLAYS / "plan-only"), "--ignore-not-found", "--wait=true")
    leftovers = kube.kubectl(
        cluster,
        "get",
        "clusterrole,clusterrolebinding,validatingadmissionpolicy,validatingadmissionpolicybinding,crd",
        "-l",
        "app.kubernetes.io/part-of=coroner",
        "-o",
        "name",
    ).stdout.strip()
    assert leftovers == ""
    assert kube.kubectl(cluster, "get", "namespace", SYSTEM, check=False).returncode != 0
    # Later tests share this cluster: put the API back.
    apply_overlay(cluster, "plan-only")
    kube.wait_for_crd(cluster)
