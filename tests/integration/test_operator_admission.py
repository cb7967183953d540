"""The operator fails closed on its admission policies (a weakened policy stops its retirements),
against the real API server.

The operator reads the admission policies and bindings (as its own ServiceAccount, through the
ClusterRole's read-only grant) at startup and with each permission refresh, compares their content
with `coroner.core.admission_digest`, and while any is missing or differs retires nothing: every
registration it would retire says AdmissionPoliciesUnverified, naming the objects. Restored, it
retires again without a restart.
"""

from __future__ import annotations

import pathlib

import pytest
import yaml
from kubernetes import client as k8s

from coroner.core import admission_digest as ad
from coroner.core.reasons import Reason
from coroner.core.world import World
from coroner_dev.devcluster.cluster import Cluster
from coroner_operator.permissions import PermissionRefresher
from support import components, helm, kube

pytestmark = pytest.mark.integration

BOOT = kube.BOOT_ID
HOST = kube.HOST_ID
BINDING = "coroner-retire-requires-evidence"


def _dead(admin: k8s.ApiClient, agent: k8s.ApiClient, namespace: str, name: str) -> None:
    kube.create_registration(admin, namespace, kube.registration_body(name=name))
    kube.patch_status(admin, namespace, name, {"status": {"lastHeartbeatTime": components.now_text(-120)}})
    components.attest(agent, namespace, name, evidence="PidfdExited")


def _retirable(admin: k8s.ApiClient, namespace: str, name: str) -> dict[str, str] | None:
    return components.condition(kube.get_registration(admin, namespace, name), "Retirable")


def test_a_weakened_or_missing_binding_stops_retirement_until_restored(
    granted: Cluster, agent_a: k8s.ApiClient, admin: k8s.ApiClient, namespace: str, tmp_path: pathlib.Path
) -> None:
    config = components.operator_kubeconfig(granted)
    try:
        with components.process(components.operator_argv(config), log=tmp_path / "operator.log"):
            # Intact: the operator, with the grant, retires as ever.
            _dead(admin, agent_a, namespace, "before")
            kube.wait_for(lambda: components.retired(admin, namespace, "before"), what="retirement, policies intact")

            # A binding that only warns: the rule is as good as gone.
            kube.kubectl(granted, "patch", "validatingadmissionpolicybinding", BINDING, "--type=merge",
                         "-p", '{"spec":{"validationActions":["Warn"]}}')  # fmt: skip
            _dead(admin, agent_a, namespace, "during")
            unverified = Reason.ADMISSION_POLICIES_UNVERIFIED.value
            kube.wait_for(
                lambda: components.reason(admin, namespace, "during") == unverified, what=f"{unverified} (Warn)"
            )
            condition = _retirable(admin, namespace, "during")
            assert condition is not None and condition["status"] == "False"
            assert f"ValidatingAdmissionPolicyBinding/{BINDING} (differs)" in condition["message"], condition
            assert not components.retired(admin, namespace, "during")

            # Deleted: the message follows (missing), still nothing retired.
            kube.kubectl(granted, "delete", "validatingadmissionpolicybinding", BINDING)
            kube.wait_for(
                lambda: (
                    f"ValidatingAdmissionPolicyBinding/{BINDING} (missing)"
                    in ((_retirable(admin, namespace, "during") or {}).get("message") or "")
                ),
                what="the condition naming the missing binding",
            )
            assert not components.retired(admin, namespace, "during")

            # Restored: retired without a restart.
            components.install(granted, grant=True)
            kube.wait_for(lambda: components.retired(admin, namespace, "during"), what="retirement once restored")
            retirement = kube.get_registration(admin, namespace, "during")["status"]["retirement"]
            assert retirement["reason"] == "PidfdExited"
    finally:
        # Re-applying does not undo a patch of a field the manifests do not set: replace the binding.
        kube.kubectl(granted, "delete", "validatingadmissionpolicybinding", BINDING, "--ignore-not-found")
        components.install(granted, grant=True)


@pytest.mark.parametrize("node_loss", [False, True])
def test_the_helm_charts_policies_compare_intact_for_its_own_operator(node_loss: bool) -> None:
    # A release in its own namespace with a namePrefix names the operator's and the agent's
    # ServiceAccounts so in every policy: the operator, as that ServiceAccount, still verifies them.
    values = ["--set=namePrefix=acme-", f"--set=nodeLoss.enabled={str(node_loss).lower()}"]
    rendered = [d for d in yaml.safe_load_all(helm.template(*values, namespace="acme-coroner")) if d]
    refresher = PermissionRefresher(
        kube=None,  # type: ignore[arg-type]
        world=World(),
        enqueue=lambda _: None,
        interval_seconds=1,
        system_namespace="acme-coroner",
        node_evidence=node_loss,
        identity="system:serviceaccount:acme-coroner:acme-coroner-operator",
    )
    comparison = ad.compare(
        rendered,
        alternates=refresher.alternates,
        system_namespace=refresher.system_namespace,
        name_prefix=refresher.name_prefix,
    )
    assert comparison.intact, comparison.names()
    assert comparison.node_loss is node_loss
