"""Signal set-up for child processes that tests interrupt with Ctrl-C.

A shell that starts a job in the background (``make test &``, nohup, some CI
runners) hands it SIGINT ignored, every descendant inherits that, and Python
then never raises KeyboardInterrupt: a Ctrl-C test would wait out its
timeout. A terminal gives the child SIGINT at its default, which is what
these tests mean to reproduce.
"""

from __future__ import annotations

import signal


def ctrl_c_as_from_a_terminal() -> None:
    """``preexec_fn``: SIGINT at its default in the child, whatever the test runner inherited."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
