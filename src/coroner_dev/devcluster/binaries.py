"""Finding or building the real control plane binaries: kube-apiserver, etcd, kubectl.

Nothing can be downloaded from release pages here, but the Go module proxy works, so the binaries
are built from Go modules by the helper module in `testenv/` and cached outside the repository,
keyed by the pinned versions and the module's own go.mod/go.sum: a pin that moves rebuilds, nothing
else does. `KUBEBUILDER_ASSETS` (the envtest convention) pointing at existing binaries skips the
build entirely.
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
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

from coroner_dev.devcluster.errors import DevClusterError

K8S_VERSION = "v1.37.2"
ETCD_VERSION = "v3.7.0"

#: Binary name -> Go package built for it.
PACKAGES: dict[str, str] = {
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kubectl": "k8s.io/kubernetes/cmd/kubectl",
    "etcd": "go.etcd.io/etcd/server/v3",
}
#: What a KUBEBUILDER_ASSETS directory must hold; the controller manager is optional there.
REQUIRED = ("kube-apiserver", "etcd", "kubectl")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Binaries:
    """Absolute paths of the control plane binaries in use."""

    directory: pathlib.Path
    source: str
    """`KUBEBUILDER_ASSETS`, `cache` or `built` — said in logs so a user knows what ran."""

    def path(self, name: str) -> pathlib.Path:
        """The path of one binary."""
        return self.directory / name

    @property
    def has_controller_manager(self) -> bool:
        """KUBEBUILDER_ASSETS directories usually lack kube-controller-manager."""
        return self.path("kube-controller-manager").exists()


def testenv_dir() -> pathlib.Path:
    """The `testenv/` Go module: COROner_TESTENV, else beside the source tree this file is in."""
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


def cache_key(module: pathlib.Path) -> str:
    """Versions plus a digest of go.mod/go.sum: a moved pin is a new key, a rerun is not."""
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum"):
        file = module / name
        if file.exists():
            digest.update(file.read_bytes())
    return f"{K8S_VERSION}-etcd-{ETCD_VERSION}-{digest.hexdigest()[:12]}"


def _complete(directory: pathlib.Path, names: tuple[str, ...]) -> bool:
    return all(os.access(directory / name, os.X_OK) for name in names)


def ensure_binaries(*, progress: Callable[[str], None] | None = None) -> Binaries:
    """Returns usable binaries, building them (once, under a lock) when none are cached."""
    say = progress or (lambda message: print(message, file=sys.stderr))
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        directory = pathlib.Path(assets)
        if _complete(directory, REQUIRED):
            return Binaries(directory=directory, source="KUBEBUILDER_ASSETS")
        say(f"KUBEBUILDER_ASSETS={assets} lacks one of {', '.join(REQUIRED)}; building instead")

    module = testenv_dir()
    target = cache_root() / "k8s" / cache_key(module)
    if _complete(target, tuple(PACKAGES)):
        return Binaries(directory=target, source="cache")
    target.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(target.parent / ".build.lock"):
        # Another process may have finished the build while this one waited for the lock.
        if _complete(target, tuple(PACKAGES)):
            return Binaries(directory=target, source="cache")
        _build(module=module, target=target, say=say)
    return Binaries(directory=target, source="built")


@contextlib.contextmanager
def _build_lock(path: pathlib.Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ldflags() -> str:
    """Version stamps, so `kubectl version` shows the real server version, not v0.0.0-master."""
    major, minor = K8S_VERSION.lstrip("v").split(".")[:2]
    stamps = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        stamps += [
            f"-X {pkg}.gitVersion={K8S_VERSION}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
        ]
    return " ".join(["-s", "-w", *stamps])


def _build(*, module: pathlib.Path, target: pathlib.Path, say: Callable[[str], None]) -> None:
    go = shutil.which("go")
    if go is None:
        raise DevClusterError(
            "the Go toolchain (`go`) is not on PATH; it is needed to build kube-apiserver, etcd and kubectl",
            fix="install Go >= 1.26 (for example from your distribution) and put it on PATH, "
            "or set KUBEBUILDER_ASSETS to a directory that already holds the binaries",
        )
    staging = pathlib.Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    log_path = target.parent / f"build-{target.name}.log"
    say(
        f"building Kubernetes {K8S_VERSION} (kube-apiserver, kube-controller-manager, kubectl) and etcd "
        f"{ETCD_VERSION} from Go modules; the first build takes 15-30 minutes on 2 cores (log: {log_path})"
    )
    started = time.monotonic()
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
    command = [go, "build", "-trimpath", "-ldflags", ldflags(), "-o", f"{staging}/", *PACKAGES.values()]
    with open(log_path, "w") as log:
        log.write(" ".join(command) + "\n")
        log.flush()
        result = subprocess.run(command, cwd=module, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        tail = "".join(log_path.read_text(errors="replace").splitlines(keepends=True)[-15:])
        raise DevClusterError(
            f"building the control plane failed (go build exit {result.returncode}); last lines:\n{tail}",
            fix=f"read {log_path}; check that the Go module proxy is reachable (GOPROXY) and disk space is free",
        )
    # go build names the etcd binary after its module path without the major version ("server").
    built_etcd = staging / "server"
    if built_etcd.exists():
        built_etcd.rename(staging / "etcd")
    missing = [name for name in PACKAGES if not (staging / name).exists()]
    if missing:
        shutil.rmtree(staging, ignore_errors=True)
        raise DevClusterError(f"go build produced no {', '.join(missing)}", fix=f"read {log_path}")
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)  # atomic: a half-built directory is never mistaken for a cache hit
    say(f"built the control plane in {time.monotonic() - started:.0f} s into {target}")
