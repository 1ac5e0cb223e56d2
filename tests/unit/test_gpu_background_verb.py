"""remote.sh's bg / bg-wait: any verb detached from a snapshot of the tree, so that it outlives a
command's 600 s on the GPU host, then collected into the command's $OUT. Runs remote.sh's own
functions; the verb is a stand-in remote.sh in a scratch tree (the real verbs need a GPU), which
writes a record into its $OUT, says which environment it got, and takes a moment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS = (ROOT / "tests" / "gpu" / "remote.sh").read_text().split("\ncmd=${1:-}\n")[0]
STAND_IN = """#!/usr/bin/env bash
echo "verb $1 from $(pwd) with SERVED_JOBS=$SERVED_JOBS"
sleep "${STAND_IN_S:-1}"
mkdir -p "$OUT" && echo '{"ok": true}' > "$OUT/record.json"
[ "$1" = failing ] && exit 3
exit 0
"""


def _tree(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    (tree / "tests" / "gpu").mkdir(parents=True)
    (tree / "tests" / "gpu" / "remote.sh").write_text(STAND_IN)
    (tree / ".stage").mkdir()
    (tree / ".stage" / "big.part").write_text("x")  # left out of the snapshot
    return tree


def _run(tmp_path: Path, script: str, out: str, **env) -> subprocess.CompletedProcess:
    (tmp_path / "f.sh").write_text(FUNCTIONS + "\n" + script + "\n")
    env = dict(os.environ, WORK=str(tmp_path / "work"), OUT=str(tmp_path / out), PY=sys.executable,
               SERVED_JOBS="speed", **env)
    return subprocess.run(["bash", str(tmp_path / "f.sh")], cwd=_tree(tmp_path) if not (tmp_path / "tree").exists()
                          else tmp_path / "tree", env=env, capture_output=True, text=True, timeout=120)


def test_a_verb_in_the_background_is_collected_with_its_records_and_exit_status(tmp_path):
    started = _run(tmp_path, "background_verb served-all; background_verb served-all", "out0", STAND_IN_S="2")
    assert started.returncode == 0, started.stderr
    assert "served-all in the background" in started.stdout
    assert "already running" in started.stdout  # a second start while it runs starts nothing
    done = _run(tmp_path, "background_wait served-all", "out1", BG_WAIT_S="60")
    assert done.returncode == 0, done.stderr
    assert "bg served-all ended: rc 0" in done.stdout
    assert "verb served-all from " + str(tmp_path / "work" / "bg-served-all" / "tree") in done.stdout
    assert "SERVED_JOBS=speed" in done.stdout  # the calling environment went with it
    assert (tmp_path / "out1" / "record.json").read_text().strip() == '{"ok": true}'
    assert (tmp_path / "out1" / "bg-served-all.log").is_file()
    assert not (tmp_path / "work" / "bg-served-all" / "tree" / ".stage").exists()


def test_a_wait_that_ends_first_says_so_and_a_failing_verb_gives_its_status(tmp_path):
    _run(tmp_path, "background_verb failing", "out0", STAND_IN_S="4")
    early = _run(tmp_path, "background_wait failing", "out1", BG_WAIT_S="0")
    assert "bg failing still running after 0s" in early.stdout
    late = _run(tmp_path, "background_wait failing", "out2", BG_WAIT_S="60")
    assert "bg failing ended: rc 3" in late.stdout and (tmp_path / "out2" / "record.json").is_file()


def test_a_wait_on_a_machine_that_never_started_it_refuses(tmp_path):
    done = _run(tmp_path, "background_wait speedup-frozen", "out")
    assert done.returncode == 1 and "no bg speedup-frozen on this machine" in done.stderr


def test_one_verb_runs_twice_at_once_under_two_names(tmp_path):
    # both releases' speed-up curves side by side, one a GPU: BG_NAME tells the two jobs apart
    first = _run(tmp_path, "BG_NAME=curve-a background_verb speedup-curve", "out0", STAND_IN_S="2")
    second = _run(tmp_path, "BG_NAME=curve-b background_verb speedup-curve", "out1", STAND_IN_S="2")
    assert "curve-a in the background" in first.stdout and "curve-b in the background" in second.stdout
    assert "already running" not in second.stdout
    for name, out in (("curve-a", "out2"), ("curve-b", "out3")):
        done = _run(tmp_path, f"background_wait {name}", out, BG_WAIT_S="60")
        assert f"bg {name} ended: rc 0" in done.stdout
        assert "verb speedup-curve from " + str(tmp_path / "work" / f"bg-{name}" / "tree") in done.stdout
        assert (tmp_path / out / "record.json").is_file() and (tmp_path / out / f"bg-{name}.log").is_file()
    # the same name again while it runs starts nothing
    _run(tmp_path, "BG_NAME=curve-a background_verb speedup-curve", "out4", STAND_IN_S="3")
    again = _run(tmp_path, "BG_NAME=curve-a background_verb speedup-curve", "out5")
    assert "curve-a already running" in again.stdout


def test_a_verb_is_not_started_while_a_staged_bundle_lacks_parts(tmp_path):
    # A verb installs what is staged first: detached while the 0.21.0 bundle still lacked parts,
    # full-size-checkpoints stopped on them, and said so only at bg-wait. The real parts.py reads
    # a manifest of two parts with one received.
    import json
    import shutil

    tree = _tree(tmp_path)
    (tree / "tests" / "gpu" / "staging").mkdir()
    shutil.copy(ROOT / "tests" / "gpu" / "staging" / "parts.py", tree / "tests" / "gpu" / "staging" / "parts.py")
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    (bundles / "bundle.json").write_text(json.dumps({"sha256": "0", "parts": [
        {"name": "bundle.tar.xz.part00", "sha256": "0"}, {"name": "bundle.tar.xz.part01", "sha256": "0"}]}))
    (bundles / "bundle.tar.xz.part00").write_text("x")
    refused = _run(tmp_path, "background_verb full-size-checkpoints", "out0", BUNDLE_DIR=str(bundles))
    assert refused.returncode == 1 and "staged bundles still lack parts (held/all: bundle 1/2)" in refused.stderr
    assert not (tmp_path / "work" / "bg-full-size-checkpoints").exists()
    anyway = _run(tmp_path, "background_verb full-size-checkpoints", "out1", BUNDLE_DIR=str(bundles), BG_PARTIAL_OK="1")
    assert anyway.returncode == 0 and "in the background" in anyway.stdout
    (bundles / "bundle.tar.xz.part01").write_text("y")
    whole = _run(tmp_path, "background_wait full-size-checkpoints; BG_NAME=again background_verb full-size-checkpoints",
                 "out2", BUNDLE_DIR=str(bundles), BG_WAIT_S="60")
    assert whole.returncode == 0 and "again in the background" in whole.stdout
