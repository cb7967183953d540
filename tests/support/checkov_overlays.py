"""`make lint`'s checkov step: every overlay rendered by the real kubectl, checked by checkov, and
compared with manifests/checkov-baseline.yaml (each remaining finding with its reason).

Fails on a finding that is not in the baseline, and on a baseline entry that no longer fires.
checkov lives in its own virtualenv (`.venv-checkov`, made on first use): its pins (packaging<24,
python-dateutil<3 through botocore) conflict with the project's test tools, so it cannot share
`.venv`. The kubectl is the dev cluster's (built or reused from the cache by ensure_binaries).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import tempfile

import yaml

from coroner_dev.devcluster.binaries import ensure_binaries

REPO = pathlib.Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
BASELINE = MANIFESTS / "checkov-baseline.yaml"
CHECKOV_VERSION = "3.3.30"
VENV = REPO / ".venv-checkov"


def checkov() -> pathlib.Path:
    binary = VENV / "bin" / "checkov"
    if not binary.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", f"checkov=={CHECKOV_VERSION}"], check=True)
    return binary


def findings(kubectl: pathlib.Path, overlay: pathlib.Path, scratch: pathlib.Path) -> set[tuple[str, str]]:
    rendered = scratch / f"{overlay.name}.yaml"
    rendered.write_text(subprocess.run([str(kubectl), "kustomize", str(overlay)], capture_output=True, text=True,
                                       check=True).stdout)  # fmt: skip
    result = subprocess.run(
        [str(checkov()), "-f", str(rendered), "--framework", "kubernetes", "-o", "json", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode not in (0, 1):
        raise SystemExit(f"checkov failed on {overlay.name} ({result.returncode}):\n{result.stderr}")
    report = json.loads(result.stdout or "{}")
    reports = report if isinstance(report, list) else [report]
    return {
        (check["check_id"], check["resource"])
        for item in reports
        for check in (item.get("results") or {}).get("failed_checks") or []
    }


def main() -> int:
    kubectl = ensure_binaries().path("kubectl")
    entries = yaml.safe_load(BASELINE.read_text())["findings"]
    baseline = {(entry["check"], entry["resource"]) for entry in entries}
    missing_reason = [entry for entry in entries if not str(entry.get("reason") or "").strip()]
    found: set[tuple[str, str]] = set()
    with tempfile.TemporaryDirectory() as scratch:
        for overlay in sorted((MANIFESTS / "overlays").iterdir()):
            found |= findings(kubectl, overlay, pathlib.Path(scratch))
    new, stale = sorted(found - baseline), sorted(baseline - found)
    for check, resource in new:
        print(
            f"checkov: {check} on {resource} is not in {BASELINE.relative_to(REPO)}: fix it, or add it with its reason"
        )
    for check, resource in stale:
        print(f"checkov: {check} on {resource} no longer fires: remove it from {BASELINE.relative_to(REPO)}")
    for entry in missing_reason:
        print(f"checkov: baseline entry {entry['check']} on {entry['resource']} has no reason")
    if new or stale or missing_reason:
        return 1
    print(
        f"checkov: {len(found)} findings on {len(list((MANIFESTS / 'overlays').iterdir()))} overlays, each in the baseline"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
