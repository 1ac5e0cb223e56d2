"""`launcher build wheels --only`: the image builds FlashInfer and vLLM in separate stages."""

from __future__ import annotations

import pytest

from launcher.builder.plan import plan, select_steps
from launcher.errors import LauncherError


def _names(only):
    return [s.name for s in select_steps(plan("linux-amd64", "0.21.0").steps, only)]


def test_flashinfer_part_has_its_three_wheels_and_no_vllm_compile():
    names = _names("flashinfer")
    assert names[:2] == ["torch", "build requirements"]
    assert {"flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache"} <= set(names)
    assert "vllm" not in names


def test_vllm_part_compiles_vllm_only():
    assert _names("vllm") == ["torch", "build requirements", "vllm"]


def test_no_part_keeps_every_step():
    assert _names(None) == [s.name for s in plan("linux-amd64", "0.21.0").steps]


def test_unknown_part_refused():
    with pytest.raises(LauncherError, match="expected one of flashinfer, vllm"):
        _names("torch")
