"""`manifests/components/node-loss`, rendered by the real kubectl kustomize into an overlay of one's
own (as docs/cli.md tells a cluster admin to add it), and the operator's own flag parser reading the
rendered arguments: the opt-in really reaches the operator, and no overlay opts in by default."""

from __future__ import annotations

import os
import pathlib
from typing import Any

import pytest
import yaml

from coroner_dev.devcluster.cluster import Cluster
from coroner_operator.main import main as operator_main
from support import kube

pytestmark = pytest.mark.e2e

COMPONENT = kube.MANIFESTS / "components" / "node-loss"


def render(cluster: Cluster, directory: pathlib.Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(kube.kubectl(cluster, "kustomize", str(directory)).stdout) if d]


def operator_args(documents: list[dict[str, Any]]) -> list[str]:
    (deployment,) = [d for d in documents if d["kind"] == "Deployment" and d["metadata"]["name"] == "coroner-operator"]
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def opt_in(documents: list[dict[str, Any]]) -> dict[str, str]:
    """The evidence policy's operator opt-in variables (the rest of its variables are not opt-ins)."""
    (policy,) = [
        d
        for d in documents
        if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == "coroner-retire-requires-evidence"
    ]
    return {v["name"]: v["expression"] for v in policy["spec"]["variables"] if v["name"].startswith("operatorMay")}


def own_overlay(tmp_path: pathlib.Path, base: str) -> pathlib.Path:
    """An overlay of one's own: an existing overlay plus the component (kustomize wants relative paths)."""
    overlay = tmp_path / "mine"
    overlay.mkdir()
    relative = pathlib.Path(os.path.relpath(kube.MANIFESTS, overlay))
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [str(relative / "overlays" / base)],
                "components": [str(relative / "components" / "node-loss")],
            }
        )
    )
    return overlay


@pytest.mark.parametrize("base", ["plan-only", "production"])
def test_the_component_turns_on_node_deletion_evidence_with_a_quarantine(
    cluster: Cluster, tmp_path: pathlib.Path, base: str
) -> None:
    without = render(cluster, kube.MANIFESTS / "overlays" / base)
    documents = render(cluster, own_overlay(tmp_path, base))
    added = operator_args(documents)[len(operator_args(without)) :]
    assert operator_args(documents)[: len(operator_args(without))] == operator_args(without)
    assert added == ["--node-deletion-evidence", "--node-quarantine-seconds=300", "--node-out-of-service-evidence"]
    # Nothing else changes but the admission half: the evidence policy admits the operator's node
    # evidence (its two opt-in variables turn true). No RBAC, no other object.
    assert len(documents) == len(without)
    changed = {("Deployment", "coroner-operator"), ("ValidatingAdmissionPolicy", "coroner-retire-requires-evidence")}

    def strip(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [d for d in docs if (d["kind"], d["metadata"]["name"]) not in changed]

    assert strip(documents) == strip(without)
    assert opt_in(documents) == {"operatorMayUseNodeDeleted": "true", "operatorMayUseNodeOutOfService": "true"}
    assert opt_in(without) == {"operatorMayUseNodeDeleted": "false", "operatorMayUseNodeOutOfService": "false"}

    # The operator's own parser accepts them and they set the policy it publishes.
    context = operator_main.make_context("coroner-operator", list(operator_args(documents)))
    assert context.params["node_deletion_evidence"] is True
    assert context.params["node_quarantine_seconds"] == 300.0


def test_no_overlay_opts_in_by_default(cluster: Cluster) -> None:
    for overlay in sorted((kube.MANIFESTS / "overlays").iterdir()):
        assert "--node-deletion-evidence" not in operator_args(render(cluster, overlay)), overlay.name
        declared = yaml.safe_load((overlay / "kustomization.yaml").read_text())
        assert not any("node-loss" in component for component in declared.get("components") or []), overlay.name
