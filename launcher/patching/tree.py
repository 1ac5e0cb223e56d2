"""Finding the vLLM tree to patch and telling its version, without importing vLLM.

A tree is the folder that contains the ``vllm/`` package: a site-packages
folder (``vllm/`` beside ``vllm-X.dist-info/``) or a source tree (``setup.py``
or ``CMakeLists.txt`` beside ``vllm/``: an sdist or a checkout). Importing
vLLM would pull in torch and CUDA and may fail on the very bug a patch fixes,
so everything here reads text files.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from launcher.errors import LauncherError
from launcher.paths import inside

SITE_PACKAGES, SOURCE = "site-packages", "source"
_FORGED_HINT = ("the file was not written by the launcher: reinstall vLLM "
                "(pip install --force-reinstall --no-deps vllm==VERSION), then delete it")


@dataclass(frozen=True)
class Tree:
    """``root`` holds ``vllm/``; ``layout`` is site-packages or source."""

    root: Path
    layout: str

    @property
    def package(self) -> Path:
        return self.root / "vllm"

    def path(self, rel: str) -> Path:
        return self.root.joinpath(*rel.split("/"))

    def inside(self, rel: object, source: str) -> Path:
        """``rel``, read from a file in the tree (journal, stamp), as a path confined to the tree."""
        return inside(self.root, rel, source, hint=_FORGED_HINT)


def find_tree(target: Path | str | None = None) -> Tree:
    """The tree at ``target`` (site-packages, source tree, or the vllm folder), else the installed vLLM."""
    if target is None:
        return _installed_tree()
    path = Path(target).expanduser()
    if not path.exists():
        raise LauncherError(f"--target {path} does not exist")
    path = path.resolve()
    if _is_package(path / "vllm"):
        root = path
    elif path.name == "vllm" and _is_package(path):
        root = path.parent
    else:
        raise LauncherError(
            f"{path} holds no vllm package",
            hint="pass a site-packages folder, a vLLM source tree (setup.py + vllm/), or the vllm folder itself",
        )
    return Tree(root, _layout(root))


def _is_package(path: Path) -> bool:
    return (path / "__init__.py").is_file()


def _layout(root: Path) -> str:
    return SOURCE if (root / "setup.py").is_file() or (root / "CMakeLists.txt").is_file() else SITE_PACKAGES


def _installed_tree() -> Tree:
    # find_spec on a top-level name locates the package without running its __init__.
    spec = importlib.util.find_spec("vllm")
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise LauncherError(
            f"vLLM is not installed in this Python ({sys.executable})",
            hint="install vLLM, or pass --target DIR (site-packages or a vLLM source tree)",
        )
    package = Path(locations[0]).resolve()
    return Tree(package.parent, _layout(package.parent))


# ``__version__ = version = '0.21.0'`` (setuptools-scm) or ``__version__ = "0.21.0"``.
_ASSIGN = re.compile(
    r"""^(?:__version__|version)[ \t]*(?::[ \t]*str[ \t]*)?=[ \t]*"""
    r"""(?:(?:__version__|version)[ \t]*=[ \t]*)?['"]([^'"]+)['"]""",
    re.M,
)


def detect_version(tree: Tree) -> str:
    """The vLLM version of ``tree`` as its metadata states it (local tag kept: ``0.21.0+cu132``).

    Order: the wheel's ``vllm-*.dist-info/METADATA`` (what pip installed),
    an sdist's ``PKG-INFO`` (or ``vllm.egg-info/PKG-INFO``), then
    ``vllm/_version.py`` (written by setuptools-scm in builds and checkouts).
    """
    for finder in (_from_dist_info, _from_pkg_info, _from_version_py):
        version = finder(tree)
        if version:
            return version
    raise LauncherError(
        f"cannot tell the vLLM version of {tree.root}: no vllm-*.dist-info, PKG-INFO or vllm/_version.py",
        hint="a git checkout gets vllm/_version.py when built or installed (pip install -e .)",
    )


def _metadata(path: Path) -> tuple[str, str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    msg = HeaderParser().parsestr(text.split("\n\n", 1)[0] + "\n")
    return (msg.get("Name") or "").strip(), (msg.get("Version") or "").strip()


def _from_dist_info(tree: Tree) -> str | None:
    versions = []
    for meta in sorted(tree.root.glob("vllm-*.dist-info/METADATA")):
        name, version = _metadata(meta)
        if name.lower() == "vllm" and version:
            versions.append(version)
    if len(set(versions)) > 1:
        # Stale dist-info folders from an interrupted upgrade: _version.py breaks the tie.
        from_code = _from_version_py(tree)
        if from_code in versions:
            return from_code
        raise LauncherError(
            f"{tree.root} holds several vLLM dist-info folders ({', '.join(versions)})",
            hint="reinstall vLLM (pip install --force-reinstall vllm==X) so one remains",
        )
    return versions[0] if versions else None


def _from_pkg_info(tree: Tree) -> str | None:
    for meta in (tree.root / "PKG-INFO", tree.root / "vllm.egg-info" / "PKG-INFO"):
        if meta.is_file():
            name, version = _metadata(meta)
            if name.lower() == "vllm" and version:
                return version
    return None


def _from_version_py(tree: Tree) -> str | None:
    path = tree.package / "_version.py"
    if not path.is_file():
        return None
    m = _ASSIGN.search(path.read_text(encoding="utf-8", errors="replace"))
    return m.group(1) if m else None
