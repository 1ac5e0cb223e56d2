"""The real-shape GPU proof's pure parts (tests/gpu/runs/realshape.py), without torch or a GPU.

The shapes must be the 26B-A4B's (layer mix, head dims, KV heads per layer
kind, experts) and the public drafter's (5 layers, 4 sliding + 1 full); the
verdicts must refuse a moving reference and name divergences by concurrency.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.unit.gpu_scripts import load as _load

mc = _load("make_checkpoints")
rs = _load("realshape")


def test_realshape_target_has_the_26b_a4b_layer_mix_and_kv_heads():
    text = mc.gemma4_config_dict(mc.REALSHAPE_TARGET)["text_config"]
    kinds = text["layer_types"]
    assert (kinds.count("sliding_attention"), kinds.count("full_attention")) == (25, 5)
    assert all(kinds[i] == "full_attention" for i in (5, 11, 17, 23, 29))
    assert (text["head_dim"], text["global_head_dim"]) == (256, 512)
    assert (text["num_attention_heads"], text["num_key_value_heads"],
            text["num_global_key_value_heads"]) == (16, 8, 2)
    assert (text["num_experts"], text["top_k_experts"]) == (128, 8)
    assert text["attention_k_eq_v"] is True
    assert text["final_logit_softcapping"] == 30.0
    assert text["use_bidirectional_attention"] == "vision"


def test_realshape_drafter_has_the_public_drafters_layers_and_fits_the_target():
    d = mc.REALSHAPE_DRAFTER
    cfg = mc.drafter_config_dict(d)
    assert cfg["num_hidden_layers"] == 5
    assert cfg["layer_types"] == ["sliding_attention"] * 4 + ["full_attention"]
    assert cfg["hidden_size"] == mc.REALSHAPE_TARGET.hidden_size  # shares embeddings / LM head
    assert max(cfg["dflash_config"]["target_layer_ids"]) + 1 < mc.REALSHAPE_TARGET.num_layers
    # Windows scaled alike: prompts cross both (the drafter's is twice the target's).
    assert cfg["sliding_window"] == 2 * mc.REALSHAPE_TARGET.sliding_window
    lengths = rs.PROMPT_LENGTHS
    assert any(n > cfg["sliding_window"] for n in lengths)
    assert any(mc.REALSHAPE_TARGET.sliding_window < n <= cfg["sliding_window"] for n in lengths)


def test_manifest_of_each_set_names_only_its_own_pairs():
    real = mc.shapes_manifest("realshape")
    assert [t["name"] for t in real["targets"]] == [mc.REALSHAPE_TARGET.name]
    assert [d["name"] for d in real["drafters"]] == [mc.REALSHAPE_DRAFTER.name]
    proof = mc.shapes_manifest("proof")
    assert mc.REALSHAPE_TARGET.name not in {t["name"] for t in proof["targets"]}


def test_verify_token_counts_mix_captured_and_padded_sizes():
    counts = [c * (rs.NUM_SPECULATIVE_TOKENS + 1) for c in rs.CONCURRENCY]
    captured = [n for n in counts if n in rs.CAPTURE_SIZES]
    padded = [n for n in counts if n not in rs.CAPTURE_SIZES]
    assert captured and padded
    assert max(counts) <= max(rs.CAPTURE_SIZES)
    assert len(rs.PROMPT_LENGTHS) == len(rs.MAX_TOKENS) == max(rs.CONCURRENCY)
    assert max(p + m for p, m in zip(rs.PROMPT_LENGTHS, rs.MAX_TOKENS)) \
        + rs.NUM_SPECULATIVE_TOKENS < rs.MAX_MODEL_LEN


def test_engine_kwargs_force_fa2_and_the_small_pool_only_when_asked():
    spec = rs.RUNS["patched-fa2-nvfp4"]
    kw = rs.engine_kwargs(spec, Path("/m"))
    assert kw["model"].endswith("-nvfp4")
    assert kw["attention_config"] == {"flash_attn_version": 2}
    assert kw["speculative_config"]["attention_backend"] == "flash_attn"
    assert kw["speculative_config"]["num_speculative_tokens"] == 15
    assert kw["enforce_eager"] is False and kw["enable_prefix_caching"] is True
    assert "num_gpu_blocks_override" not in kw
    small = rs.engine_kwargs(rs.RUNS["stock-auto-bf16-smallkv"], Path("/m"))
    assert small["num_gpu_blocks_override"] == rs.RUNS["stock-auto-bf16-smallkv"].kv_blocks
    assert "attention_backend" not in small["speculative_config"]
    ref = rs.engine_kwargs(rs.RUNS["ref-bf16"], Path("/m"))
    assert ref["max_num_seqs"] == 1 and "speculative_config" not in ref


def _out(tokens, top=None):
    return {"prompt_len": 3, "token_ids": tokens, "top": top or [[[t, 1.0, 1], [t + 1, 0.0, 2]]
                                                                 for t in tokens]}


def _reference(passes):
    return {"ok": True, "passes": passes}


def test_a_reference_that_moves_gives_no_verdict():
    ref = _reference([[_out([1, 2, 3])], [_out([1, 2, 4])]])
    run = {"ok": True, "groups": {"1": [_out([1, 2, 3])]}}
    v = rs.judge(ref, run)
    assert v["lossless"] is None and v["reason"] == "reference not deterministic"
    assert v["reference"]["prompts_differing"] == [0]
    assert v["reference"]["first_difference"] == {"0": 2}


def test_divergence_off_a_tie_is_not_lossless_and_names_its_concurrency():
    ref_out = _out([1, 2, 3])
    ref = _reference([[ref_out, _out([5, 6])], [ref_out, _out([5, 6])]])
    run = {"ok": True, "groups": {"1": [_out([1, 2, 3])], "3": [_out([1, 2, 3]), _out([5, 9])]}}
    v = rs.judge(ref, run)
    assert v["lossless"] is False
    assert v["prompt_runs"] == 3 and v["identical"] == 2
    (d,) = v["divergences"]
    assert (d["concurrency"], d["prompt"], d["position"]) == (3, 1, 1)
    assert d["tie"] is False


def test_divergence_on_an_exact_tie_to_the_runner_up_is_lossless():
    tied = [[[1, 4.0, 1], [7, 4.0, 2]]]
    ref_out = _out([1], top=tied)
    ref = _reference([[ref_out], [ref_out]])
    v = rs.judge(ref, {"ok": True, "groups": {"1": [_out([7])]}})
    assert v["lossless"] is True and v["divergences"][0]["tie"] is True


def test_small_pool_divergences_say_whether_their_request_was_preempted_before_them():
    ev = _load("sched_events").SchedEvents()
    prompts = [[10, 11], [20, 21], [30, 31]]

    def request(rid, prompt, outputs):
        return type("R", (), {"request_id": rid, "prompt_token_ids": prompt, "num_output_tokens": outputs,
                              "num_computed_tokens": 40, "num_in_flight_tokens": 16})()

    ev.group = "3"
    ev.preempted(request("a", prompts[0], 5))       # before its divergence at 7
    ev.preempted(request("b", prompts[1], 9))       # after its divergence at 1
    ev.scheduled([request("c", prompts[2], 2)], {"a": 1, "b": 1})  # c skipped once, before 4
    ref_outs = [_out(list(range(1, 13))), _out([5, 6, 7]), _out([8, 9, 10, 11, 12])]
    ref = _reference([ref_outs, ref_outs])
    run = {"ok": True, "sched_events": ev.summary(prompts), "groups": {"3": [
        _out(list(range(1, 8)) + [99] + list(range(9, 13))), _out([5, 99, 7]), _out([8, 9, 10, 11, 99])]}}
    v = rs.judge(ref, run)
    by_prompt = {d["prompt"]: d for d in v["divergences"]}
    assert (by_prompt[0]["preempted_before"], by_prompt[0]["unscheduled_before"]) == (1, 0)
    assert (by_prompt[1]["preempted_before"], by_prompt[1]["unscheduled_before"]) == (0, 0)
    assert (by_prompt[2]["preempted_before"], by_prompt[2]["unscheduled_before"]) == (0, 1)
    assert v["preemption"] == {"prompt_runs_preempted": 2, "diverged_preempted": 2, "diverged_not_preempted": 1}


def test_runs_without_scheduler_events_get_no_preemption_split():
    ref_out = _out([1, 2, 3])
    v = rs.judge(_reference([[ref_out], [ref_out]]), {"ok": True, "groups": {"1": [_out([1, 2, 4])]}})
    assert "preemption" not in v and "preempted_before" not in v["divergences"][0]


def test_merge_keeps_a_batch_invariant_twin_apart_from_its_no_inductor_twin():
    base = {"vllm": "0.21.0", "series": "patched", "mode": "dflash", "kv_blocks": 1000, "batch_invariant": True}
    old = [dict(base, name="x-bi", ok=False), dict(base, name="x-bi-noinductor", compile_backend="eager", ok=False)]
    merged = rs.merge(old, [dict(base, name="x-bi-noinductor", compile_backend="eager", ok=True)])
    assert sorted((r["name"], r["ok"]) for r in merged) == [("x-bi", False), ("x-bi-noinductor", True)]


def test_merge_replaces_the_same_configuration_and_keeps_others():
    old = [{"vllm": "0.21.0", "series": "stock", "target": {"sliding": 25, "full": 5},
            "drafter_layers": 5, "mode": "dflash", "quantization": "bf16", "drafter_backend": "auto",
            "flash_attn_version": 2, "cuda_graphs": True, "kv_blocks": None,
            "batch_invariant": False, "ok": False},
           {"vllm": "0.33.0", "series": "stock", "target": {"sliding": 25, "full": 5}, "ok": True}]
    new = [dict(old[0], ok=True)]
    merged = rs.merge(old, new)
    assert len(merged) == 2
    assert [r["vllm"] for r in merged] == ["0.33.0", "0.21.0"]
    assert merged[1]["ok"] is True


def test_a_seeded_reference_fills_a_gap_but_never_replaces_the_record_of_its_configuration():
    """A machine that ran only DFlash lanes judged them against references seeded from an
    earlier machine (remote.sh seed_raw): merged, those older records must not replace the
    newer ones of the same configuration that the file holds."""
    base = {"vllm": "0.21.0", "series": "patched", "mode": "reference", "target": {"sliding": 25, "full": 5}}
    newer = dict(base, name="ref", series_hash="7430914d", ok=True)
    seeded = dict(base, name="ref", series_hash="21fa5aba", ok=True, seeded=True)
    other = dict(base, name="ref-exact", batch_invariant=True, ok=True, seeded=True)
    ran_here = dict(base, name="dflash", mode="dflash", ok=True)
    merged = rs.merge([newer], [seeded, other, ran_here])
    assert merged == [newer, other, ran_here]
    # Without the mark it is a rerun of that configuration, and replaces it.
    assert rs.merge([newer], [dict(seeded, seeded=False)]) == [dict(seeded, seeded=False)]


def test_raws_named_in_seeded_txt_are_marked_until_a_run_writes_its_own(tmp_path):
    for name in ("ref", "dflash"):
        (tmp_path / f"{name}.raw.json").write_text(json.dumps({"name": name, "ok": True}) + "\n")
    (tmp_path / "seeded.txt").write_text("ref.raw.json\nother.raw.json\n")
    raws = rs.load_raws(tmp_path)
    assert raws["ref"].get("seeded") is True and "seeded" not in raws["dflash"]
    rs.seeded.unseed(tmp_path, "ref.raw.json")  # the reference ran on this machine after all
    assert rs.seeded_runs(tmp_path) == {"other"} and "seeded" not in rs.load_raws(tmp_path)["ref"]
    assert rs.record(rs.RUNS["trained-ref-bf16"], {"ok": False, "seeded": True}, None, {})["seeded"] is True


def test_merge_drops_a_failed_start_when_the_same_run_comes_back():
    # 0.33.0 on the H100: the small-pool runs were refused at start-up, before the target
    # loaded, so their records carry no target fields; the reruns must replace them.
    failed = {"name": "v33-x-smallkv", "vllm": "0.33.0", "series": "8d57", "ok": False}
    other = {"name": "v33-y", "vllm": "0.33.0", "series": "8d57", "ok": False}
    kept_ok = {"name": "v33-x-smallkv", "vllm": "0.21.0", "series": "8d57", "ok": True}
    rerun = {"name": "v33-x-smallkv", "vllm": "0.33.0", "series": "8d57", "ok": True,
             "target": {"sliding": 25, "full": 5}, "target_name": "trained-a4b-r30"}
    merged = rs.merge([failed, other, kept_ok], [rerun])
    assert merged == [other, kept_ok, rerun]


def test_record_carries_the_issue_fields():
    spec = rs.RUNS["stock-fa-bf16"]
    raw = {"ok": False, "vllm_version": "0.21.0",
           "log_error_line": "ValueError: Selected backend ... partial multimodal token full attention not supported",
           "log_text_for_backends": []}
    rec = rs.record(spec, raw, None, {"series_hash": "abc"})
    for key in ("vllm", "series", "target", "drafter_layers", "drafter_backend", "flash_attn_version",
                "cuda_graphs", "quantization", "kv_blocks", "ok", "error", "lossless", "divergences"):
        assert key in rec
    assert rec["series"] == "stock" and rec["target"] == {"sliding": 25, "full": 5}
    assert "partial multimodal" in rec["error"] and rec["lossless"] is None
    patched = rs.record(rs.RUNS["patched-fa2-bf16"], {"ok": True, "groups": {}}, None,
                        {"series_hash": "abc"})
    assert patched["series"] == "abc"


def test_quant_backends_are_read_from_vllm_log_lines():
    text = ("INFO [__init__.py:687] Using MarlinNvFp4LinearKernel for NVFP4 GEMM\n"
            "INFO [nvfp4.py:184] Using 'MARLIN' NvFp4 MoE backend out of potential backends: ['MARLIN']")
    assert rs._quant_backends(text) == {"linear_backend": ["MarlinNvFp4LinearKernel"],
                                        "moe_backend": ["MARLIN"]}


def test_a_newer_series_replaces_a_patched_record_and_semantics_stay_apart():
    base = {"vllm": "0.21.0", "target": {"sliding": 25, "full": 5}, "drafter_layers": 5,
            "mode": "dflash", "quantization": "modelopt-nvfp4", "drafter_backend": "flash_attn",
            "flash_attn_version": 2, "cuda_graphs": True, "kv_blocks": None, "batch_invariant": False}
    old = [dict(base, series="e5d55c3a", ok=False),  # before 0009: the assert
           dict(base, series="stock", ok=False)]
    new = [dict(base, series="5529b176", mm_prefix=True, ok=True),
           dict(base, series="9496c6ec", mm_prefix=False, ok=True)]
    merged = rs.merge(old, new)
    # The stale patched record is gone, stock stays, and the text-only run does
    # not replace the multimodal one (a record without the field is mm-prefix).
    assert [(r["series"], r.get("mm_prefix")) for r in merged] == [
        ("stock", None), ("5529b176", True), ("9496c6ec", False)]


def test_each_semantics_records_its_own_series_and_reference():
    meta = {"series_hash": "whole", "series_hash_mm": "less-text-only"}
    mm = rs.record(rs.RUNS["patched-fa2-nvfp4"], {"ok": True, "groups": {}}, None, meta)
    text = rs.record(rs.RUNS["patched-fa2-nvfp4-text"], {"ok": True, "groups": {}}, None, meta)
    assert (mm["series"], mm["mm_prefix"]) == ("less-text-only", True)
    assert (text["series"], text["mm_prefix"]) == ("whole", False)
    # A text-only run moves the target's sliding layers to FLASH_ATTN: its reference
    # must too, with the same forced FA version; the multimodal one keeps TRITON.
    ref_text = rs.reference_for(rs.RUNS["patched-fa2-nvfp4-text"])
    assert (ref_text.name, ref_text.mm_prefix, ref_text.flash_attn_version) == ("ref-nvfp4-text", False, 2)
    assert rs.reference_for(rs.RUNS["patched-fa2-nvfp4"]).name == "ref-nvfp4"
    assert rs.reference_for(rs.RUNS["patched-fa2-bf16-text"]).name == "ref-bf16-text"


def test_v33_runs_are_judged_by_v33_references_and_only_image_runs_allow_images():
    v33 = [r for r in rs.RUNS.values() if r.vllm == "0.33.0" and not r.trained]
    assert {r.series for r in v33} == {"stock", "patched"}
    assert {r.quant for r in v33} == {"bf16", "modelopt-nvfp4"}
    for r in v33:
        if r.mode == "dflash":
            ref = rs.reference_for(r)
            assert (ref.vllm, ref.quant, ref.mm_prefix) == ("0.33.0", r.quant, False)
            assert rs.engine_kwargs(r, Path("/m"))["limit_mm_per_prompt"] == {"image": 0, "video": 0}
            assert r.cuda_graphs and r.flash_attn_version == 2
    images = [r for r in v33 if r.image_limit]
    assert images and all(r.mode == "init" and r.mm_prefix for r in images)
    kw = rs.engine_kwargs(images[0], Path("/m"))
    assert kw["limit_mm_per_prompt"]["image"] == 1 and kw["skip_mm_profiling"] is True
    assert "skip_mm_profiling" not in rs.engine_kwargs(rs.RUNS["ref-bf16"], Path("/m"))
    # The 0.21.0 references stay 0.21.0's.
    assert rs.reference_for(rs.RUNS["patched-fa2-bf16"]).vllm == "0.21.0"


def test_a_call_runs_only_its_own_release(tmp_path, capsys):
    models = tmp_path / "m"
    models.mkdir()
    (models / "shapes.json").write_text('{"prompt_token_limit": 100}')
    try:
        rs.main(["--models", str(models), "--vllm", "0.33.0", "--runs", "ref-bf16"])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("a 0.21.0 run was accepted for --vllm 0.33.0")
    assert "need another vLLM" in capsys.readouterr().err


def test_an_engine_start_record_says_so_and_carries_sliding_windows():
    raw = {"ok": True, "vllm_version": "0.33.0",
           "kv_cache_groups": [{"gid": 0, "spec": "SlidingWindowSpec", "block_size": 16, "head_size": 128,
                                "sliding_window": 128, "layers": ["d.0"], "drafter_layers": ["d.0"]}]}
    rec = rs.record(rs.RUNS["v33-patched-fa2-bf16-images"], raw, None, {"series_hash": "h33"})
    assert rec["vllm"] == "0.33.0" and rec["series"] == "h33" and rec["image_limit"] == 1
    assert rec["kv_cache_groups"] == [{"gid": 0, "spec": "SlidingWindowSpec", "block_size": 16, "head_size": 128,
                                       "sliding_window": 128, "layers": 1, "drafter_layers": 1}]
    assert rec["lossless"] is None
    assert "target and drafter loaded" in rs.markdown([rec], {})


# ------------------------------------------------ batch-noise floor (grouped, no drafter)

def _pos(*entries):
    """One position's listed logprobs: (token, logit) pairs, best first."""
    return [[t, logit, rank] for rank, (t, logit) in enumerate(entries, 1)]


def _noise_case(noise_shift, swap_ref, swap_run, dflash_token=99, dflash_shift=0.0):
    """Reference: prompt 0 is [1, 2, 3] with margins 2.0; at prompt 1's position 2 token 6
    leads token 99 by ``swap_ref``. The grouped no-drafter run agrees everywhere, with
    prompt 0's position 1 margin moved by ``noise_shift`` (the bound). The DFlash run
    agrees up to prompt 1's position 2, where ``dflash_token`` leads 6 by ``swap_run``,
    and moves prompt 0's position 0 margin by ``dflash_shift``."""
    wide = [_pos((t, 8.0), (50, 6.0)) for t in (1, 2, 3)]
    ref1 = _out([4, 5, 6], top=[_pos((4, 8.0), (50, 6.0)), _pos((5, 8.0), (50, 6.0)),
                                _pos((6, 8.0), (99, 8.0 - swap_ref), (51, 1.0))])
    ref = _reference([[_out([1, 2, 3], top=wide), ref1]] * 2)
    moved = [list(p) for p in wide]
    moved[1] = _pos((2, 8.0), (50, 6.0 - noise_shift))
    noise = {"ok": True, "groups": {"2": [_out([1, 2, 3], top=moved), ref1]}}
    own = [list(p) for p in wide]
    own[0] = _pos((1, 8.0), (50, 6.0 + dflash_shift))
    run_top = ref1["top"][:2] + [_pos((dflash_token, 8.0), (6, 8.0 - swap_run), (52, 1.0))]
    dflash = {"ok": True, "groups": {"2": [_out([1, 2, 3], top=own), _out([4, 5, dflash_token], top=run_top)]}}
    return rs.within_batch_noise(ref, dflash, noise, "trained-refgroups-bf16")


def test_a_swap_no_wider_than_the_targets_own_batch_noise_is_within():
    v = _noise_case(noise_shift=0.5, swap_ref=0.125, swap_run=0.25)
    assert v["margin_bound"] == 0.5 and v["widest_swing"] == 0.375
    assert (v["explained"], v["unmeasured"], v["unexplained"], v["within"]) == (1, 0, 0, True)


def test_a_swap_wider_than_the_batch_noise_is_not_within():
    v = _noise_case(noise_shift=0.25, swap_ref=0.25, swap_run=0.125)
    assert v["unexplained"] == 1 and v["within"] is False


def test_a_token_outside_the_listed_logprobs_is_unmeasured_unless_its_bound_is_already_too_wide():
    # Token 77 is not in the reference's list: its margin there is at least 8.0 - 1.0.
    v = _noise_case(noise_shift=0.5, swap_ref=0.125, swap_run=0.125, dflash_token=77)
    assert v["unexplained"] == 1 and v["within"] is False
    # With the reference's last listed logit close, the lower bound stays under the bound.
    ref_close = _noise_case(noise_shift=8.0, swap_ref=0.125, swap_run=0.125, dflash_token=77)
    assert ref_close["unmeasured"] == 1 and ref_close["within"] is None


def test_a_run_whose_own_margins_move_more_than_batching_does_is_not_within():
    v = _noise_case(noise_shift=0.25, swap_ref=0.0625, swap_run=0.0625, dflash_shift=1.0)
    assert v["own_margin_shift"] == 1.0 and v["unexplained"] == 0 and v["within"] is False


def test_without_a_noise_run_there_is_no_noise_verdict():
    ref = _reference([[_out([1])], [_out([1])]])
    run = {"ok": True, "groups": {"1": [_out([1])]}}
    assert rs.within_batch_noise(ref, run, None, "n")["within"] is None
    assert rs.within_batch_noise(ref, run, {"ok": False}, "n")["within"] is None


def test_the_grouped_noise_run_is_the_dflash_engine_without_its_drafter():
    dflash, noise = rs.RUNS["trained-dflash-fa2-cg-bf16"], rs.RUNS["trained-refgroups-bf16"]
    assert dflash.noise == noise.name and noise.reference == dflash.reference
    assert not noise.has_drafter and noise.concurrency == dflash.concurrency
    models = Path("/models")
    kd, kn = rs.trained_engine_kwargs(dflash, models), rs.trained_engine_kwargs(noise, models)
    assert kn["enable_prefix_caching"] is True and "speculative_config" not in kn
    assert {k: v for k, v in kd.items() if k != "speculative_config"} == kn


def test_ablation_runs_revert_each_drafter_side_patch_of_the_series_and_carry_that_trees_hash():
    from launcher.patching.series import series_for

    ids = {p.id for p in series_for("0.21.0").patches}
    ablation = {n: s for n, s in rs.RUNS.items() if s.revert and s.vllm == "0.21.0" and s.capture_drafts}
    assert {s.revert for s in ablation.values()} == set(rs.DRAFTER_SIDE_PATCHES["0.21.0"]) <= ids
    for name, spec in ablation.items():
        assert spec.capture_drafts and spec.drafter == "trained" and name.endswith(f"-without-{spec.revert}")
        # The record names the hash stamped on the tree the run imported, not the merge's.
        assert rs._series_of(spec, {"series_hash": "less-" + spec.revert}, {"series_hash": "full"}) \
            == "less-" + spec.revert
    capture = rs.RUNS["trained-dflash-trained-fa2-cg-bf16-capture"]
    assert rs._series_of(capture, {}, {"series_hash": "full"}) == "full"  # raw records of before 2026-11-27
    assert len({json.dumps(s.key(), sort_keys=True) for s in [capture, *ablation.values()]}) == 1 + len(ablation)


def test_v33_trained_runs_allow_images_are_judged_by_v33_trained_references_and_ablate_0_33s_patch():
    from launcher.patching.series import series_for

    v33 = {n: r for n, r in rs.RUNS.items() if r.vllm == "0.33.0" and r.trained}
    names = set(v33)
    assert {"v33-trained-ref-bf16", "v33-trained-dflash-fa2-cg-bf16", "v33-trained-stock-fa2-cg-bf16",
            "v33-trained-oracle-fa2-cg-bf16-smallkv-bi-noinductor",
            "v33-trained-dflash-trained-fa2-cg-bf16-capture"} <= names
    for r in v33.values():
        assert r.image_limit == 1 and r.mm_prefix and r.flash_attn_version == 2
        ref = rs.reference_for(r)
        if r.mode == "dflash":
            assert ref.vllm == "0.33.0" and ref.trained and ref.quant == r.quant
            assert ref.batch_invariant == r.batch_invariant and ref.compile_backend == r.compile_backend
    oracles = [r for r in v33.values() if r.oracle]
    assert any(r.kv_blocks for r in oracles) and any(not r.kv_blocks for r in oracles)
    reverted = {r.revert for r in v33.values() if r.revert}
    assert reverted == set(rs.DRAFTER_SIDE_PATCHES["0.33.0"]) <= {p.id for p in series_for("0.33.0").patches}


def test_the_trace_run_without_0014_reverts_a_patch_of_the_series_and_traces():
    from launcher.patching.series import series_for

    spec = rs.RUNS["trained-dflash-fa2-cg-bf16-smallkv-trace-bi-noinductor-without-dflash-lookahead-slots-at-prefill"]
    assert spec.revert in {p.id for p in series_for("0.21.0").patches}
    assert spec.trace_inputs and spec.kv_blocks == rs.TRAINED_SMALL_POOL and spec.batch_invariant
    assert rs._series_of(spec, {"series_hash": "less"}, {"series_hash": "full"}) == "less"


def test_a_run_records_the_series_hash_stamped_on_the_tree_it_imported(tmp_path):
    from launcher.patching.stamp import STAMP_REL

    tree = tmp_path / "site-reverted"
    (tree / STAMP_REL).parent.mkdir(parents=True)
    (tree / STAMP_REL).write_text(json.dumps({"series_hash": "abc123", "patches": []}))
    assert rs.run_tree_hash(f"{tree}:/tmp/site") == "abc123"
    assert rs.run_tree_hash(str(tmp_path / "stock")) is None and rs.run_tree_hash(None) is None


def test_offline_acceptance_is_judged_without_torch():
    # --merge-only runs where no torch is installed; the offline reference is pure Python.
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None; sys.path.insert(0, 'tests/gpu'); import gpu_paths; import realshape as rs; "
            "print(rs.offline_acceptance({'per_prompt_steps': [[3, 0], [15]]}, (1, 2))['mean_acceptance_length'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    # Groups (1, 2): prompt 0 twice, prompt 1 once: steps 3, 0, 3, 0, 15 -> 1 + 21/5.
    assert out.stdout.strip() == "5.2"


def test_a_run_that_ends_early_or_lost_its_logprobs_is_not_within_the_noise():
    ref = _reference([[_out([1, 2, 3]), _out([4, 5, 6])]] * 2)
    noise = {"ok": True, "groups": {"2": [_out([1, 2, 3]), _out([4, 5, 6])]}}
    short = {"ok": True, "groups": {"2": [_out([1, 2]), _out([4, 5, 6])]}}
    v = rs.within_batch_noise(ref, short, noise, "n")
    assert v["unexplained"] == 1 and v["within"] is False
    bare = {"ok": True, "groups": {"2": [{"prompt_len": 3, "token_ids": [1, 9, 3], "top": []}, _out([4, 5, 6])]}}
    v = rs.within_batch_noise(ref, bare, noise, "n")
    assert v["unexplained"] == 1 and v["within"] is False


def test_no_noise_verdict_on_a_moving_reference_or_across_targets():
    noise = {"ok": True, "groups": {"1": [_out([1, 2, 3])]}}
    run = {"ok": True, "groups": {"1": [_out([1, 2, 3])]}}
    moving = _reference([[_out([1, 2, 3])], [_out([1, 2, 4])]])
    assert rs.within_batch_noise(moving, run, noise, "n")["within"] is None
    ref = dict(_reference([[_out([1, 2, 3])]] * 2), target_sha256="a")
    other = dict(noise, target_sha256="b")
    v = rs.within_batch_noise(ref, dict(run, target_sha256="a"), other, "n")
    assert v["within"] is None and "different targets" in v["reason"]


def test_merge_keeps_a_retrained_drafters_runs_beside_the_last_drafters():
    base = {"name": "trained-x-capture", "vllm": "0.21.0", "series": "6361", "mode": "dflash",
            "drafter_kind": "trained", "capture_drafts": True, "ok": True}
    old = dict(base, drafter_sha256="0d50", acceptance=2.80)
    again_old = dict(base, drafter_sha256="0d50", acceptance=2.81)
    new = dict(base, drafter_sha256="d46b", acceptance=3.01)
    assert rs.merge([old], [new]) == [old, new]
    # the same drafter's rerun still replaces its record
    assert rs.merge([old, new], [again_old]) == [new, again_old]
    # random drafters are one configuration whatever their bytes
    rand = dict(base, drafter_kind="random", drafter_sha256="aaaa")
    assert rs.merge([rand], [dict(rand, drafter_sha256="bbbb")]) == [dict(rand, drafter_sha256="bbbb")]


def test_merge_keeps_a_retrained_targets_references_beside_the_last_targets():
    ref = {"name": "trained-ref-bf16", "vllm": "0.21.0", "series": "6361", "mode": "reference",
           "target_name": "trained-a4b-r30", "ok": True}
    old = dict(ref, target_sha256="9ee9", tokens=[1])
    new = dict(ref, target_sha256="84c2", tokens=[2])
    assert rs.merge([old], [new]) == [old, new]
    # the same target's rerun replaces its record; a random target is one configuration
    assert rs.merge([old, new], [dict(old, tokens=[3])]) == [new, dict(old, tokens=[3])]
    rand = dict(ref, target_name=rs.RANDOM_TARGET_NAME, target_sha256="aaaa")
    assert rs.merge([rand], [dict(rand, target_sha256="bbbb")]) == [dict(rand, target_sha256="bbbb")]


def test_merge_takes_a_speed_runs_measurement_as_one_configuration():
    base = {"name": "trained-speed-x", "vllm": "0.21.0", "series": "6361", "mode": "dflash", "ok": True}
    first = dict(base, speed={"1": {"tok_s": 100.0}})
    again = dict(base, speed={"1": {"tok_s": 104.0}})
    plain = dict(base, name="trained-x")
    assert rs.merge([first, plain], [again]) == [plain, again]


def test_every_noise_run_a_run_names_exists_and_runs_on_its_release():
    for spec in rs.RUNS.values():
        if spec.noise:
            noise = rs.RUNS[spec.noise]
            assert noise.mode == "reference-grouped" and noise.vllm == spec.vllm, spec.name
            assert noise.quant == spec.quant and noise.target == spec.target, spec.name


def test_a_capture_runs_noise_twin_is_its_engine_without_the_drafter_in_its_own_groups():
    """trained-refgroups-bf16 runs 1/4/17/32 with prefix caching; the capture runs 1/8/17 without
    (a cached prefix feeds the drafter no features): its floor must come from its own groups."""
    models = Path("/models")
    for prefix in ("", "v33-"):
        capture = rs.RUNS[f"{prefix}trained-dflash-trained-fa2-cg-bf16-capture"]
        twin = rs.RUNS[capture.noise]
        assert twin.name == f"{prefix}trained-refgroups-bf16-capture" and twin.twin_of == capture.name
        assert not twin.has_drafter and not twin.capture_drafts and twin.concurrency == capture.concurrency
        kc, kt = rs.trained_engine_kwargs(capture, models), rs.trained_engine_kwargs(twin, models)
        assert kt["enable_prefix_caching"] is False and "speculative_config" not in kt
        assert {k: v for k, v in kc.items() if k != "speculative_config"} == kt
        # Its own configuration: a merge keeps it beside the 1/4/17/32 noise run.
        wide = rs.RUNS[f"{prefix}trained-refgroups-bf16"]
        assert twin.key() != wide.key() and wide.concurrency != twin.concurrency
        base = {"vllm": twin.vllm, "ok": True, "target_kind": "trained"}
        merged = rs.merge([dict(base, name=wide.name, **wide.key())], [dict(base, name=twin.name, **twin.key())])
        assert sorted(r["name"] for r in merged) == sorted([wide.name, twin.name])
    # The ablation runs are the capture less a patch, not its noise-named copy.
    assert rs.RUNS["trained-dflash-trained-fa2-cg-bf16-capture-without-dflash-target-layer-ids-offset"].noise is None


def test_an_nvfp4_run_names_its_quantized_copy_and_is_not_judged_against_another(tmp_path):
    """The NVFP4 copy is made per machine (remote.sh's trained_nvfp4, in the trained-target verbs); a reference seeded from
    another machine may have run another copy under the same target_sha256."""
    tt = _load("train_target")
    target = tmp_path / rs.TRAINED_TARGET
    target.mkdir()
    (target / "train-record.json").write_text(json.dumps({"target_sha256": "t"}))
    copy = tmp_path / (rs.TRAINED_TARGET + "-nvfp4")
    copy.mkdir()
    (copy / "model.safetensors").write_bytes(b"nvfp4 weights")
    nvfp4 = rs.target_identity(rs.RUNS["trained-ref-nvfp4"], tmp_path)
    assert nvfp4["target_sha256"] == "t" and nvfp4["quantized_sha256"] == tt.checkpoint_sha256(copy)
    assert "quantized_sha256" not in rs.target_identity(rs.RUNS["trained-ref-bf16"], tmp_path)
    ref = dict(_reference([[_out([1, 2, 3])], [_out([1, 2, 3])]]), target_sha256="t", quantized_sha256="a")
    run = {"ok": True, "target_sha256": "t", "quantized_sha256": "b", "groups": {"1": [_out([1, 2, 3])]}}
    assert rs.judge(ref, run)["reason"].startswith("reference ran another NVFP4 copy")
    assert rs.judge(ref, dict(run, quantized_sha256="a"))["lossless"] is True
    # Records from before the field: judged on target_sha256 alone, as they were.
    assert rs.judge({k: v for k, v in ref.items() if k != "quantized_sha256"}, run)["lossless"] is True


# The log lines vLLM 0.21.0 wrote on 2026-11-28 (decorators.py), folder names shortened.
_SAVED = ("INFO 11-28 00:34:39 [decorators.py:708] saved AOT compiled function to "
          "/root/.cache/vllm/torch_compile_cache/torch_aot_compile/ffe83d1f4c0a/rank_0_0/model")
_LOADED = ("INFO 11-28 00:40:25 [decorators.py:311] Directly load AOT compilation from path "
           "/root/.cache/vllm/torch_compile_cache/torch_aot_compile/ffe83d1f4c0a/rank_0_0/model")


def test_a_run_that_loaded_a_graph_only_another_tree_compiled_is_refused(tmp_path):
    """On 2026-11-28 the ablation without the embed-scale patch loaded the target graph that the
    ablation without the layer-offset patch had compiled (the AOT key ignores the runner's aux
    hidden-state layers): its drafter was fed the layers one too early (feature cosine 0.973)."""
    rm = _load("run_modes")
    assert rm.parse_log(_SAVED + "\n" + _SAVED)["compile_artifacts"] == {"saved": ["ffe83d1f4c0a"], "loaded": []}
    raws = {"without-offset": {"series_hash": "5ae8", "compile_artifacts": rm.parse_log(_SAVED)["compile_artifacts"]},
            "without-embed": {"series_hash": "a5c4", "compile_artifacts": rm.parse_log(_LOADED)["compile_artifacts"]},
            # the same tree loading its own graph is what the cache is for
            "again-offset": {"series_hash": "5ae8", "compile_artifacts": {"saved": [], "loaded": ["ffe83d1f4c0a"]}}}
    stale = rs.stale_compile_artifacts(raws)
    assert stale == {"without-embed": [{"artifact": "ffe83d1f4c0a", "saved_by": ["without-offset"], "trees": ["5ae8"]}]}
    spec = rs.RUNS["trained-dflash-trained-fa2-cg-bf16-capture-without-gemma4-dflash-embed-scale-logit-softcap"]
    rec = rs.record(spec, {"ok": True, "stale_compile_artifacts": stale["without-embed"]}, None, {})
    assert rec["ok"] is False and "without-offset" in rec["error"] and rec["stale_compile_artifacts"]
    # A raw record written before the field: the merge reads it from the run's log.
    log = tmp_path / "r.log"
    log.write_text(_LOADED + "\n")
    assert rs._with_compile_artifacts({}, log)["compile_artifacts"]["loaded"] == ["ffe83d1f4c0a"]
    assert rs._with_compile_artifacts({"compile_artifacts": {}}, log) == {"compile_artifacts": {}}


def test_each_vllm_tree_compiles_into_a_cache_folder_of_its_own(tmp_path):
    from launcher.patching.stamp import STAMP_REL

    trees = []
    for h in ("5ae8d1737c608923e2da", "a5c42b2df27238f148ca"):
        tree = tmp_path / h
        (tree / STAMP_REL).parent.mkdir(parents=True)
        (tree / STAMP_REL).write_text(json.dumps({"series_hash": h, "patches": []}))
        trees.append(f"{tree}:/tmp/site")
    roots = {rs.compile_cache_root({"VLLM_CACHE_ROOT": "/c"}, "0.21.0", t) for t in trees}
    assert roots == {Path("/c/trees/0.21.0-5ae8d1737c608923"), Path("/c/trees/0.21.0-a5c42b2df27238f1")}
    assert rs.compile_cache_root({}, "0.33.0", str(tmp_path / "stock")) == \
        Path.home() / ".cache" / "vllm" / "trees" / "0.33.0-stock"


def test_an_nvfp4_run_is_judged_against_the_walk_on_the_nvfp4_model_it_computed(tmp_path):
    """The offline walk on the bf16 target is another model than an NVFP4 run's; nvfp4_reference.py
    walks the NVFP4 target as W4A4 (FP4 GEMMs, emulation) and W4A16 (Hopper's Marlin)."""
    tt = _load("train_target")
    models = tmp_path
    copy = models / (rs.TRAINED_TARGET + "-nvfp4")
    copy.mkdir()
    (copy / "model.safetensors").write_bytes(b"nvfp4")
    drafter = models / rs.TRAINED_DRAFTER_TRAINED
    drafter.mkdir()
    steps = {"per_prompt_steps": [[3, 1], [15]]}
    for numerics, quantized in (("W4A4", tt.checkpoint_sha256(copy)), ("W4A16", tt.checkpoint_sha256(copy)),
                                ("W4A8", "another-copy")):
        (drafter / f"nvfp4-evaluation-{numerics}.json").write_text(json.dumps(
            {"numerics": numerics, "drafter_sha256": "d46b", "quantized_sha256": quantized,
             "evaluation": {"vllm-0.21.0": steps}}))
    spec = rs.RUNS["trained-dflash-trained-fa2-cg-nvfp4"]
    (drafter / rs.DRAFTER_RECORD).write_text(json.dumps({"drafter_sha256": "d46b", "evaluation": {}}))
    refs = rs.drafter_identity(spec, models, tt.checkpoint_sha256(copy))["acceptance_reference_nvfp4"]
    assert sorted(refs) == ["W4A16", "W4A4"]  # the walk on another NVFP4 copy is no reference
    walks = sorted(drafter.glob("nvfp4-evaluation*.json"))
    assert rs.nvfp4_walks(walks, spec, "other-drafter", tt.checkpoint_sha256(copy)) == {}
    bf16 = {"mean_acceptance_length": 2.9}
    raw = {"acceptance_reference": bf16, "acceptance_reference_nvfp4": {"W4A4": {"mean_acceptance_length": 2.5}},
           "log_text_for_backends": ["Using EmulationNvFp4LinearKernel for NVFP4 GEMM"]}
    fields = rs.drafter_fields(raw, {"mean_acceptance_length": 2.4})
    assert fields["acceptance_reference_model"] == "nvfp4-W4A4" and fields["acceptance_ratio_to_reference"] == 0.96
    marlin = raw | {"log_text_for_backends": ["Using MarlinNvFp4LinearKernel for NVFP4 GEMM"]}
    # No W4A16 walk here: the bf16 one, said so.
    assert rs.drafter_fields(marlin, None)["acceptance_reference_model"] == "bf16"
    assert rs.drafter_fields({"acceptance_reference": bf16}, None)["acceptance_reference"] == bf16


def test_a_merge_judges_earlier_nvfp4_runs_against_a_walk_that_ran_their_copy(tmp_path):
    raw_dir, walks = tmp_path / "raw", tmp_path / "walks"
    raw_dir.mkdir()
    walks.mkdir()
    name = "v33-trained-dflash-trained-fa2-cg-nvfp4"
    counters = {"spec_drafts": 100, "spec_accepted_tokens": 135}
    (raw_dir / f"{name}.raw.json").write_text(json.dumps(
        {"name": name, "ok": True, "drafter_sha256": "d46b", "quantized_sha256": "f875", "counters": counters,
         "acceptance_reference": {"mean_acceptance_length": 2.83},
         "log_text_for_backends": ["Using MarlinNvFp4LinearKernel for NVFP4 GEMM"]}))
    for numerics, copy in (("W4A16", "f875"), ("W4A4", "f875"), ("W4A16", "another")):
        (walks / f"nvfp4-evaluation-{numerics}-{copy}.json").write_text(json.dumps(
            {"numerics": numerics, "drafter_sha256": "d46b", "quantized_sha256": copy,
             "evaluation": {"vllm-0.33.0": {"per_prompt_steps": [[1, 2], [0]] if copy == "f875" else [[15]]}}}))
    out = tmp_path / "realshape.json"
    assert rs.main(["--merge-only", "--models", str(tmp_path / "m"), "--vllm", "0.33.0", "--raw-dir", str(raw_dir),
                    "--nvfp4-walks", str(walks), "--out", str(out)]) == 0
    (rec,) = [r for r in json.loads(out.read_text()) if r["name"] == name]
    assert rec["acceptance_reference_model"] == "nvfp4-W4A16"  # Marlin: weights only
    assert rec["acceptance_reference"]["mean_acceptance_length"] < 2.83
    # A run that ended while the walks ran beside it (2026-11-28) holds W4A4 alone: the merge
    # adds the W4A16 walk its Marlin kernels need, and keeps the one it has.
    own = {"mean_acceptance_length": 2.5}
    raw = json.loads((raw_dir / f"{name}.raw.json").read_text())
    (raw_dir / f"{name}.raw.json").write_text(json.dumps(raw | {"acceptance_reference_nvfp4": {"W4A4": own}}))
    walks_of = rs.load_raws(raw_dir, walks)[name]["acceptance_reference_nvfp4"]
    assert walks_of["W4A4"] == own and walks_of["W4A16"]["mean_acceptance_length"] < 2.83


def test_the_noise_bound_at_the_99th_percentile_is_not_the_widest_move():
    """bars.yaml's noise procedure (issue 51): one wide move of the no-drafter twin among 203
    does not set the bound; the 99th percentile of all its moves does."""
    assert rs.percentile([float(i) for i in range(1, 101)], 99) == 99.0
    assert rs.percentile([0.1] * 99 + [5.0], 99) == 0.1
    assert rs.percentile([], 99) == 0.0
    flat = [_pos((1, 8.0), (50, 6.0)) for _ in range(200)]
    ref1 = _out([4, 5, 6], top=[_pos((4, 8.0), (50, 6.0)), _pos((5, 8.0), (50, 6.0)),
                                _pos((6, 8.0), (99, 8.0 - 0.125), (51, 1.0))])
    ref = _reference([[_out([1] * 200, top=flat), ref1]] * 2)
    # the twin: one margin moved by 1.0, 199 by 0.0625, prompt 1 unmoved
    moved = [_pos((1, 8.0), (50, 6.0 - (1.0 if t == 0 else 0.0625))) for t in range(200)]
    noise = {"ok": True, "groups": {"2": [_out([1] * 200, top=moved), ref1]}}
    run_top = ref1["top"][:2] + [_pos((99, 8.0), (6, 8.0 - 0.25), (52, 1.0))]
    dflash = {"ok": True, "groups": {"2": [_out([1] * 200, top=flat), _out([4, 5, 99], top=run_top)]}}
    v = rs.within_batch_noise(ref, dflash, noise, "trained-refgroups-bf16")
    assert v["margin_bound"] == 1.0 and v["within"] is True  # the swing 0.375 is under the widest move
    assert v["margin_moves"] == 203 and v["margin_bound_p99"] == 0.0625
    assert v["unexplained_p99"] == 1 and v["within_p99"] is False
