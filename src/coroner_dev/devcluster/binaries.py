"""Finding or building the real control plane binaries: kube-apiserver, etcd, kubectl.

Built from Go modules by the helper module in `testenv/` (`gobuild`), cached outside the repository
in `<cache>/k8s/<versions>-<go.mod/go.sum digest>/`: a pin that moves rebuilds, nothing else does.
`KUBEBUILDER_ASSETS` (the envtest convention) pointing at existing binaries skips the build entirely.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable

from coroner_dev.devcluster import gobuild

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
class Binaries(gobuild.Built):
    """Absolute paths of the control plane binaries in use."""

    @property
    def has_controller_manager(self) -> bool:
        """KUBEBUILDER_ASSETS directories usually lack kube-controller-manager."""
        return self.path("kube-controller-manager").exists()


def ensure_binaries(*, progress: Callable[[str], None] | None = None) -> Binaries:
    """Returns usable binaries, building them (once, under a lock) when none are cached."""
    say = progress or (lambda message: print(message, file=sys.stderr))
    directory, source = gobuild.ensure(control_plane_build(), say=say)
    return Binaries(directory=directory, source=source)


def control_plane_build() -> gobuild.GoBuild:
    """The control plane, built by the `testenv/` module into `<cache>/k8s/`."""
    return gobuild.GoBuild(
        title="the control plane",
        module=gobuild.testenv_dir(),
        packages=PACKAGES,
        cache_dir="k8s",
        versions=f"{K8S_VERSION}-etcd-{ETCD_VERSION}",
        ldflags=ldflags(),
        announce=f"building Kubernetes {K8S_VERSION} (kube-apiserver, kube-controller-manager, kubectl) and etcd "
        f"{ETCD_VERSION} from Go modules; the first build takes 15-30 minutes on 2 cores",
        go_missing_fix="install Go >= 1.26 (for example from your distribution) and put it on PATH, "
        "or set KUBEBUILDER_ASSETS to a directory that already holds the binaries",
        override="KUBEBUILDER_ASSETS",
        override_requires=REQUIRED,
        # go build names the etcd binary after its module path without the major version ("server").
        renames={"server": "etcd"},
    )


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
