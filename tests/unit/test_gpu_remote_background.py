"""tests/gpu/remote.sh's background training: the call returns while the training runs, also when
its output goes through a pipe (on 2026-11-27 a `train-bg | tail` call held the device until its time
limit). Runs the script's own train_background function with a stand-in repository whose
tests/gpu/remote.sh only sleeps (the real one would install vLLM), and `install` stubbed out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REMOTE = Path(__file__).resolve().parents[1] / "gpu" / "remote.sh"
A, B = "trained-ref-bf16", "trained-ref-nvfp4"  # two runs of 0.21.0's lanes


def test_train_bg_returns_through_a_pipe_while_the_training_runs(tmp_path):
    repo, work = tmp_path / "repo", tmp_path / "work"
    (repo / "tests" / "gpu").mkdir(parents=True)
    # The stand-in "training": notes its process group, then sleeps far longer than the call.
    (repo / "tests" / "gpu" / "remote.sh").write_text(f"echo $$ > {work}/bg.pid\nsleep 60\n")
    functions = REMOTE.read_text().split('\ncmd=${1:-}\n')[0]
    script = functions + "\ninstall() { :; }\ntrain_background\n"
    (tmp_path / "remote-functions.sh").write_text(script)
    env = dict(os.environ, WORK=str(work), OUT=str(work / "out"))
    done = subprocess.run(["bash", "-c", f"bash {tmp_path / 'remote-functions.sh'} | tail -1"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=45)
    try:
        assert done.returncode == 0, done.stderr
        assert "training in the background" in done.stdout
        assert not (work / "train-bg.rc").exists()  # the call returned before the training ended
        for _ in range(100):  # the training did start, in a session of its own
            if (work / "bg.pid").exists() and (work / "bg.pid").read_text().strip():
                break
            time.sleep(0.1)
        pid = int((work / "bg.pid").read_text())
        assert os.getsid(pid) == pid or os.getsid(pid) != os.getsid(0)
    finally:
        if (work / "bg.pid").exists() and (work / "bg.pid").read_text().strip():
            os.killpg(os.getpgid(int((work / "bg.pid").read_text())), signal.SIGKILL)


def _trained_setup(tmp_path, runs: str, parallel: str) -> str:
    """Which waits trained_setup makes for these run names: the script's own function, with the
    GPU query, the waits and the raw-record seeding stubbed to say their names."""
    models, work = tmp_path / "models", tmp_path / "work"
    models.mkdir(exist_ok=True)
    (models / "shapes.json").write_text("{}")
    functions = REMOTE.read_text().split('\ncmd=${1:-}\n')[0]
    stubs = ("nvidia-smi() { :; }\nwait_training() { echo wait_training; }\nwait_drafter() { echo wait_drafter; }\n"
             "seed_raw() { :; }\ntrained_nvfp4() { echo trained_nvfp4; }\ntrained_setup\n")
    (tmp_path / "setup.sh").write_text(functions + "\n" + stubs)
    env = dict(os.environ, WORK=str(work), OUT=str(work / "out"), MODELS_TRAINED=str(models),
               RUNS=runs, RS_PARALLEL=parallel)
    done = subprocess.run(["bash", str(tmp_path / "setup.sh")], env=env, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_bf16_runs_do_not_wait_for_the_background_nvfp4_copy(tmp_path):
    """On 2026-11-27 the bf16 noise runs were to start while the NVFP4 copy (quant-bg, 6 minutes)
    was still being made beside the drafter's training."""
    assert _trained_setup(tmp_path, "", "trained-refgroups-bf16-capture;v33-trained-ref-bf16") == ["wait_training"]
    assert _trained_setup(tmp_path, "", "trained-ref-nvfp4") == ["wait_training", "trained_nvfp4"]
    assert _trained_setup(tmp_path, "trained-dflash-trained-fa2-cg-nvfp4", "") == \
        ["wait_training", "wait_drafter", "trained_nvfp4"]
    # No names: every run of the release, NVFP4 ones among them.
    assert _trained_setup(tmp_path, "", "") == ["wait_training", "trained_nvfp4"]


def test_lanes_of_both_releases_outlive_the_call_and_come_back_whether_ended_or_not(tmp_path):
    """lanes-bg starts realshape-trained and realshape-v33-trained (and, asked, nvfp4-reference) in
    sessions of their own from a snapshot (the stand-in verbs note their lanes and raw seeds, one
    ends at once, one sleeps); lanes-wait reports each and packs what exists."""
    repo, work = tmp_path / "repo", tmp_path / "work"
    (repo / "tests" / "gpu").mkdir(parents=True)
    # realshape.py's own lane check runs first (lanes_check): the real module, real run names.
    for f in [*REMOTE.parent.glob("*.py"), REMOTE.parent / "bars.yaml"]:  # gate.py reads bars.yaml
        (repo / "tests" / "gpu" / f.name).write_text(f.read_text())
    (repo / ".stage" / "realshape-raw-trained").mkdir(parents=True)
    (repo / ".stage" / "realshape-raw-trained" / "trained-ref-bf16.raw.json").write_text("{}")
    (repo / "tests" / "gpu" / "remote.sh").write_text(
        'mkdir -p "$OUT"; echo "$1 $RS_PARALLEL $(ls .stage/realshape-raw-trained)" > "$OUT/verb.txt"\n'
        'echo "$ROUND_DEADLINE_S $RS_CHILD_TIMEOUT_S" > "$OUT/limits.txt"\n'
        f'echo $$ >> {work}/bg.pids\n'
        '[ "$1" = realshape-v33-trained ] && sleep 60\nexit 0\n')
    functions = REMOTE.read_text().split('\ncmd=${1:-}\n')[0]
    (tmp_path / "f.sh").write_text(functions + '\n"$@"\n')
    env = dict(os.environ, WORK=str(work), OUT=str(tmp_path / "out"), LANES_STAGGER_S="0", LANES_WAIT_S="3",
               PY=sys.executable, MODELS_TRAINED=str(tmp_path / "models"), RS_PARALLEL_21=f"{A};{B}",
               RS_PARALLEL_33="v33-trained-ref-bf16", RS_WALK_NVFP4="1")
    try:
        started = subprocess.run(["bash", str(tmp_path / "f.sh"), "lanes_background"], cwd=repo, env=env,
                                 capture_output=True, text=True, timeout=30)
        assert started.returncode == 0, started.stderr
        assert f"realshape-trained in the background: {A};{B}" in started.stdout
        waited = subprocess.run(["bash", str(tmp_path / "f.sh"), "lanes_wait"], cwd=repo, env=env,
                                capture_output=True, text=True, timeout=30)
        assert waited.returncode == 1  # one verb still runs
        assert "lanes 21: ended with 0" in waited.stdout and "lanes 33: running" in waited.stdout
        # The NVFP4 walk runs beside the lanes, its record in a lane folder of its own.
        assert "lanes walk: ended with 0" in waited.stdout
        assert (work / "lanes-out-walk" / "verb.txt").read_text().split() == \
            ["nvfp4-reference", "trained-ref-bf16.raw.json"]
        assert (work / "lanes-out-21" / "verb.txt").read_text().split() == \
            ["realshape-trained", f"{A};{B}", "trained-ref-bf16.raw.json"]
        # A background lane is not bound by a call's 600 s: a 0.33.0 capture alone took 392 s.
        assert (work / "lanes-out-21" / "limits.txt").read_text().split() == ["1800", "900"]
        listed = subprocess.run(["tar", "-tzf", str(tmp_path / "out" / "lanes.tgz")], capture_output=True,
                                text=True, check=True).stdout.split()
        assert "lanes-out-21/verb.txt" in listed and "lanes-33.log" in listed
        assert "lanes-out-walk/verb.txt" in listed and "lanes-walk.log" in listed
    finally:
        for pid in (work / "bg.pids").read_text().split() if (work / "bg.pids").exists() else []:
            try:
                os.killpg(os.getpgid(int(pid)), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_lanes_wait_on_a_machine_that_ran_no_lanes_fails_and_says_why(tmp_path):
    """2026-11-28: the machine went back between lanes-bg and lanes-wait, and lanes-wait on the
    fresh one answered 0 with only a cd error: it read as lanes that had ended."""
    functions = REMOTE.read_text().split('\ncmd=${1:-}\n')[0]
    (tmp_path / "f.sh").write_text(functions + '\n"$@"\n')
    env = dict(os.environ, WORK=str(tmp_path / "absent"), OUT=str(tmp_path / "out"), LANES_WAIT_S="0")
    waited = subprocess.run(["bash", str(tmp_path / "f.sh"), "lanes_wait"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=30)
    assert waited.returncode == 1
    assert "no lanes on this machine" in waited.stderr and "rerun lanes-bg" in waited.stderr


def test_install_bg_runs_from_a_snapshot_under_prepares_lock(tmp_path):
    """On 2026-11-28 a background install read tests/gpu/bundle-requirements.txt while the next
    receive call's copy of the tree replaced it, and failed. install-bg runs from a snapshot, and
    holds prepare's lock so that prepare waits for it. The stand-in verb notes where it runs and
    whether it can take that lock itself (it must not: its parent holds it)."""
    repo, work = tmp_path / "repo", tmp_path / "work"
    (repo / "tests" / "gpu").mkdir(parents=True)
    (repo / "tests" / "gpu" / "remote.sh").write_text(
        f'echo $$ > {work}/bg.pid; pwd > {work}/cwd.txt\n'
        f'flock -n {work}/prepare.lock true && echo free > {work}/lock.txt || echo held > {work}/lock.txt\n'
        'sleep 60\n')
    functions = REMOTE.read_text().split('\ncmd=${1:-}\n')[0]
    (tmp_path / "f.sh").write_text(functions + '\n"$@"\n')
    env = dict(os.environ, WORK=str(work), OUT=str(tmp_path / "out"))
    try:
        started = subprocess.run(["bash", "-c", f"bash {tmp_path / 'f.sh'} install_background | tail -1"],
                                 cwd=repo, env=env, capture_output=True, text=True, timeout=30)
        assert started.returncode == 0, started.stderr
        assert "install in the background" in started.stdout
        for _ in range(100):
            if (work / "lock.txt").exists() and (work / "lock.txt").read_text().strip():
                break
            time.sleep(0.1)
        assert (work / "cwd.txt").read_text().strip() == str(work / "install-tree")
        assert (work / "lock.txt").read_text().strip() == "held"
        # The caller's tree may now change under it: the snapshot keeps the files it started with.
        (repo / "tests" / "gpu" / "remote.sh").unlink()
        assert (work / "install-tree" / "tests" / "gpu" / "remote.sh").exists()
    finally:
        if (work / "bg.pid").exists() and (work / "bg.pid").read_text().strip():
            os.killpg(os.getpgid(int((work / "bg.pid").read_text())), signal.SIGKILL)
