"""Every benchmark once, at its smallest size: that each still starts, runs and writes its result
(`make bench-quick`, part of `make check`). The numbers of such runs mean nothing; they are written
to a temporary directory, never over the recorded results in bench/results.

    .venv/bin/python bench/quick.py [--out DIR] [--only latency,steady]

The benchmarks that take `--out` write there directly; the others write bench/results/NAME.* for
the `--name` given (`quick-<benchmark>`), which this moves into DIR as soon as the run ends.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

BENCH = pathlib.Path(__file__).resolve().parent
RESULTS = BENCH / "results"

#: Each benchmark's arguments at its smallest size ("{out}": the output directory). Scripts of
#: bench/ that are not benchmarks: this driver and report.py (it renders the recorded results).
BENCHMARKS: dict[str, list[str]] = {
    "sim": ["--trials", "400", "--chunk", "200", "--no-mutants", "--out", "{out}/sim.json"],
    "faults": ["--trials", "2", "--seed", "1", "--lanes", "1", "--out", "{out}/faults.json"],
    "attestation": ["--workers", "40", "--kills", "10", "--name", "quick-attestation"],
    "latency": [
        "--workers", "40", "--kills", "10", "--nodes", "2", "--kill-window", "5",
        "--heartbeat-seconds", "2", "--ttl", "6", "--sweep-seconds", "2", "--resync-seconds", "2",
        "--name", "quick-latency",
    ],
    "massdeath": [
        "--workers", "60", "--killed", "40", "--nodes", "2", "--lost-nodes", "1", "--timeout", "180",
        "--name", "quick-massdeath",
    ],
    "patchcost": ["--objects", "50", "--name", "quick-patchcost"],
    "steady": [
        "--registrations", "200", "--agent-workers", "20", "--nodes", "2", "--namespaces", "2",
        "--warmup-seconds", "5", "--window", "20", "--idle-seconds", "5", "--name", "quick-steady",
    ],
    "realnode": ["--workers", "20", "--kills", "5", "--kill-window", "5", "--no-host", "--name", "quick-realnode"],
    "images": ["--runs", "1", "--name", "quick-images"],
    "imagefree": [
        "--starts", "6", "--parallelism", "2", "--steady-seconds", "5", "--kill-pods", "1", "--kill-rounds", "1",
        "--kill-window", "3", "--name", "quick-imagefree",
    ],
    "karpenter": ["--disruptions", "1", "--expire-after", "30s", "--name", "quick-karpenter"],
}  # fmt: skip
NOT_BENCHMARKS = frozenset({"quick", "report"})


def run(name: str, out: pathlib.Path) -> float:
    """Runs one benchmark; returns its seconds. Raises CalledProcessError when it fails."""
    argv = [arg.replace("{out}", str(out)) for arg in BENCHMARKS[name]]
    started = time.monotonic()
    try:
        subprocess.run([sys.executable, str(BENCH / f"{name}.py"), *argv], check=True)
    finally:
        for written in RESULTS.glob(f"quick-{name}.*"):
            shutil.move(str(written), out / written.name)
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=None, help="default: a new temporary directory")
    parser.add_argument("--only", default=",".join(BENCHMARKS), help="comma-separated subset")
    args = parser.parse_args(argv)
    out = args.out or pathlib.Path(tempfile.mkdtemp(prefix="coroner-bench-quick-"))
    out.mkdir(parents=True, exist_ok=True)
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"no such benchmark: {', '.join(unknown)}")
    seconds: dict[str, float] = {}
    failed: list[str] = []
    for name in names:
        print(f"bench-quick: {name} ...", flush=True)
        try:
            seconds[name] = run(name, out)
        except subprocess.CalledProcessError as exc:
            failed.append(f"{name} (exit status {exc.returncode})")
    for name, took in seconds.items():
        print(f"bench-quick: {name} ran in {took:.0f} s")
    print(f"bench-quick: results in {out}")
    if failed:
        print(f"bench-quick: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
