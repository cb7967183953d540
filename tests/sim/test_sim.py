"""The deterministic simulation (docs/simulation.md): its model API server, its replay, its mutants,
and the CI batch of seeded trials with every oracle counter at 0.

`CORONER_SIM_TRIALS` sets the size of the CI batch (default `CI_TRIALS`, over every CPU; 100,000 take
about 4 minutes on this project's 2-core machine when it is quiet, with the venv made from an optimized
CPython: see docs/simulation.md, "The scale goals"), `CORONER_SIM_JOBS` its processes.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from sim import run
from sim.apiserver import Server, SimApiError, Watcher, retired
from sim.loop import ROOT, Owner, SimLoop
from sim.mutants import MUTANTS
from sim.trial import COUNTERS, FAULTS, NOTIFICATIONS

#: The CI batch: seeds from 1,000,000,000 (apart from bench/sim.py's), in chunks over every CPU.
CI_TRIALS = 100_000
CI_FIRST_SEED = 1_000_000_000

#: Every mutant must be caught within this many seeds (counted from seed 0); bench/sim.py reports
#: the measured seeds-to-detection.
MUTANT_LIMIT = 2000

#: Seeds that once failed, each for a reason now fixed (docs/simulation.md, "Findings"). A seed
#: names a scenario only for the generator of its commit: when the generator changes, the finding
#: is kept as a test of its own (below) and the seed dropped from here.
REGRESSIONS: dict[int, str] = {}


# --- the model API server ----------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.due: list[tuple[float, object]] = []

    def at(self, when: float, fn: object) -> None:
        self.due.append((when, fn))

    def flush(self) -> None:
        while self.due:
            _, fn = self.due.pop(0)
            fn()  # type: ignore[operator]


def _server() -> tuple[Server, _Clock]:
    clock = _Clock()
    return Server(at=clock.at, clock=lambda: clock.now), clock


def _registration(name: str = "w", node: str = "n0") -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": "jobs", "labels": {"coroner.dev/node": node}},
        "spec": {"nodeName": node, "incarnation": {"pid": 1}},
    }


def test_a_failed_test_op_is_422_and_writes_nothing() -> None:
    server, _ = _server()
    created = server.create("launcher", "wreg", _registration())
    rv = created["metadata"]["resourceVersion"]
    with pytest.raises(SimApiError) as refused:
        server.patch("operator", "wreg", "jobs", "w", [
            {"op": "test", "path": "/metadata/resourceVersion", "value": "999"},
            {"op": "add", "path": "/status", "value": {"conditions": []}},
        ])  # fmt: skip
    assert refused.value.status == 422
    assert server.get("wreg", "jobs", "w")["metadata"]["resourceVersion"] == rv
    patched = server.patch(
        "operator", "wreg", "jobs", "w", [{"op": "test", "path": "/metadata/resourceVersion", "value": rv},
                                          {"op": "add", "path": "/status", "value": {"conditions": []}}],
    )  # fmt: skip
    assert int(patched["metadata"]["resourceVersion"]) > int(rv)


def test_a_stale_delete_is_409() -> None:
    server, _ = _server()
    created = server.create("launcher", "wreg", _registration())
    server.merge_status("launcher", "wreg", "jobs", "w", {"status": {"lastHeartbeatTime": "x"}})
    with pytest.raises(SimApiError) as refused:
        server.delete(
            "operator", "wreg", "jobs", "w", uid=created["metadata"]["uid"],
            resource_version=created["metadata"]["resourceVersion"],
        )  # fmt: skip
    assert refused.value.status == 409


def test_admission_by_identity() -> None:
    server, _ = _server()
    server.create("launcher", "wreg", _registration())
    retire = [{"op": "add", "path": "/status", "value": {"retirement": {"reason": "PidfdExited"}, "state": "Retired"}}]
    with pytest.raises(SimApiError, match="does not hold the retire verb"):
        server.patch("agent:n0", "wreg", "jobs", "w", retire)
    conditions = [{"op": "add", "path": "/status", "value": {"conditions": [{"type": "Retirable"}]}}]
    with pytest.raises(SimApiError, match=r"may change only status\.attestation"):
        server.patch("agent:n0", "wreg", "jobs", "w", conditions)
    with pytest.raises(SimApiError, match="another node"):
        server.patch("agent:n1", "wreg", "jobs", "w", [{"op": "add", "path": "/status", "value": {"attestation": {}}}])
    with pytest.raises(SimApiError, match=r"may not write status\.attestation"):
        server.patch("operator", "wreg", "jobs", "w", [{"op": "add", "path": "/status", "value": {"attestation": {}}}])
    server.grant = False
    with pytest.raises(SimApiError) as refused:
        server.patch("operator", "wreg", "jobs", "w", retire)
    assert refused.value.status == 403
    server.grant = True
    with pytest.raises(SimApiError, match="retiredBy must be the requester"):  # policy 6: the evidence
        server.patch("operator", "wreg", "jobs", "w", retire)
    attestation = {"verdict": "Dead", "evidence": "PidfdExited", "incarnation": {"pid": 1}, "agent": {"nodeName": "n0"}}
    server.patch(
        "agent:n0", "wreg", "jobs", "w", [{"op": "add", "path": "/status", "value": {"attestation": attestation}}]
    )
    record = {"reason": "PidfdExited", "retiredBy": "operator", "attestation": attestation}
    with pytest.raises(SimApiError, match="the Retired condition must name the evidence"):
        server.patch("operator", "wreg", "jobs", "w", [
            {"op": "add", "path": "/status/retirement", "value": record},
            {"op": "add", "path": "/status/conditions", "value": [{"type": "Retired", "status": "True", "reason": "X"}]},
            {"op": "add", "path": "/status/state", "value": "Retired"},
        ])  # fmt: skip
    retired = [{"op": "add", "path": "/status/retirement", "value": record}]
    with pytest.raises(SimApiError, match=r"status\.state must be Retired"):  # the CRD's rule on status
        server.patch("operator", "wreg", "jobs", "w", retired)
    server.patch(
        "operator", "wreg", "jobs", "w", [*retired, {"op": "add", "path": "/status/state", "value": "Retired"}]
    )
    goodbye = {"metadata": {"name": "w", "namespace": "jobs"},
               "status": {"conditions": [{"type": "Released", "status": "True"}]}}  # fmt: skip
    with pytest.raises(SimApiError, match="cannot be Released"):
        server.apply_status("launcher", "wreg", goodbye)
    with pytest.raises(SimApiError, match="terminal history"):
        server.patch("operator", "wreg", "jobs", "w", [{"op": "add", "path": "/status/retirement", "value": {}}])


def test_watch_lag_bookmarks_and_410_after_compaction() -> None:
    server, clock = _server()
    seen: list[str] = []
    relists: list[int] = []
    watch = Watcher(
        server, name="t", kind="wreg", selector=lambda b: True, lag=1.0,
        on_event=lambda etype, body: seen.append(f"{etype} {body['metadata']['name']}"),
        on_relist=lambda items: relists.append(len(items)),
    )  # fmt: skip
    server.watchers.append(watch)
    watch.start()
    server.create("launcher", "wreg", _registration("a"))
    assert seen == [] and clock.due  # lagged: delivered when its delivery is due
    clock.flush()
    assert seen == ["ADDED a"]
    server.upsert("agent:n0", "lease", {"metadata": {"name": "coroner-agent-n0", "namespace": "coroner-system"}})
    watch.deliver()
    assert watch.pos == server.rv  # a bookmark moved it past an event of another kind
    watch.connected = False
    server.create("launcher", "wreg", _registration("b"))
    server.create("launcher", "wreg", _registration("c"))
    server.compact(keep=1)
    watch.connected = True
    watch.deliver()
    assert watch.gone == 1 and relists == [0, 3]  # 410 Gone: relisted


def test_events_withheld_while_disconnected_are_delivered_after_reconnecting() -> None:
    """Found by seed 1037 (generator of 25b655c): the unobserved-state fault released its withheld
    events into a disconnected watch, which dropped them; the operator never saw a Dead attestation."""
    server, clock = _server()
    seen: list[str] = []
    watch = Watcher(
        server, name="t", kind="wreg", selector=lambda b: True, lag=0.0,
        on_event=lambda etype, body: seen.append(body["metadata"]["resourceVersion"]), on_relist=lambda items: None,
    )  # fmt: skip
    server.watchers.append(watch)
    watch.start()
    server.create("launcher", "wreg", _registration("a"))
    clock.flush()
    watch.withhold[("jobs", "a")] = 2
    server.merge_status("launcher", "wreg", "jobs", "a", {"status": {"lastHeartbeatTime": "1"}})
    clock.flush()
    assert seen == ["1"] and watch.stash
    watch.connected = False
    watch.release_withheld()
    watch.connected = True
    watch.deliver()
    assert seen == ["1", "2"]


def test_a_lagging_replica_lists_the_past() -> None:
    server, _ = _server()
    server.create("launcher", "wreg", _registration("a"))
    rv = server.rv
    server.create("launcher", "wreg", _registration("b"))
    items, at = server.list("wreg", lambda b: True, at_rv=rv)
    assert at == rv and [i["metadata"]["name"] for i in items] == ["a"]


# --- the kernel ----------------------------------------------------------------------------------


def test_a_reboot_ends_every_process_and_never_keeps_its_boot_id() -> None:
    """Found by seed 5159 (generator of f5aaf34): drawn from a small pool, a reboot could keep its
    boot id, and a process of the old boot still counted as alive for the oracle."""
    import random

    from sim.kernel import SimNode

    node = SimNode(name="n0", rng=random.Random(1), now=0.0)
    for _ in range(200):
        proc = node.spawn(now=1.0)
        before = node.boot_id
        node.boot(2.0)
        assert node.boot_id != before and not proc.alive and not node.procs


def test_the_holder_of_a_root_namespace_pid_may_live_in_a_child_namespace() -> None:
    """Found by seed 1,000,005,641 (generator of 3621879): every process has a pid in the root pid
    namespace, its host pid; one in a child namespace holds that number there too, and the probe
    rightly reads a registration recorded with it as Reused, not dead."""
    import random

    from sim.kernel import CHILD_NS_POOL, ROOT_NS, SimNode

    node = SimNode(name="n0", rng=random.Random(1), now=0.0)
    child = node.spawn(now=1.0, ns=node.new_namespace(now=1.0), host_pid=303)
    assert child.ns == CHILD_NS_POOL[0]
    assert node.holder(ns=ROOT_NS, ns_pid=303) is child
    assert node.holder(ns=CHILD_NS_POOL[0], ns_pid=child.ns_pid) is child
    assert node.holder(ns=CHILD_NS_POOL[1], ns_pid=child.ns_pid) is None


def test_a_pid_namespace_ends_with_its_pid_1_and_its_inode_goes_to_the_next_one_made() -> None:
    """The kernel's rules the agent's PidNamespaceRecreated rests on: a namespace's pid 1 is its
    first process, the namespace takes no process once pid 1 is gone, and its freed inode number is
    the next namespace's (lowest free first); a container restarted there has the same pid again."""
    import random

    import pytest

    from sim.kernel import CHILD_NS_POOL, SimNode

    node = SimNode(name="n0", rng=random.Random(1), now=0.0)
    ns = node.container("c0", now=1.0)
    worker = node.spawn(now=1.5, ns=ns)
    other = node.spawn(now=1.5, ns=node.container("c1", now=1.5))
    assert (ns, worker.ns_pid) == (CHILD_NS_POOL[0], 2) and other.ns == CHILD_NS_POOL[1]
    init = node.namespaces[ns]
    assert node.exit(init) == [init, worker] and not worker.alive and ns not in node.namespaces
    with pytest.raises(KeyError):
        node.spawn(now=2.0, ns=ns)
    again = node.spawn(now=2.0, ns=node.container("c0", now=2.0))
    assert (again.ns, again.ns_pid) == (worker.ns, worker.ns_pid)  # the same number, in a new namespace
    assert again.ns_serial != worker.ns_serial and node.namespaces[ns].start_time > worker.start_time
    assert other.alive and node.container("c1", now=2.0) == other.ns


# --- the loop ----------------------------------------------------------------------------------


def test_the_loop_runs_in_virtual_time_and_drops_every_callback_of_a_dead_owner() -> None:
    loop, seen = SimLoop(), []
    owner = Owner("operator")

    async def component() -> None:
        seen.append(("slept", loop.time()))
        await asyncio.sleep(5.0)
        seen.append(("woke", loop.time()))  # never: its owner died at 3 s
        await asyncio.sleep(1.0)

    async def request_in_flight() -> None:
        future = loop.create_future()
        loop.call_later(4.0, future.set_result, "answer")  # scheduled in the owner's context
        seen.append(("answered", await future))

    loop.start(owner, component())
    loop.start(owner, request_in_flight())
    loop.call_at(3.0, lambda: setattr(owner, "alive", False), context=ROOT)
    loop.call_at(7.0, lambda: seen.append(("trial", loop.time())), context=ROOT)
    loop.run_until(10.0)
    assert seen == [("slept", 0.0), ("trial", 7.0)]
    assert loop.time() == 10.0 and not loop.errors


def test_a_task_that_fails_unobserved_is_an_error_of_its_trial() -> None:
    # Nobody awaits it: asyncio reports "exception was never retrieved" when the task is let go of,
    # which must be during the trial (the loop keeps no strong reference to its tasks).
    loop = SimLoop()

    async def fails() -> None:
        raise ValueError("nobody looks")

    loop.start(Owner("operator"), fails())
    loop.run_until(1.0)
    assert [str(e.get("exception")) for e in loop.errors] == ["nobody looks"], loop.errors


def test_at_a_trials_end_its_pending_tasks_are_closed() -> None:
    loop, seen = SimLoop(), []

    async def waits() -> None:
        try:
            await asyncio.sleep(100.0)
        finally:
            seen.append("closed")

    loop.start(Owner("operator"), waits())
    loop.run_until(1.0)
    loop.abandon()
    assert seen == ["closed"] and not loop.errors  # the trial's loop never runs again


# --- the simulation ------------------------------------------------------------------------------


def test_a_seed_replays_step_for_step() -> None:
    with run.installed():
        first = run.one(4242, trace=True)
        second = run.one(4242, trace=True)
    assert first.trace == second.trace and first.trace
    assert first.result.steps == second.result.steps  # type: ignore[attr-defined]


def test_every_fault_and_sieve_pattern_is_drawn() -> None:
    # A time-travel retirement needs the draw to pick an operator and a notification it then sees:
    # seeds 0-999 anchor it at three notifications, 0-1,099 at four.
    summary = run.batch(range(1200))
    assert all(summary["faults"][fault] > 0 for fault in FAULTS), summary["faults"]
    stats = summary["stats"]
    assert any(k.startswith("sieve:crash_after_write:operator") for k in stats)
    assert any(k.startswith("sieve:crash_after_write:agent") for k in stats)
    assert any(k.startswith("sieve:unobserved") for k in stats)
    assert sum(1 for label in NOTIFICATIONS if stats.get(f"sieve:time_travel:{label}:retirement")) >= 4
    assert not summary["failures"], summary["failures"][:3]


def test_a_retirement_refused_by_admission_is_handled_by_the_production_executor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Seed 22 without faults: one worker, killed, retired by the one operator. Here an admission
    # policy refuses every retirement (in kube-apiserver's words): the operator's executor says so
    # in Retirable (RetireRefusedByAdmission) and keeps the registration, as it does in a cluster.
    said = "held by the test"
    denial = (
        'workerregistrations.coroner.dev "w0" is forbidden: ValidatingAdmissionPolicy '
        f"'coroner-retire-requires-evidence' with binding 'coroner-retire-requires-evidence' denied request: {said}"
    )
    patch = Server.patch

    def refusing(server: Server, identity: str, kind: str, namespace: str, name: str, ops: list[Any],
                 **kwargs: Any) -> dict[str, Any]:  # fmt: skip
        if any(op.get("path") == "/status/retirement" for op in ops):
            raise SimApiError(422, "Invalid", denial)
        return patch(server, identity, kind, namespace, name, ops, **kwargs)

    monkeypatch.setattr(Server, "patch", refusing)
    with run.installed():
        trial = run.one(22, faults=())
    body = trial.server.objects[("wreg", "jobs", "w0")]
    conditions = {c["type"]: c for c in body["status"]["conditions"]}
    assert conditions["Retirable"]["reason"] == "RetireRefusedByAdmission", conditions["Retirable"]
    assert said in conditions["Retirable"]["message"]
    assert "retirement" not in body["status"]
    assert trial.stats["operator:coroner_retire_abandoned:RetireRefusedByAdmission"] >= 1


def test_a_write_between_the_decision_and_the_retirement_is_a_conflict_the_operator_recovers_from() -> None:
    # Seed 13 with only this fault: one worker, killed. Another client annotates the registration
    # each time a retirement's Lease fence is read (twice), so each compare-and-swap tests a
    # resourceVersion that has moved: refused, read again, decided again, retired on the third.
    with run.installed():
        trial = run.one(13, faults=("bystander_write",))
    assert trial.stats["bystander_writes"] == 2
    assert trial.stats["operator:coroner_cas_conflicts"] == 2
    assert trial.stats["operator:coroner_retirements:PidfdExited"] == 1
    assert retired(trial.server.objects[("wreg", "jobs", "w0")])
    assert not trial.violations


@pytest.mark.parametrize("seed", sorted(REGRESSIONS) or [pytest.param(0, marks=pytest.mark.skip("none"))])
def test_regression_seed(seed: int) -> None:
    summary = run.batch([seed])
    assert not summary["failures"], (REGRESSIONS[seed], summary["failures"])


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_the_oracles_catch_the_mutant(mutant: str) -> None:
    hunt = run.hunt(mutant, limit=MUTANT_LIMIT)
    assert hunt["caught"], f"{mutant} ({hunt['breaks']}) survived {MUTANT_LIMIT} seeds"
    print(f"{mutant}: caught after {hunt['seeds_to_detection']} seeds by {hunt['oracle']}: {hunt['replay']}")


@pytest.mark.timeout(3600)  # a guard against a hang, not a timing claim
def test_the_ci_batch_of_seeded_trials() -> None:
    trials = int(os.environ.get("CORONER_SIM_TRIALS", str(CI_TRIALS)))
    jobs = int(os.environ.get("CORONER_SIM_JOBS", str(os.cpu_count() or 1)))
    # Chunks small enough that the processes finish together (the totals do not depend on them).
    summary = run.parallel(CI_FIRST_SEED, trials, jobs=jobs, chunk=max(1, min(1000, trials // (jobs * 8) or 1)))
    run.report(summary)
    print(f"CPU {summary['cpu_seconds'] / max(1, summary['trials']) * 1000:.2f} ms a trial over {jobs} processes")
    assert summary["trials"] == trials
    assert {c: summary["violations"].get(c, 0) for c in COUNTERS} == dict.fromkeys(COUNTERS, 0), [
        f"seed {f['seed']}: {f['counter']}: {f['detail']} (replay: {f['replay']})" for f in summary["failures"]
    ]
