"""The machine a benchmark runs on: facts about the run (machine, versions, command line), the
log line, file limits and ports, the processes' parent-death signal, and what the machine did
meanwhile (load, per-process samples, py-spy profiles)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import platform
import resource
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import psutil

from coroner.core import api
from coroner_dev.devcluster import binaries as binaries_mod

if TYPE_CHECKING:
    from harness.cluster import Bench

REPO = pathlib.Path(__file__).resolve().parents[2]
#: Where results go; CORONER_BENCH_RESULTS redirects a quick run (a check, a trial) away from the
#: committed results.
RESULTS = pathlib.Path(os.environ.get("CORONER_BENCH_RESULTS") or REPO / "bench" / "results")


def shown(path: pathlib.Path) -> str:
    """`path` relative to the repository where it is inside it (results, profiles), else as is."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


MANIFESTS = REPO / "manifests"
BIN = pathlib.Path(sys.executable).parent
REAL_BOOT_ID_FILE = pathlib.Path("/proc/sys/kernel/random/boot_id")
SYSTEM = api.SYSTEM_NAMESPACE
SHARED_MACHINE_NOTE = (
    "measured on a shared 2-core machine: other sessions' tests may have run concurrently, and the "
    "control plane, Coroner's processes, the workers and the benchmark itself all share those 2 cores"
)


def log(message: str) -> None:
    stamp = time.strftime("%H:%M:%S")
    print(f"[{stamp}] {message}", file=sys.stderr, flush=True)


# --- facts about the run -------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    cpu_model = "unknown"
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    return {
        "cpu_model": cpu_model,
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "note": SHARED_MACHINE_NOTE,
    }


def git_commit() -> dict[str, Any]:
    def git(*args: str) -> str:
        result = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30, check=False)
        return result.stdout.strip()

    commit = git("rev-parse", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return {"commit": commit or "unknown", "dirty": dirty}


def versions() -> dict[str, Any]:
    import importlib.metadata as md

    found = {}
    for package in ("kube-coroner", "kopf", "kubernetes", "psutil"):
        with contextlib.suppress(md.PackageNotFoundError):
            found[package] = md.version(package)
    return {
        "kubernetes_control_plane": binaries_mod.K8S_VERSION,
        "etcd": binaries_mod.ETCD_VERSION,
        "git": git_commit(),
        "packages": found,
    }


#: Environment variables that change what a run measures (the Go runtime's of the control plane
#: the benchmark starts), written in front of the command as they were set.
_MEASURED_ENV = ("GOMEMLIMIT", "GOGC")


def command_line() -> str:
    env = [f"{name}={os.environ[name]}" for name in _MEASURED_ENV if name in os.environ]
    argv = shlex.join(
        [os.path.relpath(sys.executable, REPO) if sys.executable.startswith(str(REPO)) else sys.executable, *sys.argv]
    )
    return " ".join([*env, argv])


def raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 65536
    if target > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tail(path: pathlib.Path, lines: int = 20) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:])
    except OSError:
        return "(no log)"


# --- what the machine did meanwhile ------------------------------------------------------------------


class Sampler:
    """psutil samples (rss, cpu seconds, fds) of some pids, every `period` seconds, in a thread."""

    def __init__(self, pids: dict[str, int], *, period: float = 1.0, max_seconds: float = 3600) -> None:
        self.procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.period = period
        self.deadline = time.monotonic() + max_seconds
        self.samples: dict[str, list[tuple[float, float, float, int]]] = {name: [] for name in pids}
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def start(self) -> Sampler:
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set() and time.monotonic() < self.deadline:
            now = time.monotonic()
            for name, proc in self.procs.items():
                with contextlib.suppress(psutil.Error), proc.oneshot():
                    times = proc.cpu_times()
                    self.samples[name].append(
                        (now, proc.memory_info().rss / 2**20, times.user + times.system, proc.num_fds())
                    )
            self._stop.wait(self.period)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=10)


class LoadMonitor:
    """How busy the shared machine was: load average, and CPU used by this benchmark's process tree
    (the benchmark, the control plane, Coroner, the workers) versus everything else on the machine
    (other sessions' work). Sampled every `period` seconds in a thread."""

    def __init__(self, *, period: float = 5.0, max_seconds: float = 4 * 3600) -> None:
        self.period = period
        self.deadline = time.monotonic() + max_seconds
        self.me = psutil.Process()
        self.samples: list[tuple[float, float, float, float]] = []  # t, load1, machine busy cores, ours cores
        self._stop = threading.Event()
        self._ours: dict[int, float] = {}
        self.thread = threading.Thread(target=self._run, name="load-monitor", daemon=True)

    def start(self) -> LoadMonitor:
        self.thread.start()
        return self

    def _ours_seconds(self) -> float:
        procs = [self.me]
        with contextlib.suppress(psutil.Error):
            procs += self.me.children(recursive=True)
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                # A process that exits keeps its last reading here (its last seconds go uncounted).
                self._ours[proc.pid] = times.user + times.system
        return sum(self._ours.values())

    def _run(self) -> None:
        last_t, last_busy, last_ours = time.monotonic(), _busy_seconds(), self._ours_seconds()
        while not self._stop.wait(self.period) and time.monotonic() < self.deadline:
            now, busy, ours = time.monotonic(), _busy_seconds(), self._ours_seconds()
            dt = now - last_t
            self.samples.append((now, os.getloadavg()[0], (busy - last_busy) / dt, max(0.0, (ours - last_ours) / dt)))
            last_t, last_busy, last_ours = now, busy, ours

    def summary(self) -> dict[str, Any]:
        self._stop.set()
        self.thread.join(timeout=10)
        if not self.samples:
            return {}
        loads = [s[1] for s in self.samples]
        busy = [s[2] for s in self.samples]
        ours = [s[3] for s in self.samples]
        other = [max(0.0, b - o) for b, o in zip(busy, ours, strict=True)]
        return {
            "load_average_1m": {
                "min": round(min(loads), 2),
                "mean": round(statistics.fmean(loads), 2),
                "max": round(max(loads), 2),
            },
            "machine_busy_cores_mean": round(statistics.fmean(busy), 2),
            "this_benchmark_cores_mean": round(statistics.fmean(ours), 2),
            "other_work_cores_mean": round(statistics.fmean(other), 2),
            "other_work_cores_max": round(max(other), 2),
            "how": f"sampled every {self.period:g} s over the whole run: machine busy time from /proc/stat; this "
            "benchmark = its own process tree (control plane, Coroner, workers, benchmark); other = the rest",
        }


def _busy_seconds() -> float:
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


class Profile:
    """py-spy sampling one process (raw collapsed stacks) for a fixed time, in the background."""

    def __init__(self, bench: Bench, pid: int, *, name: str, seconds: float) -> None:
        RESULTS.mkdir(parents=True, exist_ok=True)
        self.path = RESULTS / f"{name}.pyspy.txt"
        self.seconds = seconds
        self.proc = subprocess.Popen(
            [
                str(BIN / "py-spy"),
                "record",
                "--format",
                "raw",
                "--nonblocking",
                "--rate",
                "50",
                "--output",
                str(self.path),
                "--pid",
                str(pid),
                "--duration",
                str(max(1, int(seconds))),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        bench.on_close(self.wait)

    def wait(self) -> None:
        try:
            self.proc.wait(timeout=self.seconds + 30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def summary(self) -> dict[str, Any]:
        self.wait()
        return {"file": str(shown(self.path)), **top_frames(self.path)}


def py_spy(bench: Bench, pid: int, *, name: str, seconds: float) -> Profile | None:
    """Starts py-spy on `pid` for `seconds` (None, with a message, when py-spy is not installed)."""
    if not (BIN / "py-spy").exists():
        log("py-spy is not installed: no profile (install it with `.venv/bin/pip install py-spy`)")
        return None
    return Profile(bench, pid, name=name, seconds=seconds)


def top_frames(path: pathlib.Path, *, limit: int = 15) -> dict[str, Any]:
    """From py-spy's raw output: the share of samples in which each function appears (inclusive)
    and is the innermost frame (self), top `limit` of each."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        stack, _, count_text = line.rpartition(" ")
        try:
            count = int(count_text)
        except ValueError:
            continue
        frames = [
            f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0].rsplit("/", 1)[-1] + ")" if " (" in f else f
            for f in stack.split(";")[1:]
        ]  # first frame is the thread
        total += count
        for frame in set(frames):
            inclusive[frame] += count
        if frames:
            own[frames[-1]] += count
    if not total:
        return {}
    return {
        "samples": total,
        "inclusive_percent": {k: round(100 * v / total, 1) for k, v in inclusive.most_common(limit)},
        "self_percent": {k: round(100 * v / total, 1) for k, v in own.most_common(limit)},
    }


def timed_child(argv: list[str]) -> tuple[float | None, float | None]:
    """Runs `argv` (output discarded): its wall seconds and its own peak RSS (MiB).

    The peak is the child's VmHWM, read from /proc while it runs (its last reading). Not wait4's
    ru_maxrss: Linux carries the high-water mark of the memory a process had before exec into the
    program it execs, and a child of this process starts in this process's memory (vfork), so
    ru_maxrss says the benchmark's own peak (bench/steady.py holds every registration's body),
    whatever the child used."""
    t0 = time.monotonic()
    peak_kib = 0
    with subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        status = pathlib.Path(f"/proc/{proc.pid}/status")
        while True:
            with contextlib.suppress(OSError, ValueError):  # between its exit and its reaping
                for line in status.read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        peak_kib = max(peak_kib, int(line.split()[1]))
            try:
                proc.wait(timeout=0.02)
                break
            except subprocess.TimeoutExpired:
                continue
        seconds = round(time.monotonic() - t0, 2)
        if proc.returncode != 0:
            error = proc.stderr.read().decode(errors="replace")[-500:] if proc.stderr else ""
            log(f"{argv[0]} failed ({proc.returncode}): {error}")
            return None, None
    return seconds, round(peak_kib / 1024, 1)
