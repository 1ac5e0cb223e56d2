"""tests/gpu/remote.sh's background jobs (target-bg, lanes-bg and lanes-wait): the call returns while
the job runs, also when its output goes through a pipe, and the job runs from a snapshot of the
tree. Runs the script's own functions with a stand-in repository whose scripts only note what
they were given and sleep (the real ones train or run vLLM), and the installs stubbed out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.unit.gpu_scripts import copy_harness

REMOTE = Path(__file__).resolve().parents[1] / "gpu" / "remote.sh"
A, B = "trained-ref-bf16", "trained-ref-nvfp4"  # two runs of 0.21.0's lanes


def test_target_bg_returns_through_a_pipe_and_trains_from_a_snapshot(tmp_path):
    """target-bg (remote.sh target_background, through the `detached` helper that lanes-bg and
    drafter-bg share): the training runs in a session of its own from a snapshot of the tree,
    less .stage/, and the call returns at once even when its output goes through a pipe. The
    stand-in "training" (PY=bash runs tests/gpu/models/train_target.py as a script) notes its process
    and directory, then sleeps far longer than the call."""
    repo, work = tmp_path / "repo", tmp_path / "work"
    (repo / "tests" / "gpu" / "models").mkdir(parents=True)
    (repo / ".stage").mkdir()
    (repo / ".stage" / "bundle.tar.xz.part00").write_text("not copied")
    (repo / "tests" / "gpu" / "models" / "train_target.py").write_text(
        f"echo $$ > {work}/bg.pid\npwd > {work}/cwd.txt\nsleep 60\n")
    functions = REMOTE.read_text().split('\ncmd=${1:-}\n')[0]
    script = functions + "\ncorpus_receive() { :; }\ntarget_background\n"
    (tmp_path / "remote-functions.sh").write_text(script)
    env = dict(os.environ, WORK=str(work), OUT=str(work / "out"), PY="bash", MODELS_TRAINED=str(tmp_path / "models"))
    done = subprocess.run(["bash", "-c", f"bash {tmp_path / 'remote-functions.sh'} | tail -1"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=45)
    try:
        assert done.returncode == 0, done.stderr
        assert "training in the background" in done.stdout
        assert not (work / "target-bg.rc").exists()  # the call returned before the training ended
        for _ in range(100):  # the training did start, in a session of its own
            if (work / "cwd.txt").exists() and (work / "cwd.txt").read_text().strip():
                break
            time.sleep(0.1)
        pid = int((work / "bg.pid").read_text())
        assert os.getsid(pid) == pid or os.getsid(pid) != os.getsid(0)
        # It runs in the snapshot, which leaves the staged parts out and keeps its files when the
        # caller's tree changes under it.
        assert (work / "cwd.txt").read_text().strip() == str(work / "target-tree")
        assert not (work / "target-tree" / ".stage").exists()
        (repo / "tests" / "gpu" / "models" / "train_target.py").unlink()
        assert (work / "target-tree" / "tests" / "gpu" / "models" / "train_target.py").exists()
        # A second call while it runs starts nothing new.
        again = subprocess.run(["bash", str(tmp_path / "remote-functions.sh")], cwd=repo, env=env,
                               capture_output=True, text=True, timeout=45)
        assert again.returncode == 0 and "already running" in again.stdout, again.stderr
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
    stubs = ("nvidia-smi() { :; }\nwait_drafter() { echo wait_drafter; }\n"
             "seed_raw() { :; }\ntrained_nvfp4() { echo trained_nvfp4; }\ntrained_setup\n")
    (tmp_path / "setup.sh").write_text(functions + "\n" + stubs)
    env = dict(os.environ, WORK=str(work), OUT=str(work / "out"), MODELS_TRAINED=str(models),
               RUNS=runs, RS_PARALLEL=parallel)
    done = subprocess.run(["bash", str(tmp_path / "setup.sh")], env=env, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_bf16_runs_do_not_make_the_nvfp4_copy(tmp_path):
    """trained_setup makes the NVFP4 copy (minutes on the GPU) only for runs that read it, and
    waits for a background drafter (drafter-bg) only for runs of the trained drafter."""
    assert _trained_setup(tmp_path, "", "trained-refgroups-bf16-capture;v33-trained-ref-bf16") == []
    assert _trained_setup(tmp_path, "", "trained-ref-nvfp4") == ["trained_nvfp4"]
    assert _trained_setup(tmp_path, "trained-dflash-trained-fa2-cg-nvfp4", "") == ["wait_drafter", "trained_nvfp4"]
    assert _trained_setup(tmp_path, "trained-dflash-trained-fa2-cg-bf16", "") == ["wait_drafter"]
    # No names: every run of the release, NVFP4 ones among them.
    assert _trained_setup(tmp_path, "", "") == ["trained_nvfp4"]


def test_lanes_of_both_releases_outlive_the_call_and_come_back_whether_ended_or_not(tmp_path):
    """lanes-bg starts realshape-trained and realshape-v33-trained (and, asked, nvfp4-reference) in
    sessions of their own from a snapshot (the stand-in verbs note their lanes and raw seeds, one
    ends at once, one sleeps); lanes-wait reports each and packs what exists."""
    repo, work = tmp_path / "repo", tmp_path / "work"
    (repo / "tests" / "gpu").mkdir(parents=True)
    # realshape.py's own lane check runs first (lanes_check): the real module, real run names.
    copy_harness(repo / "tests" / "gpu")  # gate.py reads bars.yaml
    (repo / ".stage" / "realshape-raw-trained").mkdir(parents=True)
    (repo / ".stage" / "realshape-raw-trained" / "trained-ref-bf16.raw.json").write_text("{}")
    # the NVFP4 copy (extras-trained) that the NVFP4 run and the walk need, as a stand-in folder
    (tmp_path / "models" / "trained-a4b-r30-nvfp4").mkdir(parents=True)
    (tmp_path / "models" / "trained-a4b-r30-nvfp4" / "hf_quant_config.json").write_text("{}")
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
        # every lane ended, one of them badly: the wait fails and names it
        (work / "lanes-33.rc").write_text("3\n")
        waited = subprocess.run(["bash", str(tmp_path / "f.sh"), "lanes_wait"], cwd=repo, env=env,
                                capture_output=True, text=True, timeout=30)
        assert waited.returncode == 1 and "lanes that ended with an error: 33" in waited.stderr
        (work / "lanes-33.rc").write_text("0\n")
        waited = subprocess.run(["bash", str(tmp_path / "f.sh"), "lanes_wait"], cwd=repo, env=env,
                                capture_output=True, text=True, timeout=30)
        assert waited.returncode == 0, waited.stderr
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


_DISPATCH = """#!/bin/bash
# PY for the stand-in repository: python3 for `-c` lines, a stand-in script's bash otherwise
if [ "$1" = -c ]; then exec python3 "$@"; fi
exec bash "$@"
"""
_TRAIN_TARGET = """out=$1; shift; polish=""; recipe=""
while [ $# -gt 0 ]; do [ "$1" = --polish ] && polish=$2; [ "$1" = --polish-recipe ] && recipe=$2; shift; done
mkdir -p "$out/trained-a4b-r30" && echo "{}" > "$out/shapes.json"
if [ -n "$recipe" ]; then rec=$(python3 -c 'import json, sys; r = json.loads(sys.argv[1])[sys.argv[2]]; \
print(json.dumps({"target_sha256": "p3", "polished_from": {"target_sha256": "p2", "recipe": r}, "train_config": r}))' \
"$RECIPES" "$recipe")
elif [ -n "$polish" ]; then rec='{"target_sha256": "p2", "polished_from": {"target_sha256": "f1"}, '\
'"train_config": {"seq_prefix_cycle": []}}'
else rec='{"target_sha256": "f1", "polished_from": null}'; fi
echo "$rec" > "$out/trained-a4b-r30/train-record.json"
echo "target $(basename "$out")${polish:+ polish}${recipe:+ $recipe}" >> "$WORK/calls.txt"
"""
_TRAIN_DRAFTER = """mkdir -p "$1/dflash-r5-trained"
python3 -c 'import json, sys; t = json.load(open(sys.argv[1]))["target_sha256"]; \\
print(json.dumps({"target_sha256": t}))' "$1/trained-a4b-r30/train-record.json" > "$1/dflash-r5-trained/drafter-train-record.json"
echo "drafter $(basename "$1")" >> "$WORK/calls.txt"
"""


def _recipe_repo(tmp_path):
    repo = tmp_path / "repo"
    gpu = repo / "tests" / "gpu"
    (gpu / "models").mkdir(parents=True)
    (gpu / "staging").mkdir()
    (gpu / "models" / "train_target.py").write_text(_TRAIN_TARGET)
    (gpu / "models" / "train_drafter.py").write_text(_TRAIN_DRAFTER)
    # The gate passes; the record questions (has, same) go to the real trained_pack.py.
    real = REMOTE.parent / "staging" / "trained_pack.py"
    (gpu / "staging" / "trained_pack.py").write_text(f'[ "$1" = gate ] && exit 0\nexec python3 {real} "$@"\n')
    (tmp_path / "py").write_text(_DISPATCH)
    (tmp_path / "py").chmod(0o755)
    functions = REMOTE.read_text().split('\ncmd=${1:-}\n')[0]
    script = functions + "\ncorpus_receive() { :; }\nPOLISH=1 CHAIN_DRAFTER=1 target_background && " \
                         "until [ -f $WORK/target-bg.rc ]; do sleep 0.2; done; TARGET_WAIT_S=0 target_wait\n"
    (tmp_path / "recipe.sh").write_text(script)
    return repo


def _run_recipe(tmp_path, repo, **extra) -> list[str]:
    work = tmp_path / "work"
    import json
    import sys

    sys.path.insert(0, str(REMOTE.parent / "models"))
    import train_target

    env = dict(os.environ, WORK=str(work), OUT=str(work / "out"), PY=str(tmp_path / "py"),
               MODELS_TRAINED=str(tmp_path / "models"), MODELS_POLISHED=str(tmp_path / "polished"),
               RECIPES=json.dumps(train_target.POLISH_RECIPES), **extra)
    done = subprocess.run(["bash", str(tmp_path / "recipe.sh")], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and (work / "target-bg.rc").read_text().strip() == "0", done.stdout + done.stderr
    calls = work / "calls.txt"
    return calls.read_text().splitlines() if calls.exists() else []


def _record(path: Path) -> dict:
    import json

    return json.loads(path.read_text())


def test_the_recipe_polishes_into_the_trained_folder_and_trains_the_drafter_once(tmp_path):
    """POLISH=1 CHAIN_DRAFTER=1 target-bg from nothing: the first stage, its polish, and the drafter
    on the polished target, which then sits where every later verb looks ($MODELS_TRAINED; the
    first stage beside it); target-wait returns both records. Run again, it trains nothing."""
    repo, models = _recipe_repo(tmp_path), tmp_path / "models"
    assert _run_recipe(tmp_path, repo) == ["target models", "target polished polish", "drafter models"]
    assert _record(models / "trained-a4b-r30" / "train-record.json")["target_sha256"] == "p2"
    assert _record(tmp_path / "models-first" / "trained-a4b-r30" / "train-record.json")["target_sha256"] == "f1"
    assert _record(models / "dflash-r5-trained" / "drafter-train-record.json")["target_sha256"] == "p2"
    out = tmp_path / "work" / "out"
    assert _record(out / "polish-record.json")["target_sha256"] == "p2"
    assert _record(out / "train-record.json")["target_sha256"] == "f1"
    assert _record(out / "drafter-train-record.json")["target_sha256"] == "p2"
    (tmp_path / "work" / "calls.txt").unlink()
    assert _run_recipe(tmp_path, repo) == []


def test_a_restored_first_stage_is_polished_and_a_stale_drafter_retrained(tmp_path):
    """A first-stage target restored from a pack (receive-trained), with a drafter trained for it:
    the recipe polishes it and trains a drafter for the polished target."""
    repo, models = _recipe_repo(tmp_path), tmp_path / "models"
    (models / "trained-a4b-r30").mkdir(parents=True)
    (models / "shapes.json").write_text("{}")
    (models / "trained-a4b-r30" / "train-record.json").write_text('{"target_sha256": "f1", "polished_from": null}')
    (models / "dflash-r5-trained").mkdir()
    (models / "dflash-r5-trained" / "drafter-train-record.json").write_text('{"target_sha256": "f1"}')
    assert _run_recipe(tmp_path, repo) == ["target polished polish", "drafter models"]
    assert _record(models / "dflash-r5-trained" / "drafter-train-record.json")["target_sha256"] == "p2"


def test_a_second_polish_takes_the_polished_targets_place_and_its_drafter_follows(tmp_path):
    """A polished target restored from a pack, with its drafter: POLISH_AGAIN=long polishes it
    again (train_target.py --polish-recipe long), moves it aside, trains a drafter for the new
    one; run again, it trains nothing (the record's prefix cycle says the second polish is done)."""
    repo, models = _recipe_repo(tmp_path), tmp_path / "models"
    (models / "trained-a4b-r30").mkdir(parents=True)
    (models / "shapes.json").write_text("{}")
    (models / "trained-a4b-r30" / "train-record.json").write_text(
        '{"target_sha256": "p2", "polished_from": {"target_sha256": "f1"}, "train_config": {"seq_prefix_cycle": []}}')
    (models / "dflash-r5-trained").mkdir()
    (models / "dflash-r5-trained" / "drafter-train-record.json").write_text('{"target_sha256": "p2"}')
    assert _run_recipe(tmp_path, repo, POLISH_AGAIN="long") == ["target polished polish long", "drafter models"]
    assert _record(models / "trained-a4b-r30" / "train-record.json")["target_sha256"] == "p3"
    assert _record(tmp_path / "models-polished" / "trained-a4b-r30" / "train-record.json")["target_sha256"] == "p2"
    assert _record(models / "dflash-r5-trained" / "drafter-train-record.json")["target_sha256"] == "p3"
    (tmp_path / "work" / "calls.txt").unlink()
    assert _run_recipe(tmp_path, repo, POLISH_AGAIN="long") == []


def test_a_second_polish_names_a_long_recipe_and_keeps_the_target_before_it_apart(tmp_path):
    repo = _recipe_repo(tmp_path)
    work = tmp_path / "work"
    for extra, why in (({"POLISH_AGAIN": "polish"}, "long or long-heavy"),
                       ({"POLISH_AGAIN": "long", "MODELS_POLISHED": str(tmp_path / "models-polished")},
                        "where the target before it goes")):
        env = dict(os.environ, WORK=str(work), OUT=str(work / "out"), PY=str(tmp_path / "py"),
                   MODELS_TRAINED=str(tmp_path / "models"), MODELS_POLISHED=str(tmp_path / "polished"))
        env.update(extra)
        done = subprocess.run(["bash", str(tmp_path / "recipe.sh")], cwd=repo, env=env, capture_output=True,
                              text=True, timeout=60)
        assert why in done.stderr, done.stderr  # refused before anything started
        assert not (work / "target-bg.rc").exists() and not (work / "target-bg.out").exists()


def test_archive_lanes_files_the_lanes_records_beside_the_results_named_by_gpu_target_and_drafter(tmp_path):
    """What lanes-wait packed ($OUT/lanes.tgz) becomes results/realshape-logs/DATE-GPU-trained-
    TARGET-DRAFTER-lanes.tar.xz, where rejudge reads raw records; nothing to archive is refused."""
    work, out, models = tmp_path / "work", tmp_path / "out", tmp_path / "models"
    (models / "trained-a4b-r30").mkdir(parents=True)
    (models / "dflash-r5-trained").mkdir()
    (models / "trained-a4b-r30" / "train-record.json").write_text('{"target_sha256": "84c26c18aa"}')
    (models / "dflash-r5-trained" / "drafter-train-record.json").write_text('{"drafter_sha256": "8db4e9f4bb"}')
    work.mkdir()
    (work / "gpu.txt").write_text("NVIDIA H200, 143771 MiB, 580.159.04\n")
    functions = REMOTE.read_text().split('\ncmd=${1:-}\n')[0]
    (tmp_path / "f.sh").write_text(functions + '\n"$@"\n')
    env = dict(os.environ, WORK=str(work), OUT=str(out), PY=sys.executable, MODELS_TRAINED=str(models))
    tree = tmp_path / "tree"
    tree.mkdir()
    refused = subprocess.run(["bash", str(tmp_path / "f.sh"), "archive_lanes"], cwd=tree, env=env,
                             capture_output=True, text=True, timeout=30)
    assert refused.returncode == 1 and "no " in refused.stderr and "lanes.tgz" in refused.stderr
    (work / "lanes-out-21").mkdir()
    (work / "lanes-out-21" / "realshape.json").write_text("[]")
    out.mkdir()
    subprocess.run(["tar", "-C", str(work), "-czf", str(out / "lanes.tgz"), "lanes-out-21"], check=True)
    done = subprocess.run(["bash", str(tmp_path / "f.sh"), "archive_lanes"], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    [archive] = (tree / "tests" / "gpu" / "results" / "realshape-logs").glob("*.tar.xz")
    assert archive.name.endswith("-h200-trained-84c26c18-8db4e9f4-lanes.tar.xz") and archive.name[:4].isdigit()
    listed = subprocess.run(["tar", "-tJf", str(archive)], capture_output=True, text=True, check=True).stdout
    assert "lanes-out-21/realshape.json" in listed
