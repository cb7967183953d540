"""`make release` (coroner_dev.release), twice, with the images: the two `dist/`s are the same bytes
(SHA256SUMS), and each holds what it says — the images' digests pinned in both install YAMLs and
in the chart, an SBOM per image naming the Debian and the Python packages, the krew manifest
carrying the plugin archive's real sha256 (`kubectl krew` is not available here), and a plugin that
runs from its archive alone against the real API server, with none of this checkout on its path.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import tarfile
from collections.abc import Iterator

import pytest
import yaml

from coroner import __version__
from coroner_dev import release
from coroner_dev.devcluster.cluster import Cluster
from support import helm

TAG = f"v{__version__}"


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[pathlib.Path, pathlib.Path]]:
    # One tree, one time: a commit landing between the two builds (a shared checkout) would move it.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SOURCE_DATE_EPOCH", str(release.source_date_epoch()))
        first = release.build(tmp_path_factory.mktemp("release-a") / "dist")
        second = release.build(tmp_path_factory.mktemp("release-b") / "dist")
    yield first, second


def sums(dist: pathlib.Path) -> dict[str, str]:
    return {
        name: digest
        for digest, name in (line.split(maxsplit=1) for line in (dist / "SHA256SUMS").read_text().splitlines())
    }


def test_two_releases_are_the_same_bytes_and_their_checksums_hold(releases: tuple[pathlib.Path, pathlib.Path]) -> None:
    first, second = releases
    expected = {
        *(f"coroner-{name}-{TAG}.{suffix}" for name in release.SHIPPED for suffix in ("oci.tar", "spdx.json")),
        "images.json",
        "install-plan-only.yaml",
        "install-production.yaml",
        f"coroner-{__version__}.tgz",
        f"kubectl-coroner-{TAG}.tar.gz",
        "coroner.yaml",
        "RELEASE-NOTES.md",
    }
    assert set(sums(first)) == expected
    assert {path.name for path in first.iterdir()} == expected | {"SHA256SUMS"}
    assert sums(first) == sums(second)
    for dist in releases:
        subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=dist, check=True)


def test_the_images_are_pinned_by_their_digests_everywhere(releases: tuple[pathlib.Path, pathlib.Path]) -> None:
    dist = releases[0]
    images = json.loads((dist / "images.json").read_text())["images"]
    for name in release.SHIPPED:
        with tarfile.open(dist / images[name]["archive"]) as archive:
            index = json.load(archive.extractfile("index.json"))  # type: ignore[arg-type]
        assert index["manifests"][0]["digest"] == images[name]["digest"]
    for overlay in release.OVERLAYS:
        text = (dist / f"install-{overlay}.yaml").read_text()
        for name in release.PINNED:
            pinned = f"ghcr.io/coroner-dev/coroner-{name}@{images[name]['digest']}"
            assert pinned in text
            assert f"coroner-{name}:{TAG}" not in text
    rendered = helm.run("helm", "template", "coroner", str(dist / f"coroner-{__version__}.tgz")).stdout
    for name in release.PINNED:
        assert f"ghcr.io/coroner-dev/coroner-{name}@{images[name]['digest']}" in rendered
    helm.run("helm", "lint", "--strict", str(dist / f"coroner-{__version__}.tgz"))


def test_each_image_has_an_sbom_of_its_debian_and_python_packages(releases: tuple[pathlib.Path, pathlib.Path]) -> None:
    dist = releases[0]
    for name in release.SHIPPED:
        document = json.loads((dist / f"coroner-{name}-{TAG}.spdx.json").read_text())
        assert document["spdxVersion"] == "SPDX-2.3"
        assert document["name"] == f"coroner-{name}"
        locators = {ref["referenceLocator"] for p in document["packages"] for ref in p.get("externalRefs", [])}
        assert any(locator.startswith("pkg:deb/debian/python3.11") for locator in locators), name
        assert any(locator.startswith(f"pkg:pypi/kube-coroner@{__version__}") for locator in locators), name
        assert any(locator.startswith("pkg:pypi/click@") for locator in locators), name


def test_the_krew_manifest_carries_the_archives_sha256(releases: tuple[pathlib.Path, pathlib.Path]) -> None:
    dist = releases[0]
    archive = dist / f"kubectl-coroner-{TAG}.tar.gz"
    manifest = yaml.safe_load((dist / "coroner.yaml").read_text())
    (platform,) = manifest["spec"]["platforms"]
    assert platform["sha256"] == release.sha256(archive)
    assert platform["uri"].endswith(f"/{TAG}/{archive.name}")
    shipped = yaml.safe_load((release.REPO / "plugins" / "coroner.yaml").read_text())
    shipped["spec"]["platforms"][0]["sha256"] = platform["sha256"]
    assert manifest == shipped
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    for item in platform["files"]:
        assert item["from"] in names or any(name.startswith(f"{item['from']}/") for name in names), item


def test_the_plugin_runs_from_its_archive_alone(
    releases: tuple[pathlib.Path, pathlib.Path], cluster: Cluster, tmp_path: pathlib.Path
) -> None:
    with tarfile.open(releases[0] / f"kubectl-coroner-{TAG}.tar.gz") as tar:
        tar.extractall(tmp_path)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run(
        ["kubectl-coroner", "version", f"--kubeconfig={cluster.kubeconfig}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert f"Client Version: {__version__}" in result.stdout, result.stderr
    assert str(release.REPO) not in result.stdout + result.stderr
    completion = subprocess.run(
        ["kubectl_complete-coroner", ""], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    )
    assert "doctor" in completion.stdout
    assert os.access(tmp_path / "kubectl-coroner", os.X_OK)


def test_the_release_notes_are_the_changelogs_section(releases: tuple[pathlib.Path, pathlib.Path]) -> None:
    notes = (releases[0] / "RELEASE-NOTES.md").read_text()
    assert notes.startswith(f"# Coroner {TAG}\n")
    assert "The first release" in notes
    for name in sums(releases[0]):
        if name != "RELEASE-NOTES.md":
            assert f"`{name}`" in notes
