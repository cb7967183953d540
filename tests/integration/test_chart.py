"""The Helm chart renders exactly what kustomize renders, for every combination of the components,
because it is generated from the manifests; and the namespace, names and identities follow the
release. Real `kubectl kustomize`, real `helm lint`/`helm template` (helm built from Go modules)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest
import yaml

from coroner_dev import chart as chart_gen
from coroner_dev.devcluster.binaries import ensure_binaries
from support import helm

pytestmark = pytest.mark.integration

COMBINATIONS = chart_gen.combinations()


@pytest.fixture(scope="module")
def kubectl() -> pathlib.Path:
    return ensure_binaries().path("kubectl")


def test_the_chart_is_what_the_generator_makes_of_the_manifests(kubectl: pathlib.Path, tmp_path: pathlib.Path) -> None:
    fresh = tmp_path / "coroner"
    shutil.copytree(helm.CHART, fresh)
    chart_gen.generate(fresh, kubectl=kubectl)
    generated, committed = helm.files(fresh), helm.files(helm.CHART)
    stale = sorted(name for name in set(generated) | set(committed) if generated.get(name) != committed.get(name))
    assert stale == [], f"run `python -m coroner_dev.chart` (manifests/ changed since the chart was generated): {stale}"


def test_helm_lint_strict_passes() -> None:
    for values in ([], ["--set=retireGrant.enabled=true,nodeLoss.enabled=true,monitoring.enabled=true"]):
        linted = helm.run("helm", "lint", "--strict", str(helm.CHART), *values)
        assert "0 chart(s) failed" in linted.stdout


@pytest.mark.parametrize("enabled", COMBINATIONS, ids=lambda c: "+".join(sorted(c)) or "plan-only")
def test_helm_template_renders_what_kustomize_renders(kubectl: pathlib.Path, enabled: frozenset[str]) -> None:
    kustomized = helm.comparable(chart_gen.render_kustomize(kubectl, enabled))
    templated = helm.comparable(helm.template(*helm.values_for(enabled)))
    assert helm.differences(kustomized, templated) == []


def test_the_production_overlay_is_the_chart_with_the_grant(kubectl: pathlib.Path) -> None:
    overlay = chart_gen.MANIFESTS / "overlays" / "production"
    rendered = subprocess.run([str(kubectl), "kustomize", str(overlay)], capture_output=True, text=True, check=True)
    kustomized = helm.comparable(rendered.stdout)
    assert helm.differences(kustomized, helm.comparable(helm.template("--set=retireGrant.enabled=true"))) == []


def test_namespace_names_and_identities_follow_the_release() -> None:
    every = "--set=retireGrant.enabled=true,nodeLoss.enabled=true,monitoring.enabled=true"
    text = helm.template(every, "--set=namePrefix=acme-", namespace="acme-system")
    docs = [doc for doc in yaml.safe_load_all(text) if doc]
    # coroner-system is left only in names (of policies named after it), never as a namespace.
    for doc in docs:
        unnamed = {
            **doc,
            "metadata": {**doc["metadata"], "name": ""},
            "spec": {**doc.get("spec", {}), "policyName": ""},
        }
        assert chart_gen.SYSTEM not in yaml.safe_dump(unnamed), doc["metadata"]["name"]
    by_kind: dict[str, list[dict]] = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], []).append(doc)
    assert [ns["metadata"]["name"] for ns in by_kind["Namespace"]] == ["acme-system"]
    for doc in docs:
        meta = doc["metadata"]
        if doc["kind"] not in ("Namespace", "CustomResourceDefinition") and "namespace" in meta:
            assert meta["namespace"] == "acme-system", doc["kind"]
        if doc["kind"] in chart_gen.PREFIXED_KINDS:
            assert meta["name"].startswith("acme-coroner"), (doc["kind"], meta["name"])
        elif doc["kind"] != "Namespace":  # the CRD and admission policies keep the names doctor looks up
            assert not meta["name"].startswith("acme-"), (doc["kind"], meta["name"])
        if doc["kind"] != "CustomResourceDefinition":  # crds/ is not templated
            assert meta["labels"]["app.kubernetes.io/instance"] == "coroner"
    for binding in by_kind["ClusterRoleBinding"] + by_kind["RoleBinding"]:
        assert binding["roleRef"]["name"].startswith("acme-coroner-")
        assert all(
            s["namespace"] == "acme-system" and s["name"].startswith("acme-coroner-") for s in binding["subjects"]
        )
    # The admission policies name the release's ServiceAccounts, and only those.
    policies = yaml.safe_dump(by_kind["ValidatingAdmissionPolicy"])
    assert "system:serviceaccount:acme-system:acme-coroner-agent" in policies
    assert "system:serviceaccount:acme-system:acme-coroner-operator" in policies
    config_maps = {doc["metadata"]["name"] for doc in by_kind.get("ConfigMap", [])}
    for workload in by_kind["Deployment"] + by_kind["DaemonSet"]:
        pod = workload["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == workload["metadata"]["name"]
        # A ConfigMap the pod mounts is one of the release's, under its prefixed name.
        assert {v["configMap"]["name"] for v in pod.get("volumes", []) if "configMap" in v} <= config_maps
        assert "--system-namespace=acme-system" in pod["containers"][0]["args"]
    rule = yaml.safe_dump(by_kind["PrometheusRule"])
    assert 'namespace="acme-system"' in rule and "{{ $labels.node }}" in rule
    # The default release namespace passes no --system-namespace, exactly as kustomize.
    default = helm.template(every)
    assert "--system-namespace" not in default


def test_images_pin_by_digest_and_values_are_validated() -> None:
    digest = "sha256:" + "a" * 64
    text = helm.template(f"--set=operator.image.digest={digest}", "--set=agent.image.tag=v9")
    images = {doc["kind"]: doc["spec"]["template"]["spec"]["containers"][0]["image"] for doc in yaml.safe_load_all(text)
              if doc and doc["kind"] in ("Deployment", "DaemonSet")}  # fmt: skip
    assert images == {
        "Deployment": f"ghcr.io/coroner-dev/coroner-operator@{digest}",
        "DaemonSet": "ghcr.io/coroner-dev/coroner-agent:v9",
    }
    for bad in ("--set=namePrefix=Bad_", "--set=retireGrant.enabled=yes", "--set=operator.terminalRetentionSeconds=-1"):
        refused = helm.run("helm", "template", "coroner", str(helm.CHART), bad, check=False)
        assert refused.returncode != 0 and "values don't meet the specifications" in refused.stderr, bad
