"""`coroner run` and `registered()` against real processes and the real API server."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from kubernetes import client as k8s

from coroner import launcher
from coroner.client.rest import Rest
from coroner_dev.devcluster.cluster import Cluster
from support import components, kube

pytestmark = [pytest.mark.integration, pytest.mark.procs]

CORONER = str(pathlib.Path(sys.executable).parent / "coroner")


def run(cluster: Cluster, namespace: str, name: str, *command: str, **popen: object) -> subprocess.Popen[str]:
    argv = [CORONER, "run", "-n", namespace, "--node-name=node-a", f"--name={name}",
            f"--kubeconfig={cluster.kubeconfig}", "--interval-seconds=1", "--ttl-seconds=3", "--", *command]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)  # type: ignore[call-overload]


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> int:
    """Waits for the launcher and closes its pipes (an unread pipe is a ResourceWarning)."""
    proc.communicate(timeout=timeout)
    return proc.returncode


def released(admin: k8s.ApiClient, namespace: str, name: str) -> bool:
    found = components.condition(kube.get_registration(admin, namespace, name), "Released")
    return found is not None and found["status"] == "True"


def test_clean_exit_releases_and_exit_status_is_the_childs(
    coroner_api: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    proc = run(coroner_api, namespace, "ok", "sh", "-c", "sleep 2")
    assert finish(proc, 60) == 0
    assert released(admin, namespace, "ok")
    body = kube.get_registration(admin, namespace, "ok")
    assert body["spec"]["clientInstanceId"].startswith("inst-")
    assert body["status"]["lastHeartbeatTime"]


def test_failing_child_is_not_released_and_its_status_is_passed_on(
    coroner_api: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    proc = run(coroner_api, namespace, "fails", "sh", "-c", "sleep 1; exit 3")
    assert finish(proc, 60) == 3
    assert not released(admin, namespace, "fails")


def test_sigterm_is_forwarded_and_counts_as_a_clean_exit(
    coroner_api: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    proc = run(coroner_api, namespace, "term", "sleep", "60")
    kube.wait_for(lambda: kube.exists(admin, namespace, "term"), what="registration")
    proc.send_signal(signal.SIGTERM)
    assert finish(proc, 30) == 128 + signal.SIGTERM
    assert released(admin, namespace, "term")


def test_kill_9_of_the_child_is_not_a_goodbye(coroner_api: Cluster, admin: k8s.ApiClient, namespace: str) -> None:
    proc = run(coroner_api, namespace, "killed", "sleep", "60")
    kube.wait_for(lambda: kube.exists(admin, namespace, "killed"), what="registration")
    child = int(pathlib.Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
    registered_pid = kube.get_registration(admin, namespace, "killed")["spec"]["incarnation"]["pid"]
    assert registered_pid == child, "the registration names the child's own incarnation"
    os.kill(child, signal.SIGKILL)
    assert finish(proc, 30) == 128 + signal.SIGKILL
    assert not released(admin, namespace, "killed")
    beat = kube.get_registration(admin, namespace, "killed")["status"]["lastHeartbeatTime"]
    time.sleep(2.5)
    assert kube.get_registration(admin, namespace, "killed")["status"]["lastHeartbeatTime"] == beat, "no heartbeats"


def test_name_taken_by_another_incarnation_is_a_clear_error(
    coroner_api: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    kube.create_registration(admin, namespace, kube.registration_body(name="taken"))
    proc = run(coroner_api, namespace, "taken", "sleep", "60")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 125
    assert f"WorkerRegistration {namespace}/taken already exists for another incarnation" in err
    assert "choose another --name" in err


def test_missing_namespace_is_a_clear_error(coroner_api: Cluster) -> None:
    proc = run(coroner_api, "no-such-namespace", "w", "sleep", "60")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 125 and "no-such-namespace" in err


def worker_client(cluster: Cluster) -> Rest:
    """The launcher's own client (coroner.client.rest), for the admin identity."""
    return Rest.from_kubeconfig(cluster.kubeconfig)


def test_registration_is_idempotent_on_retry(coroner_api: Cluster, namespace: str) -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    client = worker_client(coroner_api)
    try:
        incarnation = launcher.probe_incarnation(sleeper.pid, node_name="node-a")
        first = launcher.register(
            client=client, namespace=namespace, node_name="node-a", incarnation=incarnation, name="idem"
        )
        again = launcher.register(
            client=client, namespace=namespace, node_name="node-a", incarnation=incarnation, name="idem"
        )
        assert again.body["metadata"]["uid"] == first.body["metadata"]["uid"]
    finally:
        sleeper.kill()
        sleeper.wait()


def test_python_api_registers_the_calling_process(coroner_api: Cluster, admin: k8s.ApiClient, namespace: str) -> None:
    with launcher.registered(
        namespace=namespace, node_name="node-a", kubeconfig=str(coroner_api.kubeconfig), name="inproc",
        interval_seconds=1, ttl_seconds=3,
    ) as registration:  # fmt: skip
        assert kube.get_registration(admin, namespace, "inproc")["spec"]["incarnation"]["pid"] == os.getpid()
        assert registration.name == "inproc"
    assert released(admin, namespace, "inproc")


def test_by_default_a_worker_is_written_once_and_says_goodbye_once(
    coroner_api: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    # No heartbeats unless asked (writes grow with nodes, not workers): the creation and the goodbye are the worker's writes.
    argv = [CORONER, "run", "-n", namespace, "--node-name=node-a", "--name=quiet",
            f"--kubeconfig={coroner_api.kubeconfig}", "--", "sh", "-c", "sleep 2"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert finish(proc, 60) == 0
    body = kube.get_registration(admin, namespace, "quiet")
    assert "heartbeat" not in body["spec"]
    assert "lastHeartbeatTime" not in body.get("status", {})
    assert released(admin, namespace, "quiet")
    managers = {entry["manager"] for entry in body["metadata"]["managedFields"]}
    assert "coroner-launcher" in managers, "the goodbye is the launcher's own server-side apply"


def test_the_goodbye_lands_whatever_was_written_since_and_never_on_a_retired_registration(
    coroner_api: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    client = worker_client(coroner_api)
    try:
        incarnation = launcher.probe_incarnation(sleeper.pid, node_name="node-a")
        moved = launcher.register(
            client=client, namespace=namespace, node_name="node-a", incarnation=incarnation, name="moved"
        )
        # Something else wrote since the launcher's last read (as the agent's attestation does).
        kube.patch_status(admin, namespace, "moved", {"status": {"lastHeartbeatTime": components.now_text()}})
        moved.release(message="clean")
        assert released(admin, namespace, "moved")

        retired = launcher.register(
            client=client, namespace=namespace, node_name="node-a", incarnation=incarnation, name="retired"
        )
        kube.patch_status(
            admin,
            namespace,
            "retired",
            {
                "status": {
                    "retirement": {
                        "retiredTime": components.now_text(),
                        "retiredBy": "admin",
                        "reason": "NodeOutOfService",
                        "statement": "Human",  # a person's node evidence says so (admission requires it)
                    },
                    "state": "Retired",
                }
            },
        )
        retired.release(message="too late")  # refused by the API server; the retirement stands
        assert not released(admin, namespace, "retired")
        with pytest.raises(k8s.ApiException) as refused:
            kube.patch_status(
                admin,
                namespace,
                "retired",
                {"status": {"conditions": [
                    {"type": "Released", "status": "True", "reason": "CleanExit", "message": "m",
                     "lastTransitionTime": components.now_text()[:19] + "Z"}
                ]}},
            )  # fmt: skip
        assert "cannot be Released" in str(refused.value.body)
    finally:
        sleeper.kill()
        sleeper.wait()
