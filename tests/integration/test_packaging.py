"""A non-editable install (what the images do) carries recipes/ and patches/."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_wheel_ships_recipes_patches_and_targets(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(REPO)],
                   check=True, timeout=600)
    wheel = next(tmp_path.glob("vllm_sm12x_launcher-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for recipe in REPO.glob("recipes/*.yaml"):
        assert f"launcher/_data/recipes/{recipe.name}" in names
    assert "launcher/_data/recipes/shared/models.yaml" in names  # the model entries recipes share
    series = [p.relative_to(REPO).as_posix() for p in REPO.glob("patches/vllm/*/series")]
    for s in series:
        assert f"launcher/_data/{s}" in names
    assert "launcher/_data/build/targets.yaml" in names
    assert "launcher/bench/prompts.jsonl" in names  # `launcher bench`'s bundled prompt set
    assert "launcher/bench/breakeven.json" in names  # the break-even table `bench` compares with
    assert "launcher/_data/build/proof.yaml" in names

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, timeout=300)
    probe = ("from launcher import paths, recipe; "
             "print(paths.recipes_dir()); print(sorted(recipe.available())); "
             "print(recipe.load('gemma4-moe-dflash-text').target.hub.repo)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(target)}).stdout.splitlines()
    assert out[0].startswith(str(target))
    assert "gemma4-moe-dflash" in out[1]
    assert out[2] == "nvidia/Gemma-4-26B-A4B-NVFP4"
