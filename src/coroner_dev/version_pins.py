"""Every place outside the Python code that spells the release's version, and the check that each one
agrees with `coroner.__version__` (the one place it is written).

The Python code derives what it needs (`coroner.core.inject.INJECTION_VERSION`, the image references
of `coroner_dev.devcluster.imagerecipe`, the package metadata through pyproject's dynamic version).
Files cannot: YAML manifests, the chart's Chart.yaml, the krew manifest, the Dockerfiles' and the
docs' examples. `mismatches()` finds every spelling of a Coroner version in the tracked files and
names those that differ; `make release` refuses to build while there is one, and
tests/unit/test_version.py fails on it; `python -m coroner_dev.version_pins` lists them.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import subprocess
import sys
from collections.abc import Iterable

import yaml

from coroner import __version__

#: What a Coroner tag looks like (semantic, with krew's and the images' leading v).
_TAG = r"v\d+\.\d+\.\d+(?:-(?:alpha|beta|rc)\.?\d+)?"
#: Every spelling of a Coroner version in free text: an image reference, the plugin's archive, a
#: a release download URL, the injection's annotation (in YAML and in the admission policy's CEL).
PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(rf"coroner-(?:agent|operator|registrar)[-:](?P<tag>{_TAG})"),
    re.compile(rf"kubectl-coroner-(?P<tag>{_TAG})\.tar\.gz"),
    re.compile(rf"releases/download/(?P<tag>{_TAG})/"),
    re.compile(rf"coroner\.dev/injected:\s*(?P<tag>{_TAG})"),
    re.compile(rf'escapeKey\("coroner\.dev/injected"\),\s*value:\s*"(?P<tag>{_TAG})"'),
)
#: Files that name other versions on purpose: the changelog, and the tests (which pin what they
#: check, an older injection's annotation among them).
EXCLUDED = frozenset({"CHANGELOG.md"})
EXCLUDED_DIRECTORIES = ("tests/",)
SUFFIXES = frozenset({".md", ".yaml", ".yml", ".json", ".py", ".Dockerfile", ".toml", ".tpl", ".txt"})


@dataclasses.dataclass(frozen=True, slots=True)
class Mismatch:
    """One place whose version is not the release's."""

    path: str
    line: int
    found: str
    expected: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.found}, not {self.expected}"


def tag() -> str:
    """The release's tag: `v` and the version (images, krew, the chart's appVersion)."""
    return f"v{__version__}"


def tracked_files(repo: pathlib.Path) -> list[str]:
    """The files git tracks, with the text suffixes that can name a version."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True, check=True).stdout
    names = [name for name in listed.decode().split("\0") if name]
    return sorted(
        name
        for name in names
        if name not in EXCLUDED
        and not name.startswith(EXCLUDED_DIRECTORIES)
        and (pathlib.PurePath(name).suffix in SUFFIXES or name.endswith(".Dockerfile"))
        and (repo / name).is_file()
    )


def text_mismatches(path: str, text: str, *, expected: str) -> Iterable[Mismatch]:
    """Every spelling of a version in TEXT that is not EXPECTED (a tag)."""
    for pattern in PATTERNS:
        for match in pattern.finditer(text):
            if match["tag"] != expected:
                yield Mismatch(path, text.count("\n", 0, match.start("tag")) + 1, match["tag"], expected)


def structured_mismatches(repo: pathlib.Path, *, version: str) -> Iterable[Mismatch]:
    """The fields that carry the version without an image reference around it."""
    chart = yaml.safe_load((repo / "charts/coroner/Chart.yaml").read_text())
    for key, expected in (("version", version), ("appVersion", f"v{version}")):
        if str(chart.get(key)) != expected:
            yield Mismatch("charts/coroner/Chart.yaml", 0, f"{key}: {chart.get(key)}", expected)
    krew = yaml.safe_load((repo / "plugins/coroner.yaml").read_text())
    if krew["spec"]["version"] != f"v{version}":
        yield Mismatch("plugins/coroner.yaml", 0, f"spec.version: {krew['spec']['version']}", f"v{version}")
    for kustomization in sorted((repo / "manifests/overlays").glob("*/kustomization.yaml")):
        for image in yaml.safe_load(kustomization.read_text()).get("images") or []:
            if image["name"].startswith("ghcr.io/coroner-dev/") and image.get("newTag") != f"v{version}":
                relative = kustomization.relative_to(repo).as_posix()
                yield Mismatch(relative, 0, f"{image['name']} newTag: {image.get('newTag')}", f"v{version}")


def mismatches(repo: pathlib.Path, *, version: str = __version__) -> list[Mismatch]:
    """Every place in the tracked tree whose version is not VERSION (none: they all agree)."""
    found = list(structured_mismatches(repo, version=version))
    for name in tracked_files(repo):
        found.extend(text_mismatches(name, (repo / name).read_text(errors="replace"), expected=f"v{version}"))
    return found


#: The lines that carry the version without an image reference: file -> (pattern, its replacement
#: for a version V, as a format string of `version` and `tag`).
FIELDS: dict[str, tuple[tuple[str, str], ...]] = {
    "src/coroner/__init__.py": ((r'^__version__ = "[^"]*"$', '__version__ = "{version}"'),),
    "charts/coroner/Chart.yaml": ((r"^version: .*$", "version: {version}"), (r"^appVersion: .*$", "appVersion: {tag}")),
    "plugins/coroner.yaml": ((r"^  version: v.*$", "  version: {tag}"),),
    "manifests/overlays/plan-only/kustomization.yaml": ((r"newTag: v.*$", "newTag: {tag}"),),
    "manifests/overlays/production/kustomization.yaml": ((r"newTag: v.*$", "newTag: {tag}"),),
}


def bump(repo: pathlib.Path, *, old: str, new: str) -> list[str]:
    """Writes NEW where OLD is spelled: the fields above, and every spelling PATTERNS find of OLD's tag
    in the tracked files (the tests' too; CHANGELOG.md, which names past versions, is not touched).
    Returns the files changed."""
    changed = set()
    for name, fields in FIELDS.items():
        path = repo / name
        text = path.read_text()
        for pattern, replacement in fields:
            text = re.sub(pattern, replacement.format(version=new, tag=f"v{new}"), text, flags=re.MULTILINE)
        if text != path.read_text():
            path.write_text(text)
            changed.add(name)
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True, check=True).stdout.decode()
    for name in sorted(n for n in listed.split("\0") if n and n not in EXCLUDED and (repo / n).is_file()):
        path = repo / name
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        updated = text
        for spelling in PATTERNS:
            updated = spelling.sub(
                lambda m: m.group(0).replace(m["tag"], f"v{new}") if m["tag"] == f"v{old}" else m.group(0), updated
            )
        if updated != text:
            path.write_text(updated)
            changed.add(name)
    return sorted(changed)


def main(argv: list[str] | None = None) -> int:
    """`python -m coroner_dev.version_pins`: every place that disagrees with coroner.__version__;
    `--bump NEW`: write NEW everywhere the current version is spelled (then check again)."""
    arguments = sys.argv[1:] if argv is None else argv
    repo = pathlib.Path(__file__).resolve().parents[2]
    if arguments[:1] == ["--bump"] and len(arguments) == 2:
        for name in bump(repo, old=__version__, new=arguments[1]):
            print(f"changed {name}")
        print("regenerate what is generated from them: python -m coroner_dev.chart", file=sys.stderr)
        return 0
    if arguments:
        print("usage: python -m coroner_dev.version_pins [--bump NEW]", file=sys.stderr)
        return 2
    found = mismatches(repo)
    for mismatch in found:
        print(mismatch)
    print(f"{len(found)} place(s) disagree with coroner.__version__ = {__version__}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
