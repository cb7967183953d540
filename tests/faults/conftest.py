"""One dedicated fault plane for tests/faults (a control plane of its own: its API server is restarted),
started for this package and stopped when its last test is done."""

from __future__ import annotations

import os
import pathlib
import resource
from collections.abc import Iterator

import pytest

from faults.plane import Plane


@pytest.fixture(scope="package")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    keep = os.environ.get("CORONER_FAULTS_CLUSTER_DIR")
    directory = pathlib.Path(keep) if keep else tmp_path_factory.mktemp("faults")
    started = Plane(directory, node_count=3, keep_cluster=bool(keep))
    try:
        yield started.start()
    finally:
        started.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
