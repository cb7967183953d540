"""A process's pidfd inode: the one identity of a process that needs no privilege to check.

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
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Final

from coroner.core import procfs

#: statfs.f_type of pidfs (include/uapi/linux/magic.h).
PIDFS_MAGIC: Final = 0x50494446
#: Room for struct statfs (120 bytes on 64-bit Linux); f_type is its first field, a native long.
_STATFS_SIZE: Final = 256

_libc = ctypes.CDLL(None, use_errno=True)


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
