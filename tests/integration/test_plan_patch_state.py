"""The plan reads the patch state of the vLLM that will run.

A released vLLM 0.21.0 or 0.29.0 (its Python files and dist-info from PyPI) placed on
PYTHONPATH is what `launcher serve` sees as the installed vLLM: found through
metadata, never imported. Stock, every required patch is NOT applied and the
plan blocks; after `launcher patch apply`, they are applied.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import recipe as recipes
from launcher.patching import series as series_mod
from tests.integration.patch_trees import mini_tree

LAUNCHER = Path(sys.executable).with_name("launcher")


@pytest.mark.parametrize("name", sorted(recipes.available()))
def test_recipe_patch_ids_exist_in_each_series(name):
    rec = recipes.load(name)
    for version in rec.vllm_versions:
        ids = {p.id for p in series_mod.series_for(version).patches}
        missing = set(rec.patches_for(version)) - ids
        assert not missing, f"{name} needs {missing} absent from the {version} series"


def _plan(site: Path, tmp_path: Path) -> dict:
    # The released vLLM first; then this checkout's launcher (what an editable install resolves to).
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(repo)]), "MODELS_DIR": str(tmp_path / "models")}
    res = subprocess.run([str(LAUNCHER), "serve", "--recipe", "gemma4-moe-dflash", "--dry-run", "--json"],
                         capture_output=True, text=True, env=env, timeout=120)
    return json.loads(res.stdout)


@pytest.mark.parametrize("version", ["0.21.0", "0.29.0"])  # the Windows fork's base; NGC 26.09's vLLM
def test_plan_sees_stock_then_patched_installed_vllm(version, tmp_path):
    site = mini_tree(version, "site-packages", tmp_path / "site", _touched_files(version))
    stock = _plan(site, tmp_path)
    assert stock["vllm_version"] == version and stock["vllm_version_source"] == "installed"
    required = recipes.load("gemma4-moe-dflash").patches_for(version)
    assert [p["id"] for p in stock["patches"]] == required
    assert all(p["applied"] is False for p in stock["patches"])
    assert any(r["area"] == "patches" and r["blocking"] for r in stock["reasons"])

    subprocess.run([str(LAUNCHER), "patch", "apply", "--target", str(site)], check=True, capture_output=True, timeout=120)
    patched = _plan(site, tmp_path)
    assert all(p["applied"] is True for p in patched["patches"])
    assert not any(r["area"] == "patches" for r in patched["reasons"])


def _touched_files(version: str) -> list[str]:
    """Files the runtime series touches, read off the diff headers."""
    out: set[str] = set()
    for patch in series_mod.series_for(version).patches:
        for line in Path(patch.path).read_text().splitlines():
            if line.startswith("+++ b/"):
                out.add(line[len("+++ b/"):].strip())
    return sorted(out)


def test_plan_inspects_the_vllm_of_another_python(tmp_path):
    """`--vllm-python`: a venv holding the released 0.21.0 files, the launcher's own Python without vLLM."""
    from tests.unit.fake_vllm_env import make_env

    python = make_env(tmp_path / "venv", with_vllm=False)
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  check=True, capture_output=True, text=True).stdout.strip())
    mini_tree("0.21.0", "site-packages", purelib, _touched_files("0.21.0"))
    env = {**os.environ, "MODELS_DIR": str(tmp_path / "models")}

    def plan() -> dict:
        res = subprocess.run([str(LAUNCHER), "serve", "--recipe", "gemma4-moe-dflash", "--dry-run", "--json",
                              "--vllm-python", str(python)], capture_output=True, text=True, env=env, timeout=120)
        return json.loads(res.stdout)

    stock = plan()
    assert stock["vllm_version"] == "0.21.0" and stock["vllm_version_source"] == "installed"
    assert stock["vllm_python"] == str(python)
    assert all(p["applied"] is False for p in stock["patches"])
    subprocess.run([str(LAUNCHER), "patch", "apply", "--target", str(purelib)], check=True, capture_output=True,
                   timeout=120)
    assert all(p["applied"] is True for p in plan()["patches"])
