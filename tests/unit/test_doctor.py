"""Node loss in `kubectl coroner doctor`, and the policy plan/apply/doctor decide with.

After an abrupt node loss (workers and agent killed, Node deleted) no agent will ever attest the
node's registrations again: doctor must FAIL (node-loss and agents) naming the node, since when,
and what would release them — never PASS with "every Ready node (0) has a live agent". The policy
is the operator's published one; flags override it with a warning; an unreadable one falls back to
the defaults with a warning.
"""

from __future__ import annotations

import copy
import datetime
import json
import re
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from coroner.cli import doctor, plan, render
from coroner.cli.commands.doctor import doctor_command
from coroner.cli.doctor.registrations import HELD_FIXES
from coroner.cli.kubectl import main
from coroner.core import admission_digest as ad
from coroner.core import api, fingerprint, held, policy_json
from coroner.core.decision import Policy
from coroner.core.model import format_time
from coroner.core.policy_json import PolicyUnreadable
from coroner.core.reasons import Reason
from coroner_operator.kubeapi import ADMISSION_RESOURCES
from unit.builders import BOOT, DELETE, NAMESPACE, NODE, NODE_UID, NOW, OTHER_BOOT, REGISTRANT, SQUATTER
from unit.test_admission_digest import REPO, SHIPPED
from unit.test_plan import S, agent_lease, listing, node, worker

pytestmark = pytest.mark.unit

SYSTEM = api.SYSTEM_NAMESPACE
LEASE = f"{SYSTEM}/{api.OPERATOR_LEASE}"
NODE_LOSS = Policy(node_deletion_evidence=True, node_deletion_quarantine_seconds=300)
DEFAULTS = Policy()


def choice(published: Policy | PolicyUnreadable = DEFAULTS, **flags: object) -> plan.PolicyChoice:
    return plan.choose_policy(published=published, flags=flags, system_namespace=SYSTEM)


def operator_lease(annotation: object = None) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": api.OPERATOR_LEASE, "namespace": SYSTEM}, "spec": {}}
    if annotation is not None:
        body["metadata"]["annotations"] = {api.POLICY_ANNOTATION: annotation}
    return body


# --- the published policy ------------------------------------------------------------------------


class TestPublishedPolicy:
    @pytest.mark.parametrize(
        ("lease", "expected"),
        [
            pytest.param(operator_lease(policy_json.dump_policy(NODE_LOSS)), NODE_LOSS, id="published"),
            pytest.param(operator_lease(policy_json.dump_policy(Policy())), Policy(), id="published-defaults"),
            pytest.param(None, "does not exist", id="no-lease"),
            pytest.param(plan.Unreadable(reason="403 forbidden"), "could not be read: 403 forbidden", id="forbidden"),
            pytest.param(operator_lease(), "has no coroner.dev/policy annotation", id="no-annotation"),
            pytest.param(operator_lease("{garbage"), "is unreadable: it is not JSON", id="garbage"),
            pytest.param(operator_lease("{}"), "is unreadable: it lacks field(s)", id="empty-object"),
            pytest.param({"metadata": {"annotations": "x"}}, "has no coroner.dev/policy", id="annotations-garbled"),
        ],
    )
    def test_read_from_the_operator_lease(self, lease: Any, expected: Policy | str) -> None:
        found = plan.published_policy(lease, system_namespace=SYSTEM)
        if isinstance(expected, Policy):
            assert found == expected
        else:
            assert isinstance(found, PolicyUnreadable) and expected in found.reason
            assert f"Lease {LEASE}" in found.reason

    def test_plan_and_apply_find_the_operator_lease_among_the_listed_leases(self) -> None:
        ours = operator_lease(policy_json.dump_policy(NODE_LOSS))
        elsewhere = {"metadata": {"name": api.OPERATOR_LEASE, "namespace": "jobs"}}
        found = plan.operator_lease_of([agent_lease(), elsewhere, ours], system_namespace=SYSTEM)
        assert found is ours
        assert plan.operator_lease_of([agent_lease(), elsewhere], system_namespace=SYSTEM) is None


class TestChoosePolicy:
    @pytest.mark.parametrize(
        ("published", "flags", "policy", "source", "warned"),
        [
            pytest.param(NODE_LOSS, {}, NODE_LOSS, "operator", [], id="operator-no-flags"),
            pytest.param(Policy(), {}, Policy(), "operator", [], id="operator-defaults-no-flags"),
            pytest.param(
                NODE_LOSS,
                {"node_deletion_evidence": True, "node_deletion_quarantine_seconds": 300.0},
                NODE_LOSS,
                "operator",
                [],
                id="flags-equal-to-the-operator",
            ),
            pytest.param(
                NODE_LOSS,
                {"node_deletion_evidence": False},
                Policy(node_deletion_evidence=False, node_deletion_quarantine_seconds=300),
                "operator+flags",
                ["--no-node-deletion-evidence differs from the operator's published nodeDeletionEvidence=true"],
                id="flag-differs-bool",
            ),
            pytest.param(
                NODE_LOSS,
                {"node_deletion_quarantine_seconds": 40.0},
                Policy(node_deletion_evidence=True, node_deletion_quarantine_seconds=40),
                "operator+flags",
                [
                    "--node-quarantine-seconds=40 differs from the operator's published nodeDeletionQuarantineSeconds=300"
                ],
                id="flag-differs-number",
            ),
            pytest.param(
                Policy(),
                {"node_deletion_evidence": True, "node_deletion_quarantine_seconds": 10.0},
                Policy(node_deletion_evidence=True, node_deletion_quarantine_seconds=10),
                "operator+flags",
                ["--node-deletion-evidence differs", "--node-quarantine-seconds=10 differs"],
                id="both-flags-differ",
            ),
            pytest.param(
                PolicyUnreadable(reason="Lease x does not exist"),
                {},
                Policy(),
                "defaults",
                ["could not be read (Lease x does not exist); deciding with the built-in defaults, which may not"],
                id="unreadable-defaults",
            ),
            pytest.param(
                PolicyUnreadable(reason="garbage"),
                {"node_deletion_evidence": True},
                Policy(node_deletion_evidence=True),
                "defaults+flags",
                ["could not be read (garbage); deciding with the built-in defaults and --node-deletion-evidence"],
                id="unreadable-with-flags",
            ),
        ],
    )
    def test_the_operator_policy_is_used_and_every_difference_is_a_warning(
        self,
        published: Policy | PolicyUnreadable,
        flags: dict[str, object],
        policy: Policy,
        source: str,
        warned: list[str],
    ) -> None:
        chosen = choice(published, **flags)
        assert chosen.policy == policy
        assert chosen.source == source
        assert len(chosen.warnings) == len(warned)
        for warning, expected in zip(chosen.warnings, warned, strict=True):
            assert expected in warning
            assert "\n" not in warning
        document = chosen.document()
        assert document["source"] == source and document["lease"] == LEASE
        assert document["values"] == policy_json.policy_document(policy)
        assert (document["published"] is None) == isinstance(published, PolicyUnreadable)
        assert json.loads(json.dumps(document)) == document

    def test_the_header_says_which_policy_and_what_differs_from_the_defaults(self) -> None:
        header = choice(NODE_LOSS).describe()
        assert header.startswith(f"Policy: the operator's, published on Lease {LEASE}")
        assert "nodeDeletionEvidence=true, nodeDeletionQuarantineSeconds=300" in header
        assert "every field at its default" in choice(Policy()).describe()
        fallback = choice(PolicyUnreadable(reason="no Lease")).describe()
        assert "the built-in defaults (the operator's could not be read: no Lease)" in fallback
        assert (
            "with nodeDeletionEvidence from the command line"
            in choice(Policy(), node_deletion_evidence=True).describe()
        )

    def test_a_flag_the_policy_refuses_is_an_error(self) -> None:
        with pytest.raises(ValueError, match="finite"):
            choice(Policy(), node_deletion_quarantine_seconds=float("nan"))

    def test_only_known_flags_are_taken(self) -> None:
        assert choice(NODE_LOSS, absence_confirm_seconds=1.0).policy == NODE_LOSS


# --- node loss ----------------------------------------------------------------------------------


def node_loss(
    registrations: list[dict[str, Any]],
    *,
    nodes: list[dict[str, Any]],
    leases: list[dict[str, Any]],
    published: Policy | PolicyUnreadable = DEFAULTS,
) -> doctor.Check:
    world = plan.build_world(listing(registrations, leases=leases, nodes=nodes, permission=False))
    chosen = choice(published)
    decided = fingerprint.decide_all(world=world, policy=chosen.policy, now=NOW)
    return doctor.check_node_loss(world=world, plan=decided, policy=chosen, system_namespace=SYSTEM, now=NOW)


EXPIRED = agent_lease(renewed_at=NOW - 300 * S, duration=40)  # expired at NOW - 260 s
LIVE = agent_lease()
REPLACED = node(uid="another-uid", boot_id=OTHER_BOOT)
RETIRED = {"status.conditions": [{"type": "Retired", "status": "True", "reason": "PidfdExited"}]}

# (registrations, nodes, leases, published, status, node state, agent state, phrases)
CASES = [
    pytest.param(
        [worker("a", attested=False), worker("b", verdict="Alive", evidence="PidfdPinned")],
        [],
        [EXPIRED],
        Policy(),
        doctor.CheckStatus.FAIL,
        "deleted",
        "expired",
        [
            "Node node-a is deleted (no Node object)",
            "expired at 2026-11-30T17:55:40Z (4m20s ago)",
            "add the manifests/components/node-loss component",
        ],
        id="deleted-agent-expired-no-opt-in",
    ),
    pytest.param(
        [worker("a", attested=False)],
        [],
        [EXPIRED],
        NODE_LOSS,
        doctor.CheckStatus.FAIL,
        "deleted",
        "expired",
        [
            "the operator runs with node-deletion evidence: its 300s quarantine ends 300s after it saw Node node-a",
            "by 2026-11-30T18:05:00Z at the latest",
        ],
        id="deleted-agent-expired-opted-in",
    ),
    pytest.param(
        [worker("a", attested=False)],
        [],
        [],
        Policy(),
        doctor.CheckStatus.FAIL,
        "deleted",
        "missing",
        ["does not exist (since an unknown time)", "node-loss component"],
        id="deleted-no-agent-lease",
    ),
    pytest.param(
        [worker("a", attested=False)],
        [],
        [EXPIRED],
        PolicyUnreadable(reason="no Lease"),
        doctor.CheckStatus.FAIL,
        "deleted",
        "expired",
        ["if the operator runs without --node-deletion-evidence (its policy could not be read)"],
        id="deleted-operator-policy-unknown",
    ),
    pytest.param(
        [worker("a", attested=False)],
        [node()],
        [EXPIRED],
        Policy(),
        doctor.CheckStatus.FAIL,
        "present",
        "expired",
        [
            "Node node-a exists",
            "kubectl taint node node-a node.kubernetes.io/out-of-service=nodeshutdown:NoExecute",
            "restarting the agent on node-a",
        ],
        id="present-agent-expired",
    ),
    pytest.param(
        [worker("a", attested=False)],
        [node()],
        [EXPIRED],
        Policy(node_out_of_service_evidence=False),
        doctor.CheckStatus.FAIL,
        "present",
        "expired",
        ["the out-of-service taint does not help: the operator's policy has nodeOutOfServiceEvidence=false"],
        id="present-taint-not-accepted",
    ),
    pytest.param(
        [worker("a", attested=False)],
        [REPLACED],
        [agent_lease(boot_id=OTHER_BOOT)],
        NODE_LOSS,
        doctor.CheckStatus.FAIL,
        "replaced",
        "another-boot",
        ["was replaced", "is live on another boot", "a replaced Node counts at once"],
        id="replaced-new-machine-live-agent",
    ),
    pytest.param(
        [worker("a")],
        [node()],
        [LIVE],
        Policy(),
        doctor.CheckStatus.PASS,
        None,
        None,
        ["no active registration is on a lost node", "(1 active)"],
        id="healthy",
    ),
    pytest.param(
        [worker("a", attested=False)],
        [],
        [LIVE],
        Policy(),
        doctor.CheckStatus.PASS,
        None,
        None,
        [],
        id="node-object-deleted-but-its-agent-lives-on-the-same-boot",
    ),
    pytest.param(
        [worker("a", attested=False)],
        [node(uid="recreated")],
        [LIVE],
        Policy(),
        doctor.CheckStatus.PASS,
        None,
        None,
        [],
        id="node-recreated-by-its-running-kubelet",
    ),
    pytest.param(
        [worker("gone", paths=RETIRED)],
        [],
        [EXPIRED],
        Policy(),
        doctor.CheckStatus.PASS,
        None,
        None,
        ["(0 active)"],
        id="terminal-registrations-are-history",
    ),
    pytest.param(
        [],
        [],
        [],
        Policy(),
        doctor.CheckStatus.PASS,
        None,
        None,
        ["(0 active)"],
        id="nothing-registered",
    ),
]


class TestNodeLoss:
    @pytest.mark.parametrize(
        ("registrations", "nodes", "leases", "published", "status", "node_state", "agent_state", "phrases"), CASES
    )
    def test_node_loss(
        self,
        registrations: list[dict[str, Any]],
        nodes: list[dict[str, Any]],
        leases: list[dict[str, Any]],
        published: Policy | PolicyUnreadable,
        status: doctor.CheckStatus,
        node_state: str | None,
        agent_state: str | None,
        phrases: list[str],
    ) -> None:
        check = node_loss(registrations, nodes=nodes, leases=leases, published=published)
        assert check.name == "node-loss"
        assert check.status == status, check.summary
        for phrase in phrases:
            assert phrase in check.summary
        if status == doctor.CheckStatus.PASS:
            assert check.facts == {"count": 0, "nodes": {}} and check.objects == ()
            return
        names = sorted(f"{NAMESPACE}/{r['metadata']['name']}" for r in registrations)
        facts = check.facts["nodes"][NODE]
        assert facts["node"] == node_state and facts["agentLease"] == agent_state
        assert facts["registrations"] == names and facts["count"] == len(names) == check.facts["count"]
        assert check.objects == (f"node/{NODE}", *(f"workerregistration/{n}" for n in names))
        assert f"{NODE}: {len(names)} registration(s)" in check.summary
        assert "kubectl coroner apply" in check.summary and api.RETIRE_VERB in check.summary
        assert sum(facts["reasons"].values()) == len(names)

    def test_since_when_is_the_agent_lease_expiry(self) -> None:
        check = node_loss([worker("a", attested=False)], nodes=[], leases=[EXPIRED])
        facts = check.facts["nodes"][NODE]
        assert facts["agentLeaseExpired"] == "2026-11-30T17:55:40Z" and facts["lostSeconds"] == 260.0
        assert facts["lastHeartbeat"] == "2026-11-30T17:59:00Z"

    @pytest.mark.parametrize(
        ("published", "released"),
        [
            pytest.param(Policy(), {"nodeDeletion": 2, "outOfServiceTaint": None, "applyNow": 0}, id="deleted"),
            pytest.param(NODE_LOSS, {"nodeDeletion": 2, "outOfServiceTaint": None, "applyNow": 0}, id="opted-in"),
        ],
    )
    def test_what_releases_them_is_decided_not_assumed(self, published: Policy, released: dict[str, int]) -> None:
        # One registration was not minted by the launcher: no evidence ever makes it retirable
        # (UntrustedIdentityProvenance comes before any death evidence), so it is not counted.
        registrations = [worker("a", attested=False), worker("b", attested=False), worker("c", attested=False)]
        registrations[2]["spec"]["clientInstanceId"] = "not-minted"
        check = node_loss(registrations, nodes=[], leases=[EXPIRED], published=published)
        assert check.facts["nodes"][NODE]["release"] == released
        assert "counts 2 of 3 dead (NodeDeleted)" in check.summary

    def test_one_line_per_node_with_counts(self) -> None:
        registrations = [
            worker("a1", attested=False),
            worker("a2", attested=False),
            worker("b1", attested=False, node_name="node-b"),
            worker("c1", node_name="node-c"),
        ]
        leases = [EXPIRED, agent_lease(node="node-c")]
        check = node_loss(registrations, nodes=[node(name="node-c")], leases=leases)
        assert check.status == doctor.CheckStatus.FAIL
        assert set(check.facts["nodes"]) == {NODE, "node-b"} and check.facts["count"] == 3
        assert "on 2 lost node(s)" in check.summary
        assert "node-a: 2 registration(s)" in check.summary and "node-b: 1 registration(s)" in check.summary
        assert "node-c" not in check.summary

    def test_unreadable_facts_are_unknown_never_zero(self) -> None:
        check = doctor.check_node_loss(
            world=plan.Unreadable(reason="forbidden"),
            plan=plan.Unreadable(reason="forbidden"),
            policy=choice(),
            system_namespace=SYSTEM,
            now=NOW,
        )
        assert check.status == doctor.CheckStatus.UNKNOWN and "count" not in check.facts


# --- agents: nodes with registrations, not only Ready ones ---------------------------------------


CONTROL_PLANE = {
    **node(ready=True),
    "metadata": {**node(ready=True)["metadata"], "labels": {"node-role.kubernetes.io/control-plane": ""}},
}


class TestAgentsOfNodesWithRegistrations:
    @pytest.mark.parametrize(
        ("nodes", "leases", "registrations", "status", "problem"),
        [
            pytest.param([], [], [worker("a")], doctor.CheckStatus.FAIL, "no agent", id="deleted-node-no-lease"),
            pytest.param(
                [], [EXPIRED], [worker("a")], doctor.CheckStatus.FAIL, "expired at", id="deleted-node-expired-lease"
            ),
            pytest.param(
                [node(ready=False)],
                [EXPIRED],
                [worker("a")],
                doctor.CheckStatus.FAIL,
                "expired at",
                id="not-ready-node-with-registrations",
            ),
            pytest.param(
                [node(ready=False, boot_id=OTHER_BOOT)],
                [LIVE],
                [worker("a")],
                doctor.CheckStatus.FAIL,
                f"agent boot id {BOOT} differs from the Node's bootID {OTHER_BOOT}",
                id="not-ready-node-boot-differs",
            ),
            pytest.param([node(ready=False)], [], [], doctor.CheckStatus.PASS, None, id="not-ready-node-empty"),
            pytest.param(
                [], [], [worker("a", paths=RETIRED)], doctor.CheckStatus.PASS, None, id="only-terminal-registrations"
            ),
            pytest.param([], [LIVE], [worker("a")], doctor.CheckStatus.PASS, None, id="no-node-object-live-agent"),
            pytest.param([], [], [], doctor.CheckStatus.PASS, None, id="empty-cluster"),
            # The shipped DaemonSet's affinity keeps the agent off control-plane nodes: a Ready one
            # without an agent is as expected, unless registrations are on it.
            pytest.param([CONTROL_PLANE], [], [], doctor.CheckStatus.PASS, None, id="control-plane-node-no-agent"),
            pytest.param(
                [CONTROL_PLANE], [], [worker("a")], doctor.CheckStatus.FAIL, "no agent", id="control-plane-node-holding"
            ),
        ],
    )
    def test_agents(
        self,
        nodes: list[dict[str, Any]],
        leases: list[dict[str, Any]],
        registrations: list[dict[str, Any]],
        status: doctor.CheckStatus,
        problem: str | None,
    ) -> None:
        world = plan.build_world(listing(registrations, leases=leases, nodes=nodes))
        decided = fingerprint.decide_all(world=world, policy=Policy(), now=NOW)
        check = doctor.check_agents(nodes=nodes, leases=leases, system_namespace=SYSTEM, now=NOW, plan=decided)
        assert check.status == status, check.summary
        if problem is None:
            assert check.objects == () and "has a live agent on the Node's boot" in check.summary
        else:
            assert check.objects == (f"node/{NODE}",)
            assert problem in check.facts["problems"][NODE] and "1 active registration(s)" in check.summary
            assert check.facts["nodesWithRegistrations"] == {NODE: 1}

    def test_the_old_blind_spot_every_ready_node_0(self) -> None:
        """The report from the field: 22 registrations, their node deleted, no Ready node at all."""
        registrations = [worker(f"w{i}", attested=False) for i in range(22)]
        world = plan.build_world(listing(registrations, leases=[EXPIRED], nodes=[]))
        decided = fingerprint.decide_all(world=world, policy=Policy(), now=NOW)
        agents = doctor.check_agents(nodes=[], leases=[EXPIRED], system_namespace=SYSTEM, now=NOW, plan=decided)
        lost = doctor.check_node_loss(world=world, plan=decided, policy=choice(), system_namespace=SYSTEM, now=NOW)
        assert agents.status == lost.status == doctor.CheckStatus.FAIL
        assert "22 active registration(s)" in agents.summary
        assert lost.facts["count"] == 22 and "node-a: 22 registration(s)" in lost.summary
        assert NODE_UID  # the registrations name the Node that is gone


# --- agents: which nodes need an agent, and why the others do not ---------------------------------


def control_plane(name: str, *, ready: bool = True) -> dict[str, Any]:
    """A Node labelled as the control plane, which the shipped agent DaemonSet's affinity avoids."""
    body = node(name=name, ready=ready, uid=f"uid-{name}")
    body["metadata"]["labels"] = {api.CONTROL_PLANE_LABEL: ""}
    return body


def plain(name: str, *, ready: bool = True) -> dict[str, Any]:
    return node(name=name, ready=ready, uid=f"uid-{name}")


AVOIDED = f"control-plane: the agent DaemonSet's node affinity avoids {api.CONTROL_PLANE_LABEL}"


class TestAgentsSaysWhichNodesNeedAnAgent:
    """Two Ready nodes, one of them the control plane, read "every Ready node (1)": the line counted
    the nodes an agent runs on and called them every Ready node. It names the nodes it checks, and
    each node it leaves out with why."""

    @pytest.mark.parametrize(
        ("nodes", "leases", "registrations", "status", "checked", "excluded", "phrases"),
        [
            pytest.param(
                [control_plane("cp-0"), plain("node-b")],
                [agent_lease(node="node-b")],
                [],
                doctor.CheckStatus.PASS,
                ["node-b"],
                {"cp-0": AVOIDED},
                [
                    "each of the 1 node(s) that need an agent (Ready and run by the agent DaemonSet: node-b; "
                    "holding active registrations: none) has a live agent on the Node's boot",
                    f"no agent expected on cp-0 ({AVOIDED})",
                ],
                id="one-ready-worker-one-ready-control-plane",
            ),
            pytest.param(
                [plain("node-b"), plain("node-c", ready=False)],
                [agent_lease(node="node-b")],
                [],
                doctor.CheckStatus.PASS,
                ["node-b"],
                {"node-c": "not Ready"},
                ["no agent expected on node-c (not Ready)"],
                id="a-node-not-ready",
            ),
            pytest.param(
                [control_plane("cp-0", ready=False)],
                [],
                [],
                doctor.CheckStatus.PASS,
                [],
                {"cp-0": f"{AVOIDED}; not Ready"},
                ["each of the 0 node(s) that need an agent (Ready and run by the agent DaemonSet: none;"],
                id="control-plane-not-ready",
            ),
            pytest.param(
                [control_plane(NODE), plain("node-b")],
                [agent_lease(node="node-b")],
                [worker("a")],
                doctor.CheckStatus.FAIL,
                [NODE, "node-b"],
                {},
                [
                    "1 of the 2 node(s) that need an agent (Ready and run by the agent DaemonSet: node-b; "
                    f"holding active registrations: {NODE}) lack a healthy agent: {NODE}: no agent"
                ],
                id="control-plane-holding-registrations-needs-one",
            ),
            pytest.param(
                [plain(NODE, ready=False), control_plane("cp-0")],
                [LIVE],
                [worker("a")],
                doctor.CheckStatus.PASS,
                [NODE],
                {"cp-0": AVOIDED},
                ["holding active registrations: node-a", f"no agent expected on cp-0 ({AVOIDED})"],
                id="not-ready-node-holding-registrations-needs-one",
            ),
        ],
    )
    def test_the_line_names_what_it_checked_and_what_it_left_out(
        self,
        nodes: list[dict[str, Any]],
        leases: list[dict[str, Any]],
        registrations: list[dict[str, Any]],
        status: doctor.CheckStatus,
        checked: list[str],
        excluded: dict[str, str],
        phrases: list[str],
    ) -> None:
        world = plan.build_world(listing(registrations, leases=leases, nodes=nodes))
        decided = fingerprint.decide_all(world=world, policy=Policy(), now=NOW)
        check = doctor.check_agents(nodes=nodes, leases=leases, system_namespace=SYSTEM, now=NOW, plan=decided)
        assert check.status == status, check.summary
        assert check.facts["expectedNodes"] == checked
        assert check.facts["notExpected"] == excluded
        assert "every Ready node" not in check.summary
        for phrase in phrases:
            assert phrase in check.summary, check.summary

    def test_unknown_registrations_still_say_which_nodes_were_checked(self) -> None:
        nodes = [control_plane("cp-0"), plain("node-b")]
        leases = [agent_lease(node="node-b")]
        check = doctor.check_agents(
            nodes=nodes, leases=leases, system_namespace=SYSTEM, now=NOW, plan=plan.Unreadable(reason="403 Forbidden")
        )
        assert check.status == doctor.CheckStatus.UNKNOWN, check.summary
        assert "the 1 Ready node(s) the agent DaemonSet runs on (node-b) have a live agent" in check.summary
        assert f"no agent expected on cp-0 ({AVOIDED})" in check.summary


# --- squatting: a registration of another registrant copying a worker's claims -----------------


class TestSquatting:
    """A peer created by another identity that copies a worker's clientInstanceId, session or
    incarnation blocks nothing in the decision, and doctor names it and its registrant."""

    def _check(self, registrations: list[dict[str, Any]]) -> doctor.Check:
        world = plan.build_world(listing(registrations))
        return doctor.check_squatting(plan=fingerprint.decide_all(world=world, policy=Policy(), now=NOW))

    def test_a_squatter_is_named_with_its_registrant(self) -> None:
        victim = worker("victim")
        squat = worker(
            "squat",
            client_instance_id="inst-victim",
            node_name="node-z",
            attested=False,
            registered_by=SQUATTER,
            created_at=NOW - 10 * S,
        )
        check = self._check([victim, squat])
        assert check.status == doctor.CheckStatus.FAIL, check.summary
        assert check.objects == (f"workerregistration/{NAMESPACE}/squat",)
        assert SQUATTER in check.summary and f"{NAMESPACE}/victim" in check.summary
        assert "clientInstanceId" in check.summary
        assert check.facts["squatters"] == [
            {
                "registration": f"{NAMESPACE}/squat",
                "registeredBy": SQUATTER,
                "claimsOf": f"{NAMESPACE}/victim",
                "victimRegisteredBy": REGISTRANT,
                "claims": ["clientInstanceId"],
            }
        ]

    def test_a_squatter_is_still_named_once_its_victim_is_retired(self) -> None:
        victim = worker("victim", conditions=[{"type": "Retired", "status": "True"}])
        squat = worker("squat", client_instance_id="inst-victim", attested=False, registered_by=SQUATTER)
        check = self._check([victim, squat])
        assert check.status == doctor.CheckStatus.FAIL, check.summary
        assert check.objects == (f"workerregistration/{NAMESPACE}/squat",)

    def test_a_twin_of_the_same_registrant_is_no_squatter(self) -> None:
        check = self._check([worker("one"), worker("two", client_instance_id="inst-one")])
        assert check.status == doctor.CheckStatus.PASS, check.summary

    def test_an_unrecorded_registrant_is_no_squatter_but_unknown(self) -> None:
        registrations = [worker("one"), worker("two", client_instance_id="inst-one", registered_by=None)]
        check = self._check(registrations)
        assert check.status == doctor.CheckStatus.PASS, check.summary
        assert check.facts["unrecordedRegistrants"] == [f"{NAMESPACE}/two"]

    def test_a_lease_squatter_is_no_conflict_but_blocked_names_it(self) -> None:
        """A Lease records no writer (accepted risk): the dead worker it names stays, and `blocked`
        says why, so doctor is not green."""
        squat = {
            "metadata": {"name": "squat", "namespace": NAMESPACE},
            "spec": {"holderIdentity": "inst-victim", "leaseDurationSeconds": 30},
        }
        world = plan.build_world(listing([worker("victim")], leases=[agent_lease(), squat]))
        decided = fingerprint.decide_all(world=world, policy=Policy(), now=NOW)
        assert doctor.check_squatting(plan=decided).status == doctor.CheckStatus.PASS
        blocked = doctor.check_blocked(plan=decided, expect_plan_only=False)
        assert blocked.status == doctor.CheckStatus.FAIL, blocked.summary
        assert blocked.facts["byReason"] == {"ProtectedLeaseHolder": [f"{NAMESPACE}/victim"]}

    def test_unreadable_registrations_are_unknown(self) -> None:
        check = doctor.check_squatting(plan=plan.Unreadable(reason="403 Forbidden"))
        assert check.status == doctor.CheckStatus.UNKNOWN


# --- retire-grant: the grant of the operator doctor is pointed at --------------------------------


def operator_deployment(
    *, name: str = "coroner-operator", service_account: str | None = "coroner-operator", app: str = "coroner-operator"
) -> dict[str, Any]:
    """A Deployment in the system namespace as the manifests and the chart render it (prefix in the names)."""
    pod_spec = {} if service_account is None else {"serviceAccountName": service_account}
    return {
        "metadata": {"name": name, "namespace": SYSTEM},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": app}},
            "template": {"metadata": {"labels": {"app.kubernetes.io/name": app}}, "spec": pod_spec},
        },
    }


SHIPPED_USER = f"system:serviceaccount:{SYSTEM}:coroner-operator"
PREFIXED = operator_deployment(name="team-a-coroner-operator", service_account="team-a-coroner-operator")
PREFIXED_USER = f"system:serviceaccount:{SYSTEM}:team-a-coroner-operator"


def operator_lease(user: str | None) -> dict[str, Any]:
    """The operator's Lease as `get` returns it, stating `user` (`api.OPERATOR_USER_ANNOTATION`; None: no
    such annotation, as an operator older than it writes)."""
    annotations = {} if user is None else {api.OPERATOR_USER_ANNOTATION: user}
    return {"metadata": {"name": "coroner-operator", "namespace": SYSTEM, "annotations": annotations}}


class TestRetireGrantOfTheOperatorPointedAt:
    """A Helm release with namePrefix runs the operator as `<prefix>coroner-operator` and binds
    `<prefix>coroner-operator-retire` to it: the grant doctor reviews is that ServiceAccount's,
    learned from the operator's Deployment (`spec.template.spec.serviceAccountName`)."""

    @pytest.mark.parametrize(
        ("deployments", "user", "learned"),
        [
            pytest.param(
                [PREFIXED], f"system:serviceaccount:{SYSTEM}:team-a-coroner-operator", "Deployment", id="helm-prefix"
            ),
            pytest.param([operator_deployment()], SHIPPED_USER, "Deployment", id="kustomize-names"),
            pytest.param([], SHIPPED_USER, "no operator Deployment", id="no-deployment-manifests-name"),
            pytest.param(
                [operator_deployment(name="web", service_account="web", app="web")],
                SHIPPED_USER,
                "no operator Deployment",
                id="other-deployments-ignored",
            ),
            pytest.param(
                [operator_deployment(service_account=None)],
                f"system:serviceaccount:{SYSTEM}:default",
                "Deployment",
                id="no-service-account-is-default",
            ),
            pytest.param(
                plan.Unreadable(reason="deployments.apps is forbidden"),
                SHIPPED_USER,
                "deployments.apps is forbidden",
                id="unreadable-manifests-name-said-so",
            ),
        ],
    )
    def test_the_operators_service_account_is_reviewed(
        self, deployments: list[dict[str, Any]] | plan.Unreadable, user: str, learned: str
    ) -> None:
        assert doctor.operator_identity(deployments, system_namespace=SYSTEM).user == user
        check = doctor.check_retire_grant(
            cluster_wide=False,
            per_namespace={},
            expect_plan_only=False,
            system_namespace=SYSTEM,
            operator_deployments=deployments,
        )
        assert check.status == doctor.CheckStatus.FAIL, check.summary
        assert check.objects == (user,) and check.facts["user"] == user
        assert learned in check.facts["userFrom"] and learned in check.summary
        granted = doctor.check_retire_grant(
            cluster_wide=True,
            per_namespace={},
            expect_plan_only=False,
            system_namespace=SYSTEM,
            operator_deployments=deployments,
        )
        assert granted.status == doctor.CheckStatus.PASS and user in granted.summary

    def test_two_operators_in_one_namespace_is_unknown_not_a_guess(self) -> None:
        both = [operator_deployment(), PREFIXED]
        assert doctor.operator_identity(both, system_namespace=SYSTEM).user is None
        check = doctor.check_retire_grant(
            cluster_wide=None,
            per_namespace={},
            expect_plan_only=False,
            system_namespace=SYSTEM,
            operator_deployments=both,
        )
        assert check.status == doctor.CheckStatus.UNKNOWN
        assert "coroner-operator" in check.summary and "team-a-coroner-operator" in check.summary

    @pytest.mark.parametrize(
        ("lease", "deployments", "user", "learned"),
        [
            pytest.param(
                operator_lease(PREFIXED_USER),
                plan.Unreadable(reason="deployments.apps is forbidden"),
                PREFIXED_USER,
                f"Lease {SYSTEM}/coroner-operator",
                id="planner-only-helm-prefix-from-the-lease",
            ),
            pytest.param(
                operator_lease(PREFIXED_USER),
                [operator_deployment()],
                PREFIXED_USER,
                f"Lease {SYSTEM}/coroner-operator",
                id="the-lease-before-the-deployments",
            ),
            pytest.param(
                operator_lease(PREFIXED_USER), [], PREFIXED_USER, "operator-user", id="annotation-named-in-the-line"
            ),
            pytest.param(
                operator_lease(None), [PREFIXED], PREFIXED_USER, "Deployment", id="no-annotation-then-the-deployments"
            ),
            pytest.param(
                operator_lease(""), [PREFIXED], PREFIXED_USER, "Deployment", id="empty-annotation-then-the-deployments"
            ),
            pytest.param(None, [PREFIXED], PREFIXED_USER, "Deployment", id="no-lease-then-the-deployments"),
            pytest.param(
                plan.Unreadable(reason="leases is forbidden"),
                [PREFIXED],
                PREFIXED_USER,
                "Deployment",
                id="unreadable-lease-then-the-deployments",
            ),
            pytest.param(
                operator_lease(None),
                plan.Unreadable(reason="deployments.apps is forbidden"),
                SHIPPED_USER,
                "deployments.apps is forbidden",
                id="neither-then-the-manifests-name-said-so",
            ),
            pytest.param(operator_lease(None), [], SHIPPED_USER, "no operator Deployment", id="neither-manifests-name"),
            pytest.param(
                operator_lease(PREFIXED_USER),
                [operator_deployment(), PREFIXED],
                PREFIXED_USER,
                f"Lease {SYSTEM}/coroner-operator",
                id="the-lease-settles-two-deployments",
            ),
        ],
    )
    def test_the_operators_user_from_its_lease_then_deployments_then_manifests(
        self,
        lease: dict[str, Any] | plan.Unreadable | None,
        deployments: list[dict[str, Any]] | plan.Unreadable,
        user: str,
        learned: str,
    ) -> None:
        """The operator states its own user on its Lease (`api.OPERATOR_USER_ANNOTATION`), which
        `coroner-planner` may read: doctor takes it from there first, then from the Deployments, then
        the manifests' name, and says in the check's line which."""
        identity = doctor.operator_identity(deployments, system_namespace=SYSTEM, lease=lease)
        assert identity.user == user and learned in identity.source, identity.source
        check = doctor.check_retire_grant(
            cluster_wide=False,
            per_namespace={},
            expect_plan_only=False,
            system_namespace=SYSTEM,
            operator_deployments=deployments,
            operator_lease=lease,
        )
        assert check.objects == (user,) and check.facts["user"] == user
        assert learned in check.facts["userFrom"] and learned in check.summary

    def test_planner_only_on_a_prefixed_release_passes_admission_content(self) -> None:
        """The false FAIL of a planner-only user (Deployments may not be listed) on a Helm release
        with namePrefix: the prefix comes from the operator's Lease, and the policies compare intact."""
        text = yaml.safe_dump_all(SHIPPED).replace(
            f"serviceaccount:{SYSTEM}:coroner-", f"serviceaccount:{SYSTEM}:team-a-coroner-"
        )
        released = [d for d in yaml.safe_load_all(text) if d]
        forbidden = plan.Unreadable(reason="deployments.apps is forbidden")
        check = doctor.check_admission_content(
            admission=listed(released),
            crd=crd_of(released),
            policy=choice(),
            system_namespace=SYSTEM,
            operator_deployments=forbidden,
            operator_lease=operator_lease(PREFIXED_USER),
        )
        assert check.status == doctor.CheckStatus.PASS, check.summary
        assert check.facts["namePrefix"] == "team-a-"
        # Where the Lease says nothing (an operator older than the annotation), the FAIL says why.
        unsaid = doctor.check_admission_content(
            admission=listed(released),
            crd=crd_of(released),
            policy=choice(),
            system_namespace=SYSTEM,
            operator_deployments=forbidden,
            operator_lease=operator_lease(None),
        )
        assert unsaid.status == doctor.CheckStatus.FAIL
        assert "namePrefix is not known" in unsaid.summary and "deployments.apps is forbidden" in unsaid.summary

    def test_admission_content_compares_with_the_release_prefix(self) -> None:
        """The chart's policies name `<prefix>coroner-operator` and `<prefix>coroner-agent`: doctor
        compares them as the release's, with the prefix of the operator it is pointed at."""
        text = yaml.safe_dump_all(SHIPPED).replace(
            f"serviceaccount:{SYSTEM}:coroner-", f"serviceaccount:{SYSTEM}:team-a-coroner-"
        )
        released = [d for d in yaml.safe_load_all(text) if d]
        assert "team-a-coroner-operator" in text
        check = doctor.check_admission_content(
            admission=listed(released),
            crd=crd_of(released),
            policy=choice(),
            system_namespace=SYSTEM,
            operator_deployments=[PREFIXED],
        )
        assert check.status == doctor.CheckStatus.PASS, check.summary
        # Without the operator's Deployment the prefix is not known: the manifests' names are expected.
        unprefixed = doctor.check_admission_content(
            admission=listed(released), crd=crd_of(released), policy=choice(), system_namespace=SYSTEM
        )
        assert unprefixed.status == doctor.CheckStatus.FAIL
        assert "namePrefix is not known" not in unprefixed.summary
        # Deployments that may not be listed: the FAIL says the prefix was not learned, and why.
        forbidden = doctor.check_admission_content(
            admission=listed(released),
            crd=crd_of(released),
            policy=choice(),
            system_namespace=SYSTEM,
            operator_deployments=plan.Unreadable(reason="deployments.apps is forbidden"),
        )
        assert forbidden.status == doctor.CheckStatus.FAIL
        assert "namePrefix is not known: deployments.apps is forbidden" in forbidden.summary
        shipped = doctor.check_admission_content(
            admission=listed(SHIPPED),
            crd=crd_of(SHIPPED),
            policy=choice(),
            system_namespace=SYSTEM,
            operator_deployments=[operator_deployment()],
        )
        assert shipped.status == doctor.CheckStatus.PASS, shipped.summary

    def test_operator_alive_names_the_release_deployment(self) -> None:
        """A Helm release with namePrefix runs the operator as Deployment `<prefix>coroner-operator`:
        the fix doctor prints names that one."""
        for deployments, shown in (
            ([PREFIXED], "get deploy team-a-coroner-operator"),
            ([operator_deployment()], "get deploy coroner-operator"),
            ([], "get deploy coroner-operator"),
        ):
            check = doctor.check_operator_alive(
                lease=None, system_namespace=SYSTEM, now=NOW, operator_deployments=deployments
            )
            assert check.status == doctor.CheckStatus.FAIL and shown in check.summary, check.summary


# --- admission: the kinds the operator compares, and those an older release may have left ---------

MUTATING = "coroner-record-registrant"  # shipped by older releases only
RECORDER = "coroner-registrant-recorded"
CRD = f"CustomResourceDefinition/{ad.CRD[1]}"


def listed(documents: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]] | plan.Unreadable]:
    """The lists doctor reads, by kind, as the API returns them (items without `kind`)."""
    by_kind: dict[str, list[dict[str, Any]] | plan.Unreadable] = {
        kind: [] for kind in (*ad.KINDS, *doctor.LEFTOVER_KINDS)
    }
    for document in documents:
        if ad.key(document) == ad.CRD:
            continue  # doctor reads the CRD on its own (crd_of)
        items = by_kind[document["kind"]]
        assert not isinstance(items, plan.Unreadable)
        items.append({k: v for k, v in copy.deepcopy(document).items() if k != "kind"})
    return by_kind


def crd_of(documents: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The CRD among `documents`, as doctor reads it for check_crd (None: not installed)."""
    found = [d for d in documents if ad.key(d) == ad.CRD]
    return found[0] if found else None


SHIPPED_CRD = crd_of(SHIPPED)


def without(kind: str, name: str) -> list[dict[str, Any]]:
    return [d for d in SHIPPED if ad.key(d) != (kind, name)]


def crd_without_status_subresource() -> dict[str, Any]:
    crd = copy.deepcopy(SHIPPED_CRD)
    assert crd is not None
    crd["spec"]["versions"][0].pop("subresources")
    return crd


PLURALS = {
    "ValidatingAdmissionPolicy": "ValidatingAdmissionPolicies",
    "ValidatingAdmissionPolicyBinding": "ValidatingAdmissionPolicyBindings",
    "MutatingAdmissionPolicy": "MutatingAdmissionPolicies",
    "MutatingAdmissionPolicyBinding": "MutatingAdmissionPolicyBindings",
}


def unreadable(kind: str) -> dict[str, list[dict[str, Any]] | plan.Unreadable]:
    return {**listed(SHIPPED), kind: plan.Unreadable(reason=f"you may not list {PLURALS[kind]} (403 Forbidden)")}


def node_loss_variant() -> list[dict[str, Any]]:
    return [ad.with_node_loss(d) if ad.key(d) == ad.EVIDENCE_POLICY else d for d in SHIPPED]


NO_NODE_EVIDENCE = Policy(node_deletion_evidence=False, node_out_of_service_evidence=False)


class TestAdmissionKinds:
    """The operator fails closed (AdmissionPoliciesUnverified) when a policy, a binding or the CRD is
    missing or differs: doctor's admission checks compare the same, so they are never PASS then.
    Mutating policies only an older release installed are looked for too: left, they still act."""

    @pytest.mark.parametrize(
        ("admission", "crd", "status", "objects"),
        [
            pytest.param(listed(SHIPPED), SHIPPED_CRD, "PASS", (), id="intact"),
            pytest.param(
                listed(without("ValidatingAdmissionPolicyBinding", RECORDER)),
                SHIPPED_CRD,
                "FAIL",
                (f"ValidatingAdmissionPolicyBinding/{RECORDER}",),
                id="binding-missing",
            ),
            pytest.param(listed(SHIPPED), None, "FAIL", (CRD,), id="crd-missing"),
            pytest.param(listed(SHIPPED), crd_without_status_subresource(), "FAIL", (CRD,), id="crd-drifted"),
            pytest.param(listed(SHIPPED), plan.Unreadable(reason="403 Forbidden"), "UNKNOWN", (), id="crd-unreadable"),
            pytest.param(unreadable("ValidatingAdmissionPolicy"), SHIPPED_CRD, "UNKNOWN", (), id="policies-unreadable"),
            pytest.param(
                unreadable("ValidatingAdmissionPolicyBinding"), SHIPPED_CRD, "UNKNOWN", (), id="bindings-unreadable"
            ),
            # What an older release left is the names check's business, not the content's.
            pytest.param(unreadable("MutatingAdmissionPolicy"), SHIPPED_CRD, "PASS", (), id="mutating-unreadable"),
        ],
    )
    def test_admission_content(
        self,
        admission: dict[str, list[dict[str, Any]] | plan.Unreadable],
        crd: dict[str, Any] | plan.Unreadable | None,
        status: str,
        objects: tuple[str, ...],
    ) -> None:
        check = doctor.check_admission_content(admission=admission, crd=crd, policy=choice(), system_namespace=SYSTEM)
        assert check.status == status, check.summary
        assert check.objects == objects
        for shown in objects:
            assert shown in check.summary
        for kind, items in admission.items():
            if isinstance(items, plan.Unreadable) and kind in ad.KINDS:
                assert f"{PLURALS[kind]} could not be read" in check.summary and "403 Forbidden" in check.summary
        if status == "PASS":
            assert check.facts["compared"] == len(ad.EXPECTED) == 21

    def test_a_policy_an_older_release_left_behind_is_named_with_its_delete(self) -> None:
        """`kubectl apply` prunes nothing: an upgrade keeps the old status-path mutating policy, which
        held every status write up with 503 after an API server restart (finding 7)."""
        old = [
            {"kind": kind, "metadata": {"name": "coroner-registration-state"}, "spec": {}}
            for kind in ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")
        ]
        check = doctor.check_admission_policies(admission=listed([*SHIPPED, *old]))
        assert check.status == "FAIL", check.summary
        assert check.objects == (
            "MutatingAdmissionPolicy/coroner-registration-state",
            "MutatingAdmissionPolicyBinding/coroner-registration-state",
        )
        assert "kubectl delete mutatingadmissionpolicy coroner-registration-state" in check.summary
        assert "kubectl delete mutatingadmissionpolicybinding coroner-registration-state" in check.summary

    @pytest.mark.parametrize(
        ("admission", "status", "objects"),
        [
            pytest.param(listed(SHIPPED), "PASS", (), id="all-present"),
            pytest.param(
                listed(without("ValidatingAdmissionPolicyBinding", RECORDER)),
                "FAIL",
                (f"ValidatingAdmissionPolicyBinding/{RECORDER}",),
                id="binding-missing",
            ),
            pytest.param(
                listed(without("ValidatingAdmissionPolicy", RECORDER)),
                "FAIL",
                (f"ValidatingAdmissionPolicy/{RECORDER}",),
                id="policy-missing",
            ),
            pytest.param(
                unreadable("MutatingAdmissionPolicyBinding"), "UNKNOWN", (), id="mutating-bindings-unreadable"
            ),
        ],
    )
    def test_admission_policy_names(
        self, admission: dict[str, list[dict[str, Any]] | plan.Unreadable], status: str, objects: tuple[str, ...]
    ) -> None:
        check = doctor.check_admission_policies(admission=admission)
        assert check.status == status, check.summary
        assert check.objects == objects
        if status == "UNKNOWN":
            assert "MutatingAdmissionPolicyBindings could not be read" in check.summary

    @pytest.mark.parametrize(
        ("published", "status"),
        [
            pytest.param(DEFAULTS, "PASS", id="out-of-service-evidence-on-by-default"),
            pytest.param(NODE_LOSS, "PASS", id="node-deletion-evidence"),
            pytest.param(NO_NODE_EVIDENCE, "FAIL", id="operator-without-node-evidence-refuses-the-variant"),
            pytest.param(PolicyUnreadable(reason="Lease gone"), "UNKNOWN", id="operator-policy-unknown"),
        ],
    )
    def test_the_node_loss_variant_is_judged_as_the_operator_judges_it(
        self, published: Policy | PolicyUnreadable, status: str
    ) -> None:
        """The operator accepts components/node-loss's evidence policy only where it uses node
        evidence (admission_digest.accepted_alternates); doctor asks the operator's published policy."""
        check = doctor.check_admission_content(
            admission=listed(node_loss_variant()),
            crd=crd_of(node_loss_variant()),
            policy=choice(published),
            system_namespace=SYSTEM,
        )
        assert check.status == status, check.summary
        if status == "FAIL":
            assert check.objects == ("ValidatingAdmissionPolicy/coroner-retire-requires-evidence",)
        if status == "UNKNOWN":
            assert "Lease gone" in check.summary
        # The base evidence policy is accepted by every operator.
        base = doctor.check_admission_content(
            admission=listed(SHIPPED), crd=crd_of(SHIPPED), policy=choice(published), system_namespace=SYSTEM
        )
        assert base.status == doctor.CheckStatus.PASS, base.summary

    @settings(max_examples=60, deadline=None)
    @given(
        gone=st.sets(st.sampled_from(sorted(ad.EXPECTED))),
        changed=st.sets(st.sampled_from(sorted(ad.EXPECTED))),
        node_evidence=st.booleans(),
        variant=st.booleans(),
    )
    def test_doctor_fails_exactly_where_the_operator_is_unverified(
        self, gone: set[tuple[str, str]], changed: set[tuple[str, str]], node_evidence: bool, variant: bool
    ) -> None:
        """Any objects deleted or changed: doctor's admission-content names exactly what the
        operator's comparison (permissions.py: compare with accepted_alternates) names."""
        documents = copy.deepcopy(node_loss_variant() if variant else SHIPPED)
        for document in documents:
            if ad.key(document) in changed and document["kind"].endswith("Binding"):
                document["spec"]["matchResources"] = {"namespaceSelector": {"matchLabels": {"only": "here"}}}
            elif ad.key(document) in changed:
                document["spec"]["failurePolicy"] = "Ignore"
        documents = [d for d in documents if ad.key(d) not in gone]
        operator = Policy(node_deletion_evidence=node_evidence, node_out_of_service_evidence=False)
        theirs = ad.compare(documents, alternates=ad.accepted_alternates(node_evidence=ad.uses_node_evidence(operator)))
        check = doctor.check_admission_content(
            admission=listed(documents), crd=crd_of(documents), policy=choice(operator), system_namespace=SYSTEM
        )
        names = [f"{kind}/{name}" for kind, name in sorted((*theirs.missing, *theirs.differing))]
        assert check.status == ("PASS" if theirs.intact else "FAIL"), check.summary
        assert list(check.objects) == names
        if not theirs.intact:
            names_check = doctor.check_admission_policies(admission=listed(documents))
            if gone - {ad.CRD}:
                assert names_check.status == doctor.CheckStatus.FAIL
            if ad.CRD in gone:  # the names check is of the policies; the crd check says it is missing
                assert doctor.check_crd(crd_of(documents)).status == doctor.CheckStatus.FAIL


def test_the_planner_role_may_list_every_kind_doctor_compares() -> None:
    """docs/cli.md: coroner-planner is what a person binds to run doctor; it lists the four kinds."""
    roles = [d for d in yaml.safe_load_all((REPO / "manifests" / "base" / "roles.yaml").read_text()) if d]
    (planner,) = [d for d in roles if d["metadata"]["name"] == "coroner-planner"]
    listable = {
        resource
        for rule in planner["rules"]
        if "admissionregistration.k8s.io" in rule["apiGroups"] and "list" in rule["verbs"]
        for resource in rule["resources"]
    }
    assert set(ADMISSION_RESOURCES.values()) <= listable
    assert tuple(ADMISSION_RESOURCES) == ad.KINDS


# --- held: registrations a reason has held Active past the bound ---------------------------------

HOUR = 3600 * S
#: What the agent says of a pid number another process took (coroner_agent.verdict.reused).
REUSED_DETAIL = (
    "pid 4242 in pid namespace 4026532001 is held by host pid 777 (state S, start time 99999), not the "
    "recorded start time 123456789; the host's pid namespace lasts the whole boot"
)


def reused(name: str, *, said: datetime.datetime, **kwargs: Any) -> dict[str, Any]:
    """A worker without heartbeats (the default) whose pid number its agent found taken at `said`."""
    paths = {"status.attestation.detail": REUSED_DETAIL, **kwargs.pop("paths", {})}
    kwargs.setdefault("heartbeat", False)
    return worker(name, verdict="Reused", evidence="StartTimeDiffers", observed_at=said, paths=paths, **kwargs)


def stale(name: str) -> dict[str, Any]:
    return worker(name, verdict="Alive", evidence="PidfdPinned", heartbeat=False, observed_at=NOW - 2 * HOUR)


def since_a_week_ago(reason: str) -> list[dict[str, object]]:
    """Retirable and Attested as the operator keeps them: False (and True) since the first decision a
    week ago; the reason changed since, the transition time did not (metav1: it moves on a flip)."""
    week = format_time(NOW - 7 * 24 * HOUR)
    return [
        {"type": "Attested", "status": "True", "reason": "Reused", "message": "", "lastTransitionTime": week},
        {"type": "Retirable", "status": "False", "reason": reason, "message": "", "lastTransitionTime": week},
    ]


def held_check(
    registrations: list[dict[str, Any]],
    *,
    leases: list[dict[str, Any]] | None = None,
    nodes: list[dict[str, Any]] | None = None,
    grace_seconds: float = 600,
) -> doctor.Check:
    world = plan.build_world(listing(registrations, leases=leases, nodes=nodes))
    decided = fingerprint.decide_all(world=world, policy=Policy(), now=NOW)
    return doctor.check_held(plan=decided, now=NOW, grace_seconds=grace_seconds)


# (registrations, leases, nodes, grace, status, {name: reason} named, phrases)
HELD_CASES = [
    pytest.param(
        [reused("reused", said=NOW - HOUR)],
        None,
        None,
        600,
        doctor.CheckStatus.WARN,
        {"reused": Reason.PID_REUSE_DETECTED},
        [
            "1 registration(s) held Active for over 600s",
            f"PidReuseDetected 1: {NAMESPACE}/reused (node {NODE}, pid {1000 + sum(map(ord, 'reused'))}, "
            f"since 2026-11-30T17:00:00Z, 1h00m: {REUSED_DETAIL})",
            "retired once that process exits",
        ],
        id="pid-reused-for-an-hour",
    ),
    pytest.param(
        [reused("reused", said=NOW - 300 * S)], None, None, 600, doctor.CheckStatus.PASS, {}, [], id="reused-5-minutes"
    ),
    pytest.param(
        # A week alive, its pid taken a minute ago: the conditions' transition times say a week (they
        # move only when a status flips), the attestation says a minute, and a minute it is.
        [reused("reused", said=NOW - 60 * S, created_at=NOW - 7 * 24 * HOUR, conditions=since_a_week_ago("PidAlive"))],
        None,
        None,
        600,
        doctor.CheckStatus.PASS,
        {},
        [],
        id="alive-a-week-reused-a-minute-ago",
    ),
    pytest.param(
        [reused("reused", said=NOW - HOUR)], None, None, 7200, doctor.CheckStatus.PASS, {}, [], id="a-longer-bound"
    ),
    pytest.param(
        # Its worker heartbeats (the opt-in): heard from 30 s ago, so not left behind.
        [reused("reused", said=NOW - HOUR, heartbeat=True, heartbeat_at=NOW - 30 * S)],
        None,
        None,
        600,
        doctor.CheckStatus.PASS,
        {},
        [],
        id="a-heartbeat-is-heard-from",
    ),
    pytest.param(
        [
            worker(
                "hidden",
                verdict="Unknown",
                evidence="ProcHidesProcesses",
                heartbeat=False,
                observed_at=NOW - HOUR,
                paths={"status.attestation.detail": "that /proc is mounted with hidepid"},
            )
        ],
        None,
        None,
        600,
        doctor.CheckStatus.WARN,
        {"hidden": Reason.LIVENESS_UNKNOWN},
        ["LivenessUnknown 1:", "that /proc is mounted with hidepid", "cannot establish"],
        id="liveness-unknown",
    ),
    pytest.param(
        [stale("rebooted")],
        [agent_lease(boot_id=OTHER_BOOT)],
        [node(boot_id=OTHER_BOOT)],
        600,
        doctor.CheckStatus.WARN,
        {"rebooted": Reason.ATTESTATION_STALE},
        ["AttestationStale 1:", "has not attested it again"],
        id="attestation-stale",
    ),
    pytest.param(
        [worker("elsewhere", heartbeat=False, observed_at=NOW - HOUR, paths={"status.attestation.hostId": "f" * 32})],
        None,
        None,
        600,
        doctor.CheckStatus.WARN,
        {"elsewhere": Reason.HOST_BINDING_UNPROVEN},
        ["HostBindingUnproven 1:"],
        id="host-binding-unproven",
    ),
    pytest.param(
        [worker("other", heartbeat=False, observed_at=NOW - HOUR, paths={"status.attestation.incarnation.pid": 7})],
        None,
        None,
        600,
        doctor.CheckStatus.WARN,
        {"other": Reason.ATTESTATION_MISMATCH},
        ["AttestationMismatch 1:"],
        id="attestation-mismatch",
    ),
    pytest.param(
        [
            worker(
                "beat",
                created_at=NOW - 3 * HOUR,
                observed_at=NOW - 2 * HOUR,
                heartbeat_at=NOW - HOUR,
                paths={"status.attestation.heartbeatSeen": format_time(NOW - 2 * HOUR, fraction=True)},
            )
        ],
        None,
        None,
        600,
        doctor.CheckStatus.WARN,
        {"beat": Reason.HEARTBEAT_AFTER_ATTESTATION},
        ["HeartbeatAfterAttestation 1:", "since 2026-11-30T17:00:00Z"],
        id="heartbeat-after-attestation-since-the-heartbeat",
    ),
    pytest.param(
        [stale("silent-boot")],
        [agent_lease(boot_id=None)],
        None,
        600,
        doctor.CheckStatus.WARN,
        {"silent-boot": Reason.BOOT_IDENTITY_UNKNOWN},
        ["BootIdentityUnknown 1:", "the agents check names the node"],
        id="boot-identity-unknown",
    ),
    pytest.param(
        [worker("partial", attested=False, heartbeat=False, paths={"spec.incarnation.startTime": DELETE})],
        None,
        None,
        600,
        doctor.CheckStatus.WARN,
        {"partial": Reason.INCOMPLETE_IDENTITY},
        ["IncompleteIdentity 1:", "since 2026-11-30T17:00:00Z", "lacks valid", "not made by Coroner's launcher"],
        id="incomplete-identity-since-creation",
    ),
    pytest.param(
        [worker("handmade", client_instance_id="handmade", attested=False, heartbeat=False)],
        None,
        None,
        600,
        doctor.CheckStatus.WARN,
        {"handmade": Reason.UNTRUSTED_IDENTITY_PROVENANCE},
        ["UntrustedIdentityProvenance 1:"],
        id="untrusted-identity-provenance",
    ),
    pytest.param(
        [worker("garbled", heartbeat_at="yesterday", attested=False)],
        None,
        None,
        600,
        doctor.CheckStatus.WARN,
        {"garbled": Reason.UNPARSABLE_HEARTBEAT},
        ["UnparsableHeartbeat 1:"],
        id="unparsable-heartbeat",
    ),
    pytest.param(
        [reused("a", said=NOW - HOUR), reused("b", said=NOW - 2 * HOUR), reused("fresh", said=NOW - 60 * S)],
        None,
        None,
        600,
        doctor.CheckStatus.WARN,
        {"a": Reason.PID_REUSE_DETECTED, "b": Reason.PID_REUSE_DETECTED},
        ["2 registration(s) held Active for over 600s", "PidReuseDetected 2:"],
        id="two-of-three",
    ),
    pytest.param(
        [reused("gone", said=NOW - HOUR, paths=RETIRED)],
        None,
        None,
        600,
        doctor.CheckStatus.PASS,
        {},
        [],
        id="terminal",
    ),
    pytest.param(
        # Unattested is the unattested check's (its own grace); dead but unconfirmed is blocked's.
        [
            worker("new", attested=False, created_at=NOW - HOUR),
            worker("once", evidence="ProcAbsent", heartbeat=False, observed_at=NOW - HOUR),
            worker("alive", verdict="Alive", evidence="PidfdPinned", observed_at=NOW - 7 * 24 * HOUR),
        ],
        None,
        None,
        600,
        doctor.CheckStatus.PASS,
        {},
        ["0 of 3 active registration(s) held Active for over 600s"],
        id="other-checks-reasons-and-a-live-worker",
    ),
]


class TestHeld:
    @pytest.mark.parametrize(("registrations", "leases", "nodes", "grace", "status", "named", "phrases"), HELD_CASES)
    def test_held_past_the_bound(
        self,
        registrations: list[dict[str, Any]],
        leases: list[dict[str, Any]] | None,
        nodes: list[dict[str, Any]] | None,
        grace: float,
        status: doctor.CheckStatus,
        named: dict[str, Reason],
        phrases: list[str],
    ) -> None:
        check = held_check(registrations, leases=leases, nodes=nodes, grace_seconds=grace)
        assert check.status == status, check.summary
        assert check.objects == tuple(f"workerregistration/{NAMESPACE}/{name}" for name in sorted(named))
        assert {item["registration"]: item["reason"] for item in check.facts["registrations"]} == {
            f"{NAMESPACE}/{name}": reason.value for name, reason in named.items()
        }
        assert check.facts["graceSeconds"] == grace
        for phrase in phrases:
            assert phrase in check.summary

    def test_the_facts_name_node_pid_since_and_why(self) -> None:
        check = held_check([reused("reused", said=NOW - HOUR)])
        assert check.facts["count"] == 1
        assert check.facts["byReason"] == {"PidReuseDetected": [f"{NAMESPACE}/reused"]}
        (item,) = check.facts["registrations"]
        assert item == {
            "registration": f"{NAMESPACE}/reused",
            "node": NODE,
            "pid": 1000 + sum(map(ord, "reused")),
            "reason": "PidReuseDetected",
            "since": "2026-11-30T17:00:00Z",
            "heldSeconds": 3600.0,
            "detail": REUSED_DETAIL,
        }

    def test_unreadable_registrations_are_unknown(self) -> None:
        check = doctor.check_held(plan=plan.Unreadable(reason="403 Forbidden"), now=NOW, grace_seconds=600)
        assert check.status == doctor.CheckStatus.UNKNOWN and "count" not in check.facts

    def test_dead_but_unconfirmed_is_blocked_at_once(self) -> None:
        """DeathUnconfirmed never ends by itself (the agent does not write an unchanged Dead again);
        `blocked` names it, without the bound, so `held` leaves it."""
        world = plan.build_world(listing([worker("once", evidence="ProcAbsent", heartbeat=False)]))
        decided = fingerprint.decide_all(world=world, policy=Policy(), now=NOW)
        blocked = doctor.check_blocked(plan=decided, expect_plan_only=False)
        assert blocked.facts["byReason"] == {"DeathUnconfirmed": [f"{NAMESPACE}/once"]}

    def test_every_reason_is_held_or_reported_elsewhere(self) -> None:
        """The survey, kept: a reason that can preserve an active registration is either `held`'s
        (past the bound) or named by another check with an alert of its own."""
        elsewhere = {
            Reason.ATTESTATION_MISSING,  # unattested; CoronerRegistrationsUnattested
            Reason.AGENT_UNAVAILABLE,  # node-loss; CoronerRegistrationsAgentUnavailable
            Reason.DEATH_UNCONFIRMED,  # blocked; CoronerRegistrationsBlocked
            Reason.CLIENT_INSTANCE_CONFLICT,  # blocked; CoronerRegistrationsBlocked
            Reason.CONFLICTING_IDENTITY,  # blocked; CoronerRegistrationsBlocked
            Reason.PROTECTED_LEASE_HOLDER,  # blocked; CoronerRegistrationsBlocked
            Reason.RETIRE_REFUSED_BY_ADMISSION,  # blocked; CoronerRegistrationsBlocked
            Reason.ADMISSION_POLICIES_UNVERIFIED,  # admission-content; CoronerAdmissionPoliciesUnverified
            Reason.RETIRE_PERMISSION_MISSING,  # retire-grant, blocked; CoronerRetirePermissionMissing
        }
        not_held = {
            Reason.ELIGIBLE_STALE_ORPHAN,  # retired
            Reason.ALREADY_TERMINAL,  # history
            Reason.PID_ALIVE,  # alive by the kernel's pidfd, from an agent live on its boot
            Reason.HEARTBEAT_NOT_EXPIRED,  # ends by the clock
        }
        assert not (held.HELD_REASONS & (elsewhere | not_held))
        assert held.HELD_REASONS | elsewhere | not_held == set(Reason)
        assert set(HELD_FIXES) == held.HELD_REASONS  # what to do, for each
        blocked_alert = alerts()["CoronerRegistrationsBlocked"]["expr"]
        for reason in (Reason.DEATH_UNCONFIRMED, Reason.CLIENT_INSTANCE_CONFLICT, Reason.RETIRE_REFUSED_BY_ADMISSION):
            assert reason.value in blocked_alert
        assert "coroner_registrations_held" in alerts()["CoronerRegistrationsHeld"]["expr"]

    def test_doctor_runs_it_after_unattested_and_a_warn_alone_exits_0_and_is_named(self) -> None:
        names = [check(minimal_findings()).name for check in doctor.CHECKS]
        assert names[names.index("unattested") + 1] == "held"
        warn = doctor.Check(
            name="held", status=doctor.CheckStatus.WARN, summary="", objects=("workerregistration/a/b",)
        )
        ok = doctor.Check(name="crd", status=doctor.CheckStatus.PASS, summary="")
        assert doctor.doctor_exit_code([ok, warn]) == 0
        assert render.doctor_names([ok, warn]) == ["workerregistration/a/b"]
        assert render.doctor_document([ok, warn], now=NOW)["checks"][1]["status"] == "WARN"

    def test_the_flag_bounds_it_and_nonsense_is_refused_before_any_request(self) -> None:
        option = next(p for p in doctor_command.params if p.name == "held_grace_seconds")
        assert option.default == held.HELD_GRACE_SECONDS == 600
        result = CliRunner().invoke(main, ["doctor", "--held-grace-seconds", "-1", "--kubeconfig", "/nonexistent"])
        assert result.exit_code == 2 and "--held-grace-seconds" in result.output


def alerts() -> dict[str, dict[str, Any]]:
    rule = yaml.safe_load((REPO / "manifests" / "components" / "monitoring" / "prometheusrule.yaml").read_text())
    return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"] if "alert" in r}


def minimal_findings() -> doctor.Findings:
    return doctor.Findings(
        crd=None,
        admission={},
        operator_lease=None,
        nodes=[],
        leases=[],
        world=plan.Unreadable(reason="x"),
        plan=plan.Unreadable(reason="x"),
        operator_deployments=[],
        cluster_wide=None,
        per_namespace={},
        policy=choice(),
        system_namespace=SYSTEM,
        expect_plan_only=False,
        attestation_grace_seconds=60,
        now=NOW,
    )


# --- -o name: object names as kubectl prints them, nothing else ------------------------------------

#: What `kubectl get -o name` prints: `kind[.group]/name`, in lower case, with no namespace.
KUBECTL_NAME = re.compile(r"[a-z]+(\.[a-z0-9-]+(\.[a-z0-9-]+)+)?/[a-z0-9][a-z0-9.:-]*")
GROUP_VAP = "admissionregistration.k8s.io"


def _decided(registrations: list[dict[str, Any]], **kwargs: Any) -> fingerprint.Plan:
    world = plan.build_world(listing(registrations, **kwargs))
    return fingerprint.decide_all(world=world, policy=Policy(), now=NOW)


def _failing_checks() -> list[Any]:
    lost = [worker("a", attested=False)]
    squat = worker(
        "squat", client_instance_id="inst-victim", attested=False, registered_by=SQUATTER, created_at=NOW - 10 * S
    )
    return [
        pytest.param(
            lambda: doctor.check_crd(None),
            [f"customresourcedefinition.apiextensions.k8s.io/{ad.CRD[1]}"],
            id="crd",
        ),
        pytest.param(
            lambda: doctor.check_admission_policies(admission=listed(without("ValidatingAdmissionPolicy", RECORDER))),
            [f"validatingadmissionpolicy.{GROUP_VAP}/{RECORDER}"],
            id="admission-policies",
        ),
        pytest.param(
            lambda: doctor.check_admission_content(
                admission=listed(without("ValidatingAdmissionPolicyBinding", RECORDER)),
                crd=SHIPPED_CRD,
                policy=choice(),
                system_namespace=SYSTEM,
            ),
            [f"validatingadmissionpolicybinding.{GROUP_VAP}/{RECORDER}"],
            id="admission-content",
        ),
        pytest.param(
            lambda: doctor.check_operator_alive(lease=None, system_namespace=SYSTEM, now=NOW),
            [f"lease.coordination.k8s.io/{api.OPERATOR_LEASE}"],
            id="operator-alive",
        ),
        pytest.param(
            lambda: doctor.check_retire_grant(
                cluster_wide=False, per_namespace={NAMESPACE: False}, expect_plan_only=False, system_namespace=SYSTEM
            ),
            ["serviceaccount/coroner-operator"],
            id="retire-grant-names-the-serviceaccount-not-its-user",
        ),
        pytest.param(
            lambda: doctor.check_retire_grant(
                cluster_wide=True,
                per_namespace={},
                expect_plan_only=True,
                system_namespace=SYSTEM,
                operator_lease=operator_lease("alice@example.com"),
            ),
            [],
            id="retire-grant-a-user-is-no-object",
        ),
        pytest.param(
            lambda: doctor.check_agents(nodes=[], leases=[], system_namespace=SYSTEM, now=NOW, plan=_decided(lost)),
            [f"node/{NODE}"],
            id="agents",
        ),
        pytest.param(
            lambda: doctor.check_node_loss(
                world=plan.build_world(listing(lost, leases=[EXPIRED], nodes=[])),
                plan=_decided(lost, leases=[EXPIRED], nodes=[]),
                policy=choice(),
                system_namespace=SYSTEM,
                now=NOW,
            ),
            [f"node/{NODE}", "workerregistration.coroner.dev/a"],
            id="node-loss",
        ),
        pytest.param(
            lambda: doctor.check_unattested(
                plan=_decided([worker("a", attested=False, created_at=NOW - HOUR)]), now=NOW, grace_seconds=60
            ),
            ["workerregistration.coroner.dev/a"],
            id="unattested",
        ),
        pytest.param(
            lambda: held_check([reused("reused", said=NOW - HOUR)]),
            ["workerregistration.coroner.dev/reused"],
            id="held",
        ),
        pytest.param(
            lambda: doctor.check_blocked(
                plan=_decided([worker("once", evidence="ProcAbsent", heartbeat=False)]), expect_plan_only=False
            ),
            ["workerregistration.coroner.dev/once"],
            id="blocked",
        ),
        pytest.param(
            lambda: doctor.check_squatting(plan=_decided([worker("victim"), squat])),
            ["workerregistration.coroner.dev/squat"],
            id="squatting",
        ),
    ]


class TestOutputName:
    """`doctor -o name` printed the operator's user name (retire-grant), `Lease NS/NAME` and
    `workerregistration/NS/NAME`: it prints object names only, as `kubectl get -o name` does."""

    @pytest.mark.parametrize(("build", "names"), _failing_checks())
    def test_every_check_names_objects_as_kubectl_does(self, build: Any, names: list[str]) -> None:
        check = build()
        assert check.status in (doctor.CheckStatus.FAIL, doctor.CheckStatus.WARN), check.summary
        printed = render.doctor_names([check])
        assert printed == names
        for line in printed:
            assert KUBECTL_NAME.fullmatch(line), line

    def test_the_command_prints_them_one_a_line(self) -> None:
        checks = [
            doctor.check_retire_grant(
                cluster_wide=False, per_namespace={NAMESPACE: False}, expect_plan_only=False, system_namespace=SYSTEM
            ),
            doctor.check_operator_alive(lease=None, system_namespace=SYSTEM, now=NOW),
        ]
        assert SHIPPED_USER in checks[0].objects  # -o wide and -o json still show whose grant it is
        assert render.doctor_names(checks) == [
            "serviceaccount/coroner-operator",
            f"lease.coordination.k8s.io/{api.OPERATOR_LEASE}",
        ]
