"""One patch run at a time per vLLM tree.

A run that writes a tree leaves a journal while it writes; without a lock,
a second ``apply``, ``revert`` or ``status`` started meanwhile takes that
live journal for a crashed run and rolls it back under the writer's feet.
Every run that may write takes this lock (``filelock``: ``flock`` on POSIX,
``LockFileEx`` on Windows, so a killed holder releases it) before it reads
the journal, and holds it until its last write.

The lock file lives in the launcher's cache, named after the tree's
resolved path, not in the tree: a file in ``vllm/`` would outlive
``revert`` and ``pip uninstall``. Runs that see the tree under another
path (another container) are not serialised by it. Beside it, the holder
records who it is, so a waiting run can say whom it waits for.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import filelock

from launcher.errors import LauncherError
from launcher.paths import cache_dir

#: How long a run waits for another before it gives up (a holder can be stopped by Ctrl-C, not by us).
WAIT_S = 600.0


def lock_path(root: Path) -> Path:
    """The lock file for ``root``: in the launcher's cache, else (not writable there) in the temp folder."""
    key = hashlib.sha256(str(root.resolve()).encode("utf-8")).hexdigest()[:20]
    for where in ("cache", "temp"):
        try:
            folder = _lock_folder(where)
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(folder, os.W_OK):
            return folder / f"patch-{key}.lock"
    raise LauncherError(f"no writable folder for the patch lock of {root}",
                        hint="set VLLM_SM12X_CACHE to a folder you can write")


def _lock_folder(where: str) -> Path:
    if where == "cache":
        return cache_dir() / "locks"  # cache_dir() itself may fail: HOME not ours (sudo -u, a container user)
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"vllm-sm12x-locks-{uid}"


def _owner_path(root: Path) -> Path:
    return lock_path(root).with_suffix(".owner.json")


def holder(root: Path) -> str:
    """Who holds the lock, in words (as recorded by the holder)."""
    try:
        data = json.loads(_owner_path(root).read_text(encoding="utf-8"))
        since = time.strftime("%H:%M:%S", time.localtime(float(data["since"])))
        return f"pid {data['pid']} on {data['host']} ({data['command']}, since {since})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another launcher process"


def held_elsewhere(root: Path) -> bool:
    """Another process holds the lock now (a read-only check: doctor, serve's preflight)."""
    try:
        lock = filelock.FileLock(lock_path(root))
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return True
    except (OSError, LauncherError):
        return False
    lock.release()
    return False


@contextmanager
def tree_lock(root: Path, say: Callable[[str], None] | None = None, wait_s: float = WAIT_S) -> Iterator[None]:
    """Hold the tree's lock; a run that must wait says for whom, once."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    try:
        lock = filelock.FileLock(lock_path(root))
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            say(f"waiting for another patch run on {root}: {holder(root)} holds its lock")
            try:
                lock.acquire(timeout=wait_s)
            except filelock.Timeout:
                raise LauncherError(
                    f"another patch run on {root} still holds its lock after {wait_s:.0f} s: {holder(root)}",
                    hint="let it finish (or stop it with Ctrl-C), then run this again",
                ) from None
    except OSError as exc:
        raise LauncherError(f"cannot take the patch lock for {root}: {exc}") from exc
    try:
        _record_owner(root)
        yield
    finally:
        _owner_path(root).unlink(missing_ok=True)
        lock.release()


def _record_owner(root: Path) -> None:
    owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
             "command": " ".join(["launcher", *sys.argv[1:3]])}
    tmp = _owner_path(root).with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(owner), encoding="utf-8")
    os.replace(tmp, _owner_path(root))
