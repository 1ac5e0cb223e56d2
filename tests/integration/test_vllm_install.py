"""`launcher install` for real: a venv made, pip run, the series applied, the status read back.

pip, venv and the patch engine are real; the wheels are the released
vLLM's Python files without its dependencies (tests/integration/vllm_wheels.py),
served from a folder (the Windows and air-gapped route) or from a local index
standing in for PyPI (PIP_INDEX_URL), so no test reaches the internet.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.vllm_wheels import simple_index, stand_in_wheel

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = Path(sys.executable).with_name("launcher")


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wheels")
    return {v: stand_in_wheel(v, folder) for v in ("0.21.0", "0.33.0")}


def launcher(*args: str, env: dict | None = None, tmp: Path) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VLLM_"))}
    full.update(PYTHONPATH=str(ROOT), MODELS_DIR=str(tmp / "models"), PIP_DISABLE_PIP_VERSION_CHECK="1",
                PIP_NO_INPUT="1", **(env or {}))
    return subprocess.run([str(LAUNCHER), *args], capture_output=True, text=True, env=full, timeout=600)


def patches_of_plan(python: Path, tmp: Path) -> dict:
    res = launcher("serve", "--recipe", "gemma4-moe-dflash", "--dry-run", "--json", "--vllm-python", str(python),
                   tmp=tmp)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_from_a_wheel_folder_offline_into_a_new_venv(wheels, tmp_path):
    venv = tmp_path / "vllm venv"  # a space, as in a Windows user folder
    folder = wheels["0.33.0"].parent
    res = launcher("install", "--venv", str(venv), "--wheel", str(folder), "--offline", tmp=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "vLLM          0.33.0  [the newest the recipe supports in --wheel]" in res.stdout
    assert "--no-index --find-links" in res.stdout
    assert "patch status: all" in res.stdout and "applied to vLLM 0.33.0" in res.stdout
    python = venv / "bin" / "python"
    assert f"launcher serve --recipe gemma4-moe-dflash --vllm-python '{python}'" in res.stdout
    plan = patches_of_plan(python, tmp_path)
    assert plan["vllm_version"] == "0.33.0" and plan["vllm_python"] == str(python)
    assert plan["patches"] and all(p["applied"] is True for p in plan["patches"])
    assert not [r for r in plan["reasons"] if r["area"] in ("patches", "vllm")], plan["reasons"]

    again = launcher("install", "--venv", str(venv), "--wheel", str(folder), "--offline", tmp=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already installed" in again.stdout and "pip not run" in again.stdout
    assert "patch status: all" in again.stdout


def test_from_the_index_then_another_release_over_it(wheels, tmp_path):
    """The PyPI route (a local index stands in for it); then 0.33.0 over a patched 0.21.0."""
    index = simple_index(tmp_path / "simple", list(wheels.values()))
    env = {"PIP_INDEX_URL": index}
    venv = tmp_path / "venv"
    first = launcher("install", "--venv", str(venv), "--version", "0.21.0", env=env, tmp=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"{venv / 'bin' / 'python'} -m pip install vllm==0.21.0" in first.stdout
    assert "applied to vLLM 0.21.0" in first.stdout

    second = launcher("install", "--venv", str(venv), env=env, tmp=tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "reverting the patches of the vLLM there before pip replaces it" in second.stdout
    assert "applied to vLLM 0.33.0" in second.stdout
    status = launcher("patch", "status", "--json", "--vllm-python", str(venv / "bin" / "python"), tmp=tmp_path)
    data = json.loads(status.stdout)
    assert data["version"] == "0.33.0" and {p["state"] for p in data["patches"]} == {"applied"}


@pytest.mark.parametrize("args, message", [
    # 0.28.0 has no series. The venv is the test's own, so a refusal that broke would
    # install into it, never into the launcher's venv.
    (["--version", "0.28.0", "--venv", "V"], "supports vLLM 0.33.0, "),
    (["--offline"], "--offline installs from a folder of wheels"),
    (["--venv", "V", "--vllm-python", sys.executable], "give --venv or --vllm-python, not both"),
    (["--wheel", "no-such.whl"], "no such file or folder"),
])
def test_bad_input_changes_nothing(args, message, tmp_path):
    args = [str(tmp_path / a) if a in ("V", "no-such.whl") else a for a in args]
    res = launcher("install", *args, tmp=tmp_path)
    assert res.returncode == 2 and message in res.stderr, res.stdout + res.stderr
    assert not (tmp_path / "V").exists()


def test_a_wheel_of_a_release_the_recipe_does_not_support_is_refused(tmp_path):
    odd = tmp_path / "vllm-0.28.0-py3-none-any.whl"  # a release with no series
    odd.write_bytes(b"")
    res = launcher("install", "--wheel", str(odd), "--venv", str(tmp_path / "v"), tmp=tmp_path)
    assert res.returncode == 2 and "not 0.28.0" in res.stderr
    assert not (tmp_path / "v").exists()
