"""One patch run at a time per vLLM tree.

A run that writes a tree leaves a journal while it writes; without a lock,
a second ``apply``, ``revert`` or ``status`` started meanwhile takes that
live journal for a crashed run and rolls it back under the writer's feet.
Every run that may write takes this lock before it reads the journal, and
holds it until its last write.

The lock belongs to the tree: on POSIX it is a ``flock`` on the tree's
``vllm/`` folder itself. Every path to that folder (a symlink, a bind mount,
another container) opens the same inode, every cache folder sees the same
lock, a killed holder releases it, and nothing is left in the tree after
``revert`` or ``pip uninstall``. Windows, which cannot lock a folder, uses
a lock file in the launcher's cache named after the tree's path.

Beside the lock, the holder records who it is, so a waiting run can say
whom it waits for. The record lives in a private folder (the cache's
``locks/``, else ``$TMPDIR/vllm-sm12x-locks-<uid>``) that must be a real
folder owned by the user with mode 0700; it is written with ``O_EXCL`` and
``O_NOFOLLOW``, so a planted symlink is never written through. The record
is only for the message: without a private folder the lock still holds.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from launcher import dirlock
from launcher.dirlock import DirLock
from launcher.errors import LauncherError
from launcher.paths import cache_dir

#: How long a run waits for another before it gives up (a holder can be stopped by Ctrl-C, not by us).
WAIT_S = 600.0
_POLL_S = 0.1


# ------------------------------------------------------------ the lock itself


class _TreeLock:
    """A :class:`DirLock` on ``root/vllm`` (POSIX), else a lock file in the cache (Windows)."""

    def __init__(self, root: Path):
        self.root = root
        self._dir = DirLock(root / "vllm")
        self._file = None

    def try_acquire(self) -> bool:
        return self._dir.try_acquire() if dirlock.supported else self._try_file_lock()

    def _try_file_lock(self) -> bool:
        import filelock

        if self._file is None:
            folder = cache_dir() / "locks"
            folder.mkdir(parents=True, exist_ok=True)
            key = hashlib.sha256(str(self.root.resolve()).encode("utf-8")).hexdigest()[:20]
            self._file = filelock.FileLock(folder / f"patch-{key}.lock")
        try:
            self._file.acquire(timeout=0)
        except filelock.Timeout:
            return False
        return True

    def release(self) -> None:
        if self._file is not None:
            self._file.release()
        self._dir.release()


def held_elsewhere(root: Path) -> bool:
    """Another process holds the lock now (a read-only check: doctor, serve's preflight)."""
    lock = _TreeLock(root)
    try:
        if not lock.try_acquire():
            return True
    except (OSError, LauncherError):
        return False
    finally:
        lock.release()
    return False


@contextmanager
def tree_lock(root: Path, say: Callable[[str], None] | None = None, wait_s: float = WAIT_S) -> Iterator[None]:
    """Hold the tree's lock; a run that must wait says for whom, once."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    lock = _TreeLock(root)
    try:
        if not lock.try_acquire():
            say(f"waiting for another patch run on {root}: {holder(root)} holds its lock")
            deadline = time.monotonic() + wait_s
            while not lock.try_acquire():
                if time.monotonic() >= deadline:
                    raise LauncherError(
                        f"another patch run on {root} still holds its lock after {wait_s:.0f} s: {holder(root)}",
                        hint="let it finish (or stop it with Ctrl-C), then run this again",
                    )
                time.sleep(_POLL_S)
    except OSError as exc:
        lock.release()
        raise LauncherError(f"cannot take the patch lock for {root}: {exc}") from exc
    except BaseException:
        lock.release()
        raise
    try:
        _record_owner(root)
        yield
    finally:
        _forget_owner(root)
        lock.release()


# ----------------------------------------------------- who holds it, in words


def holder(root: Path) -> str:
    """Who holds the lock, in words (as recorded by the holder)."""
    path = _owner_path(root)
    try:
        if path is None:
            raise OSError("no private folder for the record")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, encoding="utf-8") as fh:
            data = json.loads(fh.read(65536))
        since = time.strftime("%H:%M:%S", time.localtime(float(data["since"])))
        return f"pid {data['pid']} on {data['host']} ({data['command']}, since {since})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another launcher process"


def _owner_path(root: Path) -> Path | None:
    """The holder's record for ``root``, named after the tree's device and inode (as the lock is)."""
    folder = _private_folder()
    if folder is None:
        return None
    try:
        st = os.stat(root / "vllm")
    except OSError:
        return None
    return folder / f"patch-{st.st_dev}-{st.st_ino}.owner.json"


def _private_folder() -> Path | None:
    for folder in _owner_folders():
        if _make_private(folder):
            return folder
    return None


def _owner_folders() -> Iterator[Path]:
    try:
        yield cache_dir() / "locks"
    except OSError:  # cache_dir() itself may fail: HOME not ours (sudo -u, a container user)
        pass
    uid = os.getuid() if hasattr(os, "getuid") else 0
    yield Path(tempfile.gettempdir()) / f"vllm-sm12x-locks-{uid}"


def _make_private(folder: Path) -> bool:
    """``folder`` is (made) a real folder of this user, mode 0700: nobody else can plant files in it.

    One that is a symlink, or another user's, is not used. One of ours with a
    wider mode is narrowed: a symlink planted while it was open is never
    followed (the writes below use O_EXCL and O_NOFOLLOW).
    """
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(folder)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
        return False
    if os.name != "nt" and stat.S_IMODE(st.st_mode) & 0o077:
        try:
            os.chmod(folder, 0o700, follow_symlinks=False)
        except (OSError, NotImplementedError):
            return False
    return os.access(folder, os.W_OK)


def _record_owner(root: Path) -> None:
    final = _owner_path(root)
    if final is None:
        return
    owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
             "command": " ".join(["launcher", *sys.argv[1:3]])}
    tmp = final.with_suffix(f".{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        try:
            fd = os.open(tmp, flags, 0o600)
        except FileExistsError:  # a leftover of a killed run with this pid, or something planted: never reused
            os.unlink(tmp)
            fd = os.open(tmp, flags, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(owner))
        os.replace(tmp, final)  # replaces a symlink at ``final`` itself, never its target
    except OSError:
        pass  # the record only names the holder; the lock holds without it


def _forget_owner(root: Path) -> None:
    path = _owner_path(root)
    if path is not None:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass
