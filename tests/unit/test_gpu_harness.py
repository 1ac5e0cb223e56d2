"""The GPU proof's pure parts, without torch or a GPU: checkpoint shapes, prompts, log parsing.

The shapes must keep what the proof is about (Gemma 4's head dims, hybrid
sliding/full layers, the multimodal mm-prefix flag, a drafter larger than
the target's smallest KV bucket); the log lines below are copied from a real
vLLM 0.21.0 run on an H100 (tests/gpu/results).
"""

from __future__ import annotations

from tests.unit.gpu_scripts import load as _load

mc = _load("make_checkpoints")
rm = _load("run_modes")


def test_targets_keep_gemma4_shape_that_triggers_the_bugs():
    for shape in mc.TARGETS:
        cfg = mc.gemma4_config_dict(shape)
        text = cfg["text_config"]
        assert cfg["architectures"] == ["Gemma4ForConditionalGeneration"]
        assert text["use_bidirectional_attention"] == "vision"
        assert (text["head_dim"], text["global_head_dim"]) == (256, 512)
        assert text["enable_moe_block"] is True
        assert text["layer_types"][-1] == "full_attention"
        assert text["layer_types"].count("full_attention") == shape.num_full_layers
        assert cfg["vision_config"] is not None
        for key in mc.SPECIAL_IDS:
            assert cfg[key] < text["vocab_size"]
    assert sorted(t.num_full_layers for t in mc.TARGETS) == [1, 2]


def test_each_drafter_outgrows_its_targets_smallest_bucket():
    targets = {t.name: t for t in mc.TARGETS + mc.DIAGNOSTIC_TARGETS}
    for d in mc.DRAFTERS + mc.DIAGNOSTIC_DRAFTERS:
        target = targets[d.target]
        cfg = mc.drafter_config_dict(d)
        assert cfg["architectures"] == ["DFlashDraftModel"]
        assert cfg["dflash_config"]["mask_token_id"] == mc.MASK_TOKEN_ID < mc.VOCAB
        assert all(0 <= i < target.num_layers for i in d.target_layer_ids)
        assert cfg["hidden_size"] == mc.HIDDEN  # shares the target's embeddings
    for d in mc.DRAFTERS:
        assert d.num_layers > targets[d.target].num_full_layers


def test_manifest_lists_standard_and_diagnostic_pairs_apart():
    m = mc.shapes_manifest()
    assert [d["name"] for d in m["drafters"]] == [d.name for d in mc.DRAFTERS]
    assert {d["name"] for d in m["diagnostic_drafters"]}.isdisjoint(m_d["name"] for m_d in m["drafters"])
    assert m["prompt_token_limit"] < min(mc.SPECIAL_IDS.values())


def test_prompts_are_fixed_and_not_a_cuda_graph_batch():
    a, b = rm.prompts(4080), rm.prompts(4080)
    assert a == b
    assert len(a) == len(rm.MAX_TOKENS) == 17
    assert [len(p) for p in a] == rm.PROMPT_LENGTHS
    assert all(3 <= t < 4080 for p in a for t in p)


STOCK_AUTO_LOG = """\
INFO 11-26 06:53:39 [config.py:101] Gemma4 model has heterogeneous head dimensions (head_dim=256, global_head_dim=512). Forcing TRITON_ATTN backend to prevent mixed-backend numerical divergence.
INFO 11-26 06:53:40 [cuda.py:312] Using AttentionBackendEnum.TRITON_ATTN backend.
INFO 11-26 06:53:41 [cuda.py:373] Using FLEX_ATTENTION attention backend out of potential backends: ['FLEX_ATTENTION'].
Traceback (most recent call last):
  File "/tmp/site/vllm/v1/spec_decode/llm_base_proposer.py", line 1478, in validate_same_kv_cache_group
AssertionError: All drafting layers should belong to the same kv cache group
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_parse_log_finds_backends_and_the_root_cause_not_the_wrapper():
    info = rm.parse_log(STOCK_AUTO_LOG)
    assert info["log_forced_triton"] is True
    assert info["log_backends_explicit"] == ["TRITON_ATTN"]
    assert info["log_backends_auto"] == ["FLEX_ATTENTION"]
    assert info["log_error_line"] == (
        "AssertionError: All drafting layers should belong to the same kv cache group")


def test_parse_log_of_a_clean_run_has_no_error():
    info = rm.parse_log("INFO Using AttentionBackendEnum.FLASH_ATTN backend.\nINFO done\n")
    assert info["log_error_line"] is None
    assert info["log_backends_explicit"] == ["FLASH_ATTN"]
