"""What a pidfd tells without privilege: the process's inode, and how it ended.

A process's pidfd inode is the one identity of a process that needs no privilege to check.

Since Linux 6.9 pidfds live on pidfs, which gives each process (each `struct pid`) its own inode
number, drawn from a 64-bit counter that never goes back within a boot: no two processes of one
boot share it, however pid numbers and pid namespace inodes are recycled. `pidfd_open` and
`fstat` on the pidfd need no permission over the process (measured on 6.18: an unprivileged uid,
no capabilities, opens a pidfd for a root process in another pid namespace and reads its inode,
where its `/proc/<pid>/ns/pid` answers EACCES). On older kernels pidfds are anonymous inodes that
all share one number; `inode` says None there, so nothing records or compares a number that does
not name one process.

The worker side (`coroner run`, the registrar, the Python API) records it as
`spec.incarnation.pidfdInode`; the node agent finds the process by it (`coroner_agent.pidindex`).

How a process ended: once it was reaped, `PIDFD_GET_INFO` gives its wait status to anyone who holds a
pidfd for it (Linux 6.15+; measured on 6.18 for an unprivileged holder of another uid's process).
The registrar says goodbye for a clean exit; the node agent gives that goodbye its chance before it
attests the death (`coroner_agent.step`).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import struct
import sys
from typing import Final

from coroner.core import procfs
from coroner.core.exits import Ending, Exit, ending

#: statfs.f_type of pidfs (include/uapi/linux/magic.h).
PIDFS_MAGIC: Final = 0x50494446
#: Room for struct statfs (120 bytes on 64-bit Linux); f_type is its first field, a native long.
_STATFS_SIZE: Final = 256

#: `PIDFD_GET_INFO` = _IOWR(PIDFS_IOCTL_MAGIC 0xFF, 11, struct pidfd_info), its first 64 bytes
#: (PIDFD_INFO_SIZE_VER0); `exit_code` (a wait status) is the `__s32` at offset 60 since Linux 6.15.
_PIDFD_INFO_SIZE: Final = 64
PIDFD_GET_INFO: Final = (3 << 30) | (_PIDFD_INFO_SIZE << 16) | (0xFF << 8) | 11
PIDFD_INFO_EXIT: Final = 1 << 3
_EXIT_CODE_OFFSET: Final = 60

_libc = ctypes.CDLL(None, use_errno=True)


def _exit_info(fd: int) -> tuple[bool, int | None]:
    """(the kernel can say, the wait status once reaped)."""
    info = bytearray(_PIDFD_INFO_SIZE)
    struct.pack_into("=Q", info, 0, PIDFD_INFO_EXIT)
    try:
        fcntl.ioctl(fd, PIDFD_GET_INFO, info)
    except OSError:
        return False, None  # ENOTTY/EINVAL: a kernel without PIDFD_GET_INFO
    (mask,) = struct.unpack_from("=Q", info, 0)
    if not mask & PIDFD_INFO_EXIT:
        return True, None
    (status,) = struct.unpack_from("=i", info, _EXIT_CODE_OFFSET)
    return True, int(status)


def exit_status(fd: int) -> int | None:
    """The wait status of the process behind pidfd `fd` once it was reaped; None while it was not,
    or where the kernel does not say."""
    return _exit_info(fd)[1]


def exit_of(fd: int) -> Exit:
    """How the process behind the readable pidfd `fd` ended: UNREAPED until its parent reaps it
    (on Linux 6.13 and 6.14, which lack the exit field, it stays so), UNKNOWN where the kernel has
    no PIDFD_GET_INFO."""
    supported, status = _exit_info(fd)
    if status is not None:
        return Exit(ending(status), status)
    return Exit(Ending.UNREAPED if supported else Ending.UNKNOWN)


def _on_pidfs(fd: int) -> bool:
    buffer = ctypes.create_string_buffer(_STATFS_SIZE)
    if _libc.fstatfs(fd, buffer) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))
    return int.from_bytes(buffer.raw[: ctypes.sizeof(ctypes.c_long)], sys.byteorder) == PIDFS_MAGIC


def inode(fd: int) -> int | None:
    """The pidfd's inode number, or None where it does not name one process (no pidfs, or a 32-bit
    system, where pidfs numbers may wrap). OSError: `fd` cannot be examined."""
    if sys.maxsize <= 2**32 or not _on_pidfs(fd):
        return None
    return os.fstat(fd).st_ino


def reaped(fd: int) -> bool:
    """The process of pidfd `fd` was reaped (its fdinfo says `Pid: -1`): its number may be anyone's
    now. Until then (running, or exited and unreaped) the number is still its own."""
    with open(f"/proc/self/fdinfo/{fd}", "rb") as info:
        return procfs.parse_pidfd_fdinfo(info.read()) is None


def inode_of(pid: int) -> int | None:
    """`inode` of a pidfd opened for `pid` (as this process's pid namespace numbers it).

    OSError: the process is gone (ESRCH) or cannot be opened."""
    fd = os.pidfd_open(pid)
    try:
        return inode(fd)
    finally:
        os.close(fd)
