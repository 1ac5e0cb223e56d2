"""The trained-target proof's CPU parts (issue 23): the gate, the trained runs, the trainer's pieces.

The GPU runs themselves need the device; what can go wrong before them is
checked here: a gate that passes degenerate output, a verdict against a
reference of another target, a trained run that would drop images or the
small KV pool, a trainer whose expert kernel computes something other than
Gemma 4's experts, or prompts that break the issue's bounds.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from tests.unit.gpu_scripts import load as _load

gate = _load("gate")
rs = _load("realshape")


def _out(tokens, top=None):
    return {"token_ids": tokens, "top": top or []}


# ---------------------------------------------------------------- the gate


def test_gate_rejects_a_constant_sequence_and_counts_near_ties():
    outs = [_out([5] * 128), _out(list(range(128)))]
    block = gate.nondegenerate(outs)
    assert block["sequences"] == 2
    assert block["constant_sequences"] == 1
    assert not gate.passes(block)


def _diverse(n=32, length=128):
    rngs = [random.Random(i) for i in range(n)]
    return [[r.randrange(1000) for _ in range(length)] for r in rngs]


def test_gate_rejects_a_loop_of_few_tokens_and_passes_diverse_text():
    loop = [1, 2, 3, 4] * 32  # 4 distinct of 128: the median fraction is what catches it
    assert not gate.passes(gate.nondegenerate([_out(loop)] * 32))
    block = gate.nondegenerate([_out(t) for t in _diverse()])
    assert block["constant_sequences"] == 0 and block["median_distinct_fraction"] > 0.5
    assert block["looping_sequences"] == 0 and block["prompts_full_length"] == 32
    assert gate.passes(block)


def _stalls(head_len, copies, token=7):
    """``head_len`` distinct tokens, then ``copies`` of one token: many distinct tokens, so not
    constant, and a median fraction the old gate passed."""
    return list(range(100, 100 + head_len)) + [token] * copies


def test_a_sequence_ending_in_93_copies_of_one_token_is_looping():
    seq = _stalls(35, 93)
    assert len(set(seq)) > 1 and len(seq) == 128
    assert gate.loop_period(seq) == 1 and gate.looping(seq)
    # one different token inside the last 64 breaks period 1, and no period up to 32 fits
    broken = seq[:-40] + [5] + seq[-39:]
    assert not gate.looping(broken)


def test_loop_periods_up_to_32_count_and_longer_ones_do_not():
    head = list(range(500, 564))
    for period in (2, 17, 32):
        cycle = list(range(1000, 1000 + period))
        seq = head + cycle * (64 // period + 1)
        assert gate.loop_period(seq) == period, period
    # period 33: the last 64 tokens hold fewer than two periods of 32 or less
    seq = head + list(range(2000, 2033)) * 2
    assert not gate.looping(seq)
    # shorter than the window: not judged by the loop check (the length bar catches it)
    assert not gate.looping([1] * 63)


def test_a_diverse_sequence_is_not_looping():
    assert not any(gate.looping(t) for t in _diverse())


def test_gate_fails_a_record_with_more_than_a_tenth_looping():
    diverse = _diverse()
    # 3 of 32 looping (9.4 %) passes; 4 (12.5 %) fails, with the reason
    three = [_stalls(35, 93, token=i) for i in range(3)] + diverse[3:]
    four = [_stalls(35, 93, token=i) for i in range(4)] + diverse[4:]
    assert gate.nondegenerate([_out(t) for t in three])["looping_sequences"] == 3
    assert gate.passes(gate.nondegenerate([_out(t) for t in three]))
    block = gate.nondegenerate([_out(t) for t in four])
    assert block["looping_sequences"] == 4 and not gate.passes(block)
    assert any("looping" in why for why in gate.failures(block))


def test_gate_needs_32_prompts_of_128_tokens():
    assert not gate.passes(gate.nondegenerate([_out(t) for t in _diverse(31)]))
    # 32 prompts, one of them cut at 127 tokens: 31 of full length
    short = _diverse()
    short[5] = short[5][:127]
    block = gate.nondegenerate([_out(t) for t in short])
    assert block["prompts_full_length"] == 31 and not gate.passes(block)


def test_gate_counts_distinct_prompts_not_requests():
    # a grouped run of 1/8/22: 31 outputs of 22 prompts fails the 32-prompt bar
    prompts = _diverse(22)
    keys = [i for c in (1, 8, 22) for i in range(c)]
    outs = [_out(prompts[i]) for i in keys]
    block = gate.nondegenerate(outs, keys)
    assert block["sequences"] == 31 and block["prompts"] == 22 and not gate.passes(block)
    raw = {"groups": {str(c): [_out(prompts[i]) for i in range(c)] for c in (1, 8, 22)}}
    assert rs.generated_prompts(raw) == keys


def test_a_block_written_before_the_loop_check_fails():
    block = gate.nondegenerate([_out(t) for t in _diverse()])
    del block["looping_sequences"]
    assert not gate.passes(block) and "loops not counted" in gate.failures(block)


def test_grouped_records_weigh_the_first_prompts_once_per_group():
    # A grouped run over (1, 4, 17, 32) sees prompt 0 four times and prompt 31 once.
    grouped = gate.as_groups(list(range(36)))
    assert len(grouped) == 54
    assert grouped.count(0) == 4 and grouped.count(3) == 3 and grouped.count(16) == 2
    assert grouped.count(31) == 1 and 32 not in grouped
    # ... so a loop in the first prompt can fail a grouped record whose reference passes.
    outs = [_out([1] * 8 if i == 0 else list(range(8))) for i in range(36)]
    assert gate.nondegenerate(outs)["constant_sequences"] == 1
    assert gate.nondegenerate(gate.as_groups(outs))["constant_sequences"] == 4


def test_gate_near_ties_are_one_bf16_step_gaps():
    # 10.0 vs 10.0625: one bf16 step at 10 (2**-4); 10.0 vs 10.5: eight steps.
    tie = [[7, 10.0625, 1], [8, 10.0, 2]]
    clear = [[7, 10.5, 1], [8, 10.0, 2]]
    block = gate.nondegenerate([_out([7, 9], [tie, clear])])
    assert block["near_ties"] == 1


# ------------------------------------------------------------ the trained runs


def test_done_when_runs_exist_on_0_21_0_with_the_trained_target():
    for name in ("trained-ref-bf16", "trained-ref-nvfp4", "trained-dflash-fa2-cg-bf16",
                 "trained-dflash-fa2-cg-nvfp4", "trained-dflash-fa2-cg-bf16-smallkv"):
        spec = rs.RUNS[name]
        assert spec.trained and spec.vllm == "0.21.0"
        if spec.mode == "dflash":
            assert spec.cuda_graphs and spec.flash_attn_version == 2 and spec.drafter_backend == "flash_attn"
            assert rs.reference_for(spec).quant == spec.quant
    assert rs.RUNS["trained-dflash-fa2-cg-bf16"].concurrency == (1, 4, 17, 32)


def test_trained_multimodal_runs_allow_images_and_text_only_runs_are_language_model_only():
    models = Path("/m")
    mm = rs.trained_engine_kwargs(rs.RUNS["trained-dflash-fa2-cg-bf16"], models)
    assert mm["limit_mm_per_prompt"]["image"] == 1
    assert "skip_tokenizer_init" not in mm and "skip_mm_profiling" not in mm
    assert mm["disable_log_stats"] is False  # preemptions and prefix hits come from the engine's counters
    assert mm["max_num_seqs"] >= 32 and mm["max_model_len"] >= 1500 + 128 + 16
    text = rs.trained_engine_kwargs(rs.RUNS["trained-dflash-fa3-cg-bf16-text"], models)
    assert text["language_model_only"] is True and "limit_mm_per_prompt" not in text
    assert "attention_config" not in text  # FA3: Hopper's default, not forced
    small = rs.trained_engine_kwargs(rs.RUNS["trained-dflash-fa2-cg-bf16-smallkv"], models)
    assert small["num_gpu_blocks_override"] == rs.TRAINED_SMALL_POOL


def test_v33_small_pool_runs_use_the_pool_sized_for_one_layer_blocks():
    # On the H100, 0.33.0 refused 1000 blocks at start-up: about 4,300 needed for one
    # 2,048-token request (0.13 GiB of 32 KiB blocks). Every v33 small-pool run must pass it.
    v33_small = [s for s in rs.RUNS.values() if s.vllm == "0.33.0" and "smallkv" in s.name]
    assert v33_small and all(s.kv_blocks == rs.TRAINED_SMALL_POOL_V33 for s in v33_small)
    assert rs.TRAINED_SMALL_POOL_V33 * 32 * 1024 > 0.135 * 2**30


def _ref(tokens, sha="aaa"):
    return {"ok": True, "target_sha256": sha, "passes": [[_out(t) for t in tokens]] * 2}


def test_judge_refuses_a_reference_of_another_target():
    run = {"ok": True, "target_sha256": "bbb", "groups": {"1": [_out([1, 2, 3])]}}
    v = rs.judge(_ref([[1, 2, 3]], sha="aaa"), run)
    assert v["lossless"] is None and "target_sha256" in v["reason"]


def test_a_trained_dflash_record_is_proof_only_when_lossless_and_nondegenerate():
    spec = rs.RUNS["trained-dflash-fa2-cg-bf16"]
    diverse = _diverse()
    good = {"ok": True, "target_sha256": "aaa", "counters": {"preemptions": 0, "prefix_cache_hits": 64},
            "groups": {"1": [_out(diverse[0])], "32": [_out(t) for t in diverse]}}
    assert rs.trained_fields(spec, good, _ref(diverse))["proof"] is True
    constant = [[9] * 128 for _ in range(32)]
    dull = dict(good, groups={"32": [_out(t) for t in constant]})
    fields = rs.trained_fields(spec, dull, _ref(constant))
    assert fields["proof"] is False and fields["nondegenerate"]["constant_sequences"] == 32
    wrong = dict(good, groups={"32": [_out(diverse[1]), _out(diverse[0])] + [_out(t) for t in diverse[2:]]})
    assert rs.trained_fields(spec, wrong, _ref(diverse))["proof"] is False
    # lossless against a reference of only 22 prompts: not proof (the 32-prompt bar)
    few = dict(good, groups={"22": [_out(t) for t in diverse[:22]]})
    assert rs.trained_fields(spec, few, _ref(diverse[:22]))["proof"] is False


def test_trained_records_do_not_replace_the_random_targets():
    spec = rs.RUNS["trained-ref-bf16"]
    raw = _ref([list(range(128))])
    raw.update(target_name="trained-a4b-r30", counters={})
    new = rs.record(spec, raw, None, {"series_hash": "h" * 64})
    old = dict(new, target_kind="random", target_name=rs.RANDOM_TARGET_NAME, name="ref-bf16")
    merged = rs.merge([old], [new])
    assert {r["target_kind"] for r in merged} == {"random", "trained"}
    md = rs.markdown(merged, {})
    assert "## Trained target" in md and "degenerate" in md


def test_engine_counters_map_vllms_metric_names():
    class M:
        def __init__(self, name, value=None, values=None):
            self.name, self.value, self.values = name, value, values

    class LLM:  # stands in for vllm.LLM.get_metrics (no vLLM engine without a GPU)
        def get_metrics(self):
            return [M("vllm:num_preemptions", 3.0), M("vllm:prefix_cache_hits", 128.0),
                    M("vllm:spec_decode_num_accepted_tokens_per_pos", values=[5, 2]), M("vllm:other", 1)]

    got = rs.engine_counters(LLM())
    assert got == {"preemptions": 3, "prefix_cache_hits": 128, "spec_accepted_per_pos": [5, 2]}


# ------------------------------------------------------------- the trainer

torch = pytest.importorskip("torch", reason="the trainer's pieces need torch (the test venv has the CPU build)")
tt = _load("train_target")


def test_unigram_perplexity_of_a_uniform_stream_is_the_vocabulary_size():
    stream = list(range(50)) * 200
    assert tt.unigram_perplexity(stream, stream, 50) == pytest.approx(50, rel=1e-3)
    skewed = [0] * 900 + [1] * 100
    assert tt.unigram_perplexity(skewed, skewed, 2) < 2


def test_windows_are_deterministic_and_start_with_bos():
    import numpy as np

    stream = np.arange(5000, dtype=np.int64)
    a = tt.windows(stream, 4, 64, random.Random(1))
    b = tt.windows(stream, 4, 64, random.Random(1))
    assert (a == b).all() and a.shape == (4, 64)
    assert (a[:, 0] == tt.lm_files.CONFIG_IDS["bos_token_id"]).all()
    assert (np.diff(a[:, 1:], axis=1) == 1).all()


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    cfg = tt.TrainConfig(steps=100, warmup=10, lr=1e-3, min_lr_ratio=0.1)
    assert tt.lr_at(0, cfg) == pytest.approx(1e-4)
    assert tt.lr_at(9, cfg) == pytest.approx(1e-3)
    assert tt.lr_at(99, cfg) == pytest.approx(1e-4, rel=0.05)


def test_expert_kernel_matches_gemma4s_own_experts():
    """The trainer swaps transformers' per-expert loop for grouped GEMMs: same function, bf16 rounding apart."""
    from transformers import Gemma4TextConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextExperts

    cfg = Gemma4TextConfig(hidden_size=64, moe_intermediate_size=32, num_experts=8, top_k_experts=3,
                           hidden_activation="gelu_pytorch_tanh")
    cfg._experts_implementation = "eager"
    experts = Gemma4TextExperts(cfg)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        experts.gate_up_proj.copy_(torch.randn(experts.gate_up_proj.shape, generator=gen) * 0.1)
        experts.down_proj.copy_(torch.randn(experts.down_proj.shape, generator=gen) * 0.1)
    x = torch.randn(20, 64, generator=gen)
    weights = torch.softmax(torch.randn(20, 3, generator=gen), -1)
    index = torch.stack([torch.randperm(8, generator=gen)[:3] for _ in range(20)])
    with torch.no_grad():
        want = experts(x, index, weights)
        got = tt._experts_forward(experts, x, index, weights)
    assert got.shape == want.shape
    assert torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    assert not torch.allclose(got, torch.zeros_like(got))


def test_attention_logits_start_with_unit_variance_not_sqrt_head_dim():
    """Gemma 4 scores with scaling 1.0; the trainer's init of the q/k norm gains must bring
    the first logits from ~sqrt(head_dim) down to ~1, on sliding (256) and full (512) layers."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    shape = tt.mc.TargetShape("t", 6, hidden_size=64, num_attention_heads=2, num_key_value_heads=1,
                              num_global_key_value_heads=1, num_experts=4, moe_intermediate_size=16,
                              intermediate_size=32, sliding_window=16)
    cfg = tt.mc.gemma4_config_dict(shape, vocab=512)
    config = Gemma4Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    torch.manual_seed(0)
    model = Gemma4ForConditionalGeneration._from_config(config, attn_implementation="eager", dtype=torch.float32)
    x = torch.randn(1, 64, 64)

    def logit_std(attn):
        q = attn.q_norm(attn.q_proj(x).view(1, 64, -1, attn.head_dim))
        k = attn.k_norm(attn.k_proj(x).view(1, 64, -1, attn.head_dim))
        return float((q[0, :, 0] @ k[0, :, 0].T).std())

    layers = model.model.language_model.layers
    full = next(l.self_attn for l in layers if not l.self_attn.is_sliding)
    sliding = layers[0].self_attn
    with torch.no_grad():
        before = logit_std(sliding), logit_std(full)
        tt.unit_attention_logits(model)
        after = logit_std(sliding), logit_std(full)
    assert before[0] > 10 and before[1] > 15, before
    assert all(0.5 < s < 2.0 for s in after), after


def test_target_config_is_the_26b_a4b_mix_with_the_tokenizers_ids():
    cfg = tt.target_config()
    text = cfg["text_config"]
    assert text["layer_types"].count("sliding_attention") == 25 and text["layer_types"].count("full_attention") == 5
    assert text["head_dim"] == 256 and text["global_head_dim"] == 512 and text["attention_k_eq_v"]
    assert text["num_experts"] >= 32 and text["top_k_experts"] == 8
    assert text["vocab_size"] == tt.lm_files.VOCAB_SIZE
    ids = tt.lm_files.CONFIG_IDS
    assert cfg["image_token_id"] == ids["image_token_id"] and text["eos_token_id"] == ids["eos_token_id"]
    assert cfg["vision_config"]["num_hidden_layers"] >= 1
    d = tt.drafter_config()
    assert d["dflash_config"]["mask_token_id"] == ids["mask_token_id"]
    assert d["layer_types"] == ["sliding_attention"] * 4 + ["full_attention"]
    assert max(d["dflash_config"]["target_layer_ids"]) < 30


def test_prompts_meet_the_issues_bounds(tmp_path):
    """36 held-out prompts of 16-1,500 tokens, some sharing a long prefix, 128 new tokens each."""
    rng = random.Random(3)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(rng.randrange(3, 9)))
             for _ in range(300)]
    docs = [(f"m{i}.py", "\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(400)))
            for i in range(40)]
    tok = tt.lm_files.train_tokenizer([t for _, t in docs], 600)
    prompts = tt.build_prompts(tok, docs, seed=1)
    lengths = [len(p["token_ids"]) for p in prompts]
    assert len(prompts) >= 32 and min(lengths) >= 16 and max(lengths) <= 1500
    assert all(p["max_tokens"] >= 128 for p in prompts)
    shared = [p["token_ids"][:tt.SHARED_PREFIX] for p in prompts if p.get("shared_prefix")]
    assert len(shared) >= 4 and all(s == shared[0] for s in shared)
    # Every concurrency group of the proof (the first 4, 17, 32 prompts) holds shared-prefix prompts.
    assert any(p.get("shared_prefix") for p in prompts[:4])
    json.dumps(prompts)  # prompts.json must serialise
    assert math.isclose(sum(1 for p in prompts if p["token_ids"][0] == tt.lm_files.CONFIG_IDS["bos_token_id"]),
                        len(prompts))


def test_gate_counts_nan_logits_and_fails_on_them():
    nan = float("nan")
    diverse = list(range(128))
    block = gate.nondegenerate([_out(diverse, [[[1, nan, 1], [0, nan, 2]]] * 3 + [[[5, 2.0, 1], [6, 1.0, 2]]])])
    assert block["nan_positions"] == 3 and block["near_ties"] == 0
    assert not gate.passes(block)


def test_prefix_cache_hits_come_from_each_requests_cached_tokens():
    """vLLM 0.21.0's counter lost every group after the first on the H100 (16 queries, 0 hits);
    per-request num_cached_tokens are summed instead, the counter only as a fallback."""
    outs = [dict(_out(list(range(128))), num_cached_tokens=n) for n in (0, 640, 640)]
    raw = {"ok": True, "counters": {"prefix_cache_hits": 0}, "groups": {"1": outs[:1], "3": outs}}
    assert rs.prefix_cache_hits(raw) == 1280
    old = {"ok": True, "counters": {"prefix_cache_hits": 7}, "groups": {"1": [_out([1, 2])]}}
    assert rs.prefix_cache_hits(old) == 7


def test_unlikelihood_penalises_only_tokens_already_in_the_window():
    torch = pytest.importorskip("torch", reason="the trainer's loss needs torch (in the dev venv)")
    tt = _load("train_target")
    bos = tt.lm_files.CONFIG_IDS["bos_token_id"]
    batch = torch.tensor([[bos, 20, 21, 20, 22]])
    logits = torch.zeros(1, 4, 30)
    # Uniform over 30 tokens: each candidate costs -log(1 - 1/30).
    unit = -math.log(1 - 1 / 30)
    # Candidates per predicted position: {} (bos only), {20}, {20, 21} minus target 20 -> {21},
    # {20, 21}: 0 + 1 + 1 + 2 over 4 positions.
    assert float(tt.unlikelihood_loss(logits, batch)) == pytest.approx(unit * 4 / 4, rel=1e-5)
    # Mass moved onto a token already seen raises it; onto an unseen one it does not.
    seen, unseen = logits.clone(), logits.clone()
    seen[0, 3, 21] = 5.0
    unseen[0, 3, 25] = 5.0
    assert tt.unlikelihood_loss(seen, batch) > tt.unlikelihood_loss(logits, batch) > tt.unlikelihood_loss(unseen, batch)


def test_the_realshape_table_marks_stale_records_and_applies_the_gate_as_it_stands():
    """Issue 51: a record on the current series reads "current", one on an earlier series
    "stale", in its row and the headline; a stored block from before the loop check is not proof
    under the gate now, whatever proof the record holds."""
    from launcher.patching.series import series_for

    spec = rs.RUNS["trained-dflash-fa2-cg-bf16"]
    diverse = _diverse()
    raw = {"ok": True, "target_sha256": "aaa", "counters": {"preemptions": 0, "prefix_cache_hits": 64},
           "groups": {"32": [_out(t) for t in diverse]}}
    current = rs.record(spec, raw, _ref(diverse), {"series_hash": series_for("0.21.0").hash, "vllm": "0.21.0"})
    old = rs.record(spec, raw, _ref(diverse), {"series_hash": "f" * 64, "vllm": "0.21.0"})
    assert current["proof"] is True
    md = rs.markdown([current], {})
    row = next(ln for ln in md.splitlines() if ln.startswith("| trained-dflash-fa2-cg-bf16 |"))
    assert "| current |" in row and "| passes |" in row and "**0 of 1 records are stale**" in md
    del old["nondegenerate"]["looping_sequences"]
    md = rs.markdown([old], {})
    row = next(ln for ln in md.splitlines() if ln.startswith("| trained-dflash-fa2-cg-bf16 |"))
    assert "| **stale** |" in row and "**not proof**: loops not counted" in row
    assert "**1 of 1 records are stale**" in md


def test_the_gates_one_pass_position_check_equals_the_two_pass_definition():
    """gate._position (NaN first, then compare.is_tie on the first rank-1 and rank-2 entries) on
    random positions, near ties and non-finite logits included, against the plain definition."""
    import compare

    def plain(pos):
        if any(isinstance(e[1], float) and math.isnan(e[1]) for e in pos):
            return "nan"
        first, second = compare._ranked(pos)
        if first is not None and second is not None and compare.is_tie(first[1], second[1]):
            return "tie"
        return None

    rng = random.Random(7)
    specials = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0]
    seen = set()
    for _ in range(20000):
        base = rng.choice([rng.uniform(-40, 40), rng.choice(specials)])
        step = compare.bf16_step(base) if math.isfinite(base) else 0.0
        second = base - rng.choice([0.0, step, step * 1.5, step * 2, rng.uniform(0, 5), rng.choice(specials)])
        pos = [[1, base, 1], [2, second, 2], [3, rng.uniform(-40, 40), rng.choice([1, 2, 3])]]
        rng.shuffle(pos)
        assert gate._position(pos) == plain(pos), pos
        seen.add(plain(pos))
    assert seen == {"nan", "tie", None}
