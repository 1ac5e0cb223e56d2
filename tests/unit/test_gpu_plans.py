"""tests/gpu/plans/*.sh: the lane plans a GPU host sources before `remote.sh lanes-bg`. Each is
checked here as lanes-bg checks it on the device (remote.sh's own lanes_check and
lane_gpus_disjoint, realshape.py's own lane check), so a misspelt run or a speed run sharing a
GPU is found before a machine spends its time on it. Nothing runs a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLANS = sorted((ROOT / "tests" / "gpu" / "plans").glob("*.sh"))


def _sourced(plan: Path, tmp_path: Path, call: str) -> subprocess.CompletedProcess:
    functions = (ROOT / "tests" / "gpu" / "remote.sh").read_text().split("\ncmd=${1:-}\n")[0]
    script = tmp_path / "f.sh"
    script.write_text(f"{functions}\n. {plan}\n{call}\n")
    env = dict(os.environ, WORK=str(tmp_path / "work"), PY=sys.executable, STAGE=str(ROOT / ".stage-none"),
               MODELS_TRAINED=str(tmp_path / "models"))
    return subprocess.run(["bash", str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_there_is_a_plan():
    assert PLANS, "tests/gpu/plans holds no plan"


def _nvfp4_copy(tmp_path: Path) -> None:
    """The trained target's NVFP4 copy as extras-trained or extras-quant leaves it on the GPU
    host (a stand-in folder: the check reads only its quantization config's presence)."""
    copy = tmp_path / "models" / "trained-a4b-r30-nvfp4"
    copy.mkdir(parents=True)
    (copy / "hf_quant_config.json").write_text("{}")


@pytest.mark.parametrize("plan", PLANS, ids=[p.name for p in PLANS])
def test_a_plan_passes_the_checks_lanes_bg_makes(plan, tmp_path):
    (tmp_path / "work").mkdir()
    _nvfp4_copy(tmp_path)
    done = _sourced(plan, tmp_path, "lane_gpus_disjoint && lanes_check && echo checked")
    assert done.returncode == 0 and done.stdout.strip().endswith("checked"), done.stdout + done.stderr


@pytest.mark.parametrize("plan", [p for p in PLANS if "nvfp4" in p.read_text()], ids=lambda p: p.name)
def test_a_plan_with_nvfp4_runs_is_refused_on_a_host_without_the_copy_or_its_quantizer(plan, tmp_path):
    (tmp_path / "work").mkdir()
    done = _sourced(plan, tmp_path, "lanes_check && echo checked")
    assert done.returncode == 1 and "checked" not in done.stdout
    assert "no NVFP4 copy of the trained target and no quantizer: stage extras-quant" in done.stderr


@pytest.mark.parametrize("plan", PLANS, ids=[p.name for p in PLANS])
def test_a_plan_is_short_enough_to_source_and_names_each_run_once(plan, tmp_path):
    (tmp_path / "work").mkdir()
    done = _sourced(plan, tmp_path, 'echo "$RS_PARALLEL_21;$RS_PARALLEL_33"')
    names = [n for lane in done.stdout.strip().split(";") for n in lane.split(",") if n]
    assert names and len(names) == len(set(names)), names
    assert all(n == n.strip() and " " not in n for n in names)
