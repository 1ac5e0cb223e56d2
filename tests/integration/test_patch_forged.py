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
