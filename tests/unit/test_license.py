"""The license: LICENSE is the Apache License 2.0 as the ASF publishes it, with the appendix's
copyright line filled in, and the package metadata says the same."""

from __future__ import annotations

import hashlib
import pathlib
import tomllib

import pytest

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[2]

#: sha256 of https://www.apache.org/licenses/LICENSE-2.0.txt (also Debian's /usr/share/common-licenses/Apache-2.0).
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
PLACEHOLDER = "   Copyright [yyyy] [name of copyright owner]\n"
COPYRIGHT = "   Copyright 2026 The Coroner Authors\n"


def test_license_is_apache_2_0_verbatim_but_the_copyright_line() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.count(COPYRIGHT) == 1
    assert hashlib.sha256(text.replace(COPYRIGHT, PLACEHOLDER).encode()).hexdigest() == APACHE_2_0_SHA256


def test_the_package_metadata_names_it() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    assert not [c for c in project.get("classifiers", []) if c.startswith("License ::")]  # PEP 639: one place
