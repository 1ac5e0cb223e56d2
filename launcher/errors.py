"""One error type the CLI turns into one clear line and a non-zero exit."""

from __future__ import annotations


class LauncherError(Exception):
    """A user-facing failure: ``message`` says what is wrong, ``hint`` what to do.

    The CLI prints ``error: <message>`` (and ``hint: <hint>``) with no traceback
    and exits with ``exit_code``.
    """

    def __init__(self, message: str, hint: str | None = None, exit_code: int = 2):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message
