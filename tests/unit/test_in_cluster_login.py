"""In a pod, the operator reaches the API server where client-go's in-cluster config does: the
KUBERNETES_SERVICE_HOST/PORT the kubelet sets, never the cluster DNS name kopf's own service-account
login names (`https://kubernetes.default.svc`), which needs cluster DNS and differs from the address
the operator's own writes use (`Rest.in_cluster`). Found running the shipped image under a kubelet
whose node has no cluster DNS: kopf's watches failed to resolve the name while every write worked."""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from coroner.client import rest
from coroner_operator import main as operator_main

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("host", "port", "server"),
    [
        ("10.96.0.1", "443", "https://10.96.0.1:443"),
        ("127.0.0.1", "6443", "https://127.0.0.1:6443"),
        ("fd00::1", "443", "https://[fd00::1]:443"),
        ("10.96.0.1", None, "https://10.96.0.1:443"),
    ],
)
def test_the_in_cluster_server_is_the_service_environment(
    monkeypatch: pytest.MonkeyPatch, host: str, port: str | None, server: str
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    if port is None:
        monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    else:
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    assert rest.in_cluster_server() == server


def test_the_operators_login_in_a_pod_uses_the_service_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    from_kopf = kopf.ConnectionInfo(server="https://kubernetes.default.svc", token="t", ca_path="/ca.crt")

    def kopf_login(**_: Any) -> kopf.ConnectionInfo:
        return from_kopf

    monkeypatch.setattr(kopf, "login_with_service_account", kopf_login)
    info = operator_main.in_cluster_login()
    assert info is not None
    assert info.server == "https://127.0.0.1:6443"
    assert (info.token, info.ca_path) == ("t", "/ca.crt")
