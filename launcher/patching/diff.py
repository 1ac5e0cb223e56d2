"""Git-style unified diffs: parsing into hunks, and an exact-context applier.

Why unidiff plus our own applier: no maintained PyPI library does both halves
the engine needs. ``unidiff`` parses git diffs well (``diff --git`` headers,
new/deleted file modes, ``\\ No newline at end of file``) but applies
nothing. ``patch-ng`` and ``whatthepatch`` apply, but write file by file (no
all-or-nothing across a series), normalise or lose CRLF line endings, drop
file modes, and cannot tell "already applied" from "conflict" without
running twice on disk. The applier below works on bytes in memory: it matches
each hunk's old side exactly (no fuzz; the hunk may sit at a line offset, as
with ``patch``), keeps the bytes of every context line, gives added lines the
file's own line ending, and raises :class:`HunkMismatch` naming the file and
the hunk. Applying a reversed patch is the same code, which is how the engine
recognises a patch that is already present.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath

import unidiff
from unidiff.constants import LINE_TYPE_EMPTY, LINE_TYPE_NO_NEWLINE

from launcher.errors import LauncherError

# Diff operations of a hunk line.
CONTEXT, REMOVE, ADD = " ", "-", "+"


@dataclass(frozen=True)
class Hunk:
    """One ``@@`` block: the old and new sides as byte lines without line endings."""

    index: int
    count: int
    old_start: int
    new_start: int
    ops: tuple[tuple[str, bytes], ...]
    old_no_eol: bool = False
    new_no_eol: bool = False
    section: str = ""

    @property
    def old(self) -> list[bytes]:
        return [text for op, text in self.ops if op != ADD]

    @property
    def new(self) -> list[bytes]:
        return [text for op, text in self.ops if op != REMOVE]

    @property
    def header(self) -> str:
        old, new = self.old, self.new
        head = f"@@ -{self.old_start},{len(old)} +{self.new_start},{len(new)} @@"
        return f"{head} {self.section}".rstrip()

    def label(self) -> str:
        return f"hunk {self.index}/{self.count} ({self.header})"

    def reversed(self) -> Hunk:
        swap = {CONTEXT: CONTEXT, REMOVE: ADD, ADD: REMOVE}
        return replace(
            self,
            old_start=self.new_start,
            new_start=self.old_start,
            ops=tuple((swap[op], text) for op, text in self.ops),
            old_no_eol=self.new_no_eol,
            new_no_eol=self.old_no_eol,
        )


@dataclass(frozen=True)
class FilePatch:
    """The change a patch makes to one file. ``path`` is relative to the tree root."""

    path: str
    kind: str  # "modify", "add" or "delete"
    hunks: tuple[Hunk, ...]
    old_mode: int | None = None
    new_mode: int | None = None

    def reversed(self) -> FilePatch:
        kind = {"modify": "modify", "add": "delete", "delete": "add"}[self.kind]
        return FilePatch(
            self.path, kind, tuple(h.reversed() for h in self.hunks), self.new_mode, self.old_mode
        )


@dataclass
class HunkMismatch(Exception):
    """A hunk whose old side is not in the file: names the file, the hunk and the first difference."""

    path: str
    hunk: Hunk | None
    detail: str

    def __str__(self) -> str:
        where = f"{self.path} {self.hunk.label()}" if self.hunk else self.path
        return f"{where}: {self.detail}"


@dataclass
class Applied:
    """Result of applying one file patch: the new bytes (None: file removed) and hunk offsets."""

    content: bytes | None
    offsets: list[int] = field(default_factory=list)


def parse(text: str, source: str, allowed_prefix: str | None = None) -> tuple[FilePatch, ...]:
    """Parse the diff part of a patch file.

    ``source`` names the patch in errors. Paths lose one leading component
    (``a/``, ``b/``). ``allowed_prefix`` (``"vllm/"`` for runtime patches)
    keeps a runtime patch from reaching outside the package, so the same
    patch fits site-packages and a source tree.
    """
    try:
        patch_set = unidiff.PatchSet(text)
    except unidiff.UnidiffParseError as exc:
        raise LauncherError(f"patch {source} is not a valid unified diff: {exc}") from exc
    if not len(patch_set):
        raise LauncherError(f"patch {source} contains no diff")
    files: list[FilePatch] = []
    seen: set[str] = set()
    for pf in patch_set:
        fp = _file_patch(pf, source)
        if allowed_prefix and not fp.path.startswith(allowed_prefix):
            raise LauncherError(
                f"patch {source} touches {fp.path}, outside {allowed_prefix}",
                hint="patches for files outside vllm/ (CMake, setup.py) belong in the build/ series",
            )
        if fp.path in seen:
            raise LauncherError(f"patch {source} changes {fp.path} twice; merge those diffs")
        seen.add(fp.path)
        files.append(fp)
    return tuple(files)


def _file_patch(pf: unidiff.PatchedFile, source: str) -> FilePatch:
    if pf.is_binary_file:
        raise LauncherError(f"patch {source}: binary diffs are not supported ({pf.path})")
    if pf.is_rename:
        raise LauncherError(f"patch {source}: renames are not supported ({pf.path})")
    if pf.is_added_file:
        path, kind = pf.target_file, "add"
    elif pf.is_removed_file:
        path, kind = pf.source_file, "delete"
    else:
        path, kind = pf.target_file, "modify"
        if pf.source_file.split("/", 1)[-1] != pf.target_file.split("/", 1)[-1]:
            raise LauncherError(f"patch {source}: {pf.source_file} and {pf.target_file} differ")
    old_mode, new_mode = _mode(pf.source_mode), _mode(pf.target_mode)
    if kind == "modify" and old_mode and new_mode and old_mode != new_mode:
        raise LauncherError(f"patch {source}: mode changes are not supported ({pf.path})")
    rel = _strip_one(path, source)
    hunks = [_hunk(h, i + 1, len(pf)) for i, h in enumerate(pf)]
    if kind != "modify" and len(hunks) > 1:
        raise LauncherError(f"patch {source}: a created or deleted file must be one hunk ({rel})")
    return FilePatch(rel, kind, tuple(hunks), old_mode, new_mode)


def _mode(text: str | None) -> int | None:
    return int(text, 8) & 0o7777 if text else None


def _strip_one(path: str, source: str) -> str:
    parts = PurePosixPath(path).parts
    if len(parts) < 2 or PurePosixPath(path).is_absolute():
        raise LauncherError(f"patch {source}: path {path!r} lacks the a/ or b/ component")
    rel = PurePosixPath(*parts[1:])
    if ".." in rel.parts or "\\" in str(rel) or ":" in str(rel):
        raise LauncherError(f"patch {source}: unsafe path {path!r}")
    return rel.as_posix()


def _hunk(h: unidiff.Hunk, index: int, count: int) -> Hunk:
    ops: list[tuple[str, bytes]] = []
    old_no_eol = new_no_eol = False
    for line in h:
        if line.line_type == LINE_TYPE_NO_NEWLINE:
            # The marker refers to the line just before it, on its side(s).
            last = ops[-1][0] if ops else CONTEXT
            old_no_eol = old_no_eol or last in (CONTEXT, REMOVE)
            new_no_eol = new_no_eol or last in (CONTEXT, ADD)
            continue
        # An empty hunk line is a blank context line whose leading space an editor trimmed.
        op = CONTEXT if line.line_type == LINE_TYPE_EMPTY else line.line_type
        if op not in (CONTEXT, REMOVE, ADD):
            continue
        ops.append((op, line.value.rstrip("\n").encode("utf-8")))
    return Hunk(
        index=index,
        count=count,
        old_start=h.source_start,
        new_start=h.target_start,
        ops=tuple(ops),
        old_no_eol=old_no_eol,
        new_no_eol=new_no_eol,
        section=h.section_header.strip(),
    )


# ---------------------------------------------------------------- the applier


def split_lines(data: bytes) -> list[bytes]:
    """Lines with their endings kept; only ``\\n`` ends a line (``\\r\\n`` keeps its ``\\r``)."""
    lines = data.split(b"\n")
    out = [line + b"\n" for line in lines[:-1]]
    if lines[-1]:
        out.append(lines[-1])
    return out


def _text(line: bytes) -> bytes:
    if line.endswith(b"\r\n"):
        return line[:-2]
    if line.endswith(b"\n"):
        return line[:-1]
    return line


def _eol(line: bytes) -> bytes:
    return line[len(_text(line)) :]


def dominant_eol(lines: list[bytes]) -> bytes:
    """The ending most lines use: what added lines get, so a CRLF file stays CRLF."""
    crlf = sum(1 for line in lines if line.endswith(b"\r\n"))
    return b"\r\n" if crlf * 2 > len(lines) else b"\n"


def apply_file(content: bytes | None, fp: FilePatch) -> Applied:
    """Apply ``fp`` to ``content`` (None: the file does not exist); raise HunkMismatch."""
    if fp.kind == "add":
        if content is not None:
            raise HunkMismatch(fp.path, None, "the patch creates this file, but it already exists")
        hunk = fp.hunks[0] if fp.hunks else None
        new = hunk.new if hunk else []
        body = b"".join(line + b"\n" for line in new)
        if hunk and hunk.new_no_eol and body:
            body = body[:-1]
        return Applied(body)
    if content is None:
        raise HunkMismatch(fp.path, fp.hunks[0] if fp.hunks else None, "the file does not exist")
    lines = split_lines(content)
    if fp.kind == "delete":
        hunk = fp.hunks[0] if fp.hunks else None
        old = hunk.old if hunk else []
        if [_text(line) for line in lines] != old:
            raise HunkMismatch(fp.path, hunk, "the patch deletes this file, but its content differs")
        return Applied(None)
    eol = dominant_eol(lines)
    out: list[bytes] = []
    pos = 0  # first line of ``lines`` not yet copied to ``out``
    shift = 0  # where the previous hunk landed relative to its header
    offsets: list[int] = []
    for hunk in fp.hunks:
        old = hunk.old
        expected = max(hunk.old_start - 1 + shift, pos) if old else hunk.old_start + shift
        at = _find(lines, old, expected, pos) if old else min(max(expected, pos), len(lines))
        if at is None:
            raise HunkMismatch(fp.path, hunk, _first_difference(lines, old, expected))
        offsets.append(at - (hunk.old_start - 1 if old else hunk.old_start))
        shift = offsets[-1]
        out.extend(lines[pos:at])
        src = at
        for op, text in hunk.ops:
            if op == CONTEXT:
                _append(out, lines[src], eol)
                src += 1
            elif op == REMOVE:
                src += 1
            else:
                _append(out, text + eol, eol)
        pos = src
    out.extend(lines[pos:])
    if out and fp.hunks and fp.hunks[-1].new_no_eol and pos == len(lines):
        out[-1] = _text(out[-1])
    return Applied(b"".join(out), offsets)


def _append(out: list[bytes], line: bytes, eol: bytes) -> None:
    # A line after a last line that lacked its ending gives that line one.
    if out and not _eol(out[-1]):
        out[-1] += eol
    out.append(line)


def _find(lines: list[bytes], old: list[bytes], expected: int, lower: int) -> int | None:
    """Where ``old`` matches exactly, nearest to ``expected``, not before ``lower``."""
    n, last = len(old), len(lines) - len(old)
    if last < lower:
        return None
    texts = [_text(line) for line in lines]
    expected = min(max(expected, lower), last)
    for distance in range(0, max(expected - lower, last - expected) + 1):
        for at in (expected - distance, expected + distance) if distance else (expected,):
            if lower <= at <= last and texts[at : at + n] == old:
                return at
    return None


def _first_difference(lines: list[bytes], old: list[bytes], expected: int) -> str:
    """Say where the hunk fails at its expected place: the first differing line."""
    for i, want in enumerate(old):
        at = expected + i
        if at >= len(lines):
            return f"not found; the file ends at line {len(lines)}, the hunk expects {want.decode(errors='replace')!r}"
        got = _text(lines[at])
        if got != want:
            return (
                f"not found; at line {at + 1} it expects {want.decode(errors='replace')!r}"
                f" but the file has {got.decode(errors='replace')!r}"
            )
    return "not found (the lines appear only where an earlier hunk already applied)"
