"""An SBOM for each released image, by syft (Anchore's SBOM generator, github.com/anchore/syft).

Why syft: it reads an OCI archive as it is (no daemon, no registry) and catalogues both what the
images are made of, the Debian packages of the base (dpkg's database) and the Python packages
installed from the hashed locks (their dist-info), and writes SPDX 2.3 JSON; it is maintained, widely
used for container images and built here like helm: from its Go module through the module proxy, by
the helper module `testenv/sbom/` (its own go.mod, so its pins move no other cache key), cached under
`<cache>/sbom/`. CycloneDX's Python tool (cyclonedx-py) would see only the Python environment it runs
in or a requirements file, not an image's base.

Reproducible: syft writes the time of the scan (`creationInfo.created`) and a random UUID into the
document's namespace. Both are replaced here: the time by the release's SOURCE_DATE_EPOCH, the
namespace by one derived from the image's manifest digest (unique per image, as SPDX requires, and
the same for the same image). Everything else syft writes depends only on the archive.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from coroner_dev.devcluster import gobuild
from coroner_dev.devcluster.errors import DevClusterError

SYFT_VERSION = "v1.57.2"
NAMESPACE_BASE = "https://github.com/coroner-dev/coroner/spdx"


def syft_build() -> gobuild.GoBuild:
    """syft, built by the `testenv/sbom` module into `<cache>/sbom/`."""
    return gobuild.GoBuild(
        title="syft",
        module=gobuild.testenv_dir() / "sbom",
        packages={"syft": "github.com/anchore/syft/cmd/syft"},
        cache_dir="sbom",
        versions=f"syft-{SYFT_VERSION}",
        ldflags=f"-s -w -X main.version={SYFT_VERSION.removeprefix('v')}",
        announce=f"building syft {SYFT_VERSION} from Go modules; the first build takes 10-30 minutes on 2 cores",
        go_missing_fix="install Go >= 1.26 and put it on PATH, or set CORONER_SYFT_DIR to a directory holding syft",
        override="CORONER_SYFT_DIR",
    )


def ensure_syft(*, say: Callable[[str], None]) -> pathlib.Path:
    """The syft binary, built once."""
    directory, _ = gobuild.ensure(syft_build(), say=say)
    return directory / "syft"


def normalize(document: dict[str, Any], *, name: str, digest: str, epoch: int) -> dict[str, Any]:
    """SYFT's SPDX document with its two run-dependent fields made the image's own (module docstring)."""
    document["creationInfo"]["created"] = datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    document["documentNamespace"] = f"{NAMESPACE_BASE}/{name}/{digest.removeprefix('sha256:')}"
    return document


def write_sbom(
    syft: pathlib.Path, archive: pathlib.Path, output: pathlib.Path, *, name: str, version: str, digest: str, epoch: int
) -> None:
    """Scans the OCI archive ARCHIVE (the image NAME at VERSION, manifest DIGEST) into OUTPUT (SPDX JSON)."""
    env = {**os.environ, "SYFT_CHECK_FOR_APP_UPDATE": "false", "SYFT_PARALLELISM": "1"}
    command = [str(syft), "scan", f"oci-archive:{archive}", "-o", "spdx-json", "--quiet"]
    command += ["--source-name", name, "--source-version", version]
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise DevClusterError(
            f"syft scan of {archive} failed (exit {result.returncode}): {result.stderr.strip()[-1500:]}",
            fix="read the message; the archive must be an OCI archive (coroner dev-cluster images)",
        )
    document = normalize(json.loads(result.stdout), name=name, digest=digest, epoch=epoch)
    output.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    """`python -m coroner_dev.sbom`: builds syft if needed, prints its path."""
    del argv
    try:
        print(ensure_syft(say=lambda message: print(message, file=sys.stderr)))
    except DevClusterError as exc:
        print(f"{exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
