"""The image builder's pure parts (`coroner_dev.devcluster.images`): what its cache key digests, the
references it names images by, the pip settings it passes to a build, and the archives' naming.

The build itself (buildah, mmdebstrap, PyPI) is tests/integration/test_images_build.py.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import stat
import subprocess
import tomllib

import pytest
import yaml

from coroner.core import inject
from coroner_dev.devcluster import imagerecipe, images, ocilayout
from coroner_dev.devcluster.errors import DevClusterError

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[2]


def make_repo(path: pathlib.Path) -> pathlib.Path:
    """A checkout with one file per input root, and what the key must not see."""
    files = {
        "pyproject.toml": "[project]\nname = 'x'\n",
        "README.md": "# x\n",
        "images/agent.Dockerfile": "ARG BASE=python:3.11.7-slim-bookworm\nFROM ${BASE}\n",
        "images/agent.lock": "click==8.1 --hash=sha256:00\n",
        "images/go-worker/main.go": "package main\n\nfunc main() {}\n",
        "src/coroner/__init__.py": "",
        "operator/src/coroner_operator/__init__.py": "",
        "node-agent/src/coroner_agent/__init__.py": "",
        "src/coroner_dev/__init__.py": "",  # not an input: no image copies it
        "tests/test_x.py": "",
    }
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return path


def git(repo: pathlib.Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
        check=True,
        capture_output=True,
    )


@pytest.fixture(params=["git", "plain"])
def repo(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> pathlib.Path:
    checkout = make_repo(tmp_path / "repo")
    if request.param == "git":
        if shutil.which("git") is None:
            pytest.skip("no git")
        (checkout / ".gitignore").write_text("__pycache__/\n*.pyc\n*.egg-info/\n")
        git(checkout, "init", "-q")
        git(checkout, "add", ".")
        git(checkout, "commit", "-q", "-m", "x")
    return checkout


def test_the_key_is_the_same_for_the_same_inputs(repo: pathlib.Path) -> None:
    assert imagerecipe.cache_key(repo) == imagerecipe.cache_key(repo)
    assert imagerecipe.cache_key(repo).startswith(f"r{imagerecipe.RECIPE_VERSION}-")


@pytest.mark.parametrize(
    "name",
    [
        "pyproject.toml",
        "README.md",
        "images/agent.Dockerfile",
        "images/agent.lock",
        "images/go-worker/main.go",
        "src/coroner/__init__.py",
        "operator/src/coroner_operator/__init__.py",
        "node-agent/src/coroner_agent/__init__.py",
    ],
)
def test_a_changed_input_is_a_new_key(repo: pathlib.Path, name: str) -> None:
    before = imagerecipe.cache_key(repo)
    with open(repo / name, "a") as handle:
        handle.write("# changed\n")
    assert imagerecipe.cache_key(repo) != before


def test_a_new_file_under_a_root_is_a_new_key_and_bytecode_or_other_trees_are_not(repo: pathlib.Path) -> None:
    before = imagerecipe.cache_key(repo)
    (repo / "src" / "coroner" / "__pycache__").mkdir()
    (repo / "src" / "coroner" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (repo / "src" / "coroner_dev" / "more.py").write_text("x = 1\n")
    (repo / "tests" / "test_y.py").write_text("")
    assert imagerecipe.cache_key(repo) == before
    (repo / "src" / "coroner" / "new.py").write_text("x = 1\n")
    assert imagerecipe.cache_key(repo) != before
    assert "src/coroner/new.py" in imagerecipe.input_files(repo)


def test_an_executable_bit_is_an_input(repo: pathlib.Path) -> None:
    before = imagerecipe.cache_key(repo)
    script = repo / "images" / "agent.lock"
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    assert imagerecipe.cache_key(repo) != before


def test_a_deleted_input_is_a_new_key(repo: pathlib.Path) -> None:
    before = imagerecipe.cache_key(repo)
    (repo / "images" / "agent.lock").unlink()
    assert imagerecipe.cache_key(repo) != before


def test_the_base_recipe_and_the_recipe_version_are_inputs(repo: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before, base = imagerecipe.cache_key(repo), imagerecipe.base_reference()
    monkeypatch.setattr(imagerecipe, "BASE_PACKAGES", (*imagerecipe.BASE_PACKAGES, "curl"))
    assert imagerecipe.cache_key(repo) != before
    assert imagerecipe.base_reference() != base
    monkeypatch.undo()
    monkeypatch.setattr(imagerecipe, "RECIPE_VERSION", imagerecipe.RECIPE_VERSION + 1)
    assert imagerecipe.cache_key(repo) != before
    assert imagerecipe.base_reference() == base  # the base is the same recipe: not made again


def test_the_real_checkout_keys_every_input_root() -> None:
    files = imagerecipe.input_files(ROOT)
    for recipe in imagerecipe.RECIPES:
        assert recipe.dockerfile in files, recipe.dockerfile
    for prefix in ("images/registrar.lock", "images/go-worker/go.mod", "images/go-worker/main.go", "src/coroner/"):
        assert any(name.startswith(prefix) for name in files), prefix
    assert any(name.startswith("operator/src/") for name in files)
    assert any(name.startswith("node-agent/src/") for name in files)
    assert not any(name.startswith("src/coroner_dev/") or "__pycache__" in name for name in files)
    assert {"pyproject.toml", "README.md"} <= set(files)


def copied_from_the_context(dockerfile: str) -> list[str]:
    """The sources of a Dockerfile's COPY instructions that read the build context (not --from)."""
    sources = []
    for line in (ROOT / dockerfile).read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(word.startswith("--from") for word in words):
            sources.extend(words[1:-1])
    return sources


@pytest.mark.parametrize("recipe", imagerecipe.RECIPES, ids=lambda recipe: recipe.name)
def test_every_file_a_dockerfile_copies_is_an_input(recipe: imagerecipe.Recipe) -> None:
    """What the build reads is what the key digests and the staged context holds (a Go binary is
    built there from its module, every file of which is an input; the binary itself is not)."""
    files = set(imagerecipe.input_files(ROOT))
    built = recipe.go_binary.output if recipe.go_binary else None
    for source in copied_from_the_context(recipe.dockerfile):
        if source == built:
            assert recipe.go_binary is not None and source not in files
            assert f"{recipe.go_binary.module}/go.mod" in files and f"{recipe.go_binary.module}/main.go" in files
            continue
        assert source in files or any(name.startswith(source.rstrip("/") + "/") for name in files), source


@pytest.mark.parametrize("recipe", imagerecipe.RECIPES, ids=lambda recipe: recipe.name)
def test_an_image_that_installs_the_package_copies_what_its_metadata_names(recipe: imagerecipe.Recipe) -> None:
    """`pip install .` reads the readme and the license files pyproject.toml names (setuptools warns
    of a license file it cannot find, and will refuse it)."""
    if "--no-deps ." not in (ROOT / recipe.dockerfile).read_text():
        pytest.skip(f"{recipe.dockerfile} installs no package")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    copied = set(copied_from_the_context(recipe.dockerfile))
    assert {"pyproject.toml", project["readme"], *project["license-files"]} <= copied


def production_pins() -> set[str]:
    kustomization = yaml.safe_load((ROOT / "manifests" / "overlays" / "production" / "kustomization.yaml").read_text())
    return {f"{pin['name']}:{pin['newTag']}" for pin in kustomization["images"]}


def test_the_shipped_images_are_named_as_the_production_overlay_pins_them() -> None:
    assert {imagerecipe.AGENT_REFERENCE, imagerecipe.OPERATOR_REFERENCE} == production_pins()


def test_the_registrar_image_is_the_one_inject_and_the_injection_component_name() -> None:
    assert imagerecipe.REGISTRAR_REFERENCE == inject.REGISTRAR_IMAGE == "ghcr.io/coroner-dev/coroner-registrar:v0.1.0"
    component = (ROOT / "manifests" / "components" / "registrar-injection" / "registrar-injection.yaml").read_text()
    assert f'image: "{inject.REGISTRAR_IMAGE}"' in component


def test_the_base_manifests_name_the_same_images() -> None:
    named = set()
    for path in (ROOT / "manifests" / "base").glob("*.yaml"):
        for document in yaml.safe_load_all(path.read_text()):
            spec = (document or {}).get("spec", {}).get("template", {}).get("spec", {})
            for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
                named.add(container["image"])
    assert named == {imagerecipe.AGENT_REFERENCE, imagerecipe.OPERATOR_REFERENCE}


def test_every_recipe_has_a_dockerfile_taking_the_base_as_an_argument_or_is_scratch_alone() -> None:
    assert [recipe.name for recipe in imagerecipe.RECIPES] == [
        "agent",
        "operator",
        "registrar",
        "worker",
        "go-worker",
        "pause",
    ]
    for recipe in imagerecipe.RECIPES:
        lines = (ROOT / recipe.dockerfile).read_text().splitlines()
        instructions = [line for line in lines if line and not line.startswith("#")]
        froms = [line for line in instructions if line.startswith("FROM ")]
        if recipe.go_binary is not None:
            # Nothing but the binary: no base, no shell, no Python.
            assert froms == ["FROM scratch"], recipe.dockerfile
            assert copied_from_the_context(recipe.dockerfile) == [recipe.go_binary.output]
            continue
        assert instructions[0].startswith("ARG BASE"), recipe.dockerfile
        assert all(line.split()[1] in ("${BASE}", "scratch") for line in froms), recipe.dockerfile
    for name in ("agent", "operator", "registrar", "worker"):
        assert "ARG BASE=python:3.11.7-slim-bookworm\n" in (ROOT / "images" / f"{name}.Dockerfile").read_text()


def test_the_registrar_image_runs_coroner_as_65532() -> None:
    text = (ROOT / "images" / "registrar.Dockerfile").read_text()
    assert 'ENTRYPOINT ["coroner"]' in text and "USER 65532:65532" in text
    assert inject.REGISTRAR_ARGS == ("registrar",)
    assert "TEST-ONLY" not in text and "COPY images/worker" not in text


def test_a_go_binary_is_built_static_from_a_module_with_no_dependency() -> None:
    env = dict(imagerecipe.GO_BUILD_ENV)
    assert env["CGO_ENABLED"] == "0" and env["GOPROXY"] == "off" and env["GOTOOLCHAIN"] == "local"
    assert "-trimpath" in imagerecipe.GO_BUILD_ARGS
    for recipe in imagerecipe.RECIPES:
        if recipe.go_binary is None:
            continue
        module = ROOT / recipe.go_binary.module
        assert "require" not in (module / "go.mod").read_text() and not (module / "go.sum").exists()
        assert recipe.go_binary.output.startswith(recipe.go_binary.module + "/")
        # A binary built by hand in the checkout is not an input (.gitignore).
        assert recipe.go_binary.output not in imagerecipe.input_files(ROOT)


def test_how_a_go_binary_is_built_is_an_input(repo: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = imagerecipe.cache_key(repo)
    monkeypatch.setattr(imagerecipe, "GO_BUILD_ARGS", (*imagerecipe.GO_BUILD_ARGS, "-race"))
    assert imagerecipe.cache_key(repo) != before


def test_the_test_only_images_say_so_and_are_local_names() -> None:
    for recipe in imagerecipe.RECIPES:
        if recipe.name in ("worker", "go-worker", "pause"):
            assert recipe.reference.startswith("localhost/coroner-dev/")
            assert "TEST-ONLY" in (ROOT / recipe.dockerfile).read_text()
    assert imagerecipe.split_reference(imagerecipe.WORKER_REFERENCE) == ("localhost/coroner-dev/coroner-worker", "dev")


def test_archives_name_images_as_containerd_export_does() -> None:
    assert ocilayout.containerd_annotations(imagerecipe.AGENT_REFERENCE) == {
        "io.containerd.image.name": "ghcr.io/coroner-dev/coroner-agent:v0.1.0",
        "org.opencontainers.image.ref.name": "v0.1.0",
    }
    with pytest.raises(ValueError):
        imagerecipe.split_reference("localhost:5000/x")


def test_pip_settings_come_from_files_then_the_environment_and_never_name_install_locations(
    tmp_path: pathlib.Path,
) -> None:
    first, second = tmp_path / "a.conf", tmp_path / "b.conf"
    first.write_text("[global]\ncert = /a.crt\nindex-url = https://a/simple\ntarget = /x\n")
    second.write_text("[install]\nfind-links = /opt/wheels\ntrusted-host = b\n[global]\nindex-url = https://b/simple\n")
    environ = {
        "PIP_DEFAULT_TIMEOUT": "180",
        "PIP_FIND_LINKS": "/opt/wheels",
        "PIP_PREFIX": "/x",
        "PIP_CERT": "/env.crt",
        "https_proxy": "http://proxy:3128",
        "HOME": str(tmp_path),
    }
    settings = imagerecipe.pip_config(environ, [first, second])
    assert settings == {
        "cert": "/env.crt",
        "index-url": "https://b/simple",
        "trusted-host": "b",
        "default-timeout": "180",
        "proxy": "http://proxy:3128",
    }
    rendered = imagerecipe.render_pip_config(settings)
    assert rendered.startswith("[global]\n") and "cert = /env.crt\n" in rendered


def test_the_build_mounts_its_pip_conf_and_the_ca_files_it_names_read_only(tmp_path: pathlib.Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("x")
    conf = tmp_path / "pip.conf"
    mounts = imagerecipe.build_mounts({"cert": str(ca), "client-cert": "/absent.pem"}, conf)
    assert mounts == [f"{conf}:/etc/pip.conf:ro", f"{ca}:{ca}:ro"]


def test_pip_config_files_are_read_in_pips_order(tmp_path: pathlib.Path) -> None:
    (tmp_path / ".config" / "pip").mkdir(parents=True)
    (tmp_path / ".config" / "pip" / "pip.conf").write_text("[global]\n")
    (tmp_path / "extra.conf").write_text("[global]\n")
    found = imagerecipe.pip_config_files({"HOME": str(tmp_path), "PIP_CONFIG_FILE": str(tmp_path / "extra.conf")})
    assert found[-2:] == [tmp_path / ".config" / "pip" / "pip.conf", tmp_path / "extra.conf"]


def test_apt_sources_keep_the_enabled_debian_suite_entries(tmp_path: pathlib.Path) -> None:
    deb822 = tmp_path / "debian.sources"
    deb822.write_text(
        "Types: deb\n# a comment\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        "Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\n\n"
        "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: trixie\nComponents: main\n\n"
        "Types: deb\nURIs: http://off\nSuites: bookworm\nComponents: main\nEnabled: no\n"
    )
    one_line = tmp_path / "extra.list"
    one_line.write_text(
        "deb [arch=amd64 signed-by=/k.gpg] http://mirror/debian-security bookworm-security main # x\n"
        "deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n"
    )
    ignored = tmp_path / "nodesource.sources.disabled-by-farm"
    ignored.write_text("Types: deb\nURIs: http://x\nSuites: bookworm\nComponents: main\n")
    assert imagerecipe.apt_sources([deb822, one_line, ignored]) == [
        "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main",
        "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian "
        "bookworm-updates main",
        "deb [arch=amd64 signed-by=/k.gpg] http://mirror/debian-security bookworm-security main",
    ]


def test_an_archive_is_packed_the_same_way_twice(tmp_path: pathlib.Path) -> None:
    layout = tmp_path / "layout"
    (layout / "blobs" / "sha256").mkdir(parents=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    (layout / "index.json").write_text("{}")
    (layout / "blobs" / "sha256" / "ab").write_text("blob")
    ocilayout.pack(layout, tmp_path / "one.tar")
    os.utime(layout / "index.json", (1, 1))
    ocilayout.pack(layout, tmp_path / "two.tar")
    assert (tmp_path / "one.tar").read_bytes() == (tmp_path / "two.tar").read_bytes()


def record(directory: pathlib.Path) -> None:
    entries = {}
    for name in ("agent", "operator", "registrar", "worker", "go-worker", "pause"):
        (directory / f"{name}.oci.tar").write_bytes(b"x" * 10)
        entries[name] = {
            "reference": f"r/{name}:t",
            "archive": f"{name}.oci.tar",
            "archive_bytes": 10,
            "compressed_bytes": 9,
            "uncompressed_bytes": 20,
            "manifest_digest": "sha256:m",
            "config_digest": "sha256:c",
        }
    body = {"key": directory.name, "base": "b:t", "build_seconds": 1.5, "images": entries}
    (directory / "images.json").write_text(json.dumps(body))


def test_a_cached_build_is_found_only_when_every_archive_is_whole(tmp_path: pathlib.Path) -> None:
    record(tmp_path)
    found = images.load(tmp_path, source="cache")
    assert found is not None and found.source == "cache" and found.build_seconds == 1.5
    assert [image.name for image in found.all()] == [recipe.name for recipe in imagerecipe.RECIPES]
    assert found.agent.archive == tmp_path / "agent.oci.tar"
    assert found.summary()["images"]["pause"]["uncompressed_bytes"] == 20
    (tmp_path / "worker.oci.tar").write_bytes(b"x")
    assert images.load(tmp_path, source="cache") is None
    assert images.load(tmp_path / "absent", source="cache") is None


def test_old_builds_are_pruned_to_the_newest(tmp_path: pathlib.Path) -> None:
    for age in range(5):
        build = tmp_path / f"r1-{age}"
        build.mkdir()
        record(build)
        os.utime(build / "images.json", (1000 - age, 1000 - age))
        (tmp_path / f"build-r1-{age}.log").write_text("")
    (tmp_path / ".building-x").mkdir()
    images._prune(tmp_path, keep=tmp_path / "r1-4")
    left = sorted(path.name for path in tmp_path.iterdir())
    assert left == [
        "build-r1-0.log",
        "build-r1-1.log",
        "build-r1-2.log",
        "build-r1-4.log",
        "r1-0",
        "r1-1",
        "r1-2",
        "r1-4",
    ]


def fake_tools(directory: pathlib.Path, **scripts: str) -> None:
    directory.mkdir(exist_ok=True)
    for name, body in scripts.items():
        tool = directory / name
        tool.write_text(f"#!/bin/sh\n{body}\n")
        tool.chmod(0o755)


def test_without_buildah_the_fix_says_what_to_install(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_tools(tmp_path / "bin", git=f'exec {shutil.which("git") or "false"} "$@"')
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("CORONER_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(DevClusterError) as raised:
        images.ensure_images(progress=lambda _: None)
    assert "buildah" in str(raised.value)
    assert raised.value.fix == "apt-get install -y buildah mmdebstrap catatonit"
    assert not list((tmp_path / "cache" / "images").glob("r*"))


def test_without_mmdebstrap_the_fix_says_what_to_install(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A buildah whose storage holds no base: the base must be made, and mmdebstrap is missing.
    fake_tools(tmp_path / "bin", buildah='case "$*" in *inspect*) exit 1 ;; esac; exit 0')
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("CORONER_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(DevClusterError) as raised:
        images.ensure_images(progress=lambda _: None)
    assert "mmdebstrap" in str(raised.value)
    assert raised.value.fix == images.INSTALL_FIX
    assert not list((tmp_path / "cache" / "images").glob(".building-*"))
    assert not list((tmp_path / "cache" / "images").glob("r*"))
