"""The committed criteria of every GPU report (bars.yaml) and their version (its git blob hash).

Reports read their thresholds here instead of keeping constants of their own, so the numbers a
record was judged by are the ones a reader finds in the file the record names.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

BARS_FILE = Path(__file__).resolve().parents[1] / "bars.yaml"


@functools.cache
def load(path: Path = BARS_FILE) -> dict:
    text = Path(path).read_text(encoding="utf-8")
    try:
        import yaml
    except ImportError:  # a GPU host's interpreter without PyYAML: the file keeps to what parse reads
        return parse(text)
    return yaml.safe_load(text)


def _scalar(value: str):
    if value in ("true", "false"):
        return value == "true"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def parse(text: str) -> dict:
    """bars.yaml's subset of YAML: sections of ``key: scalar`` lines, ``#`` comments."""
    out: dict = {}
    section = None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        key, _, value = line.strip().partition(":")
        if not line.startswith(" "):
            section = out.setdefault(key, {})
        elif section is not None:
            section[key] = _scalar(value.strip())
    return out


def get(section: str, key: str):
    """One criterion; KeyError when the file lacks it (a report must not fall back to a guess)."""
    return load()[section][key]


def at(blob: str | None) -> dict:
    """The criteria as the version ``blob`` (a record's ``bars``) had them: a record keeps the
    verdict of the file it was made under. The current file where the blob is this one or none is
    named; a blob no git history here holds is an error, never the current file in its place."""
    if not blob or blob == blob_hash():
        return load()
    import subprocess

    try:
        return parse(_git(BARS_FILE.parents[2], "cat-file", "-p", blob))
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ValueError(f"bars.yaml version {blob} is not in this checkout's git history") from exc


def blob_hash(path: Path = BARS_FILE) -> str:
    """``git hash-object`` of the file, computed without git (the GPU host has a copy of the tree,
    not always its .git): sha1 of "blob <size>\\0" and the bytes."""
    data = Path(path).read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


# ---------------------------------------------------------------- provenance: bars before record


def _git(repo: Path, *args: str) -> str:
    import subprocess

    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout


def committed_versions(repo: Path, path: str = "tests/gpu/bars.yaml") -> dict[str, str]:
    """Blob hash -> the first commit (oldest) whose ``path`` had that content."""
    versions: dict[str, str] = {}
    for commit in _git(repo, "log", "--format=%H", "--", path).split():  # newest first
        try:
            blob = _git(repo, "rev-parse", f"{commit}:{path}").strip()
        except Exception:  # the commit that deleted the file
            continue
        versions[blob] = commit  # later iterations are older: the oldest wins
    return versions


def first_commit_naming(repo: Path, text: str, path: str) -> str | None:
    """The oldest commit that added ``text`` to ``path`` (git log -S), or None."""
    found = _git(repo, "log", "--format=%H", "--reverse", "-S", text, "--", path).split()
    return found[0] if found else None


def provenance(repo: Path, record: dict, path: str, bars_path: str = "tests/gpu/bars.yaml",
               versions: dict[str, str] | None = None) -> str:
    """Whether the record at ``path`` was judged under a bars file committed before it:
    "bars committed before the record", "predates the bars file" (the record names none),
    "bars version never committed", or "bars not committed before the record" (the same commit
    or a later one, or not an ancestor of the record's commit)."""
    blob = record.get("bars")
    if not blob:
        return "predates the bars file"
    versions = committed_versions(repo, bars_path) if versions is None else versions
    bars_commit = versions.get(blob)
    if bars_commit is None:
        return "bars version never committed"
    record_commit = first_commit_naming(repo, blob, path)
    if record_commit is None:
        # not committed yet: the bars it names are in the history, so they came first
        return "bars committed before the record"
    if record_commit == bars_commit:
        return "bars not committed before the record"
    try:
        _git(repo, "merge-base", "--is-ancestor", bars_commit, record_commit)
    except Exception:
        return "bars not committed before the record"
    return "bars committed before the record"
