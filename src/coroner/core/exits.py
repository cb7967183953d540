"""How a process ended, as a wait status says it: what its registrant and the node agent each do with it.

Exit status 0, or death by SIGTERM (the kubelet's stop, honoured), is a clean exit: the registrant
says goodbye (`Released`). Anything else is a death the node agent attests. What the kernel does not
say is never read as clean. `coroner.pidfs` reads the status through a pidfd.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Final

#: The signals a wait status of a container's process names most (Linux numbers); others by number.
SIGNALS: Final = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}
SIGTERM: Final = 15
#: How long to wait after a pidfd fires for the runtime to reap the process (the kernel gives the
#: exit status only then; a shim reaps within milliseconds).
REAP_WAIT_SECONDS: Final = 2.0


class Ending(enum.StrEnum):
    """How a process ended, as far as its pidfd tells."""

    CLEAN = "CleanExit"
    """Exit status 0, or killed by SIGTERM (a stop that was honoured): its registrant says goodbye."""
    UNCLEAN = "UncleanExit"
    """Anything else: the agent attests the death, and it is retired."""
    UNKNOWN = "ExitStatusUnavailable"
    """The kernel did not say (before Linux 6.15, or not reaped in time): never read as clean."""
    UNREAPED = "ExitNotReaped"
    """It exited and its parent has not reaped it yet: the kernel gives the status only then."""


def ending(wait_status: int | None) -> Ending:
    """What a wait status (as `waitpid` gives it; None: not known) says of the exit."""
    if wait_status is None:
        return Ending.UNKNOWN
    if _exited(wait_status):
        return Ending.CLEAN if _exit_code(wait_status) == 0 else Ending.UNCLEAN
    if _killed_by(wait_status) == SIGTERM:
        return Ending.CLEAN
    return Ending.UNCLEAN


# The wait status's layout (the kernel's, as glibc's WIFEXITED, WEXITSTATUS and WTERMSIG read it),
# spelled out so this stays pure: the low 7 bits are the terminating signal, 0 for an exit.
def _exited(status: int) -> bool:
    return status & 0x7F == 0


def _exit_code(status: int) -> int:
    return (status >> 8) & 0xFF


def _killed_by(status: int) -> int | None:
    signal = status & 0x7F
    return None if signal in (0, 0x7F) else signal


@dataclasses.dataclass(frozen=True, slots=True)
class Exit:
    """How the process of a pidfd that became readable ended."""

    ending: Ending
    status: int | None = None
    """Its wait status, once reaped (and the kernel says)."""

    def describe(self) -> str:
        if self.status is None:
            return (
                "its exit status is unread (not reaped yet)"
                if self.ending is Ending.UNREAPED
                else ("its exit status is unavailable (a kernel before 6.15)")
            )
        if _exited(self.status):
            return f"exit status {_exit_code(self.status)}"
        signal = _killed_by(self.status)
        if signal is not None:
            return f"killed by {SIGNALS.get(signal, f'signal {signal}')}"
        return f"wait status {self.status}"
