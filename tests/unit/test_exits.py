"""How a wait status reads (`coroner.core.exits`): only exit 0 and an honoured SIGTERM are clean, and
what the kernel does not say never is. Checked against the os module's own decoding."""

from __future__ import annotations

import os
import signal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coroner.core.exits import Ending, Exit, ending

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        pytest.param(0, Ending.CLEAN, id="exit-0"),
        pytest.param(3 << 8, Ending.UNCLEAN, id="exit-3"),
        pytest.param(signal.SIGTERM, Ending.CLEAN, id="sigterm-honoured"),
        pytest.param(signal.SIGKILL, Ending.UNCLEAN, id="sigkill-or-oom"),
        pytest.param(signal.SIGSEGV | 0x80, Ending.UNCLEAN, id="segfault-core"),
        pytest.param(None, Ending.UNKNOWN, id="unknown"),
    ],
)
def test_what_an_exit_status_says(status: int | None, expected: Ending) -> None:
    assert ending(status) is expected


@given(code=st.integers(0, 255), sig=st.integers(1, 64))
def test_only_exit_0_and_sigterm_are_clean(code: int, sig: int) -> None:
    assert (ending(code << 8) is Ending.CLEAN) == (code == 0)
    if sig not in (signal.SIGSTOP, 0x7F):  # not a stopped status
        assert (ending(sig) is Ending.CLEAN) == (sig == signal.SIGTERM)
    assert os.WIFEXITED(code << 8)


@given(status=st.integers(0, 0xFFFF))
def test_the_wait_status_is_decoded_as_the_os_module_decodes_it(status: int) -> None:
    said = Exit(ending(status), status).describe()
    if os.WIFEXITED(status):
        assert said == f"exit status {os.WEXITSTATUS(status)}"
    elif os.WIFSIGNALED(status):
        assert said.startswith("killed by ")
        if os.WTERMSIG(status) in (signal.SIGKILL, signal.SIGTERM):
            assert said == f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    else:
        assert said == f"wait status {status}"


@pytest.mark.parametrize(
    ("how", "said"),
    [
        pytest.param(Exit(Ending.UNREAPED), "its exit status is unread (not reaped yet)", id="unreaped"),
        pytest.param(Exit(Ending.UNKNOWN), "its exit status is unavailable (a kernel before 6.15)", id="unknown"),
        pytest.param(Exit(Ending.UNCLEAN, 9), "killed by SIGKILL", id="sigkill"),
        pytest.param(Exit(Ending.UNCLEAN, 64), "killed by signal 64", id="unnamed-signal"),
        pytest.param(Exit(Ending.CLEAN, 0), "exit status 0", id="exit-0"),
    ],
)
def test_how_an_exit_is_said(how: Exit, said: str) -> None:
    assert how.describe() == said
