"""The dev cloud's instances: real dev nodes that Karpenter launches and terminates.

Karpenter's dev cloud provider (testenv/karpenter, `devcloud`) calls this module's command for the two
things a cloud does, and reads the records this module writes:

    python -m coroner_dev.devcluster.karpenter_instances --dir DIR launch --name N --provider-id P
        --instance-type T --zone Z --capacity-type C
    python -m coroner_dev.devcluster.karpenter_instances --dir DIR terminate --name N

- **launch** writes the instance's record (state `booting`) and returns at once; a detached process
  boots the node (`node.start`: containerd, Coroner's images imported, a kubelet that registers its
  Node with the claim's providerID and Karpenter's `karpenter.sh/unregistered` taint), as a cloud's
  instance boots after its API call returned. The record turns `running` once the Node is Ready, or
  `failed` (with the reason) if the boot fails, which Karpenter reads as an instance that is gone.
- **terminate** ends the instance as a cloud does: the booting process, the kubelet, containerd,
  every shim and every container SIGKILLed at once, with no drain and no shutdown of anything. Then
  what a terminated instance leaves nowhere: its mounts, its cgroups and its directory; its record
  last. Terminating an instance with no record succeeds (a retried Delete).

Each record is `<cluster>/instances/<name>.json`, replaced whole (written aside, then renamed) under
one lock per cluster, so Karpenter's reads never see half of one. The record also names every process
the instance runs (each recorded the moment it is spawned), so nothing of a node outlives terminate,
even one terminated while it boots.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import pathlib
import re
import shutil
import sys
import time
from collections.abc import Iterator
from typing import Any, Literal

from coroner_dev.devcluster import gobuild
from coroner_dev.devcluster import node as node_mod
from coroner_dev.devcluster.cluster import Cluster, Started, _spawn
from coroner_dev.devcluster.errors import DevClusterError

#: This module's name (run as `python -m`, its `__name__` is `__main__`).
MODULE = "coroner_dev.devcluster.karpenter_instances"
INSTANCES = "instances"
#: Not a `.json` file: every `.json` file here is an instance record.
IMAGES = "node-images"
#: Karpenter's taint on a Node it has not yet registered: its registration removes it once it has
#: synced the NodeClaim's labels and taints, so nothing schedules on a half-registered node.
UNREGISTERED_TAINT = {"key": "karpenter.sh/unregistered", "effect": "NoExecute"}
#: A claim's name as Karpenter makes it (`<nodepool>-<suffix>`): a DNS label, also the node's name,
#: its directory's and its cgroup's.
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

State = Literal["booting", "running", "failed"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Instance:
    """One instance's record; its JSON is what the Go provider reads (`devcloud.Instance`)."""

    name: str
    provider_id: str
    instance_type: str
    zone: str
    capacity_type: str
    state: State
    reason: str = ""
    processes: tuple[Started, ...] = ()
    """The booting process, then containerd and the kubelet, each as it is spawned."""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "providerID": self.provider_id,
            "instanceType": self.instance_type,
            "zone": self.zone,
            "capacityType": self.capacity_type,
            "state": self.state,
            "reason": self.reason,
            "processes": [dataclasses.asdict(p) for p in self.processes],
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Instance:
        return cls(
            name=raw["name"],
            provider_id=raw["providerID"],
            instance_type=raw["instanceType"],
            zone=raw["zone"],
            capacity_type=raw["capacityType"],
            state=raw["state"],
            reason=raw.get("reason", ""),
            processes=tuple(Started(**p) for p in raw.get("processes", ())),
        )


def records_dir(directory: pathlib.Path) -> pathlib.Path:
    return directory / INSTANCES


def use_images(directory: pathlib.Path, *, archives: list[tuple[str, pathlib.Path]], sandbox: str) -> None:
    """The images every instance of the cluster in DIR imports (the sandbox image first), fixed when
    Karpenter starts: a boot never builds images (their cache key moves with every edit of images/),
    and every instance runs the same ones."""
    records_dir(directory).mkdir(parents=True, exist_ok=True)
    chosen = {"archives": [(reference, str(archive)) for reference, archive in archives], "sandbox": sandbox}
    (records_dir(directory) / IMAGES).write_text(json.dumps(chosen, indent=2) + "\n")


def _path(directory: pathlib.Path, name: str) -> pathlib.Path:
    if not NAME.match(name):
        raise DevClusterError(f"{name!r} is no instance name (a DNS label)", fix="name the instance by its NodeClaim")
    return records_dir(directory) / f"{name}.json"


@contextlib.contextmanager
def _locked(directory: pathlib.Path) -> Iterator[None]:
    records_dir(directory).mkdir(parents=True, exist_ok=True)
    with gobuild.build_lock(records_dir(directory) / ".lock"):
        yield


def read(directory: pathlib.Path, name: str) -> Instance | None:
    try:
        return Instance.from_json(json.loads(_path(directory, name).read_text()))
    except FileNotFoundError:
        return None


def every(directory: pathlib.Path) -> list[Instance]:
    """Every instance recorded in the cluster in DIR."""
    found = []
    for path in sorted(records_dir(directory).glob("*.json")):
        with contextlib.suppress(FileNotFoundError):
            found.append(Instance.from_json(json.loads(path.read_text())))
    return found


def _write(directory: pathlib.Path, instance: Instance) -> None:
    path = _path(directory, instance.name)
    aside = path.with_suffix(".json.new")
    aside.write_text(json.dumps(instance.to_json(), indent=2) + "\n")
    aside.replace(path)


def _update(directory: pathlib.Path, name: str, **changes: Any) -> Instance | None:
    """Changes instance NAME's record, unless it was terminated meanwhile (then None)."""
    with _locked(directory):
        current = read(directory, name)
        if current is None:
            return None
        if "processes" in changes:
            changes["processes"] = (*current.processes, *changes["processes"])
        updated = dataclasses.replace(current, **changes)
        _write(directory, updated)
        return updated


def launch(directory: pathlib.Path, instance: Instance) -> Instance:
    """Records INSTANCE (booting) and starts its boot in a detached process; returns at once. A launch
    of a name already recorded returns that record (Karpenter retries a Create it did not see end)."""
    directory = directory.resolve()
    with _locked(directory):
        existing = read(directory, instance.name)
        if existing is not None:
            return existing
        _write(directory, dataclasses.replace(instance, state="booting"))
    booter = _spawn(
        f"boot/{instance.name}",
        [sys.executable, "-m", MODULE, "--dir", str(directory), "boot", "--name", instance.name],
        log=directory / "logs" / f"{instance.name}-boot.log",
    )
    recorded = _update(directory, instance.name, processes=(booter,))
    return recorded or instance


def boot(directory: pathlib.Path, name: str) -> None:
    """Boots instance NAME's node (the detached process `launch` starts) and records how it ended."""
    from coroner_dev.devcluster.nodebinaries import ensure_node_binaries

    directory = directory.resolve()
    instance = read(directory, name)
    cluster = Cluster.load(directory)
    if instance is None or cluster is None:
        return

    def spawn(process: str, argv: list[str], log: pathlib.Path, env: dict[str, str]) -> Started:
        started = _spawn(process, argv, log=log, env=env)
        _update(directory, name, processes=(started,))
        return started

    try:
        binaries = ensure_node_binaries(progress=print)
        images = json.loads((records_dir(directory) / IMAGES).read_text())
        started = time.monotonic()
        node_mod.start(
            dataclasses.replace(cluster, nodes=(*cluster.nodes, name)),
            name=name,
            binaries=binaries,
            images=[(reference, pathlib.Path(archive)) for reference, archive in images["archives"]],
            sandbox_image=images["sandbox"],
            spawn=spawn,
            say=print,
            kubelet_settings={"providerID": instance.provider_id, "registerWithTaints": [UNREGISTERED_TAINT]},
        )
        _update(directory, name, state="running")
        print(f"instance {name} running: its Node Ready {time.monotonic() - started:.1f} s after the boot began")
    except Exception as exc:
        # Whatever stopped the boot, the instance is gone for Karpenter (node.start cleaned up).
        _update(directory, name, state="failed", reason=f"{type(exc).__name__}: {exc}"[-2000:])
        raise


@contextlib.contextmanager
def terminating(directory: pathlib.Path, name: str) -> Iterator[None]:
    """One termination of instance NAME at a time. Karpenter's `Delete` runs `terminate` as a process
    of its own, which goes on when Karpenter is stopped, while `down` terminates every instance: two
    walks of one node's cgroups remove each other's directories under them."""
    path = _path(directory, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gobuild.build_lock(path.with_name(f".{name}.terminating")):
        yield


def terminate(directory: pathlib.Path, name: str) -> bool:
    """Terminates instance NAME (see the module's docstring); False when it has no record (never
    launched, or already terminated)."""
    directory = directory.resolve()
    with terminating(directory, name):
        return _terminate(directory, name)


def _terminate(directory: pathlib.Path, name: str) -> bool:
    from coroner_dev.devcluster.nodebinaries import ensure_node_binaries

    cluster = Cluster.load(directory)
    instance = read(directory, name)
    if instance is None or cluster is None:
        return False
    # The booting process is recorded first, so it dies first and spawns nothing more.
    node_mod.lose(dataclasses.replace(cluster, processes=instance.processes), name)
    latest = read(directory, name)  # a process it recorded a moment before it died
    if latest is not None:
        node_mod.lose(dataclasses.replace(cluster, processes=latest.processes), name)
    layout = node_mod.NodeLayout(directory=directory, name=name)
    problems = node_mod.stop(cluster, name=name, binaries=ensure_node_binaries(progress=print), processes=[])
    if not problems:
        shutil.rmtree(layout.root, ignore_errors=True)
    with _locked(directory):
        _path(directory, name).unlink(missing_ok=True)
    for problem in problems:
        print(f"terminating {name} left: {problem}", file=sys.stderr)
    return True


def terminate_all(directory: pathlib.Path) -> list[str]:
    """Terminates every instance of the cluster in DIR; returns their names."""
    names = [instance.name for instance in every(directory.resolve())]
    for name in names:
        terminate(directory, name)
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coroner_dev.devcluster.karpenter_instances")
    parser.add_argument("--dir", required=True, type=pathlib.Path)
    commands = parser.add_subparsers(dest="command", required=True)
    launching = commands.add_parser("launch")
    for option in ("--name", "--provider-id", "--instance-type", "--zone", "--capacity-type"):
        launching.add_argument(option, required=True)
    commands.add_parser("boot").add_argument("--name", required=True)
    commands.add_parser("terminate").add_argument("--name", required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "launch":
            instance = Instance(
                name=args.name,
                provider_id=args.provider_id,
                instance_type=args.instance_type,
                zone=args.zone,
                capacity_type=args.capacity_type,
                state="booting",
            )
            print(json.dumps(launch(args.dir, instance).to_json()))
        elif args.command == "boot":
            boot(args.dir, args.name)
        else:
            terminate(args.dir, args.name)
    except DevClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
