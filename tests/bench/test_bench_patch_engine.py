"""Benchmark (printed, never asserted): the patch engine on full released trees.

apply, status (what ``launcher doctor`` and the plan call) and revert of the
real series on a full copy of each release's wheel tree, in process. Run with
``make bench`` to see the numbers.
"""

from __future__ import annotations

import shutil
import time

import pytest

from launcher.patching import engine
from launcher.patching.series import available_versions
from launcher.patching.stamp import STAMP_REL
from tests.integration.patch_trees import pristine


@pytest.mark.parametrize("version", available_versions())
def test_bench_patch_engine_full_wheel_tree(version, tmp_path):
    root = tmp_path / "site-packages"
    shutil.copytree(pristine(version, "site-packages"), root, ignore=shutil.ignore_patterns(".complete"))
    timings = {}
    results = {}
    for name, call in (("apply", engine.apply), ("status", engine.status), ("apply again", engine.apply),
                       ("revert", engine.revert)):
        start = time.perf_counter()
        results[name] = call(root)
        timings[name] = (time.perf_counter() - start) * 1000
    assert results["status"].fully_applied and not results["apply again"].changed
    assert not (root / STAMP_REL).exists()
    print(f"\nBENCH patch engine vLLM {version} wheel tree: "
          + ", ".join(f"{k} {v:.0f} ms" for k, v in timings.items()))
