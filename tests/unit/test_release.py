"""The release's pure parts (coroner_dev.release): archives with the same bytes for the same
contents, the values pinned by digest with every comment kept, the lock's entries, the notes."""

from __future__ import annotations

import pathlib
import tarfile

import pytest
import yaml

from coroner import __version__
from coroner_dev import release
from coroner_dev.devcluster.errors import DevClusterError

pytestmark = pytest.mark.unit

DIGEST = "sha256:" + "ab" * 32


def test_a_tar_gz_is_the_same_bytes_for_the_same_members(tmp_path: pathlib.Path) -> None:
    members = {"b": (b"two", 0o644), "a": (b"one", 0o755)}
    release.write_tar_gz(tmp_path / "1.tar.gz", members, epoch=1_700_000_000)
    release.write_tar_gz(tmp_path / "2.tar.gz", dict(reversed(members.items())), epoch=1_700_000_000)
    assert (tmp_path / "1.tar.gz").read_bytes() == (tmp_path / "2.tar.gz").read_bytes()
    with tarfile.open(tmp_path / "1.tar.gz") as tar:
        infos = tar.getmembers()
    assert [(i.name, i.mode, i.mtime, i.uid, i.uname) for i in infos] == [
        ("a", 0o755, 1_700_000_000, 0, ""),
        ("b", 0o644, 1_700_000_000, 0, ""),
    ]


def test_the_charts_values_are_pinned_by_digest_and_keep_their_comments() -> None:
    text = (release.REPO / "charts" / "coroner" / "values.yaml").read_text()
    pinned = release.pin_digest(release.pin_digest(text, "operator", DIGEST), "agent", "sha256:" + "cd" * 32)
    values = yaml.safe_load(pinned)
    assert values["operator"]["image"]["digest"] == DIGEST
    assert values["agent"]["image"]["digest"] == "sha256:" + "cd" * 32
    original = yaml.safe_load(text)
    original["operator"]["image"]["digest"] = DIGEST
    original["agent"]["image"]["digest"] = "sha256:" + "cd" * 32
    assert values == original
    assert [line for line in text.splitlines() if line.lstrip().startswith("#")] == [
        line for line in pinned.splitlines() if line.lstrip().startswith("#")
    ]


def test_pinning_a_value_that_is_not_there_says_so() -> None:
    with pytest.raises(DevClusterError, match=r"no registrar\.image\.digest"):
        release.pin_digest('operator:\n  image:\n    digest: ""\n', "registrar", DIGEST)


def test_the_lock_entries_of_some_distributions() -> None:
    lock = (
        "click==8.1 \\\n    --hash=sha256:1\n    # via kube-coroner\n"
        "pydantic-core==2.0 \\\n    --hash=sha256:2\n    --hash=sha256:3\n"
        "pyyaml==6.0 \\\n    --hash=sha256:4\n"
    )
    assert release.lock_entries(lock, ["pydantic_core", "PyYAML"]) == (
        "pydantic-core==2.0 \\\n    --hash=sha256:2\n    --hash=sha256:3\npyyaml==6.0 \\\n    --hash=sha256:4\n"
    )


def test_the_release_notes_are_the_versions_section_and_the_files(tmp_path: pathlib.Path) -> None:
    (tmp_path / "f.yaml").write_text("x")
    changelog = f"# Changelog\n\n## [9.9.9] — later\n\n- no\n\n## [{__version__}] — now\n\n- yes\n\n## [0.0.1]\n- old\n"
    notes = release.release_notes(changelog, [tmp_path / "f.yaml"])
    assert notes.startswith(f"# Coroner {release.TAG}\n\n- yes\n\n## Files\n")
    assert "| `f.yaml` | 1 |" in notes
    assert "no" not in notes.split("## Files")[0].replace("# Coroner", "")
    with pytest.raises(DevClusterError, match="no section"):
        release.release_notes("# Changelog\n", [])


def test_the_shipped_krew_manifest_is_rewritten_with_the_archives_sha256(tmp_path: pathlib.Path) -> None:
    archive = tmp_path / f"kubectl-coroner-{release.TAG}.tar.gz"
    archive.write_bytes(b"archive")
    manifest = yaml.safe_load(release.krew_manifest(archive))
    assert manifest["spec"]["platforms"][0]["sha256"] == release.sha256(archive)
