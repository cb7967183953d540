"""manifests/components/registrar-injection on the real API server: a Pod created with the label
coroner.dev/inject=true gets exactly what `kubectl coroner inject` (coroner.core.inject) adds to the
same Pod — the two Pods, one injected by the MutatingAdmissionPolicy and one by inject before it was
sent, are equal as the API server stores them, defaults and all — so the two cannot drift. An
unlabelled Pod is untouched, a labelled Pod the registrar cannot work in is refused with the
reason, and without the component a labelled Pod is admitted as it is: it runs unregistered.

No node runs here: the Pods stay Pending, which is all admission needs. The dev cluster runs without
the ServiceAccount admission plugin (no kubelet to mount tokens), so the Pods name their
ServiceAccount themselves, as that plugin does on every real cluster before the policy runs."""

from __future__ import annotations

import contextlib
import copy
import os
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from coroner.cli.doctor import injection as inject_check
from coroner.core import inject
from coroner_dev.devcluster.cluster import Cluster
from integration.test_kubectl_plugin import as_json, coroner
from support import kube

pytestmark = pytest.mark.integration

COMPONENT = kube.MANIFESTS / "components" / "registrar-injection"
LABELS = {inject.INJECT_LABEL: "true", "app": "worker"}


def pod(name: str, *, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": dict(LABELS if labels is None else labels)}
    body = {"serviceAccountName": "default", "containers": [{"name": "main", "image": "registry.invalid/go-worker:1"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {**body, **spec}}


#: Pods as people write them: the least there is, and one with init containers (a sidecar among
#: them), volumes, annotations, its own pid sharing and no automounted token.
SHAPES = {
    "minimal": pod("x"),
    "busy": {
        **pod("x"),
        "metadata": {"name": "x", "labels": LABELS, "annotations": {"team": "batch"}},
        "spec": {
            **pod("x")["spec"],
            "automountServiceAccountToken": False,
            "shareProcessNamespace": True,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
            "initContainers": [
                {"name": "migrate", "image": "registry.invalid/migrate:1"},
                {"name": "proxy", "image": "registry.invalid/proxy:1", "restartPolicy": "Always"},
            ],
            "volumes": [{"name": "scratch", "emptyDir": {}}],
        },
    },
}


def named(body: dict[str, Any], name: str) -> dict[str, Any]:
    renamed = copy.deepcopy(body)
    renamed["metadata"]["name"] = name
    return renamed


def create(admin: k8s.ApiClient, namespace: str, body: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
    core = k8s.CoreV1Api(admin)
    created = core.create_namespaced_pod(namespace, body, **({"dry_run": "All"} if dry_run else {}))
    stored: dict[str, Any] = admin.sanitize_for_serialization(created)
    return stored


def injected_at_admission(admin: k8s.ApiClient, namespace: str) -> bool:
    """Whether the API server injects a labelled Pod now (a dry run: admission runs, nothing is stored)."""
    spec = create(admin, namespace, pod("probe"), dry_run=True)["spec"]
    return any(c["name"] == inject.CONTAINER_NAME for c in spec.get("initContainers") or [])


def refused_at_admission(admin: k8s.ApiClient, namespace: str) -> bool:
    """Whether the API server refuses a labelled Pod the registrar cannot work in now (a dry run)."""
    try:
        create(admin, namespace, pod("probe-host", hostPID=True), dry_run=True)
    except ApiException as exc:
        return exc.status in (403, 422)
    return False


@contextlib.contextmanager
def component(cluster: Cluster, admin: k8s.ApiClient, namespace: str, tmp_path: pathlib.Path) -> Iterator[None]:
    """The component applied as an overlay of one's own includes it, until the API server acts on it;
    deleted afterwards, until it no longer does."""
    overlay = tmp_path / "with-injection"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "components": [os.path.relpath(COMPONENT, overlay)],
            }
        )
    )
    kube.kubectl(cluster, "apply", "-k", str(overlay))
    try:
        # Each policy is enforced a moment after it is created, the mutating and the validating one apart.
        kube.wait_for(lambda: injected_at_admission(admin, namespace), timeout=30, what="the policy in force")
        kube.wait_for(lambda: refused_at_admission(admin, namespace), timeout=30, what="the refusal in force")
        yield
    finally:
        kube.kubectl(cluster, "delete", "-k", str(overlay), "--ignore-not-found")
        kube.wait_for(lambda: not injected_at_admission(admin, namespace), timeout=30, what="the policy gone")


def registrars(stored: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in stored["spec"].get("initContainers") or [] if c["name"] == inject.CONTAINER_NAME]


def test_a_labelled_pod_gets_exactly_what_inject_adds_and_others_are_untouched(
    cluster: Cluster, admin: k8s.ApiClient, namespace: str, tmp_path: pathlib.Path
) -> None:
    with component(cluster, admin, namespace, tmp_path):
        for shape, body in SHAPES.items():
            by_policy = create(admin, namespace, named(body, f"{shape}-by-policy"))
            # Labelled too: the policy sees the registrar already there and leaves it alone.
            by_inject = create(admin, namespace, inject.inject(named(body, f"{shape}-by-inject")))
            assert len(registrars(by_policy)) == 1 and len(registrars(by_inject)) == 1, shape
            assert by_policy["spec"] == by_inject["spec"], shape
            for field in ("labels", "annotations"):
                assert by_policy["metadata"][field] == by_inject["metadata"][field], (shape, field)
            assert by_policy["metadata"]["annotations"][inject.INJECTED_ANNOTATION] == inject.INJECTION_VERSION
            # And what inject built is there as it built it (the server only adds its defaults).
            registrar = registrars(by_policy)[0]
            assert {k: registrar[k] for k in inject.container()} == inject.container(), shape
            assert by_policy["spec"]["initContainers"][0] == registrar
            assert by_policy["spec"]["volumes"][-1] == inject.token_volume()
            assert by_policy["spec"]["shareProcessNamespace"] is True

        # Without the label: admitted exactly as the same Pod is without the policy.
        plain = pod("plain", labels={"app": "worker"})
        untouched = create(admin, namespace, plain)
        assert registrars(untouched) == []
        assert "shareProcessNamespace" not in untouched["spec"] and "volumes" not in untouched["spec"]
        assert not (untouched["metadata"].get("annotations") or {})

        # A labelled Pod the registrar cannot work in is refused, with the reason and the fix.
        with pytest.raises(ApiException) as refused:
            create(admin, namespace, pod("host", hostPID=True))
        assert refused.value.status in (403, 422)
        message = kube.api_error_body(refused.value).get("message", "")
        assert "coroner-registrar-injectable" in message and "hostPID" in message and "remove hostPID" in message

    # With the component gone, the policy with it: the same labelled Pod is admitted as it is, and
    # would run with no registrar — registered by nothing (docs/cli.md, `inject`: what to check).
    unregistered = create(admin, namespace, named(SHAPES["minimal"], "after-the-policy"))
    assert registrars(unregistered) == []
    assert unregistered["metadata"]["labels"][inject.INJECT_LABEL] == "true"
    assert inject.INJECTED_ANNOTATION not in (unregistered["metadata"].get("annotations") or {})


def injection_check(cluster: Cluster) -> dict[str, Any]:
    checks = {
        c["name"]: c for c in as_json(coroner(cluster, "doctor", "-o", "json", kubeconfig=cluster.kubeconfig))["checks"]
    }
    check: dict[str, Any] = checks["registrar-injection"]
    return check


def test_doctor_names_a_labelled_pod_admitted_without_the_registrar_and_the_policy_it_needs(
    cluster: Cluster, admin: k8s.ApiClient, namespace: str, tmp_path: pathlib.Path
) -> None:
    """A labelled Pod created while the policy is missing runs unregistered: doctor FAILs naming it, why
    and the fix; once the policy is in force, the Pod admitted before it is still named (it must be
    recreated), and a Pod created since is injected and not named."""
    early = create(admin, namespace, named(SHAPES["minimal"], "before-the-policy"))
    assert registrars(early) == []
    check = injection_check(cluster)
    assert check["status"] == "FAIL", check
    assert f"{namespace}/before-the-policy" in check["summary"], check
    assert f"MutatingAdmissionPolicy {inject_check.POLICY} is not installed" in check["summary"]
    assert inject_check.COMPONENT in check["summary"] and "recreate them" in check["summary"]
    assert f"Pod/{namespace}/before-the-policy" in check["objects"]

    with component(cluster, admin, namespace, tmp_path):
        late = create(admin, namespace, named(SHAPES["minimal"], "after-the-policy"))
        assert len(registrars(late)) == 1
        check = injection_check(cluster)
        assert check["status"] == "FAIL", check
        assert f"{namespace}/before-the-policy" in check["summary"]
        assert f"{namespace}/after-the-policy" not in check["summary"]
        assert "was not yet installed or enforced when they were created" in check["summary"]

        k8s.CoreV1Api(admin).delete_namespaced_pod("before-the-policy", namespace, grace_period_seconds=0)
        check = kube.wait_for(
            lambda: (c := injection_check(cluster)) and f"{namespace}/" not in c["summary"] and c,
            timeout=30,
            what="the early Pod no longer named",
        )
        # Pending (no node here): no container runs, so none is unregistered; the policy is in force.
        # (Labelled Pods other tests left in other namespaces may still be named.)
        assert check["status"] == ("PASS" if not check["facts"]["withoutRegistrar"] else "FAIL"), check

    # The policy removed while an injected labelled Pod runs: the next one would run unregistered.
    check = injection_check(cluster)
    assert check["status"] == ("WARN" if not check["facts"]["withoutRegistrar"] else "FAIL"), check
    assert "not installed" in check["summary"]
    assert check["status"] == "FAIL" or "next such Pod" in check["summary"], check
