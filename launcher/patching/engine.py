"""Apply, revert, inspect and check the patch series on a vLLM tree.

Everything is decided in memory before a byte is written. For a series
``P1..Pn`` and the current files, the engine first peels: from ``Pn`` down to
``P1`` it reverse-applies every patch that reverse-applies cleanly (those are
present: applied earlier, by hand, or already upstream). On that base every
patch must then apply forwards in order; the ones peeled are "already
applied", the others are applied now. A patch that fits neither way is a
conflict, and the error names the file and the hunk. Peeling in reverse
order is what keeps later patches that touch the same lines from hiding
earlier ones.

Only when every patch of the series fits are files written, through a
:class:`~launcher.patching.transaction.Transaction` (all or nothing); then
the stamp (:mod:`launcher.patching.stamp`) records what was done.
"""

from __future__ import annotations

import errno
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from launcher import interrupts
from launcher.errors import LauncherError
from launcher.patching import stamp as stamps
from launcher.patching.diff import FilePatch, HunkMismatch, apply_file, parse
from launcher.patching.series import Patch, Series, public_version, series_for
from launcher.patching import transaction
from launcher.patching.lock import held_elsewhere, tree_lock
from launcher.patching.transaction import Transaction, read_source, remove_empty_dirs
from launcher.patching.tree import SITE_PACKAGES, SOURCE, Tree, detect_version, find_tree

__all__ = [
    "CheckRow",
    "PatchResult",
    "PatchStatus",
    "Report",
    "SeriesStatus",
    "Tree",
    "apply",
    "check_against",
    "check_tree",
    "detect_version",
    "find_tree",
    "interrupted",
    "recover",
    "revert",
    "status",
]

PathArg = Path | str | None
#: Beside the stamp: what an unfinished write must put back (launcher.patching.transaction).
JOURNAL_REL = "vllm/.sm12x-journal.json"

#: Test seam: called with a description before each file a run writes, under
#: the tree's lock. Tests pause a real run there to race another one against it.
_pause_hook: Callable[[str], None] | None = None


def _before_write(what: str) -> None:
    if _pause_hook is not None:
        _pause_hook(what)


# ----------------------------------------------------------------- results


@dataclass
class PatchStatus:
    """State of one patch in a tree: applied, not-applied, conflict or modified."""

    id: str
    name: str
    state: str
    detail: str = ""
    kind: str = "runtime"
    files: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"id": self.id, "name": self.name, "kind": self.kind, "state": self.state,
                "detail": self.detail, "files": self.files}


@dataclass
class SeriesStatus:
    """What ``launcher patch status`` and ``launcher doctor`` show about a tree."""

    tree: Tree
    version: str
    series_version: str
    series_hash: str
    patches: list[PatchStatus]
    stamp: dict | None
    notes: list[str] = field(default_factory=list)
    #: a killed apply/revert left its journal (not rolled back yet)
    interrupted: bool = False

    def state_of(self, patch_id: str) -> str | None:
        return next((p.state for p in self.patches if p.id == patch_id), None)

    @property
    def applied_ids(self) -> set[str]:
        return {p.id for p in self.patches if p.state == "applied"}

    @property
    def fully_applied(self) -> bool:
        return all(p.state == "applied" for p in self.patches)

    def to_dict(self) -> dict:
        stamp = None
        if self.stamp is not None:
            stamp = {k: v for k, v in self.stamp.items() if k != "patches"}
            stamp["patches"] = [
                {k: v for k, v in p.items() if k != "diff"} for p in self.stamp.get("patches", [])
            ]
        return {
            "tree": str(self.tree.root),
            "layout": self.tree.layout,
            "version": self.version,
            "series_version": self.series_version,
            "series_hash": self.series_hash,
            "patches": [p.to_dict() for p in self.patches],
            "stamp": stamp,
            "notes": self.notes,
            "interrupted": self.interrupted,
        }


@dataclass
class PatchResult:
    id: str
    name: str
    outcome: str  # applied, already applied, would apply, reverted, not applied
    detail: str = ""
    files: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"id": self.id, "name": self.name, "outcome": self.outcome, "detail": self.detail,
                "files": self.files}


@dataclass
class Report:
    """What ``apply`` or ``revert`` did (or, with dry_run, would do)."""

    action: str
    tree: Tree
    version: str
    series_version: str | None
    series_hash: str | None
    results: list[PatchResult]
    written: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    stamp_path: str | None = None
    message: str = ""

    @property
    def changed(self) -> bool:
        return bool(self.written or self.removed)

    def to_dict(self) -> dict:
        return {
            "action": self.action,
            "tree": str(self.tree.root),
            "layout": self.tree.layout,
            "version": self.version,
            "series_version": self.series_version,
            "series_hash": self.series_hash,
            "results": [r.to_dict() for r in self.results],
            "written": self.written,
            "removed": self.removed,
            "stamp": self.stamp_path,
            "message": self.message,
        }


@dataclass
class CheckRow:
    """One patch against one layout: applies, already upstream, or conflicts (with the hunk)."""

    patch_id: str
    patch_name: str
    layout: str
    result: str
    detail: str = ""
    version: str = ""

    def to_dict(self) -> dict:
        return {"patch": self.patch_id, "name": self.patch_name, "layout": self.layout,
                "result": self.result, "detail": self.detail, "version": self.version}


# --------------------------------------------------------- the analysis core


@dataclass(frozen=True)
class _Item:
    """A patch as the analysis sees it: from the series, or from a stamp entry."""

    id: str
    name: str
    sha256: str
    kind: str
    diff: str
    files: tuple[FilePatch, ...]

    @classmethod
    def of(cls, patch: Patch) -> _Item:
        return cls(patch.id, patch.name, patch.sha256, patch.kind, patch.diff_text, patch.files)

    @classmethod
    def from_stamp(cls, entry: stamps.StampEntry) -> _Item:
        prefix = "vllm/" if entry.kind == "runtime" else None
        return cls(entry.id, entry.file, entry.sha256, entry.kind, entry.diff,
                   parse(entry.diff, entry.file, allowed_prefix=prefix))

    @property
    def paths(self) -> list[str]:
        return [fp.path for fp in self.files]


@dataclass
class _Verdict:
    item: _Item
    state: str  # present, absent, conflict
    detail: str = ""
    offset: int = 0


Contents = dict[str, "bytes | None"]


def _run(work: Contents, item: _Item, reverse: bool = False) -> tuple[Contents, int]:
    """Apply ``item`` to ``work`` in memory; the changed files and the total hunk offset."""
    changed: Contents = {}
    offset = 0
    for fp in item.files:
        result = apply_file(work[fp.path], fp.reversed() if reverse else fp)
        changed[fp.path] = result.content
        offset += sum(abs(o) for o in result.offsets)
    return changed, offset


def _fits(work: Contents, item: _Item, reverse: bool = False) -> tuple[Contents, int] | None:
    try:
        return _run(work, item, reverse)
    except HunkMismatch:
        return None


def _analyse(original: Contents, items: list[_Item], stamped: set[str]) -> tuple[list[_Verdict], Contents]:
    """Classify every item (see the module docstring); return the verdicts and the fully patched files."""
    work = dict(original)
    peeled: set[str] = set()
    for item in reversed(items):
        back = _fits(work, item, reverse=True)
        if back is None:
            continue
        forward = _fits(work, item)
        # Both directions fit only for patches whose lines recur nearby; the
        # stamp, then the placement nearer the hunk headers, decides.
        if forward is not None and item.id not in stamped and forward[1] <= back[1]:
            continue
        work.update(back[0])
        peeled.add(item.id)
    verdicts = []
    for item in items:
        try:
            changed, offset = _run(work, item)
        except HunkMismatch:
            verdicts.append(_Verdict(item, "conflict", _diagnose(work, item)))
            continue
        work.update(changed)
        verdicts.append(_Verdict(item, "present" if item.id in peeled else "absent", "", offset))
    return verdicts, work


def _diagnose(work: Contents, item: _Item) -> str:
    """Name the first hunk that fits neither forwards nor backwards, or say the patch is half there."""
    forward_hunks, backward_hunks = [], []
    for fp in item.files:
        for hunk in fp.hunks:
            single = FilePatch(fp.path, fp.kind, (hunk,), fp.old_mode, fp.new_mode)
            try:
                apply_file(work[fp.path], single)
                forward_hunks.append(f"{fp.path} {hunk.label()}")
                continue
            except HunkMismatch as exc:
                failure = exc
            try:
                apply_file(work[fp.path], single.reversed())
                backward_hunks.append(f"{fp.path} {hunk.label()}")
            except HunkMismatch:
                return str(failure)
    if forward_hunks and backward_hunks:
        return f"partly applied: {', '.join(backward_hunks)} present, {', '.join(forward_hunks)} missing"
    return "the hunks fit one by one but not together (overlapping changes)"


def _load(tree: Tree, items: list[_Item]) -> Contents:
    contents: Contents = {}
    for item in items:
        for path in item.paths:
            if path in contents:
                continue
            file = tree.path(path)
            if file.is_dir():
                raise LauncherError(f"{file} is a folder, but patch {item.name} treats it as a file")
            try:
                contents[path] = read_source(file)
            except OSError as exc:
                raise LauncherError(f"cannot read {file}: {exc}") from exc
    return contents


def _conflict_error(tree: Tree, verdicts: list[_Verdict], doing: str, hint: str) -> LauncherError:
    bad = [v for v in verdicts if v.state == "conflict"]
    lines = "; ".join(f"{v.item.name}: {v.detail}" for v in bad)
    return LauncherError(
        f"cannot {doing} {tree.root} ({len(bad)} patch(es) do not fit), nothing was changed: {lines}",
        hint=hint,
    )


# ---------------------------------------------------------------- the API


def _series_context(target: PathArg, patches_root: PathArg) -> tuple[Tree, str, Series]:
    tree = find_tree(target)
    version = detect_version(tree)
    return tree, version, series_for(version, patches_root)


def _ours(stamp: dict | None, tree: Tree) -> dict[str, stamps.StampEntry]:
    """Stamp entries the launcher applied itself (revert undoes those only).

    Build entries count in source trees only: a stamp carried from a patched
    source tree into a wheel must not make revert look for CMakeLists.txt.
    """
    return {
        e.id: e
        for e in stamps.stamp_entries(stamp)
        if e.origin == "applied" and (e.kind != "build" or tree.layout == SOURCE)
    }


def apply(target: PathArg = None, *, dry_run: bool = False, patches_root: PathArg = None) -> Report:
    """Apply the series for the tree's vLLM version: all patches or none (one run per tree at a time)."""
    tree = find_tree(target)
    with tree_lock(tree.root):
        return _apply(tree, dry_run, patches_root)


def _apply(tree: Tree, dry_run: bool, patches_root: PathArg) -> Report:
    version = detect_version(tree)
    series = series_for(version, patches_root)
    if dry_run and interrupted(tree):
        raise LauncherError(f"{tree.root} holds the journal of an interrupted patch run; a dry run writes nothing",
                            hint=f"`launcher patch status --target {tree.root}` rolls it back first")
    recovered = [] if dry_run else recover(tree)
    stamp = stamps.read_stamp(tree)
    patches = series.for_layout(tree.layout)
    ours = _ours(stamp, tree)
    _refuse_foreign(tree, stamp, patches)
    items = [_Item.of(p) for p in patches]
    original = _load(tree, items)
    verdicts, final = _analyse(original, items, stamped=set(ours))
    if any(v.state == "conflict" for v in verdicts):
        raise _conflict_error(tree, verdicts, "patch", _restore_hint(tree, version))
    new = [v for v in verdicts if v.state == "absent"]
    results = [
        PatchResult(v.item.id, v.item.name,
                    ("would apply" if dry_run else "applied") if v.state == "absent" else "already applied",
                    _apply_detail(v, ours), v.item.paths)
        for v in verdicts
    ]
    touched = {path for v in new for path in v.item.paths}
    changes = {path: final[path] for path in sorted(touched) if final[path] != original[path]}
    report = Report("dry-run" if dry_run else "apply", tree, version, series.version, series.hash, results)
    if dry_run:
        report.message = f"{len(new)} patch(es) would be applied; nothing written (dry run)"
        return report

    entries = [
        stamps.StampEntry(
            id=v.item.id, file=v.item.name, sha256=v.item.sha256, kind=v.item.kind,
            origin="applied" if v.state == "absent" or v.item.id in ours else "present",
            files=v.item.paths, diff=v.item.diff,
        )
        for v in verdicts
    ]
    created = stamps.created_dirs(stamp, tree)
    modes = {fp.path: fp.new_mode for v in new for fp in v.item.files if fp.kind == "add"}
    stamp_path = tree.path(stamps.STAMP_REL)
    with _writing(tree) as tx:
        planned = tx.prepare([tree.path(p) for p in changes] + [stamp_path])
        created += [d.relative_to(tree.root).as_posix() for d in planned]
        new_stamp = stamps.build_stamp(
            vllm_version=version, series_version=series.version, series_hash=series.hash,
            layout=tree.layout, entries=entries, created_dirs=created,
        )
        for path, data in changes.items():
            _before_write(path)
            if data is None:
                tx.remove(tree.path(path))
            else:
                tx.write(tree.path(path), data, modes.get(path))
        _before_write(stamps.STAMP_REL)
        if changes or not stamps.same_content(stamp, new_stamp):
            tx.write(stamp_path, stamps.encode(new_stamp), 0o644)
            report.stamp_path = str(stamp_path)
    report.written = [p for p, d in changes.items() if d is not None]
    report.removed = [p for p, d in changes.items() if d is None]
    report.message = _recovered_note(recovered) + (
        f"applied {len(new)} patch(es), {len(verdicts) - len(new)} already applied"
        if new else f"nothing to do: all {len(verdicts)} patch(es) already applied"
    )
    return report


def _recovered_note(restored: list[str]) -> str:
    if not restored:
        return ""
    return f"rolled back an interrupted patch run first ({len(restored)} file(s) put back: {', '.join(restored)}); "


def _restore_hint(tree: Tree, version: str) -> str:
    if tree.layout == SOURCE:
        how = "restore it from the sdist or your checkout (git checkout -- FILE)"
    else:
        how = f"reinstall it (pip install --force-reinstall --no-deps vllm=={public_version(version)})"
    return (
        f"a file differs from vLLM {version} as released: undo the local edit or {how};"
        " `launcher patch status` shows each patch"
    )


def _apply_detail(v: _Verdict, ours: dict[str, stamps.StampEntry]) -> str:
    if v.state == "present":
        return "recorded in the stamp" if v.item.id in ours else "already in the tree (upstream, or applied by hand)"
    return f"hunks found {v.offset} line(s) away from their headers" if v.offset else ""


def _refuse_foreign(tree: Tree, stamp: dict | None, patches: list[Patch]) -> None:
    """A stamp from another series (changed or removed patches) must be reverted first."""
    current = {p.id: p for p in patches}
    stale = [e.file for e in _ours(stamp, tree).values() if not _same_patch(e, current.get(e.id))]
    if stale:
        raise LauncherError(
            f"{tree.root} carries patches that differ from the current series: {', '.join(stale)}",
            hint=f"run `launcher patch revert --target {tree.root}` first, then apply again",
        )


def _same_patch(entry: stamps.StampEntry, patch: Patch | None) -> bool:
    """The stamped patch is this one: same file hash, or the same diff under an edited header."""
    return patch is not None and (entry.sha256 == patch.sha256 or entry.diff == patch.diff_text)


#: Signals that unwind a write (and roll it back) instead of ending the process between two replaces:
#: SIGTERM (docker stop, timeout) and SIGHUP (a closed terminal, a dropped SSH connection).
_UNWIND = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


class _writing:
    """A journaled Transaction; SIGINT, SIGTERM and SIGHUP roll it back; every failure is one LauncherError.

    The default action of SIGTERM or SIGHUP would end the process between two
    replaces; here each unwinds like Ctrl-C. SIGKILL cannot be caught: the
    journal written by ``prepare`` covers it.
    """

    def __init__(self, tree: Tree):
        self.tree = tree
        self.tx = Transaction(root=tree.root, journal=tree.path(JOURNAL_REL))
        self._restore = lambda: None

    def __enter__(self) -> Transaction:
        self._restore = interrupts.install(_UNWIND)
        return self.tx

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if exc_type is None:
                self.tx.commit()
                return False
            with _signals_held():
                self.tx.rollback()
        finally:
            self._restore()
        if self.tx.unrestored:
            raise LauncherError(
                f"writing {self.tree.root} failed ({exc or exc_type.__name__}) and these files could not be "
                "restored: " + "; ".join(self.tx.unrestored),
                hint="the journal was kept: run `launcher patch status` to try again, or reinstall vLLM",
            ) from exc
        if exc_type is KeyboardInterrupt or isinstance(exc, interrupts.Signalled):
            name, code = ("SIGINT", 130) if exc_type is KeyboardInterrupt else (exc.name, exc.exit_status)
            raise LauncherError(f"interrupted ({name}) while writing {self.tree.root}; every file was restored as it was",
                                exit_code=code) from None
        if isinstance(exc, OSError):
            raise LauncherError(
                f"writing {self.tree.root} failed ({exc}); every file was restored as it was",
                hint=_write_failure_hint(exc),
            ) from exc
        return False


def _write_failure_hint(exc: OSError) -> str:
    """What to do about a failed write, by what the system said (a full disk is not a permission problem)."""
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return "free some space on that disk (or raise the quota), then run this again"
    if exc.errno == errno.EROFS:
        return "the file system is mounted read-only: patch a copy you can write (a venv, or --target DIR)"
    return "check permissions (site-packages may need the same user that installed vLLM)"


class _signals_held:
    """Ctrl-C and SIGTERM wait while a rollback runs (POSIX); they act once it is done."""

    def __enter__(self):
        if hasattr(signal, "pthread_sigmask"):
            self._old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, *_UNWIND})
        return self

    def __exit__(self, *exc):
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_SETMASK, self._old)
        return False


def recover(tree: Tree) -> list[str]:
    """Roll back what an apply or revert that died mid-write (SIGKILL, power loss) left; the files put back."""
    try:
        return transaction.recover(tree.root, tree.path(JOURNAL_REL))
    except OSError as exc:
        raise LauncherError(
            f"an interrupted patch run left {tree.path(JOURNAL_REL)}, and rolling it back failed: {exc}",
            hint="run this as the user that ran `launcher patch apply` (the journal stays until it succeeds)",
        ) from exc


def stray_temps(tree: Tree, series_files: list[str] = ()) -> list[str]:
    """Temp files a patch run killed outright left in the tree (its journal's own, or a file's).

    Looked for beside the journal, the stamp's files and ``series_files``: a
    run killed before its first write (while probing write access) leaves its
    probe in a folder of the series in a tree with no stamp yet.
    """
    folders = {tree.path(JOURNAL_REL).parent}
    for rel in series_files:
        folder = tree.path(rel).parent
        while folder != tree.root and not folder.is_dir():
            folder = folder.parent
        folders.add(folder)
    stamp = stamps.read_stamp(tree)
    for entry in stamps.stamp_entries(stamp):
        folders.update(tree.inside(p, f"the patch stamp {tree.path(stamps.STAMP_REL)}").parent for p in entry.files)
    found = []
    for folder in folders:
        if folder.is_dir():
            found += [p for p in folder.glob(f".*{transaction.TMP_SUFFIX}") if p.is_file()]
    return sorted(p.relative_to(tree.root).as_posix() for p in found)


def _strays_note(strays: list[str], removed: bool) -> str:
    what = f"{len(strays)} temp file(s) of a killed patch run ({', '.join(strays)})"
    return f"removed {what}" if removed else f"{what} are left: `launcher patch status` removes them"


def interrupted(tree: Tree) -> bool:
    """A journal is there: a write died and was not rolled back yet."""
    return tree.path(JOURNAL_REL).exists()


def revert(target: PathArg = None, *, patches_root: PathArg = None) -> Report:
    """Undo what the stamp says the launcher applied, newest first; remove the stamp.

    Uses the diffs stored in the stamp, so it works even if the series on
    disk changed since. Patches found present (upstream or applied by hand)
    stay.
    """
    del patches_root  # the stamp carries the diffs; kept for a uniform signature
    tree = find_tree(target)
    with tree_lock(tree.root):
        return _revert(tree)


def _revert(tree: Tree) -> Report:
    version = detect_version(tree)
    recovered = recover(tree)
    stamp = stamps.read_stamp(tree)
    if stamp is None:
        return Report("revert", tree, version, None, None, [],
                      message=_recovered_note(recovered)
                      + "no stamp in this tree: the launcher applied nothing here, nothing to revert")
    ours = [_Item.from_stamp(e) for e in _ours(stamp, tree).values()]
    original = _load(tree, ours)
    work = dict(original)
    results: list[PatchResult] = []
    conflicts: list[_Verdict] = []
    for item in reversed(ours):
        back = _fits(work, item, reverse=True)
        if back is not None:
            work.update(back[0])
            results.append(PatchResult(item.id, item.name, "reverted", "", item.paths))
        elif _fits(work, item) is not None:
            results.append(PatchResult(item.id, item.name, "not applied",
                                       "its files are as released (vLLM reinstalled?)", item.paths))
        else:
            conflicts.append(_Verdict(item, "conflict", _diagnose_reverse(work, item)))
    if conflicts:
        raise _conflict_error(
            tree, conflicts, "revert",
            f"a patched file was edited after apply: undo the edit, or reinstall vLLM "
            f"(pip install --force-reinstall --no-deps vllm=={public_version(version)}) and delete {stamps.STAMP_REL}",
        )
    results.reverse()
    changes = {p: work[p] for p in sorted(work) if work[p] != original[p]}
    created = stamps.created_dirs(stamp, tree)
    report = Report("revert", tree, version, stamp.get("series_version"), stamp.get("series_hash"), results)
    with _writing(tree) as tx:
        tx.prepare([tree.path(p) for p in changes] + [tree.path(stamps.STAMP_REL)])
        for path, data in changes.items():
            _before_write(path)
            if data is None:
                tx.remove(tree.path(path))
            else:
                mode = next((fp.old_mode for i in ours for fp in i.files
                             if fp.path == path and fp.kind == "delete"), None)
                tx.write(tree.path(path), data, mode)
        tx.remove(tree.path(stamps.STAMP_REL))
    remove_empty_dirs([tree.path(d) for d in created], tree.root)
    report.written = [p for p, d in changes.items() if d is not None]
    report.removed = [p for p, d in changes.items() if d is None] + [stamps.STAMP_REL]
    reverted = sum(1 for r in results if r.outcome == "reverted")
    report.message = _recovered_note(recovered) + f"reverted {reverted} patch(es); stamp removed"
    return report


def _diagnose_reverse(work: Contents, item: _Item) -> str:
    reversed_item = _Item(item.id, item.name, item.sha256, item.kind, item.diff,
                          tuple(fp.reversed() for fp in item.files))
    return _diagnose(work, reversed_item)


def status(target: PathArg = None, *, patches_root: PathArg = None, recover_interrupted: bool = False) -> SeriesStatus:
    """Per patch of the tree's series: applied, not-applied, conflict, or modified (stamped but edited).

    ``recover_interrupted`` (``launcher patch status``) first rolls back what
    a killed apply/revert left; without it (doctor, serve's preflight, which
    only read) such a tree is reported as interrupted.
    """
    tree = find_tree(target)
    if recover_interrupted:
        with tree_lock(tree.root):
            return _status(tree, patches_root, recover_interrupted=True)
    return _status(tree, patches_root, recover_interrupted=False)


def _status(tree: Tree, patches_root: PathArg, recover_interrupted: bool) -> SeriesStatus:
    version = detect_version(tree)
    series = series_for(version, patches_root)
    pending = interrupted(tree)
    live = pending and not recover_interrupted and held_elsewhere(tree.root)
    patches = series.for_layout(tree.layout)
    strays = [] if pending else stray_temps(tree, [fp.path for p in patches for fp in p.files])
    if strays and recover_interrupted:
        for rel in strays:
            try:
                transaction.unlink_inside(tree.path(rel), tree.root)
            except (FileNotFoundError, LauncherError):
                pass
    recovered = recover(tree) if pending and recover_interrupted else []
    pending = pending and not recover_interrupted and not live
    stamp = stamps.read_stamp(tree)
    ours = _ours(stamp, tree)
    items = [_Item.of(p) for p in patches]
    verdicts, _ = _analyse(_load(tree, items), items, stamped=set(ours))
    out = []
    for v, patch in zip(verdicts, patches):
        in_stamp = v.item.id in ours and _same_patch(ours[v.item.id], patch)
        if v.state == "present":
            state, detail = "applied", ("recorded in the stamp" if in_stamp
                                        else "present without a stamp entry (upstream, or applied by hand)")
        elif v.state == "absent":
            state, detail = "not-applied", ("the stamp lists it, but its files are as released"
                                            if in_stamp else "applies cleanly")
        else:
            state, detail = ("modified" if in_stamp else "conflict"), v.detail
        out.append(PatchStatus(v.item.id, v.item.name, state, detail, v.item.kind, v.item.paths))
    notes = _stamp_notes(stamp, tree, series, patches, version)
    if recovered:
        notes.insert(0, _recovered_note(recovered).rstrip("; "))
    if pending:
        notes.insert(0, f"an interrupted patch run left {JOURNAL_REL}: `launcher patch status` rolls it back")
    if live:
        notes.insert(0, "another patch run is writing this tree now: what is shown may change when it ends")
    if strays:
        notes.insert(0, _strays_note(strays, removed=recover_interrupted))
    return SeriesStatus(tree, version, series.version, series.hash, out, stamp, notes, interrupted=pending)


def _stamp_notes(stamp: dict | None, tree: Tree, series: Series, patches: list[Patch], version: str) -> list[str]:
    if stamp is None:
        return []
    notes = []
    if stamp.get("layout") and stamp.get("layout") != tree.layout:
        notes.append(f"the stamp was written in a {stamp.get('layout')} tree (carried into this one by a build)")
    if stamp.get("series_hash") != series.hash:
        notes.append("the stamp was written by another revision of the series; revert and apply again")
    if stamp.get("vllm_version") and stamp.get("vllm_version") != version:
        notes.append(f"the stamp was written for vLLM {stamp.get('vllm_version')}, the tree is {version}")
    current = {p.id for p in patches}
    extra = [e.id for e in _ours(stamp, tree).values() if e.id not in current]
    if extra:
        notes.append(f"the stamp lists patches no longer in the series: {', '.join(extra)}")
    return notes


def check_tree(target: PathArg = None, *, patches_root: PathArg = None) -> list[CheckRow]:
    """Read-only: how each patch of the series fits the tree as it is now."""
    tree, version, series = _series_context(target, patches_root)
    stamp = stamps.read_stamp(tree)
    return _check_rows(tree, version, series, set(_ours(stamp, tree)), upstream_word="already applied")


def check_against(spec: str, *, series_version: str | None = None, patches_root: PathArg = None) -> list[CheckRow]:
    """``vllm==X``: the series for X against X's wheel (site-packages) and sdist (source) from PyPI.

    ``series_version`` checks another release's series against X instead: how
    far a series carries to a release that has none yet (the drift watch).
    The released trees are unpacked once into the cache and only read: the
    analysis runs in memory, so the pristine copies are never touched.
    """
    from launcher import pypi

    version = _parse_spec(spec)
    series = series_for(series_version or version, patches_root)
    rows: list[CheckRow] = []
    for layout in (SITE_PACKAGES, SOURCE):
        root = pypi.unpacked("vllm", version, layout)
        tree = Tree(root, layout)
        found = detect_version(tree)
        if public_version(found) != public_version(version):
            raise LauncherError(f"the {layout} tree of vllm=={version} in the cache says {found}",
                                hint=f"delete {root} so it is unpacked again")
        rows += _check_rows(tree, found, series, set(), upstream_word="already upstream")
    return rows


def _parse_spec(spec: str) -> str:
    from packaging.requirements import InvalidRequirement, Requirement

    text = spec.strip()
    if text and text[0].isdigit():
        text = f"vllm=={text}"
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        raise LauncherError(f"--against {spec!r} is not a requirement like vllm==0.21.0") from exc
    pins = [s for s in req.specifier if s.operator in ("==", "===") and "*" not in s.version]
    if req.name.lower() != "vllm" or len(pins) != 1 or len(req.specifier) != 1:
        raise LauncherError(f"--against {spec!r} must pin one vLLM release, like vllm==0.21.0")
    return pins[0].version


def _check_rows(tree: Tree, version: str, series: Series, stamped: set[str], upstream_word: str) -> list[CheckRow]:
    items = [_Item.of(p) for p in series.for_layout(tree.layout)]
    verdicts, _ = _analyse(_load(tree, items), items, stamped)
    words = {"absent": "applies", "present": upstream_word, "conflict": "conflicts"}
    rows = []
    for v in verdicts:
        detail = v.detail
        if v.state == "absent" and v.offset:
            detail = f"hunks {v.offset} line(s) away from their headers"
        rows.append(CheckRow(v.item.id, v.item.name, tree.layout, words[v.state], detail, version))
    return rows
