"""The one error type the dev cluster raises: a cause and the fix, both meant for a person."""

from __future__ import annotations


class DevClusterError(Exception):
    """Something a user can fix; `str()` names the cause, `fix` says what to do."""

    def __init__(self, message: str, *, fix: str) -> None:
        super().__init__(message)
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.args[0]}\n  fix: {self.fix}"
