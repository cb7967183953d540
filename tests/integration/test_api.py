"""The WorkerRegistration API as a person meets it: kubectl get/describe, and what admission refuses."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.client.kube import api_client
from coroner.core import api
from coroner_dev.devcluster.cluster import Cluster
from support import components, kube

pytestmark = pytest.mark.integration


def test_sample_shows_its_columns_under_every_name(coroner_api: Cluster, namespace: str) -> None:
    kube.kubectl(coroner_api, "apply", "-n", namespace, "-f", str(kube.MANIFESTS / "samples"))
    for resource in ("workerregistrations", "wreg", "registrations"):
        table = kube.kubectl(coroner_api, "get", resource, "-n", namespace).stdout
        header, row = table.splitlines()[:2]
        assert header.split() == ["NAME", "STATE", "NODE", "PID", "REASON", "VERDICT", "AGE"]
        assert row.split()[:4] == ["queue-consumer-sample", "Active", "node-a", "4242"]
    wide = kube.kubectl(coroner_api, "get", "registrations", "-n", namespace, "-o", "wide").stdout
    assert wide.splitlines()[0].split()[-4:] == ["EVIDENCE", "ROLE", "INSTANCE", "RETIRED-BY"]


def test_describe_shows_the_attestation_evidence(coroner_api: Cluster, admin: k8s.ApiClient, namespace: str) -> None:
    body = kube.create_registration(admin, namespace, kube.registration_body(name="w1"))
    attestation = components.attestation(body, evidence="ProcAbsent")
    # The CRD is served with admission on; the admin may not forge an attestation (policy 4), so
    # write it as the node's agent would.
    components.install(coroner_api, grant=False)
    with api_client(components.agent_kubeconfig(coroner_api, "node-a")) as agent:
        kube.patch_status(agent, namespace, "w1", {"status": {"attestation": attestation}})
    described = kube.kubectl(coroner_api, "describe", "registrations", "-n", namespace, "w1").stdout
    assert "Attestation:" in described and "ProcAbsent" in described and "Verdict:" in described


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        pytest.param(lambda b: b["spec"]["incarnation"].update(pid=0), "spec.incarnation.pid", id="pid-0"),
        pytest.param(lambda b: b["spec"]["incarnation"].update(pid=99999999), "spec.incarnation.pid", id="pid-too-big"),
        pytest.param(lambda b: b["spec"]["incarnation"].update(startTime="12a"), "startTime", id="start-not-digits"),
        pytest.param(lambda b: b["spec"].update(clientInstanceId=""), "clientInstanceId", id="empty-instance"),
        pytest.param(
            lambda b: b["metadata"]["labels"].update({api.NODE_LABEL: "node-b"}), "coroner.dev/node", id="label"
        ),
        pytest.param(lambda b: b["spec"]["heartbeat"].update(ttlSeconds=1, intervalSeconds=10), "ttlSeconds", id="ttl"),
    ],
)
def test_admission_refuses_malformed_registrations(
    coroner_api: Cluster, admin: k8s.ApiClient, namespace: str, mutate: object, needle: str
) -> None:
    body = kube.registration_body(name="bad")
    mutate(body)  # type: ignore[operator]
    with pytest.raises(ApiException) as raised:
        kube.create_registration(admin, namespace, body)
    assert raised.value.status in (403, 422)
    assert needle in kube.api_error_body(raised.value)["message"]


def test_spec_is_immutable_with_a_message_that_says_what_to_do(
    coroner_api: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    kube.create_registration(admin, namespace, kube.registration_body(name="w1"))
    result = kube.kubectl(
        coroner_api, "patch", "registrations", "w1", "-n", namespace, "--type=merge",
        "-p", '{"spec":{"incarnation":{"pid":5}}}', check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "spec is immutable" in result.stderr and "register a new WorkerRegistration" in result.stderr


def test_retirement_is_terminal_history(coroner_api: Cluster, admin: k8s.ApiClient, namespace: str) -> None:
    # A retirement needs its evidence (policy coroner-retire-requires-evidence): the node's agent
    # attests the death, and the retirement copies that attestation, as the operator writes it.
    kube.create_registration(admin, namespace, kube.registration_body(name="w1"))
    components.install(coroner_api, grant=False)
    with api_client(components.agent_kubeconfig(coroner_api, "node-a")) as agent:
        body = components.attest(agent, namespace, "w1", evidence="ProcAbsent")
    attestation = body["status"]["attestation"]
    retired = [{"type": "Retired", "status": "True", "reason": "ProcAbsent", "message": "m",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]  # fmt: skip
    record = {"retiredBy": "admin", "reason": "ProcAbsent", "attestation": attestation}
    kube.patch_status(
        admin, namespace, "w1", {"status": {"conditions": retired, "retirement": record, "state": "Retired"}}
    )
    with pytest.raises(ApiException) as raised:
        kube.patch_status(admin, namespace, "w1", {"status": {"retirement": {**record, "reason": "PidfdExited"}}})
    assert "terminal history" in kube.api_error_body(raised.value)["message"]
