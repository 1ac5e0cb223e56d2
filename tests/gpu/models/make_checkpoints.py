"""Small random-weight checkpoints shaped like Gemma 4 26B-A4B and its DFlash drafter.

What the GPU proof needs from a checkpoint is its *shape*, not its knowledge:

* the target is ``Gemma4ForConditionalGeneration`` (multimodal, so vLLM marks
  it ``is_mm_prefix_lm`` through ``use_bidirectional_attention: "vision"``),
  with sliding layers at head_dim 256 and full layers at ``global_head_dim``
  512 (this is what makes vLLM 0.21.0 force TRITON_ATTN and what splits the
  KV cache into one group per layer kind), a MoE block, K=V full attention
  and one shared KV head on full layers, like the 26B-A4B;
* the drafter is ``DFlashDraftModel`` (qwen3-style) with ``dflash_config``
  ``target_layer_ids`` and ``mask_token_id``, without its own embeddings or
  LM head (vLLM shares the target's), like the public z-lab drafters.

The interesting cases are about layer counts: the hybrid KV-cache manager
cuts every spec bucket into groups the size of the smallest bucket, so a
drafter with more layers than the target has full-attention layers is split
across groups. ``SHAPES`` covers a 6-layer target (1 full layer) and a
12-layer target (2 full layers), each with a drafter that has more layers
than that.

Weights are drawn with std 0.1 rather than the usual 0.02: random models
with tiny weights produce near-flat logits, and greedy decoding then ties
so often that a lossless comparison says little.

Run with transformers 5.13.1 (vLLM 0.21.0 reads ``global_head_dim`` from
the text config; 5.15+ moves it). ``python make_checkpoints.py OUT_DIR``
writes ``OUT_DIR/<name>/`` for every target and drafter plus
``OUT_DIR/shapes.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

VOCAB = 4096
HIDDEN = 256
INIT_STD = 0.1
SEED = 1234

# Token ids for the multimodal markers live at the top of the small vocab
# (the real ids, ~256k-258k, would force a real-sized embedding table).
SPECIAL_IDS = {
    "boi_token_id": VOCAB - 8,
    "eoi_token_id": VOCAB - 7,
    "image_token_id": VOCAB - 6,
    "video_token_id": VOCAB - 5,
    "boa_token_id": VOCAB - 4,
    "eoa_token_index": VOCAB - 3,
    "audio_token_id": VOCAB - 2,
}
MASK_TOKEN_ID = VOCAB - 1  # DFlash parallel-drafting mask token
# Prompts draw token ids below this bound so they never hit a special id.
PROMPT_TOKEN_LIMIT = VOCAB - 16


@dataclass(frozen=True)
class TargetShape:
    name: str
    num_layers: int
    top_k_experts: int = 2
    # Weight of the RMSNorms after each attention / feed-forward branch (ones
    # by default). See TARGETS for why the 12-layer target lowers it.
    post_norm_scale: float | None = None
    hidden_size: int = HIDDEN
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    num_global_key_value_heads: int = 1
    num_experts: int = 4
    moe_intermediate_size: int = 64
    intermediate_size: int = 256
    sliding_window: int = 64

    @property
    def layer_types(self) -> list[str]:
        # Gemma 4's 5:1 pattern: every sixth layer is full attention.
        return [
            "full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
            for i in range(self.num_layers)
        ]

    @property
    def num_full_layers(self) -> int:
        return self.layer_types.count("full_attention")


@dataclass(frozen=True)
class DrafterShape:
    name: str
    target: str
    num_layers: int
    target_layer_ids: list[int] = field(default_factory=list)
    hidden_size: int = HIDDEN
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 128
    # The public 26B-A4B drafter declares sliding layers (see REALSHAPE);
    # None keeps the all-full qwen3 drafters of the first proof.
    layer_types: list[str] | None = None
    sliding_window: int | None = None


# The 12-layer target scales its post-branch norms to 0.3. With all norms at
# one, a 12-layer random model is chaotic in bf16: HF transformers itself picks
# a different greedy token in bf16 than in fp32 at ~7-15% of positions, many
# with fp32 margins above one logit (6 layers: none), so any two compute
# paths (a decode step vs a multi-token pass, as in DFlash verification)
# disagree far beyond a bf16 step without any drafter involved. At 0.3 each
# branch adds a smaller share to the residual stream; bf16 and fp32 then agree
# at every position checked and no fp32 top-1/top-2 gap is under 1/16.
TARGETS = [TargetShape("gemma4-t6", 6), TargetShape("gemma4-t12", 12, post_norm_scale=0.3)]
# The chaotic 12-layer variant, kept to show the effect (results/diag-*.md).
DIAGNOSTIC_TARGETS = [TargetShape("gemma4-t12-unscaled", 12)]
DRAFTERS = [
    # 2 drafter layers vs 1 full-attention layer in the target.
    DrafterShape("dflash-d2-for-t6", "gemma4-t6", 2, [1, 3, 4]),
    # 3 drafter layers vs 2 full-attention layers in the target.
    DrafterShape("dflash-d3-for-t12", "gemma4-t12", 3, [1, 5, 9]),
]
# Not in the standard rounds; run_modes.py --drafters picks them for diagnosis.
DIAGNOSTIC_DRAFTERS = [
    DrafterShape("dflash-d3-for-t12-unscaled", "gemma4-t12-unscaled", 3, [1, 5, 9]),
]

# The real-shape proof (tests/gpu/runs/realshape.py, issue 11): Gemma 4 26B-A4B's
# layer mix at small width. Sources of each value (the released config as
# public code reproduces it; shared/FACTS.md "Gemma 4 26B-A4B geometry"):
#   30 layers, every 6th full (25 sliding + 5 full); head_dim 256 / global
#   512; 16 query heads; 8 KV heads on sliding layers, 2 on full layers
#   (num_global_key_value_heads); attention_k_eq_v; 128 experts, top-8;
#   final_logit_softcapping 30; use_bidirectional_attention "vision";
#   sliding_window 1024 (here 64: 1/16, so prompts pass it).
# Shrunk: hidden 2816 -> 128, moe_intermediate 704 -> 64, dense
# intermediate 2112 -> 128, vocabulary 262144 -> 4096. Post-branch norms at
# 0.3 keep the deep random model bf16-stable (bf16_stability.py).
REALSHAPE_TARGET = TargetShape(
    "gemma4-a4b-r30", 30, top_k_experts=8, post_norm_scale=0.3, hidden_size=128,
    num_attention_heads=16, num_key_value_heads=8, num_global_key_value_heads=2,
    num_experts=128, moe_intermediate_size=64, intermediate_size=128, sliding_window=64)
# The public drafter (z-lab/gemma-4-26B-A4B-it-DFlash): 5 qwen3-style layers,
# sliding window 2048 on the first 4, full attention on the last (per a
# third-party conversion's model card, FACTS.md); window scaled by the same
# 1/16 -> 128. target_layer_ids 1, 6, 11, 17, 22, 27: the target layers a
# public engine documents reading for this drafter. head_dim 128 and the
# head counts follow z-lab's qwen3 DFlash drafters; they are not checked
# against this drafter's own config. Its hidden size is the target's (it
# shares the target's embeddings and LM head).
REALSHAPE_DRAFTER = DrafterShape(
    "dflash-r5-for-a4b-r30", "gemma4-a4b-r30", 5, [1, 6, 11, 17, 22, 27],
    hidden_size=128, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
    layer_types=["sliding_attention"] * 4 + ["full_attention"], sliding_window=128)
SETS = {
    "proof": (TARGETS + DIAGNOSTIC_TARGETS, DRAFTERS, DIAGNOSTIC_DRAFTERS),
    "realshape": ([REALSHAPE_TARGET], [REALSHAPE_DRAFTER], []),
}


def gemma4_config_dict(shape: TargetShape, vocab: int = VOCAB, ids: dict | None = None,
                       max_positions: int = 4096) -> dict:
    """The target's config.json content (a Gemma4Config). ``ids``: the special-token
    ids (SPECIAL_IDS plus pad/eos/bos) of the vocabulary the target is built for."""
    ids = {**SPECIAL_IDS, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2, **(ids or {})}
    text = {
        "model_type": "gemma4_text",
        "vocab_size": vocab,
        "vocab_size_per_layer_input": vocab,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "num_global_key_value_heads": shape.num_global_key_value_heads,
        "head_dim": 256,
        "global_head_dim": 512,
        "attention_k_eq_v": True,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-6,
        "sliding_window": shape.sliding_window,
        "layer_types": shape.layer_types,
        "final_logit_softcapping": 30.0,
        "use_bidirectional_attention": "vision",
        "hidden_size_per_layer_input": 0,
        "num_kv_shared_layers": 0,
        "enable_moe_block": True,
        "num_experts": shape.num_experts,
        "top_k_experts": shape.top_k_experts,
        "moe_intermediate_size": shape.moe_intermediate_size,
        "tie_word_embeddings": True,
        "initializer_range": INIT_STD,
        "pad_token_id": ids["pad_token_id"],
        "eos_token_id": ids["eos_token_id"],
        "bos_token_id": ids["bos_token_id"],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {
                "rope_type": "proportional",
                "partial_rotary_factor": 0.25,
                "rope_theta": 1000000.0,
            },
        },
    }
    vision = {
        "model_type": "gemma4_vision",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "patch_size": 16,
        "pooling_kernel_size": 3,
        "position_embedding_size": 1024,
        "initializer_range": INIT_STD,
    }
    return {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "text_config": text,
        "vision_config": vision,
        "audio_config": None,
        "initializer_range": INIT_STD,
        "tie_word_embeddings": True,
        **{k: ids[k] for k in SPECIAL_IDS},
    }


def drafter_config_dict(shape: DrafterShape, vocab: int = VOCAB, mask_token_id: int = MASK_TOKEN_ID,
                        max_positions: int = 4096, num_target_layers: int | None = None) -> dict:
    """The drafter's config.json content (qwen3-style DFlash), a checkpoint z-lab's
    ``DFlashDraftModel.from_pretrained`` loads as well. ``num_target_layers``: the target's
    layer count, looked up by ``shape.target`` among this module's targets when not given."""
    if num_target_layers is None:
        known = {t.name: t.num_layers for t in TARGETS + DIAGNOSTIC_TARGETS + [REALSHAPE_TARGET]}
        if shape.target not in known:
            raise ValueError(f"{shape.name}: target {shape.target} is not one of {sorted(known)}; "
                             "pass num_target_layers")
        num_target_layers = known[shape.target]
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "vocab_size": vocab,
        "hidden_size": shape.hidden_size,
        "intermediate_size": 512,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        # z-lab's DFlashDraftModel reads it before dflash_config.target_layer_ids (its default taps).
        "num_target_layers": num_target_layers,
        "dflash_config": {
            "mask_token_id": mask_token_id,
            "target_layer_ids": list(shape.target_layer_ids),
        },
    }
    if shape.layer_types is not None:
        cfg |= {"layer_types": list(shape.layer_types), "sliding_window": shape.sliding_window,
                "use_sliding_window": True}
    return cfg


def _drafter_tensors(shape: DrafterShape, generator) -> dict:
    """Weights under the names qwen3_dflash.py's loader expects."""
    import torch

    def rand(*dims):
        return (torch.randn(*dims, generator=generator) * INIT_STD).to(torch.bfloat16)

    def ones(dim):
        return torch.ones(dim, dtype=torch.bfloat16)

    cfg = drafter_config_dict(shape, num_target_layers=0)  # the tensors' shapes do not depend on it
    h, inter, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q_out = cfg["num_attention_heads"] * hd
    kv_out = cfg["num_key_value_heads"] * hd
    tensors = {
        "fc.weight": rand(h, h * len(shape.target_layer_ids)),
        "hidden_norm.weight": ones(h),
        "norm.weight": ones(h),
    }
    for i in range(shape.num_layers):
        p = f"layers.{i}."
        tensors |= {
            p + "self_attn.q_proj.weight": rand(q_out, h),
            p + "self_attn.k_proj.weight": rand(kv_out, h),
            p + "self_attn.v_proj.weight": rand(kv_out, h),
            p + "self_attn.o_proj.weight": rand(h, q_out),
            p + "self_attn.q_norm.weight": ones(hd),
            p + "self_attn.k_norm.weight": ones(hd),
            p + "mlp.gate_proj.weight": rand(inter, h),
            p + "mlp.up_proj.weight": rand(inter, h),
            p + "mlp.down_proj.weight": rand(h, inter),
            p + "input_layernorm.weight": ones(h),
            p + "post_attention_layernorm.weight": ones(h),
        }
    return tensors


def _is_post_branch_norm(name: str) -> bool:
    """The text layers' norms applied to a branch output before the residual add."""
    return "language_model" in name and (
        ".post_attention_layernorm." in name or ".post_feedforward_layernorm" in name)


def write_target(shape: TargetShape, out: Path) -> None:
    import torch
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    torch.manual_seed(SEED + shape.num_layers)
    config = Gemma4Config(**{k: v for k, v in gemma4_config_dict(shape).items()
                             if k not in ("architectures", "model_type")})
    config.architectures = ["Gemma4ForConditionalGeneration"]
    model = Gemma4ForConditionalGeneration(config).to(torch.bfloat16)
    # transformers initialises norms to ones and some scales to zeros/ones; only
    # the matrices get the wider std, which is what keeps logits from tying.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, INIT_STD)
            elif shape.post_norm_scale is not None and _is_post_branch_norm(name):
                p.fill_(shape.post_norm_scale)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}) + "\n"
    )


def write_drafter(shape: DrafterShape, out: Path, config: dict | None = None) -> None:
    """Random weights; ``config`` overrides the drafter_config_dict(shape) default
    (another vocabulary or mask token)."""
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(SEED + 100 + shape.num_layers)
    out.mkdir(parents=True, exist_ok=True)
    save_file(_drafter_tensors(shape, generator), str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config or drafter_config_dict(shape), indent=2) + "\n")


def shapes_manifest(which: str = "proof") -> dict:
    targets, drafters, diagnostic = SETS[which]
    return {
        "set": which,
        "vocab": VOCAB,
        "prompt_token_limit": PROMPT_TOKEN_LIMIT,
        "mask_token_id": MASK_TOKEN_ID,
        "init_std": INIT_STD,
        "targets": [
            {**asdict(t), "layer_types": t.layer_types, "num_full_layers": t.num_full_layers}
            for t in targets
        ],
        "drafters": [asdict(d) for d in drafters],
        "diagnostic_drafters": [asdict(d) for d in diagnostic],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder to write the checkpoints into")
    parser.add_argument("--set", dest="which", choices=sorted(SETS), default="proof",
                        help="proof: the first GPU proof's targets; realshape: the 26B-A4B layer mix")
    parser.add_argument("--post-norm-scale", type=float,
                        help="override the targets' post-branch norm weight (stability search)")
    args = parser.parse_args(argv)
    targets, drafters, diagnostic = SETS[args.which]
    if args.post_norm_scale is not None:
        targets = [replace(t, post_norm_scale=args.post_norm_scale) for t in targets]
    for t in targets:
        write_target(t, args.out / t.name)
    for d in drafters + diagnostic:
        write_drafter(d, args.out / d.name)
    (args.out / "shapes.json").write_text(json.dumps(shapes_manifest(args.which), indent=2) + "\n")
    print(f"wrote {len(targets)} targets and {len(drafters) + len(diagnostic)} drafters under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
