"""tests/gpu/remote.sh drafter-sweep / sweep-wait: several drafter recipes trained at once, one a
GPU, and the one that accepts most on the held-out prompts kept. Runs the script's own functions
and the real trained_pack.py (the plan's checks, the choice); `install` and `extras` (the bundle
and the staged target) and the snapshot's `remote.sh train-drafter` (the training, GPU only)
are stand-ins, and SWEEP_GPUS stands for the GPUs this machine lacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from tests.unit.gpu_scripts import copy_harness

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "tests" / "gpu"
REMOTE = GPU / "remote.sh"

# The stand-in training: its drafter's held-out acceptance is the override's "steps" / 1000, and
# it writes down what it was given.
TRAIN_STAND_IN = r'''
cat > "$WORK/given.txt" <<GIVEN
verb=$1 gpu=$CUDA_VISIBLE_DEVICES override=$DRAFTER_OVERRIDE extra=${DRAFTER_EXTRA_CORPUS:-none} models=$MODELS_TRAINED
GIVEN
case "$DRAFTER_OVERRIDE" in *'"steps":13}'*) echo "CUDA out of memory"; exit 1 ;; esac  # a slot that fails
d=$MODELS_TRAINED/dflash-r5-trained; mkdir -p "$d"
"$PY" - "$d" <<'PY'
import json, os, sys
acc = json.loads(os.environ["DRAFTER_OVERRIDE"])["steps"] / 1000
ev = {s: {"all_prompts": {"mean_acceptance_length": acc}} for s in ("vllm-0.21.0", "vllm-0.33.0")}
rec = {"drafter_sha256": f"d{acc}", "target_sha256": "t", "evaluation": ev}
open(os.path.join(sys.argv[1], "drafter-train-record.json"), "w").write(json.dumps(rec))
open(os.path.join(sys.argv[1], "model.safetensors"), "w").write(f"{acc}\n")
PY
printf 'target loaded\nstep 1 loss 1.0\n' > "$WORK/train-drafter.log"
'''


def _tree(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    copy_harness(tree / "tests" / "gpu")  # the gate reads its thresholds from bars.yaml
    (tree / "tests" / "gpu" / "remote.sh").write_text(TRAIN_STAND_IN)
    return tree


def _run(tmp_path: Path, call: str, **env_extra) -> subprocess.CompletedProcess:
    functions = REMOTE.read_text().split("\ncmd=${1:-}\n")[0]
    script = tmp_path / "remote-functions.sh"
    script.write_text(functions + f"\ninstall() {{ :; }}\nextras() {{ :; }}\n{call}\n")
    env = dict(os.environ, WORK=str(tmp_path / "work"), OUT=str(tmp_path / "out"), PY=sys.executable,
               SITE=str(tmp_path / "site"), MODELS_TRAINED=str(tmp_path / "models"), SWEEP_GPUS="4",
               **env_extra)
    return subprocess.run(["bash", str(script)], cwd=_tree(tmp_path) if not (tmp_path / "tree").exists()
                          else tmp_path / "tree", env=env, capture_output=True, text=True, timeout=120)


def _target(tmp_path: Path, old_acceptance: float | None) -> None:
    target = tmp_path / "models" / "trained-a4b-r30"
    target.mkdir(parents=True)
    (target / "train-record.json").write_text('{"target_sha256": "t"}')
    if old_acceptance is not None:
        old = tmp_path / "models" / "dflash-r5-trained"
        old.mkdir()
        ev = {s: {"all_prompts": {"mean_acceptance_length": old_acceptance}} for s in ("vllm-0.21.0", "vllm-0.33.0")}
        (old / "drafter-train-record.json").write_text(json.dumps({"target_sha256": "t", "evaluation": ev}))
        (old / "model.safetensors").write_text("old\n")


def _wait_all(tmp_path: Path, slots: int) -> None:
    end = time.time() + 60
    sweep = tmp_path / "work" / "drafter-sweep"
    while time.time() < end and len(list(sweep.glob("[0-9]*/rc"))) < slots:
        time.sleep(0.1)


def _sweep_to_the_end(tmp_path: Path, sweep: str, slots: int) -> subprocess.CompletedProcess:
    """drafter-sweep, every slot ended, then sweep-wait: what sweep-wait said."""
    started = _run(tmp_path, "drafter_sweep", DRAFTER_SWEEP=sweep)
    assert started.returncode == 0, started.stderr
    _wait_all(tmp_path, slots)
    waited = _run(tmp_path, "sweep_wait", SWEEP_WAIT_S="30")
    assert waited.returncode == 0, waited.stderr
    return waited


def _kept(tmp_path: Path) -> str:
    return (tmp_path / "models" / "dflash-r5-trained" / "model.safetensors").read_text()


def test_each_recipe_trains_on_its_own_gpu_and_the_best_is_kept(tmp_path):
    _target(tmp_path, old_acceptance=2.61)
    sweep = json.dumps([{"steps": 2500, "extra_fraction": 0}, {"steps": 3100, "extra_fraction": 0.25},
                        {"steps": 2900, "extra_fraction": 0}, {"steps": 2000}])
    started = _run(tmp_path, "drafter_sweep", DRAFTER_SWEEP=sweep)
    assert started.returncode == 0, started.stderr
    _wait_all(tmp_path, 4)
    given = {i: (tmp_path / "work" / "drafter-sweep" / str(i) / "work" / "given.txt").read_text() for i in range(4)}
    assert "verb=train-drafter gpu=1 " in given[1] and '"extra_fraction":0.25' in given[1]
    # Only a recipe with an extra_fraction gets the extra corpus (the bundle's vllm/ by default);
    # one that names none has the default's 0.5.
    assert f"extra={tmp_path}/site/vllm " in given[1] and f"extra={tmp_path}/site/vllm " in given[3]
    assert "extra=none " in given[0] and "extra=none " in given[2] and "gpu=2 " in given[2]
    # Each trains beside the staged drafter, in its own models folder, the target linked.
    assert f"models={tmp_path}/work/drafter-sweep/0/models" in given[0]
    assert _kept(tmp_path) == "old\n"

    waited = _run(tmp_path, "sweep_wait", SWEEP_WAIT_S="30")
    assert waited.returncode == 0, waited.stderr
    assert _kept(tmp_path) == "3.1\n"
    with tarfile.open(tmp_path / "out" / "drafter-sweep.tar.xz") as tar:
        names = set(tar.getnames())
    assert {"0/out", "2/out", "1/work/train-drafter.log", "1/drafter-train-record.json",
            "2/drafter-train-record.json"} <= names


def test_a_sweep_no_better_than_the_staged_drafter_keeps_it(tmp_path):
    _target(tmp_path, old_acceptance=3.5)
    _sweep_to_the_end(tmp_path, '[{"steps": 2500}, {"steps": 3000}]', 2)
    assert _kept(tmp_path) == "old\n"


def test_a_failed_slot_leaves_its_log_and_the_others_still_choose(tmp_path):
    _target(tmp_path, old_acceptance=2.61)
    waited = _sweep_to_the_end(tmp_path, '[{"steps": 13}, {"steps": 2700}]', 2)
    assert "slot 0: rc 1" in waited.stdout
    assert _kept(tmp_path) == "2.7\n"
    with tarfile.open(tmp_path / "out" / "drafter-sweep.tar.xz") as tar:
        said = tar.extractfile("0/out").read().decode()
        names = set(tar.getnames())
    assert "CUDA out of memory" in said and "0/drafter-train-record.json" not in names


def test_sweep_wait_before_the_end_reports_and_changes_nothing(tmp_path):
    _target(tmp_path, old_acceptance=2.0)
    sweep = tmp_path / "work" / "drafter-sweep"
    (sweep / "0" / "work").mkdir(parents=True)
    (sweep / "0" / "work" / "train-drafter.log").write_text("chunk 0 group 1024 x 16-160\nstep 50 loss 5.8\n")
    waited = _run(tmp_path, "sweep_wait", SWEEP_WAIT_S="1")
    assert waited.returncode == 0, waited.stderr
    assert "0 of 1 slots ended" in waited.stdout
    assert "chunk 0 group 1024 x 16-160" in waited.stdout and "step 50 loss 5.8" in waited.stdout
    assert not (tmp_path / "out" / "drafter-sweep.tar.xz").exists()
    assert (tmp_path / "models" / "dflash-r5-trained" / "model.safetensors").read_text() == "old\n"


def test_bad_recipes_are_refused_before_anything_starts(tmp_path):
    _target(tmp_path, old_acceptance=None)
    for sweep, said in ((json.dumps([{"stepz": 1}]), "recipe 0: no DrafterTrainConfig field stepz"),
                        (json.dumps([{}] * 5), "5 recipes and this machine 4 GPUs"),
                        (json.dumps([{}, {"extra_fraction": 2}]), "recipe 1: extra_fraction 2"),
                        ("{", "DRAFTER_SWEEP is not JSON")):
        res = _run(tmp_path, "drafter_sweep", DRAFTER_SWEEP=sweep)
        assert res.returncode != 0 and said in res.stderr, (sweep, res.stderr)
        assert not (tmp_path / "work" / "drafter-sweep").exists()


# The training's stand-in for remote.sh train-drafter: train_drafter.py, whose recipe checks stay
# the real ones (trained_pack.py sweep-plan imports them) but whose main writes down its
# arguments and a drafter for the target instead of training.
TRAIN_DRAFTER_STAND_IN = r'''
import json, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_drafter_real import *  # noqa: F401,F403

if __name__ == "__main__":
    models = Path(sys.argv[1])
    (models / "dflash-r5-trained").mkdir(exist_ok=True)
    (models / "dflash-r5-trained" / "drafter-train-record.json").write_text(json.dumps({"target_sha256": "t"}))
    (models.parent / "argv.json").write_text(json.dumps(sys.argv[1:]))
'''


def _train_drafter_argv(tmp_path, **env) -> list[str]:
    _target(tmp_path, old_acceptance=None)
    gpu = _tree(tmp_path) / "tests" / "gpu"
    (gpu / "models" / "train_drafter.py").rename(gpu / "models" / "train_drafter_real.py")
    (gpu / "models" / "train_drafter.py").write_text(TRAIN_DRAFTER_STAND_IN)
    res = _run(tmp_path, "train_drafter", **env)
    assert res.returncode == 0, res.stderr
    return json.loads((tmp_path / "argv.json").read_text())


def test_train_drafter_gives_the_default_recipe_its_extra_corpus(tmp_path):
    """The default recipe (4f7c6c17's) takes half its windows from an extra corpus:
    `remote.sh train-drafter` with no override must pass one, the bundle's vllm/ unless named."""
    argv = _train_drafter_argv(tmp_path)
    assert argv[argv.index("--extra-corpus") + 1] == f"{tmp_path}/site/vllm"


def test_train_drafter_passes_no_corpus_to_a_recipe_without_extra_fraction(tmp_path):
    argv = _train_drafter_argv(tmp_path, DRAFTER_OVERRIDE='{"extra_fraction": 0, "steps": 10}',
                               DRAFTER_EXTRA_CORPUS="/somewhere")
    assert "--extra-corpus" not in argv and argv[argv.index("--override") + 1] == '{"extra_fraction": 0, "steps": 10}'


def test_train_drafter_takes_a_named_corpus_and_refuses_a_bad_recipe_before_training(tmp_path):
    argv = _train_drafter_argv(tmp_path, DRAFTER_EXTRA_CORPUS="/elsewhere/vllm")
    assert argv[argv.index("--extra-corpus") + 1] == "/elsewhere/vllm"
    (tmp_path / "argv.json").unlink()
    res = _run(tmp_path, "train_drafter", DRAFTER_OVERRIDE='{"stepz": 1}')
    assert res.returncode != 0 and "no DrafterTrainConfig field stepz" in res.stderr
    assert not (tmp_path / "argv.json").exists()
