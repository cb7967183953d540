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

import base64
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
import yaml
from kubernetes import client as k8s

from coroner_dev.devcluster.cluster import Cluster
from support import components, kube
from support.attempts import ATTEMPTS
from support.fleet import Node, attestation, launch, worker_kubeconfig

pytestmark = pytest.mark.integration

PROFILE = kube.MANIFESTS / "base" / "agent-seccomp.json"
SECCOMP_EXEC = pathlib.Path(__file__).resolve().parents[1] / "support" / "seccomp_exec.py"
REAL_BOOT = pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip()
#: What the profile must deny: everything that reads or writes another process's memory or steals
#: its file descriptors: what a compromised agent would use against the workers it watches.
DENIED = ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "process_madvise")


#: The shipped agent's uid and gid (manifests/base/agent.yaml), with no capability.
AGENT_UID = 64242
AS_THE_AGENT = ["setpriv", f"--reuid={AGENT_UID}", f"--regid={AGENT_UID}", "--clear-groups", "--inh-caps=-all",
                "--bounding-set=-all"]  # fmt: skip


def confined(argv: list[str]) -> list[str]:
    """Under the profile, as root: what components/agent-ptrace's agent (root with ptrace access)
    meets, so each bound the profile keeps is shown where the kernel would allow the call."""
    return [sys.executable, str(SECCOMP_EXEC), str(PROFILE), "--", *argv]


def readable_by_the_agent(kubeconfig: pathlib.Path, boot_file: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """Copies the agent's uid can read (pytest's own directories are root's alone); the kubeconfig's
    files (the CA, a client certificate) are inlined as its `-data` fields."""
    directory = pathlib.Path(f"/tmp/coroner-agent-{uuid.uuid4().hex[:8]}")
    directory.mkdir(mode=0o755)
    config = yaml.safe_load(kubeconfig.read_text())
    for entry, field in [(c["cluster"], "certificate-authority") for c in config.get("clusters", [])] + [
        (u["user"], name) for u in config.get("users", []) for name in ("client-certificate", "client-key")
    ]:
        if field in entry:
            path = pathlib.Path(entry.pop(field))
            entry[f"{field}-data"] = base64.b64encode(path.read_bytes()).decode()
    copies = (directory / kubeconfig.name, directory / boot_file.name)
    copies[0].write_text(yaml.safe_dump(config))
    shutil.copyfile(boot_file, copies[1])
    for copy in copies:
        copy.chmod(0o644)
    return copies


def profile() -> dict[str, object]:
    loaded: dict[str, object] = json.loads(PROFILE.read_text())
    return loaded


def test_the_profile_is_an_allowlist_that_names_none_of_the_denied_calls() -> None:
    data = profile()
    assert data["defaultAction"] == "SCMP_ACT_ERRNO"
    allowed = {n for rule in data["syscalls"] for n in rule["names"] if rule["action"] == "SCMP_ACT_ALLOW"}  # type: ignore[attr-defined]
    assert not allowed & set(DENIED), allowed & set(DENIED)
    assert {"pidfd_open", "openat", "read", "epoll_wait", "connect"} <= allowed


def test_what_reaches_another_process_memory_is_allowed_only_with_its_arguments_bounded() -> None:
    """openat without O_RDWR, O_CREAT or O_TRUNC (O_WRONLY stays: runc reopens its exec fifo for
    writing after it loaded the filter); lseek and pread64 only below 4096, where mmap_min_addr
    leaves every process unmapped, so no read or write lands on a mapping; no pwrite, no vectored or
    spliced I/O with offsets, no signal to a thread."""
    rules = profile()["syscalls"]
    unconditional = {
        n for rule in rules for n in rule["names"] if rule["action"] == "SCMP_ACT_ALLOW" and not rule.get("args")
    }  # type: ignore[attr-defined]
    bounded = {
        "openat": [[{"index": 2, "value": 0o1102, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]],
        "lseek": [
            [{"index": 1, "value": 0, "valueTwo": 0, "op": "SCMP_CMP_EQ"}],
            [
                {"index": 1, "value": 4096, "valueTwo": 0, "op": "SCMP_CMP_LT"},
                {"index": 2, "value": 0, "valueTwo": 0, "op": "SCMP_CMP_EQ"},
            ],
        ],
        "pread64": [[{"index": 3, "value": 4096, "valueTwo": 0, "op": "SCMP_CMP_LT"}]],
    }
    for name, expected in bounded.items():
        assert name not in unconditional
        got = [rule["args"] for rule in rules if rule["action"] == "SCMP_ACT_ALLOW" and name in rule["names"]]  # type: ignore[index]
        assert got == expected, name
    never = {"open", "openat2", "pwrite64", "preadv", "preadv2", "pwritev", "pwritev2", "sendfile", "splice",
             "copy_file_range", "tgkill", "tkill", "rt_tgsigqueueinfo", "io_uring_setup"}  # fmt: skip
    allowed = {n for rule in rules for n in rule["names"] if rule["action"] == "SCMP_ACT_ALLOW"}  # type: ignore[attr-defined]
    assert not allowed & never, allowed & never


@pytest.fixture
def node(cluster: Cluster, tmp_path: pathlib.Path) -> Iterator[Node]:
    components.install(cluster, grant=False)
    made = Node(cluster, tmp_path, f"confined-{uuid.uuid4().hex[:6]}", REAL_BOOT)
    yield made
    made.stop_agent()
    kube.kubectl(cluster, "delete", "node", made.name, "--ignore-not-found")


def test_the_real_agent_still_attests_under_the_profile(
    node: Node, cluster: Cluster, admin: k8s.ApiClient, namespace: str, tmp_path: pathlib.Path
) -> None:
    kubeconfig, boot_file = readable_by_the_agent(pathlib.Path(node.kubeconfig), pathlib.Path(node.boot_file))
    argv = components.agent_argv(
        kubeconfig, node=node.name, boot_id_file=boot_file,
        extra=("--resync-seconds=1", "--absence-confirm-seconds=1", "--shutdown-grace-seconds=2"),
    )  # fmt: skip
    measure = os.environ.get("CORONER_AGENT_STRACE")
    runs = iter(range(1, 3))

    def wrapped() -> list[str]:
        return (
            ["strace", "-f", "-c", "-o", f"{measure}.{next(runs)}", *argv]
            if measure
            else [*AS_THE_AGENT, *confined(argv)]
        )

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


@pytest.fixture
def victim() -> Iterator[int]:
    """A process of another user (nobody), as a worker of another pod would be."""
    if os.geteuid() != 0:
        pytest.skip("needs root (to start a victim of another user, and the agent as components/agent-ptrace runs it)")
    proc = subprocess.Popen(["sleep", "300"], user=65534, group=65534)
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


#: Each attempt of tests/support/attempts.py the profile itself must refuse. The /proc/<pid>/mem
#: ones: an open stays allowed (the agent reads /proc), but no call can place a read or a write at a
#: mapped address (lseek and pread64 only below mmap_min_addr, no pwrite), and nothing opens for
#: reading and writing at once; the signals: kill, tgkill (the agent signals no process, not even itself).
REFUSED_BY_THE_PROFILE = (
    "ptrace-attach",
    "process_vm_readv",
    "pidfd_getfd",
    "kcmp",
    "proc-mem",
    "proc-mem-pread",
    "proc-mem-write",
    "proc-mem-pwrite",
    "kill",
    "tgkill",
)


@pytest.mark.parametrize("action", REFUSED_BY_THE_PROFILE)
def test_each_denied_action_is_refused_under_the_profile(victim: int, action: str) -> None:
    # Without the profile root does it (this is what the attacker did)...
    unconfined = subprocess.run([sys.executable, "-c", ATTEMPTS, str(victim), action], capture_output=True, text=True)
    assert unconfined.stdout.strip() == "ok", unconfined
    # ...under it the filter refuses with EPERM, before any permission check of the kernel's.
    held = subprocess.run(
        confined([sys.executable, "-c", ATTEMPTS, str(victim), action]), capture_output=True, text=True
    )
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
