"""intent.attention_per_kind and the B12X intents: how they render for each vLLM,
and which Gemma 4 layers the plan lets leave TRITON_ATTN.

The renderings are checked against the released code elsewhere: the text
recipe's map through 0.33.0's own selector (tests/integration/
test_series_0_33_0.py), the first releases with each knob in the constants
below (read off the released wheels).
"""

from __future__ import annotations

import pytest

from launcher import vllm_compat
from launcher.checks import resolve
from launcher.plan import Request
from tests.unit.conftest import H100, RTX5090, make_ctx

TEXT = "gemma4-moe-dflash-text"


def _args(plan) -> str:
    return " ".join(plan.argv)


def _blocks(plan, needle: str) -> list:
    return [r for r in plan.reasons if r.blocking and r.area == "recipe" and needle in r.message]


def test_text_recipe_renders_vllm_backend_per_kind_on_0_33_0(models):
    plan = resolve(Request(TEXT, vllm_version="0.33.0"), make_ctx(RTX5090))
    assert "--attention-config.backend_per_kind.sliding_window FLASH_ATTN" in _args(plan)
    assert "full_attention" not in _args(plan)  # the 512-dim layers keep the lock's TRITON_ATTN
    assert "gemma4-text-only-per-layer-attention-backend" not in [p.id for p in plan.patches]


def test_text_recipe_on_0_21_0_leaves_it_to_the_patch(models):
    plan = resolve(Request(TEXT, vllm_version="0.21.0"), make_ctx(RTX5090))
    assert "backend_per_kind" not in _args(plan)
    assert "gemma4-text-only-per-layer-attention-backend" in [p.id for p in plan.patches]


def test_no_knob_before_the_release_that_has_backend_per_kind():
    from launcher.recipe import Intent

    intent = Intent(attention_per_kind={"sliding_window": "flash_attn"})
    before = vllm_compat.render_intent(intent, vllm_compat.parse_version("0.27.1"))
    assert before.args == [] and "backend_per_kind" in before.notes[0]
    since = vllm_compat.render_intent(intent, vllm_compat.BACKEND_PER_KIND_SINCE)
    assert since.args == ["--attention-config.backend_per_kind.sliding_window", "FLASH_ATTN"]


@pytest.mark.parametrize("backend", ["flash_attn", "b12x"])
def test_full_attention_layers_must_stay_on_triton(models, backend):
    plan = resolve(Request(TEXT, vllm_version="0.33.0", sets=[f"intent.attention_per_kind.full_attention={backend}"]),
                   make_ctx(RTX5090))
    (reason,) = _blocks(plan, "full_attention layers have head size 512")
    assert "must stay on TRITON_ATTN" in reason.message


def test_multimodal_serving_keeps_every_layer_on_triton(models):
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.33.0",
                           sets=["intent.attention_per_kind={sliding_window: flash_attn}"]), make_ctx(RTX5090))
    (reason,) = _blocks(plan, "needs text-only serving")
    assert "--language-model-only" in reason.hint


def test_b12x_sliding_layers_render_with_their_extra_without_a_drafter(models):
    sets = ["intent.attention_per_kind.sliding_window=b12x"]
    alone = resolve(Request(TEXT, vllm_version="0.33.0", sets=[*sets, "drafter=null"]), make_ctx(RTX5090))
    assert "--attention-config.backend_per_kind.sliding_window B12X" in _args(alone)
    assert not _blocks(alone, "")
    assert any("vllm[b12x]==0.33.0" in w for w in alone.warnings)
    # The map reaches the DFlash drafter's sliding layers too, and B12X is causal-only.
    drafted = resolve(Request(TEXT, vllm_version="0.33.0", sets=sets), make_ctx(RTX5090))
    (reason,) = _blocks(drafted, "B12X has no non-causal attention")
    assert "--set drafter=null" in reason.hint


def test_b12x_attention_is_refused_before_it_exists_and_on_a_stand_in(models):
    old = resolve(Request(TEXT, vllm_version="0.21.0", sets=["intent.attention_per_kind.sliding_window=b12x"]),
                  make_ctx(RTX5090))
    assert _blocks(old, "vLLM 0.21.0 has no B12X attention backend")
    hopper = resolve(Request(TEXT, vllm_version="0.33.0", test_gpu=True,
                             sets=["intent.attention_per_kind.sliding_window=b12x"]), make_ctx(H100))
    assert _blocks(hopper, "B12X runs on sm_120 / sm_121 only")


@pytest.mark.parametrize(("backend", "too_old", "new_enough"),
                         [("b12x", "0.27.1", "0.29.0"), ("flashinfer_b12x", "0.21.0", "0.26.0")])
def test_b12x_moe_backends_need_the_release_that_has_them(models, backend, too_old, new_enough):
    sets = [f"intent.moe_fp4_backend={backend}"]
    old = resolve(Request("gemma4-moe-dflash", vllm_version=too_old, sets=sets), make_ctx(RTX5090))
    assert _blocks(old, f"--moe-backend has no {backend}")
    new = resolve(Request("gemma4-moe-dflash", vllm_version=new_enough, sets=sets), make_ctx(RTX5090))
    assert f"--moe-backend {backend}" in _args(new)
    assert not _blocks(new, "--moe-backend has no")
    assert any(f"intent.moe_fp4_backend={backend}" in w for w in new.warnings)


def test_a_whole_attention_config_after_the_dashes_is_refused_beside_the_map(models):
    plan = resolve(Request(TEXT, vllm_version="0.33.0", extra_args=["--attention-config", '{"flash_attn_version": 2}']),
                   make_ctx(RTX5090))
    (reason,) = _blocks(plan, "--attention-config after `--`")
    assert "--attention-config.flash_attn_version 2" in reason.hint
    dotted = resolve(Request(TEXT, vllm_version="0.33.0", extra_args=["--attention-config.flash_attn_version", "2"]),
                     make_ctx(RTX5090))
    assert not _blocks(dotted, "--attention-config after")


def test_a_drafter_backend_the_per_kind_map_would_override_is_refused(models):
    # 0.33.0's load_dflash_model copies the attention config into the drafter's, map included.
    clash = resolve(Request(TEXT, vllm_version="0.33.0", sets=["drafter.attention_backend=triton_attn"]),
                    make_ctx(RTX5090))
    (reason,) = _blocks(clash, "would not reach the drafter's sliding layers")
    assert "intent.attention_per_kind={}" in reason.hint
    followed = resolve(Request(TEXT, vllm_version="0.33.0", sets=["drafter.attention_backend=triton_attn",
                                                                  "intent.attention_per_kind={}"]), make_ctx(RTX5090))
    assert not _blocks(followed, "would not reach")
    assert "backend_per_kind" not in _args(followed)
    # 0.21.0 has no map: its patch leaves the drafter's backend alone.
    old = resolve(Request(TEXT, vllm_version="0.21.0", sets=["drafter.attention_backend=triton_attn"]),
                  make_ctx(RTX5090))
    assert not _blocks(old, "would not reach")


def test_the_spark_fallback_for_the_text_recipe_also_drops_the_map(models):
    from tests.unit.conftest import GB10

    spark = resolve(Request(TEXT, vllm_version="0.33.0"), make_ctx(GB10))
    (warning,) = [w for w in spark.warnings if "#50707" in w]
    assert "--set drafter.attention_backend=triton_attn --set intent.attention_per_kind={}" in warning


def test_a_hopper_stand_in_must_run_the_mapped_sliding_layers_on_fa2(models):
    plan = resolve(Request(TEXT, vllm_version="0.33.0", test_gpu=True), make_ctx(H100))
    (reason,) = _blocks(plan, "FLASH_ATTN is FlashAttention 3")
    assert reason.hint == "add -- --attention-config.flash_attn_version 2"
    fa2 = resolve(Request(TEXT, vllm_version="0.33.0", test_gpu=True,
                          extra_args=["--attention-config.flash_attn_version", "2"]), make_ctx(H100))
    assert not _blocks(fa2, "FlashAttention 3")
    assert not _blocks(resolve(Request(TEXT, vllm_version="0.33.0"), make_ctx(RTX5090)), "FlashAttention 3")
