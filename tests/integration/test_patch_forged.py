"""A journal or stamp forged by someone who can write the tree changes nothing outside it.

Issue 55.1: ``transaction.recover`` joined the journal's paths unchecked, so
``launcher patch status`` (which ``doctor`` recommends) wrote any file the
user could write; a stamp's ``created_dirs`` made ``revert`` remove folders
outside the tree. Each test writes the forged file into a real copy of the
released tree and runs the real CLI.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.patching import engine
from launcher.patching.series import series_for
from launcher.patching.stamp import STAMP_REL
from tests.integration.patch_trees import mini_tree, snapshot

REPO = Path(__file__).resolve().parents[2]
SERIES_FILES = sorted({fp.path for p in series_for("0.21.0").patches for fp in p.files})


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_SM12X_CACHE": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180)


def _journal(tree: Path, files: list[dict], created_dirs: list = ()) -> Path:
    path = tree / engine.JOURNAL_REL
    path.write_text(json.dumps({"format": 1, "files": files, "created_dirs": list(created_dirs)}))
    return path


def _entry(path: str, data: bytes = b"OWNED\n") -> dict:
    return {"path": path, "mode": 0o600, "data": base64.b64encode(data).decode()}


@pytest.fixture
def tree(tmp_path):
    return mini_tree("0.21.0", "site-packages", tmp_path / "T", SERIES_FILES)


@pytest.mark.parametrize("command", ["status", "apply", "revert"])
@pytest.mark.parametrize("where", ["../victim.txt", "vllm/../../victim.txt", "ABSOLUTE"])
def test_a_journal_path_outside_the_tree_is_refused_and_nothing_is_written(command, where, tree, tmp_path):
    victim = tmp_path / "victim.txt"
    rel = str(victim) if where == "ABSOLUTE" else where
    # A legitimate-looking entry first: the refusal comes before any write, not halfway.
    journal = _journal(tree, [_entry("vllm/__init__.py", b"changed\n"), _entry(rel)])
    before = snapshot(tree)
    res = _cli(tmp_path, "patch", command, "--target", str(tree))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    assert "is not a path inside" in res.stderr and repr(rel) in res.stderr
    assert not victim.exists()
    assert snapshot(tree) == before  # the journal kept, the tree untouched
    assert journal.exists()


def test_a_journal_path_through_a_symlinked_folder_out_of_the_tree_is_refused(tree, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tree / "vllm" / "escape").symlink_to(outside, target_is_directory=True)
    _journal(tree, [_entry("vllm/escape/victim.txt")])
    res = _cli(tmp_path, "patch", "status", "--target", str(tree))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "is not a path inside" in res.stderr
    assert list(outside.iterdir()) == []


def test_a_journal_created_dir_outside_the_tree_is_not_removed(tree, tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    _journal(tree, [], created_dirs=["../keep"])
    res = _cli(tmp_path, "patch", "status", "--target", str(tree))
    assert res.returncode == 2, res.stdout + res.stderr
    assert keep.is_dir()


@pytest.mark.parametrize("entry", [
    {"path": "vllm/x.py", "mode": "rwx", "data": None},
    {"path": "vllm/x.py", "mode": 10 ** 30, "data": None},
    {"path": ["vllm", "x.py"], "mode": None, "data": None},
    {"path": "vllm/x.py", "mode": None, "data": 5},
    "vllm/x.py",
], ids=["mode-text", "mode-huge", "path-list", "data-int", "entry-string"])
def test_a_journal_with_wrong_types_is_one_error(entry, tree, tmp_path):
    _journal(tree, [entry])
    res = _cli(tmp_path, "patch", "status", "--target", str(tree))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and res.stderr.startswith("error: ")
    assert not (tree / "vllm" / "x.py").exists()


def test_revert_leaves_a_stamp_created_dir_outside_the_tree(tree, tmp_path):
    engine.apply(tree)
    stamp_path = tree / STAMP_REL
    stamp = json.loads(stamp_path.read_text())
    keep = tmp_path / "dir"
    keep.mkdir()  # empty: rmdir would take it
    stamp["created_dirs"] = [*stamp["created_dirs"], "../dir"]
    stamp_path.write_text(json.dumps(stamp))
    before = snapshot(tree)
    res = _cli(tmp_path, "patch", "revert", "--target", str(tree))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "'../dir'" in res.stderr and "is not a path inside" in res.stderr
    assert keep.is_dir()
    assert snapshot(tree) == before  # refused before the first write


# ---- round four: folders symlinked out of the tree, special mode bits, FIFOs

_ADD = "diff --git a/{p} b/{p}\nnew file mode 100644\n--- /dev/null\n+++ b/{p}\n@@ -0,0 +1 @@\n+orig\n"
_DEL = "diff --git a/{p} b/{p}\ndeleted file mode {m}\n--- a/{p}\n+++ /dev/null\n@@ -1 +0,0 @@\n-OWNED\n"


def _stamp(tree: Path, diff: str) -> None:
    entry = {"id": "p1", "file": "p1.patch", "sha256": "0" * 64, "kind": "runtime", "origin": "applied",
             "files": [], "diff": diff}
    (tree / STAMP_REL).write_text(json.dumps({
        "format": 1, "tool": "vllm-sm12x-launcher", "vllm_version": "0.21.0", "series_version": "0.21.0",
        "series_hash": "x", "layout": "site-packages", "created_dirs": [], "patches": [entry]}))


@pytest.mark.parametrize("kind", ["add", "delete"])
def test_a_forged_stamp_diff_through_a_symlinked_folder_changes_nothing_outside(kind, tree, tmp_path):
    """Revert undoes an "added" file by deleting it and a "deleted" one by writing it back:
    through ``vllm/esc -> outside`` that deleted or created files outside the tree."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("orig\n")
    (tree / "vllm" / "esc").symlink_to(outside, target_is_directory=True)
    _stamp(tree, _ADD.format(p="vllm/esc/victim.txt") if kind == "add"
           else _DEL.format(p="vllm/esc/new.txt", m="100644"))
    res = _cli(tmp_path, "patch", "revert", "--target", str(tree))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    assert "'vllm/esc/" in res.stderr and "not a path inside" in res.stderr
    assert sorted(os.listdir(outside)) == ["victim.txt"]
    assert (outside / "victim.txt").read_text() == "orig\n"


def test_apply_refuses_a_series_folder_symlinked_out_of_the_tree(tree, tmp_path):
    outside = tmp_path / "outside"
    spec = tree / "vllm" / "v1" / "spec_decode"
    os.rename(spec, outside)
    spec.symlink_to(outside, target_is_directory=True)
    before = snapshot(outside)
    res = _cli(tmp_path, "patch", "apply", "--target", str(tree))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "not a path inside" in res.stderr and "symlink" in res.stderr
    assert snapshot(outside) == before
    assert not (tree / STAMP_REL).exists()


def test_no_setuid_or_setgid_bit_comes_from_a_forged_journal_or_stamp(tree, tmp_path):
    """Root running `patch status` on a tree others can write would otherwise make a
    root-owned setuid file with the forger's bytes."""
    _journal(tree, [{"path": "vllm/newbin", "mode": 0o4755, "data": base64.b64encode(b"#!/bin/sh\nid\n").decode()},
                    {"path": "vllm/_version.py", "mode": 0o6755,
                     "data": base64.b64encode((tree / "vllm" / "_version.py").read_bytes()).decode()}])
    res = _cli(tmp_path, "patch", "status", "--target", str(tree))
    assert "Traceback" not in res.stderr, res.stderr
    assert (tree / "vllm" / "newbin").stat().st_mode & 0o7777 == 0o755
    assert (tree / "vllm" / "_version.py").stat().st_mode & 0o7000 == 0
    _stamp(tree, _DEL.format(p="vllm/setuid.bin", m="104755"))
    res = _cli(tmp_path, "patch", "revert", "--target", str(tree))
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tree / "vllm" / "setuid.bin").stat().st_mode & 0o7777 == 0o755


@pytest.mark.parametrize("plant", ["fifo", "dev-zero", "too-large"])
@pytest.mark.parametrize("which", ["journal", "stamp"])
def test_a_journal_or_stamp_that_is_no_regular_file_is_one_error_not_a_hang(plant, which, tree, tmp_path):
    path = tree / (engine.JOURNAL_REL if which == "journal" else STAMP_REL)
    if plant == "fifo":
        os.mkfifo(path)
    elif plant == "dev-zero":
        path.symlink_to("/dev/zero")
    else:
        with open(path, "wb") as fh:
            fh.truncate(65 << 20)  # sparse: no disk used
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_SM12X_CACHE": str(tmp_path / "cache")}
    res = subprocess.run([sys.executable, "-m", "launcher", "patch", "status", "--target", str(tree)], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=30)
    assert "Traceback" not in res.stderr, res.stderr
    if which == "stamp" and plant != "too-large":
        assert res.returncode in (0, 1), res.stderr  # not a file: no stamp
    else:
        assert res.returncode == 2, res.stdout + res.stderr
        assert "unreadable" in res.stderr


def test_a_folder_swapped_for_a_symlink_after_the_checks_is_not_written_through(tree, tmp_path, monkeypatch):
    """A writer of the tree racing root's `patch apply` swaps a series folder for a symlink out
    of the tree between the path checks and the write (a probe flipping it in a loop hit 1 run
    in 12). Writes go through a descriptor of the folder, checked where it really is."""
    import shutil

    from launcher.errors import LauncherError
    from launcher.patching import transaction

    spec = tree / "vllm" / "v1" / "spec_decode"
    outside = tmp_path / "outside"
    shutil.copytree(spec, outside)  # the same bytes: the patches would fit there too
    before = snapshot(outside)
    real_through, swapped, seen = transaction._through, [], []

    def racing(path, root):
        seen.append(path)
        # prepare() passes every path once; the second time is the write itself, after the checks
        if not swapped and path.parent == spec and seen.count(path) == 2:
            os.rename(spec, spec.with_name(".held"))
            spec.symlink_to(outside, target_is_directory=True)
            swapped.append(path)
        return real_through(path, root)

    monkeypatch.setattr(transaction, "_through", racing)
    with pytest.raises(LauncherError) as err:
        engine.apply(tree)
    assert swapped, "the race was never staged"
    assert "leads out of" in err.value.message or "leads out of" in str(err.value.__cause__ or "")
    assert snapshot(outside) == before
    assert not [p for p in outside.iterdir() if p.name.endswith(".sm12x-tmp")]


def test_a_recovery_never_sweeps_temp_names_in_a_folder_swapped_out_of_the_tree(tree, tmp_path, monkeypatch):
    """After the journal's paths are checked, a folder swapped for a symlink out of the tree
    must not have files deleted in it (the sweep of `.NAME.*.sm12x-tmp` went by path)."""
    import shutil

    from launcher.patching import transaction

    spec = tree / "vllm" / "v1" / "spec_decode"
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy2(spec / "dflash.py", outside / "dflash.py")  # identical: nothing to restore there
    bait = outside / ".dflash.py.abc123.sm12x-tmp"
    bait.write_text("not the launcher's\n")
    mode = (spec / "dflash.py").stat().st_mode & 0o777
    _journal(tree, [{"path": "vllm/v1/spec_decode/dflash.py", "mode": mode,
                     "data": base64.b64encode((spec / "dflash.py").read_bytes()).decode()}])
    real_differs = transaction._differs

    def racing(item):
        if not spec.is_symlink():
            os.rename(spec, spec.with_name(".held"))
            spec.symlink_to(outside, target_is_directory=True)
        return real_differs(item)

    monkeypatch.setattr(transaction, "_differs", racing)
    transaction.recover(tree, tree / engine.JOURNAL_REL)
    assert spec.is_symlink(), "the race was never staged"
    assert bait.read_text() == "not the launcher's\n"
