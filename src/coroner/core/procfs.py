"""Pure parsers for the few /proc texts that name a process incarnation.

The agent (deciding whether an incarnation lives) and the worker launcher (recording the
incarnation it starts) must read `/proc/<pid>/stat`, `/proc/<pid>/status`, the `ns/pid` link, the
boot id and the machine id the same way, or a live worker could be matched against a different
reading of itself. So the parsing lives here once, takes text, does no I/O, and is strict: anything
that is not exactly what the kernel prints raises `ParseError` — a parser that guesses turns garbage
into a verdict, and unknown is never dead.

Two kernel facts shape it:

- `comm` (field 2 of `stat`) is printed raw between parentheses and may itself contain `)`, `(`,
  spaces and newlines (`prctl(PR_SET_NAME)` accepts them), so the fields are split after the
  **last** `)` in the text; nothing after it can contain one.
- `status` escapes its `Name:` line, so it is line-oriented; `NSpid:` lists the pid in every pid
  namespace from the reading `/proc`'s namespace down to the process's own, and the **last** entry
  is the pid the process itself sees (what a registration records).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Final

from coroner.core import api, memo

#: Largest integer any parsed field may hold: the kernel prints these as 64-bit unsigned at most.
U64_MAX: Final = 2**64 - 1

# Bounded so int() never meets a string long enough to raise (Python limits int digits); re.ASCII
# so that \d never accepts non-ASCII digits such as "٣".
_UNSIGNED: Final = re.compile(r"[0-9]{1,20}", re.ASCII)
_SIGNED: Final = re.compile(r"-?[0-9]{1,20}", re.ASCII)
_STAT_HEAD: Final = re.compile(r"([0-9]{1,20}) \(", re.ASCII)
_STATE_LETTER: Final = re.compile(r"[A-Za-z]", re.ASCII)
# "S (sleeping)", "Z (zombie)", "t (tracing stop)"; older kernels print only the letter.
_STATUS_STATE: Final = re.compile(r"([A-Za-z])(?: \([a-z ]{1,32}\))?", re.ASCII)
_PID_NS_LINK: Final = re.compile(r"pid:\[([0-9]{1,20})\]", re.ASCII)
_BOOT_ID: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.ASCII)
_MACHINE_ID: Final = re.compile(r"[0-9a-f]{32}", re.ASCII)
_STATUS_KEY: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}", re.ASCII)

# Fields of `stat` after the last ')', 0-based: field 3 (state) is index 0, so field N is N - 3.
_STAT_STATE: Final = 0
_STAT_PPID: Final = 1
_STAT_NUM_THREADS: Final = 17  # field 20
_STAT_START_TIME: Final = 19  # field 22
_STAT_MIN_FIELDS: Final = _STAT_START_TIME + 1
# The fields after comm when every one but the state (the first, _STAT_STATE) is an integer: one
# match instead of one per field; what does not match is checked field by field (and named).
_STAT_INTEGERS: Final = re.compile(r"[^ ]*(?: -?[0-9]{1,20})*", re.ASCII)

#: `status` keys the parser needs; a text without one of them describes nothing it can vouch for.
_STATUS_REQUIRED: Final = ("State", "Tgid", "Pid", "PPid", "Threads", "NSpid")


class ParseError(ValueError):
    """The text is not what the kernel prints for this file; nothing may be concluded from it."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Stat:
    """The fields of `/proc/<pid>/stat` an incarnation needs."""

    pid: int
    """Field 1: the pid in the pid namespace of the `/proc` that was read."""
    comm: str
    """Field 2, raw (may contain parentheses, spaces and newlines)."""
    state: str
    """Field 3: one letter. `Z` is not death (a thread group outlives its exited leader)."""
    ppid: int
    num_threads: int
    """Field 20."""
    start_time: int
    """Field 22: clock ticks after boot. With (boot, pid namespace, pid) it names one incarnation."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Status:
    """The fields of `/proc/<pid>/status` an incarnation needs."""

    state: str
    tgid: int
    pid: int
    ppid: int
    threads: int
    nspid: tuple[int, ...]
    """Outermost (the reading /proc's namespace) first; the last entry is the process's own view."""

    @property
    def namespaced_pid(self) -> int:
        """The pid as the process sees it (the last `NSpid` entry): what a registration records."""
        return self.nspid[-1]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True, order=True)
class IncarnationKey:
    """One run of one process on one node's boot: never reused, unlike the pid number in it."""

    boot_id: str
    pid_namespace: int
    pid: int
    """The namespaced pid (the last `NSpid` entry), as in `spec.incarnation.pid`."""
    start_time: int
    pidfd_inode: int = 0
    """The process's pidfd inode (`coroner.pidfs`), unique on its boot; 0: not recorded. When
    recorded, the agent finds the process by it, which needs no ptrace access."""

    def __str__(self) -> str:
        shown = f"boot={self.boot_id} pidns={self.pid_namespace} pid={self.pid} start={self.start_time}"
        return f"{shown} pidfd-inode={self.pidfd_inode}" if self.pidfd_inode else shown


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProcessView:
    """One process as read from one `/proc` (stat + status + ns link, checked against each other)."""

    host_pid: int
    """The pid in the reading /proc's namespace (the host pid when that is the root namespace)."""
    pid_namespace: int
    """0 where it was not needed and could not be read: a process of a child namespace read by a
    reader without ptrace access to it, found by its pidfd inode instead (`process_view`)."""
    namespaced_pid: int
    start_time: int
    state: str
    tgid: int
    threads: int

    @property
    def is_thread_group_leader(self) -> bool:
        """`/proc/<tid>` resolves for any thread; only a leader's number is a process's pid."""
        return self.tgid == self.host_pid


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProcessIncarnation:
    """An incarnation as the worker launcher records it, host binding included."""

    boot_id: str
    pid_namespace: int
    pid: int
    start_time: int
    host_id: str
    pidfd_inode: int | None = None
    """`coroner.pidfs.inode` of the process; None where the kernel gives no such number."""

    @property
    def key(self) -> IncarnationKey:
        return IncarnationKey(
            boot_id=self.boot_id,
            pid_namespace=self.pid_namespace,
            pid=self.pid,
            start_time=self.start_time,
            pidfd_inode=self.pidfd_inode or 0,
        )

    def spec(self) -> dict[str, str | int]:
        """`spec.incarnation` as docs/api.md spells it (digits as strings, pid as an integer)."""
        spec: dict[str, str | int] = {
            "bootId": self.boot_id,
            "pidNamespace": str(self.pid_namespace),
            "pid": self.pid,
            "startTime": str(self.start_time),
            "hostId": self.host_id,
        }
        if self.pidfd_inode is not None:
            spec["pidfdInode"] = str(self.pidfd_inode)
        return spec


def _text(raw: str | bytes, *, what: str) -> str:
    if isinstance(raw, bytes):
        # comm may hold any byte but NUL; surrogateescape keeps it round-trippable and never raises.
        return raw.decode("utf-8", "surrogateescape")
    if isinstance(raw, str):
        return raw
    raise ParseError(f"{what}: expected text, got {type(raw).__name__}")


def _unsigned(value: str, *, what: str, minimum: int = 0, maximum: int = U64_MAX) -> int:
    if not _UNSIGNED.fullmatch(value):
        raise ParseError(f"{what}: {value[:40]!r} is not an unsigned decimal")
    number = int(value)
    if not minimum <= number <= maximum:
        raise ParseError(f"{what}: {number} is outside {minimum}..{maximum}")
    return number


@memo.by_text
def parse_stat(raw: str | bytes) -> Stat:
    """`/proc/<pid>/stat`, split after the last `)` so that any comm parses."""
    text = _text(raw, what="stat")
    head = _STAT_HEAD.match(text)
    if head is None:
        raise ParseError(f"stat: does not start with 'PID (': {text[:40]!r}")
    close = text.rfind(")")
    if close < head.end():
        raise ParseError("stat: no ')' closes the comm field")
    comm = text[head.end() : close]
    rest = text[close + 1 :]
    if rest.endswith("\n"):
        rest = rest[:-1]
    if not rest.startswith(" "):
        raise ParseError(f"stat: no space after the comm field: {rest[:40]!r}")
    # Exactly one space between fields: an empty field (two spaces) would shift every index after it.
    fields = rest[1:].split(" ")
    if len(fields) < _STAT_MIN_FIELDS:
        raise ParseError(f"stat: {len(fields)} fields after comm, need at least {_STAT_MIN_FIELDS}")
    if not _STAT_INTEGERS.fullmatch(rest, 1):
        for index, field in enumerate(fields):
            if not _SIGNED.fullmatch(field) and index != _STAT_STATE:
                raise ParseError(f"stat: field {index + 3} is not an integer: {field[:40]!r}")
    state = fields[_STAT_STATE]
    if not _STATE_LETTER.fullmatch(state):
        raise ParseError(f"stat: field 3 is not a state letter: {state[:40]!r}")
    return Stat(
        pid=_unsigned(head.group(1), what="stat pid", minimum=1, maximum=api.PID_MAX_LIMIT),
        comm=comm,
        state=state,
        ppid=_unsigned(fields[_STAT_PPID], what="stat ppid", maximum=api.PID_MAX_LIMIT),
        num_threads=_unsigned(fields[_STAT_NUM_THREADS], what="stat num_threads"),
        start_time=_unsigned(fields[_STAT_START_TIME], what="stat starttime"),
    )


def _status_fields(text: str, *, what: str = "status") -> Mapping[str, str]:
    fields: dict[str, str] = {}
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, start=1):
        key, colon, value = line.partition(":")
        if not colon or not _STATUS_KEY.fullmatch(key):
            raise ParseError(f"{what}: line {number} is not 'Key:\\tvalue': {line[:40]!r}")
        if key in fields:
            # Two answers for one question: picking either would be a guess.
            raise ParseError(f"{what}: {key} appears twice")
        fields[key] = value.strip(" \t")
    return fields


@memo.by_text
def parse_status(raw: str | bytes) -> Status:
    """`/proc/<pid>/status`: State, Tgid, Pid, PPid, Threads and the NSpid chain."""
    text = _text(raw, what="status")
    fields = _status_fields(text)
    missing = [key for key in _STATUS_REQUIRED if key not in fields]
    if missing:
        raise ParseError(f"status: missing {', '.join(missing)}")
    state = _STATUS_STATE.fullmatch(fields["State"])
    if state is None:
        raise ParseError(f"status: State is {fields['State'][:40]!r}")
    nspid_text = fields["NSpid"].split()
    if not nspid_text:
        raise ParseError("status: NSpid is empty")
    nspid = tuple(_unsigned(item, what="status NSpid", minimum=1, maximum=api.PID_MAX_LIMIT) for item in nspid_text)
    pid = _unsigned(fields["Pid"], what="status Pid", minimum=1, maximum=api.PID_MAX_LIMIT)
    if nspid[0] != pid:
        raise ParseError(f"status: NSpid starts at {nspid[0]}, Pid is {pid}")
    return Status(
        state=state.group(1),
        tgid=_unsigned(fields["Tgid"], what="status Tgid", minimum=1, maximum=api.PID_MAX_LIMIT),
        pid=pid,
        ppid=_unsigned(fields["PPid"], what="status PPid", maximum=api.PID_MAX_LIMIT),
        threads=_unsigned(fields["Threads"], what="status Threads"),
        nspid=nspid,
    )


def parse_pid_namespace_link(raw: str | bytes) -> int:
    """The target of `/proc/<pid>/ns/pid`, `pid:[4026531836]`, as the namespace's inode number."""
    text = _text(raw, what="ns/pid link")
    match = _PID_NS_LINK.fullmatch(text)
    if match is None:
        raise ParseError(f"ns/pid link: {text[:60]!r} is not 'pid:[INODE]'")
    return _unsigned(match.group(1), what="pid namespace inode", minimum=1)


def _one_line(text: str) -> str:
    # The kernel ends these files with exactly one newline; anything else around them is not its output.
    return text[:-1] if text.endswith("\n") else text


def parse_boot_id(raw: str | bytes) -> str:
    """`/proc/sys/kernel/random/boot_id`: a lowercase UUID, one optional trailing newline."""
    text = _one_line(_text(raw, what="boot id"))
    if not _BOOT_ID.fullmatch(text):
        raise ParseError(f"boot id: {text[:60]!r} is not a lowercase UUID")
    return text


def is_boot_id(value: object) -> bool:
    """A boot id exactly as the kernel prints it (no newline): what a registration may record."""
    return isinstance(value, str) and _BOOT_ID.fullmatch(value) is not None


def parse_machine_id(raw: str | bytes) -> str:
    """`/etc/machine-id`: 32 lowercase hex digits (systemd's "uninitialized" is not an id)."""
    text = _one_line(_text(raw, what="machine id"))
    if not _MACHINE_ID.fullmatch(text):
        raise ParseError(f"machine id: {text[:60]!r} is not 32 lowercase hex digits")
    return text


def _recorded_integer(value: object, *, what: str, minimum: int, maximum: int) -> int:
    # bool is an int subclass; True is not pid 1. Floats are refused: a start time is exact or nothing.
    if isinstance(value, bool):
        raise ParseError(f"{what}: a boolean is not a number")
    if isinstance(value, int):
        if not minimum <= value <= maximum:
            raise ParseError(f"{what}: {value} is outside {minimum}..{maximum}")
        return value
    if isinstance(value, str):
        return _unsigned(value, what=what, minimum=minimum, maximum=maximum)
    raise ParseError(f"{what}: {type(value).__name__} is not a number")


@memo.by_fields
def recorded_incarnation(
    *, boot_id: object, pid_namespace: object, pid: object, start_time: object, pidfd_inode: object = None
) -> IncarnationKey:
    """Validate the incarnation fields a registration carries (strings of digits or integers);
    `pidfd_inode` None (or an IncarnationKey's 0) is not recorded: it is optional."""
    if not isinstance(boot_id, str) or not _BOOT_ID.fullmatch(boot_id):
        raise ParseError(f"bootId: {str(boot_id)[:60]!r} is not a lowercase UUID")
    return IncarnationKey(
        boot_id=boot_id,
        pid_namespace=_recorded_integer(pid_namespace, what="pidNamespace", minimum=1, maximum=U64_MAX),
        pid=_recorded_integer(pid, what="pid", minimum=1, maximum=api.PID_MAX_LIMIT),
        start_time=_recorded_integer(start_time, what="startTime", minimum=0, maximum=U64_MAX),
        pidfd_inode=0
        if pidfd_inode is None or (type(pidfd_inode) is int and pidfd_inode == 0)
        else _recorded_integer(pidfd_inode, what="pidfdInode", minimum=1, maximum=U64_MAX),
    )


def pid_namespace_of(*, status: Status, pid_namespace_link: str | bytes | None, proc_pid_namespace: int | None) -> int:
    """The inode of the pid namespace a process lives in.

    `NSpid` has one entry per level from the reading /proc's namespace down to the process's own, so
    a single entry means the process lives in the /proc's namespace itself: when that one is known
    the link is not needed (the kernel may refuse to show it: on this project's VM, root gets
    EACCES for pid 1's `ns/pid`). Otherwise the link decides; if both are given they must agree.
    """
    from_nspid = proc_pid_namespace if len(status.nspid) == 1 else None
    if pid_namespace_link is None:
        if from_nspid is None:
            raise ParseError(f"pid {status.pid}: a child pid namespace, and its ns/pid link is unknown")
        return from_nspid
    from_link = parse_pid_namespace_link(pid_namespace_link)
    if from_nspid is not None and from_nspid != from_link:
        raise ParseError(f"pid {status.pid}: NSpid says pid namespace {from_nspid}, ns/pid says {from_link}")
    return from_link


@memo.by_fields
def process_view(
    *,
    stat: str | bytes,
    status: str | bytes,
    pid_namespace_link: str | bytes | None,
    proc_pid_namespace: int | None = None,
    namespace_required: bool = True,
) -> ProcessView:
    """One process from its texts, which must describe the same task (see `pid_namespace_of`).

    Without `namespace_required`, a process of a child namespace whose link is None gets
    `pid_namespace` 0 instead of a ParseError."""
    parsed_stat = parse_stat(stat)
    parsed_status = parse_status(status)
    # The texts are read one after another; a pid reused in between would pair one task's start
    # time with another's namespace. The pids must agree (the caller re-reads stat to close the rest).
    if parsed_stat.pid != parsed_status.pid:
        raise ParseError(f"stat is pid {parsed_stat.pid}, status is pid {parsed_status.pid}")
    unread = not namespace_required and pid_namespace_link is None and len(parsed_status.nspid) > 1
    return ProcessView(
        host_pid=parsed_stat.pid,
        pid_namespace=0
        if unread
        else pid_namespace_of(
            status=parsed_status, pid_namespace_link=pid_namespace_link, proc_pid_namespace=proc_pid_namespace
        ),
        namespaced_pid=parsed_status.namespaced_pid,
        start_time=parsed_stat.start_time,
        state=parsed_stat.state,
        tgid=parsed_status.tgid,
        threads=parsed_status.threads,
    )


def parse_pidfd_fdinfo(raw: str | bytes) -> int | None:
    """A pidfd's `/proc/<self>/fdinfo/<fd>`: its `Pid:` in the reading /proc's namespace.

    None when the kernel prints -1 (reaped) or 0 (not visible from that namespace): the fd then
    names no process that this /proc can show.
    """
    fields = _status_fields(_text(raw, what="fdinfo"), what="fdinfo")
    if "Pid" not in fields:
        raise ParseError("fdinfo: no Pid line (not a pidfd?)")
    value = fields["Pid"]
    if value in ("-1", "0"):
        return None
    return _unsigned(value, what="fdinfo Pid", minimum=1, maximum=api.PID_MAX_LIMIT)


def incarnation_from(
    *,
    stat: str | bytes,
    status: str | bytes,
    pid_namespace_link: str | bytes,
    boot_id: str | bytes,
    machine_id: str | bytes | None,
    node_name: str,
    pidfd_inode: int | None = None,
) -> ProcessIncarnation:
    """The incarnation a launcher records for a process it started (and still holds unreaped).

    `machine_id` None (unreadable) or invalid falls back to `node_name`, as the API specifies.
    """
    view = process_view(stat=stat, status=status, pid_namespace_link=pid_namespace_link)
    if not view.is_thread_group_leader:
        raise ParseError(f"pid {view.host_pid} is a thread of {view.tgid}, not a process")
    host_id = node_name
    if machine_id is not None:
        try:
            host_id = parse_machine_id(machine_id)
        except ParseError:
            host_id = node_name
    if not host_id:
        raise ParseError("neither a machine id nor a node name to bind the incarnation to")
    return ProcessIncarnation(
        boot_id=parse_boot_id(boot_id),
        pid_namespace=view.pid_namespace,
        pid=view.namespaced_pid,
        start_time=view.start_time,
        host_id=host_id,
        pidfd_inode=pidfd_inode,
    )


def _mountinfo_unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash in paths as three octal digits.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_proc_mount_options(raw: str | bytes, *, mount_point: str) -> tuple[str, ...]:
    """The options of the proc mount at `mount_point` in a `/proc/self/mountinfo` text: the
    per-mount and the superblock options together (hidepid is a superblock option since 5.8 and a
    mount option before). The last mount listed at that point is the one on top, the one read."""
    found: tuple[str, ...] | None = None
    for line in _text(raw, what="mountinfo").splitlines():
        fields = line.split(" ")
        if "-" not in fields[6:]:
            raise ParseError(f"mountinfo: {line[:80]!r} has no '-' separator")
        separator = fields.index("-", 6)
        if len(fields) < separator + 4 or len(fields) < 7:
            raise ParseError(f"mountinfo: {line[:80]!r} has too few fields")
        if _mountinfo_unescape(fields[4]) != mount_point:
            continue
        if fields[separator + 1] != "proc":
            raise ParseError(f"mountinfo: {mount_point} is a {fields[separator + 1]} mount, not proc")
        found = (*fields[5].split(","), *fields[separator + 3].split(","))
    if found is None:
        raise ParseError(f"mountinfo: nothing is mounted at {mount_point}")
    return found


def hides_processes(options: tuple[str, ...]) -> bool:
    """Whether a proc mount with these options may leave processes out of its listing and answer
    ENOENT for them (hidepid=invisible or ptraceable; noaccess answers EACCES, which is no
    absence, but counts too: absence is believed only from a proc that hides nothing)."""
    return any(o.startswith("hidepid=") and o not in ("hidepid=0", "hidepid=off") for o in options)
