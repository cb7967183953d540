"""The API server enforces the evidence of a retirement, not only the `retire` verb:
holding the verb alone retires nothing without the evidence the policy asks for.

Every identity that holds `retire` (the cluster admin, a person bound to coroner-retirer, the
operator with the production overlay) tries to retire registrations that have no evidence of
death, writing exactly the compare-and-swap patch the operator and `kubectl coroner apply` write
(coroner.core.wire.status_ops): each is refused by policy coroner-retire-requires-evidence with a
message that names the missing evidence. The attestations are written by the agent's identity with
a Pod-bound ServiceAccount token, as a DaemonSet pod gets it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.client.kube import api_client
from coroner.core import api, wire
from coroner_dev.devcluster.cluster import Cluster
from coroner_dev.devcluster.identities import mint_token, user_kubeconfig
from integration.test_kubectl_plugin import apply_args, as_json, kubectl_coroner, reasons
from support import components, kube, pods

pytestmark = pytest.mark.integration

OPERATOR = f"system:serviceaccount:{api.SYSTEM_NAMESPACE}:coroner-operator"
NODE = "node-evidence"
#: The group whose members count as people (who may state node evidence), as roles.yaml binds it.
PEOPLE = "coroner:people"


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Cluster:
    components.install(cluster, grant=True)
    manifest = kube.kubectl(
        cluster, "create", "clusterrolebinding", "alice-retirer", "--clusterrole=coroner-retirer", "--user=alice",
        "--dry-run=client", "-o", "yaml",
    ).stdout  # fmt: skip
    kube.kubectl(cluster, "apply", "-f", "-", stdin=manifest)
    return cluster


@pytest.fixture(scope="module")
def retirers(installed: Cluster) -> Iterator[dict[str, tuple[str, k8s.ApiClient]]]:
    """Every identity that holds `retire`: name -> (username, client)."""
    with (
        api_client(installed.kubeconfig) as admin,
        api_client(user_kubeconfig(installed, user="alice", groups=(PEOPLE,))) as alice,
        api_client(components.operator_kubeconfig(installed)) as operator,
    ):
        yield {"admin": ("admin", admin), "human": ("alice", alice), "operator": (OPERATOR, operator)}


@pytest.fixture(scope="module")
def agent(installed: Cluster) -> Iterator[k8s.ApiClient]:
    """The agent of NODE, with the token its DaemonSet pod would get (bound to the Pod on NODE)."""
    pod = f"coroner-agent-{NODE}"
    config = pods.pod_token(
        installed, namespace=api.SYSTEM_NAMESPACE, service_account="coroner-agent", pod=pod, node=NODE
    )
    try:
        with api_client(config) as client:
            yield client
    finally:
        with api_client(installed.kubeconfig) as admin:
            pods.delete_pod(admin, namespace=api.SYSTEM_NAMESPACE, pod=pod)


def register(admin: k8s.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return kube.create_registration(admin, namespace, kube.registration_body(name=name, node=NODE, interval=None))


def attest(agent: k8s.ApiClient, namespace: str, name: str, **fields: Any) -> dict[str, Any]:
    body = kube.get_registration(agent, namespace, name)
    attestation = components.attestation(body, verdict=fields.pop("verdict", "Dead"), evidence=fields.pop("evidence"))
    for key, value in fields.items():
        attestation["incarnation"] = {**attestation["incarnation"], key: value}
    return kube.patch_status(agent, namespace, name, {"status": {"attestation": attestation}})


def retirement_ops(
    body: dict[str, Any], *, retired_by: str, reason: str, attestation: object = "copy", statement: str | None = None
) -> list[dict[str, Any]]:
    """The retirement as the operator and `apply` write it (coroner.core.wire), claiming `reason`
    (and, as `apply` does for a person's node evidence, `statement`)."""
    status = body.get("status") or {}
    relied_on = status.get("attestation") if attestation == "copy" else attestation
    record = {
        "retiredTime": components.now_text(),
        "retiredBy": retired_by,
        "reason": reason,
        "decision": "EligibleStaleOrphan",
        **({} if relied_on is None else {"attestation": relied_on}),
        **({} if statement is None else {"statement": statement}),
    }
    retired = {
        "type": "Retired",
        "status": "True",
        "reason": reason,
        "message": "retired by a test",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != "Retired"] + [retired]
    return wire.status_ops(
        body=body, resource_version=body["metadata"]["resourceVersion"], conditions=conditions, retirement=record
    )


def refusal(client: k8s.ApiClient, namespace: str, name: str, ops: list[dict[str, Any]]) -> str:
    with pytest.raises(ApiException) as raised:
        kube.patch_status(client, namespace, name, ops)
    assert raised.value.status in (403, 422), raised.value
    return str(kube.api_error_body(raised.value)["message"])


#: case -> (how the agent attested, or None for nothing; what the refusal says is missing)
CASES: dict[str, tuple[dict[str, Any] | None, str]] = {
    "live": ({"verdict": "Alive", "evidence": "PidfdPinned"}, "attested Alive (PidfdPinned)"),
    "unattested": (None, "it has no status.attestation"),
    "reused": ({"verdict": "Reused", "evidence": "StartTimeDiffers"}, "attested Reused (StartTimeDiffers)"),
    "mismatched": ({"evidence": "PidfdExited", "pid": 4243}, "the attestation is about another incarnation"),
}


@pytest.mark.parametrize("who", ["admin", "human", "operator"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_no_retire_holder_retires_without_the_evidence(
    retirers: dict[str, tuple[str, k8s.ApiClient]],
    agent: k8s.ApiClient,
    admin: k8s.ApiClient,
    namespace: str,
    who: str,
    case: str,
) -> None:
    attested, missing = CASES[case]
    register(admin, namespace, "w")
    if attested is not None:
        attest(agent, namespace, "w", **attested)
    username, client = retirers[who]
    body = kube.get_registration(admin, namespace, "w")
    message = refusal(client, namespace, "w", retirement_ops(body, retired_by=username, reason="PidfdExited"))
    assert "needs the evidence" in message and missing in message, message
    assert "retirement" not in kube.get_registration(admin, namespace, "w").get("status", {})


@pytest.mark.parametrize("who", ["admin", "human", "operator"])
def test_a_dead_attestation_of_exactly_this_incarnation_is_the_evidence(
    retirers: dict[str, tuple[str, k8s.ApiClient]],
    agent: k8s.ApiClient,
    admin: k8s.ApiClient,
    namespace: str,
    who: str,
) -> None:
    register(admin, namespace, "w")
    attest(agent, namespace, "w", evidence="PidfdExited")
    username, client = retirers[who]
    body = kube.get_registration(admin, namespace, "w")
    # Each part of the record must agree with the evidence: the path, who, and the copy relied on.
    wrong_path = refusal(client, namespace, "w", retirement_ops(body, retired_by=username, reason="ProcAbsent"))
    assert "status.retirement.reason must equal status.attestation.evidence" in wrong_path
    someone_else = refusal(client, namespace, "w", retirement_ops(body, retired_by="someone", reason="PidfdExited"))
    assert f'retiredBy must be the requester, "{username}"' in someone_else
    forged_copy = {**body["status"]["attestation"], "evidence": "ProcAbsent"}
    copy = refusal(
        client, namespace, "w", retirement_ops(body, retired_by=username, reason="PidfdExited", attestation=forged_copy)
    )
    assert "must be a verbatim copy" in copy
    no_reason = refusal(client, namespace, "w", retirement_ops(body, retired_by=username, reason="Unknown"))
    assert "needs death evidence" in no_reason
    kube.patch_status(client, namespace, "w", retirement_ops(body, retired_by=username, reason="PidfdExited"))
    retirement = kube.get_registration(admin, namespace, "w")["status"]["retirement"]
    assert retirement["retiredBy"] == username and retirement["attestation"] == body["status"]["attestation"]


@pytest.mark.parametrize("evidence", ["PidNamespaceRecreated", "ProcAbsent"])
def test_a_death_read_from_proc_is_evidence_from_the_nodes_agent_only(
    retirers: dict[str, tuple[str, k8s.ApiClient]],
    agent: k8s.ApiClient,
    admin: k8s.ApiClient,
    namespace: str,
    evidence: str,
) -> None:
    register(admin, namespace, "w")
    username, operator = retirers["operator"]
    # Nobody but the agent of spec.nodeName writes the attestation (policies 3 and 4), so nobody
    # else can state this evidence.
    body = kube.get_registration(admin, namespace, "w")
    forged = components.attestation(body, verdict="Dead", evidence=evidence)
    with pytest.raises(ApiException) as raised:
        kube.patch_status(operator, namespace, "w", {"status": {"attestation": forged}})
    assert raised.value.status in (403, 422), raised.value
    attest(agent, namespace, "w", evidence=evidence)
    body = kube.get_registration(admin, namespace, "w")
    kube.patch_status(operator, namespace, "w", retirement_ops(body, retired_by=username, reason=evidence))
    assert kube.get_registration(admin, namespace, "w")["status"]["retirement"]["reason"] == evidence


def test_a_retired_condition_alone_is_not_a_retirement(
    retirers: dict[str, tuple[str, k8s.ApiClient]], agent: k8s.ApiClient, admin: k8s.ApiClient, namespace: str
) -> None:
    register(admin, namespace, "w")
    attest(agent, namespace, "w", evidence="PidfdExited")
    body = kube.get_registration(admin, namespace, "w")
    for username, client in retirers.values():
        ops = [
            op
            for op in retirement_ops(body, retired_by=username, reason="PidfdExited")
            if op["path"] != "/status/retirement"
        ]
        message = refusal(client, namespace, "w", ops)
        # The evidence policy refuses it for every retirer. Anyone but the operator may also change the
        # Retired condition only in the write that retires (coroner-status-fields-by-identity); the API
        # server names one of the policies that refused, whichever it evaluated first.
        reasons = ["needs status.retirement"]
        if username != OPERATOR:
            reasons.append("may not change the Retired condition")
        assert any(reason in message for reason in reasons), message


@pytest.mark.parametrize("evidence", ["NodeDeleted", "NodeOutOfService"])
def test_node_evidence_from_the_operator_needs_the_node_loss_component(
    installed: Cluster,
    retirers: dict[str, tuple[str, k8s.ApiClient]],
    admin: k8s.ApiClient,
    namespace: str,
    evidence: str,
) -> None:
    name = f"w-{uuid.uuid4().hex[:6]}"
    register(admin, namespace, name)
    _, operator = retirers["operator"]
    body = kube.get_registration(admin, namespace, name)
    ops = retirement_ops(body, retired_by=OPERATOR, reason=evidence)
    # The API server swaps a changed policy in a moment after it is applied: a previous case that
    # installed and then removed the component may still be admitted by the old policy for a while.
    kube.wait_for(
        lambda: _refused_in_a_dry_run(operator, namespace, name, ops), what="the policy without the component"
    )
    message = refusal(operator, namespace, name, ops)
    assert f"with node evidence {evidence} needs the node-loss component" in message
    components.install(installed, grant=True, node_loss=True)
    try:
        kube.wait_for(
            lambda: _admitted(operator, admin, namespace, name, evidence), what=f"{evidence} with the component"
        )
    finally:
        components.install(installed, grant=True)
    assert kube.get_registration(admin, namespace, name)["status"]["retirement"]["reason"] == evidence


def _refused_in_a_dry_run(client: k8s.ApiClient, namespace: str, name: str, ops: list[dict[str, Any]]) -> bool:
    try:
        k8s.CustomObjectsApi(client).patch_namespaced_custom_object_status(
            api.GROUP, api.VERSION, namespace, api.PLURAL, name, ops, dry_run="All", _content_type=wire.JSON_PATCH
        )
    except ApiException as exc:
        if exc.status in (403, 422):
            return True
        raise
    return False


def _admitted(operator: k8s.ApiClient, admin: k8s.ApiClient, namespace: str, name: str, evidence: str) -> bool:
    body = kube.get_registration(admin, namespace, name)
    try:
        kube.patch_status(operator, namespace, name, retirement_ops(body, retired_by=OPERATOR, reason=evidence))
    except ApiException as exc:
        if exc.status in (403, 422):
            return False
        raise
    return True


def test_node_evidence_from_a_person_is_recorded_as_theirs_and_no_other_identity_may_state_it(
    installed: Cluster, retirers: dict[str, tuple[str, k8s.ApiClient]], admin: k8s.ApiClient, namespace: str
) -> None:
    register(admin, namespace, "by-person")
    register(admin, namespace, "by-worker")
    _, alice = retirers["human"]
    body = kube.get_registration(admin, namespace, "by-person")
    ops = retirement_ops(body, retired_by="alice", reason="NodeDeleted", statement="Human")
    kube.patch_status(alice, namespace, "by-person", ops)
    retirement = kube.get_registration(admin, namespace, "by-person")["status"]["retirement"]
    assert (retirement["retiredBy"], retirement["statement"]) == ("alice", "Human")
    # A workload identity that somehow holds retire is neither the operator nor a person.
    kube.kubectl(installed, "create", "rolebinding", "bot-retirer", "--clusterrole=coroner-retirer",
                 f"--serviceaccount={namespace}:bot", "-n", namespace)  # fmt: skip
    bot_name = f"system:serviceaccount:{namespace}:bot"
    with api_client(mint_token(installed, service_account=f"{namespace}/bot")) as bot:
        body = kube.get_registration(admin, namespace, "by-worker")
        ops = retirement_ops(body, retired_by=bot_name, reason="NodeDeleted", statement="Human")
        message = kube.wait_for(lambda: _refused_for_identity(bot, namespace, ops), what="the bot's RBAC")
    assert (
        f"needs a person (group {PEOPLE}) holding the retire verb (kubectl coroner apply); {bot_name} is not one"
        in message
    )


def test_a_username_outside_system_is_not_a_person_unless_its_group_says_so(
    installed: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    """A robot with an x509 certificate (or an OIDC or cloud IAM identity) holding `retire` has a
    username outside system:, and was taken for a person: who counts as one is the group coroner:people."""
    kube.kubectl(installed, "create", "rolebinding", "robot-retirer", "--clusterrole=coroner-retirer",
                 "--user=ci-robot", "-n", namespace)  # fmt: skip
    register(admin, namespace, "by-worker")
    with api_client(user_kubeconfig(installed, user="ci-robot")) as robot:
        body = kube.get_registration(admin, namespace, "by-worker")
        ops = retirement_ops(body, retired_by="ci-robot", reason="NodeDeleted", statement="Human")
        message = kube.wait_for(lambda: _refused_for_identity(robot, namespace, ops), what="the robot's RBAC")
    assert f"needs a person (group {PEOPLE}) holding the retire verb (kubectl coroner apply); ci-robot is not one" in (
        message
    ), message
    assert "retirement" not in kube.get_registration(admin, namespace, "by-worker").get("status", {})


def _refused_for_identity(client: k8s.ApiClient, namespace: str, ops: list[dict[str, Any]]) -> str | None:
    try:
        kube.patch_status(client, namespace, "by-worker", ops)
    except ApiException as exc:
        message = str(kube.api_error_body(exc).get("message"))
        return message if "node evidence" in message else None
    raise AssertionError("a ServiceAccount retired with node evidence")


@pytest.mark.parametrize("evidence", ["NodeDeleted", "NodeOutOfService"])
def test_a_persons_node_evidence_is_admitted_only_as_a_statement_recorded_as_human(
    retirers: dict[str, tuple[str, k8s.ApiClient]], admin: k8s.ApiClient, namespace: str, evidence: str
) -> None:
    register(admin, namespace, "w")
    _, alice = retirers["human"]
    body = kube.get_registration(admin, namespace, "w")
    unstated = refusal(alice, namespace, "w", retirement_ops(body, retired_by="alice", reason=evidence))
    assert f'with node evidence {evidence} as alice needs status.retirement.statement "Human"' in unstated
    other = refusal(alice, namespace, "w", retirement_ops(body, retired_by="alice", reason=evidence, statement="Mine"))
    assert "statement" in other  # the CRD's enum, or the policy: only Human is a statement
    kube.patch_status(
        alice, namespace, "w", retirement_ops(body, retired_by="alice", reason=evidence, statement="Human")
    )
    retirement = kube.get_registration(admin, namespace, "w")["status"]["retirement"]
    assert (retirement["reason"], retirement["statement"], retirement["retiredBy"]) == (evidence, "Human", "alice")


@pytest.mark.parametrize("who", ["admin", "human", "operator"])
def test_no_retirement_on_an_agents_evidence_claims_to_be_a_human_statement(
    retirers: dict[str, tuple[str, k8s.ApiClient]],
    agent: k8s.ApiClient,
    admin: k8s.ApiClient,
    namespace: str,
    who: str,
) -> None:
    register(admin, namespace, "w")
    attest(agent, namespace, "w", evidence="PidfdExited")
    username, client = retirers[who]
    body = kube.get_registration(admin, namespace, "w")
    ops = retirement_ops(body, retired_by=username, reason="PidfdExited", statement="Human")
    message = refusal(client, namespace, "w", ops)
    expected = f'status.retirement.statement "Human" records a person stating node evidence; {username} retiring'
    assert expected in message, message


@pytest.mark.parametrize("evidence", ["NodeDeleted", "NodeOutOfService"])
def test_the_operators_node_evidence_is_never_a_human_statement(
    installed: Cluster,
    retirers: dict[str, tuple[str, k8s.ApiClient]],
    admin: k8s.ApiClient,
    namespace: str,
    evidence: str,
) -> None:
    """Even with components/node-loss, where the operator may retire on node evidence at all."""
    register(admin, namespace, "w")
    _, operator = retirers["operator"]
    components.install(installed, grant=True, node_loss=True)
    try:
        kube.wait_for(lambda: _admits_node_evidence_from_the_operator(operator, admin, namespace, evidence),
                      what="the node-loss opt-in in force")  # fmt: skip
        body = kube.get_registration(admin, namespace, "w")
        ops = retirement_ops(body, retired_by=OPERATOR, reason=evidence, statement="Human")
        message = refusal(operator, namespace, "w", ops)
    finally:
        components.install(installed, grant=True)
    assert f"records a person stating node evidence; {OPERATOR} retiring with {evidence} may not write it" in message


def _admits_node_evidence_from_the_operator(
    operator: k8s.ApiClient, admin: k8s.ApiClient, namespace: str, evidence: str
) -> bool:
    """A throwaway registration the operator retires on `evidence`: admitted once the opt-in is in force."""
    name = f"probe-{uuid.uuid4().hex[:6]}"
    register(admin, namespace, name)
    return _admitted(operator, admin, namespace, name, evidence)


def test_kubectl_coroner_apply_records_a_persons_node_evidence_as_a_human_statement(
    installed: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    """The real plugin, as the cluster admin (a person): a Node that is gone, stated so with
    --node-quarantine-seconds=0, is retired on NodeDeleted with statement Human (admitted only so)."""
    gone = f"gone-{uuid.uuid4().hex[:6]}"  # never registered as a Node: a live GET finds it NotFound
    kube.create_registration(admin, namespace, kube.registration_body(name="w", node=gone, interval=None))
    statement = ("--node-deletion-evidence", "--node-quarantine-seconds=0")
    planned = kubectl_coroner(
        installed, "plan", "-n", namespace, "-o", "json", *statement, kubeconfig=installed.kubeconfig
    )
    assert planned.returncode == 0, planned.stderr
    document = as_json(planned)
    assert reasons(document) == {"w": "EligibleStaleOrphan"}
    args = [*apply_args(document, namespace, "w"), "--yes", "-o", "json", *statement]
    applied = kubectl_coroner(installed, *args, kubeconfig=installed.kubeconfig)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert [row["outcome"] for row in as_json(applied)["rows"]] == ["Retired"]
    retirement = kube.get_registration(admin, namespace, "w")["status"]["retirement"]
    assert (retirement["reason"], retirement["statement"], retirement["retiredBy"]) == ("NodeDeleted", "Human", "admin")


@pytest.mark.parametrize(("registered_host", "admitted"), [(NODE, True), ("another-machine-id", False)])
def test_the_agents_own_host_id_must_match_unless_the_worker_registered_its_nodes_name(
    retirers: dict[str, tuple[str, k8s.ApiClient]],
    agent: k8s.ApiClient,
    admin: k8s.ApiClient,
    namespace: str,
    registered_host: str,
    admitted: bool,
) -> None:
    """A worker in a container cannot read the host's /etc/machine-id and registers its node's name;
    the agent attests with the machine id it mounts. That pair is admitted (bound by the boot id and
    the node's agent); any other host id must equal the agent's."""
    body = kube.registration_body(name="w", node=NODE, interval=None, host_id=registered_host)
    kube.create_registration(admin, namespace, body)
    registered = kube.get_registration(agent, namespace, "w")
    attestation = {**components.attestation(registered), "hostId": "the-agents-machine-id"}
    kube.patch_status(agent, namespace, "w", {"status": {"attestation": attestation}})
    username, client = retirers["operator"]
    body = kube.get_registration(admin, namespace, "w")
    ops = retirement_ops(body, retired_by=username, reason="PidfdExited")
    if admitted:
        kube.patch_status(client, namespace, "w", ops)
        assert kube.get_registration(admin, namespace, "w")["status"]["retirement"]["reason"] == "PidfdExited"
    else:
        assert "another incarnation" in refusal(client, namespace, "w", ops)
