"""What each image installs, and what each of its processes holds in memory once it has imported.

Without a container engine on the development machines, an image is reproduced the way its
Dockerfile builds it: a fresh virtualenv, the image's hashed lock (`images/<name>.lock`,
`--require-hashes`), then the project with `--no-deps` from only the source roots the image copies.
Installed size is the site-packages of that venv without pip and setuptools (the base image has
those). RSS is VmRSS of a fresh interpreter after it has imported everything its entry point
imports, measured in the image venv and, for comparison, in the dev venv (one distribution with
every extra installed: what the single image used to carry).

    .venv/bin/python bench/images.py            # writes bench/results/images.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import venv
from typing import Any

import harness as c

#: image -> (source roots the Dockerfile copies, processes: name -> modules its entry point imports)
IMAGES: dict[str, tuple[list[str], dict[str, list[str]]]] = {
    "agent": (
        ["src/coroner", "node-agent/src"],
        {"coroner-agent": ["coroner_agent.main"], "coroner run": ["coroner.cli.main", "coroner.launcher"]},
    ),
    "operator": (["src/coroner", "operator/src"], {"coroner-operator": ["coroner_operator.main"]}),
}
NOT_THE_IMAGE = ("pip", "setuptools", "pkg_resources", "_distutils_hack", "__pycache__")
RSS = """
import importlib, sys
for module in sys.argv[1:]:
    importlib.import_module(module)
status = dict(line.split(':', 1) for line in open('/proc/self/status'))
print(int(status['VmRSS'].split()[0]), 'kubernetes' in sys.modules, 'kopf' in sys.modules)
"""


def installed_kib(site: pathlib.Path) -> int:
    total = 0
    for path in site.rglob("*"):
        parts = path.relative_to(site).parts
        if path.is_file() and not any(p.startswith(NOT_THE_IMAGE) for p in parts):
            total += path.stat().st_size
    return total // 1024


def rss(python: pathlib.Path, modules: list[str], runs: int) -> dict[str, Any]:
    samples = []
    for _ in range(runs):
        out = subprocess.run([str(python), "-c", RSS, *modules], capture_output=True, text=True, check=True).stdout
        kib, kubernetes, kopf = out.split()
        samples.append(int(kib))
    return {
        "rss_mib_median": round(statistics.median(samples) / 1024, 1),
        "runs": runs,
        "imports_kubernetes": kubernetes == "True",
        "imports_kopf": kopf == "True",
    }


def build(image: str, roots: list[str], work: pathlib.Path) -> pathlib.Path:
    """The image's install, reproduced: its lock with hashes, then the project without dependencies."""
    source = work / "src-tree"
    shutil.rmtree(source, ignore_errors=True)
    for name in ("pyproject.toml", "README.md"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(c.REPO / name, source / name)
    for root in roots:
        shutil.copytree(c.REPO / root, source / root, ignore=shutil.ignore_patterns("__pycache__"))
    env = work / f"venv-{image}"
    venv.create(env, with_pip=True, clear=True)
    pip = [str(env / "bin" / "python"), "-m", "pip", "install", "-q", "--no-cache-dir"]
    lock = c.REPO / "images" / f"{image}.lock"
    subprocess.run([*pip, "--require-hashes", "--only-binary=:all:", "-r", str(lock)], check=True)
    subprocess.run([*pip, "--no-deps", str(source)], check=True)
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="interpreters started per process (median RSS)")
    parser.add_argument("--name", default="images", help="result name: bench/results/NAME.json")
    args = parser.parse_args()
    result: dict[str, Any] = {
        "machine": c.machine_info(),
        "versions": c.versions(),
        "command": c.command_line(),
        "images": {},
    }
    dev_python = pathlib.Path(sys.executable)
    dev_site = next((dev_python.parent.parent / "lib").glob("python3*/site-packages"))
    with tempfile.TemporaryDirectory(prefix="coroner-images-") as tmp:
        for image, (roots, processes) in IMAGES.items():
            c.log(f"{image}: installing images/{image}.lock into a fresh venv")
            env = build(image, roots, pathlib.Path(tmp))
            site = next((env / "lib").glob("python3*/site-packages"))
            lock_pins = sorted(
                line.split("==")[0]
                for line in (c.REPO / "images" / f"{image}.lock").read_text().splitlines()
                if "==" in line
            )
            result["images"][image] = {
                "installed_kib": installed_kib(site),
                "packages": lock_pins,
                "processes": {
                    name: {
                        "image": rss(env / "bin" / "python", modules, args.runs),
                        "dev_venv": rss(dev_python, modules, args.runs),
                    }
                    for name, modules in processes.items()
                },
            }
    result["dev_venv_installed_kib"] = installed_kib(dev_site)
    c.write_result(args.name, result)
    print(json.dumps(result["images"], indent=2))


if __name__ == "__main__":
    main()
