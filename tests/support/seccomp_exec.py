"""Run a command under a seccomp profile in the OCI/Kubernetes JSON format, as the container
runtime would load it (`python seccomp_exec.py PROFILE.json -- COMMAND ...`).

It reads the same file the manifests ship (manifests/base/agent-seccomp.json), builds the filter with
the system's libseccomp (through ctypes; the runtimes use the same library), sets no_new_privs,
loads it and execs COMMAND, so COMMAND runs from its first instruction under exactly the filter a
kubelet with `seccompProfile: {type: Localhost}` would give it. Supported: defaultAction and
syscalls[].action of SCMP_ACT_ALLOW / SCMP_ACT_ERRNO (with errnoRet) / SCMP_ACT_KILL_PROCESS, for
the native architecture, with argument filters (``args``: index, value, valueTwo, op) as runc
passes them to libseccomp: the entries of one rule are ANDed (the shipped profile never names one
index twice in a rule, where runc would split it into ORed rules), `SCMP_CMP_MASKED_EQ` takes the
mask as `value` and the expected result as `valueTwo`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
import sys
from typing import Any

SCMP_ACT_KILL_PROCESS = 0x80000000
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_ACT_ERRNO_BASE = 0x00050000
#: libseccomp's enum scmp_compare.
_OPS = {
    "SCMP_CMP_NE": 1,
    "SCMP_CMP_LT": 2,
    "SCMP_CMP_LE": 3,
    "SCMP_CMP_EQ": 4,
    "SCMP_CMP_GE": 5,
    "SCMP_CMP_GT": 6,
    "SCMP_CMP_MASKED_EQ": 7,
}


class ArgCmp(ctypes.Structure):
    """libseccomp's struct scmp_arg_cmp."""

    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _comparisons(args: list[dict[str, Any]]) -> ctypes.Array[ArgCmp]:
    indexes = [int(arg["index"]) for arg in args]
    if len(set(indexes)) != len(indexes):
        raise SystemExit("seccomp_exec: one rule names an argument twice (runc would OR them)")
    array = (ArgCmp * len(args))()
    for slot, arg in zip(array, args, strict=True):
        slot.arg = int(arg["index"])
        slot.op = _OPS[arg["op"]]
        slot.datum_a = int(arg.get("value", 0))
        slot.datum_b = int(arg.get("valueTwo", 0))
    return array


def _action(spec: dict[str, Any], name: str, default_errno: int) -> int:
    kind = spec[name]
    if kind == "SCMP_ACT_ALLOW":
        return SCMP_ACT_ALLOW
    if kind == "SCMP_ACT_ERRNO":
        return SCMP_ACT_ERRNO_BASE | (int(spec.get("errnoRet", default_errno)) & 0xFFFF)
    if kind in ("SCMP_ACT_KILL_PROCESS", "SCMP_ACT_KILL"):
        return SCMP_ACT_KILL_PROCESS
    raise SystemExit(f"seccomp_exec: unsupported action {kind!r}")


def load(profile: dict[str, Any]) -> int:
    """Loads the profile into the calling thread (and what it execs); returns the rules added."""
    lib = ctypes.CDLL(ctypes.util.find_library("seccomp") or "libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(ArgCmp),
    ]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    default = _action(profile, "defaultAction", int(profile.get("defaultErrnoRet", errno.EPERM)))
    context = lib.seccomp_init(default)
    if not context:
        raise SystemExit("seccomp_exec: seccomp_init failed")
    added = 0
    for rule in profile.get("syscalls") or []:
        args = rule.get("args") or []
        comparisons = _comparisons(args) if args else None
        action = _action(rule, "action", int(rule.get("errnoRet", errno.EPERM)))
        if action == default:
            continue
        for name in rule["names"]:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:
                continue  # not a syscall of this architecture (the runtimes skip those too)
            if comparisons is None:
                result = lib.seccomp_rule_add(context, action, number, 0)
            else:
                result = lib.seccomp_rule_add_array(context, action, number, len(comparisons), comparisons)
            if result < 0:
                raise SystemExit(f"seccomp_exec: rule for {name} failed ({-result})")
            added += 1
    result = lib.seccomp_load(context)  # sets no_new_privs by default (SCMP_FLTATR_CTL_NNP)
    if result < 0:
        raise SystemExit(f"seccomp_exec: seccomp_load failed ({-result})")
    return added


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[2] != "--":
        raise SystemExit("usage: seccomp_exec.py PROFILE.json -- COMMAND [ARG...]")
    with open(argv[1]) as handle:
        load(json.load(handle))
    os.execvp(argv[3], argv[3:])


if __name__ == "__main__":
    main(sys.argv)
