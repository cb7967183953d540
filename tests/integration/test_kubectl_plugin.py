"""`kubectl coroner plan | apply | doctor` against the real API server.

The tests of the kubectl path itself (plan and apply end to end, doctor's grant review, progress on
a terminal, usage, version and completion) run ``kubectl coroner ...`` through the real kubectl with
the virtualenv's bin directory on PATH, which also proves kubectl discovers the installed
``kubectl-coroner`` plugin; the others call the plugin's click group in-process with the same argv
(`support.plugin`: a process per call costs a second of imports, times a hundred). The agent's part is
played by the test with the agent's own node-bound token (the admission policies accept
attestations from nobody else); humans are client-certificate users with just the RBAC that
docs/cli.md asks for. No operator runs here: what retires is the human's apply.
"""

from __future__ import annotations

import json
import os
import pathlib
import pty
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.client.kube import api_client
from coroner.core import api
from coroner_dev.devcluster import cluster as cluster_mod
from coroner_dev.devcluster.cluster import Cluster, write_kubeconfig
from coroner_dev.devcluster.identities import ensure_node, mint_token, user_kubeconfig
from support import components, kube, plugin

pytestmark = pytest.mark.integration

BIN = plugin.BIN
BOOT = "8d0a4c6e-3b1f-4c1e-9a56-0d6f0c1b2a3e"  # registration_body's defaults
HOST = "0f2e7a1c9d8b4e6f8a7b6c5d4e3f2a1b"
OTHER_BOOT = "11111111-2222-4333-8444-555555555555"
SUFFIX = uuid.uuid4().hex[:6]
NODE = f"kc-node-{SUFFIX}"


# --- running the plugin -------------------------------------------------------------------------


def coroner(cluster: Cluster, *args: str, kubeconfig: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """``kubectl-coroner ARGS --kubeconfig K`` in-process (`support.plugin.in_process`)."""
    del cluster  # the kubeconfig names the cluster, as it does for the real plugin
    return plugin.in_process(*args, kubeconfig=kubeconfig)


def kubectl_coroner(cluster: Cluster, *args: str, kubeconfig: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """``kubectl coroner ARGS --kubeconfig K``, kubectl finding the plugin on PATH."""
    return plugin.kubectl_coroner(cluster, *args, kubeconfig=kubeconfig)


def as_json(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.stdout, f"no output (exit {result.returncode}): {result.stderr}"
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def one_clear_sentence(result: subprocess.CompletedProcess[str]) -> str:
    """The error output: a single ``error: ...`` line and no traceback (besides one-line warnings,
    such as the one about the operator's policy, which no operator publishes in these tests)."""
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# --- the cluster as the tests need it -----------------------------------------------------------


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Cluster:
    """The plan-only overlay, as a cluster admin installs it first."""
    kube.kubectl(cluster, "apply", "-k", str(kube.MANIFESTS / "overlays" / "plan-only"))
    kube.wait_for_crd(cluster)
    return cluster


@pytest.fixture(scope="module")
def agent_token(installed: Cluster, admin: k8s.ApiClient) -> Iterator[pathlib.Path]:
    """A node-bound token of the agent for this module's own node (created NotReady, removed after)."""
    config = mint_token(installed, service_account=f"{api.SYSTEM_NAMESPACE}/coroner-agent", node=NODE)
    try:
        yield config
    finally:
        coordination = k8s.CoordinationV1Api(admin)
        try:
            coordination.delete_namespaced_lease(f"{api.AGENT_LEASE_PREFIX}{NODE}", api.SYSTEM_NAMESPACE)
        except ApiException as exc:
            if exc.status != 404:
                raise
        k8s.CoreV1Api(admin).delete_node(NODE)


@pytest.fixture
def agent(agent_token: pathlib.Path, admin: k8s.ApiClient) -> Iterator[k8s.ApiClient]:
    """The node's agent: a freshly renewed agent Lease and an API client with the agent's identity."""
    components.put_agent_lease(admin, node=NODE, boot_id=BOOT, host_id=HOST, duration=300)
    with api_client(agent_token) as client:
        yield client


@pytest.fixture(scope="module")
def roles(installed: Cluster, admin: k8s.ApiClient) -> Iterator[dict[str, str]]:
    """ClusterRoles for humans: reading a plan, and retiring (bound per namespace by each test)."""
    rbac = k8s.RbacAuthorizationV1Api(admin)
    reader, retirer = f"kc-plan-reader-{SUFFIX}", f"kc-retirer-{SUFFIX}"
    rbac.create_cluster_role(
        {
            "metadata": {"name": reader},
            "rules": [
                {"apiGroups": [api.GROUP], "resources": [api.PLURAL], "verbs": ["get", "list"]},
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["list"]},
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]},
            ],
        }
    )
    rbac.create_cluster_role(
        {
            "metadata": {"name": retirer},
            "rules": [
                {"apiGroups": [api.GROUP], "resources": [api.PLURAL], "verbs": [api.RETIRE_VERB]},
                {"apiGroups": [api.GROUP], "resources": [f"{api.PLURAL}/status"], "verbs": ["get", "patch"]},
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
            ],
        }
    )
    try:
        yield {"reader": reader, "retirer": retirer}
    finally:
        for name in (reader, retirer):
            rbac.delete_cluster_role(name)


def _user(cluster: Cluster, admin: k8s.ApiClient, *, name: str, reader_role: str) -> Iterator[pathlib.Path]:
    rbac = k8s.RbacAuthorizationV1Api(admin)
    binding = f"{name}-reads-plans"
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": binding},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": reader_role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name}],
        }
    )
    try:
        yield user_kubeconfig(cluster, user=name)
    finally:
        rbac.delete_cluster_role_binding(binding)


@pytest.fixture(scope="module")
def alice(installed: Cluster, admin: k8s.ApiClient, roles: dict[str, str]) -> Iterator[pathlib.Path]:
    """A human who may read plans everywhere; `retire` is granted per test namespace by `grant`."""
    yield from _user(installed, admin, name=f"alice-{SUFFIX}", reader_role=roles["reader"])


@pytest.fixture(scope="module")
def bob(installed: Cluster, admin: k8s.ApiClient, roles: dict[str, str]) -> Iterator[pathlib.Path]:
    """A human who may read plans but never holds `retire`."""
    yield from _user(installed, admin, name=f"bob-{SUFFIX}", reader_role=roles["reader"])


@pytest.fixture
def grant(admin: k8s.ApiClient, roles: dict[str, str], namespace: str) -> str:
    """alice holds `retire` in this test's namespace only (a RoleBinding, gone with the namespace)."""
    k8s.RbacAuthorizationV1Api(admin).create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "alice-retires"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": roles["retirer"]},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": f"alice-{SUFFIX}"}],
        },
    )
    return namespace


def register(admin: k8s.ApiClient, namespace: str, name: str, *, pid: int, heartbeat_age: float = 5.0) -> None:
    """A registration whose heartbeat expired for real: interval 1 s, TTL 1 s, last heartbeat 5 s ago."""
    body = kube.registration_body(name=name, node=NODE, pid=pid, interval=1, ttl=1)
    kube.create_registration(admin, namespace, body)
    kube.patch_status(admin, namespace, name, {"status": {"lastHeartbeatTime": components.now_text(-heartbeat_age)}})


def dead(admin: k8s.ApiClient, agent: k8s.ApiClient, namespace: str, name: str, *, pid: int) -> None:
    """Registered, silent past its TTL, and attested Dead (ProcAbsent) by its node's agent."""
    register(admin, namespace, name, pid=pid)
    components.attest(agent, namespace, name, evidence="ProcAbsent")


def resource_version(admin: k8s.ApiClient, namespace: str, name: str) -> str:
    return str(kube.get_registration(admin, namespace, name)["metadata"]["resourceVersion"])


def plan_json(
    cluster: Cluster, namespace: str, *, kubeconfig: pathlib.Path, through_kubectl: bool = False
) -> dict[str, Any]:
    run = kubectl_coroner if through_kubectl else coroner
    result = run(cluster, "plan", "-n", namespace, "-o", "json", kubeconfig=kubeconfig)
    assert result.returncode == 0, result.stderr
    return as_json(result)


def reasons(document: dict[str, Any]) -> dict[str, str]:
    return {row["name"]: row["reason"] for row in document["registrations"]}


def apply_args(document: dict[str, Any], namespace: str, *names: str) -> list[str]:
    return [
        "apply",
        "-n",
        namespace,
        "--registry-fingerprint",
        document["registryFingerprint"],
        "--candidate-fingerprint",
        document["candidateFingerprint"],
        *names,
    ]


# --- plan ---------------------------------------------------------------------------------------


def test_plan_through_kubectl_shows_every_registration_with_its_reason(
    installed: Cluster, admin: k8s.ApiClient, agent: k8s.ApiClient, alice: pathlib.Path, grant: str
) -> None:
    namespace = grant
    dead(admin, agent, namespace, "dead", pid=5001)
    register(admin, namespace, "unattested", pid=5002)
    table = kubectl_coroner(installed, "plan", "-n", namespace, kubeconfig=alice)
    assert table.returncode == 0, table.stderr
    assert "Coroner plan: namespace" in table.stdout
    for expected in ("dead", "EligibleStaleOrphan", "unattested", "AttestationMissing", "registryFingerprint:"):
        assert expected in table.stdout
    assert f"kubectl coroner apply -n {namespace} --registry-fingerprint" in table.stdout

    document = plan_json(installed, namespace, kubeconfig=alice, through_kubectl=True)
    assert reasons(document) == {"dead": "EligibleStaleOrphan", "unattested": "AttestationMissing"}
    assert document["counts"]["EligibleStaleOrphan"] == 1 and document["counts"]["AttestationMissing"] == 1
    assert document["candidates"] == [f"{namespace}/dead"]
    assert document["retirePermission"] == {namespace: True}

    yaml_out = kubectl_coroner(installed, "plan", "-n", namespace, "-o", "yaml", kubeconfig=alice)
    assert yaml_out.returncode == 0 and f"registryFingerprint: {document['registryFingerprint']}" in yaml_out.stdout

    everywhere = kubectl_coroner(installed, "plan", "-A", "-o", "json", kubeconfig=alice)
    assert everywhere.returncode == 0, everywhere.stderr
    assert f"{namespace}/dead" in as_json(everywhere)["candidates"]


def test_plan_fingerprints_are_stable_across_heartbeats(
    installed: Cluster, admin: k8s.ApiClient, agent: k8s.ApiClient, alice: pathlib.Path, grant: str
) -> None:
    namespace = grant
    dead(admin, agent, namespace, "dead", pid=5101)
    register(admin, namespace, "live", pid=5102, heartbeat_age=0)
    components.attest(agent, namespace, "live", verdict="Alive", evidence="PidfdPinned")
    register(admin, namespace, "starting", pid=5103, heartbeat_age=0)
    before = plan_json(installed, namespace, kubeconfig=alice)
    assert reasons(before) == {"dead": "EligibleStaleOrphan", "live": "PidAlive", "starting": "AttestationMissing"}

    # Both live workers heartbeat; the agent re-attests the one it watches, as it does on every change.
    for name in ("live", "starting"):
        kube.patch_status(admin, namespace, name, {"status": {"lastHeartbeatTime": components.now_text()}})
    components.attest(agent, namespace, "live", verdict="Alive", evidence="PidfdPinned")
    components.put_agent_lease(admin, node=NODE, boot_id=BOOT, host_id=HOST, duration=300)

    after = plan_json(installed, namespace, kubeconfig=alice)
    assert reasons(after) == reasons(before)
    assert after["registryFingerprint"] == before["registryFingerprint"]
    assert after["candidateFingerprint"] == before["candidateFingerprint"]


# --- apply --------------------------------------------------------------------------------------


def test_apply_previews_then_retires_under_the_callers_identity_and_replays_idempotently(
    installed: Cluster, admin: k8s.ApiClient, agent: k8s.ApiClient, alice: pathlib.Path, grant: str
) -> None:
    namespace = grant
    dead(admin, agent, namespace, "dead", pid=5201)
    register(admin, namespace, "other", pid=5202)
    document = plan_json(installed, namespace, kubeconfig=alice)
    untouched = resource_version(admin, namespace, "dead")

    preview = kubectl_coroner(installed, *apply_args(document, namespace, "dead"), kubeconfig=alice)
    assert preview.returncode == 0, preview.stderr
    assert "WouldRetire" in preview.stdout and "--yes" in preview.stdout
    assert resource_version(admin, namespace, "dead") == untouched

    applied = kubectl_coroner(
        installed, *apply_args(document, namespace, "dead"), "--yes", "-o", "json", kubeconfig=alice
    )
    assert applied.returncode == 0, applied.stderr
    result = as_json(applied)
    assert [(row["name"], row["outcome"]) for row in result["rows"]] == [("dead", "Retired")]
    assert result["retiredBy"] == f"alice-{SUFFIX}"

    body = kube.get_registration(admin, namespace, "dead")
    retirement = body["status"]["retirement"]
    assert retirement["retiredBy"] == f"alice-{SUFFIX}"
    assert retirement["reason"] == "ProcAbsent" and retirement["decision"] == "EligibleStaleOrphan"
    assert retirement["attestation"] == body["status"]["attestation"]
    retired = components.condition(body, "Retired")
    assert retired is not None and retired["status"] == "True" and retired["reason"] == "ProcAbsent"
    assert components.condition(body, "Attested") is None and components.condition(body, "Retirable") is None
    events = components.events(admin, namespace)
    assert [event.involved_object.name for event in events] == ["dead"]
    assert f"alice-{SUFFIX}" in events[0].message and events[0].source.component == "kubectl-coroner"
    assert "retirement" not in (kube.get_registration(admin, namespace, "other").get("status") or {})

    # Replay: the same command again. The retirement moved the raw fingerprints, but a row retired
    # as planned is reported AlreadyRetired, not drift, and nothing is written twice.
    settled = resource_version(admin, namespace, "dead")
    replay = kubectl_coroner(
        installed, *apply_args(document, namespace, "dead"), "--yes", "-o", "json", kubeconfig=alice
    )
    assert replay.returncode == 0, replay.stderr
    assert [(row["name"], row["outcome"]) for row in as_json(replay)["rows"]] == [("dead", "AlreadyRetired")]
    assert resource_version(admin, namespace, "dead") == settled
    assert len(components.events(admin, namespace)) == 1

    # A fresh plan shows it terminal.
    assert reasons(plan_json(installed, namespace, kubeconfig=alice))["dead"] == "AlreadyTerminal"


def test_a_new_registration_between_plan_and_apply_aborts_registry_moved(
    installed: Cluster, admin: k8s.ApiClient, agent: k8s.ApiClient, alice: pathlib.Path, grant: str
) -> None:
    namespace = grant
    dead(admin, agent, namespace, "dead", pid=5301)
    document = plan_json(installed, namespace, kubeconfig=alice)
    untouched = resource_version(admin, namespace, "dead")
    register(admin, namespace, "newcomer", pid=5302)

    result = coroner(installed, *apply_args(document, namespace, "dead"), "--yes", kubeconfig=alice)
    assert result.returncode == 3
    assert "RegistryMoved" in one_clear_sentence(result)
    assert resource_version(admin, namespace, "dead") == untouched
    assert not components.events(admin, namespace)


def test_a_new_attestation_between_plan_and_apply_aborts_candidate_set_moved(
    installed: Cluster, admin: k8s.ApiClient, agent: k8s.ApiClient, alice: pathlib.Path, grant: str
) -> None:
    namespace = grant
    dead(admin, agent, namespace, "dead", pid=5401)
    register(admin, namespace, "later", pid=5402)
    document = plan_json(installed, namespace, kubeconfig=alice)
    components.attest(agent, namespace, "later", evidence="ProcAbsent")  # a second candidate appears
    untouched = {name: resource_version(admin, namespace, name) for name in ("dead", "later")}

    result = coroner(installed, *apply_args(document, namespace, "dead"), "--yes", "-o", "json", kubeconfig=alice)
    assert result.returncode == 3
    assert as_json(result)["abort"] == "CandidateSetMoved"
    assert "CandidateSetMoved" in one_clear_sentence(result)
    assert {name: resource_version(admin, namespace, name) for name in untouched} == untouched


def test_a_user_without_retire_is_refused_and_nothing_changes(
    installed: Cluster, admin: k8s.ApiClient, agent: k8s.ApiClient, alice: pathlib.Path, bob: pathlib.Path, grant: str
) -> None:
    namespace = grant
    dead(admin, agent, namespace, "dead", pid=5501)
    untouched = resource_version(admin, namespace, "dead")
    bobs = plan_json(installed, namespace, kubeconfig=bob)
    assert reasons(bobs) == {"dead": "RetirePermissionMissing"}
    assert bobs["retirePermission"] == {namespace: False}
    table = coroner(installed, "plan", "-n", namespace, kubeconfig=bob)
    assert "do not hold the retire verb" in table.stdout

    refused = coroner(installed, *apply_args(bobs, namespace, "dead"), "--yes", kubeconfig=bob)
    assert refused.returncode == 2
    sentence = one_clear_sentence(refused)
    assert "is not a retirement candidate (RetirePermissionMissing)" in sentence and "retire verb" in sentence

    # Bob replaying alice's approval: her candidate set is not his.
    alices = plan_json(installed, namespace, kubeconfig=alice)
    borrowed = coroner(installed, *apply_args(alices, namespace, "dead"), "--yes", kubeconfig=bob)
    assert borrowed.returncode == 3 and "CandidateSetMoved" in one_clear_sentence(borrowed)
    assert resource_version(admin, namespace, "dead") == untouched


def test_bad_names_and_foreign_fingerprints_are_one_sentence_and_change_nothing(
    installed: Cluster, admin: k8s.ApiClient, agent: k8s.ApiClient, alice: pathlib.Path, grant: str
) -> None:
    namespace = grant
    dead(admin, agent, namespace, "dead", pid=5601)
    register(admin, namespace, "unattested", pid=5602)
    document = plan_json(installed, namespace, kubeconfig=alice)
    untouched = resource_version(admin, namespace, "dead")

    missing = coroner(installed, *apply_args(document, namespace, "nosuch"), "--yes", kubeconfig=alice)
    assert missing.returncode == 2
    assert f"WorkerRegistration {namespace}/nosuch does not exist" in one_clear_sentence(missing)
    assert missing.stderr.rstrip().endswith("Nothing was changed.")

    ineligible = coroner(installed, *apply_args(document, namespace, "unattested"), "--yes", kubeconfig=alice)
    assert ineligible.returncode == 2 and "(AttestationMissing)" in one_clear_sentence(ineligible)

    foreign = dict(
        document, registryFingerprint="v1:sha256:" + "ab" * 32, candidateFingerprint="v1:sha256:" + "cd" * 32
    )
    elsewhere = coroner(installed, *apply_args(foreign, namespace, "dead"), "--yes", kubeconfig=alice)
    assert elsewhere.returncode == 3
    assert "another cluster" in one_clear_sentence(elsewhere)

    garbled = coroner(
        installed, *apply_args(dict(document, registryFingerprint="v1:sha"), namespace, "dead"), kubeconfig=alice
    )
    assert garbled.returncode == 2 and "is not a Coroner fingerprint" in one_clear_sentence(garbled)
    assert resource_version(admin, namespace, "dead") == untouched
    assert not components.events(admin, namespace)


def test_no_permission_to_read_is_one_sentence(installed: Cluster, namespace: str) -> None:
    nobody = user_kubeconfig(installed, user=f"nobody-{SUFFIX}")
    result = coroner(installed, "plan", "-n", namespace, kubeconfig=nobody)
    assert result.returncode == 2
    sentence = one_clear_sentence(result)
    assert "forbidden to list workerregistrations" in sentence and "coroner-viewer" in sentence


def test_an_unreachable_cluster_is_one_sentence(installed: Cluster, tmp_path: pathlib.Path) -> None:
    closed = write_kubeconfig(
        tmp_path / "closed.kubeconfig",
        server="https://127.0.0.1:1",
        ca=installed.pki.ca_cert,
        user="nobody",
        token="x",
    )
    for command in (["plan", "-n", "default"], ["doctor"]):
        result = coroner(installed, *command, kubeconfig=closed)
        assert result.returncode == 2, result
        assert "cannot reach the Kubernetes API server at https://127.0.0.1:1" in one_clear_sentence(result)


def test_a_cluster_without_the_crd_is_one_sentence(tmp_path: pathlib.Path) -> None:
    bare = cluster_mod.up(tmp_path / "bare", controller_manager=False)
    try:
        result = coroner(bare, "plan", "-n", "default", kubeconfig=bare.kubeconfig)
        assert result.returncode == 2
        assert "CustomResourceDefinition workerregistrations.coroner.dev) is not installed" in one_clear_sentence(
            result
        )
        doctor = coroner(bare, "doctor", "-o", "json", kubeconfig=bare.kubeconfig)
        assert doctor.returncode == 1
        checks = {check["name"]: check for check in as_json(doctor)["checks"]}
        assert checks["crd"]["status"] == "FAIL"
        assert checks["unattested"]["status"] == "UNKNOWN" and "count" not in checks["unattested"]["facts"]
        assert checks["last-sweep"]["status"] == "UNKNOWN"
    finally:
        cluster_mod.down(tmp_path / "bare")


# --- doctor -------------------------------------------------------------------------------------


def doctor(cluster: Cluster, *extra: str, through_kubectl: bool = False) -> tuple[int, dict[str, dict[str, Any]]]:
    run = kubectl_coroner if through_kubectl else coroner
    result = run(cluster, "doctor", "-o", "json", *extra, kubeconfig=cluster.kubeconfig)
    assert result.returncode in (0, 1), result.stderr
    checks = {check["name"]: check for check in as_json(result)["checks"]}
    failed = any(check["status"] == "FAIL" for check in checks.values())
    assert result.returncode == (1 if failed else 0)
    return result.returncode, checks


def test_doctor_names_a_missing_policy_binding_until_it_is_reapplied(installed: Cluster) -> None:
    binding = "coroner-retire-requires-capability"
    _, checks = doctor(installed)
    assert checks["crd"]["status"] == "PASS"
    assert checks["admission-policies"]["status"] == "PASS"
    kube.kubectl(installed, "delete", "validatingadmissionpolicybinding", binding)
    try:
        code, checks = doctor(installed)
        assert code == 1
        assert checks["admission-policies"]["status"] == "FAIL"
        assert checks["admission-policies"]["objects"] == [f"ValidatingAdmissionPolicyBinding/{binding}"]
    finally:
        kube.kubectl(installed, "apply", "-k", str(kube.MANIFESTS / "overlays" / "plan-only"))
    assert doctor(installed)[1]["admission-policies"]["status"] == "PASS"


@pytest.fixture
def ready_node(installed: Cluster, admin: k8s.ApiClient) -> Iterator[str]:
    name = f"kc-ready-{uuid.uuid4().hex[:6]}"
    ensure_node(installed, name=name, boot_id=BOOT, ready=True)
    try:
        yield name
    finally:
        try:
            k8s.CoordinationV1Api(admin).delete_namespaced_lease(
                f"{api.AGENT_LEASE_PREFIX}{name}", api.SYSTEM_NAMESPACE
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
        k8s.CoreV1Api(admin).delete_node(name)


def agent_problem(checks: dict[str, dict[str, Any]], node: str) -> str | None:
    check = checks["agents"]
    problem: str | None = check["facts"].get("problems", {}).get(node)
    assert (f"node/{node}" in check["objects"]) == (problem is not None)
    if problem is not None:
        assert check["status"] == "FAIL"
    elif not check["objects"]:
        assert check["status"] == "PASS"
    return problem


def test_doctor_names_ready_nodes_without_a_healthy_agent(
    installed: Cluster, admin: k8s.ApiClient, ready_node: str
) -> None:
    problem = agent_problem(doctor(installed)[1], ready_node)
    assert problem is not None and "not found" in problem

    components.put_agent_lease(admin, node=ready_node, boot_id=BOOT, host_id=HOST)
    assert agent_problem(doctor(installed)[1], ready_node) is None

    components.put_agent_lease(admin, node=ready_node, boot_id=OTHER_BOOT, host_id=HOST)
    problem = agent_problem(doctor(installed)[1], ready_node)
    assert problem is not None and f"differs from the Node's bootID {BOOT}" in problem

    components.put_agent_lease(admin, node=ready_node, boot_id=BOOT, host_id=HOST, duration=10, renew_offset=-60)
    problem = agent_problem(doctor(installed)[1], ready_node)
    assert problem is not None and "expired at" in problem

    # The Node reboots: its bootID moves, the agent follows, and they agree again.
    ensure_node(installed, name=ready_node, boot_id=OTHER_BOOT)
    components.put_agent_lease(admin, node=ready_node, boot_id=OTHER_BOOT, host_id=HOST)
    assert agent_problem(doctor(installed)[1], ready_node) is None


@pytest.fixture
def operator_lease(installed: Cluster, admin: k8s.ApiClient) -> Iterator[k8s.CoordinationV1Api]:
    """The operator's Lease as a test writes it; whatever was there before comes back afterwards."""
    coordination = k8s.CoordinationV1Api(admin)
    name, system = "coroner-operator", api.SYSTEM_NAMESPACE
    try:
        saved: dict[str, Any] | None = admin.sanitize_for_serialization(
            coordination.read_namespaced_lease(name, system)
        )
    except ApiException as exc:
        if exc.status != 404:
            raise
        saved = None
    try:
        yield coordination
    finally:
        try:
            coordination.delete_namespaced_lease(name, system)
        except ApiException as exc:
            if exc.status != 404:
                raise
        if saved is not None:
            saved["metadata"] = {
                k: v for k, v in saved["metadata"].items() if k in ("name", "namespace", "annotations", "labels")
            }
            coordination.create_namespaced_lease(system, saved)


def write_operator_lease(
    coordination: k8s.CoordinationV1Api,
    *,
    renew_offset: float,
    sweep: dict[str, Any] | None,
    policy: str | None = None,
) -> None:
    """The operator's Lease as an operator writes it; `policy` is the coroner.dev/policy annotation."""
    name, system = "coroner-operator", api.SYSTEM_NAMESPACE
    try:
        coordination.delete_namespaced_lease(name, system)
    except ApiException as exc:
        if exc.status != 404:
            raise
    annotations = {} if sweep is None else {f"{api.GROUP}/last-sweep": json.dumps(sweep)}
    if policy is not None:
        annotations[f"{api.GROUP}/policy"] = policy
    coordination.create_namespaced_lease(
        system,
        {
            "metadata": {"name": name, "annotations": annotations},
            "spec": {
                "holderIdentity": "system:serviceaccount:coroner-system:coroner-operator",
                "leaseDurationSeconds": 180,
                "renewTime": components.now_text(renew_offset),
            },
        },
    )


def test_doctor_reports_operator_liveness_and_the_last_sweep_per_namespace(
    installed: Cluster, operator_lease: k8s.CoordinationV1Api
) -> None:
    write_operator_lease(operator_lease, renew_offset=0, sweep=None)
    _, checks = doctor(installed)
    assert checks["operator-alive"]["status"] == "PASS"
    assert checks["last-sweep"]["status"] == "UNKNOWN"
    assert "never recorded" in checks["last-sweep"]["summary"] and "failures" not in checks["last-sweep"]["facts"]

    sweep = {
        "time": components.now_text(),
        "registrations": 3,
        "namespaces": 2,
        "failures": {"broken-ns": 2, "fine-ns": 0},
        "errors": {"broken-ns": "403 Forbidden: no patch"},
        "byReason": {},
    }
    write_operator_lease(operator_lease, renew_offset=0, sweep=sweep)
    code, checks = doctor(installed)
    assert code == 1
    assert checks["last-sweep"]["status"] == "FAIL" and checks["last-sweep"]["objects"] == ["namespace/broken-ns"]
    assert "403 Forbidden: no patch" in checks["last-sweep"]["summary"]

    write_operator_lease(operator_lease, renew_offset=-600, sweep=dict(sweep, failures={"fine-ns": 0}, errors={}))
    _, checks = doctor(installed)
    assert checks["operator-alive"]["status"] == "FAIL" and "expired at" in checks["operator-alive"]["summary"]
    assert checks["last-sweep"]["status"] == "PASS"

    operator_lease.delete_namespaced_lease("coroner-operator", api.SYSTEM_NAMESPACE)
    _, checks = doctor(installed)
    assert checks["operator-alive"]["status"] == "FAIL" and checks["last-sweep"]["status"] == "UNKNOWN"


@pytest.fixture
def grant_restored(installed: Cluster, admin: k8s.ApiClient) -> Iterator[None]:
    """Whatever the operator's retire grant was before the test, it is again afterwards."""
    rbac = k8s.RbacAuthorizationV1Api(admin)
    try:
        rbac.read_cluster_role_binding("coroner-operator-retire")
        granted = True
    except ApiException as exc:
        if exc.status != 404:
            raise
        granted = False
    try:
        yield
    finally:
        if granted:
            kube.kubectl(installed, "apply", "-k", str(kube.MANIFESTS / "overlays" / "production"))
        else:
            kube.kubectl(installed, "delete", "clusterrolebinding", "coroner-operator-retire", "--ignore-not-found")


def test_doctor_reports_the_retire_grant_and_registrations_blocked_or_unattested(
    installed: Cluster, admin: k8s.ApiClient, agent: k8s.ApiClient, namespace: str, grant_restored: None
) -> None:
    dead(admin, agent, namespace, "dead", pid=5701)
    register(admin, namespace, "unattested", pid=5702)
    dead_row, unattested_row = f"workerregistration/{namespace}/dead", f"workerregistration/{namespace}/unattested"

    kube.kubectl(installed, "delete", "clusterrolebinding", "coroner-operator-retire", "--ignore-not-found")
    code, checks = doctor(installed, "--attestation-grace-seconds=0", through_kubectl=True)
    assert code == 1
    assert checks["retire-grant"]["status"] == "FAIL"
    assert checks["retire-grant"]["objects"] == ["system:serviceaccount:coroner-system:coroner-operator"]
    assert checks["blocked"]["status"] == "FAIL" and dead_row in checks["blocked"]["objects"]
    assert f"{namespace}/dead" in checks["blocked"]["facts"]["byReason"]["RetirePermissionMissing"]
    assert checks["unattested"]["status"] == "FAIL" and unattested_row in checks["unattested"]["objects"]
    assert dead_row not in checks["unattested"]["objects"]

    _, planned_only = doctor(installed, "--expect-plan-only", "--attestation-grace-seconds=3600", through_kubectl=True)
    assert planned_only["retire-grant"]["status"] == "PASS"
    assert dead_row not in planned_only["blocked"]["objects"]
    assert unattested_row not in planned_only["unattested"]["objects"]  # within its grace period

    kube.kubectl(installed, "apply", "-k", str(kube.MANIFESTS / "overlays" / "production"))
    _, checks = doctor(installed, through_kubectl=True)
    assert checks["retire-grant"]["status"] == "PASS"
    assert dead_row not in checks["blocked"]["objects"]


def test_doctor_reviews_the_grant_of_a_name_prefixed_operator(installed: Cluster, admin: k8s.ApiClient) -> None:
    """A Helm release with namePrefix (charts/coroner) runs its operator as `<prefix>coroner-operator`
    and binds `<prefix>coroner-operator-retire` to it: doctor pointed at that release's namespace
    reviews that ServiceAccount's grant, learned from the operator's Deployment there
    (never a green doctor for a release it did not review)."""
    system, prefix = f"prefixed-{SUFFIX}", "team-a-"
    account = f"{prefix}coroner-operator"
    user = f"system:serviceaccount:{system}:{account}"
    labels = {"app.kubernetes.io/name": "coroner-operator"}
    rbac = k8s.RbacAuthorizationV1Api(admin)
    kube.kubectl(installed, "create", "namespace", system)
    try:
        k8s.AppsV1Api(admin).create_namespaced_deployment(
            system,
            {
                "metadata": {"name": account},
                "spec": {
                    "replicas": 0,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {"serviceAccountName": account, "containers": [{"name": "operator", "image": "x"}]},
                    },
                },
            },
        )
        _, checks = doctor(installed, f"--system-namespace={system}")
        assert checks["retire-grant"]["status"] == "FAIL" and checks["retire-grant"]["objects"] == [user]
        assert f"from Deployment {system}/{account}" in checks["retire-grant"]["summary"]

        rbac.create_cluster_role(
            {
                "metadata": {"name": f"{prefix}coroner-retire-{SUFFIX}"},
                "rules": [{"apiGroups": [api.GROUP], "resources": [api.PLURAL], "verbs": [api.RETIRE_VERB]}],
            }
        )
        rbac.create_cluster_role_binding(
            {
                "metadata": {"name": f"{prefix}coroner-operator-retire-{SUFFIX}"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": f"{prefix}coroner-retire-{SUFFIX}",
                },
                "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": system}],
            }
        )
        _, checks = doctor(installed, f"--system-namespace={system}")
        assert checks["retire-grant"]["status"] == "PASS", checks["retire-grant"]["summary"]
        assert checks["retire-grant"]["facts"]["user"] == user
    finally:
        for kind, name in (
            ("clusterrolebinding", f"{prefix}coroner-operator-retire-{SUFFIX}"),
            ("clusterrole", f"{prefix}coroner-retire-{SUFFIX}"),
            ("namespace", system),
        ):
            kube.kubectl(installed, "delete", kind, name, "--ignore-not-found", "--wait=false")


# --- the operator's published policy, and node loss -----------------------------------------------

NODE_LOSS_POLICY = json.dumps(
    {
        "absenceConfirmSeconds": 10.0,
        "pidfdExitedWindowIntervals": 0.0,
        "procAbsentWindowIntervals": 2.0,
        "bootBoundaryWindowIntervals": 2.0,
        "nodeDeletionEvidence": True,
        "nodeDeletionQuarantineSeconds": 300.0,
        "nodeOutOfServiceEvidence": True,
    }
)


def warnings_of(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("warning: ")]


def test_plan_decides_with_the_operators_published_policy_and_warns_when_told_otherwise(
    installed: Cluster,
    admin: k8s.ApiClient,
    agent: k8s.ApiClient,
    alice: pathlib.Path,
    grant: str,
    operator_lease: k8s.CoordinationV1Api,
) -> None:
    namespace = grant
    dead(admin, agent, namespace, "dead", pid=5801)
    # alice reads plans with `list` on leases only: the operator's Lease comes with the system
    # namespace's Leases the plan lists anyway.
    write_operator_lease(operator_lease, renew_offset=0, sweep=None, policy=NODE_LOSS_POLICY)
    published = coroner(installed, "plan", "-n", namespace, "-o", "json", kubeconfig=alice)
    assert published.returncode == 0 and warnings_of(published) == [], published.stderr
    policy = as_json(published)["policy"]
    assert policy["source"] == "operator" and policy["lease"] == f"{api.SYSTEM_NAMESPACE}/coroner-operator"
    assert policy["values"]["nodeDeletionEvidence"] is True
    assert policy["values"]["nodeDeletionQuarantineSeconds"] == 300.0
    table = coroner(installed, "plan", "-n", namespace, kubeconfig=alice)
    assert "Policy: the operator's, published on Lease coroner-system/coroner-operator" in table.stdout

    # Flags still win, and the difference is said with both values.
    told = coroner(installed, "plan", "-n", namespace, "-o", "json", "--no-node-deletion-evidence", kubeconfig=alice)
    assert told.returncode == 0, told.stderr
    (warning,) = warnings_of(told)
    assert "--no-node-deletion-evidence differs from the operator's published nodeDeletionEvidence=true" in warning
    assert as_json(told)["policy"]["source"] == "operator+flags"
    assert as_json(told)["policy"]["values"]["nodeDeletionEvidence"] is False

    # Unreadable, then absent: the built-in defaults, said so.
    write_operator_lease(operator_lease, renew_offset=0, sweep=None, policy="{garbage")
    garbled = coroner(installed, "plan", "-n", namespace, "-o", "json", kubeconfig=alice)
    assert garbled.returncode == 0
    (warning,) = warnings_of(garbled)
    assert "is unreadable: it is not JSON" in warning and "deciding with the built-in defaults" in warning
    assert as_json(garbled)["policy"]["source"] == "defaults"
    operator_lease.delete_namespaced_lease("coroner-operator", api.SYSTEM_NAMESPACE)
    absent = coroner(installed, "plan", "-n", namespace, "-o", "json", kubeconfig=alice)
    (warning,) = warnings_of(absent)
    assert "Lease coroner-system/coroner-operator does not exist" in warning
    assert reasons(as_json(absent)) == {"dead": "EligibleStaleOrphan"}


@pytest.fixture
def lost_node(installed: Cluster, admin: k8s.ApiClient) -> Iterator[str]:
    """A node whose agent died with it (its Lease expired) and whose Node object was then deleted."""
    name = f"kc-lost-{uuid.uuid4().hex[:6]}"
    ensure_node(installed, name=name, boot_id=BOOT, ready=True)
    try:
        yield name
    finally:
        try:
            k8s.CoordinationV1Api(admin).delete_namespaced_lease(
                f"{api.AGENT_LEASE_PREFIX}{name}", api.SYSTEM_NAMESPACE
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
        try:
            k8s.CoreV1Api(admin).delete_node(name)
        except ApiException as exc:
            if exc.status != 404:
                raise


def test_doctor_fails_for_registrations_stranded_on_a_deleted_node_and_names_the_fix(
    installed: Cluster,
    admin: k8s.ApiClient,
    namespace: str,
    lost_node: str,
    operator_lease: k8s.CoordinationV1Api,
) -> None:
    uid = k8s.CoreV1Api(admin).read_node(lost_node).metadata.uid
    for index, name in enumerate(("consumer-1", "consumer-2")):
        body = kube.registration_body(name=name, node=lost_node, pid=5901 + index)
        body["spec"]["nodeUID"] = uid
        kube.create_registration(admin, namespace, body)
        kube.patch_status(admin, namespace, name, {"status": {"lastHeartbeatTime": components.now_text(-120)}})
    # The node is lost: its agent stopped renewing a minute ago, then the Node object was deleted.
    components.put_agent_lease(admin, node=lost_node, boot_id=BOOT, host_id=HOST, duration=10, renew_offset=-70)
    k8s.CoreV1Api(admin).delete_node(lost_node)
    write_operator_lease(
        operator_lease, renew_offset=0, sweep=None, policy=NODE_LOSS_POLICY.replace("true", "false", 1)
    )

    code, checks = doctor(installed)
    assert code == 1
    lost = checks["node-loss"]
    assert lost["status"] == "FAIL", lost
    assert f"node/{lost_node}" in lost["objects"]
    assert {f"workerregistration/{namespace}/consumer-1", f"workerregistration/{namespace}/consumer-2"} <= set(
        lost["objects"]
    )
    facts = lost["facts"]["nodes"][lost_node]
    assert facts["count"] == 2 and facts["node"] == "deleted" and facts["agentLease"] == "expired"
    assert 50 <= facts["lostSeconds"] < 600
    summary = lost["summary"]
    assert f"{lost_node}: 2 registration(s); Node {lost_node} is deleted (no Node object)" in summary
    assert f"Lease coroner-system/coroner-agent-{lost_node} expired at" in summary
    assert "add the manifests/components/node-loss component" in summary
    # A deleted Node: the human's statement is the flags (the CLI counts the quarantine from its GET).
    assert "`kubectl coroner apply --node-deletion-evidence --node-quarantine-seconds=0`" in summary
    # The agents check no longer passes on "every Ready node (0)": the node holds registrations.
    problem = agent_problem(checks, lost_node)
    assert problem is not None and "expired at" in problem and "no Node object" in problem

    # The operator runs with node-deletion evidence: doctor says when its quarantine ends instead.
    write_operator_lease(operator_lease, renew_offset=0, sweep=None, policy=NODE_LOSS_POLICY)
    result = coroner(installed, "doctor", kubeconfig=installed.kubeconfig)
    assert result.returncode == 1 and warnings_of(result) == []
    assert "Policy: the operator's, published on Lease coroner-system/coroner-operator" in result.stdout
    assert "node-loss" in result.stdout and "its 300s quarantine ends 300s after it saw Node" in " ".join(
        result.stdout.split()
    )
    assert "error: doctor: check(s)" in result.stderr and "node-loss" in result.stderr


# --- kubectl conventions: contexts, impersonation, saved plans, outputs -------------------------


def merged_kubeconfig(
    path: pathlib.Path, *, contexts: dict[str, tuple[pathlib.Path, str | None]], current: str
) -> pathlib.Path:
    """One kubeconfig with a context per (user kubeconfig, namespace), as a person keeps them."""
    users: list[dict[str, Any]] = []
    entries: list[dict[str, Any]] = []
    clusters: list[dict[str, Any]] = []
    for name, (source, namespace) in contexts.items():
        config = json.loads(source.read_text())
        clusters = config["clusters"]
        user = config["users"][0]
        if user not in users:
            users.append(user)
        context: dict[str, Any] = {"cluster": clusters[0]["name"], "user": user["name"]}
        if namespace is not None:
            context["namespace"] = namespace
        entries.append({"name": name, "context": context})
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": clusters,
                "users": users,
                "contexts": entries,
                "current-context": current,
            }
        )
    )
    return path


def test_context_selects_identity_and_namespace_of_a_two_context_kubeconfig(
    installed: Cluster,
    admin: k8s.ApiClient,
    agent: k8s.ApiClient,
    alice: pathlib.Path,
    bob: pathlib.Path,
    grant: str,
    tmp_path: pathlib.Path,
) -> None:
    namespace = grant
    dead(admin, agent, namespace, "dead", pid=6001)
    config = merged_kubeconfig(
        tmp_path / "config", contexts={"alice@jobs": (alice, namespace), "bob": (bob, None)}, current="bob"
    )
    # The current context: bob, whose context has no namespace: "default", where nothing is.
    as_bob = coroner(installed, "plan", "-o", "json", kubeconfig=config)
    assert as_bob.returncode == 0, as_bob.stderr
    assert as_json(as_bob)["scope"]["namespace"] == "default"
    assert reasons(plan_json(installed, namespace, kubeconfig=config)) == {"dead": "RetirePermissionMissing"}

    # --context: alice, and her context's namespace, with no -n.
    planned = coroner(installed, "plan", "--context", "alice@jobs", "-o", "json", kubeconfig=config)
    assert planned.returncode == 0, planned.stderr
    document = as_json(planned)
    assert document["scope"]["namespace"] == namespace and reasons(document) == {"dead": "EligibleStaleOrphan"}
    saved = tmp_path / "plan.json"
    saved.write_text(planned.stdout)

    applied = coroner(
        installed,
        *("apply", "--context", "alice@jobs", "--from-plan", str(saved), "--all-candidates", "--yes", "-o", "json"),
        kubeconfig=config,
    )
    assert applied.returncode == 0, applied.stderr
    result = as_json(applied)
    assert result["retiredBy"] == f"alice-{SUFFIX}"
    assert [(row["name"], row["outcome"]) for row in result["rows"]] == [("dead", "Retired")]

    unknown = coroner(installed, "plan", "--context", "carol", kubeconfig=config)
    assert unknown.returncode == 2
    assert "has no context 'carol' (it has alice@jobs, bob)" in one_clear_sentence(unknown)


@pytest.fixture
def readers_group(admin: k8s.ApiClient, roles: dict[str, str]) -> Iterator[str]:
    """A group (not a user) bound to the plan-reading ClusterRole."""
    rbac = k8s.RbacAuthorizationV1Api(admin)
    group = f"kc-readers-{SUFFIX}"
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": group},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": roles["reader"]},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}],
        }
    )
    try:
        yield group
    finally:
        rbac.delete_cluster_role_binding(group)


def test_as_impersonates_and_an_identity_without_retire_is_refused(
    installed: Cluster,
    admin: k8s.ApiClient,
    agent: k8s.ApiClient,
    alice: pathlib.Path,
    bob: pathlib.Path,
    grant: str,
    readers_group: str,
) -> None:
    namespace = grant
    dead(admin, agent, namespace, "dead", pid=6101)
    untouched = resource_version(admin, namespace, "dead")
    root = installed.kubeconfig  # a cluster admin, who may impersonate
    as_bob = ("--as", f"bob-{SUFFIX}")

    bobs = coroner(installed, "plan", "-n", namespace, "-o", "json", *as_bob, kubeconfig=root)
    assert bobs.returncode == 0, bobs.stderr
    bobs_plan = as_json(bobs)
    assert reasons(bobs_plan) == {"dead": "RetirePermissionMissing"}
    assert bobs_plan["retirePermission"] == {namespace: False}

    refused = coroner(installed, *apply_args(bobs_plan, namespace, "dead"), "--yes", *as_bob, kubeconfig=root)
    assert refused.returncode == 2
    sentence = one_clear_sentence(refused)
    assert "is not a retirement candidate (RetirePermissionMissing)" in sentence and "retire verb" in sentence
    everything = coroner(
        installed, *apply_args(bobs_plan, namespace), "--all-candidates", "--yes", *as_bob, kubeconfig=root
    )
    assert everything.returncode == 0, everything.stderr  # bob's plan has no candidates: nothing to do
    assert "WorkerRegistration" not in everything.stdout and resource_version(admin, namespace, "dead") == untouched

    # Someone without the impersonate verb cannot borrow another identity.
    borrowed = coroner(installed, "plan", "-n", namespace, *as_bob, kubeconfig=alice)
    assert borrowed.returncode == 2
    assert f"forbidden to impersonate user bob-{SUFFIX} (--as)" in one_clear_sentence(borrowed)

    # Groups: every --as-group is its own header; the second one is the group that may read.
    carol = ("--as", f"carol-{SUFFIX}", "--as-group", "system:authenticated")
    lacking = coroner(installed, "plan", "-n", namespace, *carol, kubeconfig=root)
    assert lacking.returncode == 2 and "forbidden to list workerregistrations" in one_clear_sentence(lacking)
    reading = coroner(
        installed, "plan", "-n", namespace, "-o", "json", *carol, "--as-group", readers_group, kubeconfig=root
    )
    assert reading.returncode == 0, reading.stderr
    assert reasons(as_json(reading)) == {"dead": "RetirePermissionMissing"}

    # Impersonating alice, who holds retire: the retirement is recorded as hers.
    as_alice = ("--as", f"alice-{SUFFIX}")
    alices = as_json(coroner(installed, "plan", "-n", namespace, "-o", "json", *as_alice, kubeconfig=root))
    applied = coroner(
        installed, *apply_args(alices, namespace, "dead"), "--yes", "-o", "json", *as_alice, kubeconfig=root
    )
    assert applied.returncode == 0, applied.stderr
    assert as_json(applied)["retiredBy"] == f"alice-{SUFFIX}"
    assert kube.get_registration(admin, namespace, "dead")["status"]["retirement"]["retiredBy"] == f"alice-{SUFFIX}"


def test_apply_from_a_saved_plan_retires_its_candidates_in_parallel_and_nothing_else(
    installed: Cluster,
    admin: k8s.ApiClient,
    agent: k8s.ApiClient,
    alice: pathlib.Path,
    grant: str,
    tmp_path: pathlib.Path,
) -> None:
    namespace = grant
    names = [f"dead-{i}" for i in range(6)]
    for i, name in enumerate(names):
        dead(admin, agent, namespace, name, pid=6201 + i)
    register(admin, namespace, "unattested", pid=6299)
    planned = coroner(installed, "plan", "-n", namespace, "-o", "yaml", kubeconfig=alice)
    assert planned.returncode == 0, planned.stderr
    saved = tmp_path / "plan.yaml"
    saved.write_text(planned.stdout)
    document = plan_json(installed, namespace, kubeconfig=alice)
    from_plan = ("apply", "--from-plan", str(saved), "--all-candidates")

    # -o name, kubectl's way: the plan's rows, and (a preview) the rows apply would retire.
    names_out = coroner(installed, "plan", "-n", namespace, "-o", "name", kubeconfig=alice)
    assert names_out.stdout.split() == [f"workerregistration.coroner.dev/{n}" for n in [*names, "unattested"]]
    preview = coroner(installed, *from_plan, "-o", "name", kubeconfig=alice)
    assert preview.returncode == 0, preview.stderr
    assert preview.stdout.split() == [f"workerregistration.coroner.dev/{n}" for n in names]
    assert all(resource_version(admin, namespace, n) for n in names)
    assert not components.events(admin, namespace)

    # A name the approved plan did not list as a candidate is refused before anything is read.
    outside = coroner(installed, "apply", "--from-plan", str(saved), "unattested", "--yes", kubeconfig=alice)
    assert outside.returncode == 2 and "not among the candidates of the approved plan" in one_clear_sentence(outside)
    # -o name output of plan names the rows in kubectl's form, which apply accepts.
    one = coroner(
        installed,
        "apply",
        "--from-plan",
        str(saved),
        "workerregistration.coroner.dev/dead-0",
        "-o",
        "json",
        kubeconfig=alice,
    )
    assert one.returncode == 0 and [row["name"] for row in as_json(one)["rows"]] == ["dead-0"]

    applied = coroner(installed, *from_plan, "--yes", "--parallelism", "3", "-o", "json", kubeconfig=alice)
    assert applied.returncode == 0, applied.stderr
    assert "Retiring" not in applied.stderr  # no progress bar when stderr is not a terminal
    rows = as_json(applied)["rows"]
    assert [(row["name"], row["outcome"]) for row in rows] == [(n, "Retired") for n in names]
    assert sorted(e.involved_object.name for e in components.events(admin, namespace)) == names
    assert "retirement" not in (kube.get_registration(admin, namespace, "unattested").get("status") or {})

    # Replays, by the file and by the fingerprints alone: every row AlreadyRetired, nothing written.
    settled = {n: resource_version(admin, namespace, n) for n in names}
    for replay in (
        coroner(installed, *from_plan, "--yes", "-o", "json", kubeconfig=alice),
        coroner(
            installed, *apply_args(document, namespace), "--all-candidates", "--yes", "-o", "json", kubeconfig=alice
        ),
    ):
        assert replay.returncode == 0, replay.stderr
        assert {row["outcome"] for row in as_json(replay)["rows"]} == {"AlreadyRetired"}
    assert {n: resource_version(admin, namespace, n) for n in names} == settled
    assert len(components.events(admin, namespace)) == len(names)

    # A candidate that appears after the approval is never retired with it.
    dead(admin, agent, namespace, "late", pid=6300)
    late = resource_version(admin, namespace, "late")
    moved = coroner(installed, *from_plan, "--yes", kubeconfig=alice)
    assert moved.returncode == 3 and "CandidateSetMoved" in one_clear_sentence(moved)
    assert resource_version(admin, namespace, "late") == late


def test_apply_shows_progress_on_a_terminal(
    installed: Cluster, admin: k8s.ApiClient, agent: k8s.ApiClient, alice: pathlib.Path, grant: str
) -> None:
    namespace = grant
    for i in range(3):
        dead(admin, agent, namespace, f"dead-{i}", pid=6401 + i)
    document = plan_json(installed, namespace, kubeconfig=alice)
    env = {key: value for key, value in os.environ.items() if key != "KUBECONFIG"}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["TERM"] = "xterm-256color"
    command = [
        str(installed.binary("kubectl")),
        "coroner",
        *apply_args(document, namespace),
        "--all-candidates",
        "--yes",
        "-o",
        "json",
        f"--kubeconfig={alice}",
    ]
    leader, follower = pty.openpty()
    try:
        process = subprocess.run(command, stdout=subprocess.PIPE, stderr=follower, env=env, timeout=120, check=False)
        os.close(follower)
        follower = -1
        terminal = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's other side is closed and drained
                break
            if not chunk:
                break
            terminal += chunk
    finally:
        if follower >= 0:
            os.close(follower)
        os.close(leader)
    assert process.returncode == 0, terminal
    assert [row["outcome"] for row in json.loads(process.stdout)["rows"]] == ["Retired"] * 3
    assert f"Retiring as alice-{SUFFIX}".encode() in terminal


def test_version_usage_outputs_timeout_and_completion_as_kubectl_users_meet_them(
    installed: Cluster, tmp_path: pathlib.Path
) -> None:
    version = kubectl_coroner(installed, "version", kubeconfig=installed.kubeconfig)
    assert version.returncode == 0, version.stderr
    lines = version.stdout.splitlines()
    assert lines[0].startswith("Client Version: ") and lines[1].startswith("Server Version: v1.")
    assert lines[2] == f"Coroner API: served: {api.API_VERSION}"
    document = as_json(kubectl_coroner(installed, "version", "-o", "json", kubeconfig=installed.kubeconfig))
    assert document["servedApiVersions"] == [api.VERSION] and document["serverVersion"]["major"] == "1"

    usage = kubectl_coroner(installed, "plan", "--bogus", kubeconfig=installed.kubeconfig)
    assert usage.returncode == 2 and usage.stderr.startswith("Usage: kubectl coroner plan [OPTIONS]")

    wide = kubectl_coroner(installed, "doctor", "-o", "wide", kubeconfig=installed.kubeconfig)
    assert wide.returncode in (0, 1) and "OBJECTS" in wide.stdout
    named = kubectl_coroner(installed, "doctor", "-o", "name", kubeconfig=installed.kubeconfig)
    assert named.returncode in (0, 1) and "CHECK" not in named.stdout

    # An API server that accepts the connection and never answers: the request timeout, in words.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        port = silent.getsockname()[1]
        mute = write_kubeconfig(
            tmp_path / "mute.kubeconfig",
            server=f"https://127.0.0.1:{port}",
            ca=installed.pki.ca_cert,
            user="x",
            token="x",
        )
        waited = kubectl_coroner(installed, "plan", "-n", "default", "--request-timeout", "1s", kubeconfig=mute)
    finally:
        silent.close()
    assert waited.returncode == 2
    assert "did not answer within --request-timeout 1s" in one_clear_sentence(waited)

    # `kubectl coroner <TAB>`: kubectl's own completion asks kubectl_complete-coroner on PATH.
    path = [str(BIN)]
    if not (BIN / "kubectl_complete-coroner").exists():  # installed by `pip install -e .`; an older install lacks it
        shim = tmp_path / "bin" / "kubectl_complete-coroner"
        shim.parent.mkdir()
        shim.write_text(
            f"#!{sys.executable}\nfrom coroner.cli.commands.completion import kubectl_complete\nkubectl_complete()\n"
        )
        shim.chmod(0o755)
        path.insert(0, str(shim.parent))
    env = {"PATH": os.pathsep.join([*path, os.environ.get("PATH", "")]), "HOME": str(tmp_path)}
    kubectl = str(installed.binary("kubectl"))
    commands = subprocess.run(
        [kubectl, "__complete", "coroner", "pl"], capture_output=True, text=True, env=env, check=False
    )
    assert commands.stdout.splitlines()[0].split("\t")[0] == "plan", commands
    outputs = subprocess.run(
        [kubectl, "__complete", "coroner", "apply", "-o", ""], capture_output=True, text=True, env=env, check=False
    )
    assert [line for line in outputs.stdout.splitlines() if not line.startswith(":")] == [
        "table",
        "wide",
        "json",
        "yaml",
        "name",
    ]
