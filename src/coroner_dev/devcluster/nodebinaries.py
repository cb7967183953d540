"""Finding or building the dev node's binaries: kubelet and kube-scheduler, containerd with its runc
shim, ctr and crictl, and runc.

Three builds through `gobuild`, each cached by its own pins under `<cache>/node-*/`:
- kubelet and kube-scheduler from the control plane's own module (`testenv/`), the same
  Kubernetes version as the API server (they share its compiled packages, so they cost little more
  than their link once the control plane is built);
- containerd, containerd-shim-runc-v2, ctr and crictl from `testenv/node/`;
- runc from `testenv/runc/`, the one cgo build: it links Debian's libseccomp (`libseccomp-dev`),
  without which it cannot load a container's seccomp profile. Debian's own runc (1.1.x) cannot run
  containers for containerd 2.x ("can't get final child's PID from pipe").
"""

from __future__ import annotations

import dataclasses
import pathlib
import shutil
import sys
from collections.abc import Callable

from coroner_dev.devcluster import binaries, gobuild
from coroner_dev.devcluster.errors import DevClusterError

CONTAINERD_VERSION = "v2.4.2"
RUNC_VERSION = "v1.5.3"
CRI_TOOLS_VERSION = "v1.37.0"

KUBERNETES_PACKAGES: dict[str, str] = {
    "kubelet": "k8s.io/kubernetes/cmd/kubelet",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
}
RUNTIME_PACKAGES: dict[str, str] = {
    "containerd": "github.com/containerd/containerd/v2/cmd/containerd",
    "containerd-shim-runc-v2": "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
    "ctr": "github.com/containerd/containerd/v2/cmd/ctr",
    "crictl": "sigs.k8s.io/cri-tools/cmd/crictl",
}
RUNC_PACKAGES: dict[str, str] = {"runc": "github.com/opencontainers/runc"}

#: Where Debian keeps the header runc's seccomp support compiles against.
SECCOMP_HEADER = pathlib.Path("/usr/include/seccomp.h")
NODE_PACKAGES_FIX = "apt-get install -y libseccomp-dev buildah mmdebstrap catatonit"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NodeBinaries:
    """Absolute paths of everything a dev node runs."""

    kubernetes: pathlib.Path
    runtime: pathlib.Path
    runc_dir: pathlib.Path

    def path(self, name: str) -> pathlib.Path:
        for directory, names in (
            (self.kubernetes, KUBERNETES_PACKAGES),
            (self.runtime, RUNTIME_PACKAGES),
            (self.runc_dir, RUNC_PACKAGES),
        ):
            if name in names:
                return directory / name
        raise KeyError(name)

    @property
    def search_path(self) -> str:
        """A PATH on which containerd finds its shim and the shim finds runc."""
        return ":".join(str(d) for d in (self.runtime, self.runc_dir))


def ensure_node_binaries(*, progress: Callable[[str], None] | None = None) -> NodeBinaries:
    """Returns usable node binaries, building each set (once, under a lock) when none is cached."""
    say = progress or (lambda message: print(message, file=sys.stderr))
    kubernetes, _ = gobuild.ensure(kubernetes_build(), say=say)
    runtime, _ = gobuild.ensure(runtime_build(), say=say)
    if not gobuild.complete(gobuild.cache_root() / "node-runc" / runc_build().cache_key(), ("runc",)):
        require_seccomp_header()
    runc_dir, _ = gobuild.ensure(runc_build(), say=say)
    return NodeBinaries(kubernetes=kubernetes, runtime=runtime, runc_dir=runc_dir)


def require_seccomp_header() -> None:
    """runc without libseccomp would start containers with no seccomp filter at all: refuse to build it."""
    if not SECCOMP_HEADER.exists() or shutil.which("gcc") is None:
        raise DevClusterError(
            f"building runc needs a C compiler and libseccomp's header ({SECCOMP_HEADER})",
            fix=NODE_PACKAGES_FIX,
        )


def kubernetes_build() -> gobuild.GoBuild:
    """kubelet and kube-scheduler, from the control plane's module and with its version stamps."""
    return gobuild.GoBuild(
        title="kubelet and kube-scheduler",
        module=gobuild.testenv_dir(),
        packages=KUBERNETES_PACKAGES,
        cache_dir="node-k8s",
        versions=binaries.K8S_VERSION,
        ldflags=binaries.ldflags(),
        announce=f"building kubelet and kube-scheduler {binaries.K8S_VERSION} from Go modules; "
        "2-5 minutes once the control plane is built",
        go_missing_fix="install Go >= 1.26 and put it on PATH",
        override="CORONER_NODE_K8S_DIR",
    )


def runtime_build() -> gobuild.GoBuild:
    """containerd, its runc shim, ctr and crictl."""
    return gobuild.GoBuild(
        title="containerd and crictl",
        module=gobuild.testenv_dir() / "node",
        packages=RUNTIME_PACKAGES,
        cache_dir="node-runtime",
        versions=f"containerd-{CONTAINERD_VERSION}-crictl-{CRI_TOOLS_VERSION}",
        ldflags=" ".join(
            [
                "-s",
                "-w",
                f"-X github.com/containerd/containerd/v2/version.Version={CONTAINERD_VERSION}",
                f"-X sigs.k8s.io/cri-tools/pkg/version.Version={CRI_TOOLS_VERSION}",
            ]
        ),
        announce=f"building containerd {CONTAINERD_VERSION} and crictl {CRI_TOOLS_VERSION} from Go modules; "
        "the first build takes 3-6 minutes on 2 cores",
        go_missing_fix="install Go >= 1.26 and put it on PATH",
        override="CORONER_NODE_RUNTIME_DIR",
        # The node runs containerd's overlayfs snapshotter only.
        tags="no_btrfs",
    )


def runc_build() -> gobuild.GoBuild:
    """runc with seccomp (cgo, libseccomp)."""
    return gobuild.GoBuild(
        title="runc",
        module=gobuild.testenv_dir() / "runc",
        packages=RUNC_PACKAGES,
        cache_dir="node-runc",
        versions=f"runc-{RUNC_VERSION}",
        ldflags=f"-s -w -X main.version={RUNC_VERSION.lstrip('v')}",
        announce=f"building runc {RUNC_VERSION} (cgo, libseccomp) from Go modules; about a minute",
        go_missing_fix="install Go >= 1.26 and put it on PATH",
        override="CORONER_NODE_RUNC_DIR",
        tags="seccomp",
        cgo=True,
    )
