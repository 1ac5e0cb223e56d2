"""The GPU proof as a pytest test: runs the harness where a GPU and vLLM 0.21.0 are present.

The full record (stock and patched rounds, committed results) comes from
``tests/gpu/remote.sh proof``; this test runs one round against the vLLM
that this interpreter imports (or the site-packages folder named by
``VLLM_SITE``) and checks what that vLLM must show:

* patched (the series stamp ``vllm/.sm12x-patches.json`` is present): every
  mode serves, the drafter runs on FLASH_ATTN, every DFlash run is lossless;
* stock 0.21.0: the baseline serves and the DFlash modes fail with the
  errors users reported (FACTS.md, "Seen on a Hopper GPU").

Without an NVIDIA GPU or without vLLM it skips, saying which is missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _gpu_reason() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU (nvidia-smi not found)"
    probe = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    if probe.returncode != 0 or "GPU" not in probe.stdout:
        return "no NVIDIA GPU visible to nvidia-smi"
    return None


def _vllm_site() -> tuple[str | None, Path | None, str | None]:
    """(PYTHONPATH for the children, the vllm package folder, reason to skip)."""
    site = os.environ.get("VLLM_SITE")
    if site:
        pkg = Path(site.split(os.pathsep)[0]) / "vllm"
        if not pkg.is_dir():
            return None, None, f"VLLM_SITE={site} holds no vllm package"
        return site, pkg, None
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None, None, "vLLM is not installed (set VLLM_SITE to a site-packages folder holding it)"
    return None, Path(list(spec.submodule_search_locations)[0]), None


@pytest.mark.gpu
def test_dflash_on_gemma4_shaped_target(tmp_path):
    reason = _gpu_reason()
    site, pkg, why = _vllm_site()
    if reason or why:
        pytest.skip(reason or why)
    sys.path.insert(0, str(HERE))  # tests/gpu: gpu_paths puts the harness's folders on the path
    import gpu_paths  # noqa: F401
    import compare
    import make_checkpoints
    import run_modes

    models = tmp_path / "models"
    subprocess.run([sys.executable, str(HERE / "models" / "make_checkpoints.py"), str(models)], check=True,
                   env={**os.environ, **({"PYTHONPATH": site} if site else {})})
    patched = (pkg / ".sm12x-patches.json").exists()
    label = "patched" if patched else "stock"
    rnd = run_modes.run_round(models, site, label, tmp_path / "logs")
    rows = compare.summarize([rnd])
    print(compare.markdown(rows, {"vllm": "installed", "series": "stamped" if patched else None}))

    baselines = [r for r in rows if r["mode"] == "baseline"]
    assert len(baselines) == len(make_checkpoints.DRAFTERS)
    assert all(r["ok"] for r in baselines), [r["error"] for r in baselines]
    dflash = [r for r in rows if r["mode"] != "baseline"]
    if patched:
        assert all(r["ok"] for r in dflash), [r["error"] for r in dflash]
        assert all(r["drafter_backends"] == ["FLASH_ATTN"] for r in dflash), dflash
        assert all(r["verdict"]["lossless"] for r in dflash), json.dumps(
            [r["verdict"] for r in dflash], indent=1)
    else:
        by_mode = {r["mode"]: r for r in dflash}
        assert "partial multimodal token full attention not supported" in (
            by_mode["dflash-flash_attn"]["error"] or "")
        assert "All drafting layers should belong to the same kv cache group" in (
            by_mode["dflash-auto"]["error"] or "")
