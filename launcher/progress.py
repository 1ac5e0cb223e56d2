"""Progress for long work: downloads, build steps, health waits, benchmark runs.

Nothing the launcher does for minutes may be silent. On a terminal the
output is a live rich line (size and rate for downloads, elapsed time and
the log's last line for build steps, elapsed time for health waits); in a
log or a pipe, where a live line would only add noise, the same facts come
as plain lines at a steady interval. Everything goes to stderr, so stdout
stays what commands promise (plans, JSON, reports).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn, TransferSpeedColumn)

# Seconds between plain lines when stderr is not a terminal.
PLAIN_INTERVAL_S = 30.0


def _console() -> Console:
    return Console(stderr=True, highlight=False)


def note(line: str) -> None:
    """One line about work that takes a while but has no measure of its own."""
    _console().print(line, markup=False)


def fmt_elapsed(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, sec = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{sec:02d}s"


def fmt_size(size: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"


class Waiting:
    """A wait with a deadline: a live ``label (elapsed / timeout)`` line, or plain lines."""

    def __init__(self, label: str, timeout: float, *, interval: float = PLAIN_INTERVAL_S):
        self.label = label
        self.timeout = timeout
        self.interval = interval
        self.console = _console()
        self._start = time.monotonic()
        self._status = None
        self._last_plain = 0.0

    def __enter__(self) -> Waiting:
        self._start = time.monotonic()
        if self.console.is_terminal:
            self._status = self.console.status(self._text())
            self._status.start()
        else:
            self.console.print(f"{self.label} (up to {self.timeout:g} s)")
            self._last_plain = self._start
        return self

    def __exit__(self, *exc) -> None:
        if self._status is not None:
            self._status.stop()

    def _text(self) -> str:
        return f"{self.label}: {fmt_elapsed(self.elapsed())} of {fmt_elapsed(self.timeout)}"

    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def expired(self) -> bool:
        """Also the tick: refreshes the live line, or prints a plain one every ``interval``."""
        now = time.monotonic()
        if self._status is not None:
            self._status.update(self._text())
        elif now - self._last_plain >= self.interval:
            self._last_plain = now
            self.console.print(f"still {self._text()}")
        return now - self._start >= self.timeout

    def fail(self, message: str) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
        self.console.print(message, markup=False)


class Download:
    """Bytes of one download: a live bar with size and rate, or plain lines with both."""

    def __init__(self, name: str, total: int | None, *, interval: float = PLAIN_INTERVAL_S):
        self.name = name
        self.total = total
        self.interval = interval
        self.console = _console()
        self.done = 0
        self._start = time.monotonic()
        self._last_plain = 0.0
        self._progress: Progress | None = None
        self._task = None

    def __enter__(self) -> Download:
        self._start = self._last_plain = time.monotonic()
        size = f" ({fmt_size(self.total)})" if self.total else ""
        if self.console.is_terminal:
            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                TimeRemainingColumn(), console=self.console, transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(f"downloading {self.name}", total=self.total)
        else:
            self.console.print(f"downloading {self.name}{size}", markup=False)
        return self

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        if self._progress is not None:
            self._progress.update(self._task, advance=nbytes)
            return
        now = time.monotonic()
        if now - self._last_plain >= self.interval:
            self._last_plain = now
            self.console.print(f"  {self._line()}", markup=False)

    def _line(self) -> str:
        elapsed = max(time.monotonic() - self._start, 1e-6)
        of = f" of {fmt_size(self.total)}" if self.total else ""
        return f"{fmt_size(self.done)}{of} in {fmt_elapsed(elapsed)} ({fmt_size(self.done / elapsed)}/s)"

    def __exit__(self, exc_type, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()
        elif exc_type is None:
            self.console.print(f"  done: {self._line()}", markup=False)


class Requests:
    """Requests of one benchmark run: a live bar (done of total, elapsed), or plain lines.

    ``total`` None: the requests are counted elsewhere (``vllm bench serve``),
    so only the elapsed time shows. ``advance`` may be called from worker threads.
    """

    def __init__(self, label: str, total: int | None, *, interval: float = PLAIN_INTERVAL_S):
        self.label = label
        self.total = total
        self.interval = interval
        self.console = _console()
        self.done = 0
        self._lock = threading.Lock()
        self._start = self._last_plain = time.monotonic()
        self._progress: Progress | None = None
        self._task = None

    def __enter__(self) -> Requests:
        self._start = self._last_plain = time.monotonic()
        if self.console.is_terminal:
            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("requests"),
                TimeElapsedColumn(), console=self.console, transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.label, total=self.total)
        else:
            of = f"{self.total} requests" if self.total else "requests counted by vllm bench serve"
            self.console.print(f"{self.label}: {of}", markup=False)
        return self

    def advance(self) -> None:
        with self._lock:
            self.done += 1
            if self._progress is not None:
                self._progress.update(self._task, advance=1)
                return
            now = time.monotonic()
            if now - self._last_plain >= self.interval:
                self._last_plain = now
                self.console.print(f"  {self.label}: {self.done} of {self.total} requests in "
                                   f"{fmt_elapsed(now - self._start)}", markup=False)

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()


def last_line(log: Path, limit: int = 160) -> str:
    """The last non-empty line of a (growing) log file, shortened for one terminal line."""
    try:
        with open(log, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - 8192))
            tail = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in tail.replace("\r", "\n").splitlines() if ln.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


class Heartbeat:
    """While a long step runs: its elapsed time and its log's last line, from a background thread."""

    def __init__(self, label: str, log: Path, *, interval: float = PLAIN_INTERVAL_S,
                 say: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic):
        self.label = label
        self.log = log
        self.interval = interval
        self.console = _console()
        # Plain lines go where the caller prints its own (build's echo), else to stderr.
        self.say = say or (lambda line: self.console.print(line, markup=False))
        self._clock = clock
        self._start = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._status = None

    def _text(self) -> str:
        line = last_line(self.log)
        return f"{self.label}: {fmt_elapsed(self._clock() - self._start)}" + (f" | {line}" if line else "")

    def _loop(self) -> None:
        tick = 1.0 if self._status is not None else self.interval
        while not self._stop.wait(tick):
            if self._status is not None:
                self._status.update(self._text())
            else:
                self.say(self._text())

    def __enter__(self) -> Heartbeat:
        self._start = self._clock()
        if self.console.is_terminal:
            self._status = self.console.status(self._text())
            self._status.start()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat {self.label}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._status is not None:
            self._status.stop()


def copy_with_progress(src, dst, name: str, total: int | None, chunk: int = 1 << 20) -> None:
    """Copy a response stream to a file, reporting as it goes."""
    with Download(name, total) as bar:
        while True:
            data = src.read(chunk)
            if not data:
                break
            dst.write(data)
            bar.advance(len(data))

