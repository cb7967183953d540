"""What a compromised agent would try against another process, as one script: the host tests run it
under the shipped seccomp profile (tests/support/seccomp_exec.py) and the real-node tests exec it
inside the running agent container, so both try exactly the same calls.

`python3 -c ATTEMPTS TARGET_PID ACTION` prints "ok" when the kernel let the attempt through, or the
errno name it failed with. The memory attempts read at the target's first mapping (what an attacker
wants), not at offset 0 (unmapped below mmap_min_addr: EIO whatever the confinement).
"""

from __future__ import annotations

from typing import Final

ATTEMPTS: Final = r"""
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
target, action = int(sys.argv[1]), sys.argv[2]
NR = {"x86_64": {"kill": 62, "tgkill": 234, "process_vm_readv": 310, "kcmp": 312, "pidfd_open": 434,
                 "pidfd_getfd": 438},
      "aarch64": {"kill": 129, "tgkill": 131, "process_vm_readv": 270, "kcmp": 272, "pidfd_open": 434,
                  "pidfd_getfd": 438}}[os.uname().machine]

def report(result):
    print("ok" if result >= 0 else errno.errorcode[ctypes.get_errno()])

def first_mapping():
    try:
        with open(f"/proc/{target}/maps") as maps:
            return int(maps.readline().split("-")[0], 16)
    except PermissionError:  # no ptrace access: any address still makes the call itself
        return 0x400000

try:
    if action == "proc-mem":  # seek to a mapping, then read(2)
        with open(f"/proc/{target}/mem", "rb", buffering=0) as mem:
            mem.seek(first_mapping())
            print("ok" if len(mem.read(8)) == 8 else "short")
    elif action == "proc-mem-pread":  # pread64(2) at a mapping, no seek
        fd = os.open(f"/proc/{target}/mem", os.O_RDONLY)
        print("ok" if len(os.pread(fd, 8, first_mapping())) == 8 else "short")
    elif action == "proc-mem-write":  # open for writing, seek to a mapping, write what is there
        with open(f"/proc/{target}/mem", "r+b", buffering=0) as mem:
            at = first_mapping()
            mem.seek(at)
            same = mem.read(8)
            mem.seek(at)
            print("ok" if mem.write(same) == 8 else "short")
    elif action == "proc-mem-pwrite":  # write-only open, pwrite64 at a mapping
        # The first mapping is the start of the executable: write back the bytes it already holds.
        with open(f"/proc/{target}/exe", "rb") as exe:
            same = exe.read(8)
        fd = os.open(f"/proc/{target}/mem", os.O_WRONLY)
        print("ok" if os.pwrite(fd, same, first_mapping()) == 8 else "short")
    elif action == "proc-root-token":
        with open(f"/proc/{target}/root/run/secrets/kubernetes.io/serviceaccount/token") as token:
            print("ok" if token.read().count(".") == 2 else "not-a-token")
    elif action == "kill":
        report(libc.syscall(NR["kill"], target, 0))  # kill(pid, 0): the permission check of every signal
    elif action == "tgkill":
        report(libc.syscall(NR["tgkill"], target, target, 0))  # tgkill(tgid, tid, 0)
    elif action == "ptrace-attach":
        report(libc.ptrace(16, target, 0, 0))  # PTRACE_ATTACH
    elif action == "process_vm_readv":
        class iovec(ctypes.Structure):
            _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
        buffer = ctypes.create_string_buffer(8)
        local = iovec(ctypes.cast(buffer, ctypes.c_void_p), 8)
        remote = iovec(first_mapping(), 8)
        report(libc.syscall(NR["process_vm_readv"], target, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0))
    elif action == "pidfd_getfd":
        pidfd = libc.syscall(NR["pidfd_open"], target, 0)  # the agent's own call, allowed
        report(pidfd if pidfd < 0 else libc.syscall(NR["pidfd_getfd"], pidfd, 0, 0))
    elif action == "kcmp":
        report(libc.syscall(NR["kcmp"], os.getpid(), target, 0, 0, 0))  # KCMP_FILE
    else:
        print(f"unknown action {action}")
except OSError as exc:
    print(errno.errorcode[exc.errno])
"""
