"""Random-weight checkpoints at Gemma 4 26B-A4B's released widths for the step-time benchmark.

Writes, under OUT:

* ``gemma4-bench-bf16/``: ``Gemma4ForConditionalGeneration``, ``BENCH_LAYERS``
  decoder layers (bench_shapes.py), bf16, with transformers' tensor names and
  its fused expert tensors (``experts.gate_up_proj`` [E, 2I, H],
  ``experts.down_proj`` [E, H, I]), as Google's checkpoint stores them;
* ``gemma4-bench-nvfp4/``: the same model in ModelOpt's NVFP4 export layout,
  written directly (no modelopt): every language-model linear as
  ``.weight`` uint8 [out, in/2] of random E2M1 code pairs, ``.weight_scale``
  float8_e4m3fn [out, in/16], ``.weight_scale_2`` and ``.input_scale``
  float32 scalars, experts split per expert (``experts.{e}.gate_proj`` ...),
  embeddings, norms, routers and the vision tower in bf16;
  ``hf_quant_config.json`` (``quant_algo`` NVFP4, ``group_size`` 16,
  ``exclude_modules``) and ``quantization_config`` (``quant_method``
  modelopt) in config.json, so vLLM detects it as ModelOpt NVFP4;
* ``dflash-bench/``: the DFlash drafter at its released widths, without its
  own embeddings or LM head (vLLM shares the target's);
* ``bench-shapes.json``: what was written.

Tensor names and shapes come from transformers' own ``Gemma4ForConditionalGeneration``
built on the meta device from the config (no memory), so they are the names
a real checkpoint has. Values: matrices N(0, INIT_STD) (packed codes uniformly
random; block scales chosen so a dequantized weight has about that std), norms
one except the post-branch norms (POST_NORM_SCALE). Generated on the GPU when
there is one, one safetensors shard per decoder layer.

``python make_bench_checkpoints.py OUT [--layers N] [--tiny]``: ``--tiny``
shrinks every width (the CPU test of the generator).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)

import bench_shapes as bs  # noqa: E402

# A small model of the same structure (CPU tests): widths divisible by the NVFP4 group.
TINY_TEXT = {"hidden_size": 64, "intermediate_size": 64, "moe_intermediate_size": 32, "num_experts": 4,
             "top_k_experts": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
             "num_global_key_value_heads": 1, "vocab_size": 512, "max_position_embeddings": 4096}
TINY_SPECIAL_IDS = {k: 500 + i for i, k in enumerate(bs.SPECIAL_IDS)}
TINY_DRAFTER = {"hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
                "intermediate_size": 128, "vocab_size": 512}


def hf_state_shapes(config: dict) -> dict[str, list[int]]:
    """name -> shape of transformers' Gemma4ForConditionalGeneration for ``config``."""
    import torch
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    hf = Gemma4Config(**{k: v for k, v in config.items()
                         if k not in ("architectures", "model_type", "quantization_config")})
    with torch.device("meta"):
        model = Gemma4ForConditionalGeneration(hf)
    return {name: list(t.shape) for name, t in model.state_dict().items()}


class _Random:
    """Values for one tensor name (see module docstring)."""

    def __init__(self, device: str, seed: int):
        import torch

        self.torch = torch
        self.device = device
        self.gen = torch.Generator(device=device).manual_seed(seed)
        # dequantized weight = E2M1 code * weight_scale * weight_scale_2
        self.scale_2 = bs.INIT_STD / (bs.E2M1_RMS * 256.0)

    def value(self, name: str, dtype: str, shape: list[int]):
        torch = self.torch
        if dtype == "U8":
            t = torch.randint(0, 256, shape, generator=self.gen, device=self.device, dtype=torch.uint8)
        elif dtype == "F8_E4M3":
            t = (192.0 + 128.0 * torch.rand(shape, generator=self.gen, device=self.device)
                 ).to(torch.float8_e4m3fn)
        elif dtype == "F32":
            scalar = self.scale_2 if name.endswith("weight_scale_2") else 8.0 / (6.0 * 448.0)
            t = torch.tensor(scalar, dtype=torch.float32)
        elif len(shape) >= 2:
            t = (torch.randn(shape, generator=self.gen, device=self.device) * bs.INIT_STD).to(torch.bfloat16)
        else:
            fill = bs.POST_NORM_SCALE if bs.is_post_branch_norm(name) else 1.0
            t = torch.full(shape, fill, dtype=torch.bfloat16)
        return t.cpu().contiguous()


def _write_shards(out: Path, layout: dict[str, tuple[str, list[int]]], rnd: _Random) -> int:
    """One safetensors file per decoder layer plus one for the rest; the index; bytes written."""
    from safetensors.torch import save_file

    shards: dict[str, list[str]] = {}
    for name in layout:
        layer = bs.layer_of(name)
        shards.setdefault("rest" if layer is None else f"layer{layer:03d}", []).append(name)
    files = sorted(shards)
    weight_map, total = {}, 0
    for i, key in enumerate(files):
        fname = f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
        tensors = {n: rnd.value(n, *layout[n]) for n in shards[key]}
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in tensors})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
    return total


def write_target(out: Path, config: dict, *, nvfp4: bool, device: str) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    layout = bs.checkpoint_layout(hf_state_shapes(config), nvfp4=nvfp4)
    written = _write_shards(out, layout, _Random(device, bs.SEED + (1 if nvfp4 else 0)))
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}) + "\n")
    if nvfp4:
        (out / "hf_quant_config.json").write_text(json.dumps(bs.hf_quant_config(), indent=1) + "\n")
    return {"tensors": len(layout), "bytes": written}


def drafter_layout(config: dict) -> dict[str, tuple[str, list[int]]]:
    """Weights under the names vLLM 0.21.0's qwen3_dflash.py loads (no embedding, no LM head)."""
    h, inter, hd = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    taps = len(config["dflash_config"]["target_layer_ids"])
    out = {"fc.weight": ("BF16", [h, h * taps]), "hidden_norm.weight": ("BF16", [h]),
           "norm.weight": ("BF16", [h])}
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": ("BF16", [q, h]),
            p + "self_attn.k_proj.weight": ("BF16", [kv, h]),
            p + "self_attn.v_proj.weight": ("BF16", [kv, h]),
            p + "self_attn.o_proj.weight": ("BF16", [h, q]),
            p + "self_attn.q_norm.weight": ("BF16", [hd]),
            p + "self_attn.k_norm.weight": ("BF16", [hd]),
            p + "mlp.gate_proj.weight": ("BF16", [inter, h]),
            p + "mlp.up_proj.weight": ("BF16", [inter, h]),
            p + "mlp.down_proj.weight": ("BF16", [h, inter]),
            p + "input_layernorm.weight": ("BF16", [h]),
            p + "post_attention_layernorm.weight": ("BF16", [h]),
        }
    return out


def write_drafter(out: Path, config: dict, device: str) -> dict:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    layout = drafter_layout(config)
    rnd = _Random(device, bs.SEED + 2)
    tensors = {n: rnd.value(n, *spec) for n, spec in layout.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return {"tensors": len(tensors), "bytes": sum(t.numel() * t.element_size() for t in tensors.values())}


def configs(layers: int, tiny: bool) -> tuple[dict, dict, dict]:
    """(bf16 target, NVFP4 target, drafter) configs."""
    if not tiny:
        return (bs.target_config(layers), bs.target_config(layers, nvfp4=True), bs.drafter_config(layers))
    bf16, nvfp4 = bs.target_config(layers, **TINY_TEXT), bs.target_config(layers, nvfp4=True, **TINY_TEXT)
    for c in (bf16, nvfp4):
        c.update(TINY_SPECIAL_IDS)
    return bf16, nvfp4, bs.drafter_config(layers, **TINY_DRAFTER)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=bs.BENCH_LAYERS)
    parser.add_argument("--tiny", action="store_true", help="small widths (CPU test)")
    parser.add_argument("--device", default=None, help="where random values are drawn (default: cuda if present)")
    args = parser.parse_args(argv)
    if args.layers < 2:
        parser.error("--layers must be at least 2 (the drafter reads layers below the last)")
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    bf16, nvfp4, drafter = configs(args.layers, args.tiny)
    t0 = time.time()
    manifest = {"layers": args.layers, "tiny": args.tiny, "sources": bs.SOURCES,
                "target_text": bf16["text_config"], "drafter": drafter, "written": {}}
    for name, cfg, quant in (("gemma4-bench-bf16", bf16, False), ("gemma4-bench-nvfp4", nvfp4, True)):
        manifest["written"][name] = write_target(args.out / name, cfg, nvfp4=quant, device=device)
        print(f"wrote {name}: {manifest['written'][name]['bytes'] / 2**30:.2f} GiB "
              f"({time.time() - t0:.0f}s)", flush=True)
    manifest["written"]["dflash-bench"] = write_drafter(args.out / "dflash-bench", drafter, device)
    (args.out / "bench-shapes.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"checkpoints under {args.out} in {time.time() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
