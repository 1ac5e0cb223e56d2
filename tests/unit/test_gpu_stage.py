"""What the device bundles (tests/gpu/stage.py) carry, per vLLM release, without downloading."""

from __future__ import annotations

import pytest

from tests.unit.gpu_scripts import load as _load

stage = _load("stage")


def test_fa4_and_the_rust_front_end_never_travel_and_fa2_only_when_asked():
    assert stage.wheel_member_dropped("vllm/vllm_flash_attn/cute/flash_fwd.py")
    assert stage.wheel_member_dropped("vllm/vllm-rs")
    assert stage.wheel_member_dropped("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so")
    assert not stage.wheel_member_dropped("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", keep_fa2=True)
    assert not stage.wheel_member_dropped("vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so")
    # CuTe headers that DeepGEMM compiles against are not FA4
    assert not stage.wheel_member_dropped("vllm/third_party/deep_gemm/include/cute/arch/mma_sm90_gmma.hpp")


def test_each_release_has_its_own_stem_and_pins():
    assert stage.bundle_stem("0.21.0") == "bundle"
    assert stage.bundle_stem("0.33.0") == "bundle-0.33.0"
    assert stage.requirements_for("0.21.0").name == "bundle-requirements.txt"
    assert stage.requirements_for("0.33.0").name == "bundle-requirements-0.33.0.txt"
    with pytest.raises(SystemExit, match="bundle-requirements-9.9.9.txt"):
        stage.requirements_for("9.9.9")


def test_the_033_pins_leave_torch_and_the_image_packages_alone():
    names = {line.split("==")[0].lower() for line in stage._requirements(stage.requirements_for("0.33.0"))}
    assert not names & {"torch", "triton", "transformers", "numpy", "nvidia-nccl-cu13", "nvidia-cudnn-cu13"}
    assert "unidiff" in names  # the patch engine applies the series on the device
