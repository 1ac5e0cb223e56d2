"""tests/gpu/staging/sites.py on the released vLLM 0.21.0 tree (the engine's test series): what remote.sh
asks of the vLLM folders on the GPU host, answered by the launcher's patch engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.integration.patch_trees import TEST_PATCHES, copy_series, mini_tree
from tests.unit.gpu_scripts import load

sites = load("sites")
BACKEND = "vllm/v1/attention/backend.py"
SITES = Path(__file__).resolve().parents[1] / "gpu" / "staging" / "sites.py"


def test_a_tree_is_current_only_once_this_series_is_applied(tmp_path):
    site = mini_tree("0.21.0", "site-packages", tmp_path / "site", [BACKEND])
    root = str(TEST_PATCHES)
    assert sites.stamp(site, root) == "" and not sites.current(site, root)
    lines = sites.apply(site, root)
    hash_line = next(line for line in lines if line.startswith("series hash "))
    assert sites.stamp(site, root) == hash_line.split()[-1] != ""
    assert sites.current(site, root)
    assert any("applied" in line for line in lines[2:])
    # another series (one patch's text changed) makes the same tree stale
    other = tmp_path / "other"
    series = copy_series("0.21.0", other)
    first = sorted(series.glob("0001-*.patch"))[0]
    first.write_text(first.read_text().replace("Subject:", "Subject: (edited)", 1))
    assert not sites.current(site, str(other))
    assert not sites.current(tmp_path / "nothing-here", root) and sites.stamp(tmp_path / "nothing-here", root) == ""


def test_meta_names_the_vllm_and_torch_it_imports(tmp_path):
    """The real vllm package needs CUDA ops at import on a GPU host; a stand-in `vllm` with only a
    version (said here, since vLLM itself cannot be imported on this CPU) shows that the meta
    reads the one PYTHONPATH puts first."""
    fake = tmp_path / "site" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "0.21.0"\n')
    (tmp_path / "gpu.txt").write_text("NVIDIA H200, 143771 MiB, 580.95\n")
    out = tmp_path / "meta.json"
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    done = subprocess.run([sys.executable, str(SITES), "meta", str(out), "--gpu-file", str(tmp_path / "gpu.txt"),
                           "--command", "make gpu-realshape", "--series-hash", "abc", "--series-hash-mm", "",
                           "--post-norm-scale", ""], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    meta = json.loads(out.read_text())
    import torch

    assert list(meta) == ["date", "gpu", "vllm", "torch", "series_hash", "series_hash_mm", "post_norm_scale",
                          "command"]
    assert (meta["vllm"], meta["torch"], meta["gpu"]) == ("0.21.0", torch.__version__, "NVIDIA H200, 143771 MiB, 580.95")
    assert (meta["series_hash"], meta["series_hash_mm"], meta["post_norm_scale"]) == ("abc", None, None)
    done = subprocess.run([sys.executable, str(SITES), "meta", str(out), "--gpu-file", str(tmp_path / "gpu.txt"),
                           "--command", "c", "--series-label", ""], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and json.loads(out.read_text())["series"] is None
