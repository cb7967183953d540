"""Building the project's container images here, with no container engine and no registry: OCI archives
for `ctr -n k8s.io images import --local`.

What is built, each from its Dockerfile in `images/`, with its shipped recipe (the only local change
is the base, passed as `--build-arg BASE=...`):

- `ghcr.io/coroner-dev/coroner-agent:v0.1.0` and `ghcr.io/coroner-dev/coroner-operator:v0.1.0`: the
  shipped images, under exactly the references manifests/overlays/production pins (no image rewrite);
- `ghcr.io/coroner-dev/coroner-registrar:v0.1.0`: shipped, `coroner registrar`, under the reference
  `kubectl coroner inject` and components/registrar-injection name (`coroner.core.inject`);
- `localhost/coroner-dev/coroner-worker:dev`: test-only, the launcher (`coroner run`) and
  `coroner-test-worker`, for end-to-end tests;
- `localhost/coroner-dev/go-worker:dev`: test-only, a static Go binary in a `scratch` image (no
  shell, no Python, nothing of Coroner), for the registrar's real-node tests;
- `localhost/coroner-dev/pause:catatonit`: test-only, containerd's sandbox image (Debian's
  catatonit, `catatonit -P`).

The base. The registry's python:3.11.7-slim-bookworm cannot be pulled here, so a stand-in is made from
Debian packages through this machine's apt mirror (the bookworm entries of /etc/apt/sources.list*):
`mmdebstrap --variant=minbase` with python3.11 (bookworm's: the same minor), python3-venv,
ca-certificates and catatonit, no docs, man pages, locales or apt lists, and `/usr/local` made a
virtualenv of /usr/bin/python3.11. That gives the layout the Dockerfiles rely on: `python`,
`python3` and `pip` in /usr/local/bin, first on PATH; the venv's sysconfig scheme ('venv') makes
`pip install --prefix=/install` put packages in /install/lib/python3.11/site-packages and scripts
(with `#!/usr/local/bin/python3.11`) in /install/bin, so `COPY --from=build /install /usr/local`
lands them in the venv's own site-packages and bin. It is an image of buildah's storage,
`localhost/coroner-dev/python-base:bookworm-<recipe digest>`, made again only when its recipe moves.

The build. `buildah bud --isolation chroot --layers --pull=never` (no daemon; buildah's storage is
`<cache>/buildah`, overlay where it works, else vfs). `RUN pip install` reaches PyPI through this
machine's pip settings (its pip configuration files and PIP_* variables, merged into one pip.conf,
and the CA files they name), bind-mounted read-only for the RUN steps only: never in a layer. The
context is a staged copy of exactly the inputs the cache key digests; a recipe's Go binary
(`imagerecipe.GoBinary`) is built into it by this machine's `go` before buildah runs
(`imagerecipe.GO_BUILD_ARGS`, `GO_BUILD_ENV`: static, nothing fetched). Each image is pushed to an OCI
layout and packed as an OCI archive whose index names it the way containerd's own export does
(`io.containerd.image.name`: the full reference; `org.opencontainers.image.ref.name`: its tag).

The cache. `<cache>/images/<key>/` holds the archives and `images.json` (references, digests, sizes);
the key digests every input: the Dockerfiles and everything else under images/, pyproject.toml, LICENSE,
README.md, every file under src/coroner, operator/src and node-agent/src that git tracks or that is
present and not ignored, the base recipe and RECIPE_VERSION. One build at a time (a file lock); a
build lands by one rename; the newest KEEP_BUILDS builds are kept. The build log is
`<cache>/images/build-<key>.log`. buildah's storage keeps the base and the last build's step images
(its --layers cache: an edit to the sources rebuilds in well under a minute), nothing older.

For the node: `ensure_images()` returns `Images`; import each of `Images.all()` with
`ctr -n k8s.io images import --local <Image.archive>`, and name `Images.pause.reference` as
containerd's sandbox image.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from coroner_dev.devcluster import gobuild, imagerecipe, ocilayout
from coroner_dev.devcluster.errors import DevClusterError

#: Moves every cache key: raise it when what this module does to the inputs changes.
KEEP_BUILDS = 3

INSTALL_FIX = "apt-get install -y buildah mmdebstrap catatonit"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Image:
    """One built image, ready for `ctr -n k8s.io images import --local <archive>`."""

    name: str
    """agent, operator, registrar, worker, go-worker or pause (`imagerecipe.RECIPES`)."""
    reference: str
    """The name containerd gives it on import (the archive's `io.containerd.image.name`)."""
    archive: pathlib.Path
    """The OCI archive (a tar of an OCI image layout; gzip layers)."""
    manifest_digest: str
    """What `ctr images ls` shows as its digest."""
    config_digest: str
    """The image id."""
    archive_bytes: int
    compressed_bytes: int
    """The layers as stored (gzip), plus config and manifest."""
    uncompressed_bytes: int
    """The layers unpacked: the image's size on a node."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Images:
    """The images of one build, all of them, from one cache directory."""

    agent: Image
    operator: Image
    registrar: Image
    worker: Image
    go_worker: Image
    pause: Image
    directory: pathlib.Path
    key: str
    base: str
    """The stand-in base's reference in buildah's storage."""
    source: str
    """`built` (by this call) or `cache`."""
    build_seconds: float
    """How long the build that made them took."""

    def all(self) -> tuple[Image, ...]:
        """Every image, in build order."""
        return (self.agent, self.operator, self.registrar, self.worker, self.go_worker, self.pause)

    def summary(self) -> dict[str, Any]:
        """What `python -m coroner_dev.devcluster.images` prints (JSON-ready)."""
        return {
            "key": self.key,
            "directory": str(self.directory),
            "source": self.source,
            "build_seconds": self.build_seconds,
            "base": self.base,
            "images": {
                image.name: {
                    "reference": image.reference,
                    "archive": str(image.archive),
                    "archive_bytes": image.archive_bytes,
                    "compressed_bytes": image.compressed_bytes,
                    "uncompressed_bytes": image.uncompressed_bytes,
                    "manifest_digest": image.manifest_digest,
                    "config_digest": image.config_digest,
                }
                for image in self.all()
            },
        }


# ---------------------------------------------------------------------------------------------
# Finding or building.


def ensure_images(*, progress: Callable[[str], None] | None = None) -> Images:
    """The images as OCI archives, building them (once, under a lock) when the cache has none
    for the current inputs."""
    say = progress or (lambda message: print(message, file=sys.stderr))
    repo = imagerecipe.repo_root()
    files = imagerecipe.input_files(repo)
    key = imagerecipe.cache_key(repo, files)
    images_dir = gobuild.cache_root() / "images"
    target = images_dir / key
    cached = load(target, source="cache")
    if cached is not None:
        return cached
    images_dir.mkdir(parents=True, exist_ok=True)
    with gobuild.build_lock(images_dir / ".build.lock"):
        cached = load(target, source="cache")  # another process may have built it meanwhile
        if cached is not None:
            return cached
        target = _build(repo, files, key=key, target=target, say=say)
        _prune(images_dir, keep=target)
    built = load(target, source="built")
    if built is None:
        raise DevClusterError(f"the images built into {target} cannot be read back", fix=f"remove {target}")
    return built


def load(directory: pathlib.Path, *, source: str) -> Images | None:
    """The images recorded in `directory/images.json`, when every archive is there whole."""
    try:
        record = json.loads((directory / "images.json").read_text())
        images: dict[str, Image] = {}
        for name, entry in record["images"].items():
            archive = directory / entry["archive"]
            if not archive.is_file() or archive.stat().st_size != entry["archive_bytes"]:
                return None
            images[name] = Image(
                name=name,
                reference=entry["reference"],
                archive=archive,
                manifest_digest=entry["manifest_digest"],
                config_digest=entry["config_digest"],
                archive_bytes=entry["archive_bytes"],
                compressed_bytes=entry["compressed_bytes"],
                uncompressed_bytes=entry["uncompressed_bytes"],
            )
        return Images(
            agent=images["agent"],
            operator=images["operator"],
            registrar=images["registrar"],
            worker=images["worker"],
            go_worker=images["go-worker"],
            pause=images["pause"],
            directory=directory,
            key=record["key"],
            base=record["base"],
            source=source,
            build_seconds=float(record["build_seconds"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


class _Log:
    """The build log, and the commands run into it."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path

    def run(self, command: Sequence[str], *, what: str, fix: str, cwd: pathlib.Path | None = None) -> None:
        """Runs `command`, its output into the log; a failure names `what` and the fix."""
        with open(self.path, "a") as log:
            log.write(f"$ {' '.join(command)}\n")
            log.flush()
            result = subprocess.run(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, check=False)
        if result.returncode != 0:
            raise self.failure(f"{what} failed (exit {result.returncode})", fix=fix)

    def output(self, command: Sequence[str], *, what: str, fix: str) -> str:
        """Runs `command`, returns its stdout (stderr into the log)."""
        with open(self.path, "a") as log:
            log.write(f"$ {' '.join(command)}\n")
            log.flush()
            result = subprocess.run(command, stdout=subprocess.PIPE, stderr=log, text=True, check=False)
            log.write(result.stdout)
        if result.returncode != 0:
            raise self.failure(f"{what} failed (exit {result.returncode})", fix=fix)
        return result.stdout.strip()

    def say(self, message: str) -> None:
        with open(self.path, "a") as log:
            log.write(f"# {message}\n")

    def failure(self, message: str, *, fix: str) -> DevClusterError:
        lines = self.path.read_text(errors="replace").splitlines(keepends=True)[-20:]
        return DevClusterError(
            f"{message}; last lines of {self.path}:\n{''.join(lines)}", fix=f"{fix} (log: {self.path})"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class _Buildah:
    """buildah with this cache's storage."""

    executable: str
    root: pathlib.Path
    driver: str

    def command(self, *arguments: str) -> list[str]:
        return [
            self.executable,
            "--root",
            str(self.root / "root"),
            "--runroot",
            str(self.root / "runroot"),
            "--storage-driver",
            self.driver,
            *arguments,
        ]

    def has_image(self, reference: str) -> bool:
        result = subprocess.run(
            self.command("inspect", "--type", "image", "--format", "{{.FromImageID}}", reference),
            capture_output=True,
            check=False,
        )
        return result.returncode == 0


def buildah_storage() -> pathlib.Path:
    """`<cache>/buildah`: buildah's --root (root/) and --runroot (runroot/), and the driver chosen."""
    return gobuild.cache_root() / "buildah"


def _buildah() -> _Buildah:
    executable = shutil.which("buildah")
    if executable is None:
        raise DevClusterError(
            "`buildah` is not on PATH; it builds the images (no container daemon needed)", fix=INSTALL_FIX
        )
    storage = buildah_storage()
    storage.mkdir(parents=True, exist_ok=True)
    chosen = storage / "driver"
    if chosen.is_file():
        return _Buildah(executable, storage, chosen.read_text().strip())
    # overlay where the kernel and the file system under the cache allow it (shares layers, no copy
    # per step), else vfs. Chosen once: the storage is the driver's.
    probe = _Buildah(executable, storage, "overlay")
    works = subprocess.run(probe.command("images", "--quiet"), capture_output=True, check=False).returncode == 0
    driver = "overlay" if works else "vfs"
    if not works:
        shutil.rmtree(storage / "root", ignore_errors=True)
        shutil.rmtree(storage / "runroot", ignore_errors=True)
    chosen.write_text(driver + "\n")
    return _Buildah(executable, storage, driver)


def _build(
    repo: pathlib.Path, files: Sequence[str], *, key: str, target: pathlib.Path, say: Callable[[str], None]
) -> pathlib.Path:
    """Builds into `target`, or into the key of what was staged when an input moved meanwhile (a
    checkout being edited): the archives always match their key. Returns where they landed."""
    buildah = _buildah()
    staging = pathlib.Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    started = time.monotonic()
    try:
        context = staging / "context"
        _stage(repo, files, context)
        staged = imagerecipe.cache_key(context, files)
        if staged != key:
            say(f"an input changed since the images' key was computed; building what was staged ({staged})")
            key, target = staged, target.parent / staged
            if load(target, source="cache") is not None:
                shutil.rmtree(staging)
                return target
        log = _Log(target.parent / f"build-{key}.log")
        log.path.write_text(f"# coroner images {key}, {datetime.datetime.now(datetime.UTC).isoformat()}\n")
        names = ", ".join(recipe.name for recipe in imagerecipe.RECIPES)
        say(f"building the images ({names}) with buildah; log: {log.path}")
        base = _ensure_base(buildah, staging=staging, log=log, say=say)
        settings = imagerecipe.pip_config(os.environ, imagerecipe.pip_config_files(os.environ))
        pip_conf = staging / "pip.conf"
        pip_conf.touch(mode=0o600)
        pip_conf.write_text(imagerecipe.render_pip_config(settings))
        log.say(f"pip settings for the build: {sorted(settings)}")
        mounts = [argument for mount in imagerecipe.build_mounts(settings, pip_conf) for argument in ("-v", mount)]
        record: dict[str, Any] = {"key": key, "base": base, "images": {}}
        for recipe in imagerecipe.RECIPES:
            step = time.monotonic()
            if recipe.go_binary is not None:
                _build_go(recipe.go_binary, context=context, log=log)
            log.run(
                buildah.command(
                    "bud",
                    "--isolation",
                    "chroot",
                    "--layers",
                    "--pull=never",
                    "--format",
                    "oci",
                    "-f",
                    str(context / recipe.dockerfile),
                    "--build-arg",
                    f"BASE={base}",
                    *mounts,
                    "-t",
                    recipe.reference,
                    str(context),
                ),
                what=f"building {recipe.reference} from {recipe.dockerfile}",
                fix="check that PyPI is reachable with this machine's pip settings (/etc/pip.conf, PIP_*) "
                "and that the Dockerfile builds",
            )
            record["images"][recipe.name] = _export(buildah, recipe, staging=staging, log=log)
            say(f"built {recipe.reference} in {time.monotonic() - step:.0f} s")
        shutil.rmtree(context)
        pip_conf.unlink()
        _prune_storage(buildah, log=log, base=base)
        record["build_seconds"] = round(time.monotonic() - started, 1)
        record["built_at"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        (staging / "images.json").write_text(json.dumps(record, indent=2) + "\n")
        staging.chmod(0o755)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)  # atomic: a half-built directory is never mistaken for a cache hit
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    say(f"built the images in {time.monotonic() - started:.0f} s into {target}")
    return target


def _build_go(binary: imagerecipe.GoBinary, *, context: pathlib.Path, log: _Log) -> None:
    """Builds a recipe's Go binary in the staged context (so from exactly the keyed sources)."""
    go = shutil.which("go")
    if go is None:
        raise DevClusterError(
            f"the Go toolchain (`go`) is not on PATH; it builds {binary.output} for the images",
            fix="install Go >= 1.26 and put it on PATH",
        )
    env = {**os.environ, **dict(imagerecipe.GO_BUILD_ENV)}
    command = [go, *imagerecipe.GO_BUILD_ARGS, "-o", str(context / binary.output), "."]
    with open(log.path, "a") as output:
        output.write(f"$ (cd {context / binary.module} && {' '.join(command)})\n")
        output.flush()
        result = subprocess.run(
            command, cwd=context / binary.module, env=env, stdout=output, stderr=subprocess.STDOUT, check=False
        )
    if result.returncode != 0:
        raise log.failure(
            f"building {binary.output} with go failed (exit {result.returncode})",
            fix=f"read the log; the module {binary.module} must build with `go build` alone, with no dependency",
        )


def _prune_storage(buildah: _Buildah, *, log: _Log, base: str) -> None:
    """Removes from buildah's storage what this build did not use: the untagged images of earlier
    builds (each build leaves its steps' images, the --layers cache; the next build needs only the
    ones this build made or reused, which its log names) and bases of other recipes. And every
    working container: `bud` leaves one behind for a stage with no step of its own (the pause
    image's), and this storage is this module's alone, used under its lock."""
    with open(log.path, "a") as output:
        subprocess.run(buildah.command("rm", "--all"), stdout=output, stderr=subprocess.STDOUT, check=False)
    used = set()
    for line in log.path.read_text(errors="replace").splitlines():
        if line.startswith("--> "):
            used.add(line.split()[-1][:11])
    listing = subprocess.run(buildah.command("images", "--all", "--json"), capture_output=True, text=True, check=False)
    try:
        stored = json.loads(listing.stdout or "[]")
    except ValueError:
        return
    stale = []
    for image in stored:
        names = image.get("names") or []
        old_base = any(name.startswith(f"{imagerecipe.BASE_REPOSITORY}:") and name != base for name in names)
        if (not names and image["id"][:11] not in used) or old_base:
            stale.append(image["id"])
    if stale:
        log.say(f"removing {len(stale)} images of earlier builds from buildah's storage")
        with open(log.path, "a") as output:
            subprocess.run(buildah.command("rmi", *stale), stdout=output, stderr=subprocess.STDOUT, check=False)


def _ensure_base(buildah: _Buildah, *, staging: pathlib.Path, log: _Log, say: Callable[[str], None]) -> str:
    """The stand-in base in buildah's storage, made by mmdebstrap when it is not there yet."""
    reference = imagerecipe.base_reference()
    if buildah.has_image(reference):
        return reference
    mmdebstrap = shutil.which("mmdebstrap")
    if mmdebstrap is None:
        raise DevClusterError(
            "`mmdebstrap` is not on PATH; it makes the images' stand-in base from Debian packages", fix=INSTALL_FIX
        )
    sources = imagerecipe.apt_sources(imagerecipe.machine_apt_sources()) or [
        f"deb http://deb.debian.org/debian {imagerecipe.BASE_SUITE} main"
    ]
    say(f"making the stand-in base {reference} with mmdebstrap from {', '.join(sources)} (about a minute)")
    made = staging / "base-mmdebstrap.tar"
    rootfs = staging / "base-rootfs.tar"
    hooks = [f"--hook-dir={imagerecipe.MERGED_USR_HOOKS}"] if imagerecipe.MERGED_USR_HOOKS.is_dir() else []
    log.run(
        [
            mmdebstrap,
            f"--variant={imagerecipe.BASE_VARIANT}",
            "--format=tar",
            *hooks,
            f"--include={','.join(imagerecipe.BASE_PACKAGES)}",
            *(f"--dpkgopt={option}" for option in imagerecipe.BASE_DPKG_OPTIONS),
            *(f"--customize-hook={hook}" for hook in imagerecipe.BASE_CUSTOMIZE_HOOKS),
            imagerecipe.BASE_SUITE,
            str(made),
            *sources,
        ],
        what="making the stand-in base with mmdebstrap",
        fix="check that this machine's apt mirror (/etc/apt/sources.list*) is reachable and that you are root",
    )
    without_devices(made, rootfs)
    made.unlink()
    fix = f"read the log; `buildah --root {buildah.root / 'root'} containers` lists what is left"
    container = buildah.command("from", "--pull=never", "scratch")
    name = log.output(container, what="buildah from scratch", fix=fix)
    try:
        log.run(buildah.command("add", name, str(rootfs), "/"), what="adding the base's root file system", fix=fix)
        config = [argument for key, value in imagerecipe.BASE_ENV for argument in ("--env", f"{key}={value}")]
        config += ["--cmd", json.dumps(list(imagerecipe.BASE_CMD))]
        config += [
            "--label",
            f"io.coroner.dev.base={reference}",
            "--label",
            f"io.coroner.dev.stands-in-for={imagerecipe.STANDS_IN_FOR}",
        ]
        log.run(buildah.command("config", *config, name), what="configuring the base", fix=fix)
        log.run(buildah.command("commit", "--rm", name, reference), what="committing the base", fix=fix)
    except DevClusterError:
        subprocess.run(buildah.command("rm", name), capture_output=True, check=False)
        raise
    rootfs.unlink()
    return reference


def without_devices(source: pathlib.Path, destination: pathlib.Path) -> None:
    """mmdebstrap's tarball without what it put in /dev (device nodes: a runtime mounts its own /dev;
    the directory stays)."""
    with tarfile.open(source) as tar_in, tarfile.open(destination, "w", format=tarfile.PAX_FORMAT) as tar_out:
        for member in tar_in:
            relative = member.name.removeprefix("./")
            if relative.startswith("dev/") and relative.rstrip("/") != "dev":
                continue
            tar_out.addfile(member, tar_in.extractfile(member) if member.isfile() else None)


def _stage(repo: pathlib.Path, files: Sequence[str], context: pathlib.Path) -> None:
    """The build context: exactly the keyed inputs (no .git, no venv, no bytecode)."""
    for name in files:
        destination = context / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(repo / name, destination)
        executable = name in imagerecipe.EXECUTABLES or os.access(repo / name, os.X_OK)
        destination.chmod(0o755 if executable else 0o644)


def _export(buildah: _Buildah, recipe: imagerecipe.Recipe, *, staging: pathlib.Path, log: _Log) -> dict[str, Any]:
    """Pushes the image to an OCI layout, names it for containerd, packs it; returns its record."""
    layout = staging / f"{recipe.name}.oci"
    log.run(
        buildah.command("push", "--quiet", recipe.reference, f"oci:{layout}:{recipe.reference}"),
        what=f"exporting {recipe.reference}",
        fix="check free disk space",
    )
    index = json.loads((layout / "index.json").read_text())
    manifests = index["manifests"]
    if len(manifests) != 1:
        raise log.failure(f"{layout}/index.json has {len(manifests)} manifests, not 1", fix="remove it and rerun")
    descriptor = manifests[0]
    descriptor["annotations"] = ocilayout.containerd_annotations(recipe.reference)
    (layout / "index.json").write_text(json.dumps(index, separators=(",", ":")))
    manifest = json.loads(ocilayout.blob(layout, descriptor["digest"]).read_bytes())
    uncompressed = sum(
        ocilayout.uncompressed_size(ocilayout.blob(layout, layer["digest"]), layer["mediaType"])
        for layer in manifest["layers"]
    )
    compressed = descriptor["size"] + manifest["config"]["size"] + sum(layer["size"] for layer in manifest["layers"])
    archive = staging / f"{recipe.name}.oci.tar"
    ocilayout.pack(layout, archive)
    shutil.rmtree(layout)
    return {
        "reference": recipe.reference,
        "archive": archive.name,
        "archive_bytes": archive.stat().st_size,
        "compressed_bytes": compressed,
        "uncompressed_bytes": uncompressed,
        "manifest_digest": descriptor["digest"],
        "config_digest": manifest["config"]["digest"],
    }


def _prune(images_dir: pathlib.Path, *, keep: pathlib.Path) -> None:
    """Keeps the newest KEEP_BUILDS builds (and `keep`), with their logs; removes the rest and any
    staging left by a killed build."""
    builds = sorted(
        (path for path in images_dir.iterdir() if path.is_dir() and (path / "images.json").is_file()),
        key=lambda path: (path / "images.json").stat().st_mtime,
        reverse=True,
    )
    for old in builds[KEEP_BUILDS:]:
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)
            (images_dir / f"build-{old.name}.log").unlink(missing_ok=True)
    for left in images_dir.glob(".building-*"):
        shutil.rmtree(left, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """`python -m coroner_dev.devcluster.images`: builds if needed, prints a JSON summary."""
    if argv if argv is not None else sys.argv[1:]:
        print("usage: python -m coroner_dev.devcluster.images (no arguments)", file=sys.stderr)
        return 2
    try:
        images = ensure_images()
    except DevClusterError as exc:
        print(f"{exc}", file=sys.stderr)
        return 1
    print(json.dumps(images.summary(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
