"""recipe < process environment < --set, and stale variables."""

from __future__ import annotations

import pytest

from launcher.errors import LauncherError
from launcher.checks import resolve
from launcher.plan import Request
from tests.unit.conftest import RTX5090, make_ctx


def test_environment_beats_recipe(models):
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0"),
                   make_ctx(RTX5090, environ={"VLLM_NVFP4_GEMM_BACKEND": "cutlass", "PATH": "/bin"}))
    assert plan.env["VLLM_NVFP4_GEMM_BACKEND"] == "cutlass"
    assert plan.env_sources["VLLM_NVFP4_GEMM_BACKEND"] == "environment"
    assert "PATH" not in plan.env  # only what vLLM reads is carried


def test_set_beats_environment(models):
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0", sets=["VLLM_NVFP4_GEMM_BACKEND=marlin"]),
                   make_ctx(RTX5090, environ={"VLLM_NVFP4_GEMM_BACKEND": "cutlass"}))
    assert plan.env["VLLM_NVFP4_GEMM_BACKEND"] == "marlin"
    assert plan.env_sources["VLLM_NVFP4_GEMM_BACKEND"] == "--set"


def test_set_recipe_field_beats_profile_override(models):
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0", sets=["serve.max_num_seqs=8"]),
                   make_ctx(RTX5090))
    assert plan.argv[plan.argv.index("--max-num-seqs") + 1] == "8"


def test_set_intent_field_renders_per_version(models):
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.33.0", sets=["intent.moe_fp4_backend=marlin"]),
                   make_ctx(RTX5090))
    assert plan.argv[plan.argv.index("--moe-backend") + 1] == "marlin"


def test_stale_inherited_variable_dropped_with_replacement_named(models):
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.33.0"),
                   make_ctx(RTX5090, environ={"VLLM_USE_FLASHINFER_MOE_FP4": "1", "VLLM_TEST_FORCE_FP8_MARLIN": "1"}))
    assert "VLLM_USE_FLASHINFER_MOE_FP4" not in plan.env
    assert set(plan.env_unset) == {"VLLM_USE_FLASHINFER_MOE_FP4", "VLLM_TEST_FORCE_FP8_MARLIN"}
    assert any("VLLM_USE_FLASHINFER_MOE_FP4" in w and "--moe-backend" in w for w in plan.warnings)


def test_force_fp8_marlin_still_read_by_0_28(models):
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.28.0"),
                   make_ctx(RTX5090, environ={"VLLM_TEST_FORCE_FP8_MARLIN": "1"}))
    assert plan.env["VLLM_TEST_FORCE_FP8_MARLIN"] == "1"
    assert "VLLM_USE_FLASHINFER_MOE_FP4" not in plan.env


def test_set_of_a_stale_variable_is_refused(models):
    with pytest.raises(LauncherError, match="no longer reads VLLM_NVFP4_GEMM_BACKEND"):
        resolve(Request("gemma4-moe-dflash", vllm_version="0.33.0", sets=["VLLM_NVFP4_GEMM_BACKEND=cutlass"]),
                make_ctx(RTX5090))


def test_extra_args_after_double_dash_come_last(models):
    # A flag the plan does not set (one it sets is refused or replaced: tests/unit/test_passthrough.py).
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0", extra_args=["--seed", "4"]),
                   make_ctx(RTX5090))
    assert plan.argv[-2:] == ["--seed", "4"]


@pytest.mark.parametrize("bad, message", [
    ("serve.max_num_seqs=zero", "field serve.max_num_seqs"),
    ("serve.no_such=1", "no recipe field"),
    ("novalue", "expected KEY=VALUE"),
    ("intent.moe_fp4_backend=warp", "field intent.moe_fp4_backend"),
])
def test_bad_set_values(models, bad, message):
    with pytest.raises(LauncherError, match=message):
        resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0", sets=[bad]), make_ctx(RTX5090))
