"""Two patch runs on one tree: the second waits for the first, and says for whom.

Issue 28.1: without a lock, `patch status` (or a second `apply`) started while
an `apply` was writing took its live journal for a crashed run and rolled it
back; the apply then finished, exit 0, over a tree that was half patched (or
pristine) with a stamp listing every patch. The race is made deterministic:
the first run is a real `launcher patch apply` whose engine pauses (through
``engine._pause_hook``, the test seam) before its third file, until the test
lets it go. The second run is a real CLI process, started while the first is
paused; the first is let go once the second either waits or has finished.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from launcher.patching import engine, lock
from launcher.patching.series import series_for
from launcher.patching.stamp import STAMP_REL
from tests.integration.patch_trees import mini_tree, snapshot

REPO = Path(__file__).resolve().parents[2]
SERIES_FILES = sorted({fp.path for p in series_for("0.21.0").patches for fp in p.files})

CHILD = """
import os, sys, time
from pathlib import Path
from launcher.patching import engine
count = 0
def pause(what):
    global count
    count += 1
    if count == 3:
        Path(os.environ["PAUSED"]).write_text(what)
        while not Path(os.environ["GO"]).exists():
            time.sleep(0.02)
engine._pause_hook = pause
from launcher.cli import main
sys.argv = ["launcher", "patch", "apply", "--target", sys.argv[1]]
main()
"""


def _env(tmp_path: Path, **extra) -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "VLLM_SM12X_CACHE": str(tmp_path / "cache"), **extra}


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the first run never reached its third write"
        time.sleep(0.02)


def _second_waits_or_ends(proc: subprocess.Popen) -> tuple[bool, str]:
    """Read the second run's stderr until it says it waits, or until it exits."""
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("waiting for another patch run"):
            return True, "".join(seen)
    return False, "".join(seen)


def _race(tree, second_argv, first_env, second_env, paused, go):
    """An apply paused at its third write, then ``launcher *second_argv`` beside it; the apply
    goes on once the second run waits or ends. Both must exit 0. Returns the first process,
    whether the second waited, what it said, and its output."""
    first = subprocess.Popen([sys.executable, "-c", CHILD, str(tree)], cwd=REPO, env=first_env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for(paused, first)
    assert (tree / engine.JOURNAL_REL).exists()  # the first run is mid-write, its journal live
    other = subprocess.Popen([sys.executable, "-m", "launcher", *second_argv], cwd=REPO, env=second_env,
                             text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    waited, said = _second_waits_or_ends(other)
    go.write_text("go")
    _, first_err = first.communicate(timeout=120)
    other_out, other_err = other.communicate(timeout=120)
    assert first.returncode == 0, first_err
    assert other.returncode == 0, other_err
    return first, waited, said, other_out, other_err


@pytest.fixture
def patched_once(tmp_path):
    """What one undisturbed apply makes of the tree (the stamp's timestamp aside)."""
    root = mini_tree("0.21.0", "site-packages", tmp_path / "reference", SERIES_FILES)
    engine.apply(root)
    return {k: v for k, v in snapshot(root).items() if k != STAMP_REL}


@pytest.mark.parametrize("second", [["patch", "status"], ["patch", "apply"], ["patch", "revert"]],
                         ids=["status", "apply", "revert"])
def test_a_second_run_waits_for_a_writing_apply_and_names_it(second, tmp_path, patched_once):
    tree = mini_tree("0.21.0", "site-packages", tmp_path / "tree", SERIES_FILES)
    assert len(SERIES_FILES) > 3  # the pause lands mid-series
    paused, go = tmp_path / "paused", tmp_path / "go"
    env = _env(tmp_path, PAUSED=str(paused), GO=str(go))
    first, waited, said, other_out, other_err = _race(tree, [*second, "--target", str(tree)], env, env, paused, go)

    after = {k: v for k, v in snapshot(tree).items() if k != STAMP_REL}
    if second[1] == "revert":  # it ran after the apply: the tree is as released again
        assert not (tree / STAMP_REL).exists()
        assert {p.state for p in engine.status(tree).patches} == {"not-applied"}
    else:  # exactly what one undisturbed apply makes, and its stamp
        assert after == patched_once
        assert engine.status(tree).fully_applied
    assert not (tree / engine.JOURNAL_REL).exists() and not list(tree.rglob("*.sm12x-tmp"))
    assert waited, f"the second run did not wait for the first: {said}{other_out}{other_err}"
    assert f"pid {first.pid}" in said and "launcher patch apply" in said


def test_read_only_status_of_a_tree_being_written_does_not_call_it_interrupted(tmp_path):
    tree = mini_tree("0.21.0", "site-packages", tmp_path / "tree", SERIES_FILES)
    paused, go = tmp_path / "paused", tmp_path / "go"
    env = _env(tmp_path, PAUSED=str(paused), GO=str(go))
    first = subprocess.Popen([sys.executable, "-c", CHILD, str(tree)], cwd=REPO, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for(paused, first)
        probe = subprocess.run(
            [sys.executable, "-c", "import sys; from launcher.patching import engine; "
             "st = engine.status(sys.argv[1]); print(st.interrupted); print(*st.notes, sep='\\n')", str(tree)],
            cwd=REPO, env=env, text=True, capture_output=True, timeout=120)
        assert probe.returncode == 0, probe.stderr
        assert probe.stdout.splitlines()[0] == "False"
        assert "another patch run is writing this tree now" in probe.stdout
        assert (tree / engine.JOURNAL_REL).exists()  # a reader never touches a live journal
    finally:
        go.write_text("go")
        first.communicate(timeout=120)
    assert first.returncode == 0


def test_status_names_and_removes_a_journal_temp_file_left_by_sigkill(tmp_path):
    """Issue 28.10: a run killed while writing its journal leaves only the journal's temp file."""
    tree = mini_tree("0.21.0", "site-packages", tmp_path / "tree", SERIES_FILES)
    stray = tree / "vllm" / ".sm12x-journal.json.k3j2l1.sm12x-tmp"
    stray.write_text("{\"format\": 1, \"files\": [")
    seen = engine.status(tree)
    assert any("temp file(s) of a killed patch run" in n and stray.name in n for n in seen.notes)
    assert stray.exists()  # read-only callers (doctor, serve's preflight) change nothing
    res = subprocess.run([sys.executable, "-m", "launcher", "patch", "status", "--target", str(tree)], cwd=REPO,
                         env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"removed 1 temp file(s) of a killed patch run (vllm/{stray.name})" in res.stdout
    assert not stray.exists()


@pytest.fixture
def bind_mount():
    """Mount a folder at another path (needs CAP_SYS_ADMIN); unmounted afterwards."""
    mounted = []

    def mount(src: Path, dest: Path) -> None:
        dest.mkdir()
        res = subprocess.run(["mount", "--bind", str(src), str(dest)], capture_output=True, text=True)
        if res.returncode != 0:
            pytest.skip(f"cannot bind-mount here: {res.stderr.strip()}")
        mounted.append(dest)

    yield mount
    for dest in mounted:
        subprocess.run(["umount", str(dest)], check=True)


@pytest.mark.parametrize("via", ["symlink", "bind-mount"])
def test_a_run_with_another_cache_folder_still_waits(via, tmp_path, patched_once, bind_mount):
    """Issue 55.3: the lock belongs to the tree, not to VLLM_SM12X_CACHE (each run here has its own),
    nor to the path the tree is reached by."""
    tree = mini_tree("0.21.0", "site-packages", tmp_path / "tree", SERIES_FILES)
    alias = tmp_path / "alias"
    if via == "symlink":
        alias.symlink_to(tree, target_is_directory=True)
    else:
        bind_mount(tree, alias)
    paused, go = tmp_path / "paused", tmp_path / "go"
    _, waited, said, other_out, other_err = _race(
        tree, ["patch", "status", "--target", str(alias)],
        _env(tmp_path, PAUSED=str(paused), GO=str(go), VLLM_SM12X_CACHE=str(tmp_path / "A")),
        _env(tmp_path, VLLM_SM12X_CACHE=str(tmp_path / "B")), paused, go)
    assert waited, f"the run with another cache did not wait: {said}{other_out}{other_err}"
    assert {k: v for k, v in snapshot(tree).items() if k != STAMP_REL} == patched_once
    assert engine.status(tree).fully_applied


def test_the_owner_record_never_writes_through_a_planted_symlink(tmp_path, monkeypatch):
    """Issue 55.2: with the cache unusable the record goes to $TMPDIR/vllm-sm12x-locks-<uid>.

    That folder is planted first, world-writable, with symlinks to a victim
    at the record's name and at its temp name for this pid.
    """
    tree = mini_tree("0.21.0", "site-packages", tmp_path / "tree", SERIES_FILES)
    monkeypatch.setenv("VLLM_SM12X_CACHE", "/dev/null/cache")  # under a file: never a folder
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    folder = tmp_path / "tmp" / f"vllm-sm12x-locks-{os.getuid()}"
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    record = lock._owner_path(tree)
    assert record is not None and record.parent == folder
    for planted in (record, record.with_suffix(f".{os.getpid()}.tmp")):
        planted.symlink_to(victim)
    with lock.tree_lock(tree):
        assert victim.read_text() == "precious"
        assert f"pid {os.getpid()}" in lock.holder(tree)
    assert victim.read_text() == "precious"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_a_fallback_folder_of_another_user_is_not_used(tmp_path, monkeypatch):
    """Issue 55.2: a folder someone else made (here: owned by uid 65534) holds no record of ours."""
    if os.getuid() != 0:
        pytest.skip("making a folder owned by another user needs root")
    tree = mini_tree("0.21.0", "site-packages", tmp_path / "tree", SERIES_FILES)
    monkeypatch.setenv("VLLM_SM12X_CACHE", "/dev/null/cache")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    folder = tmp_path / "tmp" / f"vllm-sm12x-locks-{os.getuid()}"
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    os.chown(folder, 65534, 65534)
    with lock.tree_lock(tree):
        assert list(folder.iterdir()) == []
        assert lock.held_elsewhere(tree)  # the lock itself holds without a record
    assert not lock.held_elsewhere(tree)
