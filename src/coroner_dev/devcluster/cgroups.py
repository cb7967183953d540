"""The dev nodes' cgroups, on a machine that owns the cgroup this process is in.

This machine runs cgroup v1 and owns the memory cgroup this process is in (elsewhere
the hierarchies' roots). Nothing here moves, remounts or changes an existing cgroup: the node's
cgroup root is a new child of that memory cgroup's path, created with the same relative path in
every v1 hierarchy (cpuset's `cpus` and `mems` copied down each new level, which cpuset requires
before a task may join), so every container stays inside the machine's own limits. The kubelet
needs `failCgroupV1: false` to run on v1 at all.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable

from coroner_dev.devcluster.errors import DevClusterError

CGROUP_MOUNTS = pathlib.Path("/sys/fs/cgroup")


def cgroup_parent(self_cgroup: str) -> str:
    """The path of the memory cgroup a process is in, from the text of its /proc/PID/cgroup."""
    for line in self_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return path
    raise DevClusterError(
        "this process is in no cgroup v1 memory hierarchy; the dev node nests its cgroups under that one",
        fix="run the dev node on a cgroup v1 machine (the project's machines are)",
    )


def node_cgroup_root(parent: str, name: str) -> str:
    """The kubelet's cgroupRoot: a new child of the machine's own memory cgroup path."""
    return f"{parent.rstrip('/')}/coroner-node-{name}"


def v1_hierarchies(mounts: str) -> list[pathlib.Path]:
    """The cgroup v1 mount points, from the text of /proc/self/mounts."""
    found = []
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup":
            found.append(pathlib.Path(fields[1]))
    return found


def ensure_cgroups(root: str, *, say: Callable[[str], None]) -> list[str]:
    """Creates `root` in every v1 hierarchy; returns the directories it created (deepest last)."""
    created: list[str] = []
    parts = [p for p in root.split("/") if p]
    for hierarchy in v1_hierarchies(mounts()):
        current = hierarchy
        for part in parts:
            parent, current = current, current / part
            if current.exists():
                continue
            current.mkdir()
            created.append(str(current))
            if (parent / "cpuset.cpus").exists():
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    (current / knob).write_text((parent / knob).read_text())
    if created:
        say(f"created the node's cgroups under {root} in {len(v1_hierarchies(mounts()))} hierarchies")
    return created


def mounts() -> str:
    """The text of /proc/self/mounts."""
    return pathlib.Path("/proc/self/mounts").read_text()


def remove_cgroups(root: str) -> list[str]:
    """Removes every cgroup below and at `root` in every hierarchy (v1, and the v2 one runc also
    writes on a hybrid machine), deepest first; only empty cgroups can be removed, so no task is
    moved. Returns what it could not remove (a task still inside)."""
    left: list[str] = []
    for hierarchy in v1_hierarchies(mounts()) + cgroup2_hierarchies(mounts()):
        top = hierarchy / root.lstrip("/")
        if not top.is_dir():
            continue
        for path in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            _rmdir(path, left, patience=20)
        _rmdir(top, left, patience=20)
    return left


def remove_ancestors(created: list[str]) -> list[str]:
    """Removes the ancestors `ensure_cgroups` created, once every node below them is gone."""
    left: list[str] = []
    for ancestor in sorted((pathlib.Path(c) for c in created), key=lambda p: -len(p.parts)):
        if ancestor.exists():
            _rmdir(ancestor, left, patience=1)
    return left


def cgroup2_hierarchies(mounts: str) -> list[pathlib.Path]:
    """The cgroup v2 mount points, from the text of /proc/self/mounts."""
    fields = (line.split() for line in mounts.splitlines())
    return [pathlib.Path(f[1]) for f in fields if len(f) >= 3 and f[2] == "cgroup2"]


def _rmdir(path: pathlib.Path, left: list[str], *, patience: int) -> None:
    """rmdir, tried PATIENCE times 0.1 s apart: a cgroup whose last task just died may still be busy."""
    for attempt in range(patience):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if attempt + 1 < patience:
                time.sleep(0.1)
    left.append(str(path))
