"""Plan fingerprints: content only, order-independent, stable across numeric spellings."""

from __future__ import annotations

import dataclasses
import datetime
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coroner.core.decision import Policy, decide
from coroner.core.fingerprint import (
    Plan,
    PlanRow,
    candidate_fingerprint,
    decide_all,
    plan_row,
    registry_fingerprint,
)
from coroner.core.model import parse_registration
from coroner.core.reasons import Reason
from coroner.core.world import World
from unit.builders import NOW, make_facts, make_registration

pytestmark = pytest.mark.unit

FORMAT = re.compile(r"v1:sha256:[0-9a-f]{64}")
S = datetime.timedelta(seconds=1)


def registry() -> list[dict[str, Any]]:
    """Two retirable workers, one alive, one in another namespace."""
    return [
        make_registration(name="a", client_instance_id="inst-a", session_id="s-a", pid=101),
        make_registration(name="b", client_instance_id="inst-b", session_id="s-b", pid=102),
        make_registration(name="c", client_instance_id="inst-c", session_id="s-c", pid=103, verdict="Alive"),
        make_registration(namespace="ops", name="a", client_instance_id="inst-d", session_id="s-d", pid=104),
    ]


def plan_of(bodies: list[dict[str, Any]], *, now: datetime.datetime = NOW) -> Plan:
    """The one decide-all over a cache holding `bodies` and the default facts (live agent, its Node,
    the grant in every namespace)."""
    world = World()
    for body in bodies:
        world.put_registration(body)
    facts = make_facts()
    world.agents.update(facts.agents)
    world.nodes.update(facts.nodes)
    world.retire_permission.update(dict.fromkeys(world.namespaces(), True))
    return decide_all(world=world, policy=Policy(), now=now)


def rows(bodies: list[dict[str, Any]]) -> list[PlanRow]:
    return list(plan_of(bodies).rows)


def row(**changes: object) -> PlanRow:
    base = PlanRow(
        namespace="jobs",
        name="a",
        uid="u",
        node_name="node-a",
        reason=Reason.ELIGIBLE_STALE_ORPHAN,
        verdict="Dead",
        death_evidence="PidfdExited",
        incarnation=("boot", "4026531836", 900, "1", "host"),
        client_instance_id="inst-a",
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_the_digests_are_pinned() -> None:
    """A saved plan's fingerprints must match what a later kubectl-coroner computes for the same
    rows: these values were computed by the first implementation and may never change under v1
    (escaped text included). Any row count past a hash's chunk exercises the streamed payload."""
    many = [
        row(
            name=f"w-{i}",
            uid=f"u{i}",
            namespace="ns",
            node_name='n\u00e9"1',
            reason=Reason.ELIGIBLE_STALE_ORPHAN if i % 3 == 0 else Reason.PID_ALIVE,
            verdict="Dead" if i % 3 == 0 else "Alive",
            death_evidence="PidfdExited" if i % 3 == 0 else None,
            incarnation=("b", "4026531836", 100 + i, str(i), "h"),
            client_instance_id=f"ci-{i}",
        )
        for i in range(2500)
    ]
    assert registry_fingerprint(many) == "v1:sha256:3fac5949af3384c5c73872da803a7cbffd0010c785e40ff229c0f6b5b71414f8"
    assert candidate_fingerprint(many) == "v1:sha256:c21b85f5792c0a0a38e7e1f3f40dac3e3dad5037c535c1ca6174aaa7dda31ec8"
    assert (
        candidate_fingerprint(many[1:3]) == "v1:sha256:0540532e5c5acb6f1131fce72ce432eb95fe41b07779b65d7109b5f209f16033"
    )
    assert registry_fingerprint([]) == "v1:sha256:a8253116afe7c92321402182e41d82be8d50fdde1ef93b7d1f0ef6f435391018"


def test_format() -> None:
    assert FORMAT.fullmatch(registry_fingerprint(rows(registry())))
    assert FORMAT.fullmatch(candidate_fingerprint(rows(registry())))
    assert FORMAT.fullmatch(candidate_fingerprint([]))


@given(order=st.permutations(range(4)))
def test_order_independent(order: list[int]) -> None:
    listed = rows(registry())
    shuffled = [listed[index] for index in order]
    assert registry_fingerprint(shuffled) == registry_fingerprint(listed)
    assert candidate_fingerprint(shuffled) == candidate_fingerprint(listed)


@pytest.mark.parametrize(
    "pid", [pytest.param(900, id="int"), pytest.param(900.0, id="float"), pytest.param("900", id="digits")]
)
def test_pid_spelling_does_not_matter(pid: object) -> None:
    assert registry_fingerprint([row(incarnation=("boot", "4026531836", pid, "1", "host"))]) == registry_fingerprint(
        [row()]
    )


@given(pid=st.integers(1, 4194304 - 2), spelling=st.sampled_from([int, float, str]), order=st.permutations(range(3)))
def test_any_pid_spelling_in_any_order(pid: int, spelling: type, order: list[int]) -> None:
    listed = [row(name=name, incarnation=("boot", "1", pid + i, "1", "host")) for i, name in enumerate("abc")]
    respelled = [
        dataclasses.replace(r, incarnation=(*r.incarnation[:2], spelling(r.incarnation[2]), *r.incarnation[3:]))
        for r in listed
    ]
    assert registry_fingerprint([respelled[i] for i in order]) == registry_fingerprint(listed)


def test_pid_spelling_from_the_api_does_not_matter() -> None:
    spellings = [parse_registration(make_registration(pid=pid)) for pid in (4242, 4242.0, "4242")]
    prints = {
        registry_fingerprint([(r, decide(registration=r, facts=make_facts(), policy=Policy(), now=NOW))])
        for r in spellings
    }
    assert len(prints) == 1


def test_heartbeats_and_resource_versions_do_not_move_it() -> None:
    before = rows(registry())
    moved = [
        make_registration(
            name=r.name or "",
            namespace=r.namespace or "",
            client_instance_id=r.client_instance_id or "",
            session_id=r.session_id or "",
            pid=r.incarnation.pid,
            verdict="Alive" if r.name == "c" and r.namespace == "jobs" else "Dead",
            heartbeat_at=NOW - 45 * S,
            observed_at=NOW - 2 * S,
            paths={"metadata.resourceVersion": "2002", "metadata.generation": 2},
        )
        for r in map(parse_registration, registry())
    ]
    assert registry_fingerprint(rows(moved)) == registry_fingerprint(before)
    assert candidate_fingerprint(rows(moved)) == candidate_fingerprint(before)


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"reason": Reason.PID_ALIVE}, id="reason"),
        pytest.param({"uid": "v"}, id="uid"),
        pytest.param({"incarnation": ("boot", "4026531836", 901, "1", "host")}, id="pid"),
        pytest.param({"client_instance_id": "inst-z"}, id="client-instance"),
        pytest.param({"death_evidence": "ProcAbsent"}, id="death-evidence"),
        pytest.param({"verdict": None}, id="verdict"),
    ],
)
def test_content_moves_it(changes: dict[str, object]) -> None:
    assert registry_fingerprint([row(**changes)]) != registry_fingerprint([row()])


def test_candidates_are_the_eligible_rows_only() -> None:
    listed = rows(registry())
    eligible = [r for r in listed if r.eligible]
    assert {(r.namespace, r.name) for r in eligible} == {("jobs", "a"), ("jobs", "b"), ("ops", "a")}
    assert candidate_fingerprint(listed) == candidate_fingerprint(eligible)
    # A live worker changing reason moves the registry, not the candidate set.
    alive_now_stale = [dataclasses.replace(r, reason=Reason.ATTESTATION_STALE) if not r.eligible else r for r in listed]
    assert candidate_fingerprint(alive_now_stale) == candidate_fingerprint(listed)
    assert registry_fingerprint(alive_now_stale) != registry_fingerprint(listed)
    # Losing a candidate moves both.
    fewer = [r for r in listed if r.name != "b"]
    assert candidate_fingerprint(fewer) != candidate_fingerprint(listed)


def test_registry_and_candidate_fingerprints_never_coincide() -> None:
    only_eligible = [row()]
    assert registry_fingerprint(only_eligible) != candidate_fingerprint(only_eligible)


def test_pairs_and_rows_agree() -> None:
    registrations = [parse_registration(body) for body in registry()]
    pairs = [(r, decide(registration=r, facts=make_facts(), policy=Policy(), now=NOW)) for r in registrations]
    as_rows = [plan_row(registration=r, decision=d) for r, d in pairs]
    assert registry_fingerprint(pairs) == registry_fingerprint(as_rows)
    assert candidate_fingerprint(pairs) == candidate_fingerprint(as_rows)


class TestPlan:
    def test_sorted_counted_and_fingerprinted(self) -> None:
        registrations = list(reversed(registry()))
        plan = plan_of(registrations)
        assert [(r.namespace, r.name) for r in plan.rows] == [("jobs", "a"), ("jobs", "b"), ("jobs", "c"), ("ops", "a")]
        assert list(plan.counts) == list(Reason)
        assert plan.counts[Reason.ELIGIBLE_STALE_ORPHAN] == 3
        assert plan.counts[Reason.PID_ALIVE] == 1
        assert sum(plan.counts.values()) == len(registrations)
        assert plan.registry_fingerprint == registry_fingerprint(plan.rows)
        assert plan.candidate_fingerprint == candidate_fingerprint(plan.rows)
        for entry in plan.entries:
            assert entry.row == plan_row(registration=entry.registration, decision=entry.decision)

    def test_peers_come_from_the_registry_itself(self) -> None:
        dead = make_registration(name="dead")
        twin = make_registration(name="twin", verdict="Alive", pid=5000)
        plan = plan_of([dead, twin])
        reasons = {entry.row.name: entry.decision.reason for entry in plan.entries}
        # Same clientInstanceId, and the twin may be live: the dead one must wait.
        assert reasons == {"dead": Reason.CLIENT_INSTANCE_CONFLICT, "twin": Reason.PID_ALIVE}

    def test_peers_in_other_namespaces_do_not_conflict(self) -> None:
        dead = make_registration(name="dead")
        elsewhere = make_registration(namespace="ops", name="twin", verdict="Alive")
        plan = plan_of([dead, elsewhere])
        assert plan.entries[0].decision.reason is Reason.ELIGIBLE_STALE_ORPHAN

    def test_fingerprint_does_not_depend_on_when(self) -> None:
        registrations = registry()
        earlier = plan_of(registrations, now=NOW - S)
        later = plan_of(registrations)
        assert earlier.registry_fingerprint == later.registry_fingerprint
