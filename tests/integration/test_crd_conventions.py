"""The WorkerRegistration CRD as kubectl users meet it: the names they type, the STATE column, field
selectors, and `kubectl explain` — with the real kubectl against the real API server."""

from __future__ import annotations

import datetime
import json
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.client.kube import api_client
from coroner.core import api, wire
from coroner_dev.devcluster.cluster import Cluster
from support import components, kube

pytestmark = pytest.mark.integration

BOOT = "8d0a4c6e-3b1f-4c1e-9a56-0d6f0c1b2a3e"
HOST = "0f2e7a1c9d8b4e6f8a7b6c5d4e3f2a1b"
#: Every name a user may type for the resource: plural, singular, short names, the category.
NAMES = ("workerregistrations", "workerregistration", "wreg", "registration", "registrations")


def _columns(cluster: Cluster, *args: str) -> list[dict[str, str]]:
    """`kubectl get` output as rows keyed by header (every column here is one word wide)."""
    lines = kube.kubectl(cluster, "get", *args).stdout.splitlines()
    header = lines[0].split()
    return [dict(zip(header, line.split(), strict=False)) for line in lines[1:]]


def _state(cluster: Cluster, namespace: str, name: str) -> str:
    return kube.kubectl(cluster, "get", "registration", name, "-n", namespace, "-o", "jsonpath={.status.state}").stdout


def test_every_name_gets_and_describes_and_the_singular_works(granted: Cluster, namespace: str) -> None:
    kube.kubectl(granted, "apply", "-n", namespace, "-f", str(kube.MANIFESTS / "samples"))
    for name in NAMES:
        rows = _columns(granted, name, "-n", namespace)
        assert [row["NAME"] for row in rows] == ["queue-consumer-sample"], name
        assert rows[0]["STATE"] == "Active" and rows[0]["NODE"] == "node-a" and rows[0]["PID"] == "4242"
        described = kube.kubectl(granted, "describe", name, "queue-consumer-sample", "-n", namespace).stdout
        assert "Name:         queue-consumer-sample" in described and "State:  Active" in described, name
    # The one that used to answer `the server doesn't have a resource type "registration"`.
    single = kube.kubectl(granted, "get", "registration", "queue-consumer-sample", "-n", namespace, "-o", "name")
    assert single.stdout.strip() == "workerregistration.coroner.dev/queue-consumer-sample"


def test_default_and_wide_columns(granted: Cluster, namespace: str) -> None:
    kube.kubectl(granted, "apply", "-n", namespace, "-f", str(kube.MANIFESTS / "samples"))
    header = kube.kubectl(granted, "get", "registrations", "-n", namespace).stdout.splitlines()[0].split()
    assert header == ["NAME", "STATE", "NODE", "PID", "REASON", "VERDICT", "AGE"]
    wide = kube.kubectl(granted, "get", "registrations", "-n", namespace, "-o", "wide").stdout.splitlines()[0].split()
    assert wide == [*header, "RETIRED", "HEARTBEAT", "EVIDENCE", "ROLE", "INSTANCE", "RETIRED-BY"]


def _described(schema: dict[str, Any], path: str) -> Iterator[str]:
    """Paths of the served schema's properties that carry no description."""
    for name, prop in (schema.get("properties") or {}).items():
        here = f"{path}.{name}"
        if name == "metadata" and path == "":
            continue  # the server's ObjectMeta, described by Kubernetes itself
        if not prop.get("description"):
            yield here
        yield from _described(prop, here)
        items = prop.get("items")
        if isinstance(items, dict):
            yield from _described(items, f"{here}[]")


def test_kubectl_explain_describes_every_field(granted: Cluster) -> None:
    served = json.loads(kube.kubectl(granted, "get", "--raw", f"/openapi/v3/apis/{api.GROUP}/{api.VERSION}").stdout)
    schemas = served["components"]["schemas"]
    (schema,) = [s for key, s in schemas.items() if key.endswith(f".{api.VERSION}.{api.KIND}")]
    assert schema.get("description")
    # The served schema references shared definitions for metadata only; the rest is inline.
    assert list(_described(schema, "")) == []
    explained = kube.kubectl(granted, "explain", "registration.spec.incarnation.startTime").stdout
    assert "Field 22 of /proc/<pid>/stat" in explained
    assert "Active, Retired or Released" in kube.kubectl(granted, "explain", "wreg.status.state").stdout


def test_crd_file_describes_every_field() -> None:
    crd = next(
        doc
        for doc in yaml.safe_load_all((kube.MANIFESTS / "base" / "crd.yaml").read_text())
        if doc["kind"] == "CustomResourceDefinition"
    )
    (version,) = crd["spec"]["versions"]
    assert list(_described(version["schema"]["openAPIV3Schema"], "")) == []
    assert {field["jsonPath"] for field in version["selectableFields"]} == {".spec.nodeName", ".status.state"}


@pytest.fixture
def operator(granted: Cluster, tmp_path: pathlib.Path) -> Iterator[None]:
    config = components.operator_kubeconfig(granted)
    with components.process(components.operator_argv(config), log=tmp_path / "operator.log"):
        yield


def test_state_follows_retirement_and_release_and_selects(
    granted: Cluster, operator: None, admin: k8s.ApiClient, namespace: str
) -> None:
    components.put_agent_lease(admin, node="node-a", boot_id=BOOT, host_id=HOST)
    components.put_agent_lease(admin, node="node-b", boot_id=BOOT, host_id=HOST)
    # Distinct pids: registrations sharing one incarnation would read ConflictingIdentity.
    for pid, (name, node) in enumerate((("dies", "node-a"), ("exits", "node-a"), ("lives", "node-b")), start=100):
        body = kube.registration_body(name=name, node=node, pid=pid, interval=None)
        kube.create_registration(admin, namespace, body)
        assert _state(granted, namespace, name) == "Active"  # before any status write: the default
    with api_client(components.agent_kubeconfig(granted, "node-a")) as agent:
        components.attest(agent, namespace, "dies", evidence="PidfdExited")
    kube.wait_for(
        lambda: _state(granted, namespace, "dies") == "Retired", timeout=120, what="dies Retired by the real operator"
    )
    assert components.retired(admin, namespace, "dies")
    # The worker's goodbye exactly as the launcher sends it: one server-side apply of Released.
    goodbye = wire.release_apply(
        name="exits",
        namespace=namespace,
        condition=wire.released_condition(message="goodbye", now=datetime.datetime.now(datetime.UTC), generation=1),
    )
    kube.kubectl(
        granted, "apply", "--server-side", "--subresource=status", f"--field-manager={wire.RELEASE_FIELD_MANAGER}",
        "--force-conflicts", "-f", "-", stdin=json.dumps(goodbye),
    )  # fmt: skip
    assert _state(granted, namespace, "exits") == "Released"
    # status.state is written with the change that makes it; one that disagrees is refused.
    with pytest.raises(ApiException) as refused:
        kube.patch_status(admin, namespace, "lives", {"status": {"state": "Retired"}})
    assert refused.value.status == 422
    assert 'status.state must be "Active" here' in kube.api_error_body(refused.value)["message"]
    assert _state(granted, namespace, "lives") == "Active"

    def names(selector: str) -> list[str]:
        listed = kube.kubectl(
            granted, "get", "registrations", "-n", namespace, "--field-selector", selector, "-o", "name"
        )
        return sorted(line.rsplit("/", 1)[1] for line in listed.stdout.split())

    assert names("status.state=Retired") == ["dies"]
    assert names("status.state=Released") == ["exits"]
    assert names("status.state=Active") == ["lives"]
    assert names("status.state!=Active") == ["dies", "exits"]
    assert names("spec.nodeName=node-a") == ["dies", "exits"]
    assert names("spec.nodeName=node-a,status.state=Retired") == ["dies"]
    rows = {row["NAME"]: row["STATE"] for row in _columns(granted, "registrations", "-n", namespace)}
    assert rows == {"dies": "Retired", "exits": "Released", "lives": "Active"}
