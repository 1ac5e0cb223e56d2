"""Checkpoint and drafter checks against hand-written config.json files.

The weights are real safetensors files written here with the plain format
(8-byte header length, JSON header, zero bytes): the checks read only the
headers, so no torch is needed and each broken case is one edited field.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.checkpoint import (
    CheckpointInfo,
    drafter_version_warning,
    inspect_drafter,
    inspect_target,
    quantization_flag_warning,
    read_tensor_index,
)

REPO = Path(__file__).resolve().parents[2]
BYTES = {"BF16": 2, "F16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1}

HIDDEN = 128
HEADS = 2
VOCAB = 1024
LAYER_TYPES = ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    header: dict = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = BYTES[dtype]
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def gemma4_config(**text_overrides) -> dict:
    text = {
        "model_type": "gemma4_text",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "num_hidden_layers": len(LAYER_TYPES),
        "num_attention_heads": HEADS,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "global_head_dim": 512,
        "layer_types": list(LAYER_TYPES),
        "use_bidirectional_attention": "vision",
        "enable_moe_block": True,
        "num_experts": 4,
    }
    text.update(text_overrides)
    text = {k: v for k, v in text.items() if v is not None}
    return {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "dtype": "bfloat16",
        "text_config": text,
        "vision_config": {"model_type": "gemma4_vision", "hidden_size": 64},
    }


def gemma4_tensors(global_head_dim: int = 512, *, nvfp4: bool = False, quantized_router: bool = False) -> dict:
    tensors: dict[str, tuple[str, list[int]]] = {"model.language_model.embed_tokens.weight": ("BF16", [VOCAB, HIDDEN])}

    def linear(name: str, out: int, inp: int, quantized: bool) -> None:
        if quantized:
            tensors[f"{name}.weight"] = ("U8", [out, inp // 2])
            tensors[f"{name}.weight_scale"] = ("F8_E4M3", [out, inp // 16])
            tensors[f"{name}.weight_scale_2"] = ("F32", [])
            tensors[f"{name}.input_scale"] = ("F32", [])
        else:
            tensors[f"{name}.weight"] = ("BF16", [out, inp])

    for i, kind in enumerate(LAYER_TYPES):
        head = global_head_dim if kind == "full_attention" else 256
        p = f"model.language_model.layers.{i}."
        linear(p + "self_attn.q_proj", HEADS * head, HIDDEN, nvfp4)
        linear(p + "self_attn.o_proj", HIDDEN, HEADS * head, nvfp4)
        linear(p + "router.proj", 4, HIDDEN, quantized_router)
        linear(p + "experts.0.gate_proj", 64, HIDDEN, nvfp4)
    tensors["model.vision_tower.encoder.layers.0.mlp.up_proj.linear.weight"] = ("BF16", [128, 64])
    return tensors


def make_target(root: Path, config: dict, tensors: dict, *, hf_quant: dict | None = None) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config))
    if tensors:
        write_safetensors(root / "model.safetensors", tensors)
    if hf_quant is not None:
        (root / "hf_quant_config.json").write_text(json.dumps(hf_quant))
    return root


NVFP4_QUANT = {
    "producer": {"name": "modelopt", "version": "0.47.0"},
    "quantization": {
        "quant_algo": "NVFP4",
        "group_size": 16,
        "exclude_modules": ["lm_head", "model.vision_tower*", "model.embed_vision*", "model.language_model.layers.0.router*"],
    },
}


def nvfp4_target(root: Path, **kw) -> Path:
    config = gemma4_config()
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4"}
    return make_target(root, config, gemma4_tensors(nvfp4=True, **kw), hf_quant=NVFP4_QUANT)


def blocking(reasons):
    return [r for r in reasons if r.blocking]


# --------------------------------------------------------------------------- target


def test_missing_directory_is_one_blocking_reason(tmp_path):
    info, reasons = inspect_target(tmp_path / "nope", expected_format="modelopt-nvfp4", vllm_version="0.21.0")
    assert info.format == "unknown"
    assert len(reasons) == 1 and reasons[0].blocking and reasons[0].area == "checkpoint"
    assert str(tmp_path / "nope") in reasons[0].message and "does not exist" in reasons[0].message


def test_file_instead_of_directory(tmp_path):
    f = tmp_path / "model.bin"
    f.write_text("x")
    _, reasons = inspect_target(f, expected_format=None, vllm_version="0.21.0")
    assert len(reasons) == 1 and "is not a directory" in reasons[0].message


def test_missing_config_json(tmp_path):
    (tmp_path / "m").mkdir()
    _, reasons = inspect_target(tmp_path / "m", expected_format=None, vllm_version="0.21.0")
    assert len(reasons) == 1 and reasons[0].blocking
    assert "config.json is missing" in reasons[0].message


def test_corrupt_config_json(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{not json")
    _, reasons = inspect_target(tmp_path / "m", expected_format=None, vllm_version="0.21.0")
    assert len(reasons) == 1 and "not readable JSON" in reasons[0].message


def test_bf16_gemma4_fields(tmp_path):
    root = make_target(tmp_path / "bf16", gemma4_config(), gemma4_tensors())
    info, reasons = inspect_target(root, expected_format=None, vllm_version="0.21.0")
    assert reasons == []
    assert info.format == "bf16"
    assert info.architecture == "Gemma4ForConditionalGeneration"
    assert info.is_gemma4 and info.mm_prefix
    assert (info.num_layers, info.vocab_size, info.hidden_size) == (4, VOCAB, HIDDEN)
    assert (info.head_dim, info.global_head_dim) == (256, 512)


def test_bf16_where_nvfp4_expected_names_file_and_field(tmp_path):
    root = make_target(tmp_path / "bf16", gemma4_config(), gemma4_tensors())
    _, reasons = inspect_target(root, expected_format="modelopt-nvfp4", vllm_version="0.21.0")
    (reason,) = blocking(reasons)
    assert "modelopt-nvfp4" in reason.message
    assert str(root / "config.json") in reason.message and "quantization_config" in reason.message
    assert "hf_quant_config.json" in reason.message
    assert "launcher quantize" in reason.hint


def test_modelopt_nvfp4_detected_from_hf_quant_config(tmp_path):
    root = nvfp4_target(tmp_path / "q")
    info, reasons = inspect_target(root, expected_format="modelopt-nvfp4", vllm_version="0.21.0")
    assert blocking(reasons) == []
    assert info.format == "modelopt-nvfp4" and info.quant_algo == "NVFP4"
    assert "lm_head" in info.exclude_modules


def test_modelopt_nvfp4_detected_from_quantization_config_alone(tmp_path):
    config = gemma4_config()
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["lm_head"]}
    root = make_target(tmp_path / "q", config, gemma4_tensors(nvfp4=True))
    info, reasons = inspect_target(root, expected_format="modelopt-nvfp4", vllm_version="0.21.0")
    assert info.format == "modelopt-nvfp4" and blocking(reasons) == []


def test_modelopt_fp8_is_not_nvfp4(tmp_path):
    quant = {"quantization": {"quant_algo": "FP8", "exclude_modules": []}}
    root = make_target(tmp_path / "q", gemma4_config(), gemma4_tensors(), hf_quant=quant)
    info, reasons = inspect_target(root, expected_format="modelopt-nvfp4", vllm_version="0.21.0")
    assert info.format == "unknown" and info.quant_algo == "FP8"
    assert any("'FP8'" in r.message and r.blocking for r in reasons)


def test_compressed_tensors_where_nvfp4_expected(tmp_path):
    config = gemma4_config()
    config["quantization_config"] = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}
    root = make_target(tmp_path / "ct", config, gemma4_tensors())
    info, reasons = inspect_target(root, expected_format="modelopt-nvfp4", vllm_version="0.21.0")
    assert info.format == "compressed-tensors"
    (reason,) = blocking(reasons)
    assert "quantization_config.quant_method is 'compressed-tensors'" in reason.message


def test_missing_global_head_dim_blocks_when_weights_disagree_with_the_default(tmp_path):
    # Full-attention weights at head dim 384: transformers <= 5.13 would fill
    # the missing field with 512, so vLLM 0.21.0 would build the wrong shapes.
    root = make_target(tmp_path / "m", gemma4_config(global_head_dim=None), gemma4_tensors(global_head_dim=384))
    info, reasons = inspect_target(root, expected_format=None, vllm_version="0.21.0")
    assert info.global_head_dim is None
    (reason,) = blocking(reasons)
    assert str(root / "config.json") in reason.message
    assert "layer 3" in reason.message and "384" in reason.message and "512" in reason.message
    assert '"global_head_dim": 384' in reason.hint


def test_missing_global_head_dim_without_readable_weights_blocks_on_021(tmp_path):
    root = make_target(tmp_path / "m", gemma4_config(global_head_dim=None), {})
    _, reasons = inspect_target(root, expected_format=None, vllm_version="0.21.0")
    messages = [r.message for r in blocking(reasons)]
    assert any("text_config.global_head_dim is missing" in m for m in messages)
    assert any("no *.safetensors weights" in m for m in messages)


def test_missing_global_head_dim_matching_the_default_is_a_warning(tmp_path):
    root = make_target(tmp_path / "m", gemma4_config(global_head_dim=None), gemma4_tensors(global_head_dim=512))
    _, reasons = inspect_target(root, expected_format=None, vllm_version="0.21.0")
    assert blocking(reasons) == []
    (warn,) = reasons
    assert "text_config.global_head_dim is missing" in warn.message and "matches the weights" in warn.message


def test_per_layer_config_satisfies_033_but_not_021(tmp_path):
    # What transformers >= 5.15 writes: per_layer_config instead of global_head_dim.
    config = gemma4_config(global_head_dim=None, per_layer_config={"3": {"head_dim": 384}})
    root = make_target(tmp_path / "m", config, gemma4_tensors(global_head_dim=384))
    _, reasons_033 = inspect_target(root, expected_format=None, vllm_version="0.33.0")
    assert blocking(reasons_033) == []
    _, reasons_021 = inspect_target(root, expected_format=None, vllm_version="0.21.0")
    (reason,) = blocking(reasons_021)
    assert "transformers' default" in reason.message


def test_global_head_dim_contradicting_the_weights(tmp_path):
    root = make_target(tmp_path / "m", gemma4_config(global_head_dim=256), gemma4_tensors(global_head_dim=512))
    _, reasons = inspect_target(root, expected_format=None, vllm_version="0.21.0")
    (reason,) = blocking(reasons)
    assert "(text_config.global_head_dim)" in reason.message and "512" in reason.message


def test_head_dim_contradicting_the_weights(tmp_path):
    root = make_target(tmp_path / "m", gemma4_config(head_dim=128), gemma4_tensors())
    _, reasons = inspect_target(root, expected_format=None, vllm_version="0.21.0")
    (reason,) = blocking(reasons)
    assert "text_config.head_dim is 128" in reason.message and "256" in reason.message


def test_short_layer_types(tmp_path):
    root = make_target(tmp_path / "m", gemma4_config(layer_types=LAYER_TYPES[:2]), gemma4_tensors())
    _, reasons = inspect_target(root, expected_format=None, vllm_version="0.21.0")
    assert any("text_config.layer_types has 2 entries for 4 layers" in r.message for r in blocking(reasons))


def test_missing_vocab_size_named(tmp_path):
    root = make_target(tmp_path / "m", gemma4_config(vocab_size=None), gemma4_tensors())
    _, reasons = inspect_target(root, expected_format=None, vllm_version="0.21.0")
    assert any("text_config.vocab_size is missing" in r.message for r in blocking(reasons))


def test_quantized_router_blocks(tmp_path):
    root = nvfp4_target(tmp_path / "q", quantized_router=True)
    _, reasons = inspect_target(root, expected_format="modelopt-nvfp4", vllm_version="0.21.0")
    (reason,) = blocking(reasons)
    assert "router.proj.weight_scale" in reason.message


def test_corrupt_safetensors_named(tmp_path):
    root = make_target(tmp_path / "m", gemma4_config(), {})
    (root / "model.safetensors").write_bytes(b"\x01")
    _, reasons = inspect_target(root, expected_format=None, vllm_version="0.21.0")
    assert any("model.safetensors" in r.message and "not readable" in r.message for r in blocking(reasons))


def _cut(file: Path, keep_fraction: float) -> None:
    """Truncate a safetensors file inside its data region, header intact (an interrupted copy)."""
    (length,) = struct.unpack("<Q", file.read_bytes()[:8])
    data = file.read_bytes()
    data_bytes = len(data) - 8 - length
    assert data_bytes > 2
    file.write_bytes(data[: 8 + length + int(data_bytes * keep_fraction)])


def test_safetensors_cut_off_in_its_data_region_blocks_target_and_drafter(tmp_path):
    """Issue 28.7: the header still parsed, so a truncated file passed verify and preflight."""
    target = nvfp4_target(tmp_path / "t")
    _cut(target / "model.safetensors", 0.5)
    _, reasons = inspect_target(target, expected_format=None, vllm_version="0.21.0")
    assert any("model.safetensors" in r.message and "cut off" in r.message for r in blocking(reasons))
    drafter = make_drafter(tmp_path / "d")
    _cut(drafter / "model.safetensors", 0.9)
    assert any("cut off" in r.message for r in blocking(inspect_drafter(drafter, target=TARGET)))


def test_sharded_index_is_followed(tmp_path):
    root = tmp_path / "sharded"
    root.mkdir()
    tensors = gemma4_tensors()
    names = sorted(tensors)
    half = len(names) // 2
    write_safetensors(root / "a.safetensors", {n: tensors[n] for n in names[:half]})
    write_safetensors(root / "b.safetensors", {n: tensors[n] for n in names[half:]})
    (root / "stray.safetensors").write_bytes(b"junk that must not be read")
    weight_map = {n: ("a.safetensors" if i < half else "b.safetensors") for i, n in enumerate(names)}
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    index = read_tensor_index(root)
    assert set(index) == set(tensors)
    assert index[names[-1]].file == "b.safetensors"


def test_non_gemma_model_has_no_gemma_checks(tmp_path):
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
              "num_hidden_layers": 2, "vocab_size": 100, "hidden_size": 64}
    root = make_target(tmp_path / "llama", config, {"model.embed_tokens.weight": ("BF16", [100, 64])})
    info, reasons = inspect_target(root, expected_format=None, vllm_version="0.21.0")
    assert reasons == [] and not info.is_gemma4 and not info.mm_prefix and info.format == "bf16"


# --------------------------------------------------------------------------- drafter

TARGET = CheckpointInfo(path=Path("/target"), format="modelopt-nvfp4", num_layers=6, vocab_size=4096, hidden_size=256)


def make_drafter(root: Path, *, fc_in: int | None = None, **overrides) -> Path:
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "vocab_size": 4096,
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "dflash_config": {"mask_token_id": 4095, "target_layer_ids": [1, 3, 4]},
    }
    for key, value in overrides.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config))
    write_safetensors(root / "model.safetensors", {"fc.weight": ("BF16", [256, fc_in or 256 * 3]),
                                                    "norm.weight": ("BF16", [256])})
    return root


def test_valid_drafter(tmp_path):
    assert inspect_drafter(make_drafter(tmp_path / "d"), target=TARGET) == []


def test_drafter_missing_directory(tmp_path):
    (reason,) = inspect_drafter(tmp_path / "none", target=TARGET)
    assert reason.area == "drafter" and reason.blocking and "does not exist" in reason.message


def test_drafter_wrong_architecture(tmp_path):
    root = make_drafter(tmp_path / "d", architectures=["Qwen3ForCausalLM"])
    (reason,) = inspect_drafter(root, target=TARGET)
    assert str(root / "config.json") in reason.message and "architectures" in reason.message
    assert "DFlashDraftModel" in reason.message


def test_drafter_mask_token_missing(tmp_path):
    root = make_drafter(tmp_path / "d", dflash_config={"target_layer_ids": [1, 3, 4]})
    (reason,) = inspect_drafter(root, target=TARGET)
    assert "dflash_config.mask_token_id is missing" in reason.message


def test_drafter_mask_token_outside_target_vocab(tmp_path):
    small_target = CheckpointInfo(path=Path("/t"), num_layers=6, vocab_size=2048, hidden_size=256)
    root = make_drafter(tmp_path / "d")
    (reason,) = inspect_drafter(root, target=small_target)
    assert "dflash_config.mask_token_id 4095" in reason.message and "target's vocabulary (size 2048)" in reason.message


def test_drafter_mask_token_outside_its_own_vocab(tmp_path):
    root = make_drafter(tmp_path / "d", vocab_size=4000)
    (reason,) = inspect_drafter(root, target=None)
    assert "drafter's vocabulary (size 4000)" in reason.message


def test_drafter_layer_id_out_of_range(tmp_path):
    root = make_drafter(tmp_path / "d", dflash_config={"mask_token_id": 1, "target_layer_ids": [1, 3, 6]})
    (reason,) = inspect_drafter(root, target=TARGET)
    assert "dflash_config.target_layer_ids[2] = 6" in reason.message and "6 layers" in reason.message


def test_drafter_negative_and_non_int_layer_ids(tmp_path):
    root = make_drafter(tmp_path / "d", dflash_config={"mask_token_id": 1, "target_layer_ids": [-1, "x", 2]})
    messages = [r.message for r in inspect_drafter(root, target=TARGET)]
    assert any("target_layer_ids[0] = -1" in m for m in messages)
    assert any("target_layer_ids[1] is 'x'" in m for m in messages)


def test_drafter_without_layer_ids(tmp_path):
    root = make_drafter(tmp_path / "d", dflash_config={"mask_token_id": 1})
    messages = [r.message for r in inspect_drafter(root, target=TARGET)]
    assert any("dflash_config.target_layer_ids is missing" in m for m in messages)


def test_drafter_missing_dflash_config(tmp_path):
    root = make_drafter(tmp_path / "d", dflash_config=None)
    messages = [r.message for r in inspect_drafter(root, target=TARGET)]
    assert any("dflash_config is missing" in m for m in messages)


def test_drafter_target_hidden_size_mismatch(tmp_path):
    root = make_drafter(tmp_path / "d", target_hidden_size=512, fc_in=512 * 3)
    (reason,) = inspect_drafter(root, target=TARGET)
    assert "target_hidden_size is 512" in reason.message and "hidden_size is 256" in reason.message


def test_drafter_fc_input_disagrees_with_layer_count(tmp_path):
    # fc trained on 2 target layers, config lists 3.
    root = make_drafter(tmp_path / "d", fc_in=256 * 2)
    (reason,) = inspect_drafter(root, target=TARGET)
    assert "fc.weight has 512 inputs" in reason.message and "256 x 3 target layers = 768" in reason.message
    assert "model.safetensors" in reason.message


def test_drafter_without_target_checks_only_itself(tmp_path):
    root = make_drafter(tmp_path / "d", dflash_config={"mask_token_id": 1, "target_layer_ids": [50, 60, 70]})
    assert inspect_drafter(root, target=None) == []


def make_speculators_drafter(root: Path, **overrides) -> Path:
    # The speculators layout vLLM 0.21.0 converts on load (speculators/algos.py update_dflash).
    config = {
        "speculators_model_type": "dflash",
        "mask_token_id": 4095,
        "aux_hidden_state_layer_ids": [1, 3, 4],
        "target_hidden_size": 256,
        "transformer_layer_config": {"model_type": "qwen3", "hidden_size": 256, "vocab_size": 4096},
        "speculators_config": {"proposal_methods": [{"speculative_tokens": 8}], "verifier": {"name_or_path": "t"}},
    }
    config.update(overrides)
    config = {k: v for k, v in config.items() if v is not None}
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config))
    write_safetensors(root / "model.safetensors", {"fc.weight": ("BF16", [256, 768])})
    return root


def test_speculators_layout_drafter(tmp_path):
    assert inspect_drafter(make_speculators_drafter(tmp_path / "ok"), target=TARGET) == []
    root = make_speculators_drafter(tmp_path / "bad", mask_token_id=None, aux_hidden_state_layer_ids=[1, 3, 9])
    messages = [r.message for r in inspect_drafter(root, target=TARGET)]
    assert any(m.endswith("mask_token_id is missing (vLLM needs it for parallel drafting)") for m in messages)
    assert any("aux_hidden_state_layer_ids[2] = 9" in m for m in messages)


def test_eagle_aux_layer_ids_fallback(tmp_path):
    root = make_drafter(tmp_path / "d", dflash_config={"mask_token_id": 1}, eagle_aux_hidden_state_layer_ids=[0, 2, 7])
    (reason,) = inspect_drafter(root, target=TARGET)
    assert "eagle_aux_hidden_state_layer_ids[2] = 7" in reason.message


def test_unquantized_dtype_read_from_weights_when_config_has_none(tmp_path):
    config = gemma4_config()
    config.pop("dtype")
    info, reasons = inspect_target(make_target(tmp_path / "bf", config, gemma4_tensors()), expected_format=None,
                                   vllm_version="0.21.0")
    assert info.format == "bf16" and reasons == []
    fp16 = {n: ("F16" if dt == "BF16" else dt, shape) for n, (dt, shape) in gemma4_tensors().items()}
    info, reasons = inspect_target(make_target(tmp_path / "fp16", config, fp16), expected_format=None,
                                   vllm_version="0.21.0")
    assert info.format == "unknown"
    assert any("unquantized, dtype 'float16'" in r.message and not r.blocking for r in reasons)


# --------------------------------------------------------------------------- arguments

NVFP4_INFO = CheckpointInfo(path=Path("/m"), format="modelopt-nvfp4", quant_algo="NVFP4")


@pytest.mark.parametrize(
    "args",
    [
        ["--quantization", "modelopt"],
        ["--max-model-len", "4096", "--quantization=modelopt"],
        ["-q", "modelopt_fp4"],
        ["-qmodelopt"],
    ],
)
def test_quantization_flag_warned_for_modelopt_checkpoint(args):
    reason = quantization_flag_warning(args, NVFP4_INFO)
    assert reason is not None and not reason.blocking and reason.area == "checkpoint"
    assert "modelopt" in reason.message and "hf_quant_config.json" in reason.hint


@pytest.mark.parametrize("args", [[], ["--quantization", "fp8"], ["--max-model-len", "4096"], ["--quantization"]])
def test_no_warning_without_modelopt_flag(args):
    assert quantization_flag_warning(args, NVFP4_INFO) is None


def test_no_warning_for_bf16_checkpoint():
    assert quantization_flag_warning(["--quantization", "modelopt"], CheckpointInfo(path=Path("/m"), format="bf16")) is None
    assert quantization_flag_warning(["--quantization", "modelopt"], None) is None
    assert quantization_flag_warning(["--quantization", "modelopt"], None, "bf16") is None


def test_warned_from_the_recipe_format_before_the_checkpoint_is_on_disk():
    reason = quantization_flag_warning(["--quantization", "modelopt"], None, "modelopt-nvfp4")
    assert reason is not None and "ModelOpt NVFP4 checkpoint" in reason.message and not reason.blocking
    # what was on disk decides where there is a checkpoint: a bf16 folder is not warned about
    assert quantization_flag_warning(["--quantization", "modelopt"], CheckpointInfo(path=Path("/m"), format="bf16"),
                                     "modelopt-nvfp4") is None


# ------------------------------------------------- drafter layers the vLLM version cannot build

# The public 26B-A4B DFlash drafter as a third-party conversion describes it
# (FACTS.md): 5 layers, sliding window 2048 on the first 4, full on the last.
PUBLIC_26B_DRAFTER = {
    "num_hidden_layers": 5,
    "layer_types": ["sliding_attention"] * 4 + ["full_attention"],
    "sliding_window": 2048,
}


@pytest.mark.parametrize("version", ["0.21.0", "0.21.0+cu132", "0.24.0"])
def test_sliding_drafter_layers_warn_before_0_25_and_recommend_0_33(tmp_path, version):
    root = make_drafter(tmp_path / "d", **PUBLIC_26B_DRAFTER)
    (reason,) = drafter_version_warning(root, version)
    assert not reason.blocking and reason.area == "drafter"
    assert str(root / "config.json") in reason.message
    assert "layers [0, 1, 2, 3] are sliding-window layers (window 2048" in reason.message
    assert "full, non-causal attention" in reason.message and "lossless" in reason.message
    assert "0.33.0" in reason.hint


def test_sliding_drafter_layers_are_fine_on_0_21_0_with_the_per_layer_patch(tmp_path):
    root = make_drafter(tmp_path / "d", **PUBLIC_26B_DRAFTER)
    assert drafter_version_warning(root, "0.21.0", per_layer_patched=True) == []
    (reason,) = drafter_version_warning(root, "0.21.0", per_layer_patched=False)
    assert "dflash-drafter-per-layer-attention" in reason.message and "launcher patch apply" in reason.hint


@pytest.mark.parametrize("version", ["0.25.0", "0.33.0"])
def test_sliding_drafter_layers_are_fine_from_0_25(tmp_path, version):
    assert drafter_version_warning(make_drafter(tmp_path / "d", **PUBLIC_26B_DRAFTER), version) == []


def test_use_swa_makes_every_drafter_layer_sliding(tmp_path):
    root = make_drafter(tmp_path / "d", dflash_config={
        "mask_token_id": 4095, "target_layer_ids": [1, 3, 4], "use_swa": True, "swa_window_size": 1024,
    })
    (reason,) = drafter_version_warning(root, "0.21.0")
    assert "layers [0, 1] are sliding-window layers (window 1024" in reason.message


@pytest.mark.parametrize("overrides", [
    {},  # no layer types: every layer full, as 0.21.0 runs them
    {"layer_types": ["full_attention", "full_attention"]},
    {"sliding_window": 2048},  # a window alone does not make a layer sliding (no use_swa)
])
def test_drafters_without_sliding_layers_get_no_warning(tmp_path, overrides):
    assert drafter_version_warning(make_drafter(tmp_path / "d", **overrides), "0.21.0") == []


def test_unreadable_drafter_config_is_left_to_inspect_drafter(tmp_path):
    root = tmp_path / "d"
    root.mkdir()
    (root / "config.json").write_text("{not json")
    assert drafter_version_warning(root, "0.21.0") == []
    assert inspect_drafter(root, target=TARGET)[0].blocking


# ------------------------------------------------------ headers that lie (issue 55.6, 55.8)


def _raw_safetensors(path: Path, header: dict, data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


LYING = {
    "huge-shape-tiny-offsets": ({"w": {"dtype": "BF16", "shape": [100000, 100000], "data_offsets": [0, 8]}}, 8),
    "offsets-reversed": ({"w": {"dtype": "U8", "shape": [8], "data_offsets": [8, 0]}}, 8),
    "offset-negative": ({"w": {"dtype": "U8", "shape": [8], "data_offsets": [-4, 4]}}, 8),
    "overlapping": ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                     "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, 4),
    "trailing-bytes": ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, 8 + 1000),
    "gap": ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
             "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, 12),
}


def _library_verdict(path: Path) -> bool:
    """What the real ``safetensors`` library says: True when it opens the file."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as fh:
            for key in fh.keys():
                fh.get_slice(key)
    except Exception:  # the library raises its own error types for each rule
        return False
    return True


@pytest.mark.parametrize("case", sorted(LYING))
def test_a_lying_header_is_refused_as_the_safetensors_library_refuses_it(case, tmp_path):
    header, data_len = LYING[case]
    folder = tmp_path / "m"
    folder.mkdir()
    path = _raw_safetensors(folder / "model.safetensors", header, b"\0" * data_len)
    assert _library_verdict(path) is False  # the reference: these files do not load
    with pytest.raises(ValueError, match="model.safetensors"):
        read_tensor_index(folder)


def test_headers_the_library_accepts_are_accepted(tmp_path):
    """The rules are not stricter than the library: a shuffled header order and __metadata__ pass both."""
    folder = tmp_path / "m"
    folder.mkdir()
    header = {"__metadata__": {"format": "pt"},
              "b": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [4, 16]},
              "a": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
              "empty": {"dtype": "U8", "shape": [0], "data_offsets": [16, 16]}}
    path = _raw_safetensors(folder / "model.safetensors", header, b"\0" * 16)
    assert _library_verdict(path) is True
    assert set(read_tensor_index(folder)) == {"a", "b", "empty"}


@pytest.mark.parametrize("entry", [
    {"dtype": "U8", "shape": [4], "data_offsets": 4},
    {"dtype": "U8", "shape": [4], "data_offsets": []},
    "not an object",
    {"dtype": "U8", "shape": 4, "data_offsets": [0, 4]},
    {"dtype": ["U8"], "shape": [4], "data_offsets": [0, 4]},
], ids=["offsets-int", "offsets-empty", "entry-string", "shape-int", "dtype-list"])
def test_a_header_with_wrong_types_is_one_error_in_verify(entry, tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(gemma4_config()))
    _raw_safetensors(folder / "model.safetensors", {"w": entry}, b"\0" * 4)
    res = subprocess.run([sys.executable, "-m", "launcher", "models", "verify", "--model", str(folder)],
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                         timeout=120)
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode != 0 and "tensor 'w'" in res.stdout + res.stderr


def test_a_header_nested_deep_is_one_error(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    raw = b"[" * 100_000 + b"]" * 100_000
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(ValueError, match="nested too deep"):
        read_tensor_index(folder)


def test_a_config_nested_deep_is_one_error_in_verify(tmp_path):
    """Issue 55.8: config.json nested 100k deep raised RecursionError through `models verify --model`."""
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    res = subprocess.run([sys.executable, "-m", "launcher", "models", "verify", "--model", str(folder)],
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                         timeout=120)
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    assert res.returncode != 0 and "nested too deep" in res.stdout + res.stderr
