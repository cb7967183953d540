"""Coroner's own HTTP client (agent and operator) against the real API server: every way it gets credentials, its
errors, its watch, and the bound-token rotation a pod sees."""

from __future__ import annotations

import asyncio
import base64
import json
import pathlib
import threading
import time
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from coroner.client import rest as rest_mod
from coroner.client.rest import ApiError, Rest, registrations_path
from coroner.core import api, wire
from coroner.runtime.watch import reflect
from coroner_agent.kube import AgentApi
from coroner_dev.devcluster.cluster import Cluster
from support import components, kube

pytestmark = pytest.mark.integration

WHOAMI = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
REVIEW = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}


def username(client: Rest) -> str:
    return str(client.request("POST", WHOAMI, body=REVIEW)["status"]["userInfo"]["username"])


def kubeconfig_of(path: pathlib.Path) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text()))


def test_a_token_kubeconfig_and_a_client_certificate_kubeconfig_with_inline_data(
    cluster: Cluster, tmp_path: pathlib.Path
) -> None:
    agent = components.agent_kubeconfig(cluster, "rest-node")
    assert username(Rest.from_kubeconfig(agent)) == f"system:serviceaccount:{api.SYSTEM_NAMESPACE}:coroner-agent"

    admin = kubeconfig_of(cluster.kubeconfig)
    user, entry = admin["users"][0]["user"], admin["clusters"][0]["cluster"]
    user["client-certificate-data"] = base64.b64encode(
        pathlib.Path(user.pop("client-certificate")).read_bytes()
    ).decode()
    user["client-key-data"] = base64.b64encode(pathlib.Path(user.pop("client-key")).read_bytes()).decode()
    ca = pathlib.Path(entry.pop("certificate-authority")).read_bytes()
    entry["certificate-authority-data"] = base64.b64encode(ca).decode()
    inline = tmp_path / "inline.kubeconfig"
    inline.write_text(json.dumps(admin))
    assert username(Rest.from_kubeconfig(inline)) == "admin"


def test_in_cluster_credentials_and_a_rotated_token_file(
    cluster: Cluster, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, operator = (
        kubeconfig_of(components.agent_kubeconfig(cluster, "rest-node")),
        kubeconfig_of(components.operator_kubeconfig(cluster)),
    )
    server = agent["clusters"][0]["cluster"]["server"]
    host, port = server.removeprefix("https://").rsplit(":", 1)
    (tmp_path / "ca.crt").write_bytes(
        pathlib.Path(agent["clusters"][0]["cluster"]["certificate-authority"]).read_bytes()
    )
    (tmp_path / "token").write_text(agent["users"][0]["user"]["token"] + "\n")
    monkeypatch.setattr(rest_mod, "SERVICE_ACCOUNT_DIR", tmp_path)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    client = Rest.default(None)
    assert username(client).endswith(":coroner-agent")

    # The kubelet rotates the bound token: the next read of the file (after the re-read period) uses it.
    (tmp_path / "token").write_text(operator["users"][0]["user"]["token"])
    assert username(client).endswith(":coroner-agent"), "re-read at most once a minute"
    monkeypatch.setattr(rest_mod, "TOKEN_REREAD_SECONDS", 0.0)
    assert username(client).endswith(":coroner-operator")


def test_a_kubeconfig_it_cannot_use_is_refused_with_the_fix(cluster: Cluster, tmp_path: pathlib.Path) -> None:
    config = kubeconfig_of(cluster.kubeconfig)
    config["users"][0]["user"] = {"exec": {"command": "aws", "apiVersion": "client.authentication.k8s.io/v1"}}
    path = tmp_path / "exec.kubeconfig"
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"authenticates with 'exec'.*ServiceAccount token"):
        Rest.from_kubeconfig(path)
    config["current-context"] = "elsewhere"
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="no context named 'elsewhere'"):
        Rest.from_kubeconfig(path)


def test_errors_carry_the_status_and_the_servers_message(coroner_api: Cluster) -> None:
    # The agent's RBAC installed (it may read Leases in the system namespace): on a fresh cluster,
    # run first, a missing Lease would otherwise read 403, not 404.
    components.install(coroner_api, grant=False)
    client = Rest.from_kubeconfig(components.agent_kubeconfig(coroner_api, "rest-node"))
    with pytest.raises(ApiError) as forbidden:
        client.request("GET", "/api/v1/namespaces/kube-system/secrets")
    assert forbidden.value.status == 403
    assert "cannot list resource" in forbidden.value.message
    with pytest.raises(ApiError) as missing:
        client.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{api.SYSTEM_NAMESPACE}/leases/nope-404")
    assert missing.value.status == 404


def _attest(agent: AgentApi, body: dict[str, Any], attestation: dict[str, Any]) -> dict[str, Any]:
    """The agent's attestation write, as its executor sends it: the step's patch, through AgentApi."""
    meta = body["metadata"]
    return agent.patch_status(meta["namespace"], meta["name"], wire.attestation_ops(body, attestation))


def test_the_agent_api_lists_watches_and_attests_its_own_nodes_registrations(
    coroner_api: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    components.install(coroner_api, grant=False)
    node = "rest-node"
    agent = AgentApi(Rest.from_kubeconfig(components.agent_kubeconfig(coroner_api, node)), node_name=node)
    kube.create_registration(admin, namespace, kube.registration_body(name="mine", node=node))
    kube.create_registration(admin, namespace, kube.registration_body(name="theirs", node="other-node"))
    # The agent's own watch (list, then watch), its calls handed to an event loop as in production.
    loop = asyncio.new_event_loop()
    running = threading.Thread(target=loop.run_forever, daemon=True)
    running.start()
    relists: list[list[dict[str, Any]]] = []
    events: list[tuple[str, dict[str, Any]]] = []
    stop = threading.Event()
    watcher = threading.Thread(
        target=agent.watch_registrations,
        kwargs={
            "loop": loop, "stop": stop, "timeout_seconds": 5, "on_relist": relists.append,
            "on_event": lambda event_type, obj: events.append((event_type, obj)),
        },
    )  # fmt: skip
    watcher.start()
    kube.wait_for(lambda: relists, timeout=15, what="the agent's list")
    assert {i["metadata"]["name"] for i in relists[0] if i["metadata"]["namespace"] == namespace} == {"mine"}
    body = agent.get_registration(namespace, "mine")
    assert body is not None
    written = _attest(agent, body, components.attestation(body, verdict="Alive", node=node))
    assert written["status"]["attestation"]["verdict"] == "Alive"
    with pytest.raises(ApiError) as stale:  # the same compare-and-swap again: what it relied on moved
        _attest(agent, body, components.attestation(body, verdict="Dead", node=node))
    assert stale.value.status in (409, 422)
    kube.wait_for(
        lambda: ("MODIFIED", "mine") in {(t, o["metadata"]["name"]) for t, o in events},
        timeout=15,
        what="the attestation's watch event",
    )
    stop.set()
    watcher.join(timeout=15)
    loop.call_soon_threadsafe(loop.stop)
    running.join(timeout=5)
    loop.close()
    assert all(o["metadata"]["name"] != "theirs" for _, o in events)

    agent.renew_lease(holder="rest-test", duration=15, annotations={api.AGENT_LEASE_BOOT_ID: "b"})
    agent.renew_lease(holder="rest-test", duration=15, annotations={api.AGENT_LEASE_HOST_ID: "h"})
    lease = k8s.CoordinationV1Api(admin).read_namespaced_lease(f"{api.AGENT_LEASE_PREFIX}{node}", api.SYSTEM_NAMESPACE)
    assert lease.spec.holder_identity == "rest-test"
    assert lease.metadata.annotations[api.AGENT_LEASE_BOOT_ID] == "b"
    assert lease.metadata.annotations[api.AGENT_LEASE_HOST_ID] == "h"
    assert agent.get_registration(namespace, "absent") is None


class Recording(Rest):
    """The real client, noting each LIST and each watch query it sends."""

    def __init__(self, inner: Rest) -> None:
        self.__dict__.update(inner.__dict__)
        self.lists: list[dict[str, Any]] = []
        self.watches: list[dict[str, Any]] = []

    def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        if method == "GET":
            self.lists.append(dict(kwargs.get("query") or {}))
        return super().request(method, path, **kwargs)

    def watch(self, path: str, *, query: dict[str, Any], timeout_seconds: int) -> Any:
        self.watches.append(dict(query))
        return super().watch(path, query=query, timeout_seconds=timeout_seconds)


def test_the_api_server_serves_the_watch_a_streaming_list_in_pages_then_its_events(
    coroner_api: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    """The collection arrives as a streaming list (no LIST request at all), in pages, and the same
    stream goes on as the watch."""
    components.install(coroner_api, grant=False)
    for i in range(5):
        kube.create_registration(admin, namespace, kube.registration_body(name=f"w{i}", node="n"))
    client = Recording(Rest.from_kubeconfig(coroner_api.kubeconfig))
    pages: list[tuple[list[str], bool, bool]] = []
    events: list[tuple[str, str]] = []
    stop = threading.Event()
    watcher = threading.Thread(
        target=reflect,
        args=(client, registrations_path(namespace)),
        kwargs={
            "stop": stop, "page_limit": 2, "timeout_seconds": 30,
            "on_page": lambda items, first, last, _: pages.append(([i["metadata"]["name"] for i in items], first, last)),
            "on_event": lambda event_type, obj: events.append((event_type, obj["metadata"]["name"])),
        },
    )  # fmt: skip
    watcher.start()
    try:
        kube.wait_for(lambda: pages and pages[-1][2], timeout=15, what="the streaming list's last page")
        kube.create_registration(admin, namespace, kube.registration_body(name="later", node="n"))
        kube.wait_for(lambda: ("ADDED", "later") in events, timeout=15, what="the watch event after the list")
    finally:
        stop.set()
        watcher.join(timeout=40)
    assert [len(names) for names, _, _ in pages] == [2, 2, 1]
    assert sorted(n for names, _, _ in pages for n in names) == [f"w{i}" for i in range(5)]
    assert [(first, last) for _, first, last in pages] == [(True, False), (False, False), (False, True)]
    assert client.lists == [] and len(client.watches) == 1 and client.watches[0]["sendInitialEvents"]


def test_a_stale_attestation_never_lands_on_a_registration_created_again_under_its_name(
    coroner_api: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    """The agent read `again` (heartbeat H) and decided Dead; meanwhile it was deleted and created
    again for another incarnation whose heartbeat is also H. The write must be refused: the long
    fault run saw one accepted (seed 2026, trial 557, stale_view_agent)."""
    components.install(coroner_api, grant=False)
    node = "rest-node"
    agent = AgentApi(Rest.from_kubeconfig(components.agent_kubeconfig(coroner_api, node)), node_name=node)
    beat = {"status": {"lastHeartbeatTime": components.now_text()}}
    kube.create_registration(admin, namespace, kube.registration_body(name="again", node=node))
    kube.patch_status(admin, namespace, "again", beat)
    stale = agent.get_registration(namespace, "again")
    assert stale is not None and stale["status"]["lastHeartbeatTime"] == beat["status"]["lastHeartbeatTime"]
    kube.custom(admin).delete_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, "again")
    kube.create_registration(admin, namespace, kube.registration_body(name="again", node=node, pid=4343))
    kube.patch_status(admin, namespace, "again", beat)
    with pytest.raises(ApiError) as refused:
        _attest(agent, stale, components.attestation(stale, verdict="Dead", node=node))
    assert refused.value.status == 422
    now = agent.get_registration(namespace, "again")
    assert now is not None and "attestation" not in now["status"]


def test_a_watch_left_early_does_not_leave_its_open_stream_to_the_next_request(
    coroner_api: Cluster, admin: k8s.ApiClient, namespace: str
) -> None:
    client = Rest.from_kubeconfig(coroner_api.kubeconfig, pool_size=1)  # one connection: the next request reuses it
    path = registrations_path(namespace)
    version = client.request("GET", path)["metadata"]["resourceVersion"]
    creator = threading.Timer(
        0.5, lambda: kube.create_registration(admin, namespace, kube.registration_body(name="w0", node="rest-node"))
    )
    creator.start()
    for event in client.watch(path, query={"resourceVersion": version}, timeout_seconds=20):
        assert event["type"] == "ADDED"
        break  # the stream is idle now, and stays open on the server for 20 s
    creator.join()
    started = time.monotonic()
    listed = client.request("GET", path, timeout=5)
    assert [i["metadata"]["name"] for i in listed["items"]] == ["w0"]
    assert time.monotonic() - started < 5
