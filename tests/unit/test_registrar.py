"""The registrar's pure parts: which container a process is in, which process is a container's main
one, and what an exit status says; tables, then properties. Against real processes and the real API
server: tests/integration/test_registrar.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coroner.registrar import Seen, container_of, mains, registration_name

pytestmark = pytest.mark.unit

CID = "3f9c0d1e2b4a59687766554433221100ffeeddccbbaa99887766554433221100"
OTHER = "a" * 64


@pytest.mark.parametrize(
    ("cgroup", "container"),
    [
        pytest.param(f"0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-{CID}.scope\n", CID, id="v2-systemd"),
        pytest.param(f"0::/kubepods/besteffort/pod1234/{CID}\n", CID, id="v2-cgroupfs"),
        pytest.param(
            f"12:pids:/kubepods/pod1/{CID}\n4:memory:/kubepods/pod1/{CID}\n1:name=systemd:/\n0::/\n", CID, id="v1"
        ),
        pytest.param(f"4:memory:/a/b/crio-{CID}.scope\n0::/\n", CID, id="v1-crio"),
        pytest.param("0::/\n", None, id="host-root"),
        pytest.param("0::/user.slice/session-3.scope\n", None, id="not-a-container"),
        pytest.param("", None, id="empty"),
        pytest.param("garbage", None, id="garbage"),
    ],
)
def test_the_container_of_a_process_is_its_cgroup_leaf(cgroup: str, container: str | None) -> None:
    assert container_of(cgroup) == container


def seen(pid: int, *, ppid: int = 0, depth: int = 1, start: int = 100, container: str | None = CID) -> Seen:
    return Seen(pid=pid, ppid=ppid, depth=depth, start_time=start, container=container)


OWN = "b" * 64


@pytest.mark.parametrize(
    ("processes", "expected"),
    [
        pytest.param([seen(1, container=None), seen(7)], {CID: 7}, id="one-container"),
        pytest.param([seen(7), seen(9, start=300)], {CID: 7}, id="a-later-exec-is-not-the-main-process"),
        pytest.param([seen(9, start=100), seen(7, start=100)], {CID: 7}, id="same-tick-lowest-pid"),
        pytest.param([seen(7), seen(8, ppid=7)], {CID: 7}, id="its-children-are-not-main"),
        pytest.param([seen(7, container=OTHER), seen(8)], {OTHER: 7, CID: 8}, id="two-containers"),
        pytest.param([seen(5, container=OWN), seen(6, container=OWN)], {}, id="the-registrars-own-container"),
        pytest.param([seen(7, depth=2)], {}, id="a-nested-pid-namespace"),
        pytest.param([seen(7, container=None)], {}, id="unknown-container"),
        pytest.param([seen(1, container=CID)], {}, id="pid-1-is-the-sandbox"),
    ],
)
def test_the_main_process_of_each_container(processes: list[Seen], expected: dict[str, int]) -> None:
    own = seen(5, container=OWN)
    found = mains([own, *processes], own_pid=5)
    assert {container: process.pid for container, process in found.items()} == expected


@st.composite
def pods(draw: st.DrawFn) -> tuple[list[Seen], int]:
    containers = draw(st.lists(st.sampled_from([CID, OTHER, OWN, None]), min_size=1, max_size=12))
    processes = [
        seen(
            pid,
            ppid=draw(st.sampled_from([0, 0, 1, 2])),
            depth=draw(st.sampled_from([1, 1, 2])),
            start=draw(st.integers(0, 5)),
            container=container,
        )
        for pid, container in enumerate(containers, start=1)
    ]
    return processes, draw(st.integers(1, len(processes)))


@given(pod=pods())
@settings(max_examples=300)
def test_one_main_process_per_container_the_first_the_runtime_started(pod: tuple[list[Seen], int]) -> None:
    processes, own_pid = pod
    own = next(p.container for p in processes if p.pid == own_pid)
    found = mains(processes, own_pid=own_pid)
    for container, main in found.items():
        assert main.container == container and container is not None and container != own
        assert main.pid not in (1, own_pid) and main.ppid == 0 and main.depth == 1
        candidates = [p for p in processes if p.container == container and p.ppid == 0 and p.depth == 1 and p.pid != 1]
        assert (main.start_time, main.pid) == min((p.start_time, p.pid) for p in candidates)
    started = {p.container for p in processes if p.ppid == 0 and p.depth == 1 and p.pid not in (1, own_pid)}
    assert set(found) == started - {None, own}


def test_a_registration_name_is_one_per_incarnation_and_a_valid_name() -> None:
    name = registration_name(pod_name="api-7d9f8-x2x4q", container=CID, start_time=123456)
    assert name == f"api-7d9f8-x2x4q-{CID[:12]}-123456"
    assert len(registration_name(pod_name="p" * 253, container=CID, start_time=2**63)) <= 253
