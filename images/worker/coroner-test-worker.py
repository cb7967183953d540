#!/usr/local/bin/python3
"""coroner-test-worker [SECONDS [CODE]]: the test-only worker of the coroner-worker image.

For end-to-end tests, launched by the launcher (`coroner run -n NS -- coroner-test-worker ...`):

- no argument: prints its pid, then sleeps until it is stopped (a line with its pid every minute);
- SECONDS: prints its pid, then exits with CODE (default 1) after SECONDS seconds: a container
  that crash-loops, or with CODE 0 one that completes;
- SIGTERM (the kubelet stopping the container: `coroner run` forwards it) exits 0 at once, so the
  launcher reads a clean exit and releases the registration. (Before it has printed `started`,
  while the interpreter starts, SIGTERM kills it: clean too for `coroner run`, which forwarded it.)
"""

from __future__ import annotations

import os
import signal
import sys

USAGE = "usage: coroner-test-worker [SECONDS [CODE]]"


def say(message: str) -> None:
    print(f"coroner-test-worker pid={os.getpid()} {message}", flush=True)


def main(argv: list[str]) -> int:
    if len(argv) > 2 or any(arg in ("-h", "--help") for arg in argv):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        seconds = float(argv[0]) if argv else None
        code = int(argv[1]) if len(argv) > 1 else 1
    except ValueError:
        print(USAGE, file=sys.stderr)
        return 2
    # SIGTERM is waited for, not handled: no handler can interrupt a print half-way.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    say("started")
    while True:
        received = signal.sigtimedwait({signal.SIGTERM}, 60 if seconds is None else seconds)
        if received is not None:
            say(f"got signal {received.si_signo}; exiting 0")
            return 0
        if seconds is not None:
            say(f"exiting {code} after {seconds:g} s")
            return code
        say("alive")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
