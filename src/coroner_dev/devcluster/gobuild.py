"""Building binaries from a pinned helper Go module, once, into a cache keyed by the pins.

Nothing can be downloaded from release pages here, but the Go module proxy works, so the binaries
the tests need (the control plane: `binaries.py`; helm and promtool: `tools.py`) are built by
helper modules under `testenv/` and cached outside the repository, in
`<cache>/<cache_dir>/<versions>-<go.mod/go.sum digest>/`: a pin that moves rebuilds, nothing else
does. One build at a time per cache directory (a file lock); a build lands by one rename, so a
half-built directory is never mistaken for a cache hit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping

from coroner_dev.devcluster.errors import DevClusterError


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Built:
    """Absolute paths of the binaries in use."""

    directory: pathlib.Path
    source: str
    """The override variable (`KUBEBUILDER_ASSETS`, `CORONER_TOOLS_DIR`), `cache` or `built` — said in
    logs so a user knows what ran."""

    def path(self, name: str) -> pathlib.Path:
        """The path of one binary."""
        return self.directory / name


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GoBuild:
    """One set of binaries, built by one `go build` in one helper Go module."""

    title: str
    """What is built, for messages ("the control plane", "helm and promtool")."""
    module: pathlib.Path
    """The helper Go module whose go.mod pins the versions."""
    packages: Mapping[str, str]
    """Binary name -> Go package built for it."""
    cache_dir: str
    """The subdirectory of `cache_root()` holding one directory per cache key."""
    versions: str
    """The pinned versions: the cache key's readable part."""
    ldflags: str
    announce: str
    """Said before a build starts: what, and how long the first build takes."""
    go_missing_fix: str
    """What to do when `go` is not on PATH."""
    override: str
    """The environment variable naming a directory that already holds the binaries (no build)."""
    override_requires: tuple[str, ...] = ()
    """What that directory must hold; () means every binary of `packages`."""
    tags: str = ""
    cgo: bool = False
    """Build with cgo (runc links libseccomp); everything else is static, as Kubernetes releases it."""
    renames: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Name go build gives a binary -> its name here (etcd's main package builds as "server")."""
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Added to the build's environment (a module that needs a newer toolchain: GOTOOLCHAIN)."""
    sources: tuple[str, ...] = ()
    """Globs, relative to `module`, of the module's own sources: they enter the cache key, so an
    edit rebuilds (the pinned modules' helper modules have none)."""

    def cache_key(self) -> str:
        """Versions plus a digest of go.mod/go.sum (and `sources`, each by path and bytes): a moved
        pin or an edited source is a new key, a rerun is not."""
        digest = hashlib.sha256()
        for name in ("go.mod", "go.sum"):
            file = self.module / name
            if file.exists():
                digest.update(file.read_bytes())
        for file in sorted({path for pattern in self.sources for path in self.module.glob(pattern)}):
            digest.update(str(file.relative_to(self.module)).encode() + b"\0" + file.read_bytes())
        return f"{self.versions}-{digest.hexdigest()[:12]}"


def testenv_dir() -> pathlib.Path:
    """The `testenv/` Go module: CORONER_TESTENV, else beside the source tree this file is in."""
    override = os.environ.get("CORONER_TESTENV")
    if override:
        return pathlib.Path(override)
    for parent in pathlib.Path(__file__).resolve().parents:
        candidate = parent / "testenv" / "go.mod"
        if candidate.exists():
            return candidate.parent
    raise DevClusterError(
        "cannot find the testenv/ Go module that builds the control plane",
        fix="run from a checkout of coroner, set CORONER_TESTENV=/path/to/testenv, "
        "or set KUBEBUILDER_ASSETS to a directory with kube-apiserver, etcd and kubectl",
    )


def cache_root() -> pathlib.Path:
    """`$CORONER_CACHE_DIR`, else `$XDG_CACHE_HOME/coroner`, else `~/.cache/coroner`."""
    explicit = os.environ.get("CORONER_CACHE_DIR")
    if explicit:
        return pathlib.Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = pathlib.Path(xdg) if xdg else pathlib.Path.home() / ".cache"
    return base / "coroner"


def complete(directory: pathlib.Path, names: tuple[str, ...]) -> bool:
    """Every one of `names` is an executable in `directory`."""
    return all(os.access(directory / name, os.X_OK) for name in names)


def ensure(build: GoBuild, *, say: Callable[[str], None]) -> tuple[pathlib.Path, str]:
    """The directory holding `build`'s binaries and where they came from (its override variable,
    `cache` or `built`), building them (once, under a lock) when none are cached."""
    given = os.environ.get(build.override)
    if given:
        required = build.override_requires or tuple(build.packages)
        if complete(pathlib.Path(given), required):
            return pathlib.Path(given), build.override
        say(f"{build.override}={given} lacks one of {', '.join(required)}; building instead")
    target = cache_root() / build.cache_dir / build.cache_key()
    names = tuple(build.packages)
    if complete(target, names):
        return target, "cache"
    target.parent.mkdir(parents=True, exist_ok=True)
    with build_lock(target.parent / ".build.lock"):
        # Another process may have finished the build while this one waited for the lock.
        if complete(target, names):
            return target, "cache"
        _build(build, target=target, say=say)
    return target, "built"


@contextlib.contextmanager
def build_lock(path: pathlib.Path) -> Iterator[None]:
    """One build at a time per cache directory: an exclusive flock on PATH for the block."""
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(build: GoBuild, *, target: pathlib.Path, say: Callable[[str], None]) -> None:
    go = shutil.which("go")
    if go is None:
        raise DevClusterError(
            f"the Go toolchain (`go`) is not on PATH; it is needed to build {build.title}", fix=build.go_missing_fix
        )
    staging = pathlib.Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    log_path = target.parent / f"build-{target.name}.log"
    say(f"{build.announce} (log: {log_path})")
    started = time.monotonic()
    env = {**os.environ, "CGO_ENABLED": "1" if build.cgo else "0", "GOFLAGS": "-mod=mod", **build.env}
    tags = ["-tags", build.tags] if build.tags else []
    command = [
        go,
        "build",
        "-trimpath",
        *tags,
        "-ldflags",
        build.ldflags,
        "-o",
        f"{staging}/",
        *build.packages.values(),
    ]
    with open(log_path, "w") as log:
        log.write(" ".join(command) + "\n")
        log.flush()
        result = subprocess.run(command, cwd=build.module, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        tail = "".join(log_path.read_text(errors="replace").splitlines(keepends=True)[-15:])
        raise DevClusterError(
            f"building {build.title} failed (go build exit {result.returncode}); last lines:\n{tail}",
            fix=f"read {log_path}; check that the Go module proxy is reachable (GOPROXY) and disk space is free",
        )
    for built, name in build.renames.items():
        if (staging / built).exists():
            (staging / built).rename(staging / name)
    missing = [name for name in build.packages if not (staging / name).exists()]
    if missing:
        shutil.rmtree(staging, ignore_errors=True)
        raise DevClusterError(f"go build produced no {', '.join(missing)}", fix=f"read {log_path}")
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)  # atomic: a half-built directory is never mistaken for a cache hit
    say(f"built {build.title} in {time.monotonic() - started:.0f} s into {target}")
