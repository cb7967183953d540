"""The krew manifest (plugins/coroner.yaml) has the shape krew validates, and names what we ship.

krew's own checks (sigs.k8s.io/krew pkg/index/validation): the file is named after the plugin, the
version is semantic with a leading v, every platform has a selector, an https URI, a sha256 and a
bin that one of its files installs. Ours on top: the version is the package's, and the executables
are the console scripts the package installs.
"""

from __future__ import annotations

import pathlib
import re
import tomllib
from typing import Any

import pytest
import yaml

from coroner import __version__

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "plugins" / "coroner.yaml"
SEMVER = re.compile(r"v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?")


@pytest.fixture(scope="module")
def manifest() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(MANIFEST.read_text())
    return loaded


@pytest.fixture(scope="module")
def project() -> dict[str, Any]:
    loaded: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return loaded


def test_it_is_a_krew_plugin_named_after_its_file(manifest: dict[str, Any]) -> None:
    assert manifest["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2"
    assert manifest["kind"] == "Plugin"
    assert manifest["metadata"]["name"] == MANIFEST.stem == "coroner"
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", manifest["metadata"]["name"])


def test_its_version_is_the_packages(manifest: dict[str, Any]) -> None:
    version = manifest["spec"]["version"]
    assert SEMVER.fullmatch(version), version
    assert version == f"v{__version__}"


def test_it_describes_itself(manifest: dict[str, Any]) -> None:
    spec = manifest["spec"]
    assert spec["homepage"].startswith("https://")
    assert 0 < len(spec["shortDescription"]) <= 60 and "\n" not in spec["shortDescription"]
    for command in ("plan", "apply", "doctor", "version", "inject"):
        assert f"kubectl coroner {command}" in spec["description"]
    assert "python3" in spec["caveats"]


def test_every_platform_installs_the_plugin(manifest: dict[str, Any], project: dict[str, Any]) -> None:
    platforms = manifest["spec"]["platforms"]
    assert platforms
    scripts = project["scripts"]
    for platform in platforms:
        expressions = platform["selector"].get("matchExpressions") or []
        labels = platform["selector"].get("matchLabels") or {}
        assert expressions or labels
        for expression in expressions:
            assert expression["key"] in ("os", "arch")
            assert expression["operator"] in ("In", "NotIn", "Exists", "DoesNotExist")
            if expression["operator"] in ("In", "NotIn"):
                assert expression["values"]
        assert set(labels) <= {"os", "arch"}
        uri = platform["uri"]
        assert uri.startswith("https://") and uri.endswith((".tar.gz", ".zip"))
        assert manifest["spec"]["version"] in uri
        assert re.fullmatch(r"[0-9a-f]{64}", platform["sha256"])
        files = platform["files"]
        assert all(item["from"] and item["to"] for item in files)
        assert platform["bin"] == "kubectl-coroner" and "kubectl-coroner" in {item["from"] for item in files}
        for item in files:
            if item["from"].startswith("kubectl"):
                assert item["from"] in scripts, f"{item['from']} is not a console script of the package"
