"""What every Coroner process exports beside its own series: `coroner_build_info` and the
process_*/python_* collectors of prometheus_client's default registry. One registry per process
object (tests run several operators or agents in one interpreter), so nothing here is global."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform

from prometheus_client import CollectorRegistry, Gauge, GCCollector, PlatformCollector, ProcessCollector

BUILD_INFO = "coroner_build_info"


def build_labels() -> tuple[str, str, str]:
    """version, python, commit of `coroner_build_info`."""
    return _installed_version(), platform.python_version(), os.environ.get("CORONER_GIT_COMMIT") or "unknown"


@functools.cache
def _installed_version() -> str:
    """The package's version, read once: the installed metadata is parsed from its files (about half
    a millisecond), and the code a process runs does not change under it."""
    try:
        return importlib.metadata.version("kube-coroner")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def process_registry(*, process_collectors: bool = True) -> tuple[CollectorRegistry, Gauge]:
    """A fresh registry with `coroner_build_info` set and, unless told otherwise, the process_* and
    python_* collectors (a custom registry starts without them)."""
    registry = CollectorRegistry()
    if process_collectors:
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
    build_info = Gauge(
        BUILD_INFO,
        "Always 1; the labels say which build runs: the package version, the Python version and the "
        "git commit the image was built from (CORONER_GIT_COMMIT, else unknown).",
        ["version", "python", "commit"],
        registry=registry,
    )
    build_info.labels(*build_labels()).set(1)
    return registry, build_info
