"""examples/ is what docs/workers.md shows: each example file appears on the page, verbatim, in the
code block after the line that names it, and every file of examples/ is shown (the real-node tests
apply these files, so the page shows what was proven)."""

from __future__ import annotations

import pathlib
import re

import yaml

from coroner.core import inject

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
#: A line naming `examples/FILE` and ending in a colon, then the fenced block that shows it.
SHOWN = re.compile(r"`(examples/[\w.-]+)`[^\n`]*:\n\n```yaml\n(.*?)```", re.DOTALL)


def shown() -> dict[str, str]:
    page = (ROOT / "docs" / "workers.md").read_text()
    found: dict[str, str] = {}
    for path, block in SHOWN.findall(page):
        assert path not in found, f"{path} is shown twice"
        found[path] = block
    return found


def test_docs_workers_shows_every_example_verbatim() -> None:
    files = {f"examples/{p.name}": p.read_text() for p in sorted(EXAMPLES.glob("*.yaml"))}
    assert files, "no examples"
    assert shown() == files


def test_every_workload_example_can_be_injected_and_names_the_rbac_examples_service_account() -> None:
    rbac = list(yaml.safe_load_all((EXAMPLES / "rbac.yaml").read_text()))
    (account,) = [o["metadata"]["name"] for o in rbac if o["kind"] == "ServiceAccount"]
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if inject.template_path(document) is None:
                continue
            injection = inject.inject_reporting(document)
            assert injection.injected, path
            spec = document if document["kind"] == "Pod" else document["spec"]["template"]
            assert spec["spec"]["serviceAccountName"] == account, path
