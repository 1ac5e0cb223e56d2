"""tests/gpu/remote.sh drafter-bg: the drafter retrained in a session of its own while later calls
run. Runs the script's own functions; `install` and `extras` (the bundle and the staged target,
which cannot exist here) and the snapshot's `remote.sh` (the training itself, GPU only) are
stand-ins that record what they were given."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REMOTE = ROOT / "tests" / "gpu" / "remote.sh"


def _run(tmp_path: Path, tree: Path, env_extra: dict, call: str = "drafter_background") -> subprocess.CompletedProcess:
    functions = REMOTE.read_text().split("\ncmd=${1:-}\n")[0]
    script = tmp_path / "remote-functions.sh"
    script.write_text(functions + f"\ninstall() {{ :; }}\nextras() {{ :; }}\n{call}\n")
    env = dict(os.environ, WORK=str(tmp_path / "work"), OUT=str(tmp_path / "out"),
               MODELS_TRAINED=str(tmp_path / "models"), **env_extra)
    return subprocess.run(["bash", str(script)], cwd=tree, env=env, capture_output=True, text=True, timeout=60)


def _tree(tmp_path: Path) -> Path:
    """A repository stand-in whose remote.sh 'trains' by writing its verb and environment."""
    tree = tmp_path / "tree"
    (tree / "tests" / "gpu").mkdir(parents=True)
    (tree / ".stage").mkdir()
    (tree / ".stage" / "big.part").write_text("not copied")
    (tree / "tests" / "gpu" / "remote.sh").write_text(
        'echo "verb=$1 override=${DRAFTER_OVERRIDE:-} out=$OUT models=$MODELS_TRAINED" > "$WORK/stand-in.txt"\n'
        'mkdir -p "$MODELS_TRAINED/dflash-r5-trained" && echo new > "$MODELS_TRAINED/dflash-r5-trained/model.safetensors"\n'
        'echo "{}" > "$MODELS_TRAINED/dflash-r5-trained/drafter-train-record.json"; sleep 1; exit 0\n')
    return tree


def _wait(path: Path, seconds: float = 20) -> str:
    end = time.time() + seconds
    while not path.exists() and time.time() < end:
        time.sleep(0.1)
    return path.read_text().strip()


def test_the_drafter_trains_in_the_background_with_the_override_and_runs_wait_for_it(tmp_path):
    tree = _tree(tmp_path)
    target = tmp_path / "models" / "trained-a4b-r30"  # remote.sh's $TRAINED under $MODELS_TRAINED
    target.mkdir(parents=True)
    (target / "train-record.json").write_text("{}")
    (tmp_path / "models" / "dflash-r5-trained").mkdir()
    (tmp_path / "models" / "dflash-r5-trained" / "model.safetensors").write_text("old\n")
    done = _run(tmp_path, tree, {"DRAFTER_OVERRIDE": '{"steps": 2400}'})
    assert done.returncode == 0, done.stderr
    work = tmp_path / "work"
    assert (work / "drafter-bg.asked").exists()  # wait_drafter now blocks the trained-drafter runs
    assert _wait(work / "drafter-bg.rc") == "0"
    said = (work / "stand-in.txt").read_text()
    assert said.startswith("verb=train-drafter ") and 'override={"steps": 2400}' in said
    assert f"out={work}/train-bg-out" in said  # where wait_drafter collects the record from
    # It trains beside the staged drafter, not over it: servers started meanwhile load that one whole.
    assert f"models={work}/drafter-next" in said
    assert (work / "drafter-next" / "trained-a4b-r30").resolve() == (tmp_path / "models" / "trained-a4b-r30")
    assert (tmp_path / "models" / "dflash-r5-trained" / "model.safetensors").read_text() == "old\n"
    # wait_drafter, as realshape's trained-drafter runs and pack-drafter call it, swaps it in.
    swapped = _run(tmp_path, tree, {}, call="wait_drafter")
    assert swapped.returncode == 0, swapped.stderr
    assert (tmp_path / "models" / "dflash-r5-trained" / "model.safetensors").read_text() == "new\n"
    assert not (work / "drafter-next" / "dflash-r5-trained").exists()
    assert not (work / "drafter-bg-tree" / ".stage").exists()  # the snapshot leaves the parts out
    # A second call while it runs starts nothing new.
    (work / "drafter-bg.rc").unlink()
    (work / "drafter-bg.asked").touch()
    again = _run(tmp_path, tree, {})
    assert "already running" in again.stdout


def test_without_a_target_it_refuses_and_starts_nothing(tmp_path):
    tree = _tree(tmp_path)
    done = _run(tmp_path, tree, {})
    assert done.returncode != 0 and "stage extras-trained" in done.stderr
    assert not (tmp_path / "work" / "drafter-bg.asked").exists()
