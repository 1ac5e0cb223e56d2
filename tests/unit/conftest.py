"""Fixtures for plan tests. A GPU cannot exist on CI: hardware is described
with HostInfo values (the NVML probe itself is tested for real in
test_doctor.py, where it must report the missing driver cleanly)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The GPU harness's modules (tests/gpu/<group>/) import one another by name: every group on the path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import gpu_paths  # noqa: E402,F401

from launcher.hardware import GpuInfo, HostInfo
from launcher.plan import Context

RTX5090 = GpuInfo(0, "NVIDIA GeForce RTX 5090", (12, 0), 31.4)
GB10 = GpuInfo(0, "NVIDIA GB10", (12, 1), 119.7, unified_memory=True)
H100 = GpuInfo(0, "NVIDIA H100 80GB HBM3", (9, 0), 79.6)


def make_ctx(gpu=None, *, environ=None, vllm=None, transformers=None, wsl=False) -> Context:
    host = HostInfo(system="Linux", machine="x86_64", wsl=wsl, driver="580.65" if gpu else None,
                    gpus=[gpu] if gpu else [], nvml_error=None if gpu else "NVML could not start: no driver")
    return Context(host=host, environ=dict(environ or {}), installed_vllm=vllm, installed_transformers=transformers)


@pytest.fixture
def models(tmp_path, monkeypatch):
    """An empty models dir: the default model location is $MODELS_DIR/<name>."""
    monkeypatch.setenv("MODELS_DIR", str(tmp_path / "models"))
    return tmp_path / "models"
