"""helm and promtool for tests (built from Go modules by coroner_dev.devcluster.tools), and the
object comparisons the chart tests share."""

from __future__ import annotations

import functools
import pathlib
import subprocess
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from coroner_dev import chart as chart_gen
from coroner_dev.devcluster.tools import Tools, ensure_tools

CHART = chart_gen.CHART


@functools.cache
def tools() -> Tools:
    return ensure_tools()


def run(tool: str, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    command = [str(tools().path(tool)), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def template(*args: str, namespace: str = chart_gen.SYSTEM, include_crds: bool = True, tests: bool = False) -> str:
    """`helm template`; without the `helm test` hooks unless `tests` (the kustomize manifests have none)."""
    extra = (["--include-crds"] if include_crds else []) + ([] if tests else ["--skip-tests"])
    return run("helm", "template", "coroner", str(CHART), "--namespace", namespace, *extra, *args).stdout


def values_for(enabled: Iterable[str]) -> list[str]:
    """--set flags turning exactly these components on."""
    on = set(enabled)
    return [f"--set={key}.enabled={'true' if key in on else 'false'}" for key in chart_gen.components()]


def comparable(text: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Objects by (kind, namespace, name), without the labels only the chart adds."""
    found = {}
    for doc in yaml.safe_load_all(text):
        if not doc:
            continue
        labels = doc.get("metadata", {}).get("labels")
        if isinstance(labels, dict):
            for label in chart_gen.HELM_LABELS:
                labels.pop(label, None)
            if not labels:
                del doc["metadata"]["labels"]
        annotations = doc.get("metadata", {}).get("annotations")
        if isinstance(annotations, dict) and doc["kind"] == "Namespace":
            annotations.pop(chart_gen.KEEP, None)
            if not annotations:
                del doc["metadata"]["annotations"]
        found[chart_gen.key_of(doc)] = doc
    return found


def differences(left: Mapping[Any, Any], right: Mapping[Any, Any]) -> list[str]:
    """What differs between two object maps, said per object (empty when equal)."""
    said = [f"only in the first: {key}" for key in sorted(set(left) - set(right))]
    said += [f"only in the second: {key}" for key in sorted(set(right) - set(left))]
    for key in sorted(set(left) & set(right)):
        if left[key] != right[key]:
            said.append(f"{key} differs:\n{yaml.safe_dump(left[key])}\n---\n{yaml.safe_dump(right[key])}")
    return said


def files(directory: pathlib.Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): p.read_text() for p in sorted(directory.rglob("*")) if p.is_file()}
