"""Finding or building the packaging and monitoring tools the tests use: helm and promtool.

Built from Go modules by the helper module `testenv/tools/` (`gobuild`; a module of its own, so its
pins never move the control plane's cache key in `binaries.py`), cached beside the control plane
under `<cache>/tools/<versions>-<go.mod/go.sum digest>/`: a pin that moves rebuilds, nothing else does.
`CORONER_TOOLS_DIR` pointing at a directory that already holds `helm` and `promtool` skips the
build. The Prometheus Operator's CRDs (PodMonitor, PrometheusRule), which the monitoring component's
objects are validated against, come from that project's Go module through the same module proxy.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys
from collections.abc import Callable

from coroner_dev.devcluster import gobuild
from coroner_dev.devcluster.errors import DevClusterError

HELM_VERSION = "v4.3.2"
PROMETHEUS_VERSION = "v0.316.0"
#: The release PROMETHEUS_VERSION is (the Go module's v0.3XX.Y is Prometheus 3.XX.Y).
PROMETHEUS_RELEASE = "3.16.0"
PROMETHEUS_OPERATOR_VERSION = "v0.85.0"

BUILD_TAGS = "remove_all_sd"
#: Binary name -> Go package built for it.
PACKAGES: dict[str, str] = {
    "helm": "helm.sh/helm/v4/cmd/helm",
    "promtool": "github.com/prometheus/prometheus/cmd/promtool",
}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Tools(gobuild.Built):
    """Absolute paths of helm and promtool in use."""


def module_dir() -> pathlib.Path:
    """The `testenv/tools` Go module."""
    return gobuild.testenv_dir() / "tools"


def ensure_tools(*, progress: Callable[[str], None] | None = None) -> Tools:
    """Returns usable helm and promtool, building them (once, under a lock) when none are cached."""
    say = progress or (lambda message: print(message, file=sys.stderr))
    directory, source = gobuild.ensure(tools_build(), say=say)
    return Tools(directory=directory, source=source)


def tools_build() -> gobuild.GoBuild:
    """helm and promtool, built by the `testenv/tools` module into `<cache>/tools/`."""
    return gobuild.GoBuild(
        title="helm and promtool",
        module=module_dir(),
        packages=PACKAGES,
        cache_dir="tools",
        versions=f"helm-{HELM_VERSION}-prometheus-{PROMETHEUS_VERSION}",
        ldflags=ldflags(),
        announce=f"building helm {HELM_VERSION} and promtool (Prometheus {PROMETHEUS_VERSION}) from Go modules; "
        f"the first build takes 10-20 minutes on 2 cores",
        go_missing_fix="install Go >= 1.26 and put it on PATH, or set CORONER_TOOLS_DIR to a directory holding both",
        override="CORONER_TOOLS_DIR",
        # remove_all_sd: promtool needs no cloud service discovery (only file, static and HTTP stay),
        # which leaves out most of Prometheus' dependencies (the cloud SDKs) and most of the build.
        tags=BUILD_TAGS,
    )


def ldflags() -> str:
    """Version stamps, so `helm version` and `promtool --version` say what they are."""
    stamps = [
        f"-X helm.sh/helm/v4/internal/version.version={HELM_VERSION}",
        "-X helm.sh/helm/v4/internal/version.metadata=",
        "-X helm.sh/helm/v4/internal/version.gitTreeState=clean",
        f"-X github.com/prometheus/common/version.Version={PROMETHEUS_RELEASE}",
    ]
    return " ".join(["-s", "-w", *stamps])


def prometheus_operator_crds() -> dict[str, pathlib.Path]:
    """The Prometheus Operator's CRD files by kind (PodMonitor, PrometheusRule, ...), from its Go
    module at PROMETHEUS_OPERATOR_VERSION (downloaded once into the module cache)."""
    go = shutil.which("go")
    if go is None:
        raise DevClusterError("the Go toolchain (`go`) is not on PATH", fix="install Go >= 1.26")
    module = f"github.com/prometheus-operator/prometheus-operator@{PROMETHEUS_OPERATOR_VERSION}"
    result = subprocess.run(
        [go, "mod", "download", "-json", module],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "GOFLAGS": "-mod=mod"},
        cwd=module_dir(),
    )
    if result.returncode != 0:
        raise DevClusterError(f"go mod download {module} failed: {result.stdout}{result.stderr}", fix="check GOPROXY")
    directory = pathlib.Path(json.loads(result.stdout)["Dir"]) / "example" / "prometheus-operator-crd"
    kinds = {"podmonitors": "PodMonitor", "prometheusrules": "PrometheusRule", "servicemonitors": "ServiceMonitor"}
    return {kind: directory / f"monitoring.coreos.com_{plural}.yaml" for plural, kind in kinds.items()}


def main(argv: list[str] | None = None) -> int:
    """`python -m coroner_dev.devcluster.tools helm|promtool`: builds if needed, prints the path."""
    names = (argv if argv is not None else sys.argv[1:]) or list(PACKAGES)
    unknown = [name for name in names if name not in PACKAGES]
    if unknown:
        print(f"unknown tool(s) {', '.join(unknown)}; known: {', '.join(PACKAGES)}", file=sys.stderr)
        return 2
    try:
        tools = ensure_tools()
    except DevClusterError as exc:
        print(f"{exc}", file=sys.stderr)
        return 1
    for name in names:
        print(tools.path(name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
