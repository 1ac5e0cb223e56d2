"""An exclusive ``flock`` on a folder itself, for runs that must not write it at once.

Locking the folder (not a lock file beside it, in some cache) makes every
path to it (a symlink, a bind mount, another container) and every cache
setting meet the same lock; a killed holder releases it, and nothing is
left behind. POSIX only: Windows cannot lock a folder (``supported`` says so).
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path

#: Whether folders can be locked here.
supported = os.name != "nt"
_POLL_S = 0.1


class DirLock:
    """``try_acquire`` / ``release`` on one folder; one descriptor, closed on release."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        """True when taken; False while another process holds it. OSError when the folder cannot be locked."""
        import fcntl

        if self._fd is None:
            self._fd = os.open(self.folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False
            raise
        return True

    def acquire(self, wait_s: float, on_wait: Callable[[], None]) -> bool:
        """Take it, waiting up to ``wait_s`` (``on_wait`` is called once, when it must wait); False on timeout."""
        if self.try_acquire():
            return True
        on_wait()
        deadline = time.monotonic() + wait_s
        while not self.try_acquire():
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None
