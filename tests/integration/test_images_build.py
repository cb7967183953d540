"""The images, really built (`coroner_dev.devcluster.images.ensure_images`: buildah on the stand-in
Debian base, PyPI through this machine's pip settings; minutes the first time, cached after), then
run from their archives the way a node would: each OCI archive's layers unpacked in order into a
root file system, and the image's own entry point, user and environment (from its config) run in it
with chroot. The operator's runs as 65532 on a read-only root (a private mount namespace's
read-only bind mount), as manifests/base/operator.yaml runs it.

Needs root (chroot, mount namespaces) and buildah + mmdebstrap (`apt-get install -y buildah
mmdebstrap catatonit`); the build's first run takes about 2 minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

from coroner_dev.devcluster import imagerecipe, images

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(os.geteuid() != 0, reason="unpacking image layers and chroot need root"),
]


@pytest.fixture(scope="module")
def built() -> images.Images:
    return images.ensure_images(progress=print)


def blob(layout: pathlib.Path, digest: str) -> pathlib.Path:
    algorithm, _, encoded = digest.partition(":")
    return layout / "blobs" / algorithm / encoded


def unpack(archive: pathlib.Path, into: pathlib.Path) -> dict[str, Any]:
    """The image's root file system (its layers in order, whiteouts applied) and its config."""
    layout = into / "layout"
    layout.mkdir()
    subprocess.run(["tar", "-xf", str(archive), "-C", str(layout)], check=True)
    index = json.loads((layout / "index.json").read_text())
    (descriptor,) = index["manifests"]
    manifest = json.loads(blob(layout, descriptor["digest"]).read_text())
    rootfs = into / "rootfs"
    rootfs.mkdir()
    for layer in manifest["layers"]:
        path = blob(layout, layer["digest"])
        names = subprocess.run(["tar", "-tzf", str(path)], capture_output=True, text=True, check=True).stdout.split()
        for name in names:  # whiteouts: a deleted file or an opaque directory
            base = os.path.basename(name.rstrip("/"))
            if base == ".wh..wh..opq":
                directory = rootfs / os.path.dirname(name)
                for child in directory.iterdir() if directory.is_dir() else ():
                    shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
            elif base.startswith(".wh."):
                target = rootfs / os.path.dirname(name) / base[len(".wh.") :]
                shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink(missing_ok=True)
        subprocess.run(
            ["tar", "-xzf", str(path), "-C", str(rootfs), "--numeric-owner", "--exclude=.wh.*", "--exclude=*/.wh.*"],
            check=True,
        )
    config = json.loads(blob(layout, manifest["config"]["digest"]).read_text())
    return {"rootfs": rootfs, "config": config["config"], "history": config.get("history", []), "layers": manifest}


@pytest.fixture(scope="module")
def unpacked(built: images.Images, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    result = {}
    for image in built.all():
        result[image.name] = unpack(image.archive, tmp_path_factory.mktemp(image.name))
    yield result


def in_image(
    image: dict[str, Any], argv: list[str], *, read_only: bool = False, user: str | None = None
) -> subprocess.Popen[str]:
    """`argv` in the unpacked image, as its config's user with its config's environment (chroot in
    a private mount namespace; the root bind-mounted read-only when asked)."""
    rootfs, config = image["rootfs"], image["config"]
    userspec = user or config.get("User") or "0:0"
    if ":" not in userspec:
        userspec += f":{userspec}"
    env = dict(item.split("=", 1) for item in config.get("Env", []))
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && ' if read_only else ""
    script += 'exec chroot --userspec="$USERSPEC" "$0" "$@"'
    return subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(rootfs), *argv],
        env={**env, "USERSPEC": userspec},
        cwd="/",
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_in_image(image: dict[str, Any], argv: list[str], **kwargs: Any) -> tuple[int, str]:
    proc = in_image(image, argv, **kwargs)
    out, _ = proc.communicate(timeout=120)
    return proc.returncode, out


def entry(image: dict[str, Any], *args: str) -> list[str]:
    return [*image["config"]["Entrypoint"], *args]


def test_the_images_are_named_and_sized(built: images.Images) -> None:
    assert [image.reference for image in built.all()] == [recipe.reference for recipe in imagerecipe.RECIPES]
    for image in built.all():
        assert image.archive.is_file() and image.archive.stat().st_size == image.archive_bytes
        with tarfile.open(image.archive) as tar:
            index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        assert index["manifests"][0]["annotations"]["io.containerd.image.name"] == image.reference
        assert index["manifests"][0]["digest"] == image.manifest_digest
        assert image.uncompressed_bytes > image.compressed_bytes > 0


def test_a_second_call_finds_the_cache(built: images.Images) -> None:
    # An input edited since `built` (a shared checkout) is a new key: built once more, then cached.
    first = images.ensure_images(progress=print)
    started = time.monotonic()
    again = images.ensure_images(progress=print)
    assert again.source == "cache" and again.key == first.key and again.agent.archive == first.agent.archive
    assert time.monotonic() - started < 10


def test_the_agent_image_runs_its_entry_point(unpacked: dict[str, dict[str, Any]]) -> None:
    agent = unpacked["agent"]
    assert agent["config"]["Entrypoint"] == ["coroner-agent"]
    assert agent["config"].get("User", "") == ""  # root, with only CAP_SYS_PTRACE in the manifests
    code, out = run_in_image(agent, entry(agent, "--help"))
    assert code == 0, out
    assert "Usage: coroner-agent" in out
    # The launcher ships in the agent image too (docs/cli.md), and python is the venv's.
    code, out = run_in_image(agent, ["python", "-c", "import sys, coroner.launcher; print(sys.prefix)"])
    assert (code, out.strip()) == (0, "/usr/local")


def test_the_operator_image_runs_as_65532_on_a_read_only_root(unpacked: dict[str, dict[str, Any]]) -> None:
    operator = unpacked["operator"]
    assert operator["config"]["Entrypoint"] == ["coroner-operator"]
    assert operator["config"]["User"] == "65532:65532"
    code, out = run_in_image(operator, entry(operator, "--help"), read_only=True)
    assert code == 0, out
    assert "Usage: coroner-operator" in out
    code, out = run_in_image(operator, ["python", "-c", "import os, kopf; print(os.getuid())"], read_only=True)
    assert (code, out.strip()) == (0, "65532")
    code, out = run_in_image(operator, ["touch", "/tmp/x"], read_only=True, user="0:0")
    assert code != 0 and "Read-only file system" in out
    # The CLI ships in it for the chart's `helm test`, which runs doctor from this image.
    code, out = run_in_image(operator, ["kubectl-coroner", "doctor", "--help"], read_only=True)
    assert code == 0 and "PASS / WARN / FAIL / UNKNOWN" in out, out


def test_no_build_time_setting_is_in_an_image(unpacked: dict[str, dict[str, Any]]) -> None:
    for name, image in unpacked.items():
        rootfs = image["rootfs"]
        assert not (rootfs / "etc" / "pip.conf").exists(), name
        assert not any("pip.conf" in json.dumps(entry) for entry in image["history"]), name
        if name not in ("pause", "go-worker"):  # the images FROM scratch have no /etc, no /dev
            assert (rootfs / "etc" / "resolv.conf").read_text() == "", name
            assert not list((rootfs / "dev").iterdir()), name


def test_the_worker_image_launches_and_its_test_worker_obeys(unpacked: dict[str, dict[str, Any]]) -> None:
    worker = unpacked["worker"]
    assert worker["config"]["Entrypoint"] == ["coroner", "run"]
    assert worker["config"]["User"] == "65532:65532"
    code, out = run_in_image(worker, entry(worker, "--help"), read_only=True)
    assert code == 0 and "Launch COMMAND as a registered worker" in out, out
    code, out = run_in_image(worker, ["coroner-test-worker", "0.2", "3"], read_only=True)
    assert code == 3 and "exiting 3 after 0.2 s" in out, out
    proc = in_image(worker, ["coroner-test-worker"], read_only=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "coroner-test-worker pid=" in line and "started" in line
    # chroot and unshare exec into the worker: the signal reaches it, as `coroner run` forwards it.
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out


def test_the_registrar_image_runs_coroner_registrar_as_65532_on_a_read_only_root_with_the_base_alone(
    unpacked: dict[str, dict[str, Any]],
) -> None:
    registrar = unpacked["registrar"]
    assert registrar["config"]["Entrypoint"] == ["coroner"]
    assert registrar["config"]["User"] == "65532:65532"
    code, out = run_in_image(registrar, entry(registrar, "registrar", "--help"), read_only=True)
    assert code == 0 and "Register the main process of every other container" in out, out
    present = (
        "import importlib.util as u; print([m for m in ('prometheus_client', 'kopf', 'kubernetes', "
        "'coroner_agent', 'coroner_operator', 'coroner_dev') if u.find_spec(m)])"
    )
    code, out = run_in_image(registrar, ["python", "-c", present], read_only=True)
    assert (code, out.strip()) == (0, "[]")


def test_the_go_worker_image_is_its_static_binary_alone_and_obeys(unpacked: dict[str, dict[str, Any]]) -> None:
    go = unpacked["go-worker"]
    assert go["config"]["Entrypoint"] == ["/go-worker"]
    assert go["config"]["User"] == "65532:65532"
    assert sorted(path.name for path in go["rootfs"].iterdir()) == ["go-worker"]
    code, out = run_in_image(go, entry(go, "0.2", "3"), read_only=True)
    assert code == 3 and "exiting 3 after 0.2 s" in out, out
    proc = in_image(go, entry(go), read_only=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "go-worker pid=" in line and "started" in line, line
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "exiting 0" in out, out


def test_the_pause_image_is_catatonit_alone(unpacked: dict[str, dict[str, Any]]) -> None:
    pause = unpacked["pause"]
    assert pause["config"]["Entrypoint"] == ["/catatonit", "-P"]
    assert pause["config"]["User"] == "65535:65535"
    assert sorted(path.name for path in pause["rootfs"].iterdir()) == ["catatonit"]
    proc = in_image(pause, entry(pause), read_only=True)
    time.sleep(0.5)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
