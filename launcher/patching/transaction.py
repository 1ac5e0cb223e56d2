"""All-or-nothing file writes: every change lands, or every file is restored byte for byte.

Each write goes to a temporary file beside its target and is moved over it
with ``os.replace`` (atomic on POSIX and Windows), so no reader ever sees
half a file. Before the first replace, :meth:`Transaction.prepare` checks
that every target folder takes writes (nothing is written otherwise) and
writes a **journal** beside the stamp: the original bytes and mode of every
file the transaction will touch, and the folders it will create. If a step
fails, or SIGINT/SIGTERM arrives, the files are put back in-process; if the
process dies outright (SIGKILL, power loss), the journal survives and
:func:`recover` puts them back on the next ``apply``, ``revert`` or
``status``. A committed transaction deletes its journal.
"""

from __future__ import annotations

import base64
import errno
import fnmatch
import json
import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from launcher.errors import LauncherError
from launcher.paths import inside

TMP_SUFFIX = ".sm12x-tmp"
PROBE_PREFIX = ".sm12x-probe-"
_FOLDER_OUT = ("a folder on the way is a symlink that leads out of the tree: patch the tree that holds "
               "the real files, or replace the link with a copy")
_FORGED = ("the journal was not written by the launcher: reinstall vLLM "
           "(pip install --force-reinstall --no-deps vllm==VERSION), then delete it")
JOURNAL_FORMAT = 1
#: The largest journal or stamp read: they hold the original bytes of a few
#: source files, never this much. A bigger one (or /dev/zero) is refused.
MAX_RECORD_BYTES = 64 << 20
#: Permission bits a write may set. setuid, setgid and sticky bits never
#: belong to a vLLM source file; from a forged journal or stamp they would
#: make a root-owned setuid file when root runs `patch status`.
MODE_MASK = 0o777


def read_record(path: Path, limit: int = MAX_RECORD_BYTES) -> bytes:
    """The bytes of a journal or stamp: a regular file (not a link, FIFO or device), at most ``limit`` bytes.

    OSError otherwise; a FIFO or ``/dev/zero`` planted there would hang the
    read or fill memory.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path} is not a regular file")
        if info.st_size > limit:
            raise OSError(f"{path} is {info.st_size} bytes, more than a launcher record ever holds ({limit})")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(limit + 1)
        if len(data) > limit:
            raise OSError(f"{path} is more than {limit} bytes")
        return data
    finally:
        os.close(fd)


def read_source(path: Path) -> bytes | None:
    """A tree file's bytes (None when absent); OSError for a FIFO, device or folder there (never a hang)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (FileNotFoundError, NotADirectoryError):  # absent, or a file where a folder should be
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read()
    finally:
        os.close(fd)


@dataclass
class _Undo:
    path: Path
    data: bytes | None  # None: the file did not exist
    mode: int | None


@dataclass
class Transaction:
    """Use as a context manager; an exception inside rolls everything back.

    ``root`` and ``journal`` enable :meth:`prepare` (journal paths are kept
    relative to ``root``); without them the transaction lives in memory only.
    """

    root: Path | None = None
    journal: Path | None = None
    undo: list[_Undo] = field(default_factory=list)
    created_dirs: list[Path] = field(default_factory=list)
    #: Files a rollback could not put back (reported by the caller, never silent).
    unrestored: list[str] = field(default_factory=list)
    _originals: dict[Path, _Undo] = field(default_factory=dict)

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:
            self.rollback()
        return False

    # -- before the first write

    def prepare(self, paths: list[Path]) -> list[Path]:
        """Check write access for ``paths``, journal their originals; return the folders to be made.

        Raises LauncherError, with nothing written, when a folder refuses writes.
        """
        for path in paths:
            self._confined(path)
            _through(path, self.root)  # a symlink out of the tree is refused before anything is written
        _check_writable([*paths, *([self.journal] if self.journal else [])], self.root)
        self._originals = {p: _snapshot(p) for p in paths}
        planned = _missing_dirs(paths)
        if self.journal is not None and self.root is not None:
            write_journal(self.journal, self.root, list(self._originals.values()), planned)
        return planned

    # -- the writes

    def write(self, path: Path, data: bytes, mode: int | None = None) -> None:
        """Replace (or create) ``path``; an existing file keeps its mode unless ``mode`` is given."""
        self._confined(path)
        old = self._originals.get(path) or _snapshot(path)
        self._mkdirs(path.parent)
        _atomic_write(_through(path, self.root), data, mode if mode is not None else old.mode, self.root)
        # Recorded once the file changed: a write that failed left it as it was.
        self.undo.append(old)

    def remove(self, path: Path) -> None:
        self._confined(path)
        old = self._originals.get(path) or _snapshot(path)
        if old.data is None:
            return
        _unlink(path, self.root)
        self.undo.append(old)

    def _confined(self, path: Path) -> None:
        """``path`` lies in the tree, its folders (symlinks resolved) too: a symlinked folder
        planted in the tree (or named by a forged stamp's diff) must not carry a write or a
        delete elsewhere."""
        if self.root is None:
            return
        try:
            rel = path.relative_to(self.root).as_posix()
        except ValueError:
            rel = str(path)
        inside(self.root, rel, "the patch run", hint=_FOLDER_OUT)

    def _mkdirs(self, folder: Path) -> None:
        missing = []
        while not folder.exists():
            missing.append(folder)
            folder = folder.parent
        for d in reversed(missing):
            with _folder(d.parent, self.root) as (dfd, name_of):
                os.mkdir(name_of(d), dir_fd=dfd) if dfd is not None else d.mkdir()
            self.created_dirs.append(d)

    # -- the end

    def commit(self) -> None:
        """Everything landed: the journal goes (the stamp now tells the state)."""
        if self.journal is not None and self.journal.exists():
            _unlink(self.journal, self.root)
            _fsync_dir(self.journal.parent)

    def rollback(self) -> None:
        # Prepared: compare every journaled file with its original, so a signal
        # between a replace and its undo entry cannot leave that file behind.
        items = list(self._originals.values()) if self._originals else list(reversed(self.undo))
        for item in items:
            try:
                if _differs(item):
                    _restore(item, self.root)
            except (OSError, LauncherError) as exc:  # a folder that now leads out of the tree is left alone
                self.unrestored.append(f"{item.path}: {exc}")
        for d in reversed(self.created_dirs):
            _rmdir_quietly(d, self.root)
        self.undo.clear()
        self.created_dirs.clear()
        if not self.unrestored:
            self.commit()  # back as before: the journal has nothing left to do
        # else the journal stays: the next apply/revert/status tries again


def _differs(item: _Undo) -> bool:
    """The file is not (or no longer) as ``item`` recorded it: bytes, existence or mode."""
    if not item.path.is_file():
        return item.data is not None or item.path.exists()
    if item.data is None:
        return True
    return read_source(item.path) != item.data or (
        item.mode is not None and item.path.stat().st_mode & 0o7777 != item.mode & MODE_MASK)


def _restore(item: _Undo, root: Path | None) -> None:
    if item.data is None:
        if item.path.exists() or item.path.is_symlink():
            _unlink(item.path, root)
    else:
        _atomic_write(_through(item.path, root), item.data, item.mode, root)


def _through(path: Path, root: Path | None) -> Path:
    """Where a write of ``path`` lands: a symlink's target, so the link stays a link.

    A tree may link a file to another inside it; replacing the link with a
    regular file would leave the tree unlike the release after a revert. A
    link that leads out of the tree is refused: the write would change a file
    elsewhere. Without a root (an in-memory transaction) the path itself is replaced.
    """
    if root is None or not path.is_symlink():
        return path
    target = path.resolve()
    if not target.is_relative_to(root.resolve()):
        raise LauncherError(f"{path} is a symlink to {target}, outside {root}; nothing was written",
                            hint="patch the tree that holds the real file, or replace the link with a copy")
    return target


def _snapshot(path: Path) -> _Undo:
    if not path.exists():
        return _Undo(path, None, None)
    return _Undo(path, read_source(path), path.stat().st_mode & 0o7777)


def _missing_dirs(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for path in paths:
        folder = path.parent
        chain = []
        while not folder.exists():
            chain.append(folder)
            folder = folder.parent
        out += [d for d in reversed(chain) if d not in out]
    return out


def _nearest_dir(path: Path) -> Path | None:
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    return folder if folder.is_dir() else None  # a file in the way fails at the write, and is rolled back


def _check_writable(paths: list[Path], root: Path | None = None) -> None:
    """Every write lands as a temp file in the target's folder: probe each folder for real.

    A real probe rather than os.access: it also sees read-only mounts and
    ACLs, and answers the same for root as the write would.
    """
    refused: dict[Path, str] = {}
    errnos: set[int | None] = set()
    for folder in {d for d in map(_nearest_dir, paths) if d is not None}:
        try:
            with _folder(folder, root) as (dfd, _):
                fd, probe = _temp_file(folder, dfd, PROBE_PREFIX)
                try:
                    os.close(fd)
                finally:  # an interrupt between the two calls must not leave the probe behind
                    _remove_quietly(folder / probe, dfd, probe)
        except OSError as exc:
            refused[folder] = exc.strerror or str(exc)
            errnos.add(exc.errno)
    if os.name == "nt":  # Windows will not replace a read-only file
        for path in paths:
            if path.is_file() and not os.access(path, os.W_OK):
                refused[path] = "read-only file"
    if refused:
        where = "; ".join(f"{p} ({why})" for p, why in sorted(refused.items()))
        if errnos == {errno.EROFS}:  # what the system said, not a guess at permissions
            what, hint = "a read-only file system", "remount it read-write, or patch a copy you can write: a venv, or --target DIR"
        elif errnos and errnos <= {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}:
            what, hint = "no space left", "free some space on that disk (or raise the quota), then run this again"
        else:
            what, hint = "no write access", ("run as the user that installed this vLLM (e.g. with sudo for a system vLLM), "
                                             "or patch a copy you own: a venv, or --target DIR")
        raise LauncherError(f"{what}, nothing was written: {where}", hint=hint)


def _atomic_write(path: Path, data: bytes, mode: int | None, root: Path | None = None) -> None:
    with _folder(path.parent, root) as (dfd, name_of):
        fd, tmp = _temp_file(path.parent, dfd, f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                # A new file is 0600; the target keeps the mode it had (or the patch's).
                os.fchmod(fh.fileno(), (mode if mode is not None else 0o644) & MODE_MASK) if hasattr(os, "fchmod") \
                    else os.chmod(path.parent / tmp, (mode if mode is not None else 0o644) & MODE_MASK)
                os.fsync(fh.fileno())
            if dfd is not None:
                os.replace(tmp, name_of(path), src_dir_fd=dfd, dst_dir_fd=dfd)
            else:
                os.replace(path.parent / tmp, path)
        except BaseException:
            _remove_quietly(path.parent / tmp, dfd, tmp)
            raise


# Linux (and the BSDs) act on a folder through a descriptor: once the folder is opened and
# found inside the tree, swapping it for a symlink cannot carry the writes elsewhere.
_DIR_FD = os.open in os.supports_dir_fd and os.rename in os.supports_dir_fd and os.name != "nt"  # os.replace takes them where rename does


class _folder:
    """``with _folder(path, root) as (dfd, name_of)``: a descriptor of ``path`` checked to be
    inside ``root`` (None without a root or dir_fd support) and a function giving a child's
    name relative to it. The check reads the descriptor's own path, so a folder swapped for
    a symlink between a check and a write (a tree writer racing root's `patch apply`) is
    refused instead of written through."""

    def __init__(self, folder: Path, root: Path | None):
        self.folder, self.root, self.fd = folder, root, None

    def __enter__(self):
        if self.root is not None and _DIR_FD:
            self.fd = os.open(self.folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            try:
                real = Path(os.readlink(f"/proc/self/fd/{self.fd}"))
            except OSError:
                real = self.folder.resolve()
            if not real.is_relative_to(self.root.resolve()):
                os.close(self.fd)
                self.fd = None
                raise LauncherError(f"{self.folder} leads out of {self.root} (to {real}); nothing was written there",
                                    hint=_FOLDER_OUT)
        return self.fd, (lambda child: child.name)

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)
        return False


def _temp_file(folder: Path, dfd: int | None, prefix: str) -> tuple[int, str]:
    """A new file (O_EXCL, O_NOFOLLOW, 0600) in ``folder``; (descriptor, name)."""
    if dfd is None:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=prefix, suffix=TMP_SUFFIX)
        return fd, Path(tmp).name
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        name = f"{prefix}{os.urandom(6).hex()}{TMP_SUFFIX}"
        try:
            return os.open(name, flags, 0o600, dir_fd=dfd), name
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {folder}")


def _remove_quietly(path: Path, dfd: int | None, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dfd) if dfd is not None else os.unlink(path)
    except FileNotFoundError:
        pass


def unlink_inside(path: Path, root: Path | None) -> None:
    """Remove ``path`` through a descriptor of its folder checked to lie in ``root``."""
    _unlink(path, root)


def _unlink(path: Path, root: Path | None) -> None:
    with _folder(path.parent, root) as (dfd, name_of):
        os.unlink(name_of(path), dir_fd=dfd) if dfd is not None else os.unlink(path)


def _fsync_dir(folder: Path) -> None:
    if os.name == "nt":
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------- the journal


def write_journal(journal: Path, root: Path, originals: list[_Undo], planned_dirs: list[Path]) -> None:
    data = {
        "format": JOURNAL_FORMAT,
        "tool": "vllm-sm12x-launcher",
        "files": [
            {"path": u.path.relative_to(root).as_posix(), "mode": u.mode,
             "data": None if u.data is None else base64.b64encode(u.data).decode("ascii")}
            for u in originals
        ],
        "created_dirs": [d.relative_to(root).as_posix() for d in planned_dirs],
    }
    _atomic_write(journal, json.dumps(data).encode("utf-8"), 0o644, root)
    _fsync_dir(journal.parent)


def recover(root: Path, journal: Path) -> list[str]:
    """Roll back a transaction that died after its journal was written; return the files put back.

    Idempotent: restoring a file to its original bytes twice is harmless, so
    a recovery that is itself interrupted simply runs again next time.
    """
    _sweep_temps(journal.parent, journal.name, root)
    if not journal.exists():
        return []
    files, planned = _read_journal(root, journal)
    restored = []
    for path, mode, original in files:
        item = _Undo(path, original, mode)
        if _differs(item):
            _restore(item, root)
            restored.append(path.relative_to(root).as_posix())
        if path.parent.is_dir():
            _sweep_temps(path.parent, path.name, root)
    for d in sorted(planned, key=lambda p: len(p.parts), reverse=True):
        _rmdir_quietly(d, root)
    _unlink(journal, root)
    _fsync_dir(journal.parent)
    return restored


def _read_journal(root: Path, journal: Path) -> tuple[list[tuple[Path, int | None, bytes | None]], list[Path]]:
    """The journal's files (path, mode, original bytes) and folders, every path checked to stay in ``root``.

    All of it is checked before the first write: a forged or damaged journal
    changes nothing.
    """
    try:
        data = json.loads(read_record(journal).decode("utf-8"))
        files = [_journal_file(root, journal, f) for f in data["files"]]
        planned = [inside(root, d, f"the journal {journal}", _FORGED) for d in data.get("created_dirs", [])]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise LauncherError(
            f"the journal of an interrupted patch run, {journal}, is unreadable: {exc}",
            hint="reinstall vLLM (pip install --force-reinstall --no-deps vllm==VERSION), then delete the journal",
        ) from exc
    return files, planned


def _journal_file(root: Path, journal: Path, entry: dict) -> tuple[Path, int | None, bytes | None]:
    path = inside(root, entry["path"], f"the journal {journal}", _FORGED)
    mode, data = entry["mode"], entry["data"]
    if not (mode is None or (type(mode) is int and 0 <= mode <= 0o7777)):
        raise ValueError(f"mode {mode!r} of {entry['path']} is not a file mode")
    if not (data is None or isinstance(data, str)):
        raise TypeError(f"the data of {entry['path']} is not base64 text")
    return path, mode, None if data is None else base64.b64decode(data, validate=True)


def _sweep_temps(folder: Path, name: str, root: Path | None = None) -> None:
    """Temp files a killed write left beside ``name`` (only ours: prefix and suffix both match).

    Through a checked descriptor of the folder: one that now leads out of the tree is left alone.
    """
    if not folder.is_dir():
        return
    pattern = f".{name}.*{TMP_SUFFIX}"
    try:
        with _folder(folder, root) as (dfd, _):
            for entry in os.listdir(dfd if dfd is not None else folder):
                if fnmatch.fnmatchcase(entry, pattern):
                    try:
                        _remove_quietly(folder / entry, dfd, entry)
                    except OSError:
                        pass
    except (OSError, LauncherError):
        pass


def _rmdir_quietly(d: Path, root: Path | None) -> None:
    """Remove ``d`` if it is an empty folder, through a checked descriptor of its parent."""
    try:
        with _folder(d.parent, root) as (dfd, name_of):
            os.rmdir(name_of(d), dir_fd=dfd) if dfd is not None else d.rmdir()
    except (OSError, LauncherError):
        pass


def remove_empty_dirs(paths: list[Path], root: Path | None = None) -> None:
    """Remove folders a patch created, deepest first, where they are empty again."""
    for d in sorted(paths, key=lambda p: len(p.parts), reverse=True):
        _rmdir_quietly(d, root)
