"""One version, written in one place (`coroner.__version__`): the package metadata, the code's image
references and every file that spells it agree (`coroner_dev.version_pins`)."""

from __future__ import annotations

import importlib.metadata
import pathlib
import subprocess
import tomllib

import pytest

from coroner import __version__
from coroner.core import inject
from coroner_dev import version_pins
from coroner_dev.devcluster import imagerecipe

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_package_takes_its_version_from_coroner_init() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"]
    assert pyproject["project"]["dynamic"] == ["version"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "coroner.__version__"}
    assert importlib.metadata.version("kube-coroner") == __version__, "reinstall: make install"


def test_the_code_derives_the_image_references_and_the_injection_version() -> None:
    tag = version_pins.tag()
    assert tag == f"v{__version__}"
    assert tag == inject.INJECTION_VERSION
    for reference in (imagerecipe.AGENT_REFERENCE, imagerecipe.OPERATOR_REFERENCE, imagerecipe.REGISTRAR_REFERENCE):
        assert reference.endswith(f":{tag}")


def test_every_file_that_spells_the_version_agrees() -> None:
    assert [str(m) for m in version_pins.mismatches(ROOT)] == []


def test_a_new_version_is_found_missing_at_every_pin() -> None:
    """The scan sees each kind of place, so a bump that forgets one fails the test above."""
    places = {m.path for m in version_pins.mismatches(ROOT, version="9.9.9")}
    assert {
        "charts/coroner/Chart.yaml",
        "plugins/coroner.yaml",
        "manifests/overlays/plan-only/kustomization.yaml",
        "manifests/overlays/production/kustomization.yaml",
        "manifests/base/agent.yaml",
        "manifests/base/operator.yaml",
        "manifests/components/registrar-injection/registrar-injection.yaml",
        "charts/coroner/templates/mutatingadmissionpolicy-coroner-registrar-injection.yaml",
        "images/agent.Dockerfile",
    } <= places
    assert not any(path.startswith("tests/") or path == "CHANGELOG.md" for path in places)


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("image: ghcr.io/coroner-dev/coroner-agent:v0.0.1\n", ["v0.0.1"]),
        ("kubectl krew install --archive=kubectl-coroner-v1.2.3.tar.gz", ["v1.2.3"]),
        ("dist/coroner-registrar-v2.0.0-rc.1.oci.tar", ["v2.0.0-rc.1"]),
        ('escapeKey("coroner.dev/injected"),\n   value: "v0.0.2"}', ["v0.0.2"]),
        ("annotations: {coroner.dev/injected: v0.0.3}", ["v0.0.3"]),
        ("image: ghcr.io/coroner-dev/coroner-agent:v9.9.9 and python:3.11.7", []),
    ],
)
def test_the_scan_finds_each_spelling(text: str, found: list[str]) -> None:
    assert [m.found for m in version_pins.text_mismatches("f", text, expected="v9.9.9")] == found


def test_a_bump_writes_the_new_version_everywhere_it_is_spelled(tmp_path: pathlib.Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", "--local", "--no-hardlinks", str(ROOT), str(clone)], check=True)
    changed = version_pins.bump(clone, old=__version__, new="9.9.9")
    assert {"src/coroner/__init__.py", "charts/coroner/Chart.yaml", "plugins/coroner.yaml"} <= set(changed)
    assert [str(m) for m in version_pins.mismatches(clone, version="9.9.9")] == []
    assert '__version__ = "9.9.9"' in (clone / "src/coroner/__init__.py").read_text()
    assert (clone / "CHANGELOG.md").read_text() == (ROOT / "CHANGELOG.md").read_text()
