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


# One table for every command (README "Exit codes", `launcher --help`).
EXIT_OK = 0  # done, or a dry run that printed its plan (its verdict is in the output and --json)
EXIT_PROBLEMS = 1  # a check found problems: doctor, models verify, patch status/check/drift, build preflight
EXIT_REFUSED = 2  # bad input, or a refusal: a serve the preflight blocks, a patch that conflicts
EXIT_TIMEOUT = 124  # waited too long (serve --wait): as timeout(1)
EXIT_SIGNAL_BASE = 128  # stopped by signal N: 128 + N (Ctrl-C 130, SIGTERM 143), as a shell reports it

EXIT_CODES_TABLE = """\
Exit codes, the same for every command:
  0      done, or a dry run that printed its plan (its verdict is in the
         output and the --json)
  1      a check found problems: doctor, models verify, patch status,
         patch check, patch drift, build preflight
  2      bad input, or a refusal: a serve the preflight blocks, a patch
         that conflicts
  124    a wait ran out of time: serve --wait --timeout
  128+N  stopped by signal N, as a shell reports it: Ctrl-C 130, SIGTERM 143
  other  serve: vLLM's own exit code, passed on"""
