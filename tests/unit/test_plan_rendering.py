"""The full plan of the user recipe, per vLLM version, against hand-written
expectations (FACTS.md: the user setup of vLLM issue #43858)."""

from __future__ import annotations

import json

import pytest

from launcher.checks import resolve
from launcher.plan import Request
from tests.unit.conftest import RTX5090, make_ctx

# The user's env, less TORCH_MATMUL_PRECISION (read by neither release) and
# VLLM_USE_FLASHINFER_MOE_FP4=0 (it only struck FlashInfer off the list;
# `--moe-backend cutlass`, which 0.21.0 has, names the backend).
USER_ENV_0_21 = {
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "VLLM_TEST_FORCE_FP8_MARLIN": "0",
    "VLLM_NVFP4_GEMM_BACKEND": "flashinfer-cutlass",
    "VLLM_USE_FLASHINFER_SAMPLER": "1",
}


def _common_args(models, max_model_len="49152"):
    return [
        "vllm", "serve", str(models / "gemma-4-26B-A4B-it-NVFP4"),
        "--served-model-name", "gemma4", "gemma4-fast", "gemma4-deep",
        "--host", "127.0.0.1", "--port", "8000",
        "--max-model-len", max_model_len,
        "--max-num-seqs", "16",
        "--max-num-batched-tokens", "8192",
        "--gpu-memory-utilization", "0.85",
        "--enable-chunked-prefill", "--enable-prefix-caching", "--trust-remote-code",
        "--enable-auto-tool-choice", "--tool-call-parser", "gemma4",
    ]


def _spec(models):
    return ["--speculative-config", json.dumps(
        {"method": "dflash", "model": str(models / "gemma-4-26B-A4B-it-DFlash"),
         "num_speculative_tokens": 15, "attention_backend": "flash_attn"}, separators=(",", ":"))]


# The NVIDIA NVFP4 checkpoint asks for an FP8 KV cache, which FA2 (the drafter's
# FLASH_ATTN on sm_12x) cannot hold: the recipe keeps bf16 caches.
BF16_KV = ["--kv-cache-dtype", "bfloat16"]


def test_user_setup_on_0_21_0(models):
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0"), make_ctx(RTX5090))
    assert plan.env == USER_ENV_0_21
    assert plan.argv == _common_args(models) + ["--moe-backend", "cutlass"] + _spec(models) + BF16_KV
    assert plan.profile == "rtx5090" and plan.profile_source.startswith("detected")
    assert plan.env_unset == []


def test_user_setup_on_0_33_0_uses_flags_not_removed_vars(models):
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.33.0"), make_ctx(RTX5090))
    assert plan.env == {
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "VLLM_USE_FLASHINFER_SAMPLER": "1",
    }
    # 0.33.0 holds fewer KV tokens in the 5090's memory, fewer still at K 15: the profile's
    # serve_since context, the one the K 15 server started with at full size
    assert plan.argv == _common_args(models, "16384") + [
        "--moe-backend", "cutlass", "--linear-backend", "flashinfer_cutlass"] + _spec(models) + BF16_KV


def test_spark_profile_detected_from_sm_121(models):
    from tests.unit.conftest import GB10

    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0"), make_ctx(GB10))
    assert plan.profile == "dgx-spark"
    args = plan.argv
    assert args[args.index("--max-model-len") + 1] == "262144"
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.7"
    assert args[args.index("--max-num-seqs") + 1] == "48"
    # 48 x (1 + 15) tokens per decode step, all inside the captured CUDA graphs.
    assert args[args.index("--max-cudagraph-capture-size") + 1] == "768"
    assert not any("CUDA graphs" in w for w in plan.warnings)


def test_no_gpu_uses_default_profile_and_says_so(models):
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0"), make_ctx(None))
    assert plan.profile == "rtx5090"
    assert plan.profile_source == "default (no GPU detected)"
    assert any(r.area == "hardware" and r.blocking and "no NVIDIA GPU" in r.message for r in plan.reasons)


def test_wsl_override_only_where_read(models):
    on_033 = resolve(Request("gemma4-moe-dflash", vllm_version="0.33.0"), make_ctx(RTX5090, wsl=True))
    assert on_033.env["VLLM_WSL2_ENABLE_PIN_MEMORY"] == "1"
    assert on_033.env_sources["VLLM_WSL2_ENABLE_PIN_MEMORY"] == "recipe wsl"
    on_021 = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0"), make_ctx(RTX5090, wsl=True))
    assert "VLLM_WSL2_ENABLE_PIN_MEMORY" not in on_021.env  # 0.21.0 does not read it
    not_wsl = resolve(Request("gemma4-moe-dflash", vllm_version="0.33.0"), make_ctx(RTX5090))
    assert "VLLM_WSL2_ENABLE_PIN_MEMORY" not in not_wsl.env


def test_recipe_without_drafter_has_no_speculative_config(models):
    plan = resolve(Request("gemma4-moe", vllm_version="0.21.0"), make_ctx(RTX5090))
    assert "--speculative-config" not in plan.argv
    assert plan.drafter is None


def test_model_and_drafter_overrides(tmp_path, models):
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0", model=str(tmp_path / "t"),
                           drafter=str(tmp_path / "d")), make_ctx(RTX5090))
    assert plan.argv[2] == str(tmp_path / "t")
    spec = json.loads(plan.argv[plan.argv.index("--speculative-config") + 1])
    assert spec["model"] == str(tmp_path / "d")


def test_docker_runtime_gets_an_image_tag_naming_version_arch_and_platform(models):
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.33.0", runtime="docker"), make_ctx(None))
    assert plan.image == "vllm-sm12x:0.33.0-sm120-amd64"


def test_plan_warns_on_0_21_when_the_drafter_has_sliding_layers(tmp_path, models):
    drafter = tmp_path / "d"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps({
        "architectures": ["DFlashDraftModel"], "num_hidden_layers": 5, "sliding_window": 2048,
        "layer_types": ["sliding_attention"] * 4 + ["full_attention"],
    }))

    def sliding_warnings(version):
        plan = resolve(Request("gemma4-moe-dflash", vllm_version=version, drafter=str(drafter)),
                       make_ctx(RTX5090))
        return [r for r in plan.reasons if "sliding-window layers" in r.message]

    (warning,) = sliding_warnings("0.21.0")
    assert not warning.blocking and "--vllm-version 0.33.0" in warning.hint
    assert sliding_warnings("0.33.0") == []


# The other bases (Windows 0.26.0, NGC 26.08 = 0.27.1, NGC 26.09 = 0.29.0): flags
# as on 0.33.0 (env knobs removed in 0.24.0); VLLM_TEST_FORCE_FP8_MARLIN is read
# until 0.29.0 (envs.py of each release, tests/integration/test_vllm_compat_real.py).
FLAG_ENV = {
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "VLLM_USE_FLASHINFER_SAMPLER": "1",
}


@pytest.mark.parametrize(("version", "fp8_marlin"), [("0.26.0", True), ("0.27.1", True), ("0.29.0", False),
                                                     ("0.30.0", False), ("0.31.0", False), ("0.32.0", False)])
def test_user_setup_on_the_ngc_and_windows_bases(models, version, fp8_marlin):
    plan = resolve(Request("gemma4-moe-dflash", vllm_version=version, runtime="docker"), make_ctx(RTX5090))
    assert plan.env == {**FLAG_ENV, **({"VLLM_TEST_FORCE_FP8_MARLIN": "0"} if fp8_marlin else {})}
    # serve_since starts at 0.33.0 (measured there): these releases keep the profile's context
    assert plan.argv == _common_args(models) + [
        "--moe-backend", "cutlass", "--linear-backend", "flashinfer_cutlass"] + _spec(models) + BF16_KV
    # Every one of these releases lacks the Triton fully-masked-tile fix (0.33.0 has it).
    assert [p.id for p in plan.patches] == ["dflash-drafter-own-mm-prefix-config",
                                            "gemma4-dflash-embed-scale-logit-softcap",
                                            "triton-unified-attention-fully-masked-tile"]
    assert not [r for r in plan.reasons if r.area in ("vllm", "patches") and r.blocking]  # a listed release


def test_stale_fp8_marlin_from_the_shell_is_dropped_on_0_29_0(models):
    ctx = make_ctx(RTX5090, environ={"VLLM_TEST_FORCE_FP8_MARLIN": "1"})
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.29.0", runtime="docker"), ctx)
    assert plan.env_unset == ["VLLM_TEST_FORCE_FP8_MARLIN"] and "VLLM_TEST_FORCE_FP8_MARLIN" not in plan.env
    assert any("no longer reads it" in w for w in plan.warnings)
    kept = resolve(Request("gemma4-moe-dflash", vllm_version="0.27.1", runtime="docker"), ctx)
    assert kept.env["VLLM_TEST_FORCE_FP8_MARLIN"] == "1" and kept.env_unset == []


def test_decode_batch_beyond_the_captured_cuda_graphs_is_named(models):
    from tests.unit.conftest import GB10

    unsized = ["profiles.dgx-spark.serve.max_cudagraph_capture_size=null"]
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0", sets=unsized), make_ctx(GB10))
    warning = next(w for w in plan.warnings if "CUDA graphs" in w)
    assert warning.startswith("decode steps of more than 32 requests run without CUDA graphs on vLLM 0.21.0")
    assert "48 sequences x 16 tokens = 768 tokens" in warning
    # 0.33.0 captures the uniform decode sizes itself.
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.33.0", sets=unsized), make_ctx(GB10))
    assert not any("CUDA graphs" in w for w in plan.warnings)


@pytest.mark.parametrize("version", ["0.26.0", "0.33.0"])
def test_spark_plan_names_the_fa2_assert_of_50707_and_the_5090_plan_does_not(models, version):
    from tests.unit.conftest import GB10

    fallback = "triton_attn"
    spark = resolve(Request("gemma4-moe-dflash", vllm_version=version), make_ctx(GB10))
    (warning,) = [w for w in spark.warnings if "#50707" in w]
    assert "FlashAttention 2 on sm_121" in warning and "--set drafter=null" in warning
    # The fallback keeps FA2 out of the drafter: TRITON_ATTN runs non-causal attention from 0.26.0.
    assert f"--set drafter.attention_backend={fallback}" in warning
    followed = resolve(Request("gemma4-moe-dflash", vllm_version=version,
                               sets=[f"drafter.attention_backend={fallback}"]), make_ctx(GB10))
    assert f'"attention_backend":"{fallback}"' in " ".join(followed.argv)
    assert not [w for w in followed.warnings if "#50707" in w]
    assert not [r for r in followed.reasons if "cannot start" in r.message]
    rtx = resolve(Request("gemma4-moe-dflash", vllm_version=version), make_ctx(RTX5090))
    assert not [w for w in rtx.warnings if "#50707" in w]


def test_spark_plan_on_0_21_0_names_no_fallback_that_cannot_start(models):
    from tests.unit.conftest import GB10

    spark = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0"), make_ctx(GB10))
    (warning,) = [w for w in spark.warnings if "#50707" in w]
    assert "flex_attention" not in warning and "0.26.0 or later" in warning
    # FLEX_ATTENTION beside the TRITON_ATTN target cannot start on 0.21.0: refused, with the way out.
    flex = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0",
                           sets=["drafter.attention_backend=flex_attention"]), make_ctx(GB10))
    (reason,) = [r for r in flex.reasons if "cannot start" in r.message]
    assert "flex_attention cannot start" in reason.message and "triton_attn" in reason.hint

