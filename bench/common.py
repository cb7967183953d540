"""The benchmarks' harness is the package `harness` (bench/harness/); bench/faults.py still reads
its machine facts and versions under this name."""

from __future__ import annotations

from harness.machine import machine_info as machine_info
from harness.machine import versions as versions
