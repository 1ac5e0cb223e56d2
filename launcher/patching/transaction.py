"""All-or-nothing file writes: every change lands, or every file is restored byte for byte.

Each write goes to a temporary file beside its target and is moved over it
with ``os.replace`` (atomic on POSIX and Windows), so no reader ever sees
half a file. The original bytes and mode of every file are kept in memory;
if any step fails, the files already written are put back and the files
and folders created are removed, then the error propagates.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class _Undo:
    path: Path
    data: bytes | None  # None: the file did not exist
    mode: int | None


@dataclass
class Transaction:
    """Use as a context manager; an exception inside rolls everything back."""

    undo: list[_Undo] = field(default_factory=list)
    created_dirs: list[Path] = field(default_factory=list)
    #: Files a rollback could not put back (reported by the caller, never silent).
    unrestored: list[str] = field(default_factory=list)

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:
            self.rollback()
        return False

    def write(self, path: Path, data: bytes, mode: int | None = None) -> None:
        """Replace (or create) ``path``; an existing file keeps its mode unless ``mode`` is given."""
        old = _snapshot(path)
        self._mkdirs(path.parent)
        self.undo.append(old)
        _atomic_write(path, data, mode if mode is not None else old.mode)

    def remove(self, path: Path) -> None:
        old = _snapshot(path)
        if old.data is None:
            return
        self.undo.append(old)
        os.unlink(path)

    def _mkdirs(self, folder: Path) -> None:
        missing = []
        while not folder.exists():
            missing.append(folder)
            folder = folder.parent
        for d in reversed(missing):
            d.mkdir()
            self.created_dirs.append(d)

    def rollback(self) -> None:
        for item in reversed(self.undo):
            try:
                if item.data is None:
                    if item.path.exists():
                        os.unlink(item.path)
                else:
                    _atomic_write(item.path, item.data, item.mode)
            except OSError as exc:
                self.unrestored.append(f"{item.path}: {exc}")
        for d in reversed(self.created_dirs):
            try:
                d.rmdir()
            except OSError:
                pass
        self.undo.clear()
        self.created_dirs.clear()


def _snapshot(path: Path) -> _Undo:
    if not path.exists():
        return _Undo(path, None, None)
    return _Undo(path, path.read_bytes(), path.stat().st_mode & 0o7777)


def _atomic_write(path: Path, data: bytes, mode: int | None) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".sm12x-tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        # mkstemp makes 0600 files; the target keeps the mode it had (or the patch's).
        os.chmod(tmp, mode if mode is not None else 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def remove_empty_dirs(paths: list[Path]) -> None:
    """Remove folders a patch created, deepest first, where they are empty again."""
    for d in sorted(paths, key=lambda p: len(p.parts), reverse=True):
        try:
            d.rmdir()
        except OSError:
            pass
