"""What the project's images are built from, and the key of a build: the recipes (`RECIPES`), the
stand-in base's recipe, the inputs and their digest (`cache_key`), and this machine's pip
configuration and apt sources as a build sees them. Pure but for reading the inputs and the
machine's configuration files; `coroner_dev.devcluster.images` builds from it (its docstring says
how and why).
"""

from __future__ import annotations

import configparser
import dataclasses
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from coroner import __version__
from coroner.core import inject
from coroner_dev.devcluster.errors import DevClusterError

RECIPE_VERSION = 1
#: How many builds `<cache>/images/` keeps (the newest, by when they landed).
#: The shipped images' references: tagged with the release's version (coroner.__version__).
AGENT_REFERENCE = f"ghcr.io/coroner-dev/coroner-agent:v{__version__}"
OPERATOR_REFERENCE = f"ghcr.io/coroner-dev/coroner-operator:v{__version__}"
#: The image `kubectl coroner inject` and components/registrar-injection name (one constant).
REGISTRAR_REFERENCE = inject.REGISTRAR_IMAGE
WORKER_REFERENCE = "localhost/coroner-dev/coroner-worker:dev"
GO_WORKER_REFERENCE = "localhost/coroner-dev/go-worker:dev"
PAUSE_REFERENCE = "localhost/coroner-dev/pause:catatonit"
BASE_REPOSITORY = "localhost/coroner-dev/python-base"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GoBinary:
    """A static Go binary built into the staged build context before its image (`go build` in
    `module`, a Go module of the context with no dependencies, to `output`): its sources are inputs
    of the cache key (they are under images/), the binary itself is not."""

    module: str
    """The module's directory, relative to the repository."""
    output: str
    """Where the binary lands in the staged context, relative to it (the Dockerfile COPYs it)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Recipe:
    """One image: its name here, its reference, its Dockerfile (relative to the repository), and the
    Go binary built before it, if any."""

    name: str
    reference: str
    dockerfile: str
    go_binary: GoBinary | None = None


RECIPES: tuple[Recipe, ...] = (
    Recipe(name="agent", reference=AGENT_REFERENCE, dockerfile="images/agent.Dockerfile"),
    Recipe(name="operator", reference=OPERATOR_REFERENCE, dockerfile="images/operator.Dockerfile"),
    Recipe(name="registrar", reference=REGISTRAR_REFERENCE, dockerfile="images/registrar.Dockerfile"),
    Recipe(name="worker", reference=WORKER_REFERENCE, dockerfile="images/worker.Dockerfile"),
    Recipe(
        name="go-worker",
        reference=GO_WORKER_REFERENCE,
        dockerfile="images/go-worker.Dockerfile",
        go_binary=GoBinary(module="images/go-worker", output="images/go-worker/go-worker"),
    ),
    Recipe(name="pause", reference=PAUSE_REFERENCE, dockerfile="images/pause.Dockerfile"),
)

#: How a GoBinary is built: static (no libc in a `scratch` image), with no path of this machine or
#: build id in it, nothing fetched (a module with a dependency fails here), this machine's Go
#: toolchain (its version is not an input of the cache key: a new toolchain rebuilds at the next
#: change of an input).
GO_BUILD_ARGS = ("build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid=")
GO_BUILD_ENV = (
    ("CGO_ENABLED", "0"),
    ("GOOS", "linux"),
    ("GOFLAGS", "-mod=readonly"),
    ("GOPROXY", "off"),
    ("GOTOOLCHAIN", "local"),
    ("GOWORK", "off"),
)

#: Inputs: single files, and trees (every file git tracks, or that is present and not ignored).
INPUT_FILES = ("pyproject.toml", "README.md", "LICENSE")
INPUT_TREES = ("images", "src/coroner", "operator/src", "node-agent/src")
#: Executable in the staged context whatever the checkout's modes (the worker's entry point).
EXECUTABLES = frozenset({"images/worker/coroner-test-worker.py"})

#: The stand-in base: what mmdebstrap is asked for, and the image configuration it gets.
BASE_SUITE = "bookworm"
BASE_VARIANT = "minbase"
BASE_PACKAGES = ("python3.11", "python3-venv", "ca-certificates", "catatonit")
BASE_DPKG_OPTIONS = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/info/*",
)
BASE_CUSTOMIZE_HOOKS = (
    'chroot "$1" python3.11 -m venv /usr/local',
    'rm -f "$1"/usr/local/bin/activate "$1"/usr/local/bin/activate.* "$1"/usr/local/bin/Activate.ps1',
    'rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/cache/debconf/*-old',
    'find "$1"/var/log -type f -delete',
    # mmdebstrap copies this machine's; a container runtime mounts its own over them.
    ': > "$1"/etc/resolv.conf; : > "$1"/etc/hostname',
)
BASE_ENV = (("PATH", "/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"), ("LANG", "C.UTF-8"))
BASE_CMD = ("python3",)
#: The base the Dockerfiles name, which the stand-in replaces (a label of every image built on it).
STANDS_IN_FOR = "python:3.11.7-slim-bookworm"
#: mmdebstrap's hook that merges /usr with an empty usr-is-merged (else init-system-helpers pulls
#: usrmerge, and with it perl: 50 MB).
MERGED_USR_HOOKS = pathlib.Path("/usr/share/mmdebstrap/hooks/merged-usr")

#: pip settings carried from this machine into the build's pip.conf (file keys and PIP_* variables
#: alike); never install locations (--prefix is the Dockerfiles'), nor local wheel directories
#: (find-links: inputs the cache key would not see).
PIP_KEYS = frozenset(
    {
        "index-url",
        "extra-index-url",
        "trusted-host",
        "cert",
        "client-cert",
        "proxy",
        "timeout",
        "default-timeout",
        "retries",
        "disable-pip-version-check",
    }
)
PIP_CA_KEYS = ("cert", "client-cert")


def repo_root() -> pathlib.Path:
    """The checkout the images are built from: CORONER_REPO, else the one this file is in."""
    override = os.environ.get("CORONER_REPO")
    if override:
        return pathlib.Path(override)
    for parent in pathlib.Path(__file__).resolve().parents:
        if (parent / "images" / "agent.Dockerfile").exists() and (parent / "pyproject.toml").exists():
            return parent
    raise DevClusterError(
        "cannot find the checkout holding images/*.Dockerfile to build the images from",
        fix="run from a checkout of coroner (an editable install), or set CORONER_REPO=/path/to/checkout",
    )


def base_recipe() -> dict[str, Any]:
    """Everything that makes the stand-in base (the base's cache key digests it)."""
    return {
        "suite": BASE_SUITE,
        "variant": BASE_VARIANT,
        "packages": list(BASE_PACKAGES),
        "dpkg_options": list(BASE_DPKG_OPTIONS),
        "customize_hooks": list(BASE_CUSTOMIZE_HOOKS),
        "env": [list(pair) for pair in BASE_ENV],
        "cmd": list(BASE_CMD),
        "merged_usr": True,
        "dev": "empty",
    }


def base_reference() -> str:
    """The stand-in base's reference: a moved recipe is a new tag, so a new base."""
    digest = hashlib.sha256(json.dumps(base_recipe(), sort_keys=True).encode()).hexdigest()[:12]
    return f"{BASE_REPOSITORY}:{BASE_SUITE}-{digest}"


def input_files(repo: pathlib.Path) -> list[str]:
    """The inputs, as sorted paths relative to `repo`: INPUT_FILES and every file under INPUT_TREES
    that git tracks or that is present and not ignored (a checkout without git: every file present
    but bytecode)."""
    listed = _git_listed(repo)
    if listed is None:
        listed = set(INPUT_FILES)
        for tree in INPUT_TREES:
            for path in (repo / tree).rglob("*"):
                relative = path.relative_to(repo).as_posix()
                if "__pycache__" not in path.parts and path.suffix != ".pyc":
                    listed.add(relative)
    return sorted(name for name in listed if (repo / name).is_file())


def _git_listed(repo: pathlib.Path) -> set[str] | None:
    git = shutil.which("git")
    if git is None or not (repo / ".git").exists():
        return None
    result = subprocess.run(
        [
            git,
            "-C",
            str(repo),
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
            "--",
            *INPUT_FILES,
            *INPUT_TREES,
        ],
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        return None
    return {name for name in result.stdout.decode().split("\0") if name}


def cache_key(repo: pathlib.Path, files: Sequence[str] | None = None) -> str:
    """A digest of every input: each file's path, executable bit and bytes, the base recipe, the
    recipes (with how their Go binaries are built) and RECIPE_VERSION. A changed input is a new key;
    a rerun is not."""
    digest = hashlib.sha256()
    digest.update(f"recipe {RECIPE_VERSION}\n".encode())
    digest.update(json.dumps(base_recipe(), sort_keys=True).encode())
    digest.update(
        json.dumps(
            [
                [r.name, r.reference, r.dockerfile, dataclasses.asdict(r.go_binary) if r.go_binary else None]
                for r in RECIPES
            ]
        ).encode()
    )
    digest.update(json.dumps([list(GO_BUILD_ARGS), [list(pair) for pair in GO_BUILD_ENV]]).encode())
    for name in files if files is not None else input_files(repo):
        path = repo / name
        content = path.read_bytes()
        executable = name in EXECUTABLES or os.access(path, os.X_OK)
        digest.update(f"\0{name}\0{int(executable)}\0{len(content)}\0".encode())
        digest.update(content)
    return f"r{RECIPE_VERSION}-{digest.hexdigest()[:16]}"


def split_reference(reference: str) -> tuple[str, str]:
    """`host/path:tag` -> (`host/path`, `tag`)."""
    repository, _, tag = reference.rpartition(":")
    if not repository or "/" in tag:
        raise ValueError(f"{reference!r} has no tag")
    return repository, tag


def pip_config(environ: Mapping[str, str], files: Sequence[pathlib.Path]) -> dict[str, str]:
    """This machine's pip settings that a build needs to reach the index: the PIP_KEYS of `files`
    ([global], then [install], later files winning, as pip reads them), then of PIP_* variables
    (pip's precedence); `https_proxy` as `proxy` when pip names none."""
    settings: dict[str, str] = {}
    for file in files:
        parser = configparser.RawConfigParser()
        try:
            parser.read(file)
        except (OSError, configparser.Error):
            continue
        for section in ("global", "install"):
            if parser.has_section(section):
                for key, value in parser.items(section):
                    if key in PIP_KEYS:
                        settings[key] = value
    for name, value in environ.items():
        key = name[4:].lower().replace("_", "-") if name.startswith("PIP_") else ""
        if key in PIP_KEYS:
            settings[key] = value
    proxy = environ.get("https_proxy") or environ.get("HTTPS_PROXY")
    if proxy and "proxy" not in settings:
        settings["proxy"] = proxy
    return settings


def pip_config_files(environ: Mapping[str, str]) -> list[pathlib.Path]:
    """The pip configuration files this machine's pip reads, in pip's order (later wins)."""
    home = pathlib.Path(environ.get("HOME") or pathlib.Path.home())
    xdg = environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":")
    candidates = [
        *(pathlib.Path(d) / "pip" / "pip.conf" for d in reversed(xdg) if d),
        pathlib.Path("/etc/pip.conf"),
        home / ".pip" / "pip.conf",
        pathlib.Path(environ.get("XDG_CONFIG_HOME") or home / ".config") / "pip" / "pip.conf",
    ]
    if environ.get("PIP_CONFIG_FILE"):
        candidates.append(pathlib.Path(environ["PIP_CONFIG_FILE"]))
    return [path for path in candidates if path.is_file()]


def render_pip_config(settings: Mapping[str, str]) -> str:
    """A pip.conf with `settings` in [global]."""
    lines = ["[global]", *(f"{key} = {value}" for key, value in sorted(settings.items()))]
    return "\n".join(lines) + "\n"


def build_mounts(settings: Mapping[str, str], pip_conf: pathlib.Path) -> list[str]:
    """`buildah bud -v` arguments: the build's pip.conf at /etc/pip.conf and every CA or client
    certificate file it names at its own path, read-only (RUN steps only: never in a layer)."""
    mounts = [f"{pip_conf}:/etc/pip.conf:ro"]
    for key in PIP_CA_KEYS:
        value = settings.get(key)
        if value and pathlib.Path(value).is_file():
            mounts.append(f"{value}:{value}:ro")
    return mounts


def apt_sources(paths: Sequence[pathlib.Path], *, suite: str = BASE_SUITE) -> list[str]:
    """This machine's enabled Debian entries for `suite` (and its -updates, -security), as one-line
    `deb` sources for mmdebstrap, from .list and deb822 .sources files."""
    entries: list[str] = []
    for path in paths:
        try:
            text = path.read_text()
        except OSError:
            continue
        if path.name.endswith(".sources"):
            entries.extend(_deb822_entries(text))
        elif path.name.endswith(".list") or path.name == "sources.list":
            entries.extend(_one_line_entries(text))
    wanted = {suite, f"{suite}-updates", f"{suite}-security"}
    kept: list[str] = []
    for entry in entries:
        match = _ONE_LINE.match(entry)
        if match and match["suite"] in wanted and entry not in kept:
            kept.append(entry)
    return kept


_ONE_LINE = re.compile(r"deb\s+(?:\[[^\]]*\]\s+)?(?P<uri>\S+)\s+(?P<suite>\S+)")


def _one_line_entries(text: str) -> list[str]:
    return [line.split("#", 1)[0].strip() for line in text.splitlines() if line.strip().startswith("deb ")]


def _deb822_entries(text: str) -> list[str]:
    entries = []
    for paragraph in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in paragraph.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
            continue
        signed = fields.get("signed-by", "")
        option = f"[signed-by={signed}] " if signed.startswith("/") else ""
        components = fields.get("components", "")
        for uri in fields.get("uris", "").split():
            for suite in fields.get("suites", "").split():
                entries.append(f"deb {option}{uri} {suite} {components}".strip())
    return entries


def machine_apt_sources() -> list[pathlib.Path]:
    """/etc/apt/sources.list and the .list/.sources files of /etc/apt/sources.list.d."""
    etc = pathlib.Path("/etc/apt")
    found = [etc / "sources.list"] if (etc / "sources.list").is_file() else []
    directory = etc / "sources.list.d"
    if directory.is_dir():
        found.extend(sorted(p for p in directory.iterdir() if p.suffix in (".list", ".sources") and p.is_file()))
    return found
