"""The operator against the real API server: decisions become conditions, deaths become retirements.

The agent's part is played by the test with the agent's own node-bound identity (the admission
policies accept attestations from nobody else); tests with real agents and real processes live in
test_end_to_end.py.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import os
import pathlib
import re
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from coroner.client.kube import api_client
from coroner.core import api, wire
from coroner.core.model import parse_time
from coroner_dev.devcluster.cluster import Cluster
from support import components, kube

pytestmark = pytest.mark.integration

BOOT = kube.BOOT_ID
HOST = kube.HOST_ID


@pytest.fixture
def operator(granted: Cluster, tmp_path: pathlib.Path) -> Iterator[None]:
    config = components.operator_kubeconfig(granted)
    with components.process(components.operator_argv(config), log=tmp_path / "operator.log"):
        yield


def _register(admin: k8s.ApiClient, namespace: str, name: str, *, heartbeat_age: float = 0.0, **kwargs: object) -> None:
    kube.create_registration(admin, namespace, kube.registration_body(name=name, **kwargs))  # type: ignore[arg-type]
    kube.patch_status(admin, namespace, name, {"status": {"lastHeartbeatTime": components.now_text(-heartbeat_age)}})


def test_a_goodbye_the_operator_did_not_write_is_kept_exactly_as_written(
    operator: None, admin: k8s.ApiClient, namespace: str
) -> None:
    """The registrant's Released, timed to the microsecond with an offset (RFC 3339 allows both):
    the operator's conditions write must carry it back verbatim, or admission refuses that write
    (only the registrant changes its goodbye) on every try."""
    _register(admin, namespace, "bye")
    goodbye = {
        "type": "Released", "status": "True", "reason": "CleanExit", "message": "bye",
        "lastTransitionTime": datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds"),
    }  # fmt: skip
    # After the operator's first Retirable, which the goodbye keeps as written (a merge patch replaces
    # the whole list, and only the operator may change its own conditions).
    kube.wait_for(lambda: components.reason(admin, namespace, "bye"), what="the operator's first Retirable")
    written = kube.get_registration(admin, namespace, "bye")["status"]["conditions"]
    kube.patch_status(admin, namespace, "bye", {"status": {"conditions": [*written, goodbye], "state": "Released"}})
    kube.wait_for(
        lambda: components.reason(admin, namespace, "bye") == "AlreadyTerminal", what="Retirable AlreadyTerminal"
    )
    conditions = kube.get_registration(admin, namespace, "bye")["status"]["conditions"]
    assert [c for c in conditions if c["type"] == "Released"] == [goodbye]


def test_pidfd_death_is_retired_with_an_event(
    operator: None, agent_a: k8s.ApiClient, admin: k8s.ApiClient, namespace: str
) -> None:
    _register(admin, namespace, "w1")
    components.attest(agent_a, namespace, "w1", evidence="PidfdExited")
    kube.wait_for(lambda: components.retired(admin, namespace, "w1"), what="retirement")
    body = kube.get_registration(admin, namespace, "w1")
    retirement = body["status"]["retirement"]
    assert retirement["reason"] == "PidfdExited"
    assert retirement["retiredBy"] == "system:serviceaccount:coroner-system:coroner-operator"
    assert retirement["attestation"]["verdict"] == "Dead"
    assert components.condition(body, "Retired")["status"] == "True"
    events = kube.wait_for(lambda: components.events(admin, namespace), what="Retired event")
    assert len(events) == 1 and "PidfdExited" in events[0].message


def test_a_live_worker_is_never_retired_and_nothing_is_rewritten(
    operator: None, agent_a: k8s.ApiClient, admin: k8s.ApiClient, namespace: str
) -> None:
    _register(admin, namespace, "alive", heartbeat_age=120)  # long silent, but the agent says Alive
    components.attest(agent_a, namespace, "alive", verdict="Alive", evidence="PidfdPinned")
    kube.wait_for(lambda: components.reason(admin, namespace, "alive") == "PidAlive", what="PidAlive")
    settled = kube.get_registration(admin, namespace, "alive")["metadata"]["resourceVersion"]
    time.sleep(5)
    body = kube.get_registration(admin, namespace, "alive")
    assert body["metadata"]["resourceVersion"] == settled, "an unchanged decision must not be written again"
    assert "retirement" not in body["status"]


def test_heartbeat_after_the_attestation_preserves(
    operator: None, agent_a: k8s.ApiClient, admin: k8s.ApiClient, namespace: str
) -> None:
    _register(admin, namespace, "w1", heartbeat_age=120)
    # Plan-only is not in play here; a heartbeat landing after the Dead attestation must stop it.
    components.attest(agent_a, namespace, "w1", evidence="ProcAbsent")
    kube.patch_status(admin, namespace, "w1", {"status": {"lastHeartbeatTime": components.now_text()}})
    kube.wait_for(
        lambda: (
            components.reason(admin, namespace, "w1") in ("HeartbeatAfterAttestation",)
            or components.retired(admin, namespace, "w1")
        ),
        what="a decision",
    )
    # Either the operator saw the heartbeat first (preserved), or it retired before the heartbeat
    # was written (a race the heartbeat lost, legitimately). The next test pins the race itself.
    if not components.retired(admin, namespace, "w1"):
        assert components.reason(admin, namespace, "w1") == "HeartbeatAfterAttestation"


def test_proc_absent_waits_for_its_corroboration_window(
    operator: None, agent_a: k8s.ApiClient, admin: k8s.ApiClient, namespace: str
) -> None:
    # interval 3 s: ProcAbsent may retire only after 6 s of silence (2 x interval), long before the
    # 60 s TTL. Judged on the recorded times, not on how fast this machine happens to be.
    _register(admin, namespace, "w1", interval=3, ttl=60)
    components.attest(agent_a, namespace, "w1", evidence="ProcAbsent")
    kube.wait_for(lambda: components.retired(admin, namespace, "w1"), timeout=60, what="retirement")
    status = kube.get_registration(admin, namespace, "w1")["status"]
    silence = (
        parse_time(status["retirement"]["retiredTime"]) - parse_time(status["lastHeartbeatTime"])
    ).total_seconds()
    assert 6 <= silence < 60, f"retired after {silence:.1f} s of silence"
    assert status["retirement"]["reason"] == "ProcAbsent"


def test_protecting_lease_holder_is_preserved(
    operator: None, agent_a: k8s.ApiClient, admin: k8s.ApiClient, namespace: str
) -> None:
    _register(admin, namespace, "w1", heartbeat_age=120)
    k8s.CoordinationV1Api(admin).create_namespaced_lease(
        namespace,
        {
            "metadata": {"name": "leader"},
            "spec": {"holderIdentity": "w1", "leaseDurationSeconds": 3600, "renewTime": components.now_text()},
        },
    )
    components.attest(agent_a, namespace, "w1", evidence="PidfdExited")
    kube.wait_for(lambda: components.reason(admin, namespace, "w1") == "ProtectedLeaseHolder", what="protected")
    k8s.CoordinationV1Api(admin).delete_namespaced_lease("leader", namespace)
    kube.wait_for(lambda: components.retired(admin, namespace, "w1"), what="retirement once the Lease is gone")


def test_malformed_heartbeat_and_foreign_attestation_are_preserved_with_precise_reasons(
    operator: None, agent_a: k8s.ApiClient, admin: k8s.ApiClient, namespace: str
) -> None:
    kube.create_registration(admin, namespace, kube.registration_body(name="garbled"))
    kube.patch_status(admin, namespace, "garbled", {"status": {"lastHeartbeatTime": "yesterday-ish"}})
    components.attest(agent_a, namespace, "garbled")
    kube.wait_for(lambda: components.reason(admin, namespace, "garbled") == "UnparsableHeartbeat", what="reason")
    _register(admin, namespace, "untrusted", heartbeat_age=120, client_instance_id="handmade-1")
    components.attest(agent_a, namespace, "untrusted")
    kube.wait_for(
        lambda: components.reason(admin, namespace, "untrusted") == "UntrustedIdentityProvenance", what="reason"
    )


def test_plan_only_until_granted_then_retires_without_restart(
    granted: Cluster, agent_a: k8s.ApiClient, admin: k8s.ApiClient, namespace: str, tmp_path: pathlib.Path
) -> None:
    components.install(granted, grant=False)
    try:
        config = components.operator_kubeconfig(granted)
        with components.process(components.operator_argv(config), log=tmp_path / "operator.log"):
            _register(admin, namespace, "w1", heartbeat_age=120)
            components.attest(agent_a, namespace, "w1")
            kube.wait_for(
                lambda: components.reason(admin, namespace, "w1") == "RetirePermissionMissing", what="plan-only"
            )
            assert not components.retired(admin, namespace, "w1")
            components.install(granted, grant=True)
            kube.wait_for(lambda: components.retired(admin, namespace, "w1"), what="retirement after the grant")
    finally:
        components.install(granted, grant=True)


def _register_dead(admin: k8s.ApiClient, agent: k8s.ApiClient, namespace: str, count: int) -> list[str]:
    """`count` registrations, each registered then attested Dead; eight at a time (one at a time,
    two hundred of them took most of a test's time, waiting on round trips)."""
    names = [f"w{i:04d}" for i in range(count)]

    def one(name: str) -> None:
        _register(admin, namespace, name, heartbeat_age=120)
        components.attest(agent, namespace, name, evidence="PidfdExited")

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, names))
    return names


def _all_retired(admin: k8s.ApiClient, namespace: str, count: int) -> bool:
    items = kube.custom(admin).list_namespaced_custom_object(
        "coroner.dev", "v1alpha1", namespace, "workerregistrations"
    )["items"]
    return len(items) == count and all("retirement" in (i.get("status") or {}) for i in items)


def test_two_operators_racing_retire_each_registration_exactly_once(
    granted: Cluster, agent_a: k8s.ApiClient, admin: k8s.ApiClient, namespace: str, tmp_path: pathlib.Path
) -> None:
    count = 200
    # The agent stays live for the whole race. With the fixture's 60 s Lease a slow machine saw it
    # expire mid-race, and the rest were then rightly kept (AgentUnavailable): not this test's subject.
    components.put_agent_lease(admin, node="node-a", boot_id=BOOT, host_id=HOST, duration=900)
    config = components.operator_kubeconfig(granted)
    with (
        components.process(components.operator_argv(config), log=tmp_path / "operator-1.log"),
        components.process(components.operator_argv(config), log=tmp_path / "operator-2.log"),
    ):
        _register_dead(admin, agent_a, namespace, count)
        kube.wait_for(lambda: _all_retired(admin, namespace, count), timeout=120, what="all retired")
        time.sleep(2)  # let any late duplicate attempt surface
    # Each retirement is counted in exactly one Event, posted by the replica that won the CAS: its
    # own (the first --event-burst per namespace and window of each replica) or an aggregate's count
    # (the rest, flushed at the latest when the operator stops, as it just did).
    events = components.events(admin, namespace)
    assert sum(e.count or 1 for e in events) == count, [(e.involved_object.name, e.count) for e in events]
    assert len({e.involved_object.name for e in events}) == len(events)
    assert any((e.count or 1) > 1 and "combined from similar events" in e.message for e in events)
    logs = (tmp_path / "operator-1.log").read_text() + (tmp_path / "operator-2.log").read_text()
    # Only this namespace: leftovers of earlier tests in namespaces still terminating may be retired too.
    assert logs.count(f"retired workerregistration={namespace}/") == count


def test_operator_killed_mid_retirement_converges_without_double_retirement(
    granted: Cluster, agent_a: k8s.ApiClient, admin: k8s.ApiClient, namespace: str, tmp_path: pathlib.Path
) -> None:
    count = 60
    config = components.operator_kubeconfig(granted)
    _register_dead(admin, agent_a, namespace, count)
    with components.process(components.operator_argv(config), log=tmp_path / "operator-1.log") as first:
        kube.wait_for(
            lambda: f"retired workerregistration={namespace}/" in (tmp_path / "operator-1.log").read_text(),
            timeout=60,
            interval=0.01,
            what="the first retirement",
        )
        first.kill()  # SIGKILL, mid-stream
        first.wait()
    with components.process(components.operator_argv(config), log=tmp_path / "operator-2.log"):
        kube.wait_for(lambda: _all_retired(admin, namespace, count), timeout=120, what="convergence")
    events = components.events(admin, namespace)
    assert len(events) <= count and len({e.involved_object.name for e in events}) == len(events)
    # A SIGKILL may land between a successful write and its log line or Event, so those may be
    # missing for the write in flight; what must never happen is a name retired twice.
    logs = (tmp_path / "operator-1.log").read_text() + (tmp_path / "operator-2.log").read_text()
    retired_names = re.findall(rf"retired workerregistration=({re.escape(namespace)}/\S+)", logs)
    assert len(retired_names) == len(set(retired_names)) >= count - 8


def test_grant_revoked_between_two_deaths(
    granted: Cluster, agent_a: k8s.ApiClient, admin: k8s.ApiClient, namespace: str, operator: None
) -> None:
    _register(admin, namespace, "first", heartbeat_age=120)
    components.attest(agent_a, namespace, "first")
    kube.wait_for(lambda: components.retired(admin, namespace, "first"), what="first retired")
    kube.kubectl(granted, "delete", "clusterrolebinding", "coroner-operator-retire")
    try:
        _register(admin, namespace, "second", heartbeat_age=120)
        components.attest(agent_a, namespace, "second")
        kube.wait_for(
            lambda: components.reason(admin, namespace, "second") == "RetirePermissionMissing", what="plan-only"
        )
        time.sleep(2)
        assert not components.retired(admin, namespace, "second")
    finally:
        components.install(granted, grant=True)


def _reviews_sent(cluster: Cluster) -> float:
    """SelfSubjectAccessReviews the API server has answered so far (its own request counter)."""
    text = kube.kubectl(cluster, "get", "--raw", "/metrics").stdout
    pattern = r'^apiserver_request_total\{[^}]*resource="selfsubjectaccessreviews"[^}]*\} ([0-9.e+]+)$'
    return sum(float(found) for found in re.findall(pattern, text, re.MULTILINE))


def test_a_retirement_sends_no_review_and_a_revocation_bites_at_the_write(
    granted: Cluster, agent_a: k8s.ApiClient, admin: k8s.ApiClient, namespace: str, tmp_path: pathlib.Path
) -> None:
    """The retire verb is enforced by admission on the retirement write itself: the operator asks
    no review per retirement, and a revocation the periodic refresh has not seen yet (it runs once
    an hour here) is found by the write's refusal and recorded as RetirePermissionMissing."""
    config = components.operator_kubeconfig(granted)
    argv = components.operator_argv(config, "--permission-refresh-seconds=3600")
    with components.process(argv, log=tmp_path / "operator.log"):
        _register(admin, namespace, "first", heartbeat_age=120)
        components.attest(agent_a, namespace, "first")
        kube.wait_for(lambda: components.retired(admin, namespace, "first"), what="first retired")
        reviews = _reviews_sent(granted)
        _register(admin, namespace, "second", heartbeat_age=120)
        components.attest(agent_a, namespace, "second")
        kube.wait_for(lambda: components.retired(admin, namespace, "second"), what="second retired")
        assert _reviews_sent(granted) == reviews, "a retirement asked a SelfSubjectAccessReview"
        kube.kubectl(granted, "delete", "clusterrolebinding", "coroner-operator-retire")
        try:
            _register(admin, namespace, "third", heartbeat_age=120)
            components.attest(agent_a, namespace, "third")
            kube.wait_for(
                lambda: components.reason(admin, namespace, "third") == "RetirePermissionMissing", what="plan-only"
            )
            assert not components.retired(admin, namespace, "third")
            logs = (tmp_path / "operator.log").read_text()
            assert "cause=RetirePermissionMissing" in logs and "refused the retirement" in logs, logs[-3000:]
        finally:
            components.install(granted, grant=True)


def _refused_status_patches(cluster: Cluster) -> float:
    """Status PATCHes of registrations the API server answered 422, so far (its own counter)."""
    text = kube.kubectl(cluster, "get", "--raw", "/metrics").stdout
    found = 0.0
    for line in text.splitlines():
        if (
            line.startswith("apiserver_request_total{")
            and 'code="422"' in line
            and 'resource="workerregistrations"' in line
            and 'subresource="status"' in line
            and 'verb="PATCH"' in line
        ):
            found += float(line.rsplit(" ", 1)[1])
    return found


CONDITIONS_POLICY = "coroner-status-fields-by-identity"


def _stuff_past_admission(
    cluster: Cluster, admin: k8s.ApiClient, namespace: str, name: str, conditions: list[dict[str, str]]
) -> None:
    """Writes `conditions` with the conditions policy unbound, then binds it again and waits until
    admission enforces it once more (a policy change reaches admission a moment after it lands), so
    that the tests after this one meet it."""

    def admitted(written: list[dict[str, str]], dry_run: str | None) -> bool:
        try:
            k8s.CustomObjectsApi(admin).patch_namespaced_custom_object_status(
                api.GROUP, api.VERSION, namespace, api.PLURAL, name, {"status": {"conditions": written}},
                dry_run=dry_run, _content_type=wire.MERGE_PATCH,
            )  # fmt: skip
        except k8s.exceptions.ApiException as exc:
            if exc.status != 403:
                raise
            return False
        return True

    try:
        kube.kubectl(cluster, "delete", "validatingadmissionpolicybinding", CONDITIONS_POLICY)
        kube.wait_for(lambda: admitted(conditions, None), what=f"the stuffing admitted, {CONDITIONS_POLICY} unbound")
    finally:
        components.install(cluster, grant=True)
    changed = [{**conditions[0], "message": "changed"}, *conditions[1:]]
    kube.wait_for(lambda: not admitted(changed, "All"), what=f"{CONDITIONS_POLICY} enforced again")


def test_conditions_stuffed_to_the_crds_limit_back_off_instead_of_spinning(
    granted: Cluster, agent_a: k8s.ApiClient, admin: k8s.ApiClient, namespace: str, tmp_path: pathlib.Path
) -> None:
    """Conditions filled up to the CRD's maxItems (16): the operator's conditions write, which
    appends Attested and Retirable, is refused 422 though nothing moved. It must back off (capped
    exponential) and say so, not re-read and write again at once. Admission refuses conditions
    other than Coroner's own; a registration stuffed while that policy was unbound (installed late,
    or removed by someone) is what remains to handle, so the test unbinds it only to stuff."""
    _register(admin, namespace, "stuffed")
    stuffing = [
        {"type": f"Peer{i}", "status": "True", "reason": "Stuffed", "message": "a peer's",
         "lastTransitionTime": components.now_text()}
        for i in range(16)
    ]  # fmt: skip
    _stuff_past_admission(granted, admin, namespace, "stuffed", stuffing)
    before = _refused_status_patches(granted)
    config = components.operator_kubeconfig(granted)
    log = tmp_path / "operator.log"
    with components.process(components.operator_argv(config), log=log):
        kube.wait_for(lambda: _refused_status_patches(granted) > before, what="the first refused write")
        first = _refused_status_patches(granted)
        time.sleep(8)
        refused = _refused_status_patches(granted) - first
    assert refused <= 6, f"{refused} refused writes in 8 s: a hot loop, not a backoff"
    text = log.read_text()
    assert "refused though it had not moved" in text and "retry_in=" in text, text[-3000:]


def _metric(port: int, name: str, labels: str = "") -> float:
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    found = re.search(rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+]+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_metrics_and_deletion_of_terminal_registrations_after_their_retention(
    granted: Cluster, agent_a: k8s.ApiClient, admin: k8s.ApiClient, namespace: str, tmp_path: pathlib.Path
) -> None:
    import socket
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = components.operator_kubeconfig(granted)
    # The base manifests' RBAC (delete on workerregistrations, for this ServiceAccount only); a short
    # retention, and sweeps every second, which is what brings a due registration back for deletion.
    argv = components.operator_argv(
        config,
        f"--metrics-port={port}",
        "--metrics-bind-address=127.0.0.1",
        "--terminal-retention-seconds=4",
        "--resync-seconds=1",
    )
    with components.process(argv, log=tmp_path / "operator.log"):
        # Three processes (three pids): one alive however long silent, one said goodbye, one died.
        _register(admin, namespace, "alive", heartbeat_age=120, pid=5001)
        components.attest(agent_a, namespace, "alive", verdict="Alive", evidence="PidfdPinned")
        _register(admin, namespace, "released", pid=5002)
        goodbye = {"type": "Released", "status": "True", "reason": "CleanExit", "message": "bye",
                   "lastTransitionTime": components.now_text()}  # fmt: skip
        kube.patch_status(admin, namespace, "released", {"status": {"conditions": [goodbye], "state": "Released"}})
        _register(admin, namespace, "retired", heartbeat_age=120)
        components.attest(agent_a, namespace, "retired", evidence="PidfdExited")
        kube.wait_for(lambda: components.retired(admin, namespace, "retired"), what="retirement")
        # Until its retention ends the retirement is there to read: its status, its Event, its metric.
        # (The operator counts right after its write returns: the status may be visible first.
        # Not "== 1": leftovers of earlier tests in namespaces still terminating are the cluster's
        # too, and this operator may retire them as well.)
        kube.wait_for(
            lambda: _metric(port, "coroner_retirements_total", '{evidence="PidfdExited"}') >= 1,
            what=f"the retirement metric (see {tmp_path / 'operator.log'})",
        )
        assert _metric(port, "coroner_death_to_retirement_seconds_count") >= 1
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).status == 200
        events = kube.wait_for(lambda: components.events(admin, namespace), what="Retired event")
        assert [e.involved_object.name for e in events] == ["retired"]

        for name in ("retired", "released"):
            kube.wait_for(lambda name=name: not kube.exists(admin, namespace, name), timeout=60, what=f"{name} deleted")
        for terminal in ("Retired", "Released"):
            kube.wait_for(
                lambda terminal=terminal: (
                    _metric(port, "coroner_terminal_deletions_total", f'{{terminal="{terminal}"}}') >= 1
                ),
                what=f"the deletion metric ({terminal})",
            )
        logs = (tmp_path / "operator.log").read_text()
        assert f"deleted terminal workerregistration={namespace}/retired terminal=Retired" in logs
        assert f"deleted terminal workerregistration={namespace}/released terminal=Released" in logs
        # The active registration is never deleted, however long the retention has passed.
        time.sleep(5)
        assert components.reason(admin, namespace, "alive") == "PidAlive"
        assert _metric(port, "coroner_registration_objects", '{state="active"}') >= 1


def test_a_delete_whose_preconditions_moved_leaves_the_registration_alone(
    granted: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    """The operator's DELETE (as its own ServiceAccount): refused with 409 when the object changed
    since it was read (resourceVersion) or is another object under the same name (uid)."""
    import asyncio

    from coroner.client.rest import ApiError, Rest
    from coroner_operator.kubeapi import KubeApi

    _register(admin, namespace, "w1")
    # Terminal, as every registration retention deletes is (admission refuses the operator an
    # active one: coroner-delete-only-terminal), released by its registrant.
    goodbye = {"type": "Released", "status": "True", "reason": "CleanExit", "message": "bye",
               "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
    kube.patch_status(admin, namespace, "w1", {"status": {"conditions": [goodbye], "state": "Released"}})
    read = kube.get_registration(admin, namespace, "w1")["metadata"]
    kube.patch_status(admin, namespace, "w1", {"status": {"lastHeartbeatTime": components.now_text()}})
    now = kube.get_registration(admin, namespace, "w1")["metadata"]
    assert now["resourceVersion"] != read["resourceVersion"]
    operator = KubeApi(Rest.default(components.operator_kubeconfig(granted)))
    try:
        for uid, resource_version in ((read["uid"], read["resourceVersion"]), ("another-uid", now["resourceVersion"])):
            with pytest.raises(ApiError) as refused:
                asyncio.run(
                    operator.delete_registration(
                        namespace=namespace, name="w1", uid=uid, resource_version=resource_version
                    )
                )
            assert refused.value.status == 409, refused.value
            assert (
                kube.get_registration(admin, namespace, "w1")["metadata"]["resourceVersion"] == now["resourceVersion"]
            )
        asyncio.run(
            operator.delete_registration(
                namespace=namespace, name="w1", uid=now["uid"], resource_version=now["resourceVersion"]
            )
        )
        assert not kube.exists(admin, namespace, "w1")
    finally:
        operator.close()


@pytest.mark.parametrize("glob", [False, True], ids=["exact", "glob"])
def test_a_namespaced_operator_serves_only_its_namespaces(
    granted: Cluster, agent_a: k8s.ApiClient, admin: k8s.ApiClient, namespace: str, tmp_path: pathlib.Path, glob: bool
) -> None:
    """An exact name is watched on its own; a glob watches every namespace and keeps its matches."""
    other = f"{namespace}-other"
    served = f"{namespace[:-1]}?" if glob else namespace
    k8s.CoreV1Api(admin).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=other)))
    try:
        config = components.operator_kubeconfig(granted)
        with components.process(components.operator_argv(config, f"--namespace={served}"), log=tmp_path / "op.log"):
            # The other namespace's registration first, and a second served retirement after the
            # first: an operator that served the other namespace would have decided it by then.
            for ns, name in ((other, "w1"), (namespace, "w1"), (namespace, "w2")):
                _register(admin, ns, name, heartbeat_age=120)
                components.attest(agent_a, ns, name, evidence="PidfdExited")
                if ns == namespace:
                    kube.wait_for(
                        lambda n=name: components.retired(admin, namespace, n),
                        what=f"{name} retired in the served namespace",
                    )
            assert components.reason(admin, other, "w1") is None and not components.retired(admin, other, "w1")
    finally:
        k8s.CoreV1Api(admin).delete_namespace(other)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(port: int, path: str) -> str:
    import urllib.request

    return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).read().decode()


def _operator_lease(admin: k8s.ApiClient) -> k8s.V1Lease | None:
    from kubernetes.client.exceptions import ApiException

    try:
        return k8s.CoordinationV1Api(admin).read_namespaced_lease(api.OPERATOR_LEASE, api.SYSTEM_NAMESPACE)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_the_standby_takes_over_after_the_leader_is_killed_and_retires_what_died_since(
    granted: Cluster, agent_a: k8s.ApiClient, admin: k8s.ApiClient, namespace: str, tmp_path: pathlib.Path
) -> None:
    """Two replicas with --leader-elect: only the leader retires; SIGKILL the leader (no release),
    and the standby takes the Lease once the leader's record has not changed for a lease duration
    (by its own clock) and retires a worker that died after the kill."""
    lease_duration, retry = 6.0, 1.0
    # Earlier tests' operators ran without election and left the Lease held by their ServiceAccount
    # for 180 s; an upgrade meets the same (see docs/operations.md): start from none.
    if _operator_lease(admin) is not None:
        k8s.CoordinationV1Api(admin).delete_namespaced_lease(api.OPERATOR_LEASE, api.SYSTEM_NAMESPACE)
    config = components.operator_kubeconfig(granted)
    ports = {"op-1": _free_port(), "op-2": _free_port()}

    def argv(identity: str) -> list[str]:
        return components.operator_argv(
            config,
            "--leader-elect",
            f"--leader-elect-identity={identity}",
            f"--leader-elect-lease-duration={lease_duration}",
            "--leader-elect-renew-deadline=4",
            f"--leader-elect-retry-period={retry}",
            f"--metrics-port={ports[identity]}",
            "--metrics-bind-address=127.0.0.1",
            "--resync-seconds=2",
            "--log-format=json",
        )

    def holder() -> str | None:
        lease = _operator_lease(admin)
        return None if lease is None else lease.spec.holder_identity

    def answers(port: int, path: str) -> str:
        try:
            return _get(port, path)
        except OSError:
            return ""

    logs = {name: tmp_path / f"{name}.log" for name in ports}
    with components.process(argv("op-1"), log=logs["op-1"]) as first:
        kube.wait_for(lambda: holder() == "op-1", timeout=60, what=f"op-1 leads (see {logs['op-1']})")
        with components.process(argv("op-2"), log=logs["op-2"]):
            kube.wait_for(lambda: answers(ports["op-2"], "/readyz") == "standby\n", timeout=60, what="op-2 stands by")
            assert _metric(ports["op-2"], "coroner_operator_leader") == 0
            assert answers(ports["op-2"], "/healthz").startswith("ok standby"), "a healthy standby is healthy"
            assert answers(ports["op-1"], "/readyz") == "leader\n"
            assert _metric(ports["op-1"], "coroner_operator_leader") == 1
            build = _get(ports["op-1"], "/metrics")
            assert re.search(
                r'^coroner_build_info\{commit="[^"]+",python="3\.[^"]+",version="[^"]+"\} 1\.0$', build, re.M
            )
            assert "process_resident_memory_bytes" in build and "python_gc_objects_collected_total" in build

            _register(admin, namespace, "before", heartbeat_age=120)
            components.attest(agent_a, namespace, "before", evidence="PidfdExited")
            kube.wait_for(lambda: components.retired(admin, namespace, "before"), what="the leader retires")
            transitions = _operator_lease(admin).spec.lease_transitions  # type: ignore[union-attr]

            first.kill()  # SIGKILL: no release, the standby must wait the Lease out
            first.wait()
            killed = time.monotonic()
            _register(admin, namespace, "after", heartbeat_age=120)
            components.attest(agent_a, namespace, "after", evidence="PidfdExited")
            kube.wait_for(
                lambda: holder() == "op-2",
                # lease duration + a jittered retry, plus what a loaded machine adds to each step
                timeout=lease_duration + retry * 1.2 + 30,
                interval=0.1,
                what=f"op-2 takes over (see {logs['op-2']})",
            )
            took_over = time.monotonic() - killed
            kube.wait_for(lambda: components.retired(admin, namespace, "after"), timeout=60, what="op-2 retires")
            assert answers(ports["op-2"], "/readyz") == "leader\n"
            assert _metric(ports["op-2"], "coroner_operator_leader") == 1
            lease = _operator_lease(admin)
            assert lease is not None and lease.spec.lease_transitions == transitions + 1

            def swept() -> dict[str, str] | None:
                current = _operator_lease(admin)
                found = (current.metadata.annotations or {}) if current is not None else {}
                return found if api.LAST_SWEEP_ANNOTATION in found and current.spec.holder_identity == "op-2" else None

            annotations = kube.wait_for(swept, what="the new leader's sweep on its Lease")
            assert api.POLICY_ANNOTATION in annotations
            # The holder is a pod's name; the operator's user rides on the Lease for doctor.
            assert (
                annotations[api.OPERATOR_USER_ANNOTATION]
                == f"system:serviceaccount:{api.SYSTEM_NAMESPACE}:coroner-operator"
            )
    print(f"takeover {took_over:.1f} s after SIGKILL (lease duration {lease_duration} s, retry {retry} s)")
    one = logs["op-1"].read_text()
    two = logs["op-2"].read_text()
    assert f"retired workerregistration={namespace}/before" in one
    assert f"retired workerregistration={namespace}/before" not in two, "the standby retired nothing"
    assert f"retired workerregistration={namespace}/after" in two
    # --log-format=json: every line, kopf's and Coroner's alike, is one JSON object.
    import json

    records = [json.loads(line) for line in two.splitlines() if line.strip()]
    assert all("message" in r and "severity" in r and "logger" in r for r in records)
    assert {"coroner.operator", "coroner.leader"} <= {r["logger"] for r in records}
    assert any(r["logger"].startswith("kopf") for r in records), "kopf's own lines are JSON too"
    assert any(r["message"].startswith(f"retired workerregistration={namespace}/after") for r in records)


def test_the_lease_field_selector_leaves_out_kube_node_lease_on_the_real_server(
    granted: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    """What kopf sends with the operator's Lease list and watch (handlers.LEASE_FIELD_SELECTOR), as
    the operator's ServiceAccount: the kubelets' node Leases are not sent, a worker's Lease is."""
    from coroner_operator.handlers import LEASE_FIELD_SELECTOR

    coordination = k8s.CoordinationV1Api(admin)
    for ns, name in (("kube-node-lease", "node-ha-test"), (namespace, "worker-held")):
        body = {"metadata": {"name": name, "namespace": ns}, "spec": {"holderIdentity": name}}
        try:
            coordination.create_namespaced_lease(ns, body)
        except k8s.exceptions.ApiException as exc:
            if exc.status != 409:
                raise
    with api_client(components.operator_kubeconfig(granted)) as operator:
        seen = k8s.CoordinationV1Api(operator).list_lease_for_all_namespaces(field_selector=LEASE_FIELD_SELECTOR)
    names = {(item.metadata.namespace, item.metadata.name) for item in seen.items}
    assert (namespace, "worker-held") in names
    assert not any(ns == "kube-node-lease" for ns, _ in names)
    coordination.delete_namespaced_lease("node-ha-test", "kube-node-lease")


def test_the_operator_states_its_user_on_its_lease_only_it_may_and_doctor_reads_it_as_a_planner(
    operator: None, granted: Cluster, admin: k8s.ApiClient
) -> None:
    """The operator writes its own user (its SelfSubjectReview) on its Lease at startup; someone else
    whom RBAC lets update Leases in the system namespace is refused by admission policy 9
    (coroner-system-leases-by-owner) when they rewrite it; and `kubectl coroner doctor` run with
    only `coroner-planner` (which may not list Deployments) learns the operator's user from there."""
    user = f"system:serviceaccount:{api.SYSTEM_NAMESPACE}:{api.OPERATOR_SERVICE_ACCOUNT}"

    def stated() -> str | None:
        lease = _operator_lease(admin)
        annotations = (lease.metadata.annotations or {}) if lease is not None else {}
        return annotations.get(api.OPERATOR_USER_ANNOTATION)

    assert kube.wait_for(stated, what="the operator's user on its Lease") == user

    suffix = uuid.uuid4().hex[:6]
    mallory, planner = f"mallory-{suffix}", f"planner-{suffix}"
    rbac = k8s.RbacAuthorizationV1Api(admin)
    rbac.create_namespaced_role(
        api.SYSTEM_NAMESPACE,
        {
            "metadata": {"name": mallory},
            "rules": [
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "update", "patch"]}
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        api.SYSTEM_NAMESPACE,
        {
            "metadata": {"name": mallory},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": mallory},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": mallory}],
        },
    )
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": planner},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "coroner-planner"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": planner}],
        }
    )
    try:
        forged = f"{api.OPERATOR_USER_ANNOTATION}=system:serviceaccount:{api.SYSTEM_NAMESPACE}:forged"
        lease = f"lease/{api.OPERATOR_LEASE}"
        allowed = kube.kubectl(
            granted, "auth", "can-i", "patch", lease, "-n", api.SYSTEM_NAMESPACE, f"--as={mallory}", check=False
        )
        assert allowed.stdout.strip() == "yes", "RBAC lets mallory write the Lease: admission must refuse"
        refused = kube.kubectl(
            granted,
            "annotate",
            "--overwrite",
            "-n",
            api.SYSTEM_NAMESPACE,
            lease,
            forged,
            f"--as={mallory}",
            check=False,
        )
        assert refused.returncode != 0
        assert f"{mallory} may not write Lease {api.SYSTEM_NAMESPACE}/{api.OPERATOR_LEASE}" in refused.stderr
        assert stated() == user

        env = {key: value for key, value in os.environ.items() if key != "KUBECONFIG"}
        env["PATH"] = f"{components.BIN}{os.pathsep}{env.get('PATH', '')}"
        ran = subprocess.run(
            [str(granted.binary("kubectl")), "coroner", "doctor", "-o", "json", "--as", planner,
             f"--kubeconfig={granted.kubeconfig}"],
            capture_output=True, text=True, env=env, timeout=120, check=False,
        )  # fmt: skip
        checks = {check["name"]: check for check in json.loads(ran.stdout)["checks"]}
        grant = checks["retire-grant"]
        assert grant["facts"]["user"] == user, grant["summary"]
        assert f"Lease {api.SYSTEM_NAMESPACE}/{api.OPERATOR_LEASE}" in grant["facts"]["userFrom"], grant["summary"]
        assert checks["admission-content"]["status"] == "PASS", checks["admission-content"]["summary"]
    finally:
        rbac.delete_cluster_role_binding(planner)
        rbac.delete_namespaced_role_binding(mallory, api.SYSTEM_NAMESPACE)
        rbac.delete_namespaced_role(mallory, api.SYSTEM_NAMESPACE)
