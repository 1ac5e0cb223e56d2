"""CPU-side parts of the step-time benchmark (tests/gpu/runs/bench_steps.py, reports/bench_report.py, models/make_bench_checkpoints.py).

What cannot run here is vLLM on a GPU. What runs: the released widths and the
layer pattern, the checkpoint generator at tiny widths (files written and
read back; the NVFP4 one checked by the project's checkpoint inspector and
replayed through vLLM 0.21.0's Gemma 4 weight loader, read from the released
wheel; the bf16 one loaded by transformers), the report arithmetic on
made-up step records, and the parent's scheduling of engine subprocesses
(stand-in children: a stand-in for an engine is what needs a GPU).
"""

from __future__ import annotations

import json
import math
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

GPU_DIR = Path(__file__).resolve().parents[1] / "gpu"
sys.path.insert(0, str(GPU_DIR))

import bench_report as br  # noqa: E402
import bench_shapes as bs  # noqa: E402

from launcher.checkpoint import inspect_target, read_tensor_index  # noqa: E402

# ----------------------------------------------------------------- released widths


def test_layer_pattern_is_the_released_five_to_one():
    assert bs.layer_types(30).count("full_attention") == 5
    assert bs.layer_types(30)[5::6] == ["full_attention"] * 5
    assert bs.layer_types(bs.BENCH_LAYERS) == ["sliding_attention"] * 5 + ["full_attention"]


def test_target_config_carries_the_released_widths():
    text = bs.target_config()["text_config"]
    assert (text["hidden_size"], text["num_attention_heads"]) == (2816, 16)
    assert (text["head_dim"], text["num_key_value_heads"]) == (256, 8)
    assert (text["global_head_dim"], text["num_global_key_value_heads"]) == (512, 2)
    assert text["attention_k_eq_v"] is True
    assert (text["num_experts"], text["top_k_experts"], text["moe_intermediate_size"]) == (128, 8, 704)
    assert text["vocab_size"] == 262144 and text["num_hidden_layers"] == bs.BENCH_LAYERS
    assert bs.target_config()["image_token_id"] < text["vocab_size"]


def test_released_depth_has_the_published_parameter_counts():
    """Built by transformers at 30 layers: 25.2B parameters, 3.8B active per token
    (Google's figures for the 26B-A4B) -- an independent check of every width."""
    from make_bench_checkpoints import hf_state_shapes

    shapes = hf_state_shapes(bs.target_config(30))
    lang = {n: math.prod(s) for n, s in shapes.items() if "language_model" in n}
    experts = sum(v for n, v in lang.items() if ".experts." in n)
    total = sum(lang.values())
    active = total - experts + experts * 8 / 128
    assert abs(total / 25.2e9 - 1) < 0.01, total
    assert abs(active / 3.8e9 - 1) < 0.01, active


def test_drafter_config_is_the_released_one_with_taps_fitted():
    cfg = bs.drafter_config()
    assert cfg["num_hidden_layers"] == 5 and cfg["layer_types"][-1] == "full_attention"
    assert cfg["layer_types"].count("sliding_attention") == 4 and cfg["sliding_window"] == 2048
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (32, 8, 128)
    assert cfg["intermediate_size"] == 5632 and cfg["dflash_config"]["mask_token_id"] == 4
    # Shifted by one (patch dflash-target-layer-ids-offset), every tap stays inside 6 layers.
    taps = cfg["dflash_config"]["target_layer_ids"]
    assert taps == [0, 1, 2, 3, 4] and max(taps) + 1 < bs.BENCH_LAYERS
    assert bs.drafter_taps(30) == list(range(6))  # the released six at full depth


def test_engine_runs_capture_exactly_the_measured_shapes():
    decode, verify = bs.run_by_name("bf16-decode-locked"), bs.run_by_name("bf16-dflash-fa3")
    assert decode.capture_sizes == [1, 4, 16, 32]
    assert verify.capture_sizes == [16, 64, 256, 512]
    kw = verify.engine_kwargs("/t", "/d")
    assert kw["speculative_config"]["num_speculative_tokens"] == 15
    assert kw["attention_config"] == {"backend": "TRITON_ATTN", "flash_attn_version": 3}
    per_layer = bs.run_by_name("bf16-decode-per-layer").engine_kwargs("/t", None)
    assert per_layer["language_model_only"] is True and "backend" not in per_layer["attention_config"]
    assert per_layer["attention_config"]["flash_attn_version"] == 2
    assert per_layer["max_model_len"] > bs.CONTEXTS["64k"]
    with pytest.raises(KeyError, match="unknown engine run"):
        bs.run_by_name("nope")


# ----------------------------------------------------------------- checkpoints


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from make_bench_checkpoints import main

    out = tmp_path_factory.mktemp("bench-ckpt")
    assert main([str(out), "--tiny", "--device", "cpu"]) == 0
    return out


def test_nvfp4_tensors_have_modelopt_layout(tiny):
    cfg = json.loads((tiny / "gemma4-bench-nvfp4" / "config.json").read_text())["text_config"]
    tensors = read_tensor_index(tiny / "gemma4-bench-nvfp4")
    h, inter, experts = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["num_experts"]
    for layer in range(bs.BENCH_LAYERS):
        p = f"model.language_model.layers.{layer}."
        head = cfg["global_head_dim"] if layer == 5 else cfg["head_dim"]
        checks = {p + "self_attn.o_proj": (h, cfg["num_attention_heads"] * head),
                  p + f"experts.{experts - 1}.up_proj": (inter, h),
                  p + "experts.0.down_proj": (h, inter)}
        for module, (rows, cols) in checks.items():
            assert tensors[f"{module}.weight"].dtype == "U8"
            assert tensors[f"{module}.weight"].shape == (rows, cols // 2)
            assert tensors[f"{module}.weight_scale"].dtype == "F8_E4M3"
            assert tensors[f"{module}.weight_scale"].shape == (rows, cols // 16)
            for scalar in ("weight_scale_2", "input_scale"):
                assert tensors[f"{module}.{scalar}"].dtype == "F32" and tensors[f"{module}.{scalar}"].shape == ()
        assert (p + "self_attn.v_proj.weight" in tensors) == (layer != 5)  # K=V on the full layer
        assert tensors[p + "router.proj.weight"].dtype == "BF16"
    assert tensors["model.language_model.embed_tokens.weight"].dtype == "BF16"
    assert not any("gate_up_proj" in n for n in tensors)


def test_nvfp4_checkpoint_is_recognised_as_modelopt(tiny):
    quant = json.loads((tiny / "gemma4-bench-nvfp4" / "hf_quant_config.json").read_text())["quantization"]
    assert (quant["quant_algo"], quant["group_size"]) == ("NVFP4", 16)
    info, reasons = inspect_target(tiny / "gemma4-bench-nvfp4", expected_format="modelopt-nvfp4",
                                   vllm_version="0.21.0")
    assert info.format == "modelopt-nvfp4"
    assert [r.message for r in reasons if r.blocking] == []


def test_nvfp4_dequantized_weight_has_about_the_init_std(tiny):
    import torch
    from safetensors.torch import load_file

    index = json.loads((tiny / "gemma4-bench-nvfp4" / "model.safetensors.index.json").read_text())
    name = "model.language_model.layers.0.experts.0.gate_proj"
    t = load_file(str(tiny / "gemma4-bench-nvfp4" / index["weight_map"][name + ".weight"]))
    codes = torch.stack([t[name + ".weight"] & 0xF, t[name + ".weight"] >> 4], -1).flatten(-2)
    e2m1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])
    scale = t[name + ".weight_scale"].float().repeat_interleave(16, -1) * t[name + ".weight_scale_2"]
    std = (e2m1[codes.long()] * scale).std().item()
    assert 0.5 * bs.INIT_STD < std < 2 * bs.INIT_STD


@pytest.mark.network
def test_every_target_tensor_maps_onto_a_vllm_021_parameter(tiny):
    from launcher import pypi
    from tests.integration.vllm_gemma4_names import Gemma4Loader

    loader = Gemma4Loader.read(pypi.unpacked("vllm", "0.21.0", "site-packages") / "vllm")
    for variant in ("gemma4-bench-nvfp4", "gemma4-bench-bf16"):
        tensors = read_tensor_index(tiny / variant)
        unmapped = []
        for name, meta in tensors.items():
            model_name = loader.to_model_name(name)
            if model_name is None:
                assert name.startswith(("model.vision_tower.", "model.embed_vision.")), name
            elif model_name.endswith(("moe.gate_up_proj", "moe.down_proj")):
                # bf16 only: renamed by vLLM's _weight_iterator, which then splits
                # these 3D tensors ([E, 2I, H] / [E, H, I]) per expert.
                assert variant.endswith("bf16") and len(meta.shape) == 3
            elif not loader.resolve(loader.to_parameter(model_name)):
                unmapped.append(name)
        assert unmapped == [], variant


def test_bf16_checkpoint_loads_in_transformers_and_runs(tiny):
    import torch
    from transformers import Gemma4ForConditionalGeneration

    model, info = Gemma4ForConditionalGeneration.from_pretrained(
        tiny / "gemma4-bench-bf16", dtype=torch.bfloat16, output_loading_info=True)
    assert not info["missing_keys"]
    assert not info["unexpected_keys"]
    norm = model.model.language_model.layers[0].post_attention_layernorm.weight
    assert torch.equal(norm, torch.full_like(norm, bs.POST_NORM_SCALE))  # both rounded to bf16
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[11, 12, 13]])).logits
    assert torch.isfinite(logits).all()


def test_drafter_checkpoint_matches_its_config(tiny):
    cfg = json.loads((tiny / "dflash-bench" / "config.json").read_text())
    tensors = read_tensor_index(tiny / "dflash-bench")
    taps = len(cfg["dflash_config"]["target_layer_ids"])
    assert tensors["fc.weight"].shape == (cfg["hidden_size"], cfg["hidden_size"] * taps)
    assert tensors["layers.4.mlp.gate_proj.weight"].shape == (cfg["intermediate_size"], cfg["hidden_size"])
    assert not any(n.startswith(("embed_tokens", "lm_head")) for n in tensors)


# ----------------------------------------------------------------- report arithmetic


def _phase(step, forward, logits, propose=None, tokens=1, n=10, wall=(1.0, 0.6), steps=(48, 8)):
    rows = [{"step_ms": step, "forward_ms": forward, "logits_ms": logits, "forward_tokens": tokens,
             **({"propose_ms": propose} if propose is not None else {})} for _ in range(n)]
    rows.insert(0, {"step_ms": 99.0, "forward_ms": 90.0, "forward_tokens": tokens * 64})  # prefill step
    return {"forward_tokens": tokens, "steps": rows, "wall_long_s": wall[0], "wall_short_s": wall[1],
            "steps_long": steps[0], "steps_short": steps[1]}


def _records():
    decode = {"ok": True, "vllm": "0.21.0", "device": "GPU X",
              "phases": {f"decode-b{b}": _phase(10.0, 6.0, 1.0, tokens=b) for b in bs.BATCHES}}
    fa3 = {"ok": True, "phases": {f"verify-b{b}": _phase(20.0, 8.0, 2.0, propose=4.0, tokens=16 * b)
                                  for b in bs.BATCHES}}
    fa2 = {"ok": True, "phases": {f"verify-b{b}": _phase(21.0, 8.0, 2.0, propose=5.0, tokens=16 * b)
                                  for b in bs.BATCHES}}
    return {"bf16-decode-locked": decode, "bf16-dflash-fa3": fa3, "bf16-dflash-fa2": fa2}


def test_steps_extrapolate_and_subtract_the_drafter():
    steps = br.steps_ms(_records())["bf16"]
    # decode30 = step + 4 * forward; the prefill row is not a steady step
    assert steps["decode"]["1"]["decode_30"] == pytest.approx(10.0 + 4 * 6.0)
    assert steps["decode"]["1"]["measured_6_layers"]["wall_ms"] == pytest.approx(1000 * 0.4 / 40)
    # verify = step - propose, then + 4 * forward; verify comes from the FA3 engine
    assert steps["verify"]["16"] == pytest.approx(20.0 - 4.0 + 4 * 8.0)
    assert steps["draft"] == {"flash_attn_fa3": {b: 4.0 for b in ("1", "4", "16", "32")},
                              "flash_attn_fa2": {b: 5.0 for b in ("1", "4", "16", "32")}}


def test_projection_and_ratios():
    steps = br.steps_ms(_records())
    ratios, proj = br.ratios_and_projection(steps)
    t_dec, t_ver = 34.0, 48.0
    assert proj["bf16"]["flash_attn_fa3"]["1"]["2"] == pytest.approx(round(2 * t_dec / (4.0 + t_ver), 3))
    assert proj["bf16"]["flash_attn_fa2"]["32"]["8"] == pytest.approx(round(8 * t_dec / (5.0 + t_ver), 3))
    assert proj["bf16"]["flash_attn_fa3"]["4"]["humaneval"] == pytest.approx(round(7.73 * t_dec / 52.0, 3))
    assert proj["bf16"]["flash_attn_fa3"]["4"]["mt-bench"] == pytest.approx(round(4.25 * t_dec / 52.0, 3))
    assert ratios["bf16"]["flash_attn_fa2"]["1"] == {
        "draft_over_verify": round(5.0 / t_ver, 4), "verify_over_decode": round(t_ver / t_dec, 4), "draft_from": "bf16"}
    assert proj["projected"] is True and proj["taus"] == [2, 3, 4, 5, 6, 7, 8]


def test_nvfp4_projection_borrows_the_bf16_drafter_time():
    recs = _records()
    recs["nvfp4-decode-locked"] = recs["bf16-decode-locked"]
    recs["nvfp4-dflash-fa3"] = recs["bf16-dflash-fa3"]
    ratios, _ = br.ratios_and_projection(br.steps_ms(recs))
    assert ratios["nvfp4"]["flash_attn_fa3"]["1"]["draft_from"] == "nvfp4"
    assert ratios["nvfp4"]["flash_attn_fa2"]["1"]["draft_from"] == "bf16"


def test_breakdown_splits_the_forward_by_kernel_mix():
    recs = _records()
    recs["bf16-decode-locked"]["profile"] = {"decode-b1": {"steps": 2, "kernels": [
        ["ProfilerStep*", 20000.0, 2], ["bench::forward", 12000.0, 2],  # markers, not kernels
        ["kernel_unified_attention_2d", 2000.0, 12], ["fused_moe_kernel", 6000.0, 12],
        ["nvjet_gemm", 2000.0, 24]]}}
    b = br.breakdown(recs)["bf16-decode-locked/decode-b1"]
    assert b["kernel_scope"] == "step"
    assert b["kernels_ms_per_step"] == {"attention": 1.0, "moe": 3.0, "other": 1.0}
    assert b["coverage"] == pytest.approx(0.5)
    assert [r[0] for r in b["top_kernels"]] == ["kernel_unified_attention_2d", "fused_moe_kernel", "nvjet_gemm"]
    # Step scope, no drafter: attention 1 ms and MoE 3 ms as measured, the other 2 ms of the
    # 6 ms forward is "other"; times 5 layer-blocks. LM head 1 ms; rest 10 - 6 - 1 = 3 ms.
    assert b["per_30_layers_ms"] == {"attention": 5.0, "moe": 15.0, "other_forward": 10.0, "lm_head": 1.0,
                                     "drafter": 0.0, "rest": 3.0}
    assert sum(b["per_30_layers_share"].values()) == pytest.approx(1.0, abs=0.01)


def test_breakdown_gives_no_split_when_drafter_kernels_are_mixed_in():
    recs = _records()
    recs["bf16-dflash-fa3"]["profile"] = {"verify-b1": {"steps": 1, "kernels": [
        ["flash_fwd_kernel", 9000.0, 5], ["fused_moe_kernel", 4000.0, 6]]}}
    b = br.breakdown(recs)["bf16-dflash-fa3/verify-b1"]
    assert b["kernel_scope"] == "step" and "per_30_layers_ms" not in b
    assert b["split"].startswith("none")


def test_breakdown_prefers_the_kernels_inside_the_target_forward():
    recs = _records()
    recs["bf16-dflash-fa3"]["profile"] = {"verify-b1": {"steps": 1, "kernels": [["flash_fwd_kernel", 9000.0, 5]],
                                                         "ranges": {"forward": [["kernel_unified_attention_2d", 2000.0, 6],
                                                                                ["fused_moe_kernel", 4000.0, 6]]}}}
    b = br.breakdown(recs)["bf16-dflash-fa3/verify-b1"]
    assert b["kernel_scope"] == "forward"  # the drafter's flash kernels stay out of the target's split
    assert b["coverage"] == pytest.approx(6.0 / 8.0)
    assert b["per_30_layers_ms"]["attention"] == pytest.approx(8.0 / 3 * 5, abs=1e-3)
    assert b["per_30_layers_ms"]["drafter"] == 4.0


def test_classify_kernel_names():
    assert br.classify("flash_fwd_splitkv_kernel") == "attention"
    assert br.classify("_fwd_kernel_unified_attention_3d") == "attention"
    assert br.classify("Marlin<moe>") == "moe"
    assert br.classify("fused_moe_kernel") == "moe"
    assert br.classify("void cutlass::Kernel2<gemm>") == "other"


def _ctx_phase(step, wall_long, tokens):
    p = _phase(step, 5.0, 1.0, wall=(wall_long, 0.1), steps=(64, 8))
    p["outputs"] = [{"prompt_len": 100, "token_ids": tokens, "top": [[[t, 10.0, 1], [t + 1, 9.0, 2]] for t in tokens]}]
    return p


def test_json_shape_and_per_layer_backend():
    from compare import verdict

    recs = _records()
    locked, patched = recs["bf16-decode-locked"], {"ok": True, "phases": {}}
    recs["bf16-decode-per-layer"] = patched
    for label in bs.CONTEXTS:
        locked["phases"][f"ctx-{label}"] = _ctx_phase(8.0, 0.66, [5, 6, 7])
        patched["phases"][f"ctx-{label}"] = _ctx_phase(5.0, 0.38, [5, 6, 7])
    for rec, toks in ((locked, [5, 6, 7]), (patched, [5, 6, 7])):
        rec["phases"]["lossless-short"] = {"outputs": _ctx_phase(1.0, 1.0, toks)["outputs"]}
    locked["phases"]["lossless-short-alone"] = {"outputs": _ctx_phase(1.0, 1.0, [5, 6, 8])["outputs"]}
    doc = br.build(recs, {"device": "GPU X"}, verdict)
    assert doc["per_layer_backend"]["noise_floor"]["lossless"] is False  # 8 vs 7: not a tie
    assert {"ratios", "steps_ms", "projection", "per_layer_backend", "device", "vllm", "breakdown"} <= set(doc)
    plb = doc["per_layer_backend"]
    assert plb["patch_id"] == bs.PER_LAYER_PATCH_ID
    assert set(plb["decode_speedup"]) == {"2k", "16k", "64k"}
    # wall per step: (0.66 - 0.1) / 56 vs (0.38 - 0.1) / 56
    assert plb["decode_speedup"]["16k"] == pytest.approx(0.56 / 0.28, rel=1e-3)
    assert plb["decode_speedup_gpu"]["16k"] == pytest.approx(8.0 / 5.0)
    # Both forwards take 5 ms: no kernel speed-up; at 30 layers 8 + 4*5 vs 5 + 4*5.
    assert plb["decode_speedup_forward"]["16k"] == pytest.approx(1.0)
    assert plb["decode_speedup_30"]["16k"] == pytest.approx(28.0 / 25.0, rel=1e-3)
    assert plb["lossless"] is True
    json.dumps(doc)
    md = br.markdown(doc)
    assert "Projected DFlash speed-up (not measured)" in md and "| 16k |" in md


def test_per_layer_divergence_beyond_a_tie_is_not_lossless():
    from compare import verdict

    recs = _records()
    recs["bf16-decode-per-layer"] = {"ok": True, "phases": {}}
    recs["bf16-decode-locked"]["phases"]["ctx-2k"] = _ctx_phase(8.0, 0.66, [5, 6, 7])
    recs["bf16-decode-per-layer"]["phases"]["ctx-2k"] = _ctx_phase(5.0, 0.38, [5, 9, 7])
    plb = br.build(recs, {}, verdict)["per_layer_backend"]
    assert plb["lossless"] is False and plb["lossless_detail"]["divergences"][0]["position"] == 1


def test_report_survives_failed_and_missing_runs():
    from compare import verdict

    doc = br.build({"bf16-decode-locked": {"ok": False, "error": "boom"}}, {}, verdict)
    assert doc["steps_ms"] == {} and doc["projection"]["formula"] == br.FORMULA
    assert "missing" in doc["per_layer_backend"] and doc["runs"]["bf16-decode-locked"]["error"] == "boom"


# ----------------------------------------------------------------- scheduling

# A stand-in engine (no GPU here): starts, says ready, waits for its turn,
# "measures" while checking that no other engine's heartbeat moves, writes
# its record. Heartbeats stop only if the parent really stopped the process.
FAKE_CHILD = textwrap.dedent("""
    import json, sys, time, threading
    from pathlib import Path
    spec = json.loads(sys.argv[1]); control = Path(spec["control"]); name = spec["run"]
    beat = control / f"{name}.beat"
    def heartbeat():
        tmp = beat.with_suffix(".tmp")
        while True:
            tmp.write_text(str(time.time())); tmp.replace(beat); time.sleep(0.02)
    threading.Thread(target=heartbeat, daemon=True).start()
    time.sleep(0.3 + 0.1 * len(name) % 3)
    if name == "bf16-dflash-flex":
        raise SystemExit(3)  # a failed engine start
    (control / f"{name}.ready").touch()
    while not (control / f"{name}.go").exists():
        time.sleep(0.05)
    time.sleep(0.1)  # a write already in a system call when the others were stopped still lands
    others = [p for p in control.glob("*.beat") if p != beat]
    before = {p: p.read_text() for p in others}
    time.sleep(0.4)
    moved = [p.name for p in others if p.read_text() != before[p]]
    Path(spec["result"]).write_text(json.dumps({"run": name, "ok": not moved, "moved": moved,
                                                "phases": {}, "vllm": "stand-in"}))
    (control / f"{name}.done").touch()
""")


def test_engines_start_side_by_side_and_measure_alone(tmp_path):
    import bench_steps

    models = tmp_path / "models"
    models.mkdir()
    (models / "bench-shapes.json").write_text("{}")
    script = tmp_path / "fake_child.py"
    script.write_text(FAKE_CHILD)

    class FakeBench(bench_steps.Bench):
        def child_cmd(self, spec):
            return [sys.executable, str(script), json.dumps(spec)]

    args = SimpleNamespace(out=tmp_path / "out", models=models, site=None, series_hash=None,
                           deadline_s=60.0, min_run_s=5.0, parallel=3, gpu_gib=80.0)
    bench = FakeBench(args)
    t0 = time.time()
    bench.loop(list(bs.RUNS))
    assert time.time() - t0 < 30
    assert bench.max_running == 3  # starts overlapped; each measurement saw no other heartbeat move
    failed = {n for n, r in bench.records.items() if not r.get("ok")}
    assert failed == {"bf16-dflash-flex"}, {n: r.get("moved") or r.get("error") for n, r in bench.records.items()}
    doc = json.loads((args.out / "bench.json").read_text())
    assert set(doc["runs"]) == {r.name for r in bs.RUNS}
    assert (args.out / "bench.md").exists()


def test_deadline_leaves_later_runs_unstarted(tmp_path):
    import bench_steps

    models = tmp_path / "models"
    models.mkdir()
    (models / "bench-shapes.json").write_text("{}")
    args = SimpleNamespace(out=tmp_path / "out", models=models, site=None, series_hash=None,
                           deadline_s=bench_steps.MIN_TIME_FOR_A_RUN_S - 1, parallel=3, gpu_gib=80.0)
    bench = bench_steps.Bench(args)
    bench.loop(list(bs.RUNS[:2]))
    assert all(r["error"].startswith("not started") for r in bench.records.values())


def test_keep_earlier_takes_only_records_of_the_same_device_and_series(tmp_path):
    import bench_steps

    args = SimpleNamespace(out=tmp_path / "out", models=tmp_path, site=None, series_hash="abc",
                           deadline_s=60, parallel=1, gpu_gib=80.0)
    bench = bench_steps.Bench(args)
    bench.meta["device"] = "NVIDIA H200, 143771 MiB"

    def earlier(name, **over):
        rec = {"run": name, "ok": True, "bench_device": bench.meta["device"], "series_hash": "abc", **over}
        (args.out / f"run-{name}.json").write_text(json.dumps(rec))

    earlier("bf16-decode-locked")
    earlier("nvfp4-decode-locked", series_hash="old")               # another series
    earlier("bf16-dflash-fa2", bench_device="NVIDIA H100, 81559 MiB")  # another machine
    earlier("bf16-dflash-flex", ok=False)                            # failed earlier
    earlier("bf16-dflash-fa3")                                       # rerun by this call
    bench.keep_earlier({"bf16-dflash-fa3"})
    assert set(bench.records) == {"bf16-decode-locked"}


def test_kernels_are_grouped_by_the_innermost_device_range_they_ran_in():
    import bench_steps

    events = [("ProfilerStep#5", 0.0, 100.0),
              ("bench::forward", 10.0, 40.0), ("fused_moe_kernel", 12.0, 20.0), ("nvjet_gemm", 20.0, 30.0),
              ("bench::logits", 45.0, 50.0), ("nvjet_gemm", 45.0, 49.0),
              ("bench::propose", 60.0, 90.0), ("bench::forward", 62.0, 70.0),  # a nested range
              ("flash_fwd_kernel", 63.0, 66.0), ("argmax_kernel", 80.0, 81.0),
              ("sampler_kernel", 95.0, 96.0)]  # outside every range
    got = bench_steps.group_by_device_ranges(events)
    assert got == {"forward": {"fused_moe_kernel": [8.0, 1], "nvjet_gemm": [10.0, 1], "flash_fwd_kernel": [3.0, 1]},
                   "logits": {"nvjet_gemm": [4.0, 1]}, "propose": {"argmax_kernel": [1.0, 1]}}


# ----------------------------------------------------------------- step timing (stand-in engine)

# The engine and CUDA events need a GPU; these stand-ins call the runner methods
# the way vLLM 0.21.0's engine core does (execute_model -> _model_forward ->
# model.compute_logits, then sample_tokens -> drafter.propose), so the timer's
# wrapping and bookkeeping and the phase records run for real.


class _Event:
    def __init__(self, enable_timing=True):
        self.t = None

    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, other):
        return 1000.0 * (other.t - self.t)


class _Torch:
    cuda = SimpleNamespace(Event=_Event, synchronize=lambda: None)
    profiler = None


class _Runner:
    def __init__(self, spec_tokens: int):
        self.spec = spec_tokens
        self.model = SimpleNamespace(compute_logits=lambda h: time.sleep(0.0005))
        self.drafter = SimpleNamespace(propose=lambda *a: time.sleep(0.001)) if spec_tokens else None
        self.batch = None

    def _model_forward(self, input_ids=None, positions=None, **kw):
        time.sleep(0.002)

    def execute_model(self, tokens: int):
        import torch

        self._model_forward(input_ids=torch.zeros(tokens, dtype=torch.long))
        self.model.compute_logits(None)

    def sample_tokens(self, grammar=None):
        if self.drafter is not None:
            self.drafter.propose()


class _LLM:
    def __init__(self, runner):
        self.runner = runner

    def generate(self, inputs, params, use_tqdm=False):
        b, per_seq = len(inputs), 1 + self.runner.spec
        self.runner.execute_model(b * len(inputs[0]["prompt_token_ids"]))  # prefill
        self.runner.sample_tokens()
        for _ in range(params.max_tokens - 1):
            self.runner.execute_model(b * per_seq)
            self.runner.sample_tokens()
        out = SimpleNamespace(token_ids=list(range(params.max_tokens)), logprobs=None)
        return [SimpleNamespace(outputs=[out]) for _ in inputs]


def _sampling_params(**kw):
    return SimpleNamespace(**kw)


@pytest.mark.parametrize("spec_tokens", (0, 15))
def test_timed_phase_records_steady_steps_and_wall_clock(spec_tokens):
    import bench_steps

    runner = _Runner(spec_tokens)
    timer = bench_steps.StepTimer(_Torch, runner)
    prompts = bench_steps._prompts(4, bs.DECODE_PROMPT_LEN, 1)
    phase = bench_steps._timed_phase(_LLM(runner), timer, _sampling_params, prompts, 20)
    phase["forward_tokens"] = 4 * (1 + spec_tokens)
    assert phase["steps_long"] == 20 and phase["steps_short"] == bs.WALL_SHORT_TOKENS
    assert len(phase["steps"]) == 20 and phase["steps"][0]["forward_tokens"] == 4 * bs.DECODE_PROMPT_LEN
    assert phase["tokens_per_step"] == 1.0
    m = br.phase_ms(phase)
    assert m["steps"] == 19 - br.SKIP_STEPS
    assert m["step_ms"] >= m["forward_ms"] + m["logits_ms"] > 0
    assert (m["propose_ms"] is not None) == bool(spec_tokens)
    assert m["wall_ms"] > 0
    assert timer.steps == []  # collected


def test_configs_parse_in_transformers_as_vllm_021_reads_them(tiny):
    from transformers import AutoConfig

    target = AutoConfig.from_pretrained(tiny / "gemma4-bench-bf16")
    text = target.get_text_config()
    # vLLM 0.21.0 reads these from the text config (FACTS.md: transformers <= 5.13 keeps them there)
    assert (text.head_dim, text.global_head_dim, text.attention_k_eq_v) == (256, 512, True)
    assert text.layer_types.count("full_attention") == 1 and text.use_bidirectional_attention == "vision"
    drafter = AutoConfig.from_pretrained(tiny / "dflash-bench")
    assert drafter.model_type == "qwen3" and drafter.num_hidden_layers == 5
    assert drafter.dflash_config["target_layer_ids"] == [0, 1, 2, 3, 4]


@pytest.mark.filterwarnings("ignore:CUDA is not available")
def test_profile_phase_groups_kernels_by_timed_range():
    """The profiler schedule, the step hook and the bench:: ranges, on the CPU profiler
    (no kernels without a GPU: what is checked is that the ranges are found)."""
    import torch
    import bench_steps

    class TorchWithProfiler(_Torch):
        profiler = torch.profiler

    runner = _Runner(15)
    timer = bench_steps.StepTimer(TorchWithProfiler, runner)
    prof = bench_steps._profile_phase(torch, _LLM(runner), timer, _sampling_params, bench_steps._prompts(2, 8, 1))
    assert prof["steps"] == 8
    assert set(prof["ranges"]) == {"forward", "logits", "propose"}
    assert timer.profiler is None


def test_the_benchmark_report_says_whether_it_ran_the_current_series():
    from launcher.patching.series import series_for

    now = series_for("0.21.0").hash
    assert br._series_md({"vllm": "0.21.0", "meta": {"series_hash": now}}).startswith(f"Series: {now[:8]} (current;")
    old = br._series_md({"vllm": "0.21.0", "meta": {"series_hash": "9496c6ec" + "0" * 56}})
    assert "(**stale**; the current 0.21.0 series is " + now[:8] in old
    assert "not recorded" in br._series_md({"vllm": "0.21.0", "meta": {}})
