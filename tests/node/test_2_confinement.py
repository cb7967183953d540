"""The agent's confinement, tried from inside the running agent container on the real node: each
attempt is a process exec'd into that container by containerd (`crictl exec`), so it runs with the
container's own seccomp filter (the shipped Localhost profile), capabilities (none), no_new_privs
and user (uid 64242), against a worker of another Pod (uid 65532, its own pid namespace).

docs/security.md's threat 8 says what each outcome is; this table is what the kernel answered.
"""

from __future__ import annotations

import pathlib
import uuid
from collections.abc import Iterator

import pytest

from coroner_dev import realnode
from coroner_dev.devcluster.cluster import Cluster
from support.attempts import ATTEMPTS
from support.nodes import NODE, container_id, crictl, host_pids, status_field, wait_for

pytestmark = pytest.mark.node

#: What each attempt (tests/support/attempts.py) meets on this machine's kernel (6.18, no AppArmor,
#: so components/agent-apparmor cannot be loaded), as docs/security.md (threat 8) says:
#: - the profile refuses ptrace, process_vm_readv, kill and tgkill (EPERM, before the kernel looks),
#:   and opening /proc/<pid>/mem for writing (openat is allowed read-only);
#: - opening /proc/<pid>/mem read-only, and reading another Pod's token through /proc/<pid>/root,
#:   are refused by the kernel (EACCES): the agent runs as a uid of its own with no capability, so
#:   it has no ptrace-mode access to any other user's process. (Under components/agent-ptrace, root
#:   with CAP_SYS_PTRACE, the token IS read: docs/security.md's accepted risk for that component.)
EXPECTED = {
    "ptrace-attach": "EPERM",
    "process_vm_readv": "EPERM",
    "kill": "EPERM",
    "tgkill": "EPERM",
    "proc-mem": "EACCES",
    "proc-mem-pread": "EACCES",
    "proc-mem-write": "EPERM",
    "proc-root-token": "EACCES",
}


@pytest.fixture(scope="module")
def victim(node_cluster: Cluster) -> Iterator[int]:
    """The host pid of a worker in a Pod of its own namespace (uid 65532), with its own token."""
    namespace = f"victim-{uuid.uuid4().hex[:6]}"
    realnode.kubectl(node_cluster, "create", "namespace", namespace)
    realnode.apply_objects(node_cluster, realnode.worker_rbac(namespace))
    marker = f"5{uuid.uuid4().int % 10**6}"
    pod = realnode.worker_pod("victim", namespace=namespace, node=NODE, cluster=node_cluster, command=["sleep", marker])
    realnode.apply_objects(node_cluster, [pod])
    try:
        (pid,) = wait_for(lambda: host_pids(marker), timeout=90, what="the victim worker's process")
        yield pid
    finally:
        realnode.kubectl(node_cluster, "delete", "namespace", namespace, "--wait=false", check=False)


@pytest.mark.parametrize("action", list(EXPECTED))
def test_an_attempt_from_inside_the_agent_container_meets_what_the_threat_model_says(
    node_cluster: Cluster, victim: int, action: str
) -> None:
    assert status_field(victim, "Uid").split()[0] == "65532"
    agent = container_id(node_cluster, NODE, name="agent", namespace="coroner-system")
    result = crictl(node_cluster, NODE, "exec", agent, "python3", "-c", ATTEMPTS, str(victim), action, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == EXPECTED[action], (action, result.stdout, result.stderr)


def test_the_attempts_run_with_the_agents_own_confinement(node_cluster: Cluster) -> None:
    """The exec'd probe is confined as the agent is (else the table above would prove nothing)."""
    agent = container_id(node_cluster, NODE, name="agent", namespace="coroner-system")
    result = crictl(
        node_cluster,
        NODE,
        "exec",
        agent,
        "python3",
        "-c",
        "import pathlib; print(pathlib.Path('/proc/self/status').read_text())",
    )
    fields = dict(line.split(":", 1) for line in result.stdout.splitlines() if ":" in line)
    assert fields["Seccomp"].strip() == "2"
    assert fields["NoNewPrivs"].strip() == "1"
    assert int(fields["CapEff"].strip(), 16) == 0
    assert fields["Uid"].split()[0] == "64242"
    assert pathlib.Path("/sys/kernel/security/apparmor").exists() is False
