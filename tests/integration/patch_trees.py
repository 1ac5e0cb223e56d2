"""Small copies of the released vLLM trees for the patch engine tests.

The released wheel and sdist (from PyPI, through ``launcher.pypi.unpacked``,
cached outside the clone) are the pristine source. Copying a whole tree per
test costs seconds on two cores, so each test copies what the engine reads:
the version metadata, ``vllm/__init__.py``, ``vllm/_version.py``, the build
files of a source tree, and the files the series touches, all byte for byte
with their modes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

from launcher.pypi import unpacked

LAYOUTS = ("site-packages", "source")
DATA = Path(__file__).resolve().parent.parent / "data"
TEST_PATCHES = DATA / "patches"


def pristine(version: str, layout: str) -> Path:
    return unpacked("vllm", version, layout)


def mini_tree(version: str, layout: str, dest: Path, rel_paths=()) -> Path:
    """Copy the parts of the released tree the engine needs into ``dest``; return ``dest``."""
    src = pristine(version, layout)
    dest.mkdir(parents=True, exist_ok=True)
    if layout == "site-packages":
        for info in src.glob("vllm-*.dist-info"):
            shutil.copytree(info, dest / info.name)
    wanted = ["vllm/__init__.py", "vllm/_version.py", *rel_paths]
    if layout == "source":
        wanted += ["PKG-INFO", "setup.py", "CMakeLists.txt"]
    for rel in wanted:
        path = src / rel
        if path.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest / rel)
    return dest


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``root``: sha256 and permission bits (compiled caches left out)."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            rel = path.relative_to(root).as_posix()
            out[rel] = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mode & 0o7777)
    return out


def dirs(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_dir() and p.name != "__pycache__"}


def copy_series(version: str, dest_root: Path, source_root: Path = TEST_PATCHES) -> Path:
    """Copy one version's series to ``dest_root/vllm/<version>`` (tests then add or edit patches)."""
    dest = dest_root / "vllm" / version
    shutil.copytree(source_root / "vllm" / version, dest)
    return dest


def single_patch_tree(version: str, patch, dest: Path, layout: str = "site-packages", extra=()) -> Path:
    """The released tree's files ``patch`` touches, plus ``extra``, with that patch
    applied alone through the engine (a one-entry series under ``dest/patches``)."""
    from launcher.patching import engine

    touched = [fp.path for fp in patch.files]
    tree = mini_tree(version, layout, dest / "tree", [*touched, *extra])
    root = dest / "patches"
    (root / "vllm" / version).mkdir(parents=True)
    shutil.copy2(patch.path, root / "vllm" / version / patch.name)
    (root / "vllm" / version / "series").write_text(patch.name + "\n")

    report = engine.apply(tree, patches_root=root)

    assert [(r.id, r.outcome) for r in report.results] == [(patch.id, "applied")]
    return tree


def patches_tree(version: str, patches, dest: Path, layout: str = "site-packages", extra=()) -> Path:
    """Like ``single_patch_tree``, with several patches of one series applied in order."""
    from launcher.patching import engine

    touched = [fp.path for patch in patches for fp in patch.files]
    tree = mini_tree(version, layout, dest / "tree", [*touched, *extra])
    root = dest / "patches" / "vllm" / version
    root.mkdir(parents=True)
    for patch in patches:
        shutil.copy2(patch.path, root / patch.name)
    (root / "series").write_text("".join(patch.name + "\n" for patch in patches))
    report = engine.apply(tree, patches_root=dest / "patches")
    assert [r.outcome for r in report.results] == ["applied"] * len(patches)
    return tree


def check_applies_alone(version: str, patch, layout: str, tmp_path: Path) -> None:
    """One patch, as the only entry of a series, applies through the engine to
    the released tree, changes every file it touches, and each still compiles."""
    import py_compile

    touched = [fp.path for fp in patch.files]
    tree = single_patch_tree(version, patch, tmp_path, layout)
    released = pristine(version, layout)
    for rel in touched:
        assert (tree / rel).read_bytes() != (released / rel).read_bytes(), rel
        py_compile.compile(str(tree / rel), cfile=str(tmp_path / "c.pyc"), doraise=True)


def series_applied_tree(version: str, dest: Path, extra=()) -> Path:
    """The released wheel's files a probe reads, with the whole series applied."""
    from launcher.patching import engine
    from launcher.patching.series import series_for

    series = series_for(version)
    touched = sorted({fp.path for p in series.patches for fp in p.files})
    tree = mini_tree(version, "site-packages", dest, [*touched, *extra])
    report = engine.apply(tree)
    assert {r.outcome for r in report.results} == {"applied"}
    return tree


def run_probe(probe: Path, code_root: Path, *args: str, timeout: float = 120) -> dict:
    """Run a probe script on a tree in its own interpreter; its one JSON line."""
    run = subprocess.run([sys.executable, str(probe), str(code_root), *args], capture_output=True,
                         text=True, timeout=timeout)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout)
