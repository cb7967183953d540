"""The agent away and back on the real node: its Pod deleted as an upgrade deletes it, workers dying
and their containers restarted by the kubelet while no agent runs, and the DaemonSet's own rolling
update while workers crash-loop.

A container the kubelet restarts gets a new pid namespace, which the kernel often numbers with the
inode of a namespace just freed (the old container's, or another's), and its worker often gets the
same pid in it: the dead incarnation's (pidNamespace, pid) is then held by a live stranger. The
agent that comes back must read that as dead, not as a reuse of a live incarnation's pid, and never
confuse the stranger with the dead: `ProcAbsent` where the launcher recorded the process's pidfd
inode (no process has it any more), `PidNamespaceRecreated` where it could not (the namespace now
under that inode has a pid 1 that started after the incarnation).

"The agent's return" is measured from its first renewal of its node Lease (`renewTime`, written by
the new agent's Pod); a retirement's time is its `status.retirement.retiredTime`. Both are this
machine's clock. They run before test_3_node_loss, which ends the worker node.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from coroner.core import api
from coroner_dev import realnode
from coroner_dev.devcluster.cluster import Cluster
from support.nodes import NODE, agent_pids, get_json, host_pids, kubectl, registrations, state, verdict, wait_for

pytestmark = [
    pytest.mark.node,
    # The measured times are recorded with record_property, which pytest's default junit family
    # (xunit2) warns about under --junitxml; they are written all the same.
    pytest.mark.filterwarnings("ignore:record_property is incompatible:pytest.PytestWarning"),
]

SYSTEM = realnode.SYSTEM_NAMESPACE
AGENT_LABEL = "app.kubernetes.io/name=coroner-agent"
AGENT_LEASE = f"{api.AGENT_LEASE_PREFIX}{NODE}"
#: A label no node has: with it as the agent DaemonSet's nodeSelector, no agent runs anywhere.
KEPT_OFF = "coroner.dev/test-agent-kept-off"
#: Every dead incarnation is terminal within this many seconds of the agent's return.
RETURN_TO_TERMINAL_SECONDS = 30.0
#: Rounds of the agent-gap test before it gives up waiting for the kernel to reuse an inode.
MAX_ROUNDS = 30
#: Workers killed in each gap: each restart is a chance that a new pid namespace gets a freed inode.
WORKERS_PER_ROUND = 4

Registration = dict[str, Any]


def moment(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text)


def key(registration: Registration) -> tuple[str, int]:
    incarnation = registration["spec"]["incarnation"]
    return str(incarnation["pidNamespace"]), int(incarnation["pid"])


def held(registration: Registration) -> int | None:
    """The host pid of whatever process holds the registration's (pidNamespace, pid) now, if any."""
    namespace, pid = key(registration)
    return realnode.host_pid(f"pid:[{namespace}]", pid)


def of_role(items: list[Registration], role: str) -> list[Registration]:
    return [r for r in items if r["spec"].get("role") == role]


def describe(registration: Registration) -> str:
    status = registration.get("status", {})
    conditions = {c["type"]: c for c in status.get("conditions", [])}
    attestation = status.get("attestation", {})
    return (
        f"{registration['metadata']['name']} (role {registration['spec'].get('role')}, incarnation "
        f"{registration['spec']['incarnation']}): state={state(registration) or '-'} "
        f"verdict={attestation.get('verdict', '-')} evidence={attestation.get('evidence', '-')} "
        f"retirable={conditions.get('Retirable', {}).get('reason', '-')} "
        f"detail={attestation.get('detail', '-')!r}"
    )


def retired_seconds(registration: Registration, since: datetime.datetime) -> float:
    return (moment(registration["status"]["retirement"]["retiredTime"]) - since).total_seconds()


def terminal_seconds(registration: Registration, since: datetime.datetime) -> float:
    """From SINCE to the registration becoming terminal: its retiredTime, or its Released condition's
    transition (seconds precision)."""
    if state(registration) == "Retired":
        return retired_seconds(registration, since)
    (released,) = [c for c in registration["status"]["conditions"] if c["type"] == "Released"]
    return (moment(released["lastTransitionTime"]) - since).total_seconds()


def start_workers(
    cluster: Cluster, namespace: str, roles: list[str], *, command: Callable[[str], list[str]] | None = None
) -> dict[str, str]:
    """A Pod per role (restartPolicy Always) running `coroner run -- sleep MARKER` (or COMMAND(MARKER));
    returns each role's marker, by which the host finds its program."""
    markers = {role: f"3{uuid.uuid4().int % 10**6:06d}" for role in roles}
    pods = [
        realnode.worker_pod(
            role,
            namespace=namespace,
            node=NODE,
            cluster=cluster,
            command=command(markers[role]) if command else ["sleep", markers[role]],
            restart_policy="Always",
        )
        for role in roles
    ]
    realnode.apply_objects(cluster, pods)
    return markers


def alive_each(cluster: Cluster, namespace: str, roles: list[str], *, timeout: float = 90) -> dict[str, Registration]:
    """Each role's one registration, Active and attested Alive."""

    def every_one_alive() -> dict[str, Registration] | None:
        items = registrations(cluster, namespace)
        found = {}
        for role in roles:
            mine = of_role(items, role)
            if len(mine) != 1 or state(mine[0]) != "Active" or verdict(mine[0]) != "Alive":
                return None
            found[role] = mine[0]
        return found

    return wait_for(
        every_one_alive, timeout=timeout, what=f"one Active registration attested Alive for each of {roles}"
    )


def wait_or_explain(
    cluster: Cluster, namespace: str, predicate: Callable[[list[Registration]], bool], *, timeout: float, what: str
) -> list[Registration]:
    """Polls the namespace's registrations until PREDICATE holds; on a timeout, fails with each one's state."""

    def holds() -> list[Registration] | None:
        items = registrations(cluster, namespace)
        return items if items and predicate(items) else None

    try:
        return wait_for(holds, timeout=timeout, what=what)
    except AssertionError as exc:
        lines = "\n".join(describe(r) for r in registrations(cluster, namespace))
        raise AssertionError(f"{exc}; the registrations:\n{lines}") from None


def lease_spec(cluster: Cluster) -> dict[str, Any]:
    spec: dict[str, Any] = get_json(cluster, "-n", SYSTEM, "lease", AGENT_LEASE)["spec"]
    return spec


@dataclasses.dataclass(frozen=True, slots=True)
class AgentReturn:
    pod: str
    """The new agent's Pod (the Lease's holder)."""
    renewed: datetime.datetime
    """Its first renewal of the node Lease."""


def agent_return(cluster: Cluster, *, previous_holder: str, timeout: float = 180) -> AgentReturn:
    """The first renewal of the node's Lease by an agent Pod other than PREVIOUS_HOLDER (polled every
    0.1 s; the agent renews every 10 s, so the renewal seen is its first)."""

    def renewed_by_another() -> AgentReturn | None:
        spec = lease_spec(cluster)
        holder = spec.get("holderIdentity")
        if not holder or holder == previous_holder:
            return None
        return AgentReturn(pod=str(holder), renewed=moment(spec["renewTime"]))

    return wait_for(renewed_by_another, timeout=timeout, what="the new agent's first Lease renewal", interval=0.1)


def agent_pod_names(cluster: Cluster) -> list[str]:
    return [p["metadata"]["name"] for p in get_json(cluster, "-n", SYSTEM, "pods", "-l", AGENT_LABEL)["items"]]


def agent_daemonset_selector(cluster: Cluster, value: str | None) -> None:
    patch = {"spec": {"template": {"spec": {"nodeSelector": {KEPT_OFF: value}}}}}
    kubectl(cluster, "-n", SYSTEM, "patch", "daemonset", "coroner-agent", "--type=merge", "-p", json.dumps(patch))


@contextlib.contextmanager
def agent_kept_off_the_node(cluster: Cluster) -> Iterator[None]:
    """No agent on the node for the block. The DaemonSet is given a nodeSelector no node matches, so
    its controller deletes the agent's Pod as an upgrade does (the agent gets SIGTERM and, while its
    workers live, keeps attesting for its --shutdown-grace-seconds, 40, before it exits) and makes
    no new one until the selector is removed, when the block ends."""
    agent_daemonset_selector(cluster, "true")
    try:
        wait_for(
            lambda: not agent_pod_names(cluster) and not agent_pids(),
            timeout=120,
            what="the agent's Pod deleted and its process exited",
            interval=0.5,
        )
        yield
    finally:
        agent_daemonset_selector(cluster, None)


@dataclasses.dataclass(slots=True)
class GapRound:
    number: int
    dead: dict[str, Registration]
    """Role -> the incarnation killed while the agent was away (as Retired, in the end)."""
    live: dict[str, Registration]
    """Role -> the incarnation the kubelet restarted its container into."""
    reused: set[str]
    """Roles whose dead (pidNamespace, pid) a restarted incarnation of this round holds."""
    held_otherwise: set[str]
    """Roles whose dead (pidNamespace, pid) some other process holds."""
    back: AgentReturn
    seconds: dict[str, float]
    """Role -> seconds from the agent's return to the dead incarnation's retirement."""


def restarted(items: list[Registration], dead: dict[str, Registration]) -> dict[str, Registration] | None:
    """Role -> the one registration of its role other than the dead one, when every role has it."""
    found = {}
    for role, gone in dead.items():
        others = [r for r in of_role(items, role) if r["metadata"]["name"] != gone["metadata"]["name"]]
        if len(others) != 1:
            return None
        found[role] = others[0]
    return found


def agent_gap_round(cluster: Cluster, namespace: str, number: int) -> GapRound:
    roles = [f"gap{number}-{i}" for i in range(WORKERS_PER_ROUND)]
    start_workers(cluster, namespace, roles)
    dead = alive_each(cluster, namespace, roles)
    previous_holder = str(lease_spec(cluster)["holderIdentity"])

    with agent_kept_off_the_node(cluster):
        pids = {role: realnode.incarnation_pid(r) for role, r in dead.items()}
        assert all(pids.values()), f"round {number}: a worker not running before its kill: {pids}"
        for pid in pids.values():
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
        # Each container exits with its worker (`coroner run` returns 128 + 9) and the kubelet
        # restarts it at once (its first restart): a new `coroner run`, a new registration.
        live = wait_for(
            lambda: restarted(registrations(cluster, namespace), dead),
            timeout=90,
            what=f"round {number}: each killed worker's container restarted and registered again",
        )
        wait_for(
            lambda: all(realnode.incarnation_pid(r) is not None for r in live.values()),
            timeout=30,
            what=f"round {number}: the restarted incarnations running",
        )
        assert not agent_pids(), "the agent must still be away while the containers restart"
        assert all(realnode.incarnation_pid(r) is None for r in dead.values())
        live_keys = {key(r) for r in live.values()}
        reused = {role for role, r in dead.items() if key(r) in live_keys}
        held_otherwise = {role for role, r in dead.items() if role not in reused and held(r) is not None}
        for role in roles:
            print(
                f"round {number} {role}: dead {key(dead[role])} -> restarted {key(live[role])}"
                + (" (the dead pair is held by a restarted worker)" if role in reused else "")
                + (" (the dead pair is held by another process)" if role in held_otherwise else "")
            )

    back = agent_return(cluster, previous_holder=previous_holder)
    names = {r["metadata"]["name"]: role for role, r in dead.items()}
    items = wait_or_explain(
        cluster,
        namespace,
        lambda items: all(state(r) == "Retired" for r in items if r["metadata"]["name"] in names),
        timeout=RETURN_TO_TERMINAL_SECONDS + 60,
        what=f"round {number}: every incarnation killed while the agent was away Retired",
    )
    retired = {names[r["metadata"]["name"]]: r for r in items if r["metadata"]["name"] in names}
    seconds = {role: retired_seconds(r, back.renewed) for role, r in retired.items()}
    for role, r in sorted(retired.items()):
        print(
            f"round {number} {role}: agent return -> Retired {seconds[role]:.3f} s "
            f"({r['status']['retirement']['reason']})"
        )
    return GapRound(
        number=number,
        dead=retired,
        live=live,
        reused=reused,
        held_otherwise=held_otherwise,
        back=back,
        seconds=seconds,
    )


def check_gap_round(cluster: Cluster, namespace: str, done: GapRound, bystander: Registration) -> None:
    for role, r in done.dead.items():
        conditions = {c["type"]: c for c in r["status"]["conditions"]}
        assert conditions["Retired"]["status"] == "True", describe(r)
        reason = r["status"]["retirement"]["reason"]
        if role in done.reused and "pidfdInode" in r["spec"]["incarnation"]:
            # Found by its pidfd inode, which no process has any more: never fooled by the reuse.
            assert reason == "ProcAbsent", describe(r)
        elif role in done.reused:
            assert reason == "PidNamespaceRecreated", describe(r)
        elif role in done.held_otherwise:
            assert reason in ("PidNamespaceRecreated", "ProcAbsent"), describe(r)
        else:
            assert reason == "ProcAbsent", describe(r)
        # Attested by the agent that came back, on its node.
        agent = r["status"]["retirement"]["attestation"]["agent"]
        assert (agent["nodeName"], agent["podName"]) == (NODE, done.back.pod), describe(r)
        assert done.seconds[role] <= RETURN_TO_TERMINAL_SECONDS, (
            f"round {done.number}: {role} retired {done.seconds[role]:.3f} s after the agent's return"
        )
    # The restarted incarnations, the very strangers that hold the dead pairs, and the bystander that
    # lived through every gap: Active, attested Alive by the new agent, never retired.
    live_names = {r["metadata"]["name"] for r in [*done.live.values(), bystander]}
    items = wait_or_explain(
        cluster,
        namespace,
        lambda items: all(verdict(r) == "Alive" for r in items if r["metadata"]["name"] in live_names),
        timeout=30,
        what=f"round {done.number}: every live incarnation attested Alive by the agent that came back",
    )
    for r in items:
        if r["metadata"]["name"] in live_names:
            assert state(r) == "Active", describe(r)
            assert "retirement" not in r["status"], describe(r)
            assert realnode.incarnation_pid(r) is not None, describe(r)
    # The restarted ones registered while no agent ran: their first attestation is the new agent's.
    restarted_names = {r["metadata"]["name"] for r in done.live.values()}
    for r in items:
        if r["metadata"]["name"] in restarted_names:
            assert r["status"]["attestation"]["agent"]["podName"] == done.back.pod, describe(r)


@pytest.mark.timeout(MAX_ROUNDS * 180)
def test_a_container_restarted_while_its_agent_was_away_retires_the_dead_incarnation_even_under_its_reused_pid_namespace_inode(
    node_cluster: Cluster, worker_namespace: str, record_property: Callable[[str, object], None]
) -> None:
    realnode.rolled_out(node_cluster)
    start_workers(node_cluster, worker_namespace, ["bystander"])
    bystander = alive_each(node_cluster, worker_namespace, ["bystander"])["bystander"]

    rounds: list[GapRound] = []
    for number in range(1, MAX_ROUNDS + 1):
        done = agent_gap_round(node_cluster, worker_namespace, number)
        rounds.append(done)
        for role, seconds in sorted(done.seconds.items()):
            record_property(f"agent_return_to_retired_seconds[{role}]", round(seconds, 3))
        check_gap_round(node_cluster, worker_namespace, done, bystander)
        kubectl(
            node_cluster, "-n", worker_namespace, "delete", "pod", *done.dead, "--wait=true", timeout=120
        )  # fmt: skip
        if done.reused:
            break

    reused = [(done.number, role) for done in rounds for role in sorted(done.reused)]
    record_property("rounds", len(rounds))
    record_property("reused_pid_namespace_pairs", json.dumps(reused))
    print(f"{len(rounds)} round(s); dead (pidNamespace, pid) pairs held by a restarted worker: {reused}")
    assert reused, (
        f"in {MAX_ROUNDS} rounds of {WORKERS_PER_ROUND} containers restarted while the agent was away, the "
        "kernel never gave a restarted container's pid namespace a dead incarnation's inode with the same "
        "pid: the case of a dead incarnation's number held by a live one was not exercised"
    )
    (final,) = [
        r
        for r in registrations(node_cluster, worker_namespace)
        if r["metadata"]["name"] == bystander["metadata"]["name"]
    ]
    assert state(final) == "Active" and verdict(final) == "Alive", describe(final)


class Killer(threading.Thread):
    """From the host, SIGKILLs the program whose argv holds MARKER each time it has run EVERY seconds,
    as an OOM killer or a person would: a crash loop through the kubelet's restarts."""

    def __init__(self, marker: str, *, every: float) -> None:
        super().__init__(daemon=True, name=f"killer-{marker}")
        self.marker = marker
        self.every = every
        self.stopped = threading.Event()
        self.kills = 0

    def run(self) -> None:
        first_seen: dict[int, float] = {}
        while not self.stopped.wait(0.3):
            for pid in host_pids(self.marker):
                if time.monotonic() - first_seen.setdefault(pid, time.monotonic()) >= self.every:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                        self.kills += 1

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=10)


@pytest.mark.timeout(900)
def test_a_rolling_update_of_the_agent_while_workers_crash_loop_leaves_every_dead_incarnation_terminal_and_every_live_one_active(
    node_cluster: Cluster, worker_namespace: str, record_property: Callable[[str, object], None]
) -> None:
    realnode.rolled_out(node_cluster)
    steady = ["steady-a", "steady-b"]
    # steady-*: live throughout; gap: killed once, in the gap between the old agent's exit and the new
    # one's start; killed: SIGKILLed from the host whenever it has run 5 s; exits: exits 3 after 4 s.
    markers = start_workers(node_cluster, worker_namespace, [*steady, "gap", "killed"])
    start_workers(node_cluster, worker_namespace, ["exits"], command=lambda marker: ["sh", "-c", "sleep 4; exit 3"])
    before = alive_each(node_cluster, worker_namespace, [*steady, "gap"])
    killer = Killer(markers["killed"], every=5.0)
    killer.start()
    try:
        wait_or_explain(
            node_cluster,
            worker_namespace,
            lambda items: len(of_role(items, "killed")) >= 2 and len(of_role(items, "exits")) >= 2,
            timeout=120,
            what="both crash-looping workers registered at least twice",
        )
        previous_holder = str(lease_spec(node_cluster)["holderIdentity"])
        old_agent = set(agent_pids())
        assert old_agent
        kubectl(node_cluster, "-n", SYSTEM, "rollout", "restart", "daemonset/coroner-agent")
        # The old agent keeps attesting while it drains (its workers live: 40 s), then exits; the
        # DaemonSet creates the new Pod only once the old one is gone (maxUnavailable 1, no surge).
        wait_for(
            lambda: not old_agent & set(agent_pids()), timeout=120, what="the old agent's process exited", interval=0.1
        )
        gap_pid = realnode.incarnation_pid(before["gap"])
        assert gap_pid is not None
        os.kill(gap_pid, signal.SIGKILL)
        killed_in_gap = datetime.datetime.now(datetime.UTC)
        back = agent_return(node_cluster, previous_holder=previous_holder)
        assert killed_in_gap < back.renewed, "the gap worker must die before the new agent starts"
        snapshot = registrations(node_cluster, worker_namespace)
        dead_at_return = {r["metadata"]["name"]: r for r in snapshot if realnode.incarnation_pid(r) is None}
        # What the new agent alone can end: dead and not terminal at its start (the gap worker at least).
        left = {name for name, r in dead_at_return.items() if state(r) == "Active"}
        assert before["gap"]["metadata"]["name"] in left, describe(before["gap"])
        items = wait_or_explain(
            node_cluster,
            worker_namespace,
            lambda items: all(state(r) in ("Retired", "Released") for r in items if r["metadata"]["name"] in left),
            timeout=RETURN_TO_TERMINAL_SECONDS + 60,
            what="every incarnation dead at the new agent's start terminal",
        )
        seconds = {}
        for r in items:
            name = r["metadata"]["name"]
            if name in left:
                seconds[name] = terminal_seconds(r, back.renewed)
                reason = r["status"].get("retirement", {}).get("reason", "Released")
                print(
                    f"rollout: {r['spec']['role']} {name}: agent return -> {state(r)} {seconds[name]:.3f} s ({reason})"
                )
                record_property(
                    f"agent_return_to_terminal_seconds[{r['spec']['role']}/{name}]", round(seconds[name], 3)
                )
        assert all(s <= RETURN_TO_TERMINAL_SECONDS for s in seconds.values()), seconds
        realnode.rolled_out(node_cluster)
        # The crash loops go on under the new agent for a while.
        time.sleep(20)
    finally:
        killer.stop()

    def consistent(items: list[Registration]) -> bool:
        """Every running incarnation Active and Alive, every other one terminal."""
        for r in items:
            running = realnode.incarnation_pid(r) is not None
            if running and (state(r) != "Active" or verdict(r) != "Alive"):
                return False
            if not running and state(r) not in ("Retired", "Released"):
                return False
        return True

    items = wait_or_explain(
        node_cluster,
        worker_namespace,
        consistent,
        timeout=RETURN_TO_TERMINAL_SECONDS + 30,
        what="every running incarnation Active and Alive, every dead one terminal",
    )
    # No live incarnation retired: a Retired registration's exact incarnation runs nowhere.
    for r in items:
        if state(r) == "Retired":
            assert realnode.incarnation_pid(r) is None, describe(r)
            assert r["status"]["retirement"]["attestation"]["agent"]["nodeName"] == NODE, describe(r)
    for role in steady:
        (only,) = of_role(items, role)
        assert only["metadata"]["name"] == before[role]["metadata"]["name"]
        assert state(only) == "Active" and verdict(only) == "Alive", describe(only)
        assert "retirement" not in only["status"], describe(only)
        assert realnode.incarnation_pid(only) is not None
    print(
        f"rollout: {len(items)} registrations, {sum(state(r) == 'Retired' for r in items)} Retired, "
        f"{killer.kills} host kills of `killed`"
    )
    kubectl(node_cluster, "-n", worker_namespace, "delete", "pod", "--all", "--wait=false")
