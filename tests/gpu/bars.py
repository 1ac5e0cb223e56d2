"""The committed criteria of every GPU report (bars.yaml) and their version (its git blob hash).

Reports read their thresholds here instead of keeping constants of their own, so the numbers a
record was judged by are the ones a reader finds in the file the record names.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

BARS_FILE = Path(__file__).resolve().parent / "bars.yaml"


@functools.cache
def load(path: Path = BARS_FILE) -> dict:
    import yaml

    return yaml.safe_load(Path(path).read_text(encoding="utf-8"))


def get(section: str, key: str):
    """One criterion; KeyError when the file lacks it (a report must not fall back to a guess)."""
    return load()[section][key]


def blob_hash(path: Path = BARS_FILE) -> str:
    """``git hash-object`` of the file, computed without git (the GPU host has a copy of the tree,
    not always its .git): sha1 of "blob <size>\\0" and the bytes."""
    data = Path(path).read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
