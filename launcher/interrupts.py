"""Signals that end a process by default, turned into an exception so a run unwinds first.

``docker stop`` and systemd send SIGTERM, a closed terminal or a dropped SSH
connection SIGHUP, Ctrl-\\ SIGQUIT: each would end the launcher between two
steps, leaving a temporary folder, a container or a child behind. Raised as
:class:`Signalled`, they run the same clean-up as Ctrl-C, and the exit
status says which signal it was (128+N, the shell's convention).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

#: The signals a run unwinds from (those a platform lacks are left out).
ENDING = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, n))


class Signalled(BaseException):
    """Signal ``signum`` arrived; a BaseException so that ``except Exception`` clean-ups let it pass."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = int(signum)
        self.name = signal.Signals(signum).name

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


def install(signals: tuple[int, ...] = ENDING) -> Callable[[], None]:
    """Raise :class:`Signalled` on ``signals`` from now on; return what puts the old handlers back.

    Outside the main thread Python cannot set handlers: nothing changes there.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def raise_signalled(signum, frame):  # noqa: ARG001
        raise Signalled(signum)

    previous = {sig: signal.signal(sig, raise_signalled) for sig in signals}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


@contextlib.contextmanager
def unwinding(signals: tuple[int, ...] = ENDING) -> Iterator[None]:
    """:func:`install` for the duration of a ``with`` block."""
    restore = install(signals)
    try:
        yield
    finally:
        restore()
