"""triton-unified-attention-fully-masked-tile: the released Triton unified attention
kernel, run by Triton's interpreter (TRITON_INTERPRET=1, numpy on the CPU; no GPU here),
gives NaN for sliding-window rows whose first KV tile lies wholly before their window
when every in-window score is strongly negative; with the patch those rows match a
float64 softmax reference.

The kernel, its helpers and the launcher are the tree's own files
(triton_attention_probe.py; only vLLM's platform/env/logger imports are stand-ins).
Triton is not in the test venv (about 1 GB installed, only needed here); it is
installed once, pinned, into the project's cache, under a file lock and renamed into
place whole, so parallel or interrupted runs never see half an install.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.paths import cache_dir

PATCH_ID = "triton-unified-attention-fully-masked-tile"
VERSIONS = ["0.21.0", "0.26.0", "0.27.1", "0.29.0", "0.30.0", "0.31.0"]
TRITON = "3.9.0"
PROBE = Path(__file__).resolve().parent / "triton_attention_probe.py"

pytestmark = pytest.mark.network  # the released wheels and triton come from PyPI


def _triton_dir() -> Path:
    root = cache_dir() / "test-tools"
    target = root / f"triton-{TRITON}"
    if (target / "triton").is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"triton-{TRITON}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "triton").is_dir():
            tmp = root / f".triton-{TRITON}.{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            subprocess.run(
                [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(tmp),
                 f"triton=={TRITON}"],
                check=True, timeout=1200,
            )
            os.replace(tmp, target)
    return target


@pytest.fixture(scope="module")
def run_probe():
    triton_dir = _triton_dir()

    def run(tree: Path) -> dict:
        env = {**os.environ, "TRITON_INTERPRET": "1",
               "PYTHONPATH": os.pathsep.join([str(triton_dir), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run([sys.executable, str(PROBE), str(tree)], env=env, capture_output=True,
                              text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-4000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    return run


@pytest.mark.parametrize("version", VERSIONS)
def test_rows_after_a_fully_masked_tile_match_the_reference(version, vllm_tree, run_probe):
    got = run_probe(vllm_tree(version, PATCH_ID))
    assert got["max_in_window_score"] < -104  # the case really underflows exp() in fp32
    assert got["nan_rows"] == []
    assert got["finite_rows"] == 48
    assert got["max_abs_err_finite_rows"] < 1e-3


@pytest.mark.parametrize("version", VERSIONS)
def test_the_released_kernel_gives_nan_on_the_case(version, stock_tree, run_probe):
    """The baseline the patched run is compared with: the released kernel fails on
    exactly the rows whose first tile (keys 0-31) is outside their window (39-47)."""
    got = run_probe(stock_tree(version))
    assert got["nan_rows"] == list(range(39, 48))
    assert got["max_abs_err_finite_rows"] < 1e-3  # the other rows are right either way
