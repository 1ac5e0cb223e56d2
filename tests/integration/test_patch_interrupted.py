"""``patch apply`` without write access, and killed mid-apply for real.

The tree is the released vLLM 0.21.0 wheel's files the real 0.21.0 series
touches. Signals are real (SIGTERM, SIGKILL sent to a real process). The one
thing arranged is *when* they arrive: the child's ``os.replace`` pauses
before its fourth file, so the kill lands with three files patched and the
fourth's temp file on disk, as ``docker stop`` or ``timeout`` would find it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from launcher.errors import LauncherError
from launcher.patching import engine
from launcher.patching.series import series_for
from launcher.patching.stamp import STAMP_REL
from tests.integration.patch_trees import dirs, mini_tree, snapshot
from tests.signals import ctrl_c_as_from_a_terminal

REPO = Path(__file__).resolve().parents[2]
SERIES_FILES = sorted({fp.path for p in series_for("0.21.0").patches for fp in p.files})

# Runs the real CLI; os.replace pauses before the 4th patched file (the journal does not count).
CHILD = """
import os, sys, time
from pathlib import Path
real_replace = os.replace
count = 0
def slow_replace(src, dst, **dir_fds):
    global count
    if not str(dst).endswith(".sm12x-journal.json"):
        count += 1
        if count == 4:
            Path(os.environ["MARKER"]).write_text("paused")
            time.sleep(120)
    return real_replace(src, dst, **dir_fds)
os.replace = slow_replace
from launcher.cli import main
sys.argv = ["launcher", "patch", "apply", "--target", sys.argv[1]]
main()
"""


@pytest.fixture
def tree(tmp_path):
    root = mini_tree("0.21.0", "site-packages", tmp_path / "tree", SERIES_FILES)
    assert len(SERIES_FILES) > 4  # the pause lands mid-series
    return root


def _launcher(*args, check=True):
    res = subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True, timeout=120,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    if check:
        assert res.returncode == 0, res.stderr
    return res


def _kill_mid_apply(root: Path, tmp_path: Path, sig: int) -> subprocess.CompletedProcess:
    marker = tmp_path / "paused"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(root)], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO), "MARKER": str(marker)},
                            preexec_fn=ctrl_c_as_from_a_terminal)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the child never reached the fourth write"
        time.sleep(0.05)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)],
                         ids=["sigterm", "ctrl-c", "sighup"])
def test_sigterm_mid_apply_rolls_back_like_ctrl_c(sig, code, tree, tmp_path):
    before, before_dirs = snapshot(tree), dirs(tree)
    res = _kill_mid_apply(tree, tmp_path, sig)
    assert res.returncode == code, res.stderr
    assert f"interrupted ({sig.name})" in res.stderr and "every file was restored" in res.stderr
    assert snapshot(tree) == before and dirs(tree) == before_dirs
    assert not list(tree.rglob("*.sm12x-tmp"))  # no stray temp file, no journal left


def test_sigkill_mid_apply_leaves_a_journal_that_status_rolls_back(tree, tmp_path):
    before, before_dirs = snapshot(tree), dirs(tree)
    res = _kill_mid_apply(tree, tmp_path, signal.SIGKILL)
    assert res.returncode == -signal.SIGKILL
    # What a hard kill leaves: some files patched, a temp file, no stamp, the journal.
    assert snapshot(tree) != before
    assert list(tree.rglob("*.sm12x-tmp")) and not (tree / STAMP_REL).exists()
    assert (tree / engine.JOURNAL_REL).exists()

    # Read-only users of the status (doctor, serve's preflight) see it, and change nothing.
    seen = engine.status(tree)
    assert seen.interrupted and any("interrupted" in n for n in seen.notes)
    assert (tree / engine.JOURNAL_REL).exists()

    res = _launcher("patch", "status", "--target", str(tree))
    assert "rolled back an interrupted patch run" in res.stdout
    assert snapshot(tree) == before and dirs(tree) == before_dirs
    assert not list(tree.rglob("*.sm12x-tmp"))
    assert {p.state for p in engine.status(tree).patches} == {"not-applied"}


@pytest.mark.parametrize("command", ["apply", "revert"])
def test_sigkill_mid_apply_is_rolled_back_by_the_next_apply_or_revert(command, tree, tmp_path):
    before = snapshot(tree)
    _kill_mid_apply(tree, tmp_path, signal.SIGKILL)
    res = _launcher("patch", command, "--target", str(tree))
    assert "rolled back an interrupted patch run first" in res.stdout
    assert not (tree / engine.JOURNAL_REL).exists() and not list(tree.rglob("*.sm12x-tmp"))
    if command == "apply":
        assert {p.state for p in engine.status(tree).patches} == {"applied"}
        _launcher("patch", "revert", "--target", str(tree))
    assert snapshot(tree) == before


# --- no write access ----------------------------------------------------------


def _as_other_user(fn):
    """Run ``fn`` where the tree's folders refuse writes.

    As root (CI) permissions do not apply, so a forked child drops to
    ``nobody`` first; otherwise the folders are made read-only. Returns
    (error message or None, result).
    """
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        try:
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            try:
                fn()
                msg = "OK"
            except LauncherError as exc:
                msg = "LauncherError: " + exc.message
            except BaseException as exc:
                msg = f"{type(exc).__name__}: {exc}"
            os.write(write, msg.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as fh:
        msg = fh.read()
    os.waitpid(pid, 0)
    return msg


def test_apply_without_write_access_writes_nothing_and_says_why():
    base = Path(tempfile.mkdtemp(prefix="sm12x-ro-"))
    try:
        base.chmod(0o755)  # readable by `nobody`
        root = mini_tree("0.21.0", "site-packages", base / "tree", SERIES_FILES)
        patches = base / "patches"
        shutil.copytree(REPO / "patches", patches)
        for path in [base, *base.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        if os.geteuid() != 0:
            for path in [root, *root.rglob("*")]:
                if path.is_dir():
                    path.chmod(0o555)
        before, before_dirs = snapshot(root), dirs(root)

        msg = _as_other_user(lambda: engine.apply(root, patches_root=patches))

        assert msg.startswith("LauncherError: no write access, nothing was written:"), msg
        assert str(root / "vllm") in msg
        assert "could not be restored" not in msg
        assert snapshot(root) == before and dirs(root) == before_dirs
    finally:
        for path in [base, *base.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
        shutil.rmtree(base)


# --- issue 55.12, 55.13: probes, symlinked files, a full disk ----------------------------


def test_status_removes_a_write_probe_a_killed_run_left_in_a_tree_without_stamp(tree):
    """A run killed while probing write access (before its journal) left .sm12x-probe-*.sm12x-tmp in a
    folder of the series; status looked only beside the journal and the stamp's files."""
    folder = (tree / SERIES_FILES[-1]).parent
    probe = folder / ".sm12x-probe-k2j4h1.sm12x-tmp"
    probe.write_bytes(b"")
    res = _launcher("patch", "status", "--target", str(tree))
    assert not probe.exists()
    assert f"removed 1 temp file(s) of a killed patch run ({probe.relative_to(tree).as_posix()})" in res.stdout


def test_a_symlinked_file_stays_a_symlink_through_apply_and_revert(tree):
    rel = SERIES_FILES[0]
    link = tree / rel
    real = tree / "vllm" / "_real" / link.name
    real.parent.mkdir()
    link.replace(real)
    link.symlink_to(real)
    original = real.read_bytes()
    _launcher("patch", "apply", "--target", str(tree))
    assert link.is_symlink() and link.resolve() == real  # patched through the link
    assert real.read_bytes() != original
    _launcher("patch", "revert", "--target", str(tree))
    assert link.is_symlink() and real.read_bytes() == original


def test_a_symlink_out_of_the_tree_is_refused_before_any_write(tree, tmp_path):
    link = tree / SERIES_FILES[0]
    outside = tmp_path / "elsewhere.py"
    link.replace(outside)
    link.symlink_to(outside)
    original = outside.read_bytes()
    before = snapshot(tree)
    res = _launcher("patch", "apply", "--target", str(tree), check=False)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert f"{link} is a symlink to {outside}, outside {tree}; nothing was written" in res.stderr
    assert outside.read_bytes() == original and snapshot(tree) == before and link.is_symlink()


def test_a_full_disk_during_apply_says_so_not_permissions(tmp_path):
    where = tmp_path / "small"
    where.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        root = mini_tree("0.21.0", "site-packages", where / "tree", SERIES_FILES)
        filler = where / "filler"
        with open(filler, "wb") as fh:
            try:
                fh.write(b"x" * (8 << 20))
            except OSError:
                pass
        before = snapshot(root)
        res = _launcher("patch", "apply", "--target", str(root), check=False)
        assert res.returncode == 2 and "No space left on device" in res.stderr, res.stderr
        assert "hint: free some space on that disk" in res.stderr and "permissions" not in res.stderr
        filler.unlink()
        assert snapshot(root) == before
    finally:
        subprocess.run(["umount", str(where)], check=True)


def test_a_read_only_mount_says_so_not_permissions_or_sudo(tmp_path):
    """Round four: a read-only bind mount of the tree was called "no write access" with a
    hint to use sudo, which cannot help."""
    root = mini_tree("0.21.0", "site-packages", tmp_path / "tree", SERIES_FILES)
    view = tmp_path / "ro"
    view.mkdir()
    res = subprocess.run(["mount", "--bind", "-o", "ro", str(root), str(view)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {res.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True, capture_output=True)
        before = snapshot(root)
        res = _launcher("patch", "apply", "--target", str(view), check=False)
        assert res.returncode == 2, res.stdout + res.stderr
        assert "error: a read-only file system, nothing was written:" in res.stderr
        assert "sudo" not in res.stderr and "hint: remount it read-write" in res.stderr
        assert snapshot(root) == before
    finally:
        subprocess.run(["umount", str(view)], check=True)
