"""Bytes a decode step reads, counted from a checkpoint's tensors, and what that allows at a bandwidth.

Pure Python (no torch): the counts come from the safetensors headers and
config.json, so they run here on the released checkpoint's file list or on
the generated one (``fullsize_shapes.nvidia_layout``) alike. The CPU tests
check them against hand-computed values for a small config.

What one step of T = batch x tokens_per_seq tokens reads (weights once per
step, whatever T is; each is read from memory once, which is the bound's
assumption):

* routed experts: per layer, the distinct experts the step's tokens touch,
  E x (1 - (1 - k/E)^T) under uniform routing (exactly k at T = 1; about 82
  of 128 for a 16-token verify) times one expert's bytes (its NVFP4 codes,
  block scales and scalars);
* every other language-model weight (attention, dense MLP, routers, norms):
  all of it, plus the copy of K that vLLM 0.21.0 loads into the V slot of
  the ``attention_k_eq_v`` layers (gemma4.py: "k_eq_v layers load K weights
  into both K and V slots");
* the LM head: the tied embedding (262,144 x 2816 bf16, 1.48 GB), read once
  for the step's logits; the embedding rows of the T tokens;
* the KV cache: per sequence, ``min(context, sliding_window)`` positions of
  each sliding layer and ``context`` positions of each full layer, K and V
  (vLLM stores V for K=V layers too), at ``kv_bytes`` per element;
* with a DFlash drafter: its weights, the LM head again (the drafter scores
  its block with the target's head) and its KV cache (vLLM 0.21.0 runs its
  layers as full attention, FACTS.md).

Not counted: the vision tower (no image in a decode step), activations,
sampling, writes. Per generated token = step bytes / (batch x accepted tokens
per sequence).

Projections are labelled as such: ``tok/s = efficiency x bandwidth /
bytes per token``, with the efficiency measured on the test GPU (its decode
bytes per second over its copy bandwidth, ``copy_bandwidth.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)

import fullsize_shapes as fs  # noqa: E402
import st_stream  # noqa: E402

GB = 1e9
GIB = 1 << 30
# Peak memory bandwidth, decimal GB/s, as issue 27 states them (vendor figures).
DEVICES_GBPS = {"rtx5090": 1790.0, "gb10": 273.0}
# Public decode anchors for Gemma 4 26B-A4B at concurrency 1 (issue 27, FACTS.md).
ANCHORS = [
    {"device": "rtx5090", "what": "AWQ 4-bit, vLLM 0.19.2rc1, no speculation", "tok_s": 228.0},
    {"device": "rtx5090", "what": "AWQ 4-bit, vLLM 0.19.2rc1, DFlash n=13", "tok_s": 578.0},
    {"device": "rtx5090", "what": "llama.cpp Q4_K", "tok_s": 180.0},
    {"device": "gb10", "what": "NVFP4, no speculation", "tok_s_range": [29.8, 52.0]},
    {"device": "gb10", "what": "NVFP4, MTP n=4", "tok_s": 55.6},
]


def expected_experts(num_experts: int, top_k: int, tokens: int) -> float:
    """Distinct experts ``tokens`` tokens touch in one layer when each picks ``top_k`` uniformly."""
    if tokens <= 0:
        return 0.0
    if tokens == 1:
        return float(top_k)
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def kv_bytes_per_sequence(text: dict, context: int, kv_bytes: int = 2) -> int:
    """KV cache bytes one sequence's decode step reads at ``context`` positions."""
    window = text["sliding_window"]
    total = 0
    for kind in text["layer_types"]:
        if kind == "full_attention":
            heads = text.get("num_global_key_value_heads") or text["num_key_value_heads"]
            dim = text.get("global_head_dim") or text["head_dim"]
            positions = context
        else:
            heads, dim, positions = text["num_key_value_heads"], text["head_dim"], min(context, window)
        total += positions * 2 * heads * dim * kv_bytes
    return total


def drafter_kv_bytes_per_sequence(drafter_cfg: dict, context: int, kv_bytes: int = 2) -> int:
    per_layer = 2 * drafter_cfg["num_key_value_heads"] * drafter_cfg["head_dim"] * kv_bytes
    return drafter_cfg["num_hidden_layers"] * per_layer * context


def step_bytes(tensors: dict[str, tuple[str, list[int]]], text: dict, *, context: int, batch: int = 1,
               tokens_per_seq: int = 1, kv_bytes: int = 2, drafter: dict[str, tuple[str, list[int]]] | None = None,
               drafter_cfg: dict | None = None) -> dict[str, float]:
    """Bytes one step reads, by term (see the module docstring); ``total`` sums them."""
    by_class = fs.bytes_by_class(tensors)
    tokens = batch * tokens_per_seq
    experts, top_k = text["num_experts"], text["top_k_experts"]
    out: dict[str, float] = {
        "experts": by_class.get("experts", 0) * expected_experts(experts, top_k, tokens) / experts,
        "attention": by_class.get("attention", 0),
        "attention_vllm_v_copy": _k_eq_v_copy(tensors, text),
        "dense_mlp": by_class.get("dense_mlp", 0),
        "router": by_class.get("router", 0),
        "norms_other": by_class.get("norms_other", 0),
        "lm_head": by_class.get("lm_head", by_class.get("embedding", 0)),
        "embedding_rows": tokens * text["hidden_size"] * _dtype_bytes(tensors, "embed_tokens.weight"),
        "kv_cache": batch * kv_bytes_per_sequence(text, context + tokens_per_seq - 1, kv_bytes),
    }
    if drafter is not None:
        out["drafter_weights"] = sum(fs.nbytes(*v) for v in drafter.values())
        out["drafter_lm_head"] = out["lm_head"]
        out["drafter_kv_cache"] = batch * drafter_kv_bytes_per_sequence(drafter_cfg, context, kv_bytes) \
            if drafter_cfg else 0
    out["total"] = sum(out.values())
    return out


def _dtype_bytes(tensors: dict, suffix: str) -> int:
    for name, (dtype, _) in tensors.items():
        if name.endswith(suffix):
            return fs.DTYPE_BYTES[dtype]
    return 2


def _k_eq_v_copy(tensors: dict, text: dict) -> int:
    if not text.get("attention_k_eq_v"):
        return 0
    full = {i for i, kind in enumerate(text["layer_types"]) if kind == "full_attention"}
    return sum(fs.nbytes(*v) for n, v in tensors.items()
               if n.endswith("self_attn.k_proj.weight") and fs.layer_of(n) in full)


def per_token(step: dict[str, float], batch: int = 1, accepted_per_seq: float = 1.0) -> float:
    return step["total"] / (batch * accepted_per_seq)


def tokens_per_second(bytes_per_token: float, bandwidth_gbps: float, efficiency: float = 1.0) -> float:
    return efficiency * bandwidth_gbps * GB / bytes_per_token


def achieved_fraction(bytes_per_token: float, tpot_ms: float, bandwidth_gbps: float) -> float:
    """Decode bytes per second at a measured time per output token, over the device's bandwidth."""
    return bytes_per_token / (tpot_ms / 1000.0) / (bandwidth_gbps * GB)


def projections(bytes_per_token: float, efficiency: float, *, devices: dict[str, float] = DEVICES_GBPS,
                label: str = "") -> dict[str, dict]:
    """tok/s on each device at ``efficiency`` of its bandwidth (and the bound at 100 %): projections."""
    return {name: {"projection": True, "what": label or "decode, concurrency 1", "bandwidth_gbps": bw,
                   "efficiency": round(efficiency, 4),
                   "tok_s": round(tokens_per_second(bytes_per_token, bw, efficiency), 1),
                   "tok_s_at_bandwidth_bound": round(tokens_per_second(bytes_per_token, bw), 1)}
            for name, bw in devices.items()}


def dflash_projection(verify: dict[str, float], tau: float, bandwidth_gbps: float, efficiency: float) -> float:
    """tok/s of DFlash at batch 1 with mean acceptance length ``tau`` (tokens out per step, the bonus
    token counted): ``tau`` tokens per step that reads ``verify['total']`` bytes."""
    return tau * efficiency * bandwidth_gbps * GB / verify["total"]


def summary(tensors: dict, text: dict, *, context: int, drafter: dict | None = None, drafter_cfg: dict | None = None,
            spec_tokens: int = 15, kv_bytes: int = 2) -> dict:
    """The roofline block: batch 1 decode, the batch-16 decode per token, and (with a drafter) one
    DFlash step of 1 + ``spec_tokens`` tokens."""
    decode = step_bytes(tensors, text, context=context, kv_bytes=kv_bytes)
    decode16 = step_bytes(tensors, text, context=context, batch=16, kv_bytes=kv_bytes)
    out = {"context": context, "kv_bytes": kv_bytes, "decode_b1": _rounded(decode),
           "bytes_per_token": round(decode["total"]), "decode_b16_terms": _rounded(decode16),
           "decode_b16_per_token": round(per_token(decode16, batch=16)),
           "expected_experts": {t: round(expected_experts(text["num_experts"], text["top_k_experts"], t), 2)
                                for t in (1, 4, 16, 22, 16 * 22)}}
    if drafter is not None:
        verify = step_bytes(tensors, text, context=context, tokens_per_seq=1 + spec_tokens, kv_bytes=kv_bytes,
                            drafter=drafter, drafter_cfg=drafter_cfg)
        out["dflash_step_b1"] = _rounded(verify)
    return out


def _rounded(step: dict[str, float]) -> dict[str, int]:
    return {k: round(v) for k, v in step.items()}


def load(folder: Path) -> tuple[dict, dict]:
    """(tensors, config.json) of a checkpoint folder, from its headers."""
    folder = Path(folder)
    return st_stream.read_checkpoint_tensors(folder), json.loads((folder / "config.json").read_text())


def format_table(block: dict) -> list[str]:
    lines = [f"bytes read per step at context {block['context']} (GB = 1e9):"]
    for key in ("decode_b1", "dflash_step_b1"):
        if key not in block:
            continue
        lines.append(f"  {key}:")
        for term, value in block[key].items():
            lines.append(f"    {term:<22} {value / GB:9.4f} GB")
    lines.append(f"  decode at batch 16, per token: {block['decode_b16_per_token'] / GB:.4f} GB")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, required=True, help="checkpoint folder (config.json, *.safetensors)")
    parser.add_argument("--drafter", type=Path, help="DFlash drafter folder")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--efficiency", type=float, default=None, help="fraction of bandwidth for projections")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    tensors, cfg = load(args.target)
    drafter = drafter_cfg = None
    if args.drafter:
        drafter, drafter_cfg = load(args.drafter)
    block = summary(tensors, cfg["text_config"], context=args.context, drafter=drafter, drafter_cfg=drafter_cfg)
    if args.efficiency is not None:
        block["projection"] = projections(block["bytes_per_token"], args.efficiency)
    print("\n".join(format_table(block)))
    if "projection" in block:
        for name, p in block["projection"].items():
            print(f"  projection {name}: {p['tok_s']} tok/s at {p['efficiency']:.0%} of {p['bandwidth_gbps']} GB/s")
    if args.json:
        args.json.write_text(json.dumps(block, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
