"""What the fault harness found, pinned as tests. Each was a strict xfail until its fix landed.

Each test states the invariant the way the fault run checks it and fails today for the reason in its
marker; when the fix lands it passes, strict xfail turns that into a failure, and the marker goes.
docs/faults.md ("Findings") has the cause and the proposed fix of each.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import subprocess
import time

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.core import api, wire
from coroner_dev import fleet
from faults import runner
from faults.plane import AGENT_SA, Plane, proxied_kubeconfig
from faults.trial import BOUND, Trial
from faults.workers import Worker, register, spawn
from support import kube

pytestmark = [
    pytest.mark.integration,
    pytest.mark.procs,
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.geteuid() != 0, reason="the fault plane's workers need root (pid namespaces)"),
]


def test_a_restored_grant_is_noticed_after_an_api_outage(plane: Plane) -> None:
    trial = Trial(plane, seed=301, faults=[], index=301)
    namespace = trial.namespace
    plane.create_trial_namespace(namespace)
    node = next(iter(plane.agents))
    worker = Worker(name="w", node=node, kind="sleep", victim=True, interval=1, ttl=3)
    try:
        spawn(worker)
        register(worker, client=plane.worker_client, namespace=namespace, boot_id_file=plane.agents[node].boot_file)
        kube.wait_for(lambda: _reason(plane, namespace, "w") == "PidAlive", timeout=30, what="PidAlive")
        # The operator loses its connection for a few permission-refresh periods (1 s each).
        plane.operator_proxy.set_mode("drop")
        time.sleep(3)
        plane.operator_proxy.set_mode("pass")
        time.sleep(2)
        plane.revoke_grant()
        kube.wait_for(lambda: not plane.operator_may_retire(namespace), timeout=15, what="revocation")
        worker.kill()
        kube.wait_for(lambda: _reason(plane, namespace, "w") == "RetirePermissionMissing", timeout=30, what="plan-only")
        plane.restore_grant()
        # README: "The operator notices the grant within --permission-refresh-seconds" (1 s here);
        # six periods is generous (the same step without the outage takes about one: grant_revoked).
        kube.wait_for(lambda: _retired(plane, namespace, "w"), timeout=6, what="retirement after the grant")
    finally:
        plane.restore_grant()
        worker.close()
        plane.delete_trial_namespace(namespace)
        runner.restart_operator(plane)


def test_an_agent_cannot_renew_another_nodes_lease(plane: Plane) -> None:
    source, target = list(plane.agents)[:2]
    client = plane.agent_client(source)
    coordination = k8s.CoordinationV1Api(client)
    name = f"{api.AGENT_LEASE_PREFIX}{target}"
    try:
        # The real agent renews every second: a renewal between the read and the forged write ends
        # it in 409 before admission sees it, which proves nothing, so read again and retry.
        for _ in range(10):
            lease = coordination.read_namespaced_lease(name, api.SYSTEM_NAMESPACE)
            lease.spec.holder_identity = f"forged-by-{source}"
            lease.metadata.annotations = {**(lease.metadata.annotations or {}), api.AGENT_LEASE_BOOT_ID: "forged"}
            with pytest.raises(ApiException) as refused:
                coordination.replace_namespaced_lease(name, api.SYSTEM_NAMESPACE, lease)
            if refused.value.status != 409:
                break
        assert refused.value.status == 403
    finally:
        client.close()
        # The real agent renews its Lease every second; make sure the forged boot id is gone.
        kube.wait_for(
            lambda: (
                (
                    k8s.CoordinationV1Api(plane.admin)
                    .read_namespaced_lease(name, api.SYSTEM_NAMESPACE)
                    .metadata.annotations
                    or {}
                ).get(api.AGENT_LEASE_BOOT_ID)
                == plane.agents[target].boot_id
            ),
            timeout=30,
            what="the real agent's Lease back",
        )


def test_an_operator_started_during_an_api_outage_retires_within_the_bound(plane: Plane) -> None:
    namespace, worker = _dead_worker_setup(plane)
    try:
        for operator in plane.operators:
            operator.stop()
        plane.operators = []
        plane.operator_proxy.set_mode("drop")
        operator = plane.start_operator()
        kube.wait_for(
            lambda: "cannot ask the API server who this operator is" in operator.log.read_text(errors="replace"),
            timeout=60,
            what="the operator's startup to meet the outage",
        )
        plane.operator_proxy.set_mode("pass")
        worker.kill()  # attested Dead by its (healthy) agent at once
        kube.wait_for(lambda: _retired(plane, namespace, "w"), timeout=BOUND, what="retirement")
    finally:
        plane.operator_proxy.set_mode("pass")
        _cleanup(plane, namespace, worker)


def test_an_agent_started_during_an_api_outage_serves_its_node_once_the_api_is_back(plane: Plane) -> None:
    namespace, worker = _dead_worker_setup(plane)
    agent = plane.agents[worker.node]
    try:
        agent.stop()
        agent.proxy.set_mode("drop")
        agent.start()
        time.sleep(8)  # its imports take a few seconds on this machine; then it meets the outage
        agent.proxy.set_mode("pass")
        time.sleep(2)
        assert agent.running, f"the agent exited with status {agent.proc.poll() if agent.proc else None}"
        worker.kill()
        kube.wait_for(lambda: _retired(plane, namespace, "w"), timeout=BOUND, what="retirement")
    finally:
        agent.proxy.set_mode("pass")
        if not agent.running:
            agent.stop()
            agent.start()
        _cleanup(plane, namespace, worker)


@pytest.mark.parametrize("status", [429, 401, 403])
def test_an_agent_that_met_a_restarting_api_server_names_itself_in_its_attestations(plane: Plane, status: int) -> None:
    """Found by the long run's shared rounds: zombie[agent-restarted] + apiserver_restart[crash]
    (seed 43501029): every retirement on that agent's attestations recorded identity 'unknown'.
    Seen again after the 429 fix (seed 1176102363 and others, resumed long run): the agent logged
    one unreachable try, then took the restarting server's next answer (no "busy" retry: a 4xx
    other than 429) as final."""
    namespace, worker = _dead_worker_setup(plane)
    agent = plane.agents[worker.node]
    try:
        agent.stop()
        answered = agent.proxy.answer(lambda r: r.path.startswith(SELF_REVIEW), status, times=1)
        agent.start()
        agent.wait_started()
        assert answered[0] == 1, "the agent never asked who it is"
        worker.kill()
        kube.wait_for(lambda: _retired(plane, namespace, "w"), timeout=BOUND, what="retirement")
        attestation = (_registration(plane, namespace, "w").get("status") or {}).get("retirement", {})["attestation"]
        assert attestation["agent"]["identity"] == AGENT_SA, attestation["agent"]
    finally:
        _cleanup(plane, namespace, worker)


SELF_REVIEW = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


#: What a restarting API server answers every client for a moment.
WARMING_UP = [
    # The admission policy plugin until its policies have synced (upstream k8s.io/apiserver
    # admission/plugin/policy/generic: "not yet ready to handle request").
    (403, 'workerregistrations.coroner.dev "w" is forbidden: not yet ready to handle request'),
    # The token authenticator a moment after a restart (finding 5, the agent's half).
    (401, "Unauthorized"),
    (503, "the server is currently unable to handle the request"),
]
#: The launcher's two writes: its create, and its goodbye (a server-side apply of Released).
LAUNCHER_WRITES = {
    "create": lambda r: r.method == "POST" and r.resource == api.PLURAL and r.name is None,
    "goodbye": lambda r: r.method == "PATCH" and r.resource == api.PLURAL and r.name == "w",
}


@pytest.mark.parametrize("write", list(LAUNCHER_WRITES))
@pytest.mark.parametrize(("status", "message"), WARMING_UP, ids=["admission-not-ready", "unauthorized", "unavailable"])
def test_the_launcher_outlasts_an_api_server_warming_up(plane: Plane, write: str, status: int, message: str) -> None:
    """Finding 5's other half: the agent's SelfSubjectReview waits out an API server that refuses
    for a moment after a restart, but `coroner run` took those answers as final. On its create it
    failed — with "not allowed to create ... bind the ClusterRole coroner-worker" for a 403 that
    said nothing about RBAC — so a worker started in that moment never ran; on its goodbye it
    ended in a traceback with exit status 1 instead of its worker's 0, and the goodbye was lost
    (the registration was left for the agent and the operator to retire). A proxy answers the first
    two such writes; the retire grant is revoked meanwhile, so that the operator's retirement of the
    exited worker cannot win the race with a goodbye held back for a moment (it is retired, true
    either way, when it does)."""
    trial = Trial(plane, seed=int(time.time()), faults=[], index=11)
    namespace = trial.namespace
    plane.create_trial_namespace(namespace)
    node = next(iter(plane.agents))
    proxy = plane.new_proxy(f"launcher-{write}-{status}")
    kubeconfig = proxied_kubeconfig(
        plane.worker_kubeconfig, proxy.port, plane.work / f"launcher-{write}-{status}.kubeconfig"
    )
    body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": status, "message": message})
    answered = proxy.answer(LAUNCHER_WRITES[write], status, times=2, body=body.encode())
    plane.revoke_grant()
    try:
        result = subprocess.run(
            fleet.run_argv(namespace=namespace, node=node, name="w", kubeconfig=kubeconfig,
                           boot_id_file=plane.agents[node].boot_file, command=("true",)),
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert answered[0] == 2, f"the proxy did not answer the launcher's {write}s"
        assert result.returncode == 0, result.stdout + result.stderr
        assert "bind the ClusterRole" not in result.stderr, result.stderr
        assert _registration(plane, namespace, "w")["status"]["state"] == "Released", result.stderr
    finally:
        plane.restore_grant()
        plane.delete_trial_namespace(namespace)


def _dead_worker_setup(plane: Plane) -> tuple[str, Worker]:
    """A namespace with one live registered `sleep` worker, attested Alive."""
    trial = Trial(plane, seed=int(time.time()), faults=[], index=9)
    namespace = trial.namespace
    plane.create_trial_namespace(namespace)
    node = next(iter(plane.agents))
    worker = Worker(name="w", node=node, kind="sleep", victim=True, interval=1, ttl=3)
    spawn(worker)
    register(worker, client=plane.worker_client, namespace=namespace, boot_id_file=plane.agents[node].boot_file)
    kube.wait_for(lambda: _reason(plane, namespace, "w") == "PidAlive", timeout=30, what="PidAlive")
    return namespace, worker


def _cleanup(plane: Plane, namespace: str, worker: Worker) -> None:
    worker.close()
    plane.delete_trial_namespace(namespace)
    runner.restart_operator(plane)
    for agent in plane.agents.values():
        agent.ensure_healthy()


def _registration(plane: Plane, namespace: str, name: str) -> dict[str, object]:
    return kube.get_registration(plane.admin, namespace, name)


def _reason(plane: Plane, namespace: str, name: str) -> str | None:
    for condition in (_registration(plane, namespace, name).get("status") or {}).get("conditions") or []:  # type: ignore[union-attr]
        if condition.get("type") == "Retirable":
            return str(condition.get("reason"))
    return None


def _retired(plane: Plane, namespace: str, name: str) -> bool:
    return "retirement" in (_registration(plane, namespace, name).get("status") or {})  # type: ignore[operator]


@pytest.mark.parametrize("graceful", [True, False], ids=["graceful", "crash"])
def test_status_writes_and_registrations_go_through_at_once_after_an_api_server_restart(
    plane: Plane, graceful: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Finding 7 (the long run, seeds 2219168164, 901570364, 1822940206: apiserver_restart[graceful]):
    for up to two minutes after a restart every status write answered 503 "Resource kind
    coroner.dev/v1alpha1, Kind=WorkerRegistration not found": a MutatingAdmissionPolicy on the
    status path needs the CRD's type converter, which the API server builds a while after it is
    ready, and answers 503 until then whatever its failurePolicy. Dead workers went without any
    condition for that long."""
    namespace, worker = _dead_worker_setup(plane)
    kube.create_registration(plane.admin, namespace, kube.registration_body(name="probe", node=worker.node))
    refused: list[str] = []
    newcomer = Worker(name="newcomer", node=worker.node, kind="sleep", victim=False)
    try:
        plane.restart_apiserver(graceful=graceful, during=worker.kill)
        kube.wait_for(lambda: _heartbeat(plane, namespace, "probe", refused), timeout=60, what="a status write")
        assert not [r for r in refused if "Resource kind" in r], refused
        # A worker starting now registers at once too: the launcher names its registrant itself, and
        # no mutating policy (which would answer 503 for now) records it.
        spawn(newcomer)
        with caplog.at_level(logging.INFO, logger="coroner.launcher"):
            register(newcomer, client=plane.worker_client, namespace=namespace,
                     boot_id_file=plane.agents[worker.node].boot_file)  # fmt: skip
        assert not [r.getMessage() for r in caplog.records if r.name == "coroner.launcher"], caplog.text
        kube.wait_for(lambda: _retired(plane, namespace, "w"), timeout=BOUND, what="retirement")
    finally:
        newcomer.close()
        _cleanup(plane, namespace, worker)


def _heartbeat(plane: Plane, namespace: str, name: str, refused: list[str]) -> bool:
    """A heartbeat written by the admin: True once admitted; refusals while the server warms go to `refused`."""
    try:
        kube.patch_status(plane.admin, namespace, name, wire.heartbeat_patch(datetime.datetime.now(datetime.UTC)))
    except ApiException as exc:
        if exc.status not in (0, 404, 500, 503):  # 404: the CRD is not served yet
            raise
        refused.append(f"{exc.status} {kube.api_error_body(exc).get('message')}")
        return False
    return True
