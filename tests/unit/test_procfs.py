"""Parsing /proc texts: exact on what the kernel prints, ParseError on anything else, never a guess.

Tables of kernel-shaped texts first (including the comm field's traps: parentheses, spaces and
newlines inside it), then properties: any comm round-trips, and no input — arbitrary text, bytes
or mutations of real texts — makes a parser raise anything but ParseError.
"""

from __future__ import annotations

import ast
import contextlib
import pathlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coroner.core import api, procfs
from coroner.core.procfs import IncarnationKey, ParseError

pytestmark = pytest.mark.unit

ROOT_NS = api.ROOT_PID_NAMESPACE_INODE
CHILD_NS = 4026532178
BOOT = "6af8093f-1f8e-4864-bd25-cc70d02449a1"
MACHINE = "3d1219c7c4c5404aaa1f6d2a48adfda4"


def stat_text(
    *, pid: int = 4242, comm: str = "sleep", state: str = "S", ppid: int = 1, threads: int = 1, start: int = 123456
) -> str:
    """A `stat` line as Linux 6.x prints it (52 fields)."""
    after = [state, str(ppid), "4242", "4242", "0", "-1", "4194304", "86", "0", "0", "0", "0", "0", "0", "0", "20", "0"]
    after += [str(threads), "0", str(start), "2383872", "256"]
    after += ["18446744073709551615", "1", "1", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0", "17", "3"]
    after += ["0", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0"]
    return f"{pid} ({comm}) {' '.join(after)}\n"


def status_text(
    *, pid: int = 4242, tgid: int | None = None, state: str = "S (sleeping)", threads: int = 1, nspid: str | None = None
) -> str:
    """A `status` file as Linux 6.x prints it (trimmed of lines the parser does not need)."""
    lines = [
        "Name:\tsleep",
        "Umask:\t0022",
        f"State:\t{state}",
        f"Tgid:\t{tgid or pid}",
        "Ngid:\t0",
        f"Pid:\t{pid}",
        "PPid:\t1",
        "TracerPid:\t0",
        "Uid:\t0\t0\t0\t0",
        "FDSize:\t64",
        "Groups:\t",
        f"NStgid:\t{nspid or pid}",
        f"NSpid:\t{nspid or pid}",
        f"NSpgid:\t{pid}",
        f"NSsid:\t{pid}",
        "Kthread:\t0",
        "VmPeak:\t    8264 kB",
        f"Threads:\t{threads}",
        "SigQ:\t0/15472",
        "Cpus_allowed_list:\t0-1",
        "voluntary_ctxt_switches:\t1",
    ]
    return "\n".join(lines) + "\n"


# --- stat --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("comm", "state", "start"),
    [
        pytest.param("sleep", "S", 123456, id="plain"),
        pytest.param("", "R", 0, id="empty-comm-start-0"),
        pytest.param("a b c", "S", 1, id="spaces"),
        pytest.param("x) Z 1 2 3 (y", "S", 77, id="fake-fields-inside-comm"),
        pytest.param(")))", "Z", 9, id="only-closing-parens"),
        pytest.param("(((", "D", 9, id="only-opening-parens"),
        pytest.param("new\nline", "T", 42, id="newline"),
        pytest.param("kworker/u8:0-events_unbound", "I", 5, id="long-kernel-thread-name"),
        pytest.param("caf\udcc3", "S", 5, id="undecodable-byte"),
        pytest.param("a", "S", 2**64 - 1, id="start-u64-max"),
    ],
)
def test_stat_parses_after_the_last_paren(comm: str, state: str, start: int) -> None:
    parsed = procfs.parse_stat(stat_text(comm=comm, state=state, start=start, threads=3))
    assert (parsed.pid, parsed.comm, parsed.state, parsed.start_time, parsed.num_threads) == (
        4242,
        comm,
        state,
        start,
        3,
    )


def test_stat_accepts_bytes_with_any_comm_byte() -> None:
    raw = stat_text(comm="x").replace("(x)", "(\xff)").encode("latin-1")
    assert procfs.parse_stat(raw).start_time == 123456


def test_stat_of_this_kernel_parses() -> None:
    # The real thing, from the test process itself: the table above must match what the kernel prints.
    text = pathlib.Path("/proc/self/stat").read_bytes()
    assert procfs.parse_stat(text).pid > 0


GOOD = stat_text()


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("4242 sleep S 1", id="no-parens"),
        pytest.param("4242 (sleep S 1 2 3", id="no-closing-paren"),
        pytest.param(" 4242 (sleep) S", id="leading-space"),
        pytest.param("-1 (sleep) " + GOOD.split(") ", 1)[1], id="negative-pid"),
        pytest.param("0 (sleep) " + GOOD.split(") ", 1)[1], id="pid-0"),
        pytest.param("4194305 (sleep) " + GOOD.split(") ", 1)[1], id="pid-beyond-pid-max"),
        pytest.param("4242 (sleep)S 1 1", id="no-space-after-comm"),
        pytest.param("4242 (sleep) S 1 2 3\n", id="too-few-fields"),
        pytest.param(GOOD.replace(" S ", " S  "), id="double-space-shifts-fields"),
        pytest.param(GOOD.replace(" S ", " 7 "), id="state-not-a-letter"),
        pytest.param(GOOD.replace(" S ", " SS "), id="state-two-letters"),
        pytest.param(GOOD.replace(" 123456 ", " 12x456 "), id="start-not-digits"),
        pytest.param(GOOD.replace(" 123456 ", " -123456 "), id="start-negative"),
        pytest.param(GOOD.replace(" 123456 ", " 123456789012345678901 "), id="start-21-digits"),
        pytest.param(GOOD.replace(" 123456 ", " 18446744073709551616 "), id="start-beyond-u64"),
        pytest.param(GOOD.replace(" 123456 ", " \u0661\u0662 "), id="start-arabic-digits"),
        pytest.param(GOOD + "trailing", id="garbage-after-newline"),
        pytest.param(GOOD[:-1] + "\n\n", id="two-newlines"),
    ],
)
def test_stat_refuses_garbage(text: str) -> None:
    with pytest.raises(ParseError):
        procfs.parse_stat(text)


def test_stat_refuses_non_text() -> None:
    with pytest.raises(ParseError):
        procfs.parse_stat(42)  # type: ignore[arg-type]


# --- status ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(status_text(), ("S", 4242, 4242, 1, (4242,)), id="root-namespace"),
        pytest.param(
            status_text(pid=22137, nspid="22137\t2"), ("S", 22137, 22137, 1, (22137, 2)), id="child-namespace"
        ),
        pytest.param(status_text(pid=5, nspid="5\t3\t1"), ("S", 5, 5, 1, (5, 3, 1)), id="grandchild-namespace"),
        pytest.param(
            status_text(state="Z (zombie)", threads=2), ("Z", 4242, 4242, 2, (4242,)), id="zombie-leader-with-threads"
        ),
        pytest.param(status_text(state="X"), ("X", 4242, 4242, 1, (4242,)), id="state-letter-only"),
        pytest.param(status_text(pid=4243, tgid=4242), ("S", 4242, 4243, 1, (4243,)), id="a-thread"),
    ],
)
def test_status(text: str, expected: tuple[Any, ...]) -> None:
    parsed = procfs.parse_status(text)
    assert (parsed.state, parsed.tgid, parsed.pid, parsed.threads, parsed.nspid) == expected
    assert parsed.namespaced_pid == expected[-1][-1]


def test_status_of_this_kernel_parses() -> None:
    parsed = procfs.parse_status(pathlib.Path("/proc/self/status").read_bytes())
    assert parsed.nspid[0] == parsed.pid


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param(status_text().replace("NSpid:\t4242\n", ""), id="no-nspid"),
        pytest.param(status_text().replace("Threads:\t1\n", ""), id="no-threads"),
        pytest.param(status_text().replace("NSpid:\t4242", "NSpid:\t"), id="empty-nspid"),
        pytest.param(status_text().replace("NSpid:\t4242", "NSpid:\t4243\t2"), id="nspid-not-starting-at-pid"),
        pytest.param(status_text().replace("NSpid:\t4242", "NSpid:\t4242\t0"), id="nspid-zero"),
        pytest.param(status_text().replace("NSpid:\t4242", "NSpid:\t4242\tx"), id="nspid-not-digits"),
        pytest.param(status_text() + "Tgid:\t4242\n", id="duplicate-tgid"),
        pytest.param(status_text() + "garbage line\n", id="line-without-colon"),
        pytest.param(status_text().replace("State:\tS (sleeping)", "State:\tsleeping"), id="state-word"),
        pytest.param(status_text().replace("Tgid:\t4242", "Tgid:\t-4242"), id="negative-tgid"),
        pytest.param(status_text() + "\n", id="blank-line"),
    ],
)
def test_status_refuses_garbage(text: str) -> None:
    with pytest.raises(ParseError):
        procfs.parse_status(text)


# --- links, ids, fdinfo --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("pid:[4026531836]", 4026531836, id="root"),
        pytest.param(b"pid:[4026532178]", 4026532178, id="bytes"),
        pytest.param("pid:[18446744073709551615]", 2**64 - 1, id="u64-max"),
    ],
)
def test_pid_namespace_link(text: str | bytes, expected: int) -> None:
    assert procfs.parse_pid_namespace_link(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "pid:[]", "pid:[0]", "net:[4026531840]", "pid:[4026531836]\n", "pid:4026531836", " pid:[1]", "pid:[1e3]"],
)
def test_pid_namespace_link_refuses_garbage(text: str) -> None:
    with pytest.raises(ParseError):
        procfs.parse_pid_namespace_link(text)


def test_boot_id() -> None:
    assert procfs.parse_boot_id(BOOT + "\n") == BOOT
    assert procfs.parse_boot_id(BOOT.encode()) == BOOT
    assert procfs.is_boot_id(BOOT)
    assert not procfs.is_boot_id(BOOT + "\n")
    assert not procfs.is_boot_id(None)


@pytest.mark.parametrize(
    "text",
    ["", "\n", BOOT.upper(), BOOT + "\n\n", " " + BOOT, BOOT[:-1], BOOT.replace("-", ""), "boot-a", BOOT + "0"],
)
def test_boot_id_refuses_garbage(text: str) -> None:
    with pytest.raises(ParseError):
        procfs.parse_boot_id(text)


def test_machine_id() -> None:
    assert procfs.parse_machine_id(MACHINE + "\n") == MACHINE
    for text in ("uninitialized\n", "", MACHINE.upper(), MACHINE[:-1], MACHINE + "\n\n"):
        with pytest.raises(ParseError):
            procfs.parse_machine_id(text)


FDINFO = "pos:\t0\nflags:\t02000002\nmnt_id:\t4\nino:\t23031\nPid:\t23030\nNSpid:\t23030\n"


def test_pidfd_fdinfo() -> None:
    assert procfs.parse_pidfd_fdinfo(FDINFO) == 23030
    assert procfs.parse_pidfd_fdinfo(FDINFO.replace("23030", "-1")) is None  # reaped
    assert procfs.parse_pidfd_fdinfo(FDINFO.replace("Pid:\t23030", "Pid:\t0")) is None  # not visible
    for text in ("pos:\t0\nflags:\t02\n", FDINFO.replace("Pid:\t23030", "Pid:\tx"), "garbage"):
        with pytest.raises(ParseError):
            procfs.parse_pidfd_fdinfo(text)


# --- namespaces and incarnations ------------------------------------------------------------------


def test_namespace_from_a_single_nspid_needs_no_link() -> None:
    # Here root gets EACCES for pid 1's ns link: one NSpid entry means "the /proc's own namespace".
    status = procfs.parse_status(status_text())
    assert procfs.pid_namespace_of(status=status, pid_namespace_link=None, proc_pid_namespace=ROOT_NS) == ROOT_NS
    with pytest.raises(ParseError):
        procfs.pid_namespace_of(status=status, pid_namespace_link=None, proc_pid_namespace=None)
    with pytest.raises(ParseError, match="says"):
        procfs.pid_namespace_of(status=status, pid_namespace_link=f"pid:[{CHILD_NS}]", proc_pid_namespace=ROOT_NS)


def test_namespace_of_a_child_needs_its_link() -> None:
    status = procfs.parse_status(status_text(pid=22137, nspid="22137\t2"))
    with pytest.raises(ParseError):
        procfs.pid_namespace_of(status=status, pid_namespace_link=None, proc_pid_namespace=ROOT_NS)
    assert (
        procfs.pid_namespace_of(status=status, pid_namespace_link=f"pid:[{CHILD_NS}]", proc_pid_namespace=ROOT_NS)
        == CHILD_NS
    )


def test_incarnation_from_a_child_namespace() -> None:
    incarnation = procfs.incarnation_from(
        stat=stat_text(pid=22137, start=229477),
        status=status_text(pid=22137, nspid="22137\t2"),
        pid_namespace_link=f"pid:[{CHILD_NS}]",
        boot_id=BOOT + "\n",
        machine_id=MACHINE + "\n",
        node_name="node-a",
    )
    assert incarnation.key == IncarnationKey(boot_id=BOOT, pid_namespace=CHILD_NS, pid=2, start_time=229477)
    assert incarnation.spec() == {
        "bootId": BOOT,
        "pidNamespace": str(CHILD_NS),
        "pid": 2,
        "startTime": "229477",
        "hostId": MACHINE,
    }


@pytest.mark.parametrize("machine_id", [None, "uninitialized\n", ""], ids=["unreadable", "uninitialized", "empty"])
def test_incarnation_host_id_falls_back_to_the_node_name(machine_id: str | None) -> None:
    incarnation = procfs.incarnation_from(
        stat=stat_text(), status=status_text(), pid_namespace_link=f"pid:[{ROOT_NS}]",
        boot_id=BOOT, machine_id=machine_id, node_name="node-a",
    )  # fmt: skip
    assert incarnation.host_id == "node-a"


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"stat": stat_text(pid=4243)}, id="stat-and-status-of-different-pids"),
        pytest.param({"status": status_text(pid=4242, tgid=4000)}, id="a-thread-not-a-process"),
        pytest.param({"boot_id": "not-a-boot"}, id="bad-boot-id"),
        pytest.param({"pid_namespace_link": "pid:[x]"}, id="bad-link"),
        pytest.param({"node_name": "", "machine_id": None}, id="nothing-to-bind-to"),
    ],
)
def test_incarnation_refuses_what_does_not_add_up(changes: dict[str, Any]) -> None:
    arguments: dict[str, Any] = {
        "stat": stat_text(), "status": status_text(), "pid_namespace_link": f"pid:[{ROOT_NS}]",
        "boot_id": BOOT, "machine_id": MACHINE, "node_name": "node-a",
    }  # fmt: skip
    with pytest.raises(ParseError):
        procfs.incarnation_from(**(arguments | changes))


def test_recorded_incarnation_accepts_the_api_shapes() -> None:
    expected = IncarnationKey(boot_id=BOOT, pid_namespace=ROOT_NS, pid=42, start_time=0)
    assert procfs.recorded_incarnation(boot_id=BOOT, pid_namespace=str(ROOT_NS), pid=42, start_time="0") == expected
    assert procfs.recorded_incarnation(boot_id=BOOT, pid_namespace=ROOT_NS, pid="42", start_time=0) == expected


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"boot_id": None}, id="boot-missing"),
        pytest.param({"boot_id": BOOT.upper()}, id="boot-uppercase"),
        pytest.param({"boot_id": BOOT + "\n"}, id="boot-with-newline"),
        pytest.param({"pid_namespace": ""}, id="pidns-empty"),
        pytest.param({"pid_namespace": "0"}, id="pidns-zero"),
        pytest.param({"pid_namespace": "4026531836 "}, id="pidns-space"),
        pytest.param({"pid_namespace": 2**64}, id="pidns-beyond-u64"),
        pytest.param({"pid": 0}, id="pid-zero"),
        pytest.param({"pid": True}, id="pid-bool"),
        pytest.param({"pid": 42.0}, id="pid-float"),
        pytest.param({"pid": api.PID_MAX_LIMIT + 1}, id="pid-beyond-limit"),
        pytest.param({"pid": "-42"}, id="pid-negative"),
        pytest.param({"start_time": "0x10"}, id="start-hex"),
        pytest.param({"start_time": "\u0661"}, id="start-arabic-digit"),
        pytest.param({"start_time": -1}, id="start-negative"),
        pytest.param({"start_time": None}, id="start-missing"),
        pytest.param({"start_time": ["1"]}, id="start-list"),
    ],
)
def test_recorded_incarnation_refuses_garbage(changes: dict[str, object]) -> None:
    fields: dict[str, object] = {"boot_id": BOOT, "pid_namespace": str(ROOT_NS), "pid": 42, "start_time": "7"}
    with pytest.raises(ParseError):
        procfs.recorded_incarnation(**(fields | changes))  # type: ignore[arg-type]


# --- properties ---------------------------------------------------------------------------------

# Any character but NUL can be in a comm (the kernel stores it NUL-terminated); the interesting ones
# are weighted in so that most examples contain them.
COMMS = st.text(
    alphabet=st.one_of(st.sampled_from("() \n\t:)("), st.characters(exclude_characters="\x00")), max_size=64
)


@given(
    comm=COMMS,
    pid=st.integers(1, api.PID_MAX_LIMIT),
    state=st.sampled_from("RSDTtWXxKPIZ"),
    threads=st.integers(0, 10**6),
    start=st.integers(0, 2**64 - 1),
)
def test_any_comm_round_trips(comm: str, pid: int, state: str, threads: int, start: int) -> None:
    parsed = procfs.parse_stat(stat_text(pid=pid, comm=comm, state=state, threads=threads, start=start))
    assert (parsed.pid, parsed.comm, parsed.state, parsed.num_threads, parsed.start_time) == (
        pid, comm, state, threads, start,
    )  # fmt: skip


PARSERS = [
    procfs.parse_stat,
    procfs.parse_status,
    procfs.parse_pid_namespace_link,
    procfs.parse_boot_id,
    procfs.parse_machine_id,
    procfs.parse_pidfd_fdinfo,
]


def parses_or_refuses(parser: Any, raw: str | bytes) -> None:
    with contextlib.suppress(ParseError):
        parser(raw)


@pytest.mark.parametrize("parser", PARSERS, ids=lambda parser: parser.__name__)
@given(raw=st.one_of(st.text(), st.binary()))
def test_garbage_raises_only_parse_error(parser: Any, raw: str | bytes) -> None:
    parses_or_refuses(parser, raw)


@given(data=st.data())
@settings(max_examples=300)
def test_mutated_kernel_texts_raise_only_parse_error(data: st.DataObject) -> None:
    texts = [stat_text(comm="a) b"), status_text(pid=22137, nspid="22137\t2"), "pid:[4026531836]", BOOT, FDINFO]
    parser_and_text = data.draw(st.sampled_from(list(zip(PARSERS[:4] + PARSERS[5:], texts, strict=True))))
    parser, text = parser_and_text
    position = data.draw(st.integers(0, len(text)))
    cut = data.draw(st.integers(0, 4))
    insert = data.draw(st.text(max_size=6))
    parses_or_refuses(parser, text[:position] + insert + text[position + cut :])


@given(
    boot_id=st.one_of(st.none(), st.text(), st.integers(), st.just(BOOT)),
    pid_namespace=st.one_of(st.none(), st.text(), st.integers(), st.booleans(), st.floats()),
    pid=st.one_of(st.none(), st.text(), st.integers(), st.booleans(), st.floats()),
    start_time=st.one_of(st.none(), st.text(), st.integers(), st.lists(st.integers())),
)
def test_recorded_incarnation_never_raises_anything_else(
    boot_id: object, pid_namespace: object, pid: object, start_time: object
) -> None:
    try:
        key = procfs.recorded_incarnation(boot_id=boot_id, pid_namespace=pid_namespace, pid=pid, start_time=start_time)
    except ParseError:
        return
    assert 1 <= key.pid <= api.PID_MAX_LIMIT and key.pid_namespace >= 1 and key.start_time >= 0


# --- purity ---------------------------------------------------------------------------------------

#: procfs is shared by the agent and the launcher, and both rely on it doing no I/O (`memo` is
#: the core's memos of pure functions, standard library only).
ALLOWED_IMPORTS = {
    "__future__",
    "collections.abc",
    "dataclasses",
    "re",
    "typing",
    "coroner",
    "coroner.core",
    "coroner.core.api",
    "coroner.core.memo",
}


def test_procfs_imports_only_computation() -> None:
    source = pathlib.Path(procfs.__file__).read_text()
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            imported.add(base)
            imported |= {
                f"{base}.{alias.name}" for alias in node.names if base in {"coroner", "coroner.core", "coroner.client"}
            }
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in {"open", "print", "eval", "exec", "__import__"}, node.func.id
    assert imported <= ALLOWED_IMPORTS, sorted(imported - ALLOWED_IMPORTS)


MOUNTINFO = (
    "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
    "30 22 0:28 / /proc/sys/fs/binfmt_misc rw,relatime - binfmt_misc binfmt_misc rw\n"
    "41 27 0:40 / /host/proc rw,nosuid,nodev - proc proc rw,hidepid=invisible,gid=4\n"
    "42 27 0:41 / /with\\040space ro - proc proc rw\n"
    "43 27 0:42 / /old rw,hidepid=2 - proc proc rw\n"
    "44 27 0:43 / /stacked rw - proc proc rw,hidepid=invisible\n"
    "45 27 0:44 / /stacked rw shared:7 - proc proc rw\n"
    "46 27 0:45 / /tmp rw - tmpfs tmpfs rw\n"
)


@pytest.mark.parametrize(
    ("mount_point", "hides"),
    [
        ("/proc", False),
        ("/host/proc", True),
        ("/with space", False),
        ("/old", True),  # before 5.8, hidepid was a per-mount option
        ("/stacked", False),  # the last mount at a point is the one on top
    ],
)
def test_proc_mount_options(mount_point: str, hides: bool) -> None:
    options = procfs.parse_proc_mount_options(MOUNTINFO, mount_point=mount_point)
    assert procfs.hides_processes(options) is hides


@pytest.mark.parametrize(
    ("text", "mount_point", "message"),
    [
        (MOUNTINFO, "/nowhere", "nothing is mounted at /nowhere"),
        (MOUNTINFO, "/tmp", "is a tmpfs mount, not proc"),
        ("22 27 0:21 / /proc rw proc proc rw\n", "/proc", "no '-' separator"),
        ("22 27 0:21 / /proc rw - proc\n", "/proc", "too few fields"),
    ],
)
def test_proc_mount_options_refuses_what_it_cannot_vouch_for(text: str, mount_point: str, message: str) -> None:
    with pytest.raises(procfs.ParseError, match=message):
        procfs.parse_proc_mount_options(text, mount_point=mount_point)


@pytest.mark.parametrize(
    ("options", "hides"),
    [
        ((), False),
        (("rw", "hidepid=0"), False),
        (("hidepid=off",), False),
        (("hidepid=1",), True),
        (("hidepid=noaccess",), True),
        (("hidepid=ptraceable", "subset=pid"), True),
        (("hidepid=invisible",), True),
    ],
)
def test_hides_processes(options: tuple[str, ...], hides: bool) -> None:
    assert procfs.hides_processes(options) is hides


def test_this_machines_proc_mount_parses() -> None:
    with open("/proc/self/mountinfo") as file:
        options = procfs.parse_proc_mount_options(file.read(), mount_point="/proc")
    assert "rw" in options or "ro" in options
