"""Benchmark (printed, never asserted): wall time of `launcher serve --dry-run`.
Target: well under a second. Run with `make bench` to see the numbers."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

LAUNCHER = Path(sys.executable).with_name("launcher")


def test_bench_serve_dry_run(tmp_path):
    env = {**os.environ, "MODELS_DIR": str(tmp_path)}
    times = []
    for _ in range(5):
        start = time.perf_counter()
        res = subprocess.run([str(LAUNCHER), "serve", "--recipe", "gemma4-moe-dflash", "--dry-run"],
                             capture_output=True, text=True, env=env)
        times.append(time.perf_counter() - start)
        assert "verdict" in res.stdout
    print(f"\nBENCH launcher serve --dry-run: median {statistics.median(times) * 1000:.0f} ms, "
          f"min {min(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms over {len(times)} runs")
