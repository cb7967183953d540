"""Doctor's checks of what the admission policies cannot see: who RBAC lets act as the agents or a worker's
Pod (`access`, resolved by `rbac`), mutating admission on registrations (`mutation`), and the agent's
seccomp profile (`seccomp`)."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from coroner.cli import doctor
from coroner.cli.doctor import access, mutation, rbac, seccomp
from coroner.cli.plan import Unreadable
from coroner.core import api
from coroner.core.world import World

pytestmark = pytest.mark.unit

REPO = pathlib.Path(__file__).resolve().parents[2]
SYSTEM = api.SYSTEM_NAMESPACE
BOOTSTRAP = {"kubernetes.io/bootstrapping": "rbac-defaults"}


def role(name: str, rules: list[dict[str, Any]], *, namespace: str | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, **({"namespace": namespace} if namespace else {})}
    meta.update(extra.pop("meta", {}))
    return {"metadata": meta, "rules": rules, **extra}


def binding(
    name: str, role_name: str, subjects: list[dict[str, Any]], *, namespace: str | None = None, kind: str = "ClusterRole",
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {"name": name, **({"namespace": namespace} if namespace else {}), "labels": labels or {}}
    return {"metadata": meta, "roleRef": {"kind": kind, "name": role_name}, "subjects": subjects}


def user(name: str) -> dict[str, str]:
    return {"kind": "User", "name": name}


TOKENS = {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]}


def cluster(
    *, cluster_roles: Any = (), cluster_role_bindings: Any = (), roles: Any = (), role_bindings: Any = ()
) -> rbac.Rbac:
    return rbac.Rbac(
        cluster_roles=list(cluster_roles),
        cluster_role_bindings=list(cluster_role_bindings),
        roles=list(roles),
        role_bindings=list(role_bindings),
    )


class TestRuleMatching:
    @pytest.mark.parametrize(
        ("rule", "allowed"),
        [
            (TOKENS, True),
            ({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, True),
            ({"apiGroups": [""], "resources": ["*/token"], "verbs": ["create"]}, True),
            ({"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["create"]}, False),
            ({"apiGroups": ["apps"], "resources": ["*"], "verbs": ["*"]}, False),
            ({"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["get"]}, False),
            ({**TOKENS, "resourceNames": ["coroner-agent"]}, True),
        ],
    )
    def test_as_the_rbac_authorizer_matches(self, rule: dict[str, Any], allowed: bool) -> None:
        assert rbac.rule_allows(rule, access.TOKEN) is allowed

    def test_resource_names_never_match_a_create_without_a_name(self) -> None:
        rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"], "resourceNames": ["x"]}
        assert not rbac.rule_allows(rule, access.CREATE_PODS)
        assert rbac.rule_allows({**rule, "resourceNames": []}, access.CREATE_PODS)


class TestGrants:
    def test_an_aggregated_role_has_the_rules_of_the_roles_it_selects_even_before_the_controller_ran(self) -> None:
        edit = role(
            "edit", [], aggregationRule={"clusterRoleSelectors": [{"matchLabels": {"aggregate-to-edit": "true"}}]}
        )
        part = role("part", [TOKENS], meta={"labels": {"aggregate-to-edit": "true"}})
        found = rbac.grants(
            cluster(
                cluster_roles=[edit, part], role_bindings=[binding("b", "edit", [user("alice")], namespace=SYSTEM)]
            ),
            [access.TOKEN],
            namespace=SYSTEM,
        )
        assert [(g.subject, g.binding, g.role) for g in found] == [
            ("User/alice", f"RoleBinding/{SYSTEM}/b", "ClusterRole/edit")
        ]

    def test_a_rolebinding_grants_only_in_its_namespace_a_clusterrolebinding_everywhere(self) -> None:
        state = cluster(
            cluster_roles=[role("minter", [TOKENS])],
            roles=[role("local", [TOKENS], namespace="other")],
            role_bindings=[
                binding("elsewhere", "minter", [user("bob")], namespace="other"),
                binding("local", "local", [user("carol")], namespace="other", kind="Role"),
            ],
            cluster_role_bindings=[
                binding("all", "minter", [{"kind": "ServiceAccount", "name": "ci", "namespace": "tools"}])
            ],
        )
        assert {g.subject for g in rbac.grants(state, [access.TOKEN], namespace=SYSTEM)} == {"ServiceAccount/tools/ci"}
        assert {g.subject for g in rbac.grants(state, [access.TOKEN], namespace="other")} == {
            "ServiceAccount/tools/ci",
            "User/bob",
            "User/carol",
        }


class TestSystemNamespaceAccess:
    def test_admins_and_the_control_planes_own_bindings_are_not_named(self) -> None:
        state = cluster(
            cluster_roles=[role("cluster-admin", [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}])],
            cluster_role_bindings=[
                binding("cluster-admin", "cluster-admin", [{"kind": "Group", "name": "system:masters"}]),
                binding(
                    "system:controller:daemon-set-controller",
                    "cluster-admin",
                    [{"kind": "ServiceAccount", "name": "daemon-set-controller", "namespace": "kube-system"}],
                    labels=BOOTSTRAP,
                ),
            ],
        )
        check = access.check_system_namespace_access(rbac=state, system_namespace=SYSTEM)
        assert check.status == doctor.CheckStatus.PASS, check.summary
        assert "not resolved" in check.summary

    def test_a_person_with_edit_a_robot_and_a_subject_added_to_a_default_binding_are_named(self) -> None:
        state = cluster(
            cluster_roles=[role("edit", [TOKENS, {"apiGroups": [""], "resources": ["pods", "pods/exec"], "verbs": ["create"]}])],
            cluster_role_bindings=[
                binding("added", "edit", [user("mallory")], labels=BOOTSTRAP),
                binding("robot", "edit", [{"kind": "ServiceAccount", "name": "deployer", "namespace": "ci"}]),
            ],
            role_bindings=[binding("alice", "edit", [user("alice")], namespace=SYSTEM)],
        )  # fmt: skip
        check = access.check_system_namespace_access(rbac=state, system_namespace=SYSTEM)
        assert check.status == doctor.CheckStatus.WARN
        assert check.objects == ("ServiceAccount/ci/deployer", "User/alice", "User/mallory")
        assert check.kubectl_names() == ("serviceaccount/deployer",)
        (alice,) = [row for row in check.facts["subjects"] if row["subject"] == "User/alice"]
        assert alice["can"] == ["create pods", "create pods/exec", "create serviceaccounts/token"]
        assert alice["via"] == [f"RoleBinding/{SYSTEM}/alice (ClusterRole/edit)"]

    def test_unreadable_rbac_is_unknown(self) -> None:
        check = access.check_system_namespace_access(rbac=Unreadable(reason="forbidden"), system_namespace=SYSTEM)
        assert check.status == doctor.CheckStatus.UNKNOWN


def test_worker_namespace_access_names_who_can_mint_a_workers_token_per_namespace() -> None:
    state = cluster(
        cluster_roles=[role("edit", [TOKENS]), role("pods", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}])],
        role_bindings=[
            binding("editor", "edit", [user("dave")], namespace="team"),
            binding("creator", "pods", [user("erin")], namespace="team"),
            binding("elsewhere", "edit", [user("frank")], namespace="no-registrations"),
        ],
    )  # fmt: skip
    world = World(system_namespace=SYSTEM)
    empty = access.check_worker_namespace_access(rbac=state, world=world)
    assert empty.status == doctor.CheckStatus.PASS
    world.namespaces = lambda: ["team"]  # type: ignore[method-assign]
    check = access.check_worker_namespace_access(rbac=state, world=world)
    assert check.status == doctor.CheckStatus.WARN
    # A Pod created in the namespace has its own name and uid: no worker's registrant.
    assert check.objects == ("User/dave",)
    assert "namespace team" in check.summary


class TestAdmissionMutation:
    REGISTRATIONS = {"apiGroups": [api.GROUP], "apiVersions": ["*"], "operations": ["UPDATE"]}

    def policy(self, name: str, **constraints: Any) -> dict[str, Any]:
        return {"metadata": {"name": name}, "spec": {"matchConstraints": constraints}}

    @pytest.mark.parametrize(
        ("resources", "touched"),
        [
            (["workerregistrations/status"], ["workerregistrations/status UPDATE"]),
            (["*"], ["workerregistrations UPDATE"]),
            (["*/*"], ["workerregistrations UPDATE", "workerregistrations/status UPDATE"]),
            (["*/status"], ["workerregistrations/status UPDATE"]),
            (["workerregistrations/*"], ["workerregistrations/status UPDATE"]),
            (["pods"], []),
        ],
    )
    def test_rules_match_as_the_api_server_matches_them(self, resources: list[str], touched: list[str]) -> None:
        rule = {**self.REGISTRATIONS, "resources": resources}
        check = mutation.check_admission_mutation(webhooks=[], policies=[self.policy("p", resourceRules=[rule])])
        assert check.facts["mutators"].get("MutatingAdmissionPolicy/p", []) == touched

    def test_the_registrar_injection_and_excluded_registrations_pass(self) -> None:
        pods = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
        everything = {"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["*"], "resources": ["*/*"]}
        policies = [
            self.policy("coroner-registrar-injection", resourceRules=[pods]),
            self.policy("all-but-registrations", resourceRules=[everything], excludeResourceRules=[everything]),
        ]
        check = mutation.check_admission_mutation(webhooks=[], policies=policies)
        assert check.status == doctor.CheckStatus.PASS, check.summary

    def test_a_webhook_and_a_policy_are_named_and_fail(self) -> None:
        hook = {
            "metadata": {"name": "sidecars"},
            "webhooks": [{"name": "all.example.com", "rules": [{**self.REGISTRATIONS, "resources": ["*/*"]}]}],
        }
        check = mutation.check_admission_mutation(
            webhooks=[hook], policies=[self.policy("p", resourceRules=[{**self.REGISTRATIONS, "resources": ["*/*"]}])]
        )
        assert check.status == doctor.CheckStatus.FAIL
        assert check.objects == ("MutatingAdmissionPolicy/p", "MutatingWebhookConfiguration/sidecars")
        assert check.kubectl_names() == (
            "mutatingadmissionpolicy.admissionregistration.k8s.io/p",
            "mutatingwebhookconfiguration.admissionregistration.k8s.io/sidecars",
        )
        assert "all.example.com" in check.summary

    def test_unreadable_is_unknown(self) -> None:
        check = mutation.check_admission_mutation(webhooks=Unreadable(reason="forbidden"), policies=[])
        assert check.status == doctor.CheckStatus.UNKNOWN


class TestAgentSeccomp:
    SHIPPED = (REPO / "manifests" / "base" / "agent-seccomp.json").read_text()

    def test_the_shipped_digest_is_the_manifests_profile(self) -> None:
        # Fails after any change of agent-seccomp.json until SHIPPED_PROFILE_SHA256 is set to this.
        assert seccomp.profile_digest(self.SHIPPED) == seccomp.SHIPPED_PROFILE_SHA256

    def state(self, profile: str | None) -> dict[str, Any]:
        daemonset = {
            "metadata": {"name": "team-a-coroner-agent"},
            "spec": {"template": {"spec": {"volumes": [{"name": "p", "configMap": {"name": "seccomp-x"}}]}}},
        }
        configmaps = (
            [] if profile is None else [{"metadata": {"name": "seccomp-x"}, "data": {"agent-seccomp.json": profile}}]
        )
        return {"daemonsets": [daemonset], "configmaps": configmaps, "system_namespace": SYSTEM}

    def test_the_shipped_profile_passes_however_it_is_formatted(self) -> None:
        reformatted = json.dumps(json.loads(self.SHIPPED), indent=7)
        assert seccomp.check_agent_seccomp(**self.state(reformatted)).status == doctor.CheckStatus.PASS

    @pytest.mark.parametrize("profile", ['{"defaultAction": "SCMP_ACT_ALLOW"}', "not json", None])
    def test_a_rewritten_or_missing_profile_fails_by_name(self, profile: str | None) -> None:
        check = seccomp.check_agent_seccomp(**self.state(profile))
        assert check.status == doctor.CheckStatus.FAIL
        assert check.objects == (f"ConfigMap/{SYSTEM}/seccomp-x",)
        assert check.kubectl_names() == ("configmap/seccomp-x",)


def test_node_taint_access_names_who_can_patch_nodes_while_the_taint_counts() -> None:
    state = cluster(
        cluster_roles=[role("patcher", [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}])],
        cluster_role_bindings=[
            binding("cni", "patcher", [{"kind": "ServiceAccount", "name": "cni", "namespace": "kube-system"}]),
            binding(
                "system:controller:node-controller",
                "patcher",
                [{"kind": "ServiceAccount", "name": "node-controller", "namespace": "kube-system"}],
                labels=BOOTSTRAP,
            ),
        ],
        # A RoleBinding grants nothing on a cluster-scoped resource.
        role_bindings=[binding("local", "patcher", [user("gina")], namespace="team")],
    )
    check = access.check_node_taint_access(rbac=state, out_of_service_evidence=True)
    assert check.status == doctor.CheckStatus.WARN
    assert check.objects == ("ServiceAccount/kube-system/cni",)
    assert "out-of-service" in check.summary
    off = access.check_node_taint_access(rbac=state, out_of_service_evidence=False)
    assert off.status == doctor.CheckStatus.PASS
