"""The confined agent (a compromised agent must not reach other processes): the real agent still attests under the seccomp profile the
manifests ship, and what that profile denies is refused.

The profile is manifests/base/agent-seccomp.json, the very file the DaemonSet's init container
installs for the kubelet; tests/support/seccomp_exec.py loads it with the system's libseccomp and
execs the command, as a container runtime does. The agent runs on the host (no container engine
here) with a node-bound token, watches real workers started with `coroner run`, and attests a
SIGKILLed one Dead by pidfd and a ProcAbsent one after its confirmation; its shutdown path runs too.

Measuring what the agent calls: `CORONER_AGENT_STRACE=/tmp/agent.strace pytest -k still_attests`
wraps both of the agent's runs in `strace -f -c -o /tmp/agent.strace.N` instead (unconfined), whose
tables docs/security.md quotes.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from coroner_dev.devcluster.cluster import Cluster
from support import components, kube
from support.fleet import Node, attestation, launch, worker_kubeconfig

pytestmark = pytest.mark.integration

PROFILE = kube.MANIFESTS / "base" / "agent-seccomp.json"
SECCOMP_EXEC = pathlib.Path(__file__).resolve().parents[1] / "support" / "seccomp_exec.py"
REAL_BOOT = pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip()
#: What the profile must deny: everything that reads or writes another process's memory or steals
#: its file descriptors: what a compromised agent would use against the workers it watches.
DENIED = ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "process_madvise")


def confined(argv: list[str]) -> list[str]:
    return [sys.executable, str(SECCOMP_EXEC), str(PROFILE), "--", *argv]


def profile() -> dict[str, object]:
    loaded: dict[str, object] = json.loads(PROFILE.read_text())
    return loaded


def test_the_profile_is_an_allowlist_that_names_none_of_the_denied_calls() -> None:
    data = profile()
    assert data["defaultAction"] == "SCMP_ACT_ERRNO"
    allowed = {n for rule in data["syscalls"] for n in rule["names"] if rule["action"] == "SCMP_ACT_ALLOW"}  # type: ignore[attr-defined]
    assert not allowed & set(DENIED), allowed & set(DENIED)
    assert {"pidfd_open", "openat", "read", "epoll_wait", "connect"} <= allowed


@pytest.fixture
def node(cluster: Cluster, tmp_path: pathlib.Path) -> Iterator[Node]:
    components.install(cluster, grant=False)
    made = Node(cluster, tmp_path, f"confined-{uuid.uuid4().hex[:6]}", REAL_BOOT)
    yield made
    made.stop_agent()


def test_the_real_agent_still_attests_under_the_profile(
    node: Node, cluster: Cluster, admin: k8s.ApiClient, namespace: str, tmp_path: pathlib.Path
) -> None:
    argv = components.agent_argv(
        node.kubeconfig, node=node.name, boot_id_file=node.boot_file,
        extra=("--resync-seconds=1", "--absence-confirm-seconds=1", "--shutdown-grace-seconds=2"),
    )  # fmt: skip
    measure = os.environ.get("CORONER_AGENT_STRACE")
    runs = iter(range(1, 3))

    def wrapped() -> list[str]:
        return ["strace", "-f", "-c", "-o", f"{measure}.{next(runs)}", *argv] if measure else confined(argv)

    worker_config = worker_kubeconfig(cluster, namespace)
    with open(node.log, "ab") as out:
        node.agent = subprocess.Popen(wrapped(), stdout=out, stderr=subprocess.STDOUT)
    killed = launch(namespace=namespace, kubeconfig=worker_config, directory=tmp_path, name="killed", node=node)
    vanished = launch(namespace=namespace, kubeconfig=worker_config, directory=tmp_path, name="vanished", node=node)
    for worker in (killed, vanished):
        kube.wait_for(
            lambda w=worker: attestation(admin, namespace, w.name).get("verdict") == "Alive",
            what=f"{worker.name} Alive",
        )
    killed.kill()
    kube.wait_for(lambda: attestation(admin, namespace, "killed").get("verdict") == "Dead", what="killed Dead")
    assert attestation(admin, namespace, "killed")["evidence"] == "PidfdExited"
    # Stop the agent, lose a worker while it is away, restart it: the death is read from /proc.
    stop(node.agent, measuring=bool(measure))
    child = pathlib.Path(f"/proc/{vanished.child}")
    vanished.vanish()
    # The orphaned worker is reaped by whoever adopts it; until then a new agent could still pin it.
    kube.wait_for(lambda: not child.exists(), what="the vanished worker reaped")
    with open(node.log, "ab") as out:
        node.agent = subprocess.Popen(wrapped(), stdout=out, stderr=subprocess.STDOUT)
    kube.wait_for(lambda: attestation(admin, namespace, "vanished").get("verdict") == "Dead", what="vanished Dead")
    assert attestation(admin, namespace, "vanished")["evidence"] == "ProcAbsent"
    assert stop(node.agent, measuring=bool(measure)) == 0, node.log.read_text()[-3000:]
    node.agent = None


def stop(proc: subprocess.Popen[bytes], *, measuring: bool) -> int:
    """SIGTERM the agent itself (under strace, its tracee: strace would detach and leave it running)."""
    pid = proc.pid
    if measuring:
        pid = int(pathlib.Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
    os.kill(pid, signal.SIGTERM)
    return proc.wait(timeout=30)


#: Each denied action, tried on a live process of another user: (name, snippet). The snippet prints
#: the errno the call failed with, or "ok".
PROBE = r"""
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
target = int(sys.argv[1])
action = sys.argv[2]

def report(result):
    print("ok" if result >= 0 else errno.errorcode[ctypes.get_errno()])

if action == "ptrace-attach":
    report(libc.ptrace(16, target, 0, 0))  # PTRACE_ATTACH
elif action == "process_vm_readv":
    class iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
    buffer = ctypes.create_string_buffer(8)
    local = iovec(ctypes.cast(buffer, ctypes.c_void_p), 8)
    with open(f"/proc/{target}/maps") as maps:
        start = int(maps.readline().split("-")[0], 16)
    remote = iovec(start, 8)
    report(libc.syscall(310, target, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0))
elif action == "pidfd_getfd":
    pidfd = libc.syscall(434, target, 0)  # pidfd_open: the agent's own call, allowed
    if pidfd < 0:
        report(pidfd)
    else:
        report(libc.syscall(438, pidfd, 0, 0))  # pidfd_getfd(pidfd, 0, 0)
elif action == "kcmp":
    report(libc.syscall(312, os.getpid(), target, 0, 0, 0))  # KCMP_FILE
elif action == "proc-mem":
    try:
        with open(f"/proc/{target}/mem", "rb") as mem:
            print("ok")
    except OSError as exc:
        print(errno.errorcode[exc.errno])
"""


@pytest.fixture
def victim() -> Iterator[int]:
    """A process of another user (nobody), as a worker of another pod would be."""
    if os.geteuid() != 0:
        pytest.skip("needs root (the agent runs as root with CAP_SYS_PTRACE)")
    proc = subprocess.Popen(["sleep", "300"], user=65534, group=65534)
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("action", ["ptrace-attach", "process_vm_readv", "pidfd_getfd", "kcmp"])
def test_each_denied_action_is_refused_under_the_profile(victim: int, action: str) -> None:
    # Without the profile root does it (this is what the attacker did)...
    unconfined = subprocess.run([sys.executable, "-c", PROBE, str(victim), action], capture_output=True, text=True)
    assert unconfined.stdout.strip() == "ok", unconfined
    # ...under it the kernel refuses with EPERM, before any permission check.
    held = subprocess.run(confined([sys.executable, "-c", PROBE, str(victim), action]), capture_output=True, text=True)
    assert held.stdout.strip() == "EPERM", held


def test_what_seccomp_cannot_see_is_the_apparmor_profiles_part() -> None:
    """Paths (/proc/<pid>/root, cwd, mem, environ, map_files) are not syscalls: the AppArmor profile
    denies them, and only a kernel with AppArmor can show it. Here the profile is checked for the
    rules; on a node with AppArmor, `aa-exec -p coroner-agent cat /proc/1/root/etc/shadow` fails."""
    text = (kube.MANIFESTS / "components" / "agent-apparmor" / "coroner-agent.apparmor").read_text()
    for entry in ("root", "cwd", "mem", "environ", "map_files"):
        assert entry in text.split("deny /proc/*/{", 1)[1].split("}", 1)[0]
    assert "ptrace (read)" in text and "deny ptrace (trace" in text
    if not pathlib.Path("/sys/kernel/security/apparmor").exists():
        return
    if shutil.which("aa-exec") is None:
        return
    # With AppArmor and the profile loaded, the denied path is refused (EACCES).
    result = subprocess.run(["aa-exec", "-p", "coroner-agent", "cat", "/proc/1/root/etc/hostname"], check=False)
    assert result.returncode != 0
