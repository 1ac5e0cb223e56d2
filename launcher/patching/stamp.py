"""The stamp file: what the launcher applied to a tree, kept inside the tree.

``vllm/.sm12x-patches.json`` travels with the package it describes, so
``launcher patch status`` and ``launcher doctor`` can read it in an image, a
venv or a source tree alike. Each entry carries its diff: ``revert`` undoes
exactly what was applied even after the launcher (and its series) changed.

``origin`` tells ``applied`` (written by the launcher, undone by revert) from
``present`` (found already in the tree: upstream, or applied by hand; revert
leaves it alone).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone

from launcher.errors import LauncherError
from launcher.patching.transaction import read_record
from launcher.patching.tree import Tree

STAMP_REL = "vllm/.sm12x-patches.json"
FORMAT = 1


@dataclass(frozen=True)
class StampEntry:
    id: str
    file: str
    sha256: str
    kind: str
    origin: str
    files: list[str]
    diff: str

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "file": self.file,
            "sha256": self.sha256,
            "kind": self.kind,
            "origin": self.origin,
            "files": self.files,
            "diff": self.diff,
        }


def read_stamp(tree: Tree) -> dict | None:
    """The stamp as a dict, None when the tree has none; LauncherError when it is unreadable."""
    path = tree.path(STAMP_REL)
    if not path.is_file():
        return None
    try:
        data = json.loads(read_record(path).decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise LauncherError(
            f"the patch stamp {path} is unreadable: {exc}",
            hint="restore vLLM (pip install --force-reinstall) and delete the stamp, then apply again",
        ) from exc
    if not isinstance(data, dict) or not isinstance(data.get("patches"), list):
        raise LauncherError(f"the patch stamp {path} is not one this launcher wrote")
    return data


def stamp_entries(stamp: dict | None) -> list[StampEntry]:
    if not stamp:
        return []
    entries = []
    for raw in stamp["patches"]:
        try:
            entries.append(
                StampEntry(
                    id=str(raw["id"]),
                    file=str(raw["file"]),
                    sha256=str(raw["sha256"]),
                    kind=str(raw.get("kind", "runtime")),
                    origin=str(raw.get("origin", "applied")),
                    files=list(raw.get("files", [])),
                    diff=str(raw.get("diff", "")),
                )
            )
        except (KeyError, TypeError) as exc:
            raise LauncherError(f"the patch stamp lists a malformed entry: {raw!r}") from exc
    return entries


def created_dirs(stamp: dict | None, tree: Tree) -> list[str]:
    """The folders the stamp says the launcher created, each checked to lie inside the tree.

    ``revert`` removes them once empty: a forged stamp must not name one elsewhere.
    """
    listed = (stamp or {}).get("created_dirs", [])
    if not isinstance(listed, list):
        raise LauncherError(f"the patch stamp {tree.path(STAMP_REL)} is not one this launcher wrote")
    source = f"the patch stamp {tree.path(STAMP_REL)}"
    return [tree.inside(d, source).relative_to(tree.root).as_posix() for d in listed]


def build_stamp(
    *,
    vllm_version: str,
    series_version: str,
    series_hash: str,
    layout: str,
    entries: list[StampEntry],
    created_dirs: list[str],
) -> dict:
    return {
        "format": FORMAT,
        "tool": "vllm-sm12x-launcher",
        "vllm_version": vllm_version,
        "series_version": series_version,
        "series_hash": series_hash,
        "layout": layout,
        "applied_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "created_dirs": created_dirs,
        "patches": [e.to_dict() for e in entries],
    }


def same_content(a: dict | None, b: dict | None) -> bool:
    """Equal apart from the time: an unchanged tree keeps its stamp byte for byte."""
    if a is None or b is None:
        return a is b
    strip = lambda d: {k: v for k, v in d.items() if k != "applied_at"}  # noqa: E731
    return strip(a) == strip(b)


def encode(stamp: dict) -> bytes:
    return (json.dumps(stamp, indent=2, sort_keys=False) + "\n").encode("utf-8")
