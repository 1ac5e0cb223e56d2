"""Gemma 4 26B-A4B at full size, in NVIDIA's NVFP4 export layout, and its DFlash drafter (issue 27).

Pure Python (no torch): what ``make_fullsize_checkpoints.py`` writes on the
GPU host, what ``roofline.py`` counts, and what the CPU tests check.

Where each fact comes from (``SOURCES``)
---------------------------------------
* Text config: the released ``google/gemma-4-26B-A4B-it`` text config, as
  ``bench_shapes.TARGET_TEXT`` already carries it (its docstring names the
  public code that quotes it), at its released depth of 30 layers.
* Vision tower: the released ``vision_config`` of the same config.json, as
  public code quotes it: a notes file transcribing the config.json downloaded
  from huggingface.co/google/gemma-4-26B-A4B-it (2026-04-03), and Go, Rust and
  Python loader tests of Gemma 4 that carry the same block (hidden 1152,
  intermediate 4304, 27 layers, 16 heads and 16 KV heads of 72, patch 16,
  pooling 3, position table 10240, rope theta 100, ``standardize`` true,
  ``use_clipped_linears`` false, 280 soft tokens per image). Built by
  transformers it has 0.57 B parameters (model cards: "~550M").
* NVIDIA's export (``nvidia/Gemma-4-26B-A4B-NVFP4`` at the revision pinned in
  recipes/shared/models.yaml): a public Rust loader test that validates that
  checkpoint's config.json reproduces its ``quantization_config``: producer
  modelopt 0.43.0rc2.dev91+gc79ebc014, ``quant_algo`` NVFP4, group 16 (W4A4
  ``config_groups``), ``kv_cache_scheme`` 8-bit float, and ``ignore`` =
  ``lm_head``, ``model.embed_vision*``, ``model.vision_tower*`` and, for every
  layer L, ``model.language_model.layers.L.{mlp,router,self_attn}*`` (sorted);
  its expert tensors are ``...layers.L.experts.E.{gate,up,down}_proj.*`` with
  ``down_proj.weight`` U8 [2816, 352]. So only the routed experts are NVFP4;
  attention, the dense MLP, routers, norms, the tied embedding (the LM head)
  and the vision tower stay bf16. recipes/shared/models.yaml records the same
  (kv_cache_quant_algo FP8, no KV scale tensors, 18.79 GB of safetensors),
  and so does a public model card comparing it with a fully quantized export
  ("the official NVIDIA checkpoint leaves self-attention and MLP in BF16").
* Drafter: ``z-lab/gemma-4-26B-A4B-it-DFlash`` (``bench_shapes.DRAFTER``) at its
  released taps ``target_layer_ids`` [1, 6, 11, 17, 22, 27]: 58 tensors,
  0.80 GiB, which is what models.yaml records for the released file.

The released tokenizer is not reproduced (see ``fullsize_tokenizer.py``).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)

import bench_shapes as bs  # noqa: E402

SOURCES = {
    "text": bs.SOURCES["target"],
    "vision": "google/gemma-4-26B-A4B-it config.json vision_config, as public code quotes it (a notes "
              "file transcribing the config.json from huggingface.co, 2026-04-03; Go/Rust/Python Gemma 4 "
              "loader tests with the same block)",
    "nvidia_layout": "nvidia/Gemma-4-26B-A4B-NVFP4 config.json quantization_config, as a public Rust "
                     "loader test of that checkpoint reproduces it; recipes/shared/models.yaml (format, "
                     "sizes, no KV scale tensors)",
    "drafter": bs.SOURCES["drafter"],
}

LAYERS = bs.TARGET_TEXT["num_hidden_layers"]  # 30
VISION = {
    "model_type": "gemma4_vision", "hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27,
    "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 72, "hidden_activation": "gelu_pytorch_tanh",
    "patch_size": 16, "pooling_kernel_size": 3, "position_embedding_size": 10240, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_theta": 100.0, "rope_type": "default"}, "standardize": True,
    "use_clipped_linears": False, "max_position_embeddings": 131072, "default_output_length": 280,
    "initializer_range": bs.INIT_STD,
}
SOFT_TOKENS_PER_IMAGE = 280
END_OF_TURN_ID = 106  # released eos_token_id [1, 106]
NVIDIA_PRODUCER = {"name": "modelopt", "version": "0.43.0rc2.dev91+gc79ebc014"}


def nvidia_ignore(num_layers: int = LAYERS) -> list[str]:
    """NVIDIA's ``ignore`` / ``exclude_modules``: everything but the routed experts."""
    out = ["lm_head", "model.embed_vision*", "model.vision_tower*"]
    out += [f"model.language_model.layers.{i}.{part}*" for i in range(num_layers)
            for part in ("mlp", "router", "self_attn")]
    return sorted(out)


def quantization_config(num_layers: int = LAYERS) -> dict:
    """config.json ``quantization_config`` in the flat form ModelOpt 0.43 writes (vLLM 0.21.0 reads
    ``quant_algo``, ``ignore`` and ``kv_cache_scheme`` from it; group size defaults to 16)."""
    group = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": bs.NVFP4_GROUP}
    return {"quant_method": "modelopt", "quant_algo": "NVFP4", "producer": dict(NVIDIA_PRODUCER),
            "config_groups": {"group_0": {"weights": dict(group), "input_activations": dict(group),
                                          "targets": ["Linear"]}},
            "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"},
            "ignore": nvidia_ignore(num_layers)}


def hf_quant_config(num_layers: int = LAYERS) -> dict:
    return {"producer": dict(NVIDIA_PRODUCER),
            "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": bs.NVFP4_GROUP,
                             "exclude_modules": nvidia_ignore(num_layers)}}


def target_config(*, vision: dict | None = None, **text_overrides) -> dict:
    """config.json of the full-size target: the released text and vision configs, NVIDIA's quantization."""
    cfg = bs.target_config(text_overrides.pop("num_hidden_layers", LAYERS), **text_overrides)
    layers = cfg["text_config"]["num_hidden_layers"]
    cfg["vision_config"] = {**VISION, **(vision or {})}
    cfg["vision_soft_tokens_per_image"] = cfg["vision_config"]["default_output_length"]
    cfg["eos_token_id"] = [1, END_OF_TURN_ID]
    cfg["quantization_config"] = quantization_config(layers)
    return cfg


def drafter_config(target_layers: int = LAYERS, **overrides) -> dict:
    """The released drafter: its own taps (bench_shapes fits them to a shallow target instead)."""
    cfg = bs.drafter_config(target_layers, **overrides)
    taps = overrides.get("target_layer_ids", bs.DRAFTER["target_layer_ids"])
    if max(taps) + 1 >= target_layers:
        raise ValueError(f"taps {taps} do not fit below the last of {target_layers} layers once shifted by one")
    cfg["dflash_config"]["target_layer_ids"] = list(taps)
    return cfg


# ------------------------------------------------------------------ checkpoint layout


def is_expert(name: str) -> bool:
    return ".experts." in name and "language_model" in name


def nvidia_layout(hf_names: dict[str, list[int]]) -> dict[str, tuple[str, list[int]]]:
    """name -> (safetensors dtype, shape) in NVIDIA's export: experts split per expert and NVFP4,
    everything else bf16 under transformers' names; the tied ``lm_head.weight`` not written."""
    out: dict[str, tuple[str, list[int]]] = {}
    for name, shape in hf_names.items():
        if name == "lm_head.weight":
            continue
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            for module, rows, cols in bs.expert_modules(name, list(shape)):
                out.update(bs.nvfp4_tensors(module, rows, cols))
        else:
            out[name] = ("BF16", list(shape))
    return out


DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "U8": 1, "I8": 1, "F8_E4M3": 1, "I32": 4, "I64": 8}


def nbytes(dtype: str, shape: list[int] | tuple[int, ...]) -> int:
    return DTYPE_BYTES[dtype] * math.prod(shape)


# What a tensor is, for the byte counts (generator) and for what a decode step reads (roofline).
CLASSES = ("experts", "attention", "dense_mlp", "router", "norms_other", "embedding", "lm_head", "vision",
           "drafter")


def tensor_class(name: str) -> str:
    if name.startswith(("model.vision_tower.", "model.embed_vision.")):
        return "vision"
    if name == "lm_head.weight":
        return "lm_head"
    if name.endswith("embed_tokens.weight"):
        return "embedding"
    if is_expert(name):
        return "experts"
    if ".self_attn." in name:
        return "attention"
    if ".mlp." in name:
        return "dense_mlp"
    if ".router." in name:
        return "router"
    return "norms_other"


def bytes_by_class(layout: dict[str, tuple[str, list[int]]], *, drafter: bool = False) -> dict[str, int]:
    out = dict.fromkeys(CLASSES, 0)
    for name, (dtype, shape) in layout.items():
        out["drafter" if drafter else tensor_class(name)] += nbytes(dtype, shape)
    return {k: v for k, v in out.items() if v}


def layer_of(name: str) -> int | None:
    return bs.layer_of(name)


def shard_plan(layout: dict[str, tuple[str, list[int]]], max_bytes: int) -> list[list[str]]:
    """Tensors in write order (embedding and the rest, layers in order, the vision tower last),
    cut into shards of at most ``max_bytes`` (a single larger tensor gets a shard of its own)."""
    def key(name: str):
        layer = layer_of(name)
        group = 2 if tensor_class(name) == "vision" else (0 if layer is None else 1)
        return (group, -1 if layer is None else layer, name)

    shards: list[list[str]] = [[]]
    size = 0
    for name in sorted(layout, key=key):
        n = nbytes(*layout[name])
        if shards[-1] and size + n > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    return [s for s in shards if s]


def parameter_counts(hf_names: dict[str, list[int]], text: dict) -> dict:
    """Parameters of the bf16 model (transformers' names): total with and without the vision tower,
    and active per token (top-k of the routed experts, every other language-model weight, the
    embedding once: the LM head is tied to it)."""
    total = sum(math.prod(s) for n, s in hf_names.items() if n != "lm_head.weight")
    vision = sum(math.prod(s) for n, s in hf_names.items() if tensor_class(n) == "vision")
    experts = sum(math.prod(s) for n, s in hf_names.items() if n.endswith(("experts.gate_up_proj",
                                                                           "experts.down_proj")))
    active = total - vision - experts + experts * text["top_k_experts"] // text["num_experts"]
    return {"params_total": total, "params_text": total - vision, "params_vision": vision,
            "params_experts": experts, "params_active": active}
