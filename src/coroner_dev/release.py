"""`make release`: everything a user installs Coroner from, written to `dist/` (git ignores it).

What `dist/` holds, for the version `coroner.__version__` (`TAG` = `v<version>`):

- `coroner-{agent,operator,registrar}-TAG.oci.tar`: the shipped images as OCI archives (the build of
  `coroner dev-cluster images`, `coroner_dev.devcluster.images`), and `images.json`: each one's
  reference, manifest digest (what a registry and `ctr images ls` show), config digest and archive;
- `coroner-{agent,operator,registrar}-TAG.spdx.json`: an SBOM of each image (SPDX 2.3, by syft:
  `coroner_dev.sbom` says which tool and why);
- `install-plan-only.yaml`, `install-production.yaml`: `kubectl kustomize` of each overlay with the
  operator's and the agent's images pinned by digest;
- `coroner-VERSION.tgz`: the chart (`helm package`), its values pinning both images by digest;
- `kubectl-coroner-TAG.tar.gz`: the plugin (`kubectl-coroner`, a Python zipapp of the package and
  the pure-Python dependencies it imports, from `plugins/kubectl-coroner.lock`; the completion helper
  `kubectl_complete-coroner`; LICENSE), and `coroner.yaml`, the krew manifest carrying its sha256;
- `RELEASE-NOTES.md`: the version's section of CHANGELOG.md, and the files with their sizes;
- `SHA256SUMS`: `sha256sum -c SHA256SUMS` checks every file above.

Reproducible. Every file's bytes depend only on the tracked inputs and the time of the last commit
(SOURCE_DATE_EPOCH, which the archives' and the chart's timestamps take): two runs give the same
SHA256SUMS. The images come from the image cache keyed by their inputs, so two releases of one
tree ship the very same images. What a build of the images afresh (another cache, another machine)
changes, and why, is in docs/upgrading.md ("Reproducing a release"); the SBOMs follow the images.

`--no-images` (the fast mode the tests use) skips the image archives and their SBOMs; the install
YAML and the chart then pin the images by tag, and `images.json` is not written.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Mapping

import yaml

from coroner import __version__
from coroner_dev import sbom, version_pins
from coroner_dev.devcluster.errors import DevClusterError

REPO = pathlib.Path(__file__).resolve().parents[2]
TAG = f"v{__version__}"
#: The images a release ships (the test-only worker and pause images are not).
SHIPPED = ("agent", "operator", "registrar")
#: Images the manifests and the chart name, pinned by digest in a release: name -> values key.
PINNED = {"operator": "operator", "agent": "agent"}
OVERLAYS = ("plan-only", "production")
PLUGIN = "kubectl-coroner"
COMPLETION = "kubectl_complete-coroner"


def source_date_epoch(repo: pathlib.Path = REPO) -> int:
    """SOURCE_DATE_EPOCH when set, else the time of the last commit: what every timestamp becomes."""
    given = os.environ.get("SOURCE_DATE_EPOCH")
    if given:
        return int(given)
    stamp = subprocess.run(["git", "log", "-1", "--format=%ct"], cwd=repo, capture_output=True, text=True, check=True)
    return int(stamp.stdout.strip())


def sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# Archives with the same bytes for the same contents.


def write_tar_gz(path: pathlib.Path, members: Mapping[str, tuple[bytes, int]], *, epoch: int) -> None:
    """A gzip'd tar of MEMBERS (name -> (bytes, mode)), sorted, root-owned, every time EPOCH."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(members):
            data, mode = members[name]
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, epoch
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    with open(path, "wb") as handle, gzip.GzipFile(filename="", mode="wb", fileobj=handle, mtime=epoch) as out:
        out.write(raw.getvalue())


# ---------------------------------------------------------------------------------------------
# The parts.


def kubectl_path() -> pathlib.Path:
    from coroner_dev.devcluster.binaries import ensure_binaries

    return ensure_binaries().directory / "kubectl"


def helm_path() -> pathlib.Path:
    from coroner_dev.devcluster.tools import ensure_tools

    return ensure_tools().path("helm")


def install_yaml(overlay: str, digests: Mapping[str, str], *, kubectl: pathlib.Path, work: pathlib.Path) -> str:
    """`kubectl kustomize` of manifests/overlays/OVERLAY, with DIGESTS (image name -> digest) pinned."""
    directory = work / f"install-{overlay}"
    directory.mkdir()
    images = [
        {"name": f"ghcr.io/coroner-dev/coroner-{name}", "digest": digests[name]} for name in PINNED if name in digests
    ]
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(REPO / "manifests" / "overlays" / overlay, directory)],
        "images": images,
    }
    (directory / "kustomization.yaml").write_text(json.dumps(kustomization, indent=2) + "\n")
    result = subprocess.run([str(kubectl), "kustomize", str(directory)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise DevClusterError(f"kubectl kustomize {overlay} failed: {result.stderr.strip()}", fix="kubectl kustomize")
    pins = ", ".join(f"{name}@{digest}" for name, digest in digests.items() if name in PINNED) or "by tag"
    header = f"# Coroner {TAG}, manifests/overlays/{overlay} (kubectl kustomize); images: {pins}.\n"
    return header + result.stdout


def package_chart(
    out: pathlib.Path, digests: Mapping[str, str], *, helm: pathlib.Path, work: pathlib.Path, epoch: int
) -> pathlib.Path:
    """`helm package` of a copy of charts/coroner whose values pin DIGESTS, every file's time EPOCH
    (helm writes the files' modification times into the archive)."""
    chart = work / "chart" / "coroner"
    shutil.copytree(REPO / "charts" / "coroner", chart)
    values_path = chart / "values.yaml"
    values = values_path.read_text()
    for name, key in PINNED.items():
        if name in digests:
            values = pin_digest(values, key, digests[name])
    values_path.write_text(values)
    for path in [chart, *chart.rglob("*")]:
        os.utime(path, (epoch, epoch))
    result = subprocess.run(
        [str(helm), "package", str(chart), "--destination", str(out)], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise DevClusterError(f"helm package failed: {result.stderr.strip()}", fix="helm lint --strict charts/coroner")
    return out / f"coroner-{__version__}.tgz"


def pin_digest(values: str, key: str, digest: str) -> str:
    """values.yaml's text with `KEY.image.digest` set (the text edited, so every comment stays)."""
    pattern = re.compile(rf'(^{key}:\n(?:[ #].*\n|\n)*?  image:\n(?:    .*\n)*?    digest: )""', re.MULTILINE)
    changed, count = pattern.subn(rf'\g<1>"{digest}"', values, count=1)
    if count != 1:
        raise DevClusterError(f"charts/coroner/values.yaml has no {key}.image.digest", fix="restore the value")
    if yaml.safe_load(changed)[key]["image"]["digest"] != digest:
        raise DevClusterError(f"pinning {key}.image.digest changed something else", fix="check values.yaml")
    return changed


LAUNCHER = f"""#!/usr/bin/env python3
# kubectl-coroner from the release archive: the package and its dependencies under lib/ beside this
# file, the compiled ones under lib/cpXY for each CPython it supports. `{COMPLETION}` runs it with
# the argument __complete__ (kubectl's plugin completion).
import os
import sys

here = os.path.dirname(os.path.realpath(__file__))
compiled = os.path.join(here, "lib", "cp%d%d" % sys.version_info[:2])
if not os.path.isdir(compiled):
    supported = sorted(name for name in os.listdir(os.path.join(here, "lib")) if name.startswith("cp3"))
    sys.exit(f"kubectl-coroner: this archive supports CPython {{', '.join(supported)}}, not {{sys.version.split()[0]}}; "
             "use one of those as python3, or pip install 'kube-coroner[cli]'")
sys.path[:0] = [compiled, os.path.join(here, "lib")]
if sys.argv[1:2] == ["__complete__"]:
    from coroner.cli.commands.completion import kubectl_complete

    del sys.argv[1]
    kubectl_complete()
else:
    from coroner.cli.kubectl import main

    sys.exit(main())
"""
COMPLETION_SCRIPT = f"""#!/bin/sh
# kubectl's completion of `kubectl coroner`: the plugin beside this file answers it.
exec python3 "$(dirname "$(readlink -f "$0")")/{PLUGIN}" __complete__ "$@"
"""
#: The CPythons the archive carries compiled dependencies for, and the platform (krew's selector).
PLUGIN_PYTHONS = ("3.11", "3.12", "3.13", "3.14")
PLUGIN_PLATFORM = "manylinux2014_x86_64"


def _pip_target(target: pathlib.Path, requirements: pathlib.Path, python: str) -> None:
    """Installs REQUIREMENTS (hashed) into TARGET as wheels for CPython PYTHON on PLUGIN_PLATFORM."""
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile"]
    command += ["--target", str(target), "--no-deps", "--require-hashes", "--only-binary=:all:"]
    command += ["--platform", PLUGIN_PLATFORM, "--implementation", "cp", "--python-version", python]
    result = subprocess.run([*command, "-r", str(requirements)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise DevClusterError(
            f"pip install of {requirements.name} failed: {result.stderr.strip()[-1500:]}", fix="make locks"
        )
    shutil.rmtree(target / "bin", ignore_errors=True)


def lock_entries(lock: str, names: Iterable[str]) -> str:
    """The entries of a hashed lock (uv's format) for the distributions NAMES."""
    wanted = {re.sub(r"[-_.]+", "-", name).lower() for name in names}
    blocks = re.split(r"(?m)^(?=[A-Za-z0-9])", lock)
    return "".join(b for b in blocks if b and re.sub(r"[-_.]+", "-", b.split("==")[0]).lower() in wanted)


def plugin_archive(out: pathlib.Path, *, work: pathlib.Path, epoch: int, say: Callable[[str], None]) -> pathlib.Path:
    """kubectl-coroner-TAG.tar.gz (module docstring)."""
    lib = work / "plugin" / "lib"
    lock = REPO / "plugins" / "kubectl-coroner.lock"
    say(f"installing the plugin's dependencies from {lock.name} (pip; CPython {', '.join(PLUGIN_PYTHONS)})")
    first = PLUGIN_PYTHONS[0]
    _pip_target(lib, lock, first)
    # What holds a compiled module moves to lib/cpXY, and is installed again for each other CPython.
    compiled = sorted({p.relative_to(lib).parts[0] for p in lib.rglob("*.so")})
    distributions = sorted(
        {info.name.split("-")[0] for info in lib.glob("*.dist-info") if any(
            line.split("/")[0].split(",")[0] in compiled for line in (info / "RECORD").read_text().splitlines()
        )}
    )  # fmt: skip
    for python in PLUGIN_PYTHONS:
        target = lib / f"cp{python.replace('.', '')}"
        if python == first:
            target.mkdir()
            for name in compiled + [i.name for i in lib.glob("*.dist-info") if i.name.split("-")[0] in distributions]:
                (lib / name).rename(target / name)
        else:
            requirements = work / f"compiled-{python}.lock"
            requirements.write_text(lock_entries(lock.read_text(), distributions))
            _pip_target(target, requirements, python)
    shutil.copytree(REPO / "src" / "coroner", lib / "coroner", ignore=shutil.ignore_patterns("__pycache__"))
    info = lib / f"kube_coroner-{__version__}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: kube-coroner\nVersion: {__version__}\n")
    (info / "top_level.txt").write_text("coroner\n")
    members = {
        PLUGIN: (LAUNCHER.encode(), 0o755),
        COMPLETION: (COMPLETION_SCRIPT.encode(), 0o755),
        "LICENSE": ((REPO / "LICENSE").read_bytes(), 0o644),
    }
    for path in lib.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            members[path.relative_to(lib.parent).as_posix()] = (path.read_bytes(), 0o644)
    archive = out / f"{PLUGIN}-{TAG}.tar.gz"
    write_tar_gz(archive, members, epoch=epoch)
    return archive


def krew_manifest(archive: pathlib.Path) -> str:
    """plugins/coroner.yaml with the archive's sha256 in place of its placeholder."""
    text = (REPO / "plugins" / "coroner.yaml").read_text()
    changed, count = re.subn(r'(sha256: )"?[0-9a-f]{64}"?', rf'\g<1>"{sha256(archive)}"', text)
    if count != 1 or archive.name not in changed:
        raise DevClusterError(
            f"plugins/coroner.yaml has not exactly one sha256 or names no {archive.name}", fix="check it"
        )
    return changed


def release_notes(changelog: str, files: Iterable[pathlib.Path]) -> str:
    """The version's section of CHANGELOG.md, and what dist/ holds."""
    match = re.search(
        rf"^## \[?{re.escape(__version__)}\]?[^\n]*\n(.*?)(?=^## |\Z)", changelog, re.MULTILINE | re.DOTALL
    )
    if match is None:
        raise DevClusterError(
            f"CHANGELOG.md has no section `## {__version__}`", fix="write the release's changes there"
        )
    rows = "".join(f"| `{path.name}` | {path.stat().st_size:,} |\n" for path in sorted(files))
    return (
        f"# Coroner {TAG}\n\n{match.group(1).strip()}\n\n## Files\n\n| file | bytes |\n| --- | ---: |\n{rows}\n"
        'Check them with `sha256sum -c SHA256SUMS`. Install: README.md, "Install".\n'
    )


def shipped_images(out: pathlib.Path, *, say: Callable[[str], None], epoch: int) -> dict[str, str]:
    """Copies the shipped images' archives into OUT, writes their SBOMs and images.json; returns the
    manifest digests by name."""
    from coroner_dev.devcluster.images import ensure_images

    built = ensure_images(progress=say)
    syft = sbom.ensure_syft(say=say)
    record: dict[str, dict[str, str]] = {}
    for name in SHIPPED:
        image = getattr(built, name)
        archive = out / f"coroner-{name}-{TAG}.oci.tar"
        shutil.copyfile(image.archive, archive)
        say(f"scanning {archive.name} with syft")
        sbom.write_sbom(
            syft, archive, out / f"coroner-{name}-{TAG}.spdx.json",
            name=f"coroner-{name}", version=TAG, digest=image.manifest_digest, epoch=epoch,
        )  # fmt: skip
        record[name] = {
            "reference": image.reference,
            "digest": image.manifest_digest,
            "config_digest": image.config_digest,
            "archive": archive.name,
        }
    (out / "images.json").write_text(json.dumps({"version": TAG, "images": record}, indent=2, sort_keys=True) + "\n")
    return {name: entry["digest"] for name, entry in record.items()}


def build(out: pathlib.Path, *, images: bool = True, say: Callable[[str], None] = print) -> pathlib.Path:
    """Writes the release into OUT (replaced whole, by one rename at the end). Returns OUT."""
    wrong = version_pins.mismatches(REPO)
    if wrong:
        listed = "\n  ".join(str(m) for m in wrong)
        raise DevClusterError(
            f"these places disagree with coroner.__version__ {__version__}:\n  {listed}", fix="set them"
        )
    epoch = source_date_epoch()
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    work = pathlib.Path(tempfile.mkdtemp(prefix="coroner-release-"))
    try:
        digests = shipped_images(staging, say=say, epoch=epoch) if images else {}
        kubectl = kubectl_path()
        for overlay in OVERLAYS:
            (staging / f"install-{overlay}.yaml").write_text(install_yaml(overlay, digests, kubectl=kubectl, work=work))
        package_chart(staging, digests, helm=helm_path(), work=work, epoch=epoch)
        archive = plugin_archive(staging, work=work, epoch=epoch, say=say)
        (staging / "coroner.yaml").write_text(krew_manifest(archive))
        files = sorted(path for path in staging.iterdir() if path.is_file())
        notes = release_notes((REPO / "CHANGELOG.md").read_text(), files)
        (staging / "RELEASE-NOTES.md").write_text(notes)
        sums = "".join(f"{sha256(path)}  {path.name}\n" for path in sorted(staging.iterdir()) if path.is_file())
        (staging / "SHA256SUMS").write_text(sums)
        staging.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m coroner_dev.release [--out dist] [--no-images]` (`make release`)."""
    parser = argparse.ArgumentParser(prog="python -m coroner_dev.release", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=REPO / "dist")
    parser.add_argument("--no-images", action="store_true", help="skip the image archives and their SBOMs (fast)")
    arguments = parser.parse_args(argv)
    say = lambda message: print(message, file=sys.stderr)  # noqa: E731
    try:
        out = build(arguments.out, images=not arguments.no_images, say=say)
    except DevClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for line in (out / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        print(f"{(out / name).stat().st_size:>12,}  {digest[:16]}  {name}")
    print(f"release {TAG} in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
