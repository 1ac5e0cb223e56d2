"""The patch series on disk: which vLLM versions have one, and what each holds.

Layout (the contract recipes, builds and images rely on)::

    patches/vllm/<version>/series            runtime patches, one file name a line
    patches/vllm/<version>/NNNN-<id>.patch
    patches/vllm/<version>/build/series      optional: build files outside vllm/
    patches/vllm/<version>/build/NNNN-<id>.patch

A patch file is a header of ``Key: value`` lines (``Subject``, ``Fixes`` and
``Upstream-Status`` required; ``Applies-To``, ``Bug`` and others optional), a
free-text description after a blank line, then git-style diffs with
``a/vllm/...`` / ``b/vllm/...`` paths. Recipes name patches by id: the file
name without ``NNNN-`` and ``.patch``.

The patches root is ``launcher.paths.patches_dir()`` unless a caller passes
``patches_root`` or sets ``VLLM_SM12X_PATCHES`` (tests and people developing
a series point the engine at another folder that way).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from launcher.errors import LauncherError
from launcher.patching.diff import FilePatch, parse
from launcher.paths import patches_dir

REQUIRED_HEADERS = ("Subject", "Fixes", "Upstream-Status")
_NAME = re.compile(r"^(?P<num>\d{4})-(?P<id>[A-Za-z0-9][A-Za-z0-9._-]*)\.patch$")
_HEADER = re.compile(r"^(?P<key>[A-Za-z][A-Za-z0-9-]*):[ \t]*(?P<value>.*)$")


def patches_root(override: Path | str | None = None) -> Path:
    """The folder holding ``vllm/<version>/``: argument, else $VLLM_SM12X_PATCHES, else the shipped one."""
    if override is not None:
        return Path(override)
    env = os.environ.get("VLLM_SM12X_PATCHES")
    return Path(env) if env else patches_dir()


@dataclass(frozen=True)
class Patch:
    """One patch file of a series, read and validated at load time."""

    id: str
    name: str
    path: Path
    headers: dict[str, str]
    description: str
    diff_text: str
    sha256: str
    kind: str = "runtime"  # or "build"

    @functools.cached_property
    def files(self) -> tuple[FilePatch, ...]:
        prefix = "vllm/" if self.kind == "runtime" else None
        return parse(self.diff_text, self.name, allowed_prefix=prefix)

    @property
    def subject(self) -> str:
        return self.headers.get("Subject", "")


@dataclass(frozen=True)
class Series:
    """The patches for one vLLM release, in application order."""

    version: str
    path: Path
    patches: list[Patch] = field(default_factory=list)
    build_patches: list[Patch] = field(default_factory=list)

    @functools.cached_property
    def hash(self) -> str:
        """Stable over checkouts (line endings of the patch files do not count)."""
        h = hashlib.sha256(f"vllm-sm12x series {self.version}\n".encode())
        for patch in [*self.patches, *self.build_patches]:
            h.update(f"{patch.kind} {patch.name} {patch.sha256}\n".encode())
        return h.hexdigest()

    def for_layout(self, layout: str) -> list[Patch]:
        """Runtime patches everywhere; build patches only where the build files are (source trees)."""
        return [*self.patches, *self.build_patches] if layout == "source" else list(self.patches)

    def by_id(self, patch_id: str) -> Patch | None:
        return next((p for p in [*self.patches, *self.build_patches] if p.id == patch_id), None)


def available_versions(patches_root_dir: Path | str | None = None) -> list[str]:
    """Versions with a ``series`` file, oldest first."""
    base = patches_root(patches_root_dir) / "vllm"
    if not base.is_dir():
        return []
    found = [d.name for d in base.iterdir() if (d / "series").is_file()]
    return sorted(found, key=_sort_key)


def _sort_key(version: str):
    try:
        return (0, Version(version), version)
    except InvalidVersion:
        return (1, Version("0"), version)


def public_version(version: str) -> str:
    """``0.21.0+cu132`` -> ``0.21.0``: local builds of a release use the release's series."""
    try:
        return Version(version).public
    except InvalidVersion as exc:
        raise LauncherError(f"{version!r} is not a valid vLLM version") from exc


def series_for(version: str, patches_root_dir: Path | str | None = None) -> Series:
    """The series for a vLLM version (local tags ignored); LauncherError when there is none."""
    public = public_version(version)
    versions = available_versions(patches_root_dir)
    match = next((v for v in versions if public_version(v) == public), None)
    if match is None:
        have = ", ".join(versions) or "none"
        if not versions:
            raise LauncherError(f"no patch series for vLLM {version}; series exist for: {have}")
        from launcher.vllm_compat import nearest_release

        near = nearest_release(public, versions)
        raise LauncherError(
            f"no patch series for vLLM {version}, so it is not supported; the nearest supported release is "
            f"{near} (series exist for: {have})",
            hint=f"install vLLM {near} (pip install vllm=={near}); to see how {near}'s series fits {public}: "
                 f"launcher patch check --against vllm=={public} --series {near}",
        )
    return load_series(patches_root(patches_root_dir) / "vllm" / match)


def load_series(folder: Path) -> Series:
    """Read and validate ``folder/series`` (and ``folder/build/series`` when present)."""
    runtime = _load_list(folder, "runtime")
    build = _load_list(folder / "build", "build") if (folder / "build" / "series").is_file() else []
    seen: dict[str, str] = {}
    for patch in [*runtime, *build]:
        if patch.id in seen:
            raise LauncherError(f"series {folder}: patch id {patch.id!r} is used by {seen[patch.id]} and {patch.name}")
        seen[patch.id] = patch.name
    return Series(folder.name, folder, runtime, build)


def _load_list(folder: Path, kind: str) -> list[Patch]:
    series_file = folder / "series"
    names: list[str] = []
    for raw in series_file.read_text(encoding="utf-8").splitlines():
        name = raw.split("#", 1)[0].strip()
        if not name:
            continue
        if name in names:
            raise LauncherError(f"{series_file} lists {name} twice")
        names.append(name)
    return [load_patch(folder / name, kind) for name in names]


def load_patch(path: Path, kind: str = "runtime") -> Patch:
    """Read one patch file: validate its name and header, split off the diff."""
    m = _NAME.match(path.name)
    if not m:
        raise LauncherError(f"patch file name {path.name!r} is not NNNN-<id>.patch", hint=f"in {path.parent}")
    if not path.is_file():
        raise LauncherError(f"series {path.parent / 'series'} lists {path.name}, which does not exist")
    # Normalised to LF so a Windows checkout (autocrlf) reads and hashes the same patch.
    text = path.read_bytes().replace(b"\r\n", b"\n").decode("utf-8")
    headers, description, diff_text = split_patch_text(text, path.name)
    missing = [k for k in REQUIRED_HEADERS if not headers.get(k)]
    if missing:
        raise LauncherError(f"patch {path.name} lacks header(s): {', '.join(missing)}", hint=f"in {path}")
    sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return Patch(m["id"], path.name, path, headers, description, diff_text, sha, kind)


def split_patch_text(text: str, source: str) -> tuple[dict[str, str], str, str]:
    """Header dict, description, diff text. The diff starts at the first ``diff --git``
    (or a ``--- `` line directly followed by ``+++ ``)."""
    lines = text.split("\n")
    start = None
    for i, line in enumerate(lines):
        if line.startswith("diff --git ") or (
            line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")
        ):
            start = i
            break
    if start is None:
        raise LauncherError(f"patch {source} contains no diff")
    headers: dict[str, str] = {}
    last_key = None
    i = 0
    for i, line in enumerate(lines[:start]):
        if not line.strip():
            break
        m = _HEADER.match(line)
        if m:
            last_key = m["key"]
            headers[last_key] = m["value"].strip()
        elif line[:1] in (" ", "\t") and last_key:
            headers[last_key] += " " + line.strip()  # folded header line
        else:
            raise LauncherError(f"patch {source}: header line {i + 1} is not 'Key: value': {line!r}")
    else:
        i = start
    description = "\n".join(lines[i:start]).strip()
    return headers, description, "\n".join(lines[start:])
