"""Where the launcher finds its data and keeps its caches.

recipes/, patches/ and build/targets.yaml sit at the repository's top level.
A non-editable install carries copies under ``launcher/_data/`` (see
pyproject.toml); an editable install or a plain checkout reads the originals.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from launcher.errors import LauncherError

_PACKAGE = Path(__file__).resolve().parent


def data_path(*parts: str) -> Path:
    """Path of a shipped data file or folder (recipes, patches, build/targets.yaml)."""
    packaged = _PACKAGE.joinpath("_data", *parts)
    if packaged.exists():
        return packaged
    return _PACKAGE.parent.joinpath(*parts)


def recipes_dir() -> Path:
    return data_path("recipes")


def patches_dir() -> Path:
    return data_path("patches")


def cache_dir() -> Path:
    """Downloads (PyPI releases, extracted trees) live outside any clone so runs reuse them."""
    root = os.environ.get("VLLM_SM12X_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "vllm-sm12x"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def models_dir() -> Path:
    """The documented models folder: $MODELS_DIR, else ~/models."""
    return Path(os.environ.get("MODELS_DIR") or Path.home() / "models").expanduser()


_UNSAFE_CHARS = "\0\\:" if os.name == "nt" else "\0"


def inside(root: Path, rel: object, source: str, hint: str | None = None) -> Path:
    """``rel`` as a path under ``root``; LauncherError for anything that could leave it.

    For names read from files others can write (a patch journal or stamp in
    the vLLM tree, a Hub listing): each is checked before anything is written
    or deleted. A relative POSIX path without ``..`` (on Windows, nor ``\\``
    or ``:``, which mean a folder or a drive there), whose existing folders,
    symlinks resolved, stay under ``root``.
    """
    text = rel if isinstance(rel, str) else None
    pure = PurePosixPath(text) if text else None
    if (pure is None or pure.is_absolute() or ".." in pure.parts or pure.parts in ((), (".",))
            or any(c in text for c in _UNSAFE_CHARS)):
        raise _outside(root, rel, source, hint)
    path = root.joinpath(*pure.parts)
    try:
        escapes = not path.parent.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):  # a symlink loop
        escapes = True
    if escapes:
        raise _outside(root, rel, source, hint)
    return path


def _outside(root: Path, rel: object, source: str, hint: str | None) -> LauncherError:
    return LauncherError(
        f"{source} names {repr(rel)[:160]}, which is not a path inside {root}; nothing was written",
        hint=hint,
    )
