"""The one Go-module builder of the dev tooling (`coroner_dev.devcluster.gobuild`), with a stand-in `go`.

The control plane and the tools are built by one builder parameterised by module, packages and
cache directory; what must not move is where each lands (the cache keys existing caches are found
under) and that a build happens once: a cached directory is reused, a failed build leaves nothing a
later run could take for a cache hit. The real `go build` is exercised by every control-plane test.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import stat

import pytest

from coroner_dev.devcluster import binaries, gobuild, tools
from coroner_dev.devcluster.errors import DevClusterError

pytestmark = pytest.mark.unit

#: A `go` that "builds" each package into an executable named as go names it (the last path
#: element that is not a major version), logs each call, and fails when FAKE_GO_EXIT says so.
FAKE_GO = """#!/bin/sh
echo "$@" >> "$FAKE_GO_CALLS"
[ -n "$FAKE_GO_EXIT" ] && { echo "compile error" ; exit "$FAKE_GO_EXIT" ; }
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    -o) out="$2"; shift 2 ;;
    -tags|-ldflags) shift 2 ;;
    build|-trimpath) shift ;;
    *) name=$(basename "$1"); case "$name" in v[0-9]*) name=$(basename "$(dirname "$1")") ;; esac
       printf '#!/bin/sh\\n' > "$out$name"; chmod +x "$out$name"; shift ;;
  esac
done
"""


@pytest.fixture
def fake_go(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    go = bin_dir / "go"
    go.write_text(FAKE_GO)
    go.chmod(go.stat().st_mode | stat.S_IXUSR)
    calls = tmp_path / "go-calls"
    calls.touch()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_GO_CALLS", str(calls))
    monkeypatch.delenv("FAKE_GO_EXIT", raising=False)
    monkeypatch.setenv("CORONER_CACHE_DIR", str(tmp_path / "cache"))
    return calls


def build(module: pathlib.Path, **overrides: object) -> gobuild.GoBuild:
    fields: dict[str, object] = {
        "title": "the thing",
        "module": module,
        "packages": {"thing": "example.com/cmd/thing", "etcd": "go.etcd.io/etcd/server/v3"},
        "cache_dir": "things",
        "versions": "thing-v1",
        "ldflags": "-s -w",
        "announce": "building the thing",
        "go_missing_fix": "install go",
        "override": "THING_DIR",
        "renames": {"server": "etcd"},
    }
    fields.update(overrides)
    return gobuild.GoBuild(**fields)  # type: ignore[arg-type]


def test_the_cache_keys_existing_caches_are_found_under() -> None:
    """The keys are the versions and the first 12 hex digits of sha256(go.mod + go.sum), as before
    the two builders became one (~/.cache/coroner/k8s/v1.37.2-etcd-v3.7.0-57107ae94f3c is reused)."""
    for made, versions in (
        (binaries.control_plane_build(), f"{binaries.K8S_VERSION}-etcd-{binaries.ETCD_VERSION}"),
        (tools.tools_build(), f"helm-{tools.HELM_VERSION}-prometheus-{tools.PROMETHEUS_VERSION}"),
    ):
        digest = hashlib.sha256(b"".join((made.module / n).read_bytes() for n in ("go.mod", "go.sum")))
        assert made.cache_key() == f"{versions}-{digest.hexdigest()[:12]}"
    assert binaries.control_plane_build().cache_dir == "k8s" and tools.tools_build().cache_dir == "tools"


def test_builds_once_then_reuses_the_cache(fake_go: pathlib.Path, tmp_path: pathlib.Path) -> None:
    module = tmp_path / "module"
    module.mkdir()
    (module / "go.mod").write_text("module example.com/testenv\n")
    said: list[str] = []
    directory, source = gobuild.ensure(build(module), say=said.append)
    assert source == "built" and directory.parent == tmp_path / "cache" / "things"
    assert directory.name.startswith("thing-v1-")
    assert sorted(p.name for p in directory.iterdir()) == ["etcd", "thing"]  # "server" renamed
    assert said[0].startswith("building the thing (log: ") and said[-1].startswith("built the thing in ")
    again, source = gobuild.ensure(build(module), say=said.append)
    assert (again, source) == (directory, "cache")
    assert len(fake_go.read_text().splitlines()) == 1  # go ran once
    (module / "go.sum").write_text("a moved pin\n")
    moved, source = gobuild.ensure(build(module), say=said.append)
    assert source == "built" and moved != directory


def test_a_failed_build_leaves_no_cache_hit(
    fake_go: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = tmp_path / "module"
    module.mkdir()
    monkeypatch.setenv("FAKE_GO_EXIT", "2")
    with pytest.raises(DevClusterError) as failed:
        gobuild.ensure(build(module), say=lambda _: None)
    assert "building the thing failed (go build exit 2)" in str(failed.value) and "compile error" in str(failed.value)
    assert [p.name for p in (tmp_path / "cache" / "things").iterdir() if not p.name.startswith(("build-", "."))] == []


def test_a_package_go_did_not_produce_is_named(fake_go: pathlib.Path, tmp_path: pathlib.Path) -> None:
    module = tmp_path / "module"
    module.mkdir()
    with pytest.raises(DevClusterError, match="go build produced no etcd"):
        gobuild.ensure(build(module, renames={}), say=lambda _: None)


def test_an_override_directory_skips_the_build(
    fake_go: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    given = tmp_path / "given"
    given.mkdir()
    (given / "thing").write_text("#!/bin/sh\n")
    (given / "thing").chmod(0o755)
    monkeypatch.setenv("THING_DIR", str(given))
    said: list[str] = []
    directory, source = gobuild.ensure(build(tmp_path, override_requires=("thing",)), say=said.append)
    assert (directory, source) == (given, "THING_DIR") and fake_go.read_text() == ""
    # Lacking a required binary, it says so and builds instead.
    directory, source = gobuild.ensure(build(tmp_path), say=said.append)
    assert source == "built" and said[0] == f"THING_DIR={given} lacks one of thing, etcd; building instead"
