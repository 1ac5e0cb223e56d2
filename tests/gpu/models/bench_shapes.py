"""Gemma 4 26B-A4B and its DFlash drafter at their released widths, a few layers deep, for the step-time benchmark.

Pure Python (no torch): what the GPU benchmark builds, and the CPU unit tests
check (``tests/unit/test_gpu_bench.py``).

Where each width comes from
---------------------------
The target's text config, ``google/gemma-4-26B-A4B-it`` ``config.json``, as
public code reproduces it (the Hugging Face repository itself is not reachable
from here): a public Swift test quotes the keys of
``mlx-community/gemma-4-26b-a4b-it-4bit`` (revision 0d77464e, a conversion that
keeps Google's text config) verbatim, and public Go and Rust tests of Gemma 4
loaders carry the same numbers for the 26B-A4B (30 layers, every sixth full,
``num_global_key_value_heads`` 2, ``max_position_embeddings`` 262144). FACTS.md
("Gemma 4 26B-A4B geometry") agrees on every value it names. ``TARGET_TEXT``
below lists them; ``SOURCES`` says which is which.

The drafter, ``z-lab/gemma-4-26B-A4B-it-DFlash`` ``config.json``, quoted
verbatim by a public Rust test (hf2q) and by a public Swift test of a DFlash
loader: a qwen3-style ``DFlashDraftModel``, 5 layers (4 sliding, window 2048,
then 1 full), hidden 2816, 32 heads, 8 KV heads, head_dim 128, MLP 5632,
``target_layer_ids`` [1, 6, 11, 17, 22, 27], ``mask_token_id`` 4,
``block_size`` 16, ``final_logit_softcapping`` 30.

What the benchmark changes, and why
-----------------------------------
* Depth: ``BENCH_LAYERS`` = 6 target layers, 5 sliding + 1 full, the released
  5:1 pattern (one sixth of the model). Step times are extrapolated to the
  released 30 layers as ``T30 = T_step + (30/6 - 1) * T_forward``: the
  measured target forward (embedding, 6 decoder layers, final norm) repeated
  five times, everything outside the forward (LM head, sampler, scheduling,
  the drafter) once. This counts the embedding lookup and final norm five
  times instead of once (two small kernels) and assumes the per-layer cost
  does not depend on depth, which holds for a decoder stack of identical
  blocks run from one CUDA graph.
* The drafter reads 5 target layers instead of 6 (``target_layer_ids``
  [0..4]; the series' ``dflash-target-layer-ids-offset`` shifts them to
  layers 1..5 of the 6): its ``fc`` input is 5 x 2816 wide instead of
  6 x 2816. ``fc`` only sees the hidden states of newly accepted tokens, so
  this is a small matmul either way. Every other drafter width is real.
  vLLM 0.21.0 runs the drafter's four sliding layers as full attention
  (sliding DFlash layers came in 0.25.0, FACTS.md); at the benchmark's
  short contexts (under the 2048 window) that changes nothing.
* The vision tower is a token one (it is never built: every multimodal limit
  is 0), special token ids are the released ones.
* Weights are random (std ``INIT_STD``); the norms after each attention and
  feed-forward branch are 0.3 (as the GPU proof's stable targets), which keeps
  a random stack bf16-stable so that greedy token comparisons mean something.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

SOURCES = {
    "target": "google/gemma-4-26B-A4B-it config.json text_config, as quoted verbatim in public "
              "code (a Swift test quoting mlx-community/gemma-4-26b-a4b-it-4bit rev 0d77464e; "
              "Go and Rust Gemma 4 loader tests); FACTS.md 'Gemma 4 26B-A4B geometry'",
    "drafter": "z-lab/gemma-4-26B-A4B-it-DFlash config.json, as quoted verbatim in public code "
               "(a Rust test of hf2q; a Swift DFlash loader test)",
}

# google/gemma-4-26B-A4B-it text_config (see SOURCES).
TARGET_TEXT = {
    "hidden_size": 2816,
    "intermediate_size": 2112,           # dense MLP beside the MoE block
    "moe_intermediate_size": 704,        # one expert's width
    "num_experts": 128,
    "top_k_experts": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,            # sliding layers
    "num_global_key_value_heads": 2,     # full layers
    "head_dim": 256,                     # sliding layers
    "global_head_dim": 512,              # full layers
    "attention_k_eq_v": True,            # full layers: V is K
    "vocab_size": 262144,
    "num_hidden_layers": 30,
    "sliding_window": 1024,
    "final_logit_softcapping": 30.0,
    "max_position_embeddings": 262144,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "enable_moe_block": True,
    "num_kv_shared_layers": 0,
    "hidden_size_per_layer_input": 0,
    "use_bidirectional_attention": "vision",
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                           "rope_theta": 1000000.0},
    },
}
# Released multimodal token ids (Gemma 4 configs); the video id follows them.
SPECIAL_IDS = {
    "boi_token_id": 255999, "eoi_token_id": 258882, "image_token_id": 258880,
    "video_token_id": 258884, "boa_token_id": 256000, "eoa_token_index": 258883,
    "audio_token_id": 258881,
}
# z-lab/gemma-4-26B-A4B-it-DFlash (see SOURCES).
DRAFTER = {
    "hidden_size": 2816,
    "num_hidden_layers": 5,
    "layer_types": ["sliding_attention"] * 4 + ["full_attention"],
    "sliding_window": 2048,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 5632,
    "target_layer_ids": [1, 6, 11, 17, 22, 27],
    "mask_token_id": 4,
    "block_size": 16,
    "final_logit_softcapping": 30.0,
    "rope_theta": 1000000,
    "rms_norm_eps": 1e-6,
}

BENCH_LAYERS = 6
FULL_EVERY = 6  # every sixth layer is full attention
INIT_STD = 0.02
POST_NORM_SCALE = 0.3
SEED = 20261126
# Prompt token ids stay clear of the control and multimodal ids.
PROMPT_TOKEN_RANGE = (10, 255000)
NUM_SPECULATIVE_TOKENS = 15  # the recipe's; a verify step scores 16 tokens per sequence
NVFP4_GROUP = 16
# E2M1 magnitudes (0, 0.5, 1, 1.5, 2, 3, 4, 6): the RMS of uniformly random codes.
E2M1_RMS = (sum(v * v for v in (0, 0.5, 1, 1.5, 2, 3, 4, 6)) / 8) ** 0.5
# ModelOpt keeps these in bf16 (FACTS.md: lm_head, the vision tower and embedder, routers).
NVFP4_EXCLUDE = ["lm_head", "model.vision_tower*", "model.embed_vision*",
                 "model.language_model.layers.*.router*"]


def layer_types(num_layers: int) -> list[str]:
    return ["full_attention" if (i + 1) % FULL_EVERY == 0 else "sliding_attention"
            for i in range(num_layers)]


def drafter_taps(num_layers: int) -> list[int]:
    """``target_layer_ids`` for a target of ``num_layers``: as many as the released
    drafter's six fit below the last layer once shifted by one (patch 0004)."""
    return list(range(min(len(DRAFTER["target_layer_ids"]), num_layers - 1)))


def target_config(num_layers: int = BENCH_LAYERS, *, nvfp4: bool = False, **text_overrides) -> dict:
    """config.json of the bench target (Gemma4ForConditionalGeneration)."""
    text = {**TARGET_TEXT, "model_type": "gemma4_text", "num_hidden_layers": num_layers,
            "layer_types": layer_types(num_layers), "vocab_size_per_layer_input": TARGET_TEXT["vocab_size"],
            "initializer_range": INIT_STD, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
            **text_overrides}
    text["vocab_size_per_layer_input"] = text["vocab_size"]
    vision = {"model_type": "gemma4_vision", "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
              "head_dim": 32, "patch_size": 16, "pooling_kernel_size": 3,
              "position_embedding_size": 1024, "initializer_range": INIT_STD}
    config = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
              "text_config": text, "vision_config": vision, "audio_config": None,
              "initializer_range": INIT_STD, "tie_word_embeddings": True, "dtype": "bfloat16",
              **SPECIAL_IDS}
    if nvfp4:
        config["quantization_config"] = {
            "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": NVFP4_GROUP,
            "kv_cache_quant_algo": None, "ignore": list(NVFP4_EXCLUDE),
        }
    return config


def hf_quant_config() -> dict:
    """hf_quant_config.json as ModelOpt's export writes it for NVFP4."""
    return {"producer": {"name": "modelopt", "version": "0.47.0"},
            "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None,
                             "group_size": NVFP4_GROUP, "exclude_modules": list(NVFP4_EXCLUDE)}}


def drafter_config(target_layers: int = BENCH_LAYERS, **overrides) -> dict:
    """config.json of the bench drafter (the released DFlash drafter, taps fitted to the target)."""
    d = {**DRAFTER, **overrides}
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": d["hidden_size"], "num_hidden_layers": d["num_hidden_layers"],
        "layer_types": d["layer_types"], "sliding_window": d["sliding_window"],
        "use_sliding_window": True, "max_window_layers": d["num_hidden_layers"],
        "num_attention_heads": d["num_attention_heads"],
        "num_key_value_heads": d["num_key_value_heads"], "head_dim": d["head_dim"],
        "intermediate_size": d["intermediate_size"], "hidden_act": "silu",
        "vocab_size": overrides.get("vocab_size", TARGET_TEXT["vocab_size"]),
        "max_position_embeddings": TARGET_TEXT["max_position_embeddings"],
        "rms_norm_eps": d["rms_norm_eps"], "rope_theta": d["rope_theta"], "rope_scaling": None,
        "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False,
        "block_size": d["block_size"], "num_target_layers": target_layers,
        "final_logit_softcapping": d["final_logit_softcapping"], "dtype": "bfloat16",
        "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
        "dflash_config": {"mask_token_id": d["mask_token_id"],
                          "target_layer_ids": drafter_taps(target_layers)},
    }


# ------------------------------------------------------------------ checkpoint layout


def is_post_branch_norm(name: str) -> bool:
    return "language_model" in name and (
        ".post_attention_layernorm." in name or ".post_feedforward_layernorm" in name)


def is_quantized_linear(name: str) -> bool:
    """A language-model linear ModelOpt NVFP4 quantizes (attention, dense MLP, experts)."""
    if "language_model.layers." not in name or ".router." in name:
        return False
    return any(f".{p}." in name or name.endswith(f".{p}") for p in
               ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                "gate_up_proj"))


def nvfp4_tensors(module: str, out_features: int, in_features: int) -> dict[str, tuple[str, list[int]]]:
    """The four tensors ModelOpt's export writes for one NVFP4 linear (FACTS.md):
    ``.weight`` uint8 [out, in/2] (two E2M1 codes a byte), ``.weight_scale``
    float8_e4m3fn [out, in/16] (one per 16-element block), ``.weight_scale_2``
    and ``.input_scale`` float32 scalars."""
    if in_features % NVFP4_GROUP:
        raise ValueError(f"{module}: in_features {in_features} is not a multiple of {NVFP4_GROUP}")
    return {
        f"{module}.weight": ("U8", [out_features, in_features // 2]),
        f"{module}.weight_scale": ("F8_E4M3", [out_features, in_features // NVFP4_GROUP]),
        f"{module}.weight_scale_2": ("F32", []),
        f"{module}.input_scale": ("F32", []),
    }


def expert_modules(name: str, shape: list[int]) -> list[tuple[str, int, int]]:
    """HF's fused expert tensors as the per-expert linears ModelOpt exports.

    ``experts.gate_up_proj`` [E, 2I, H] -> ``experts.{e}.gate_proj`` / ``up_proj``
    [I, H] (gate first, as transformers' Gemma4 experts split it);
    ``experts.down_proj`` [E, H, I] -> ``experts.{e}.down_proj`` [H, I].
    """
    base = name.rsplit(".", 1)[0]  # ...experts
    experts = shape[0]
    if name.endswith("gate_up_proj"):
        inter, hidden = shape[1] // 2, shape[2]
        return [(f"{base}.{e}.{proj}", inter, hidden) for e in range(experts)
                for proj in ("gate_proj", "up_proj")]
    if name.endswith("down_proj"):
        return [(f"{base}.{e}.down_proj", shape[1], shape[2]) for e in range(experts)]
    raise ValueError(f"not a fused expert tensor: {name}")


def checkpoint_layout(hf_names: dict[str, list[int]], *, nvfp4: bool) -> dict[str, tuple[str, list[int]]]:
    """name -> (safetensors dtype, shape) of the checkpoint, from the HF model's state dict.

    bf16 keeps transformers' names and the fused expert tensors (what Google's
    checkpoint has); NVFP4 splits experts per expert and packs every
    language-model linear as ``nvfp4_tensors`` says. ``lm_head.weight`` is
    tied to the embedding and not written.
    """
    out: dict[str, tuple[str, list[int]]] = {}
    for name, shape in hf_names.items():
        if name == "lm_head.weight":
            continue
        if not (nvfp4 and is_quantized_linear(name)):
            out[name] = ("BF16", list(shape))
        elif name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            for module, rows, cols in expert_modules(name, list(shape)):
                out.update(nvfp4_tensors(module, rows, cols))
        else:
            out.update(nvfp4_tensors(name.removesuffix(".weight"), shape[0], shape[1]))
    return out


def layer_of(name: str) -> int | None:
    """Decoder layer index of a language-model tensor (for sharding), else None."""
    marker = "language_model.layers."
    if marker not in name:
        return None
    return int(name.split(marker, 1)[1].split(".", 1)[0])


# ------------------------------------------------------------------ engine runs


BATCHES = (1, 4, 16, 32)
CONTEXTS = {"2k": 2048, "16k": 16384, "64k": 65536}
DECODE_PROMPT_LEN = 64
DECODE_TOKENS = 48
VERIFY_TOKENS = 40
CONTEXT_DECODE_TOKENS = 64
WALL_SHORT_TOKENS = 8  # the short run subtracted from the long one (wall-clock per step)
MAX_NUM_BATCHED_TOKENS = 8192
PER_LAYER_PATCH_ID = "gemma4-text-only-per-layer-attention-backend"


@dataclass(frozen=True)
class EngineRun:
    """One vLLM engine (one subprocess) and what it measures.

    ``target``: "bf16" or "nvfp4". ``drafter``: None (no speculative decoding)
    or the drafter's attention backend: "flash_attn" (``fa_version`` 2 or 3)
    or "flex_attention". ``locked``: the target on TRITON_ATTN for every layer,
    as Gemma 4 is on sm_12x (the lock's own effect, set explicitly because the
    runs are text-only, where the series' per-layer patch would lift it);
    otherwise the per-layer patch's choice (``--language-model-only``).
    """

    name: str
    target: str
    drafter: str | None = None
    fa_version: int | None = None
    locked: bool = True
    contexts: bool = False  # decode at 2k/16k/64k, batch 1, with logits for the lossless check
    profile: bool = False  # torch profiler pass for the time breakdown
    disable_hybrid_kv_cache_manager: bool = False
    weight_gib: float = 12.0
    notes: list[str] = field(default_factory=list)

    @property
    def spec_tokens(self) -> int:
        return NUM_SPECULATIVE_TOKENS if self.drafter else 0

    @property
    def capture_sizes(self) -> list[int]:
        """CUDA graph sizes in tokens: exactly the measured steps' shapes."""
        per_seq = 1 + self.spec_tokens
        return [b * per_seq for b in BATCHES]

    @property
    def max_model_len(self) -> int:
        return (max(CONTEXTS.values()) + 2 * CONTEXT_DECODE_TOKENS) if self.contexts else 4096

    @property
    def kv_cache_bytes(self) -> int:
        return (6 if self.contexts else 3) << 30

    def engine_kwargs(self, target_path: str, drafter_path: str | None) -> dict:
        """``vllm.LLM`` keyword arguments (vLLM 0.21.0)."""
        kw: dict = {
            "model": target_path, "skip_tokenizer_init": True, "dtype": "bfloat16", "seed": 0,
            "max_model_len": self.max_model_len, "max_num_seqs": max(BATCHES),
            "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
            # The KV cache is sized here, so vLLM skips its free-memory profile:
            # engines start side by side. The utilization only has to fit at start.
            "kv_cache_memory_bytes": self.kv_cache_bytes, "gpu_memory_utilization": 0.2,
            "compilation_config": {"cudagraph_capture_sizes": self.capture_sizes},
        }
        attention: dict = {}
        if self.locked:
            attention["backend"] = "TRITON_ATTN"
            kw["limit_mm_per_prompt"] = {"image": 0, "video": 0}
        else:
            kw["language_model_only"] = True
        if self.fa_version is not None:
            attention["flash_attn_version"] = self.fa_version
        if attention:
            kw["attention_config"] = attention
        if self.contexts:
            kw["logprobs_mode"] = "raw_logits"
        if self.disable_hybrid_kv_cache_manager:
            kw["disable_hybrid_kv_cache_manager"] = True
        if self.drafter:
            kw["speculative_config"] = {"method": "dflash", "model": drafter_path,
                                        "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
                                        "attention_backend": self.drafter}
        return kw

    def as_dict(self) -> dict:
        return {**asdict(self), "capture_sizes": self.capture_sizes,
                "max_model_len": self.max_model_len}


# In priority order: a command cut short keeps the first ones.
RUNS = [
    EngineRun("bf16-decode-locked", "bf16", fa_version=2, contexts=True, profile=True,
              notes=["target step times without a drafter; the lock side of the per-layer comparison"]),
    EngineRun("bf16-decode-per-layer", "bf16", fa_version=2, locked=False, contexts=True,
              notes=["series patch gemma4-text-only-per-layer-attention-backend: sliding layers FLASH_ATTN (FA2), full TRITON_ATTN"]),
    EngineRun("bf16-dflash-fa3", "bf16", drafter="flash_attn", fa_version=3, profile=True),
    EngineRun("nvfp4-decode-locked", "nvfp4", weight_gib=6.0),
    EngineRun("nvfp4-dflash-fa3", "nvfp4", drafter="flash_attn", fa_version=3, weight_gib=6.0),
    EngineRun("bf16-dflash-fa2", "bf16", drafter="flash_attn", fa_version=2,
              notes=["FA2 is what FLASH_ATTN runs on sm_12x"]),
    EngineRun("bf16-dflash-flex", "bf16", drafter="flex_attention", disable_hybrid_kv_cache_manager=True,
              notes=["hybrid KV cache manager off: with shared KV tensors the series gives every layer the "
                     "(num_blocks, 2, ...) layout, which FLEX_ATTENTION refuses (patch 0003)"]),
]


def run_by_name(name: str) -> EngineRun:
    for run in RUNS:
        if run.name == name:
            return run
    raise KeyError(f"unknown engine run {name!r}; known: {[r.name for r in RUNS]}")
