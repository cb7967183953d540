"""An admission refusal of a retirement is recorded as what it is (never as a generic failure to retry): the real operator,
holding the `retire` grant, meets a ValidatingAdmissionPolicy that refuses its retirement write.

The API server answers such a refusal with 403 (a validation with ``reason: Forbidden``, as all of
Coroner's are) or 422 (the default ``reason: Invalid``), its message naming the policy and binding:
``... is forbidden: ValidatingAdmissionPolicy 'NAME' with binding 'BINDING' denied request: ...``.
Before, the operator read every 403 as RetirePermissionMissing (untrue: the grant is there) and
every 422 as a compare-and-swap conflict (read it again and retry at once). Now the registration
says RetireRefusedByAdmission, naming the policy and what it said; the namespace stays granted (a
registration next to it is retired); the attempt is retried with backoff, and retires once the
policy is gone.
"""

from __future__ import annotations

import json
import pathlib
import re
import socket
import urllib.request
import uuid

import pytest
from kubernetes import client as k8s

from coroner.client.kube import api_client
from coroner_dev.devcluster.cluster import Cluster
from coroner_dev.devcluster.identities import ensure_node
from integration.test_kubectl_plugin import apply_args, as_json, kubectl_coroner, plan_json, reasons
from support import components, kube

pytestmark = pytest.mark.integration

BOOT = kube.BOOT_ID
HOST = kube.HOST_ID
POLICY = "test-refuses-one-retirement"
SAID = "this registration is kept for an audit"
#: A registration the test policy also matches, to see that the policy is in effect.
PROBE = "policy-probe"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _metric(port: int, name: str, labels: str = "") -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    found = re.search(rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+]+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def _refuse_retiring(cluster: Cluster, namespace: str, name: str, *, reason: str | None) -> None:
    """A policy of someone else's: no retirement of `namespace/name` (`reason` None: the default, Invalid)."""
    validation = {
        "expression": "!has(object.status.retirement)",
        "message": SAID,
        **({} if reason is None else {"reason": reason}),
    }
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["coroner.dev"],
                        "apiVersions": ["*"],
                        "resources": ["workerregistrations/status"],
                        "operations": ["UPDATE"],
                    }
                ]
            },
            "matchConditions": [
                {
                    "name": "that-one",
                    "expression": f"object.metadata.namespace == '{namespace}' && "
                    f"object.metadata.name in ['{name}', '{PROBE}']",
                }
            ],
            "validations": [
                validation,
                {"expression": "object.status.?lastHeartbeatTime.orValue('') != 'policy-probe'"},
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": f"{POLICY}-binding"},
        "spec": {"policyName": POLICY, "validationActions": ["Deny"]},
    }
    kube.kubectl(
        cluster, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": [policy, binding]})
    )
    # A new policy takes effect a moment after it is stored (the API server's policy informer): the
    # operator, started next, once retired `name` before it did. Wait until a dry-run status write
    # of a probe registration is refused by this very policy.
    with api_client(cluster.kubeconfig) as admin:
        kube.create_registration(admin, namespace, kube.registration_body(name=PROBE))
    # A heartbeat, which the probe's registrant (the admin) may write: a condition of another type
    # would be refused by coroner-status-fields-by-identity first.
    marker = {"status": {"lastHeartbeatTime": "policy-probe"}}
    probe = ["-n", namespace, "patch", "workerregistration", PROBE, "--subresource=status", "--type=merge"]
    kube.wait_for(
        lambda: (
            POLICY in kube.kubectl(cluster, *probe, "-p", json.dumps(marker), "--dry-run=server", check=False).stderr
        ),
        timeout=30,
        interval=0.2,
        what=f"ValidatingAdmissionPolicy {POLICY} in effect",
    )
    kube.kubectl(cluster, "-n", namespace, "delete", "workerregistration", PROBE)


def _remove_policy(cluster: Cluster) -> None:
    kube.kubectl(cluster, "delete", "validatingadmissionpolicybinding", f"{POLICY}-binding", "--ignore-not-found")
    kube.kubectl(cluster, "delete", "validatingadmissionpolicy", POLICY, "--ignore-not-found")


def _register_dead(admin: k8s.ApiClient, agent: k8s.ApiClient, namespace: str, name: str, pid: int) -> None:
    kube.create_registration(admin, namespace, kube.registration_body(name=name, pid=pid))
    kube.patch_status(admin, namespace, name, {"status": {"lastHeartbeatTime": components.now_text()}})
    components.attest(agent, namespace, name, evidence="PidfdExited")


def _retirable(admin: k8s.ApiClient, namespace: str, name: str) -> dict[str, object] | None:
    return components.condition(kube.get_registration(admin, namespace, name), "Retirable")


@pytest.mark.parametrize("reason", ["Forbidden", None], ids=["403-Forbidden", "422-Invalid"])
def test_a_retirement_refused_by_admission_says_so_and_keeps_the_grant(
    granted: Cluster,
    agent_a: k8s.ApiClient,
    admin: k8s.ApiClient,
    namespace: str,
    tmp_path: pathlib.Path,
    reason: str | None,
) -> None:
    _refuse_retiring(granted, namespace, "kept", reason=reason)
    port = _free_port()
    log = tmp_path / "operator.log"
    argv = components.operator_argv(
        components.operator_kubeconfig(granted), f"--metrics-port={port}", "--metrics-bind-address=127.0.0.1"
    )
    try:
        with components.process(argv, log=log):
            _register_dead(admin, agent_a, namespace, "kept", pid=6101)
            _register_dead(admin, agent_a, namespace, "next-to-it", pid=6102)
            refused = kube.wait_for(
                lambda: (
                    (found := _retirable(admin, namespace, "kept")) is not None
                    and found.get("reason") == "RetireRefusedByAdmission"
                    and found
                ),
                what=f"the refusal recorded (see {log})",
            )
            assert refused["status"] == "False"
            message = str(refused["message"])
            assert f"ValidatingAdmissionPolicy {POLICY} (binding {POLICY}-binding)" in message, message
            assert SAID in message and f"WorkerRegistration {namespace}/kept" in message, message
            # The grant is there: the namespace is not plan-only, its other dead worker is retired.
            kube.wait_for(lambda: components.retired(admin, namespace, "next-to-it"), what="the other retired")
            assert components.reason(admin, namespace, "next-to-it") == "AlreadyTerminal"
            assert not components.retired(admin, namespace, "kept")
            # Retried with backoff (not re-read and retried at once as a conflict): a second refusal.
            conflicts = _metric(port, "coroner_cas_conflicts_total")
            kube.wait_for(
                lambda: _metric(port, "coroner_retire_abandoned_total", '{cause="RetireRefusedByAdmission"}') >= 2,
                what="the backoff's retry",
            )
            assert _metric(port, "coroner_cas_conflicts_total") == conflicts
            assert _metric(port, "coroner_retire_abandoned_total", '{cause="RetirePermissionMissing"}') == 0
            assert components.reason(admin, namespace, "kept") == "RetireRefusedByAdmission"
            # Once the policy is gone, a retry retires it.
            _remove_policy(granted)
            kube.wait_for(lambda: components.retired(admin, namespace, "kept"), timeout=120, what="retired after")
        logs = log.read_text()
        assert (
            f"retire refused workerregistration={namespace}/kept cause=RetireRefusedByAdmission policy={POLICY}" in logs
        )
    finally:
        _remove_policy(granted)


def test_apply_prints_a_refusal_by_admission_naming_the_object_and_the_fix(
    granted: Cluster, agent_a: k8s.ApiClient, admin: k8s.ApiClient, namespace: str
) -> None:
    """The cluster admin (who holds `retire`) retires with `kubectl coroner apply`; no operator runs."""
    _refuse_retiring(granted, namespace, "kept", reason="Forbidden")
    try:
        _register_dead(admin, agent_a, namespace, "kept", pid=6201)
        document = plan_json(granted, namespace, kubeconfig=granted.kubeconfig)
        assert reasons(document) == {"kept": "EligibleStaleOrphan"}
        args = apply_args(document, namespace, "kept")
        applied = kubectl_coroner(granted, *args, "--yes", "-o", "json", kubeconfig=granted.kubeconfig)
        assert applied.returncode == 2, applied.stderr
        (row,) = as_json(applied)["rows"]
        assert (row["name"], row["outcome"]) == ("kept", "RetireRefusedByAdmission")
        detail = row["detail"]
        assert f"WorkerRegistration {namespace}/kept" in detail and SAID in detail, detail
        assert f"ValidatingAdmissionPolicy {POLICY} (binding {POLICY}-binding)" in detail, detail
        assert "retire grant is not the problem" in detail
        assert f"`kubectl get validatingadmissionpolicy {POLICY} -o yaml`" in detail
        table = kubectl_coroner(granted, *args, "--yes", kubeconfig=granted.kubeconfig)
        assert table.returncode == 2 and "RetireRefusedByAdmission" in table.stdout, table.stdout + table.stderr
        assert not components.retired(admin, namespace, "kept")
    finally:
        _remove_policy(granted)


def test_node_evidence_the_evidence_policy_refuses_is_reported_as_its_refusal(
    granted: Cluster, admin: k8s.ApiClient, namespace: str, tmp_path: pathlib.Path
) -> None:
    """Coroner's own policy: an operator started with --node-out-of-service-evidence where
    components/node-loss is not installed decides NodeOutOfService for a tainted node's worker, and
    coroner-retire-requires-evidence refuses the operator's node evidence. The registration says so,
    naming the policy and the missing component — before, it said RetirePermissionMissing."""
    node = f"oos-{uuid.uuid4().hex[:6]}"
    ensure_node(granted, name=node, boot_id=BOOT)
    log = tmp_path / "operator.log"
    argv = components.operator_argv(components.operator_kubeconfig(granted), "--node-out-of-service-evidence")
    try:
        with components.process(argv, log=log):
            kube.create_registration(admin, namespace, kube.registration_body(name="w", node=node, interval=None))
            # No agent ever published a Lease for this node: nothing attested, and nothing can be.
            kube.wait_for(lambda: components.reason(admin, namespace, "w") == "AgentUnavailable", what="unattested")
            kube.kubectl(granted, "taint", "node", node, "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute")
            refused = kube.wait_for(
                lambda: (
                    (found := _retirable(admin, namespace, "w")) is not None
                    and found.get("reason") == "RetireRefusedByAdmission"
                    and found
                ),
                what=f"the refusal recorded (see {log})",
            )
            message = str(refused["message"])
            assert "ValidatingAdmissionPolicy coroner-retire-requires-evidence" in message, message
            assert "with node evidence NodeOutOfService needs the node-loss component" in message, message
            assert not components.retired(admin, namespace, "w")
    finally:
        k8s.CoreV1Api(admin).delete_node(node)
