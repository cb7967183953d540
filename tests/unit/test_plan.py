"""The pure side of `kubectl coroner`: facts as the operator gathers them, fingerprints, replay, output.

Everything here is computed from raw objects shaped like the API returns them, at the fixed
instant `NOW`; the integration tests drive the same code through the real API server and kubectl.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import datetime
import functools
import io
import json
import pathlib
from typing import Any

import jsonpatch
import pytest
import urllib3
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.text import Text

from coroner.cli import doctor, options, plan, render, session
from coroner.cli.commands import completion
from coroner.cli.kubectl import main
from coroner.core import admission_digest, api, fingerprint, model, wire
from coroner.core.decision import Policy
from coroner.core.model import format_time
from coroner.core.reasons import ApplyAbort, Evidence, Reason
from unit.builders import BOOT, HOST, NAMESPACE, NODE, NODE_UID, NOW, OTHER_BOOT, cached, condition, make_registration

pytestmark = pytest.mark.unit

S = datetime.timedelta(seconds=1)
REPO = pathlib.Path(__file__).resolve().parents[2]


# --- raw objects as a LIST returns them ---------------------------------------------------------


def agent_lease(
    *,
    node: str = NODE,
    boot_id: str | None = BOOT,
    host_id: str | None = HOST,
    renewed_at: datetime.datetime = NOW - 5 * S,
    duration: int = 40,
    namespace: str = api.SYSTEM_NAMESPACE,
) -> dict[str, Any]:
    annotations = {}
    if boot_id is not None:
        annotations[api.AGENT_LEASE_BOOT_ID] = boot_id
    if host_id is not None:
        annotations[api.AGENT_LEASE_HOST_ID] = host_id
    return {
        "metadata": {"name": f"{api.AGENT_LEASE_PREFIX}{node}", "namespace": namespace, "annotations": annotations},
        "spec": {
            "holderIdentity": f"agent-{node}",
            "leaseDurationSeconds": duration,
            "renewTime": format_time(renewed_at, fraction=True),
        },
    }


def lease(
    *, name: str, namespace: str, holder: str, renewed_at: datetime.datetime = NOW, duration: int = 30
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration,
            "renewTime": format_time(renewed_at, fraction=True),
        },
    }


def node(*, name: str = NODE, boot_id: str | None = BOOT, ready: bool = True, uid: str = NODE_UID) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if boot_id is not None:
        status["nodeInfo"] = {"bootID": boot_id}
    return {"metadata": {"name": name, "uid": uid}, "status": status}


def worker(name: str, **kwargs: Any) -> dict[str, Any]:
    """A registration with its own identity (no conflicts with the others), retirable by default."""
    kwargs.setdefault("client_instance_id", f"inst-{name}")
    kwargs.setdefault("session_id", f"s-{name}")
    kwargs.setdefault("pid", 1000 + sum(map(ord, name)))
    return make_registration(name=name, **kwargs)


def listing(
    registrations: list[dict[str, Any]],
    *,
    leases: list[dict[str, Any]] | None = None,
    nodes: list[dict[str, Any]] | None = None,
    permission: bool | None = True,
) -> plan.Listing:
    namespaces = {r["metadata"]["namespace"] for r in registrations} or {NAMESPACE}
    return plan.Listing(
        registrations=cached(registrations),
        leases=[agent_lease()] if leases is None else leases,
        nodes=[node()] if nodes is None else nodes,
        retire_permission=dict.fromkeys(namespaces, permission),
    )


def planned(registrations: list[dict[str, Any]], *, now: datetime.datetime = NOW, **kwargs: Any) -> plan.Plan:
    return fingerprint.decide_all(world=plan.build_world(listing(registrations, **kwargs)), policy=Policy(), now=now)


def reasons(result: plan.Plan) -> dict[str, Reason]:
    return {entry.registration.name or "?": entry.decision.reason for entry in result.entries}


def retire(body: dict[str, Any], result: plan.Plan, *, by: str = "alice") -> dict[str, Any]:
    """Applies apply's own patch to `body` as the API server would (tests included)."""
    entry = next(e for e in result.entries if e.registration.name == body["metadata"]["name"])
    ops = functools.partial(wire.retirement_ops, writer=wire.Writer.PERSON)(
        body=body, registration=entry.registration, decision=entry.decision, retired_by=by, now=NOW
    )
    patched: dict[str, Any] = jsonpatch.apply_patch(body, ops)
    patched["metadata"]["resourceVersion"] = str(int(body["metadata"]["resourceVersion"]) + 1)
    return patched


# --- facts gathered the way the operator gathers them --------------------------------------------


class TestFacts:
    def test_dead_orphan_with_live_agent_and_the_grant_is_eligible(self) -> None:
        assert reasons(planned([worker("a")])) == {"a": Reason.ELIGIBLE_STALE_ORPHAN}

    @pytest.mark.parametrize(
        ("permission", "expected"),
        [
            pytest.param(False, Reason.RETIRE_PERMISSION_MISSING, id="denied"),
            pytest.param(None, Reason.RETIRE_PERMISSION_MISSING, id="unknown-is-not-granted"),
        ],
    )
    def test_without_the_callers_retire_verb_it_is_plan_only(self, permission: bool | None, expected: Reason) -> None:
        assert reasons(planned([worker("a")], permission=permission)) == {"a": expected}

    def test_terminal_registrations_show_already_terminal(self) -> None:
        released = worker("gone", conditions=[condition("Released", "True", "CleanExit")])
        assert reasons(planned([released])) == {"gone": Reason.ALREADY_TERMINAL}

    def test_agent_leases_come_only_from_the_system_namespace(self) -> None:
        elsewhere = agent_lease(namespace="jobs")
        assert reasons(planned([worker("a")], leases=[elsewhere])) == {"a": Reason.AGENT_UNAVAILABLE}

    def test_a_protecting_lease_in_the_namespace_preserves(self) -> None:
        held = lease(name="lock", namespace=NAMESPACE, holder="a")
        assert reasons(planned([worker("a")], leases=[agent_lease(), held])) == {"a": Reason.PROTECTED_LEASE_HOLDER}

    def test_the_node_boot_id_is_cross_checked_with_the_agent(self) -> None:
        result = planned([worker("a")], nodes=[node(boot_id=OTHER_BOOT)])
        assert reasons(result) == {"a": Reason.BOOT_IDENTITY_UNKNOWN}

    def test_a_node_absent_from_the_list_is_not_seen_not_deleted(self) -> None:
        unattested = worker("a", attested=False)
        world = plan.build_world(listing([unattested], nodes=[]))
        assert world.nodes_synced
        policy = Policy(node_deletion_evidence=True)
        result = fingerprint.decide_all(world=world, policy=policy, now=NOW)
        assert reasons(result) == {"a": Reason.ATTESTATION_MISSING}

    @pytest.mark.parametrize(
        ("quarantine", "expected"),
        [
            pytest.param(0.0, Reason.ELIGIBLE_STALE_ORPHAN, id="a-human-states-it-gone-for-good"),
            pytest.param(300.0, Reason.AGENT_UNAVAILABLE, id="the-quarantine-counts-from-the-live-get"),
        ],
    )
    def test_a_node_a_live_get_found_gone_is_deleted_from_then(self, quarantine: float, expected: Reason) -> None:
        # The human path after an abrupt node loss: the Alive its dead agent wrote is no bar.
        lost = worker("a", verdict="Alive", evidence="PidfdPinned")
        expired = agent_lease(renewed_at=NOW - 600 * S)
        world = plan.build_world(
            dataclasses.replace(listing([lost], nodes=[], leases=[expired]), nodes_gone={NODE: NOW})
        )
        policy = Policy(node_deletion_evidence=True, node_deletion_quarantine_seconds=quarantine)
        result = fingerprint.decide_all(world=world, policy=policy, now=NOW)
        assert reasons(result) == {"a": expected}
        if expected is Reason.ELIGIBLE_STALE_ORPHAN:
            assert result.entries[0].decision.death_evidence is Evidence.NODE_DELETED

    def test_peers_within_the_namespace_conflict(self) -> None:
        live = worker("b", verdict="Alive", evidence="PidfdPinned", client_instance_id="inst-a")
        result = planned([worker("a"), live])
        assert reasons(result)["a"] == Reason.CLIENT_INSTANCE_CONFLICT

    def test_the_retire_permission_is_per_namespace(self) -> None:
        ops = worker("a", namespace="ops")
        facts = plan.Listing(
            registrations=cached([worker("a"), ops]),
            leases=[agent_lease()],
            nodes=[node()],
            retire_permission={NAMESPACE: True, "ops": False},
        )
        result = fingerprint.decide_all(world=plan.build_world(facts), policy=Policy(), now=NOW)
        by_key = {model.key_of(e.registration): e.decision.reason for e in result.entries}
        assert by_key == {
            (NAMESPACE, "a"): Reason.ELIGIBLE_STALE_ORPHAN,
            ("ops", "a"): Reason.RETIRE_PERMISSION_MISSING,
        }


class TestCounts:
    def test_every_reason_is_counted_zero_included(self) -> None:
        result = planned(
            [worker("a"), worker("b", attested=False), worker("c", verdict="Alive", evidence="PidfdPinned")]
        )
        assert set(result.counts) == set(Reason)
        assert sum(result.counts.values()) == len(result.entries) == 3
        assert result.counts[Reason.ELIGIBLE_STALE_ORPHAN] == 1
        assert result.counts[Reason.ATTESTATION_MISSING] == 1
        assert result.counts[Reason.PID_ALIVE] == 1
        assert result.counts[Reason.PID_REUSE_DETECTED] == 0

    def test_entries_are_in_namespace_then_name_order(self) -> None:
        result = planned([worker("b"), worker("a", namespace="zz"), worker("a")])
        assert [model.key_of(e.registration) for e in result.entries] == [
            (NAMESPACE, "a"),
            (NAMESPACE, "b"),
            ("zz", "a"),
        ]


# --- fingerprints -------------------------------------------------------------------------------


class TestFingerprintStability:
    def live(self, *, heartbeat: datetime.datetime, rv: str = "1001") -> dict[str, Any]:
        """A live worker: the agent attests it Alive, and it heartbeats."""
        body = worker("live", verdict="Alive", evidence="PidfdPinned", heartbeat_at=heartbeat)
        body["metadata"]["resourceVersion"] = rv
        return body

    def test_a_heartbeat_moves_neither_fingerprint(self) -> None:
        before = planned([worker("a"), self.live(heartbeat=NOW - 5 * S)])
        # The worker heartbeats again (new lastHeartbeatTime, new resourceVersion) and time passes.
        after = planned([worker("a"), self.live(heartbeat=NOW + 5 * S, rv="1002")], now=NOW + 6 * S)
        assert reasons(after) == reasons(before)
        assert after.registry_fingerprint == before.registry_fingerprint
        assert after.candidate_fingerprint == before.candidate_fingerprint

    def test_an_agent_lease_renewal_moves_neither_fingerprint(self) -> None:
        before = planned([worker("a")], leases=[agent_lease(renewed_at=NOW - 5 * S)])
        after = planned([worker("a")], leases=[agent_lease(renewed_at=NOW)])
        assert (after.registry_fingerprint, after.candidate_fingerprint) == (
            before.registry_fingerprint,
            before.candidate_fingerprint,
        )

    def test_list_order_does_not_matter(self) -> None:
        bodies = [worker("a"), worker("b"), worker("c", attested=False)]
        assert planned(bodies).registry_fingerprint == planned(list(reversed(bodies))).registry_fingerprint

    def test_a_new_registration_moves_the_registry_but_not_the_candidates(self) -> None:
        before = planned([worker("a")])
        after = planned([worker("a"), worker("b", attested=False)])
        assert after.registry_fingerprint != before.registry_fingerprint
        assert after.candidate_fingerprint == before.candidate_fingerprint

    def test_a_new_candidate_moves_both(self) -> None:
        before = planned([worker("a")])
        after = planned([worker("a"), worker("b")])
        assert after.registry_fingerprint != before.registry_fingerprint
        assert after.candidate_fingerprint != before.candidate_fingerprint

    def test_fingerprint_shape(self) -> None:
        result = planned([worker("a")])
        assert plan.valid_fingerprint(result.registry_fingerprint)
        assert not plan.valid_fingerprint("v1:sha256:abc")
        assert not plan.valid_fingerprint(result.registry_fingerprint.upper())


# --- apply: assessment and replay ---------------------------------------------------------------


def assess(result: plan.Plan, approved: plan.Plan, *names: str, namespace: str = NAMESPACE) -> plan.ApplyAssessment:
    return plan.assess_apply(
        plan=result,
        names=[(namespace, name) for name in names],
        registry_fingerprint=approved.registry_fingerprint,
        candidate_fingerprint=approved.candidate_fingerprint,
    )


class TestApplyAssessment:
    def test_an_unchanged_cluster_retires_the_named_candidates(self) -> None:
        approved = planned([worker("a"), worker("b"), worker("c", attested=False)])
        again = planned([worker("a"), worker("b"), worker("c", attested=False)], now=NOW + 3 * S)
        assessment = assess(again, approved, "a")
        assert assessment.abort is None and not assessment.refusals
        assert [e.registration.name for e in assessment.to_retire] == ["a"]

    def test_a_new_registration_aborts_registry_moved(self) -> None:
        approved = planned([worker("a")])
        assessment = assess(planned([worker("a"), worker("new", attested=False)]), approved, "a")
        assert assessment.abort == ApplyAbort.REGISTRY_MOVED
        assert "RegistryMoved" in assessment.abort_detail and "Nothing was changed" in assessment.abort_detail

    def test_a_new_candidate_aborts_candidate_set_moved(self) -> None:
        approved = planned([worker("a"), worker("b", attested=False)])
        assessment = assess(planned([worker("a"), worker("b")]), approved, "a")
        assert assessment.abort == ApplyAbort.CANDIDATE_SET_MOVED

    def test_a_fingerprint_from_another_cluster_aborts(self) -> None:
        elsewhere = planned([worker("a", uid="uid-of-another-cluster")])
        assessment = assess(planned([worker("a")]), elsewhere, "a")
        assert assessment.abort == ApplyAbort.CANDIDATE_SET_MOVED
        assert "another cluster" in assessment.abort_detail

    def test_unknown_and_ineligible_names_are_refused_one_sentence_each(self) -> None:
        approved = planned([worker("a"), worker("alive", verdict="Alive", evidence="PidfdPinned")])
        assessment = assess(approved, approved, "a", "typo", "alive")
        assert assessment.abort is None
        assert assessment.unknown == ((NAMESPACE, "typo"),)
        assert [e.registration.name for e in assessment.not_candidates] == ["alive"]
        refusals = assessment.refusals
        assert len(refusals) == 2
        assert refusals[0].startswith(f"WorkerRegistration {NAMESPACE}/typo does not exist")
        assert f"{NAMESPACE}/alive is not a retirement candidate (PidAlive)" in refusals[1]

    def test_a_name_given_twice_is_one_row(self) -> None:
        approved = planned([worker("a")])
        assert len(assess(approved, approved, "a", "a").to_retire) == 1


class TestReplay:
    def test_replaying_a_successful_apply_is_already_retired_and_not_drift(self) -> None:
        bodies = [worker("a"), worker("b"), worker("c", attested=False)]
        approved = planned(bodies)
        after = planned([retire(bodies[0], approved), bodies[1], bodies[2]], now=NOW + 10 * S)
        # The retirement did move the raw fingerprints: a is AlreadyTerminal now.
        assert reasons(after)["a"] == Reason.ALREADY_TERMINAL
        assert after.registry_fingerprint != approved.registry_fingerprint
        assessment = assess(after, approved, "a")
        assert assessment.abort is None, assessment.abort_detail
        assert [e.registration.name for e in assessment.already_retired] == ["a"]
        assert not assessment.to_retire and not assessment.refusals
        assert assessment.registry_fingerprint == approved.registry_fingerprint

    def test_a_partial_replay_retires_the_rest(self) -> None:
        bodies = [worker("a"), worker("b")]
        approved = planned(bodies)
        after = planned([retire(bodies[0], approved), bodies[1]])
        assessment = assess(after, approved, "a", "b")
        assert assessment.abort is None
        assert [e.registration.name for e in assessment.already_retired] == ["a"]
        assert [e.registration.name for e in assessment.to_retire] == ["b"]

    def test_an_unnamed_candidate_retired_meanwhile_is_drift(self) -> None:
        bodies = [worker("a"), worker("b")]
        approved = planned(bodies)
        after = planned([bodies[0], retire(bodies[1], approved, by="operator")])
        assert assess(after, approved, "a").abort == ApplyAbort.CANDIDATE_SET_MOVED

    def test_retiring_a_plan_in_several_runs_names_the_earlier_rows(self) -> None:
        bodies = [worker("a"), worker("b")]
        approved = planned(bodies)
        after = planned([retire(bodies[0], approved), bodies[1]])
        second_run = assess(after, approved, "b")
        assert second_run.abort == ApplyAbort.CANDIDATE_SET_MOVED
        assert f"the retirement, as planned, of {NAMESPACE}/a; name those too (a) to replay" in second_run.abort_detail
        named = assess(after, approved, "a", "b")
        assert named.abort is None and [e.registration.name for e in named.to_retire] == ["b"]

    def test_no_hint_when_something_else_moved_too(self) -> None:
        bodies = [worker("a"), worker("b")]
        approved = planned(bodies)
        after = planned([retire(bodies[0], approved), bodies[1], worker("c", attested=False)])
        assessment = assess(after, approved, "b")
        assert assessment.abort == ApplyAbort.CANDIDATE_SET_MOVED and "name them too" not in assessment.abort_detail

    def test_a_retirement_with_other_evidence_is_drift(self) -> None:
        bodies = [worker("a")]
        approved = planned(bodies)
        retired = retire(bodies[0], approved)
        retired["status"]["retirement"]["reason"] = "NodeOutOfService"
        assert assess(planned([retired]), approved, "a").abort == ApplyAbort.CANDIDATE_SET_MOVED

    def test_a_released_row_is_not_a_replay(self) -> None:
        approved = planned([worker("a")])
        released = worker("a", conditions=[condition("Released", "True", "CleanExit")])
        assessment = assess(planned([released]), approved, "a")
        assert assessment.abort == ApplyAbort.CANDIDATE_SET_MOVED
        assert not assessment.already_retired


# --- the retirement patch -----------------------------------------------------------------------


class TestRetirementPatch:
    def patch(self, body: dict[str, Any], *, by: str = "alice") -> list[dict[str, Any]]:
        result = planned([body])
        entry = result.entries[0]
        return functools.partial(wire.retirement_ops, writer=wire.Writer.PERSON)(
            body=body, registration=entry.registration, decision=entry.decision, retired_by=by, now=NOW
        )

    def test_shape_is_the_operators_compare_and_swap(self) -> None:
        body = worker("a")
        ops = self.patch(body)
        assert [(op["op"], op["path"]) for op in ops] == [
            ("test", "/metadata/resourceVersion"),
            ("test", "/status/attestation"),
            ("add", "/status/conditions"),
            ("add", "/status/retirement"),
            ("add", "/status/state"),
        ]
        assert ops[-1]["value"] == "Retired"
        assert ops[0]["value"] == "1001"
        assert ops[1]["value"] == body["status"]["attestation"]
        retirement = ops[3]["value"]
        assert retirement == {
            "retiredTime": format_time(NOW, fraction=True),
            "retiredBy": "alice",
            "reason": "PidfdExited",
            "decision": "EligibleStaleOrphan",
            "attestation": body["status"]["attestation"],
        }
        (retired,) = ops[2]["value"]
        assert retired["type"] == "Retired" and retired["status"] == "True" and retired["reason"] == "PidfdExited"
        assert retired["observedGeneration"] == 1 and "alice" in retired["message"]

    def test_attested_and_retirable_are_written_back_verbatim(self) -> None:
        # Stored exactly as the operator wrote them, including a field apply's renderer would drop.
        attested = {**condition("Attested", "True", "Dead"), "extra": "kept"}
        retirable = condition("Retirable", "False", "RetirePermissionMissing")
        active = condition("Retired", "False", "Active")
        ops = self.patch(worker("a", conditions=[attested, retirable, active]))
        written = ops[2]["value"]
        assert written[0] == attested and written[1] == retirable
        assert written[2]["type"] == "Retired" and written[2]["status"] == "True"
        assert written[2]["lastTransitionTime"] == format_time(NOW)
        assert len(written) == 3

    def test_a_registration_without_status_gets_one(self) -> None:
        body = worker("a", attested=False, paths={"spec.nodeName": NODE})
        body.pop("status")
        result = planned(
            [body], nodes=[{**node(), "spec": {"taints": [{"key": "node.kubernetes.io/out-of-service"}]}}], leases=[]
        )
        entry = result.entries[0]
        assert entry.decision.reason == Reason.ELIGIBLE_STALE_ORPHAN, entry.decision.detail
        ops = functools.partial(wire.retirement_ops, writer=wire.Writer.PERSON)(
            body=body, registration=entry.registration, decision=entry.decision, retired_by="alice", now=NOW
        )
        assert [(op["op"], op["path"]) for op in ops] == [("test", "/metadata/resourceVersion"), ("add", "/status")]
        assert ops[1]["value"]["retirement"]["reason"] == "NodeOutOfService"
        assert "attestation" not in ops[1]["value"]["retirement"]

    def test_the_patch_applies_and_its_tests_guard_the_read(self) -> None:
        body = worker("a")
        ops = self.patch(body)
        jsonpatch.apply_patch(body, ops)  # applies cleanly to what was read
        moved = copy.deepcopy(body)
        moved["metadata"]["resourceVersion"] = "1002"
        with pytest.raises(jsonpatch.JsonPatchTestFailed):
            jsonpatch.apply_patch(moved, ops)
        reattested = copy.deepcopy(body)
        reattested["status"]["attestation"]["observedTime"] = format_time(NOW, fraction=True)
        with pytest.raises(jsonpatch.JsonPatchTestFailed):
            jsonpatch.apply_patch(reattested, ops)

    def test_a_preserved_registration_has_no_patch(self) -> None:
        body = worker("a", verdict="Alive", evidence="PidfdPinned")
        with pytest.raises(ValueError, match="PidAlive"):
            self.patch(body)


class TestExitCodes:
    def row(self, outcome: plan.RowOutcome) -> plan.RowResult:
        return plan.RowResult(key=(NAMESPACE, outcome.value), outcome=outcome, detail="")

    @pytest.mark.parametrize(
        ("outcomes", "code"),
        [
            pytest.param([plan.RowOutcome.RETIRED, plan.RowOutcome.ALREADY_RETIRED], 0, id="done"),
            pytest.param([plan.RowOutcome.WOULD_RETIRE], 0, id="preview"),
            pytest.param([plan.RowOutcome.RETIRED, plan.RowOutcome.RETIRE_CONFLICT], 3, id="moved"),
            pytest.param([plan.RowOutcome.RETIRE_ABANDONED], 3, id="fence"),
            pytest.param([plan.RowOutcome.RETIRE_PERMISSION_MISSING], 2, id="refused"),
            pytest.param([plan.RowOutcome.RETIRE_FAILED, plan.RowOutcome.RETIRE_CONFLICT], 3, id="moved-wins"),
        ],
    )
    def test_apply(self, outcomes: list[plan.RowOutcome], code: int) -> None:
        assert plan.apply_exit_code([self.row(o) for o in outcomes]) == code


# --- output -------------------------------------------------------------------------------------


def rendered(draw: Any) -> str:
    buffer = io.StringIO()
    draw(Console(file=buffer, width=250, color_system=None))
    return buffer.getvalue()


class TestOutput:
    def test_table_shows_every_row_counts_fingerprints_and_the_apply_line(self) -> None:
        result = planned([worker("a"), worker("b", attested=False)])
        text = rendered(
            lambda c: render.render_plan(result, console=c, namespace=NAMESPACE, retire_permission={NAMESPACE: True})
        )
        assert "EligibleStaleOrphan" in text and "AttestationMissing" in text
        assert "Counts (2 total): EligibleStaleOrphan 1, AttestationMissing 1" in text
        assert f"registryFingerprint:  {result.registry_fingerprint}" in text
        assert f"candidateFingerprint: {result.candidate_fingerprint}" in text
        assert (
            f"kubectl coroner apply -n {NAMESPACE} --registry-fingerprint {result.registry_fingerprint} "
            f"--candidate-fingerprint {result.candidate_fingerprint} a"
        ) in text
        assert "NAMESPACE" not in text.split("Counts")[0]

    def test_all_namespaces_table_names_namespaces_and_apply_uses_namespace_slash_name(self) -> None:
        result = planned([worker("a"), worker("a", namespace="ops")])
        text = rendered(lambda c: render.render_plan(result, console=c, namespace=None, retire_permission={}))
        assert "NAMESPACE" in text
        assert "kubectl coroner apply -A " in text and f" {NAMESPACE}/a ops/a" in text

    def test_missing_permission_is_explained(self) -> None:
        result = planned([worker("a")], permission=False)
        text = rendered(
            lambda c: render.render_plan(result, console=c, namespace=NAMESPACE, retire_permission={NAMESPACE: False})
        )
        assert "do not hold the retire verb" in text and "No retirement candidates." in text

    def test_markup_in_object_text_is_printed_not_interpreted(self) -> None:
        result = planned([worker("a", client_instance_id="[bold]x[/bold]")])
        text = rendered(lambda c: render.render_plan(result, console=c, namespace=NAMESPACE, retire_permission={}))
        assert "'[bold]x[/bold]'" in text

    def test_empty_registry(self) -> None:
        result = planned([])
        text = rendered(lambda c: render.render_plan(result, console=c, namespace=NAMESPACE, retire_permission={}))
        assert f"No WorkerRegistrations in namespace {NAMESPACE}." in text and "Counts (0 total): none" in text

    @pytest.mark.parametrize("output", ["json", "yaml"])
    def test_machine_output_round_trips(self, output: str) -> None:
        result = planned([worker("a"), worker("b", attested=False)])
        document = render.plan_document(result, namespace=NAMESPACE, now=NOW, retire_permission={NAMESPACE: True})
        text = render.dump(document, output=output)
        loaded = json.loads(text) if output == "json" else yaml.safe_load(text)
        assert loaded["registryFingerprint"] == result.registry_fingerprint
        assert loaded["candidateFingerprint"] == result.candidate_fingerprint
        assert loaded["counts"]["EligibleStaleOrphan"] == 1 and loaded["counts"]["PidReuseDetected"] == 0
        assert loaded["candidates"] == [f"{NAMESPACE}/a"]
        rows = {row["name"]: row for row in loaded["registrations"]}
        assert rows["a"]["reason"] == "EligibleStaleOrphan" and rows["a"]["retirable"] is True
        assert (
            rows["a"]["deathEvidence"] == "PidfdExited" and rows["a"]["pid"] == rows["a"]["facts"]["incarnation"]["pid"]
        )
        assert rows["b"]["reason"] == "AttestationMissing" and rows["b"]["detail"]

    def test_apply_table(self) -> None:
        results = [
            plan.RowResult(
                key=(NAMESPACE, "a"), outcome=plan.RowOutcome.WOULD_RETIRE, detail="dead", node_name=NODE, pid=7
            )
        ]
        text = rendered(lambda c: render.render_apply(results=results, console=c, preview=True, retired_by=None))
        assert "preview (nothing written)" in text and "WouldRetire" in text and "--yes" in text

    def test_doctor_table_and_json(self) -> None:
        checks = [
            doctor.Check(name="crd", status=doctor.CheckStatus.PASS, summary="fine"),
            doctor.Check(name="agents", status=doctor.CheckStatus.FAIL, summary="node/x", objects=("node/x",)),
        ]
        text = rendered(lambda c: render.render_doctor(checks, console=c))
        assert "crd" in text and "FAIL" in text
        document = json.loads(render.dump(render.doctor_document(checks, now=NOW), output="json"))
        assert document["healthy"] is False
        assert document["checks"][1] == {
            "name": "agents",
            "status": "FAIL",
            "summary": "node/x",
            "objects": ["node/x"],
            "facts": {},
        }


# --- doctor checks ------------------------------------------------------------------------------


def crd(*, established: str | None = "True", versions: tuple[str, ...] = (api.VERSION,)) -> dict[str, Any]:
    conditions = [] if established is None else [{"type": "Established", "status": established}]
    return {
        "metadata": {"name": api.CRD_NAME},
        "spec": {"versions": [{"name": v, "served": True} for v in versions]},
        "status": {"conditions": conditions},
    }


def operator_lease(*, renewed_at: datetime.datetime = NOW - 10 * S, sweep: object = None) -> dict[str, Any]:
    body = lease(
        name=plan.OPERATOR_LEASE, namespace=api.SYSTEM_NAMESPACE, holder="op", renewed_at=renewed_at, duration=180
    )
    if sweep is not None:
        body["metadata"]["annotations"] = {
            doctor.LAST_SWEEP_ANNOTATION: sweep if isinstance(sweep, str) else json.dumps(sweep)
        }
    return body


class TestDoctorChecks:
    def test_crd(self) -> None:
        assert doctor.check_crd(crd()).status == doctor.CheckStatus.PASS
        missing = doctor.check_crd(None)
        assert missing.status == doctor.CheckStatus.FAIL and "not installed" in missing.summary
        assert missing.objects == (f"CustomResourceDefinition/{api.CRD_NAME}",)
        assert doctor.check_crd(crd(established="False")).status == doctor.CheckStatus.FAIL
        assert doctor.check_crd(crd(versions=("v1beta9",))).status == doctor.CheckStatus.FAIL
        assert doctor.check_crd(plan.Unreadable(reason="forbidden")).status == doctor.CheckStatus.UNKNOWN

    def test_admission_policy_names_are_the_manifests(self) -> None:
        manifest = REPO / "manifests" / "base" / "admission-policies.yaml"
        documents = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
        policies = {d["metadata"]["name"] for d in documents if d["kind"] == "ValidatingAdmissionPolicy"}
        bound = {d["spec"]["policyName"] for d in documents if d["kind"] == "ValidatingAdmissionPolicyBinding"}
        assert set(doctor.ADMISSION_POLICIES) == policies == bound
        check = doctor.check_admission_policies(
            admission={
                kind: [d for d in documents if d["kind"] == kind]
                for kind in (*admission_digest.KINDS, *doctor.LEFTOVER_KINDS)
            }
        )
        assert check.status == doctor.CheckStatus.PASS, check.summary

    def test_a_missing_or_warn_only_binding_fails_by_name(self) -> None:
        policies = [{"metadata": {"name": n}} for n in doctor.ADMISSION_POLICIES]
        bindings = [
            {"metadata": {"name": n}, "spec": {"policyName": n, "validationActions": ["Deny"]}}
            for n in doctor.ADMISSION_POLICIES[1:]
        ]
        bindings[0]["spec"]["validationActions"] = ["Warn"]
        check = doctor.check_admission_policies(
            admission={
                "ValidatingAdmissionPolicy": policies[1:],
                "ValidatingAdmissionPolicyBinding": bindings,
                "MutatingAdmissionPolicy": [],
                "MutatingAdmissionPolicyBinding": [],
            }
        )
        assert check.status == doctor.CheckStatus.FAIL
        first, second = doctor.ADMISSION_POLICIES[0], doctor.ADMISSION_POLICIES[1]
        assert check.objects == (
            f"ValidatingAdmissionPolicy/{first}",
            f"ValidatingAdmissionPolicyBinding/{first}",
            f"ValidatingAdmissionPolicyBinding/{second}",
        )
        assert (
            doctor.check_admission_policies(
                admission={
                    kind: plan.Unreadable(reason="x") if kind == "ValidatingAdmissionPolicy" else []
                    for kind in (*admission_digest.KINDS, *doctor.LEFTOVER_KINDS)
                }
            ).status
            == doctor.CheckStatus.UNKNOWN
        )

    def test_operator_alive(self) -> None:
        system = api.SYSTEM_NAMESPACE
        alive = doctor.check_operator_alive(lease=operator_lease(), system_namespace=system, now=NOW)
        assert alive.status == doctor.CheckStatus.PASS
        expired = doctor.check_operator_alive(
            lease=operator_lease(renewed_at=NOW - 181 * S), system_namespace=system, now=NOW
        )
        assert expired.status == doctor.CheckStatus.FAIL and "expired at" in expired.summary
        absent = doctor.check_operator_alive(lease=None, system_namespace=system, now=NOW)
        assert absent.status == doctor.CheckStatus.FAIL and absent.objects == (f"Lease {system}/coroner-operator",)
        forbidden = doctor.check_operator_alive(lease=plan.Unreadable(reason="no"), system_namespace=system, now=NOW)
        assert forbidden.status == doctor.CheckStatus.UNKNOWN

    @pytest.mark.parametrize(
        "body",
        [
            pytest.param(None, id="no-lease"),
            pytest.param(operator_lease(), id="no-annotation"),
            pytest.param(operator_lease(sweep="{not json"), id="garbled"),
            pytest.param(operator_lease(sweep={"time": "x"}), id="no-failures-field"),
        ],
    )
    def test_a_sweep_never_recorded_is_unknown_never_zero(self, body: dict[str, Any] | None) -> None:
        check = doctor.check_last_sweep(lease=body, system_namespace=api.SYSTEM_NAMESPACE)
        assert check.status == doctor.CheckStatus.UNKNOWN
        assert "0" not in check.summary.replace(api.SYSTEM_NAMESPACE, "")
        assert "failures" not in check.facts

    def test_last_sweep_failures_are_named_per_namespace(self) -> None:
        sweep = {
            "time": "2026-11-30T18:00:00Z",
            "registrations": 12,
            "failures": {"jobs": 2, "ok": 0},
            "errors": {"jobs": "500 Internal Server Error: etcd"},
        }
        check = doctor.check_last_sweep(lease=operator_lease(sweep=sweep), system_namespace=api.SYSTEM_NAMESPACE)
        assert check.status == doctor.CheckStatus.FAIL
        assert (
            check.objects == ("namespace/jobs",) and "jobs: 2 failed (500 Internal Server Error: etcd)" in check.summary
        )
        clean = {**sweep, "failures": {"ok": 0}, "errors": {}}
        passed = doctor.check_last_sweep(lease=operator_lease(sweep=clean), system_namespace=api.SYSTEM_NAMESPACE)
        assert passed.status == doctor.CheckStatus.PASS and "12 registrations" in passed.summary

    @pytest.mark.parametrize(
        ("cluster_wide", "per_namespace", "plan_only", "status"),
        [
            pytest.param(True, {}, False, doctor.CheckStatus.PASS, id="granted"),
            pytest.param(False, {"jobs": True}, False, doctor.CheckStatus.PASS, id="granted-per-namespace"),
            pytest.param(False, {"jobs": True, "ops": False}, False, doctor.CheckStatus.FAIL, id="partly"),
            pytest.param(False, {}, False, doctor.CheckStatus.FAIL, id="plan-only"),
            pytest.param(False, {}, True, doctor.CheckStatus.PASS, id="plan-only-expected"),
            pytest.param(True, {}, True, doctor.CheckStatus.FAIL, id="granted-but-plan-only-expected"),
            pytest.param(None, {}, False, doctor.CheckStatus.UNKNOWN, id="cannot-review"),
            pytest.param(False, {"jobs": None}, False, doctor.CheckStatus.UNKNOWN, id="cannot-review-namespace"),
        ],
    )
    def test_retire_grant(
        self,
        cluster_wide: bool | None,
        per_namespace: dict[str, bool | None],
        plan_only: bool,
        status: doctor.CheckStatus,
    ) -> None:
        check = doctor.check_retire_grant(
            cluster_wide=cluster_wide,
            per_namespace=per_namespace,
            expect_plan_only=plan_only,
            system_namespace=api.SYSTEM_NAMESPACE,
        )
        assert check.status == status, check.summary
        if status == doctor.CheckStatus.FAIL:
            assert check.objects == ("system:serviceaccount:coroner-system:coroner-operator",)

    def test_agents(self) -> None:
        nodes = [
            node(name="healthy"),
            node(name="no-agent"),
            node(name="stale"),
            node(name="rebooted", boot_id=OTHER_BOOT),
            node(name="silent-boot"),
            node(name="unpublished", boot_id=None),
            node(name="not-ready", ready=False),
        ]
        leases = [
            agent_lease(node="healthy"),
            agent_lease(node="stale", renewed_at=NOW - 41 * S),
            agent_lease(node="rebooted"),
            agent_lease(node="silent-boot", boot_id=None),
            agent_lease(node="unpublished"),
        ]
        check = doctor.check_agents(nodes=nodes, leases=leases, system_namespace=api.SYSTEM_NAMESPACE, now=NOW)
        assert check.status == doctor.CheckStatus.FAIL
        assert check.objects == ("node/no-agent", "node/rebooted", "node/silent-boot", "node/stale")
        assert f"agent boot id {BOOT} differs from the Node's bootID {OTHER_BOOT}" in check.summary
        fixed = [
            agent_lease(node=n["metadata"]["name"], boot_id=(n["status"].get("nodeInfo") or {}).get("bootID", BOOT))
            for n in nodes
        ]
        clean = doctor.check_agents(
            nodes=nodes, leases=fixed, system_namespace=api.SYSTEM_NAMESPACE, now=NOW, plan=planned([])
        )
        assert clean.status == doctor.CheckStatus.PASS
        # Without the registrations, the nodes holding them are unknown: not a pass.
        unknown = doctor.check_agents(nodes=nodes, leases=fixed, system_namespace=api.SYSTEM_NAMESPACE, now=NOW)
        assert unknown.status == doctor.CheckStatus.UNKNOWN
        assert (
            doctor.check_agents(
                nodes=plan.Unreadable(reason="no"), leases=[], system_namespace=api.SYSTEM_NAMESPACE, now=NOW
            ).status
            == doctor.CheckStatus.UNKNOWN
        )

    def test_unattested_after_the_grace_period(self) -> None:
        fresh = worker("fresh", attested=False, created_at=NOW - 10 * S, heartbeat_at=None)
        stuck = worker("stuck", attested=False, created_at=NOW - 600 * S)
        result = planned([fresh, stuck, worker("fine")])
        check = doctor.check_unattested(plan=result, now=NOW, grace_seconds=60)
        assert check.status == doctor.CheckStatus.FAIL
        assert check.objects == (f"workerregistration/{NAMESPACE}/stuck",) and check.facts["count"] == 1
        assert doctor.check_unattested(plan=planned([worker("fine")]), now=NOW, grace_seconds=60).status == (
            doctor.CheckStatus.PASS
        )
        unknown = doctor.check_unattested(plan=plan.Unreadable(reason="forbidden"), now=NOW, grace_seconds=60)
        assert unknown.status == doctor.CheckStatus.UNKNOWN and "count" not in unknown.facts

    def test_blocked_are_dead_but_preserved_for_a_fixable_cause(self) -> None:
        result = planned(
            [
                worker("waiting-for-ttl", evidence="ProcAbsent", heartbeat_at=NOW - 2 * S),
                worker("alive", verdict="Alive", evidence="PidfdPinned"),
                worker("held"),
            ],
            leases=[agent_lease(), lease(name="lock", namespace=NAMESPACE, holder="held")],
            permission=False,
        )
        assert reasons(result) == {
            "waiting-for-ttl": Reason.HEARTBEAT_NOT_EXPIRED,
            "alive": Reason.PID_ALIVE,
            "held": Reason.PROTECTED_LEASE_HOLDER,
        }
        check = doctor.check_blocked(plan=result, expect_plan_only=False)
        assert check.status == doctor.CheckStatus.FAIL and check.objects == (f"workerregistration/{NAMESPACE}/held",)

    def test_blocked_by_the_grant_is_expected_only_when_plan_only_is(self) -> None:
        result = planned([worker("a")], permission=False)
        assert doctor.check_blocked(plan=result, expect_plan_only=False).status == doctor.CheckStatus.FAIL
        assert doctor.check_blocked(plan=result, expect_plan_only=True).status == doctor.CheckStatus.PASS
        unknown = doctor.check_blocked(plan=result, expect_plan_only=False, permission_known=False)
        assert unknown.status == doctor.CheckStatus.UNKNOWN

    def test_exit_code(self) -> None:
        def check(status: doctor.CheckStatus) -> plan.Check:
            return doctor.Check(name="x", status=status, summary="")

        assert doctor.doctor_exit_code([check(doctor.CheckStatus.PASS), check(doctor.CheckStatus.UNKNOWN)]) == 0
        assert doctor.doctor_exit_code([check(doctor.CheckStatus.PASS), check(doctor.CheckStatus.FAIL)]) == 1


# --- the command line, before any request -------------------------------------------------------


class TestUsage:
    FP = "v1:sha256:" + "0" * 64

    def run(self, *args: str) -> Any:
        return CliRunner().invoke(main, list(args))

    def test_a_malformed_fingerprint_is_one_sentence_and_exit_2(self) -> None:
        result = self.run("apply", "--registry-fingerprint", "abc", "--candidate-fingerprint", self.FP, "-n", "x", "a")
        assert result.exit_code == 2
        assert result.output.strip().count("\n") == 0
        assert "--registry-fingerprint 'abc' is not a Coroner fingerprint" in result.output

    @pytest.mark.parametrize("value", ["-1", "nan", "soon"])
    def test_a_bad_quarantine_is_a_usage_error_before_any_request(self, value: str) -> None:
        result = self.run("plan", "-n", "x", "--node-quarantine-seconds", value, "--kubeconfig", "/nonexistent")
        assert result.exit_code == 2 and "Traceback" not in result.output
        assert "--node-quarantine-seconds" in result.output and "kubeconfig" not in result.output

    def test_the_cycle_collector_is_off_during_a_command_and_back_after(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import gc

        seen: list[bool] = []

        def connect(*args: Any, **kwargs: Any) -> None:
            seen.append(gc.isenabled())
            raise session.PluginError("stop here")

        monkeypatch.setattr(session.Session, "__init__", connect)
        assert gc.isenabled()
        result = self.run("plan", "-n", "x")
        assert result.exit_code == 2 and "stop here" in result.output
        assert seen == [False] and gc.isenabled()

    def test_namespace_and_all_namespaces_conflict(self) -> None:
        result = self.run("plan", "-n", "x", "-A")
        assert result.exit_code == 2 and "not both" in result.output

    def test_all_namespaces_needs_namespace_slash_name(self) -> None:
        result = self.run("apply", "-A", "--registry-fingerprint", self.FP, "--candidate-fingerprint", self.FP, "a")
        assert result.exit_code == 2 and "NAMESPACE/NAME" in result.output

    def test_a_name_outside_the_namespace_is_refused(self) -> None:
        result = self.run(
            "apply", "-n", "x", "--registry-fingerprint", self.FP, "--candidate-fingerprint", self.FP, "y/a"
        )
        assert result.exit_code == 2 and "outside the planned namespace x" in result.output

    def test_a_missing_kubeconfig_is_one_sentence(self, tmp_path: pathlib.Path) -> None:
        result = self.run("plan", "-n", "x", "--kubeconfig", str(tmp_path / "nope"))
        assert result.exit_code == 2
        assert result.output.startswith("error: cannot load the kubeconfig") and "Traceback" not in result.output


# --- the layout: deciding never imports showing or talking -------------------------------------


@pytest.mark.parametrize("module", [plan, doctor])
def test_the_pure_cli_modules_import_no_output_and_no_client(module: Any) -> None:
    """plan and doctor decide; rendering is `coroner.cli.render`, I/O `coroner.cli.session`."""
    tree = ast.parse(pathlib.Path(module.__file__).read_text())
    imported = {
        name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in ([node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names])
    }
    tops = {name.split(".")[0] for name in imported}
    assert tops <= {
        "__future__",
        "dataclasses",
        "datetime",
        "enum",
        "functools",
        "json",
        "math",
        "re",
        "collections",
        "typing",
        "coroner",
    }
    assert not {
        name for name in imported if name.startswith(("coroner.client", "coroner.cli.session", "coroner.cli.render"))
    }


# --- kubectl conventions: durations, saved plans, every candidate, -o ---------------------------


class TestRequestTimeout:
    @pytest.mark.parametrize(
        ("text", "seconds"),
        [
            ("0", 0.0),
            ("30", 30.0),
            ("2.5", 2.5),
            ("30s", 30.0),
            ("1m", 60.0),
            ("1m30s", 90.0),
            ("1h2m3s", 3723.0),
            ("500ms", 0.5),
            (" 5s ", 5.0),
        ],
    )
    def test_kubectl_durations(self, text: str, seconds: float) -> None:
        assert options.parse_duration(text) == pytest.approx(seconds)

    @pytest.mark.parametrize("text", ["", "s", "5x", "-1", "-1s", "1s-", "nan", "inf", "1 m", "m1"])
    def test_anything_else_is_refused(self, text: str) -> None:
        with pytest.raises(ValueError, match="duration"):
            options.parse_duration(text)

    @settings(deadline=None)
    @given(
        hours=st.integers(0, 48),
        minutes=st.integers(0, 120),
        seconds=st.integers(0, 120),
        millis=st.integers(0, 2000),
    )
    def test_parts_add_up(self, hours: int, minutes: int, seconds: int, millis: int) -> None:
        text = f"{hours}h{minutes}m{seconds}s{millis}ms"
        expected = hours * 3600 + minutes * 60 + seconds + millis / 1000
        assert options.parse_duration(text) == pytest.approx(expected)


def saved(result: plan.Plan, *, namespace: str | None = NAMESPACE, **policy_flags: Any) -> dict[str, Any]:
    """A plan as `plan -o json` saves it, read back."""
    published = Policy()
    choice = plan.choose_policy(published=published, flags=policy_flags, system_namespace=api.SYSTEM_NAMESPACE)
    document = render.plan_document(
        result, namespace=namespace, now=NOW, retire_permission={NAMESPACE: True}, policy=choice
    )
    loaded: dict[str, Any] = json.loads(render.dump(document, output="json"))
    return loaded


class TestSavedPlan:
    def test_a_saved_plan_carries_its_approval(self) -> None:
        result = planned([worker("a"), worker("b"), worker("c", attested=False)])
        approval = plan.read_saved_plan(saved(result), source="plan.json")
        assert approval.registry_fingerprint == result.registry_fingerprint
        assert approval.candidate_fingerprint == result.candidate_fingerprint
        assert approval.namespace == NAMESPACE
        assert approval.candidates == ((NAMESPACE, "a"), (NAMESPACE, "b"))
        assert approval.policy_flags == {}

    def test_yaml_reads_the_same(self) -> None:
        result = planned([worker("a")])
        document = render.plan_document(result, namespace=None, now=NOW, retire_permission={})
        approval = plan.read_saved_plan(yaml.safe_load(render.dump(document, output="yaml")), source="plan.yaml")
        assert approval.namespace is None and approval.candidates == ((NAMESPACE, "a"),)

    def test_the_policy_flags_of_the_plan_travel_with_it(self) -> None:
        result = planned([worker("a")])
        document = saved(result, node_deletion_evidence=True, node_deletion_quarantine_seconds=0.0)
        approval = plan.read_saved_plan(document, source="plan.json")
        assert approval.policy_flags == {"node_deletion_evidence": True, "node_deletion_quarantine_seconds": 0.0}

    @settings(max_examples=50, deadline=None)
    @given(
        rows=st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d", "e"]), st.booleans()), unique_by=lambda r: r[0]),
        all_namespaces=st.booleans(),
        output=st.sampled_from(["json", "yaml"]),
    )
    def test_any_plan_saved_reads_back_as_its_approval(
        self, rows: list[tuple[str, bool]], all_namespaces: bool, output: str
    ) -> None:
        result = planned([worker(name, attested=attested) for name, attested in rows])
        namespace = None if all_namespaces else NAMESPACE
        document = render.plan_document(result, namespace=namespace, now=NOW, retire_permission={})
        text = render.dump(document, output=output)
        approval = plan.read_saved_plan(json.loads(text) if output == "json" else yaml.safe_load(text), source="f")
        assert approval.registry_fingerprint == result.registry_fingerprint
        assert approval.candidate_fingerprint == result.candidate_fingerprint
        assert approval.namespace == namespace
        assert list(approval.candidates) == [model.key_of(e.registration) for e in plan.candidates(result)]
        assert approval.candidates == tuple((NAMESPACE, name) for name, attested in sorted(rows) if attested)

    @pytest.mark.parametrize(
        "spoil",
        [
            pytest.param(lambda d: [d], id="not-an-object"),
            pytest.param(lambda d: {**d, "kind": "ApplyResult"}, id="another-kind"),
            pytest.param(lambda d: {**d, "apiVersion": "coroner.dev/v9"}, id="another-version"),
            pytest.param(lambda d: {**d, "registryFingerprint": "v1:sha256:abc"}, id="cut-fingerprint"),
            pytest.param(lambda d: {k: v for k, v in d.items() if k != "candidateFingerprint"}, id="no-fingerprint"),
            pytest.param(lambda d: {**d, "scope": {"namespace": None, "allNamespaces": False}}, id="bad-scope"),
            pytest.param(lambda d: {**d, "candidates": "jobs/a"}, id="candidates-not-a-list"),
            pytest.param(lambda d: {**d, "candidates": ["a"]}, id="candidate-without-namespace"),
            pytest.param(lambda d: {**d, "candidates": ["elsewhere/a"]}, id="candidate-outside-the-scope"),
            pytest.param(
                lambda d: {**d, "policy": {**d["policy"], "fromFlags": ["retireEverything"]}}, id="unknown-flag"
            ),
        ],
    )
    def test_anything_but_a_plan_is_one_sentence(self, spoil: Any) -> None:
        document = spoil(saved(planned([worker("a")])))
        with pytest.raises(ValueError, match=r"^plan.json is not a plan saved with `kubectl coroner plan -o json`"):
            plan.read_saved_plan(document, source="plan.json")


class TestAllCandidates:
    def test_the_candidates_now_when_nothing_moved(self) -> None:
        approved = planned([worker("a"), worker("b"), worker("c", attested=False)])
        again = planned([worker("a"), worker("b"), worker("c", attested=False)], now=NOW + 3 * S)
        keys = plan.all_candidates(
            again,
            registry_fingerprint=approved.registry_fingerprint,
            candidate_fingerprint=approved.candidate_fingerprint,
        )
        assert keys == [(NAMESPACE, "a"), (NAMESPACE, "b")]
        assessment = assess(again, approved, *(name for _, name in keys))
        assert assessment.abort is None and len(assessment.to_retire) == 2

    def test_after_a_partial_run_the_rows_it_retired_count_as_the_candidates_they_were(self) -> None:
        bodies = [worker("a"), worker("b")]
        approved = planned(bodies)
        partly = [retire(bodies[0], approved), bodies[1]]
        again = planned(partly)
        keys = plan.all_candidates(
            again,
            registry_fingerprint=approved.registry_fingerprint,
            candidate_fingerprint=approved.candidate_fingerprint,
        )
        assert keys == [(NAMESPACE, "a"), (NAMESPACE, "b")]
        assessment = assess(again, approved, "a", "b")
        assert assessment.abort is None
        assert [e.registration.name for e in assessment.already_retired] == ["a"]
        assert [e.registration.name for e in assessment.to_retire] == ["b"]

    def test_a_new_candidate_is_never_added_to_the_approved_set(self) -> None:
        approved = planned([worker("a")])
        again = planned([worker("a"), worker("b")])
        keys = plan.all_candidates(
            again,
            registry_fingerprint=approved.registry_fingerprint,
            candidate_fingerprint=approved.candidate_fingerprint,
        )
        assessment = plan.assess_apply(
            plan=again,
            names=keys,
            registry_fingerprint=approved.registry_fingerprint,
            candidate_fingerprint=approved.candidate_fingerprint,
        )
        assert assessment.abort == ApplyAbort.CANDIDATE_SET_MOVED

    def test_an_old_retirement_is_not_mistaken_for_this_plans(self) -> None:
        bodies = [worker("old"), worker("a")]
        before = planned(bodies)
        bodies = [retire(bodies[0], before), bodies[1]]
        approved = planned(bodies)  # "old" was already terminal when this plan was approved
        keys = plan.all_candidates(
            approved,
            registry_fingerprint=approved.registry_fingerprint,
            candidate_fingerprint=approved.candidate_fingerprint,
        )
        assert keys == [(NAMESPACE, "a")]


class TestOutputs:
    def test_names_are_kubectls(self) -> None:
        result = planned([worker("a"), worker("b", attested=False)])
        assert render.plan_names(result) == [
            "workerregistration.coroner.dev/a",
            "workerregistration.coroner.dev/b",
        ]
        results = [
            plan.RowResult(key=(NAMESPACE, "a"), outcome=plan.RowOutcome.RETIRED, detail=""),
            plan.RowResult(key=(NAMESPACE, "b"), outcome=plan.RowOutcome.RETIRE_CONFLICT, detail=""),
        ]
        assert render.apply_names(results) == ["workerregistration.coroner.dev/a"]
        checks = [
            doctor.failed("agents", "x", objects=("node/x", "node/y")),
            doctor.passed("crd", "fine"),
            doctor.failed("node-loss", "x", objects=("node/x",)),
        ]
        assert render.doctor_names(checks) == ["node/x", "node/y"]

    def test_a_table_lines_up_its_columns_and_folds_its_detail_within_the_width(self) -> None:
        columns = [render.Column("NAME"), render.Column("PID", right=True), render.Column("DETAIL", fold=True)]
        rows = [[("a", None), ("7", None), ("short", None)], [("long-name", None), ("12345", "red"), ("x " * 12, None)]]
        narrow = io.StringIO()
        render.print_table(Console(file=narrow, width=40, color_system=None), title="T", columns=columns, rows=rows)
        assert narrow.getvalue().splitlines() == [
            "T",
            " NAME         PID  DETAIL",
            " " + "─" * 39,
            " a              7  short",
            " long-name  12345  x x x x x x x x x x x",
            "                   x",
        ]

    def test_control_characters_in_object_text_are_shown_not_sent_to_the_terminal(self) -> None:
        columns = [render.Column("NAME"), render.Column("DETAIL", fold=True)]
        text = rendered(
            lambda c: render.print_table(c, title="T", columns=columns, rows=[[("a", None), ("x\x1b[2J\ry", None)]])
        )
        assert "x?[2J?y" in text and "\x1b" not in text and "\r" not in text

    @given(st.lists(st.tuples(st.text(min_size=1, max_size=12), st.text(max_size=80)), max_size=6))
    @settings(max_examples=50, deadline=None)
    def test_a_table_styled_for_a_terminal_says_what_the_plain_one_says(self, cells: list[tuple[str, str]]) -> None:
        columns = [render.Column("NAME"), render.Column("DETAIL", fold=True)]
        rows = [[(name, "bold green"), (detail, None)] for name, detail in cells]
        plain, styled = io.StringIO(), io.StringIO()
        render.print_table(Console(file=plain, width=60, color_system=None), title="T", columns=columns, rows=rows)
        terminal = Console(file=styled, width=60, force_terminal=True, color_system="standard")
        render.print_table(terminal, title="T", columns=columns, rows=rows)
        assert "\x1b[" in styled.getvalue()
        assert Text.from_ansi(styled.getvalue()).plain.rstrip("\n") == plain.getvalue().rstrip("\n")

    def test_wide_adds_columns(self) -> None:
        result = planned([worker("a")])

        def draw(wide: bool) -> str:
            return rendered(
                lambda c: render.render_plan(result, console=c, namespace=NAMESPACE, retire_permission={}, wide=wide)
            )

        assert "DEATH EVIDENCE" in draw(True) and "DEATH EVIDENCE" not in draw(False)
        assert result.entries[0].registration.uid in draw(True)

    @pytest.mark.parametrize("output", options.OUTPUTS)
    def test_every_command_takes_every_output(self, output: str) -> None:
        for command in ("plan", "apply", "doctor", "version"):
            result = CliRunner().invoke(main, [command, "-o", output, "--help"])
            assert result.exit_code == 0, (command, result.output)


class TestKubectlConventions:
    def run(self, *args: str) -> Any:
        return CliRunner().invoke(main, list(args))

    def test_usage_says_kubectl_coroner(self) -> None:
        result = self.run("plan", "--bogus")
        assert result.exit_code == 2 and "Usage: kubectl coroner plan" in result.output

    def test_every_command_takes_kubectls_connection_flags(self) -> None:
        for command in ("plan", "apply", "doctor", "version"):
            text = self.run(command, "--help").output
            for flag in ("--kubeconfig", "--context", "--as ", "--as-group", "--request-timeout", "--output"):
                assert flag in text, (command, flag)

    def test_as_group_needs_as(self) -> None:
        result = self.run("plan", "-n", "x", "--as-group", "admins")
        assert result.exit_code == 2 and "--as-group needs --as" in result.output

    def test_a_context_the_kubeconfig_lacks_is_named(self, tmp_path: pathlib.Path) -> None:
        config = tmp_path / "config"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "one", "context": {"cluster": "c", "user": "u", "namespace": "jobs"}}],
                    "current-context": "one",
                }
            )
        )
        result = self.run("plan", "--kubeconfig", str(config), "--context", "two")
        assert result.exit_code == 2
        assert result.output.strip() == (
            f"error: the kubeconfig {config} has no context 'two' (it has one); pass one of those to --context."
        )

    def test_the_context_picks_the_default_namespace(self, tmp_path: pathlib.Path) -> None:
        config = tmp_path / "config"
        contexts = [
            {"name": "one", "context": {"cluster": "c", "user": "u", "namespace": "jobs"}},
            {"name": "two", "context": {"cluster": "c", "user": "u", "namespace": "batch"}},
        ]
        config.write_text(
            yaml.safe_dump(
                {
                    "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": contexts,
                    "current-context": "one",
                }
            )
        )
        assert session.context_namespace(session.Connection(kubeconfig=str(config))) == "jobs"
        assert session.context_namespace(session.Connection(kubeconfig=str(config), context="two")) == "batch"

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (["--all-candidates", "a"], "not both"),
            ([], "NAMES..."),
            (["--registry-fingerprint", "v1:sha256:" + "0" * 64, "a"], "--candidate-fingerprint"),
        ],
    )
    def test_apply_needs_one_way_to_name_rows_and_an_approval(self, args: list[str], message: str) -> None:
        fp = ["--registry-fingerprint", "v1:sha256:" + "0" * 64, "--candidate-fingerprint", "v1:sha256:" + "0" * 64]
        result = self.run("apply", "-n", "x", *(args if "--registry-fingerprint" in args else [*fp, *args]))
        assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output

    def test_from_plan_refuses_a_name_outside_its_candidates_before_any_request(self, tmp_path: pathlib.Path) -> None:
        file = tmp_path / "plan.json"
        file.write_text(json.dumps(saved(planned([worker("a"), worker("b", attested=False)]))))
        result = self.run("apply", "--from-plan", str(file), "b", "--kubeconfig", str(tmp_path / "none"))
        assert result.exit_code == 2
        assert "not among the candidates of the approved plan" in result.output and "kubeconfig" not in result.output

    def test_from_plan_keeps_its_scope(self, tmp_path: pathlib.Path) -> None:
        file = tmp_path / "plan.json"
        file.write_text(json.dumps(saved(planned([worker("a")]))))
        result = self.run("apply", "--from-plan", str(file), "-n", "elsewhere", "a")
        assert result.exit_code == 2 and f"was made with -n {NAMESPACE}, not -n elsewhere" in result.output

    def test_from_plan_refuses_a_file_that_is_not_a_plan(self, tmp_path: pathlib.Path) -> None:
        file = tmp_path / "plan.json"
        file.write_text("{not: [json")
        result = self.run("apply", "--from-plan", str(file), "--all-candidates")
        assert result.exit_code == 2 and "is not a plan saved with" in result.output

    def test_completion_offers_commands_flags_and_outputs(self) -> None:
        offered, directive = completion.completions(main, [""])
        assert {"plan", "apply", "doctor", "version", "completion"} <= {value for value, _ in offered}
        assert directive == 4
        offered, _ = completion.completions(main, ["plan", "-o", ""])
        assert [value for value, _ in offered] == list(options.OUTPUTS)
        _, directive = completion.completions(main, ["apply", "--from-plan", ""])
        assert directive == 0  # a file name

    @pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
    def test_completion_scripts(self, shell: str) -> None:
        result = self.run("completion", shell)
        assert result.exit_code == 0 and "_KUBECTL_CORONER_COMPLETE" in result.output
        assert "kubectl-coroner" in result.output


@pytest.mark.parametrize(
    ("error", "timed_out"),
    [
        (urllib3.exceptions.ReadTimeoutError(None, "/", "read timed out"), True),  # type: ignore[arg-type]
        (urllib3.exceptions.ConnectTimeoutError("connect timed out"), True),
        (urllib3.exceptions.NewConnectionError(None, "Connection refused"), False),  # type: ignore[arg-type]
        (urllib3.exceptions.ProtocolError("reset"), False),
    ],
)
def test_a_refused_connection_is_unreachable_not_slow(error: Exception, timed_out: bool) -> None:
    """urllib3's NewConnectionError (ECONNREFUSED) subclasses ConnectTimeoutError: not a timeout."""
    retried = urllib3.exceptions.MaxRetryError(None, "/", error)  # type: ignore[arg-type]
    text = session.Session.unreachable(_FakeSession(), retried).message  # type: ignore[arg-type]
    assert ("did not answer within" in text) is timed_out
    assert ("cannot reach the Kubernetes API server" in text) is not timed_out


class _FakeSession:
    server = "https://127.0.0.1:1"
    connection = session.Connection()


class TestReadOnlyCache:
    """What `plan` and `doctor` leave out (the bodies, each decision's structured evidence) changes
    nothing they show: the same reasons, details, rows, counts and fingerprints."""

    @given(
        workers=st.lists(
            st.tuples(
                st.sampled_from(["Dead", "Alive", "Unknown"]),
                st.sampled_from(["PidfdExited", "ProcAbsent", "PidfdPinned"]),
                st.sampled_from(["inst-1", "inst-2", "inst-3", "inst-4"]),
                st.booleans(),
            ),
            max_size=8,
        ),
        permission=st.sampled_from([True, False, None]),
    )
    def test_the_lean_plan_is_the_plan(
        self, workers: list[tuple[str, str, str, bool]], permission: bool | None
    ) -> None:
        registrations = [
            worker(f"w{i}", verdict=verdict, evidence=evidence, client_instance_id=instance, attested=attested)
            for i, (verdict, evidence, instance, attested) in enumerate(workers)
        ]
        full_listing = listing(registrations, permission=permission)
        lean_world = cached(registrations, keep_bodies=False)
        lean_listing = dataclasses.replace(full_listing, registrations=lean_world)
        full = fingerprint.decide_all(world=plan.build_world(full_listing), policy=Policy(), now=NOW)
        lean = fingerprint.decide_all(
            world=plan.build_world(lean_listing), policy=Policy(), now=NOW, keep_evidence=False
        )
        assert lean_world.bodies == {} and len(lean_world.parsed) == len(registrations)
        assert lean.rows == full.rows
        assert lean.counts == full.counts
        assert (lean.registry_fingerprint, lean.candidate_fingerprint) == (
            full.registry_fingerprint,
            full.candidate_fingerprint,
        )
        for a, b in zip(lean.entries, full.entries, strict=True):
            assert dataclasses.replace(a.decision, evidence=b.decision.evidence) == b.decision
            assert a.decision.evidence == {}
