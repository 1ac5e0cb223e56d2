"""doctor runs for real on this GPU-less machine: no NVML, and it says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

LAUNCHER = Path(sys.executable).with_name("launcher")


def test_doctor_json_without_gpu():
    res = subprocess.run([str(LAUNCHER), "doctor", "--json"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stderr  # no recipe fits a machine without a GPU
    report = json.loads(res.stdout)
    assert report["gpu"]["devices"] == []
    assert "NVML" in report["gpu"]["error"] or "nvidia-ml-py" in report["gpu"]["error"]
    assert report["os"]["system"] == "Linux"
    assert report["recipes"]["gemma4-moe-dflash"]["fits"] is False
    assert any("no NVIDIA GPU" in r for r in report["recipes"]["gemma4-moe-dflash"]["reasons"])
    assert "vllm" in report["packages"]


def test_doctor_text_without_gpu():
    res = subprocess.run([str(LAUNCHER), "doctor", "--recipe", "gemma4-e4b"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stderr  # the recipe asked about does not fit
    assert "gpu       none:" in res.stdout
    assert "gemma4-e4b: does not fit" in res.stdout


def test_an_unusable_vllm_python_is_one_verdict_not_contradicted_by_the_recipes(tmp_path):
    """The recipes were judged against the launcher's own Python and told the user to point
    --vllm-python at a Python with vLLM, below the error about the one given; a folder was
    reported as "no such file"."""
    for given, why in ((tmp_path / "none", "no such file"), (tmp_path, "is a folder, not a Python executable")):
        res = subprocess.run([str(LAUNCHER), "doctor", "--json", "--vllm-python", str(given)],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 1, res.stderr
        report = json.loads(res.stdout)
        assert why in report["vllm_env"]["error"]
        for verdict in report["recipes"].values():
            assert verdict["fits"] is False
            assert verdict["reasons"] == ["[BLOCK] not judged: the --vllm-python given is unusable (vllm env, above)"]
