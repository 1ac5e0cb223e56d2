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
