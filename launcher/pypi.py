"""Fetch released vLLM files from PyPI into the cache, and unpack them.

Used by ``launcher patch check --against``, ``launcher build wheels`` and the
tests. PyPI's simple index (JSON form, PEP 691) lists every file with its
sha256; downloads are verified and kept under ``<cache>/pypi/`` so a second
run reads the disk only. The Python files of a wheel that is not cached are
read with range requests instead of downloading it (``launcher.ranged_zip``).
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


def _index(project: str) -> dict:
    req = urllib.request.Request(
        f"{INDEX}/{project}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.load(resp)
    except OSError as exc:
        raise LauncherError(
            f"cannot reach the package index {INDEX} for {project}: {exc}",
            hint="check the network, or set VLLM_SM12X_PYPI_INDEX to a mirror",
        ) from exc
    except ValueError:  # HTML, or anything else that is not JSON
        raise LauncherError(
            f"the package index {INDEX} answered for {project} with something that is not JSON",
            hint="VLLM_SM12X_PYPI_INDEX must serve the JSON simple API (PEP 691), as pypi.org/simple does",
        ) from None


def latest_release(project: str) -> str:
    """The newest final release with a file that is not yanked (pre-releases skipped)."""
    from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, parse_sdist_filename, parse_wheel_filename

    found = set()
    for f in _index(project).get("files", []):
        if f.get("yanked"):
            continue
        try:
            name = f["filename"]
            version = parse_wheel_filename(name)[1] if name.endswith(".whl") else parse_sdist_filename(name)[1]
        except (InvalidWheelFilename, InvalidSdistFilename):
            continue
        if not version.is_prerelease and not version.is_devrelease:
            found.add(version)
    if not found:
        raise LauncherError(f"the package index {INDEX} lists no release of {project}")
    return str(max(found))


def _index_files(project: str) -> list[ReleaseFile]:
    data = _index(project)
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
    cached = _cached(project, version, kind, arch)
    if cached is not None:
        return cached
    dest_dir = cache_dir() / "pypi"
    dest_dir.mkdir(parents=True, exist_ok=True)
    marker = dest_dir / f"{project}-{version}-{kind}-{arch}.name"
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
    if (root / ".complete").exists():
        return _tree_top(root, layout)
    if layout not in ("site-packages", "source"):
        raise ValueError(f"unknown layout {layout!r}")
    # Unpacked beside the final folder and renamed into place: several
    # processes (parallel test runs, other checkouts) share this cache, and a
    # reader must never see a half-written tree.
    root.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}-"))
    os.chmod(work, 0o755)
    progress.note(f"unpacking {project} {version} ({layout}) into {root}")
    try:
        _extract(project, version, layout, work)
        (work / ".complete").write_text("ok")
        if root.exists() and not (root / ".complete").exists():
            shutil.rmtree(root)  # left by an interrupted run of an older launcher
        try:
            os.rename(work, root)
        except OSError:
            if not (root / ".complete").exists():
                raise  # not a racing unpack that finished first
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _tree_top(root, layout)


def _python_file(name: str) -> bool:
    # Python sources and metadata only: the compiled extensions are hundreds
    # of MB and no patch touches them.
    return name.endswith(".py") or ".dist-info/" in name


def _extract(project: str, version: str, layout: str, dest: Path) -> None:
    if layout == "site-packages":
        wheel = _cached(project, version, "wheel", "x86_64") or _python_files_only(project, version, dest)
        if wheel is not None:
            with zipfile.ZipFile(wheel) as zf:
                zf.extractall(dest, [n for n in zf.namelist() if _python_file(n)])
    else:
        with tarfile.open(fetch(project, version, "sdist")) as tf:
            tf.extractall(dest, filter="data")


def _cached(project: str, version: str, kind: str, arch: str) -> Path | None:
    marker = cache_dir() / "pypi" / f"{project}-{version}-{kind}-{arch}.name"
    if marker.exists():
        path = marker.parent / marker.read_text().strip()
        if path.exists():
            return path
    return None


def _python_files_only(project: str, version: str, dest: Path) -> Path | None:
    """Read only the wheel's Python files (ranged requests, about a thirtieth of
    the wheel); None when that worked, else the downloaded wheel to unpack."""
    from launcher import ranged_zip

    rf = _pick(_index_files(project), project, version, "wheel", "x86_64")
    scratch = dest.parent / f".{dest.name}.sparse"
    try:
        ranged_zip.extract(rf.url, dest, _python_file, scratch)
        return None
    except (ranged_zip.RangesUnsupported, OSError, zipfile.BadZipFile):
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir()
        return fetch(project, version, "wheel")
    finally:
        scratch.unlink(missing_ok=True)


def _tree_top(root: Path, layout: str) -> Path:
    if layout == "source":
        subdirs = [p for p in root.iterdir() if p.is_dir()]
        if len(subdirs) == 1:
            return subdirs[0]
    return root
