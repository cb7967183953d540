"""The permission refresher's admission half: the operator fails closed.

The refresher lists the admission policies and bindings, compares them by content
(`coroner.core.admission_digest`) and records in the World what keeps them from being verified;
any change reconciles every registration. Unknown is never intact: a listing that fails is
recorded as unverified, with why. Then, through the real reconciler and step: a registration dead
by every other line is preserved as AdmissionPoliciesUnverified, with no retirement effect.
"""

from __future__ import annotations

import asyncio
import copy
import re
from typing import Any

import pytest
import yaml

from coroner.client.rest import ApiError
from coroner.core import admission_digest as ad
from coroner.core import api
from coroner.core.decision import Policy
from coroner.core.model import Key
from coroner.core.reasons import Reason
from coroner.core.world import World
from coroner_operator.app import Operator
from coroner_operator.metrics import Metrics
from coroner_operator.permissions import PermissionRefresher
from coroner_operator.settings import OperatorSettings
from unit.builders import (
    NAME,
    NAMESPACE,
    NODE,
    NOW,
    make_agent,
    make_node,
    make_registration,
    shipped_admission_policies,
)

pytestmark = pytest.mark.unit

SHIPPED = shipped_admission_policies()
BINDING = ("ValidatingAdmissionPolicyBinding", "coroner-retire-requires-evidence")


def served(*, without: tuple[str, str] | None = None, warn: tuple[str, str] | None = None) -> list[dict[str, Any]]:
    """The shipped objects as a cluster lists them, one left out or one binding set to Warn."""
    documents = [copy.deepcopy(d) for d in SHIPPED if ad.key(d) != without]
    for document in documents:
        if ad.key(document) == warn:
            document["spec"]["validationActions"] = ["Warn"]
    return documents


class FakeKube:
    def __init__(self, listed: list[dict[str, Any]] | Exception) -> None:
        self.listed = listed
        self.lists = 0

    async def list_admission_policies(self) -> list[dict[str, Any]]:
        self.lists += 1
        await asyncio.sleep(0)  # a real await: concurrent callers interleave here
        if isinstance(self.listed, Exception):
            raise self.listed
        return copy.deepcopy(self.listed)

    async def can_retire(self, **_: Any) -> bool:
        return True


def world_with(*keys: Key) -> World:
    world = World(system_namespace=api.SYSTEM_NAMESPACE)
    for namespace, name in keys:
        world.put_registration(make_registration(name=name, namespace=namespace, uid=f"uid-{name}"))
    return world


def refresher(kube: FakeKube, world: World, enqueued: list[Key], **kwargs: Any) -> PermissionRefresher:
    return PermissionRefresher(
        kube=kube,  # type: ignore[arg-type]
        world=world,
        enqueue=enqueued.append,
        interval_seconds=5.0,
        **kwargs,
    )


KEYS = (("jobs", "w1"), ("jobs", "w2"), ("ops", "w3"))


@pytest.mark.parametrize(
    ("listed", "expected"),
    [
        pytest.param(served(), (), id="intact"),
        pytest.param(served(without=BINDING), (f"{BINDING[0]}/{BINDING[1]} (missing)",), id="binding-deleted"),
        pytest.param(served(warn=BINDING), (f"{BINDING[0]}/{BINDING[1]} (differs)",), id="binding-warns"),
        pytest.param(
            served(without=ad.CRD),
            (f"CustomResourceDefinition/{ad.CRD[1]} (missing)",),
            id="crd-deleted",
        ),
        pytest.param(
            [],
            tuple(f"{kind}/{name} (missing)" for kind, name in sorted(ad.EXPECTED)),
            id="none-installed",
        ),
    ],
)
def test_what_is_missing_or_differs_is_recorded_and_a_change_reconciles_everything(
    listed: list[dict[str, Any]], expected: tuple[str, ...]
) -> None:
    world, enqueued = world_with(*KEYS), []
    asyncio.run(refresher(FakeKube(listed), world, enqueued).refresh_admission())
    assert world.admission_unverified == expected
    assert world.facts_for(KEYS[0], now=NOW).admission_unverified == expected
    # From verified (the World's start) to anything else: every registration, in every namespace.
    assert sorted(enqueued) == (sorted(KEYS) if expected else [])


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(ApiError(403, "Forbidden", '{"message": "cannot list validatingadmissionpolicies"}'), id="403"),
        pytest.param(ApiError(500, "InternalServerError", "etcd is sad"), id="500"),
        pytest.param(OSError("connection refused"), id="unreachable"),
    ],
)
def test_a_listing_that_fails_is_unverified_never_intact(error: Exception) -> None:
    world, enqueued = world_with(*KEYS), []
    asyncio.run(refresher(FakeKube(error), world, enqueued).refresh_admission())
    (why,) = world.admission_unverified
    assert why.startswith("the admission policies could not be read (")
    assert sorted(enqueued) == sorted(KEYS)


def test_restored_policies_reconcile_everything_again_and_an_unchanged_answer_nothing() -> None:
    world, enqueued = world_with(*KEYS), []
    kube = FakeKube(served(warn=BINDING))
    r = refresher(kube, world, enqueued)
    asyncio.run(r.refresh_admission())
    enqueued.clear()
    asyncio.run(r.refresh_admission())
    assert enqueued == [], "the same answer again changes no decision"
    kube.listed = served(without=BINDING)  # from Warn to deleted: the message changes
    asyncio.run(r.refresh_admission())
    assert world.admission_unverified == (f"{BINDING[0]}/{BINDING[1]} (missing)",)
    assert sorted(enqueued) == sorted(KEYS)
    enqueued.clear()
    kube.listed = served()
    asyncio.run(r.refresh_admission())
    assert world.admission_unverified == ()
    assert sorted(enqueued) == sorted(KEYS)


def test_refresh_asks_for_the_admission_policies_each_time() -> None:
    kube = FakeKube(served())
    r = refresher(kube, world_with(*KEYS), [])
    asyncio.run(r.refresh())
    asyncio.run(r.refresh())
    assert kube.lists == 2


def _versioned(documents: list[dict[str, Any]], version: str) -> list[dict[str, Any]]:
    """The objects as the API server stores them: each with a uid and a resourceVersion."""
    for index, document in enumerate(documents):
        document["metadata"].update(uid=f"uid-{index}", resourceVersion=version)
    return documents


def test_an_unchanged_listing_is_not_digested_again_and_a_new_version_is(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[int] = []
    compare = ad.compare
    monkeypatch.setattr(ad, "compare", lambda listed, **kw: compared.append(1) or compare(listed, **kw))
    world, enqueued = world_with(*KEYS), []
    kube = FakeKube(_versioned(served(), "1"))
    r = refresher(kube, world, enqueued)
    asyncio.run(r.refresh_admission())
    asyncio.run(r.refresh_admission())
    assert (kube.lists, len(compared), world.admission_unverified) == (2, 1, ())
    kube.listed = _versioned(served(warn=BINDING), "2")  # weakened: the server gave it a new version
    asyncio.run(r.refresh_admission())
    assert len(compared) == 2
    assert world.admission_unverified == (f"{BINDING[0]}/{BINDING[1]} (differs)",)
    kube.listed = served(warn=BINDING)  # without versions (not as a server lists): compared every time
    asyncio.run(r.refresh_admission())
    asyncio.run(r.refresh_admission())
    assert len(compared) == 4


def test_another_operator_in_the_process_sees_a_weakening_under_the_versions_digested_before() -> None:
    # The digests are remembered per process (a restarted operator does not digest the same objects
    # again), by content: the same names, uids and resourceVersions with one binding weakened (an
    # object recreated, another cluster) are digested as what they are.
    world = world_with(*KEYS)
    asyncio.run(refresher(FakeKube(_versioned(served(), "1")), world, []).refresh_admission())
    assert world.admission_unverified == ()
    world = world_with(*KEYS)
    asyncio.run(refresher(FakeKube(_versioned(served(warn=BINDING), "1")), world, []).refresh_admission())
    assert world.admission_unverified == (f"{BINDING[0]}/{BINDING[1]} (differs)",)
    world = world_with(*KEYS)
    asyncio.run(refresher(FakeKube(_versioned(served(), "1")), world, []).refresh_admission())
    assert world.admission_unverified == ()


def test_ensure_reads_them_once_before_the_first_decision_even_when_asked_at_once() -> None:
    kube = FakeKube(served(without=BINDING))
    world = world_with(*KEYS)
    r = refresher(kube, world, [])

    async def first_decisions() -> None:
        await asyncio.gather(*(r.ensure(namespace) for namespace in ("jobs", "jobs", "ops", "ops")))
        await r.ensure("jobs")

    asyncio.run(first_decisions())
    assert kube.lists == 1
    assert world.admission_unverified == (f"{BINDING[0]}/{BINDING[1]} (missing)",)


def node_loss() -> list[dict[str, Any]]:
    return [ad.with_node_loss(d) if ad.key(d) == ad.EVIDENCE_POLICY else d for d in served()]


@pytest.mark.parametrize(
    ("listed", "node_evidence", "verified"),
    [
        pytest.param(node_loss(), True, True, id="node-loss-component-with-node-evidence"),
        pytest.param(served(), True, True, id="base-policy-is-stricter-than-node-evidence-needs"),
        pytest.param(node_loss(), False, False, id="node-loss-policy-without-node-evidence-is-weaker"),
        pytest.param(served(), False, True, id="base-without-node-evidence"),
    ],
)
def test_the_node_loss_variant_is_verified_only_for_an_operator_using_node_evidence(
    listed: list[dict[str, Any]], node_evidence: bool, verified: bool
) -> None:
    world = world_with(*KEYS)
    asyncio.run(refresher(FakeKube(listed), world, [], node_evidence=node_evidence).refresh_admission())
    expected = () if verified else (f"{ad.EVIDENCE_POLICY[0]}/{ad.EVIDENCE_POLICY[1]} (differs)",)
    assert world.admission_unverified == expected


def helm_install(namespace: str, prefix: str) -> list[dict[str, Any]]:
    """The shipped objects as the Helm chart renders them into `namespace` with namePrefix `prefix`."""
    text = re.sub(r"coroner-system(?!-)", namespace, yaml.safe_dump_all(served()))
    text = text.replace(
        f"system:serviceaccount:{namespace}:coroner-", f"system:serviceaccount:{namespace}:{prefix}coroner-"
    )
    return list(yaml.safe_load_all(text))


@pytest.mark.parametrize(
    ("identity", "verified"),
    [
        pytest.param("system:serviceaccount:acme-coroner:acme-coroner-operator", True, id="the-release-identity"),
        pytest.param("system:serviceaccount:acme-coroner:coroner-operator", False, id="unprefixed-identity"),
        pytest.param("kubernetes-admin", False, id="not-a-service-account"),
    ],
)
def test_a_helm_install_in_another_namespace_with_a_name_prefix_is_verified(identity: str, verified: bool) -> None:
    world = world_with(*KEYS)
    kube = FakeKube(helm_install("acme-coroner", "acme-"))
    r = refresher(kube, world, [], system_namespace="acme-coroner", identity=identity)
    asyncio.run(r.refresh_admission())
    assert (world.admission_unverified == ()) is verified, world.admission_unverified


@pytest.mark.parametrize(
    ("identity", "namespace", "prefix"),
    [
        ("system:serviceaccount:coroner-system:coroner-operator", "coroner-system", ""),
        ("system:serviceaccount:acme:acme-coroner-operator", "acme", "acme-"),
        ("system:serviceaccount:acme:acme-coroner-operator", "coroner-system", ""),
        ("system:serviceaccount:acme:someone-else", "acme", ""),
        ("kubernetes-admin", "coroner-system", ""),
        ("", "coroner-system", ""),
    ],
)
def test_the_name_prefix_is_read_off_the_operators_own_identity(identity: str, namespace: str, prefix: str) -> None:
    assert api.name_prefix_of(identity, system_namespace=namespace) == prefix


# --- through the operator: reconcile gathers, the step preserves ------------------------------------


def operator(kube: FakeKube) -> Operator:
    """An operator whose cache holds a registration dead by every other line: a live agent on its
    node attested PidfdExited, and the grant is held."""
    world = World(system_namespace=api.SYSTEM_NAMESPACE)
    world.put_registration(make_registration())
    world.agents[NODE] = make_agent()
    world.nodes[NODE] = make_node()
    return Operator(
        world=world,
        kube=kube,  # type: ignore[arg-type]
        policy=Policy(),
        metrics=Metrics(),
        settings=OperatorSettings(),
        clock=lambda: NOW,
    )


@pytest.mark.parametrize(
    ("listed", "reason"),
    [
        pytest.param(served(), Reason.ELIGIBLE_STALE_ORPHAN, id="verified-retires"),
        pytest.param(served(warn=BINDING), Reason.ADMISSION_POLICIES_UNVERIFIED, id="warn-only-binding"),
        pytest.param(ApiError(403, "Forbidden", "no list"), Reason.ADMISSION_POLICIES_UNVERIFIED, id="unreadable"),
    ],
)
def test_the_first_decision_waits_for_the_policies_and_an_unverified_one_retires_nothing(
    listed: list[dict[str, Any]] | Exception, reason: Reason
) -> None:
    op = operator(FakeKube(listed))
    _, effects = asyncio.run(op.reconciler.decide((NAMESPACE, NAME)))
    assert effects is not None and effects.reason is reason
    if reason is Reason.ELIGIBLE_STALE_ORPHAN:
        assert effects.retire is not None
        return
    assert effects.retire is None
    assert effects.write_conditions is not None
    (retirable,) = [op["value"] for op in effects.write_conditions.ops if op.get("path", "").endswith("/conditions")]
    message = next(c["message"] for c in retirable if c["type"] == "Retirable")
    assert "PidfdExited" in message and "plan-only" in message
    if isinstance(listed, Exception):
        assert "could not be read (403 Forbidden" in message
    else:
        assert f"{BINDING[0]}/{BINDING[1]} (differs)" in message


class WritingKube(FakeKube):
    """Records every status patch; answers a conditions write with the object as patched."""

    def __init__(self, listed: list[dict[str, Any]] | Exception) -> None:
        super().__init__(listed)
        self.patches: list[list[dict[str, Any]]] = []

    async def patch_status(self, *, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        self.patches.append(ops)
        body = make_registration(name=name, namespace=namespace)
        body["metadata"]["resourceVersion"] = "1000"
        return body

    async def list_leases(self, **_: Any) -> list[dict[str, Any]]:
        return []


def test_a_weakening_the_cache_has_not_seen_stops_the_retirement_right_before_it() -> None:
    kube = WritingKube(served())
    op = operator(kube)

    async def scenario() -> None:
        await op.permissions.refresh_admission()  # verified: the cache says the decision may retire
        assert op.world.admission_unverified == ()
        kube.listed = served(warn=BINDING)  # weakened after the last refresh
        await op.reconciler.reconcile((NAMESPACE, NAME))

    asyncio.run(scenario())
    assert kube.lists == 2, "one read right before the retirement"
    assert op.world.admission_unverified == (f"{BINDING[0]}/{BINDING[1]} (differs)",)
    written = [op_["path"] for ops in kube.patches for op_ in ops]
    assert not any(path.startswith("/status/retirement") for path in written), written
    assert op.gauge.by_reason() == {Reason.ADMISSION_POLICIES_UNVERIFIED.value: 1}
    conditions = next(o["value"] for ops in kube.patches for o in ops if o["path"] == "/status/conditions")
    assert any(c["reason"] == Reason.ADMISSION_POLICIES_UNVERIFIED for c in conditions)


def test_retirements_decided_together_share_one_read_right_before_them() -> None:
    kube = WritingKube(served())
    op = operator(kube)
    for index in range(5):
        op.world.put_registration(make_registration(name=f"w{index}", uid=f"uid-w{index}"))

    async def scenario() -> None:
        await op.permissions.refresh_admission()
        checks = [op.permissions.admission_verified(decided_at=0.0) for _ in range(5)]
        assert all(await asyncio.gather(*checks))

    asyncio.run(scenario())
    assert kube.lists == 2, "the refresh, then one read for the five retirements decided before it"


def test_the_gauge_says_whether_the_policies_are_verified_and_unknown_is_not() -> None:
    kube = WritingKube(served(warn=BINDING))
    op = operator(kube)

    def gauge() -> float | None:
        return op.metrics.registry.get_sample_value("coroner_admission_policies_verified")

    assert gauge() == 0, "before the first read: unknown is never verified"
    asyncio.run(op.permissions.refresh_admission())
    assert gauge() == 0
    kube.listed = served()
    asyncio.run(op.permissions.refresh_admission())
    assert gauge() == 1
    kube.listed = ApiError(403, "Forbidden", "no list")
    asyncio.run(op.permissions.refresh_admission())
    assert gauge() == 0


class FakeElector:
    """A leader election whose outcome the test sets."""

    def __init__(self) -> None:
        self.leading = asyncio.Event()

    @property
    def is_leader(self) -> bool:
        return self.leading.is_set()

    async def wait_leader(self) -> None:
        await self.leading.wait()


def test_a_standby_asks_nothing_and_a_new_leader_asks_at_once() -> None:
    """Cost per replica: a standby's reviews and admission lists would double the API load for
    facts nobody decides with (its reconciles are gated); the leader it becomes asks at once."""

    async def scenario() -> tuple[int, int, int]:
        kube = FakeKube(served())
        elector = FakeElector()
        refresh = refresher(kube, world_with(*KEYS), [])
        refresh.interval_seconds = 0.01
        task = asyncio.create_task(refresh.run(elector=elector))  # type: ignore[arg-type]
        for _ in range(20):  # many intervals as a standby
            await asyncio.sleep(0.01)
        standby = kube.lists
        elector.leading.set()
        for _ in range(200):
            if kube.lists:
                break
            await asyncio.sleep(0.001)
        leading = kube.lists
        elector.leading.clear()
        for _ in range(20):
            await asyncio.sleep(0.01)
        after = kube.lists
        for _ in range(20):
            await asyncio.sleep(0.01)
        task.cancel()
        return standby, leading, kube.lists - after

    standby, leading, after_losing = asyncio.run(scenario())
    assert standby == 0
    assert leading >= 1
    assert after_losing == 0
