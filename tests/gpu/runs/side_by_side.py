"""Processes side by side on a GPU host: each with its environment and log, started a stagger apart, all waited for, each log's tail printed (served-all's jobs, realshape's lanes).

Engine start-up is mostly CPU (compile, graph capture): a stagger keeps the starts from crowding
one another. While any process runs, the GPUs' used memory can be sampled into a log.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

MEMORY_EVERY_S = 30
TAIL_LINES = 12


@dataclass(frozen=True)
class Job:
    argv: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)  # on top of the caller's environment


def without_options(argv: list[str], valued: tuple[str, ...], flags: tuple[str, ...] = ()) -> list[str]:
    """``argv`` less the options a parent keeps to itself: each of ``valued`` with its value
    (``--opt V`` or ``--opt=V``) and each of ``flags``; what is left goes to its children."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in valued:
            skip = True
        elif a not in flags and a.split("=", 1)[0] not in valued:
            out.append(a)
    return out


def tail(path: Path, n: int = TAIL_LINES) -> list[str]:
    """The last ``n`` lines of ``path`` that are not blank (none if it does not exist)."""
    if not path.is_file():
        return []
    return [line for line in path.read_text(errors="replace").splitlines() if line.strip()][-n:]


def sample_memory(path: Path, procs: list[subprocess.Popen], every_s: float = MEMORY_EVERY_S) -> threading.Thread:
    """The GPUs' used memory every ``every_s`` while one of ``procs`` runs, into ``path``
    (watched by the processes themselves: a name pattern would match another checkout's)."""
    def alive() -> bool:
        return any(p.poll() is None for p in procs)

    def loop():
        with path.open("w") as fh:
            while alive():
                got = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"],
                                     capture_output=True, text=True) if shutil.which("nvidia-smi") else None
                fh.write(got.stdout if got and got.returncode == 0 else "no nvidia-smi\n")
                fh.flush()
                end = time.monotonic() + every_s
                while alive() and time.monotonic() < end:
                    time.sleep(0.1)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def run(jobs: list[Job], stagger_s: float, memory_log: Path | None = None, tail_lines: int = TAIL_LINES) -> list[int]:
    """Start every job (``stagger_s`` between starts), wait for all, print each log's tail under
    ``== LOG``; their exit codes, in order."""
    procs = []
    for n, job in enumerate(jobs):
        job.log.parent.mkdir(parents=True, exist_ok=True)
        with job.log.open("w") as log:
            procs.append(subprocess.Popen(job.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env={**os.environ, **job.env}))
        if n + 1 < len(jobs):
            time.sleep(stagger_s)
    sampler = sample_memory(memory_log, procs) if memory_log is not None else None
    codes = [p.wait() for p in procs]
    if sampler is not None:
        sampler.join()
    for job in jobs:
        print(f"== {job.log.name}", *tail(job.log, tail_lines), sep="\n", flush=True)
    return codes
