"""Fetch released vLLM files from PyPI into the cache, and unpack them.

Used by ``launcher patch check --against``, ``launcher build wheels`` and the
tests. PyPI's simple index (JSON form, PEP 691) lists every file with its
sha256; downloads are verified and kept under ``<cache>/pypi/`` so a second
run reads the disk only.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from launcher import progress
from launcher.errors import LauncherError
from launcher.paths import cache_dir

INDEX = os.environ.get("VLLM_SM12X_PYPI_INDEX", "https://pypi.org/simple")


@dataclass(frozen=True)
class ReleaseFile:
    filename: str
    url: str
    sha256: str


def _index_files(project: str) -> list[ReleaseFile]:
    req = urllib.request.Request(
        f"{INDEX}/{project}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            data = json.load(resp)
    except OSError as exc:
        raise LauncherError(
            f"cannot reach the package index {INDEX} for {project}: {exc}",
            hint="check the network, or set VLLM_SM12X_PYPI_INDEX to a mirror",
        ) from exc
    return [
        ReleaseFile(f["filename"], f["url"], f.get("hashes", {}).get("sha256", ""))
        for f in data.get("files", [])
        if not f.get("yanked")
    ]


def _pick(files: list[ReleaseFile], project: str, version: str, kind: str, arch: str) -> ReleaseFile:
    norm = project.replace("-", "_")
    if kind == "sdist":
        wanted = [f for f in files if f.filename in (f"{project}-{version}.tar.gz", f"{norm}-{version}.tar.gz")]
    else:
        # Prefer the plain build over re-uploads such as "-1-" build tags.
        wanted = sorted(
            (
                f
                for f in files
                if f.filename.startswith(f"{norm}-{version}-")
                and f.filename.endswith(f"{arch}.whl")
                and "manylinux" in f.filename
            ),
            key=lambda f: f.filename.count("-"),
        )
    if not wanted:
        raise LauncherError(f"PyPI has no {kind} of {project}=={version} for {arch if kind == 'wheel' else 'source'}")
    return wanted[0]


def fetch(project: str, version: str, kind: str = "wheel", arch: str = "x86_64") -> Path:
    """Download (once) and return the path of a release file. ``kind`` is wheel or sdist."""
    dest_dir = cache_dir() / "pypi"
    dest_dir.mkdir(parents=True, exist_ok=True)
    marker = dest_dir / f"{project}-{version}-{kind}-{arch}.name"
    if marker.exists():
        cached = dest_dir / marker.read_text().strip()
        if cached.exists():
            return cached
    rf = _pick(_index_files(project), project, version, kind, arch)
    target = dest_dir / rf.filename
    if not target.exists() or (rf.sha256 and _sha256(target) != rf.sha256):
        _download(rf, target)
    marker.write_text(rf.filename)
    return target


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _download(rf: ReleaseFile, target: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".part-")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(rf.url, timeout=300) as resp:
            length = resp.headers.get("Content-Length")
            progress.copy_with_progress(resp, out, rf.filename, int(length) if length and length.isdigit() else None)
        if rf.sha256 and _sha256(Path(tmp)) != rf.sha256:
            raise LauncherError(f"checksum mismatch downloading {rf.filename}")
        os.replace(tmp, target)
    except OSError as exc:
        raise LauncherError(f"download of {rf.filename} failed: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def unpacked(project: str, version: str, layout: str) -> Path:
    """A pristine, read-only-by-convention tree of a release, unpacked once.

    ``layout`` is ``site-packages`` (the wheel's Python files: the root holds
    ``vllm/`` and ``vllm-X.dist-info/``) or ``source`` (the sdist's top folder,
    holding ``CMakeLists.txt``, ``setup.py`` and ``vllm/``). Callers copy it
    before changing anything.
    """
    root = cache_dir() / "trees" / f"{project}-{version}-{layout}"
    done = root / ".complete"
    if done.exists():
        return _tree_top(root, layout)
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    progress.note(f"unpacking {project} {version} ({layout}) into {root}")
    if layout == "site-packages":
        with zipfile.ZipFile(fetch(project, version, "wheel")) as zf:
            # Python sources and metadata only: the compiled extensions are
            # hundreds of MB and no patch touches them.
            members = [n for n in zf.namelist() if n.endswith(".py") or ".dist-info/" in n]
            zf.extractall(root, members)
    elif layout == "source":
        with tarfile.open(fetch(project, version, "sdist")) as tf:
            tf.extractall(root, filter="data")
    else:
        raise ValueError(f"unknown layout {layout!r}")
    done.write_text("ok")
    return _tree_top(root, layout)


def _tree_top(root: Path, layout: str) -> Path:
    if layout == "source":
        subdirs = [p for p in root.iterdir() if p.is_dir()]
        if len(subdirs) == 1:
            return subdirs[0]
    return root
