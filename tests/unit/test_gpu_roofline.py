"""roofline.py on a small hand-built checkpoint: every byte count worked out here by hand.

The config: hidden 32, two layers (one sliding with window 8, 2 KV heads of 4;
one full with 1 KV head of 8, K = V), 4 experts top-2 of width 16, vocabulary
64, tied embedding. Tensor sizes are written out below as the products they
are, not taken from the module under test.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))

import roofline  # noqa: E402

TEXT = {"hidden_size": 32, "vocab_size": 64, "num_experts": 4, "top_k_experts": 2, "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention"], "num_key_value_heads": 2, "head_dim": 4,
        "num_global_key_value_heads": 1, "global_head_dim": 8, "attention_k_eq_v": True}
P = "model.language_model."


def _nvfp4(module: str, rows: int, cols: int) -> dict:
    return {f"{module}.weight": ("U8", [rows, cols // 2]), f"{module}.weight_scale": ("F8_E4M3", [rows, cols // 16]),
            f"{module}.weight_scale_2": ("F32", []), f"{module}.input_scale": ("F32", [])}


def _tensors() -> dict:
    t = {P + "embed_tokens.weight": ("BF16", [64, 32]), P + "norm.weight": ("BF16", [32])}
    t[P + "layers.0.self_attn.q_proj.weight"] = ("BF16", [16, 32])
    t[P + "layers.0.self_attn.k_proj.weight"] = ("BF16", [8, 32])
    t[P + "layers.0.self_attn.v_proj.weight"] = ("BF16", [8, 32])
    t[P + "layers.0.self_attn.o_proj.weight"] = ("BF16", [32, 16])
    t[P + "layers.1.self_attn.q_proj.weight"] = ("BF16", [32, 32])
    t[P + "layers.1.self_attn.k_proj.weight"] = ("BF16", [8, 32])
    t[P + "layers.1.self_attn.o_proj.weight"] = ("BF16", [32, 32])
    for layer in (0, 1):
        p = f"{P}layers.{layer}."
        t[p + "mlp.gate_proj.weight"] = ("BF16", [16, 32])
        t[p + "mlp.up_proj.weight"] = ("BF16", [16, 32])
        t[p + "mlp.down_proj.weight"] = ("BF16", [32, 16])
        t[p + "router.proj.weight"] = ("BF16", [4, 32])
        t[p + "input_layernorm.weight"] = ("BF16", [32])
        for e in range(4):
            t |= _nvfp4(f"{p}experts.{e}.gate_proj", 16, 32) | _nvfp4(f"{p}experts.{e}.up_proj", 16, 32)
            t |= _nvfp4(f"{p}experts.{e}.down_proj", 32, 16)
    t["model.vision_tower.encoder.layers.0.mlp.fc.weight"] = ("BF16", [100, 100])  # never read in decode
    return t


# By hand, bytes:
EXPERT = (16 * 16 + 16 * 2 + 8) * 2 + (32 * 8 + 32 * 1 + 8)  # gate + up, down: codes, block scales, 2 scalars
EXPERTS_ALL = 2 * 4 * EXPERT  # 7104
ATTENTION = (16 * 32 + 8 * 32 + 8 * 32 + 32 * 16) * 2 + (32 * 32 + 8 * 32 + 32 * 32) * 2  # 3072 + 4608
V_COPY = 8 * 32 * 2  # the full layer's k_proj, loaded again into the V slot by vLLM
DENSE = 2 * (16 * 32 * 3) * 2
ROUTER = 2 * 4 * 32 * 2
NORMS = 3 * 32 * 2
HEAD = 64 * 32 * 2  # tied embedding
ROW = 32 * 2  # one embedding row


def kv(context: int) -> int:
    return min(context, 8) * 2 * 2 * 4 * 2 + context * 2 * 1 * 8 * 2


def test_the_hand_counts_add_up():
    assert (EXPERT, EXPERTS_ALL, ATTENTION) == (888, 7104, 7680)
    assert kv(10) == 576


def test_decode_at_batch_one():
    step = roofline.step_bytes(_tensors(), TEXT, context=10)
    assert step["experts"] == EXPERTS_ALL * 2 / 4  # top-2 of 4 experts per layer
    assert step["attention"] == ATTENTION and step["attention_vllm_v_copy"] == V_COPY
    assert (step["dense_mlp"], step["router"], step["norms_other"]) == (DENSE, ROUTER, NORMS)
    assert step["lm_head"] == HEAD and step["embedding_rows"] == ROW and step["kv_cache"] == kv(10)
    assert step["total"] == EXPERTS_ALL / 2 + ATTENTION + V_COPY + DENSE + ROUTER + NORMS + HEAD + ROW + kv(10)
    assert step["total"] == 23328


def test_batch_two_touches_three_experts_on_average():
    step = roofline.step_bytes(_tensors(), TEXT, context=10, batch=2)
    # 4 x (1 - (1 - 2/4)^2) = 3 distinct experts of 4 per layer
    assert step["experts"] == EXPERTS_ALL * 3 / 4
    assert step["kv_cache"] == 2 * kv(10) and step["embedding_rows"] == 2 * ROW
    total = EXPERTS_ALL * 3 / 4 + ATTENTION + V_COPY + DENSE + ROUTER + NORMS + HEAD + 2 * ROW + 2 * kv(10)
    assert roofline.per_token(step, batch=2) == total / 2


def test_sliding_layers_read_at_most_their_window():
    assert roofline.kv_bytes_per_sequence(TEXT, 4) == 4 * 32 + 4 * 32
    assert roofline.kv_bytes_per_sequence(TEXT, 100) == 8 * 32 + 100 * 32


def test_dflash_step_adds_the_drafter_and_a_second_head():
    drafter = {"fc.weight": ("BF16", [32, 64])}
    cfg = {"num_hidden_layers": 1, "num_key_value_heads": 1, "head_dim": 4}
    step = roofline.step_bytes(_tensors(), TEXT, context=10, tokens_per_seq=3, drafter=drafter, drafter_cfg=cfg)
    assert step["experts"] == EXPERTS_ALL * 3.5 / 4  # 4 x (1 - 0.5^3) of 4
    assert step["kv_cache"] == kv(12)  # context plus the two drafted positions
    assert (step["drafter_weights"], step["drafter_lm_head"], step["drafter_kv_cache"]) == (4096, HEAD, 10 * 16)
    assert step["total"] == (EXPERTS_ALL * 3.5 / 4 + ATTENTION + V_COPY + DENSE + ROUTER + NORMS + HEAD + 3 * ROW
                             + kv(12) + 4096 + HEAD + 160)


def test_expected_experts_limits():
    assert roofline.expected_experts(128, 8, 1) == 8
    assert roofline.expected_experts(128, 8, 0) == 0
    assert roofline.expected_experts(128, 8, 16) == pytest.approx(128 * (1 - (120 / 128) ** 16))
    assert 82 < roofline.expected_experts(128, 8, 16) < 83  # FACTS.md: "about 82 of 128"
    assert roofline.expected_experts(128, 8, 10_000) == pytest.approx(128)


def test_projection_and_achieved_fraction():
    assert roofline.tokens_per_second(23328, 1000.0, 0.5) == pytest.approx(0.5 * 1e12 / 23328)
    assert roofline.achieved_fraction(23328, 1.0, 1000.0) == pytest.approx(23328 / 1e-3 / 1e12)
    p = roofline.projections(5.6e9, 0.6)
    assert p["rtx5090"]["projection"] is True
    assert p["rtx5090"]["tok_s"] == pytest.approx(0.6 * 1790 / 5.6, abs=0.05)
    assert p["gb10"]["tok_s_at_bandwidth_bound"] == pytest.approx(273 / 5.6, abs=0.05)
    assert roofline.dflash_projection({"total": 15e9}, 4, 1790.0, 0.5) == pytest.approx(4 * 0.5 * 1790 / 15)


def test_summary_and_cli_on_a_checkpoint_folder(tmp_path, capsys):
    import json

    import st_stream

    specs = [(n, d, s) for n, (d, s) in _tensors().items()]
    with st_stream.Writer(tmp_path / "model.safetensors", specs) as w:  # zeros: only the header is read
        for n, d, s in specs:
            w.write(n, bytes({"BF16": 2, "U8": 1, "F8_E4M3": 1, "F32": 4}[d] * math.prod(s)))
    (tmp_path / "config.json").write_text(json.dumps({"text_config": TEXT}))
    assert roofline.main(["--target", str(tmp_path), "--context", "10", "--efficiency", "0.5",
                          "--json", str(tmp_path / "r.json")]) == 0
    block = json.loads((tmp_path / "r.json").read_text())
    assert block["bytes_per_token"] == 23328
    assert block["decode_b1"]["total"] == 23328
    assert block["projection"]["rtx5090"]["tok_s"] == round(0.5 * 1790e9 / 23328, 1)
    assert "projection rtx5090" in capsys.readouterr().out
