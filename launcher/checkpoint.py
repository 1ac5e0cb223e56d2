"""What a checkpoint directory really is, before vLLM is asked to load it.

Many failed starts are a directory that is not what the recipe assumes: a
bf16 release where the recipe wants ModelOpt NVFP4, a Gemma 4 config saved by
a transformers that dropped ``global_head_dim``, a DFlash drafter trained for
another target. vLLM reports these minutes into a start, deep in a traceback;
here they are read off ``config.json``, ``hf_quant_config.json`` and the
safetensors headers (plain JSON, so no torch) and reported as ``Reason``
objects that name the file and the field.

Used by the plan's preflight (``launcher.checks.checkpoint``: ``inspect_target``,
``inspect_drafter``, ``drafter_version_warning``, ``quantization_flag_warning``),
by ``launcher doctor --model DIR`` (``inspect_target``) and by ``launcher
quantize`` to validate what it wrote.
"""

from __future__ import annotations

import json
import math
import shlex
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.preflight import Reason
from launcher.vllm_compat import parse_version

FORMATS = ("modelopt-nvfp4", "compressed-tensors", "bf16", "unknown")

CONFIG = "config.json"
HF_QUANT_CONFIG = "hf_quant_config.json"
SAFETENSORS_INDEX = "model.safetensors.index.json"

DFLASH_ARCHITECTURE = "DFlashDraftModel"

# transformers <= 5.13 (what vLLM 0.21.x runs with for Gemma 4) fills a missing
# text_config.global_head_dim with this default; it is what 0.21.x then uses.
_TRANSFORMERS_DEFAULT_GLOBAL_HEAD_DIM = 512

# Modules vLLM builds without a quantization method (Gemma 4's router is a
# plain GateLinear; the vision/audio towers are Hugging Face modules): a
# quantized tensor under one of them cannot load.
UNQUANTIZABLE_MARKERS = ("lm_head", "router", "vision_tower", "embed_vision", "audio_tower", "embed_audio")


@dataclass(frozen=True)
class TensorMeta:
    dtype: str  # safetensors spelling: "BF16", "U8", "F8_E4M3", "F32", ...
    shape: tuple[int, ...]
    file: str


@dataclass
class CheckpointInfo:
    """A target checkpoint as vLLM would see it. Fields are None when unknown."""

    path: Path
    format: str = "unknown"
    architecture: str | None = None
    model_type: str | None = None
    is_gemma4: bool = False
    # use_bidirectional_attention == "vision": vLLM treats the model as a
    # multimodal-prefix LM, which is what the mm-prefix drafter fixes are for.
    mm_prefix: bool = False
    num_layers: int | None = None
    vocab_size: int | None = None
    hidden_size: int | None = None
    head_dim: int | None = None
    global_head_dim: int | None = None  # as written in the text config
    layer_types: list[str] = field(default_factory=list)
    quant_algo: str | None = None  # "NVFP4", "FP8", ... for ModelOpt; quant_method otherwise
    exclude_modules: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = [self.format, self.architecture or "unknown architecture"]
        if self.num_layers is not None:
            parts.append(f"{self.num_layers} layers")
        if self.is_gemma4:
            parts.append(f"head_dim {self.head_dim} / global_head_dim {self.global_head_dim}")
        if self.mm_prefix:
            parts.append("multimodal prefix (use_bidirectional_attention=vision)")
        return ", ".join(str(p) for p in parts)


# --------------------------------------------------------------------------- files


class _Unreadable(Exception):
    def __init__(self, reason: Reason):
        self.reason = reason


def _read_json(path: Path, area: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _Unreadable(Reason(area, f"{path} is missing", True)) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _Unreadable(Reason(area, f"{path} is not readable JSON: {exc}", True)) from None
    except RecursionError:
        raise _Unreadable(Reason(area, f"{path} is not readable JSON: nested too deep", True)) from None
    if not isinstance(data, dict):
        raise _Unreadable(Reason(area, f"{path} is not a JSON object", True))
    return data


#: Bits per element of every dtype the safetensors format defines (as the library spells them).
_DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64,
    "I64": 64, "U64": 64, "F64": 64,
}


def _safetensors_header(path: Path) -> dict[str, Any]:
    # Format: 8-byte little-endian header length, then that many bytes of JSON, then the data.
    with path.open("rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise ValueError("shorter than a safetensors header")
        (length,) = struct.unpack("<Q", raw)
        if length > 100 * 1024 * 1024:
            raise ValueError(f"header claims {length} bytes")
        try:
            header = json.loads(fh.read(length))
        except RecursionError:
            raise ValueError("header JSON is nested too deep") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    _check_layout(path, header, 8 + length)
    return header


def _check_layout(path: Path, header: dict[str, Any], data_start: int) -> None:
    """The rules the ``safetensors`` library applies when it opens a file.

    Every tensor names a known dtype, a shape of non-negative ints and two
    non-negative data offsets; sorted by offset the tensors tile the data
    region from byte 0 with no gap or overlap, each exactly shape x dtype
    bytes long, and the file ends where the last one does. A header that
    lies about any of it would load as garbage, or not at all.
    """
    entries = sorted(_tensor_entries(header), key=lambda e: (e[1], e[2]))
    expected = 0
    for name, begin, end, nbytes in entries:
        if begin != expected:
            what = "overlaps the tensor before it" if begin < expected else f"leaves a gap at byte {expected}"
            raise ValueError(f"tensor {name!r}: data_offsets [{begin}, {end}] {what}")
        if end - begin != nbytes:
            raise ValueError(f"tensor {name!r}: data_offsets [{begin}, {end}] hold {end - begin} bytes, "
                             f"but its shape and dtype need {nbytes}")
        expected = end
    needed = data_start + expected
    size = path.stat().st_size
    if size < needed:
        # An interrupted copy: the header is intact, the data region is not.
        raise ValueError(f"cut off: {size} bytes, but its header places tensor data up to byte {needed}")
    if size > needed:
        raise ValueError(f"{size - needed} trailing bytes after the last tensor (its header ends the data at byte {needed})")


def _tensor_entries(header: dict[str, Any]) -> list[tuple[str, int, int, int]]:
    """(name, begin, end, bytes that shape x dtype need) per tensor; ValueError naming a malformed entry."""
    out = []
    for name, meta in header.items():
        if name == "__metadata__":
            if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
                raise ValueError("__metadata__ is not an object of strings")
            continue
        if not isinstance(meta, dict):
            raise ValueError(f"tensor {name!r}: its entry is not an object")
        dtype, shape, offsets = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in _DTYPE_BITS:
            raise ValueError(f"tensor {name!r}: unknown dtype {str(dtype)[:40]!r}")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(f"tensor {name!r}: shape {str(shape)[:60]} is not a list of non-negative integers")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int and o >= 0 for o in offsets)):
            raise ValueError(f"tensor {name!r}: data_offsets {str(offsets)[:60]} are not two non-negative integers")
        if offsets[1] < offsets[0]:
            raise ValueError(f"tensor {name!r}: data_offsets {offsets} end before they begin")
        bits = _DTYPE_BITS[dtype] * math.prod(shape)
        if bits % 8:
            raise ValueError(f"tensor {name!r}: {math.prod(shape)} elements of {dtype} are not a whole number of bytes")
        out.append((name, offsets[0], offsets[1], bits // 8))
    return out


def read_tensor_index(directory: Path) -> dict[str, TensorMeta]:
    """Name -> dtype/shape of every tensor in the directory's safetensors files.

    Reads headers only. Unreadable files raise ValueError naming the file.
    """
    files: list[Path]
    index = directory / SAFETENSORS_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
            files = sorted({directory / name for name in weight_map.values()})
        except (RecursionError, AttributeError, TypeError) as exc:
            raise ValueError(f"{index}: not a safetensors index ({type(exc).__name__})") from None
    else:
        files = sorted(directory.glob("*.safetensors"))
    tensors: dict[str, TensorMeta] = {}
    for file in files:
        try:
            header = _safetensors_header(file)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{file}: {exc}") from None
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            tensors[name] = TensorMeta(meta["dtype"], tuple(meta["shape"]), file.name)
    return tensors


# --------------------------------------------------------------------------- target


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language-model part of a (possibly multimodal) config."""
    nested = config.get("text_config")
    return nested if isinstance(nested, dict) else config


def _detect_format(
    directory: Path, config: dict[str, Any], info: CheckpointInfo, tensors: dict[str, TensorMeta] | None
) -> list[Reason]:
    """ModelOpt (hf_quant_config.json, else quantization_config.quant_method
    "modelopt"), compressed-tensors, or unquantized bf16 (config dtype, else
    the weights' dominant dtype)."""
    reasons: list[Reason] = []
    qconf = config.get("quantization_config")
    hf_quant = directory / HF_QUANT_CONFIG
    if hf_quant.is_file():
        try:
            data = _read_json(hf_quant, "checkpoint")
        except _Unreadable as exc:
            return [exc.reason]
        quant = data.get("quantization", {}) if isinstance(data.get("quantization"), dict) else {}
        info.quant_algo = quant.get("quant_algo")
        info.exclude_modules = list(quant.get("exclude_modules") or [])
        info.format = "modelopt-nvfp4" if info.quant_algo == "NVFP4" else "unknown"
        if info.quant_algo != "NVFP4":
            reasons.append(
                Reason(
                    "checkpoint",
                    f"{hf_quant}: quantization.quant_algo is {info.quant_algo!r}; only ModelOpt NVFP4 is checked here",
                    blocking=False,
                )
            )
        return reasons
    if isinstance(qconf, dict):
        method = qconf.get("quant_method")
        if method == "modelopt":
            info.quant_algo = qconf.get("quant_algo")
            info.exclude_modules = list(qconf.get("ignore") or qconf.get("exclude_modules") or [])
            info.format = "modelopt-nvfp4" if info.quant_algo == "NVFP4" else "unknown"
        elif method == "compressed-tensors":
            info.format = "compressed-tensors"
            info.quant_algo = method
        else:
            info.format = "unknown"
            info.quant_algo = str(method)
        return reasons
    dtype = config.get("dtype") or config.get("torch_dtype") or text_config(config).get("dtype")
    if dtype is None and tensors:
        counts: dict[str, int] = {}
        for meta in tensors.values():
            counts[meta.dtype] = counts.get(meta.dtype, 0) + 1
        dtype = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}.get(max(counts, key=counts.__getitem__))
    info.format = "bf16" if dtype == "bfloat16" else "unknown"
    if dtype != "bfloat16":
        what = f"dtype {dtype!r}" if dtype else "no dtype in config.json and no weights to tell"
        reasons.append(Reason("checkpoint", f"{directory / CONFIG}: unquantized, {what}", blocking=False))
    return reasons


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _find_tensor(tensors: dict[str, TensorMeta], suffix: str) -> tuple[str, TensorMeta] | None:
    """The language-model tensor ending in ``suffix`` (towers excluded)."""
    for name, meta in tensors.items():
        if name.endswith(suffix) and not any(m in name for m in ("vision", "audio")):
            return name, meta
    return None


def weights_head_dim(tensors: dict[str, TensorMeta], layer: int, num_heads: int | None) -> tuple[int, str] | None:
    """Head dim of one layer from its q_proj rows (unchanged by NVFP4 packing)."""
    if not num_heads:
        return None
    hit = _find_tensor(tensors, f"layers.{layer}.self_attn.q_proj.weight")
    if hit is None or not hit[1].shape:
        return None
    name, meta = hit
    return meta.shape[0] // num_heads, f"{meta.file}: {name} {list(meta.shape)}"


def _vllm_global_head_dim(tc: dict[str, Any], full_layer: int, vllm_version: str) -> tuple[int | None, str]:
    """The full-attention head dim the given vLLM would build, and where it comes from.

    0.21.x runs with transformers <= 5.13, which reads ``global_head_dim`` from
    the text config (default 512 when absent) and ignores ``per_layer_config``.
    Later bases run with transformers >= 5.15, which read ``per_layer_config``
    (written by 5.15+ in place of ``global_head_dim``) and fall back to it.
    """
    explicit = _int(tc.get("global_head_dim"))
    if not vllm_version.startswith("0.21"):
        per_layer = tc.get("per_layer_config")
        if isinstance(per_layer, dict):
            entry = per_layer.get(str(full_layer)) or per_layer.get(full_layer)  # type: ignore[call-overload]
            if isinstance(entry, dict) and _int(entry.get("head_dim")):
                return entry["head_dim"], f"text_config.per_layer_config[{full_layer}].head_dim"
    if explicit is not None:
        return explicit, "text_config.global_head_dim"
    return _TRANSFORMERS_DEFAULT_GLOBAL_HEAD_DIM, "transformers' default for a missing text_config.global_head_dim"


def _gemma4_reasons(
    directory: Path, tc: dict[str, Any], info: CheckpointInfo, tensors: dict[str, TensorMeta] | None, vllm_version: str
) -> list[Reason]:
    cfg = directory / CONFIG
    reasons: list[Reason] = []
    if info.head_dim is None:
        reasons.append(Reason("checkpoint", f"{cfg}: text_config.head_dim is missing", True))
    if info.num_layers is not None and len(info.layer_types) < info.num_layers:
        reasons.append(
            Reason(
                "checkpoint",
                f"{cfg}: text_config.layer_types has {len(info.layer_types)} entries for "
                f"{info.num_layers} layers (vLLM indexes it per layer)",
                True,
            )
        )
    full_layers = [i for i, t in enumerate(info.layer_types) if t == "full_attention"]
    if not full_layers:
        return reasons
    layer = full_layers[0]
    used, source = _vllm_global_head_dim(tc, layer, vllm_version)
    weights = weights_head_dim(tensors or {}, layer, _int(tc.get("num_attention_heads")))
    missing = info.global_head_dim is None
    hint = (
        f'add "global_head_dim": {weights[0] if weights else "<full-attention head dim>"} to text_config in {cfg} '
        "(transformers >= 5.15 drops it on save; vLLM 0.21.x reads it from there)"
    )
    if weights is not None and used != weights[0]:
        reasons.append(
            Reason(
                "checkpoint",
                f"{cfg}: vLLM {vllm_version} would build full-attention layer {layer} with head dim {used} "
                f"({source}) but the weights have {weights[0]} ({weights[1]})",
                True,
                hint,
            )
        )
    elif missing and vllm_version.startswith("0.21"):
        if weights is None:
            reasons.append(
                Reason(
                    "checkpoint",
                    f"{cfg}: text_config.global_head_dim is missing and the weights could not be read to "
                    f"confirm transformers' default of {used}",
                    True,
                    hint,
                )
            )
        else:
            reasons.append(
                Reason(
                    "checkpoint",
                    f"{cfg}: text_config.global_head_dim is missing; vLLM {vllm_version} falls back to {used}, "
                    "which matches the weights",
                    False,
                    hint,
                )
            )
    if info.head_dim is not None and info.layer_types:
        sliding = next((i for i, t in enumerate(info.layer_types) if t != "full_attention"), None)
        got = weights_head_dim(tensors or {}, sliding, _int(tc.get("num_attention_heads"))) if sliding is not None else None
        if got is not None and got[0] != info.head_dim:
            reasons.append(
                Reason(
                    "checkpoint",
                    f"{cfg}: text_config.head_dim is {info.head_dim} but layer {sliding}'s weights have "
                    f"{got[0]} ({got[1]})",
                    True,
                )
            )
    return reasons


def _nvfp4_layout_reasons(directory: Path, info: CheckpointInfo, tensors: dict[str, TensorMeta]) -> list[Reason]:
    """Quantized tensors where vLLM builds an unquantized module."""
    bad = sorted(
        name
        for name in tensors
        if name.endswith(".weight_scale") and any(m in name for m in UNQUANTIZABLE_MARKERS)
    )
    if not bad:
        return []
    shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
    return [
        Reason(
            "checkpoint",
            f"{directory}: quantized tensors under modules vLLM loads unquantized (routers, vision/audio towers): {shown}",
            True,
            "re-quantize with `launcher quantize`, which keeps these in bf16",
        )
    ]


def inspect_target(
    path: Path, *, expected_format: str | None, vllm_version: str
) -> tuple[CheckpointInfo, list[Reason]]:
    """Describe the target checkpoint at ``path`` and everything that would stop vLLM loading it.

    ``expected_format`` is what the recipe was written for (None: anything);
    ``vllm_version`` the base it will run on ("0.21.0", "0.33.0"), since
    Gemma 4 config fields are read differently across bases.
    """
    path = Path(path)
    info = CheckpointInfo(path=path)
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a directory"
        return info, [Reason("checkpoint", f"model directory {path} {what}", True)]
    try:
        config = _read_json(path / CONFIG, "checkpoint")
    except _Unreadable as exc:
        return info, [exc.reason]

    reasons: list[Reason] = []
    tensors: dict[str, TensorMeta] | None
    try:
        tensors = read_tensor_index(path)
    except (OSError, ValueError, KeyError) as exc:
        tensors = None
        reasons.append(Reason("checkpoint", f"weights not readable: {exc}", True))
    if tensors is not None and not tensors:
        reasons.append(Reason("checkpoint", f"{path}: no *.safetensors weights", True))
    reasons += _detect_format(path, config, info, tensors)
    archs = config.get("architectures")
    info.architecture = archs[0] if isinstance(archs, list) and archs else None
    info.model_type = config.get("model_type")
    tc = text_config(config)
    info.num_layers = _int(tc.get("num_hidden_layers"))
    info.vocab_size = _int(tc.get("vocab_size"))
    info.hidden_size = _int(tc.get("hidden_size"))
    info.head_dim = _int(tc.get("head_dim"))
    info.global_head_dim = _int(tc.get("global_head_dim"))
    info.layer_types = [t for t in tc.get("layer_types") or [] if isinstance(t, str)]
    info.is_gemma4 = (info.model_type or "").startswith("gemma4") or (info.architecture or "").startswith("Gemma4")
    info.mm_prefix = tc.get("use_bidirectional_attention") == "vision"

    for name, value in (("num_hidden_layers", info.num_layers), ("vocab_size", info.vocab_size), ("hidden_size", info.hidden_size)):
        if value is None:
            where = "text_config." if "text_config" in config else ""
            reasons.append(Reason("checkpoint", f"{path / CONFIG}: {where}{name} is missing", True))

    if expected_format is not None and info.format != expected_format:
        reasons.append(_format_mismatch(path, config, info, expected_format))
    if info.is_gemma4:
        reasons += _gemma4_reasons(path, tc, info, tensors, vllm_version)
    if info.format == "modelopt-nvfp4" and tensors:
        reasons += _nvfp4_layout_reasons(path, info, tensors)
    return info, reasons


def _format_mismatch(path: Path, config: dict[str, Any], info: CheckpointInfo, expected: str) -> Reason:
    if info.format == "unknown" and info.quant_algo:
        seen = f"{path / HF_QUANT_CONFIG} quantization.quant_algo / {path / CONFIG} quantization_config say {info.quant_algo!r}"
    elif info.format == "compressed-tensors":
        seen = f"{path / CONFIG} quantization_config.quant_method is 'compressed-tensors'"
    elif info.format == "bf16":
        seen = f"{path / CONFIG} has no quantization_config and there is no {HF_QUANT_CONFIG} (a bf16 checkpoint)"
    else:
        seen = f"{path / CONFIG}: format not recognised"
    hint = None
    if expected == "modelopt-nvfp4" and info.format == "bf16":
        hint = f"make one with: launcher quantize --model {shlex.quote(str(path))} --out {shlex.quote(f'{path}-nvfp4')}"
    return Reason("checkpoint", f"the recipe expects a {expected} checkpoint but {seen}", True, hint)


# --------------------------------------------------------------------------- drafter


_MISSING = object()


@dataclass
class _DrafterFields:
    """The fields vLLM reads from a DFlash drafter config, with the names they have in the file.

    Two layouts reach vLLM 0.21.0's DFlashDraftModel: the native one
    (``dflash_config.{mask_token_id,target_layer_ids}``) and the speculators
    one (``speculators_model_type: dflash``, top-level ``mask_token_id`` and
    ``aux_hidden_state_layer_ids``, layers under ``transformer_layer_config``),
    which vLLM converts on load (``speculators/algos.py`` ``update_dflash``).
    """

    architectures: Any
    mask: Any
    mask_field: str
    layer_ids: Any
    layer_ids_field: str
    hidden: Any
    hidden_field: str
    vocab_size: Any
    missing_block: str | None = None  # a whole section that is absent


def _drafter_fields(config: dict[str, Any]) -> _DrafterFields:
    if config.get("speculators_model_type") == "dflash":
        layer = config.get("transformer_layer_config") if isinstance(config.get("transformer_layer_config"), dict) else {}
        hidden_field = "target_hidden_size" if "target_hidden_size" in config else "transformer_layer_config.hidden_size"
        return _DrafterFields(
            architectures=[DFLASH_ARCHITECTURE],  # set by vLLM's converter
            mask=config.get("mask_token_id", _MISSING),
            mask_field="mask_token_id",
            layer_ids=config.get("aux_hidden_state_layer_ids", _MISSING),
            layer_ids_field="aux_hidden_state_layer_ids",
            hidden=config.get("target_hidden_size", layer.get("hidden_size", _MISSING)),
            hidden_field=hidden_field,
            vocab_size=layer.get("vocab_size"),
        )
    dflash = config.get("dflash_config")
    missing_block = None if isinstance(dflash, dict) else "dflash_config"
    dflash = dflash if isinstance(dflash, dict) else {}
    # The drafter sizes fc from dflash_config.target_layer_ids (falling back
    # to eagle_aux_hidden_state_layer_ids, which gpu_model_runner also reads).
    if "target_layer_ids" in dflash or "eagle_aux_hidden_state_layer_ids" not in config:
        ids, ids_field = dflash.get("target_layer_ids", _MISSING), "dflash_config.target_layer_ids"
    else:
        ids, ids_field = config["eagle_aux_hidden_state_layer_ids"], "eagle_aux_hidden_state_layer_ids"
    hidden_field = "target_hidden_size" if "target_hidden_size" in config else "hidden_size"
    return _DrafterFields(
        architectures=config.get("architectures") or [],
        mask=dflash.get("mask_token_id", _MISSING),
        mask_field="dflash_config.mask_token_id",
        layer_ids=ids,
        layer_ids_field=ids_field,
        hidden=config.get(hidden_field, _MISSING),
        hidden_field=hidden_field,
        vocab_size=config.get("vocab_size"),
        missing_block=missing_block,
    )


def inspect_drafter(path: Path, *, target: CheckpointInfo | None) -> list[Reason]:
    """Everything that would stop vLLM's DFlash drafter (``qwen3_dflash.py``) from pairing with ``target``."""
    path = Path(path)
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a directory"
        return [Reason("drafter", f"drafter directory {path} {what}", True)]
    cfg = path / CONFIG
    try:
        config = _read_json(cfg, "drafter")
    except _Unreadable as exc:
        return [exc.reason]

    f = _drafter_fields(config)
    reasons: list[Reason] = []
    if not isinstance(f.architectures, list) or DFLASH_ARCHITECTURE not in f.architectures:
        reasons.append(Reason("drafter", f"{cfg}: architectures is {f.architectures!r}, expected [{DFLASH_ARCHITECTURE!r}]", True))
    if f.missing_block:
        reasons.append(Reason("drafter", f"{cfg}: {f.missing_block} is missing", True))
    reasons += _mask_reasons(cfg, f, target)
    ids = _layer_id_reasons(cfg, f, target, reasons)
    reasons += _fc_reasons(path, f, len(ids), target)
    return reasons


# What z-lab's reference drafter (dflash 0.1.0, DFlashDraftModel.from_pretrained) needs from
# config.json. transformers' Qwen3Config fills a missing size with Qwen3's own default, a model
# the weights do not fit; num_target_layers it reads unconditionally (AttributeError without it).
REFERENCE_DRAFTER_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                            "num_key_value_heads", "head_dim", "num_target_layers",
                            "dflash_config.target_layer_ids", "dflash_config.mask_token_id")


def reference_drafter_reasons(path: Path) -> list[Reason]:
    """What stops z-lab's ``DFlashDraftModel.from_pretrained`` from loading the drafter at ``path``
    as vLLM runs it, one reason per missing field, named as in config.json."""
    cfg = Path(path) / CONFIG
    try:
        config = _read_json(cfg, "drafter")
    except _Unreadable as exc:
        return [exc.reason]
    dflash = config.get("dflash_config") if isinstance(config.get("dflash_config"), dict) else {}
    missing = [name for name in REFERENCE_DRAFTER_FIELDS
               if (dflash if name.startswith("dflash_config.") else config).get(name.split(".")[-1]) is None]
    reasons = [Reason("drafter", f"{cfg}: {name} is missing (z-lab's DFlashDraftModel needs it)", True)
               for name in missing]
    layers, _window = drafter_sliding_layers(config)
    if isinstance(config.get("layer_types"), list) and layers:
        # Qwen3Config keeps sliding_window only with use_sliding_window; without it the reference
        # runs the sliding layers unwindowed and vLLM (0.25.0+) refuses them.
        for name in ("sliding_window", "use_sliding_window"):
            if not config.get(name):
                reasons.append(Reason("drafter", f"{cfg}: {name} is missing or off but layers {layers} "
                                                 "are sliding_attention", True))
    return reasons


# vLLM's DFlash drafter builds sliding-window layers from 0.25.0 (qwen3_dflash.py
# _resolve_layer_attention); drafters mixing sliding and full layers need the V2
# model runner (default from 0.29.0). Before 0.25.0 every drafter layer is full,
# non-causal attention over the whole context.
SLIDING_DRAFTER_SUPPORT = "0.25.0"
SLIDING_DRAFTER_RECOMMENDED = "0.33.0"


def drafter_sliding_layers(config: dict[str, Any]) -> tuple[list[int], Any]:
    """The drafter layers vLLM 0.25.0+ builds as sliding-window layers, and their window.

    Read as vLLM reads them: ``layer_types`` entries ``"sliding_attention"``,
    else every layer when ``dflash_config.use_swa`` is set; the window is
    ``dflash_config.swa_window_size``, else ``sliding_window``.
    """
    dflash = config.get("dflash_config") if isinstance(config.get("dflash_config"), dict) else {}
    layer_types = config.get("layer_types")
    layers: list[int] = []
    if isinstance(layer_types, list):
        layers = [i for i, kind in enumerate(layer_types) if kind == "sliding_attention"]
    if not layers and dflash.get("use_swa") is True:
        layers = list(range(_int(config.get("num_hidden_layers")) or 0))
    return layers, dflash.get("swa_window_size", config.get("sliding_window"))


# The 0.21.0 series' backport of 0.26.0's per-layer drafter attention.
PER_LAYER_DRAFTER_PATCH = "dflash-drafter-per-layer-attention"


def drafter_version_warning(path: Path, vllm_version: str, per_layer_patched: bool | None = None) -> list[Reason]:
    """A warning when the drafter has sliding-window layers that ``vllm_version`` cannot build.

    The output stays lossless (the target verifies every drafted token), but
    the drafter runs off the distribution it was trained on, so acceptance,
    and with it the speed-up, drops. ``per_layer_patched``: whether the tree
    has ``dflash-drafter-per-layer-attention``, which builds them as trained
    (None: not known here).
    """
    if parse_version(vllm_version) >= parse_version(SLIDING_DRAFTER_SUPPORT) or per_layer_patched:
        return []
    cfg = Path(path) / CONFIG
    try:
        config = _read_json(cfg, "drafter")
    except _Unreadable:
        return []  # inspect_drafter reports it
    layers, window = drafter_sliding_layers(config)
    if not layers:
        return []
    window_text = f"window {window}" if window is not None else "no window given"
    return [
        Reason(
            "drafter",
            f"{cfg}: drafter layers {layers} are sliding-window layers ({window_text}, causal as trained), "
            f"but vLLM {vllm_version}'s DFlash drafter has none without the series' {PER_LAYER_DRAFTER_PATCH}: "
            "they run as full, non-causal attention over the whole context. Output stays lossless (the target "
            "checks every token); acceptance, and so the speed-up, is lower, in every block and more so past "
            "the window",
            blocking=False,
            hint=f"launcher patch apply (its {PER_LAYER_DRAFTER_PATCH} builds these layers as trained), or run "
            f"vLLM {SLIDING_DRAFTER_RECOMMENDED} (--vllm-version {SLIDING_DRAFTER_RECOMMENDED})",
        )
    ]


def _mask_reasons(cfg: Path, f: _DrafterFields, target: CheckpointInfo | None) -> list[Reason]:
    mask = f.mask
    if mask is _MISSING:
        return [Reason("drafter", f"{cfg}: {f.mask_field} is missing (vLLM needs it for parallel drafting)", True)]
    if _int(mask) is None or mask < 0:
        return [Reason("drafter", f"{cfg}: {f.mask_field} is {mask!r}, not a token id", True)]
    reasons = []
    for vocab, whose in ((target.vocab_size if target else None, "target's"), (_int(f.vocab_size), "drafter's")):
        if vocab is not None and mask >= vocab:
            reasons.append(
                Reason("drafter", f"{cfg}: {f.mask_field} {mask} is outside the {whose} vocabulary (size {vocab})", True)
            )
    return reasons


def _layer_id_reasons(cfg: Path, f: _DrafterFields, target: CheckpointInfo | None, reasons: list[Reason]) -> list[Any]:
    if f.layer_ids is _MISSING:
        reasons.append(Reason("drafter", f"{cfg}: {f.layer_ids_field} is missing", True))
        return []
    if not isinstance(f.layer_ids, list) or not f.layer_ids:
        reasons.append(Reason("drafter", f"{cfg}: {f.layer_ids_field} is {f.layer_ids!r}, not a list of layer indices", True))
        return []
    layers = target.num_layers if target is not None else None
    for pos, layer in enumerate(f.layer_ids):
        if _int(layer) is None:
            reasons.append(Reason("drafter", f"{cfg}: {f.layer_ids_field}[{pos}] is {layer!r}, not a layer index", True))
        elif layers is not None and not 0 <= layer < layers:
            reasons.append(
                Reason(
                    "drafter",
                    f"{cfg}: {f.layer_ids_field}[{pos}] = {layer} is outside the target's {layers} layers (0..{layers - 1})",
                    True,
                )
            )
    return f.layer_ids


def _fc_reasons(path: Path, f: _DrafterFields, num_features: int, target: CheckpointInfo | None) -> list[Reason]:
    """fc maps the concatenated target hidden states to the drafter's hidden size.

    vLLM 0.21.0 sizes fc's input as ``(target_hidden_size or hidden_size) *
    len(target_layer_ids)``; the checkpoint's fc.weight and the target's hidden
    size must both agree with that.
    """
    cfg = path / CONFIG
    reasons: list[Reason] = []
    per_layer = _int(f.hidden) if f.hidden is not _MISSING else None
    if per_layer is None:
        return [Reason("drafter", f"{cfg}: {f.hidden_field} is missing", True)]
    if target is not None and target.hidden_size is not None and per_layer != target.hidden_size:
        reasons.append(
            Reason(
                "drafter",
                f"{cfg}: {f.hidden_field} is {per_layer} but the target's hidden_size is {target.hidden_size}",
                True,
                "this drafter was trained for another target model",
            )
        )
    expected_in = per_layer * num_features
    try:
        tensors = read_tensor_index(path)
    except (OSError, ValueError, KeyError) as exc:
        return reasons + [Reason("drafter", f"drafter weights not readable: {exc}", True)]
    fc = next(((n, m) for n, m in tensors.items() if n == "fc.weight" or n.endswith(".fc.weight")), None)
    if not tensors:
        reasons.append(Reason("drafter", f"{path}: no *.safetensors weights", True))
    elif fc is None:
        reasons.append(Reason("drafter", f"{path}: no fc.weight tensor (the DFlash input projection)", True))
    elif len(fc[1].shape) == 2 and num_features and fc[1].shape[1] != expected_in:
        name, meta = fc
        reasons.append(
            Reason(
                "drafter",
                f"{meta.file}: {name} has {meta.shape[1]} inputs but {cfg} gives {f.hidden_field} {per_layer} x "
                f"{num_features} target layers = {expected_in}",
                True,
            )
        )
    return reasons


# --------------------------------------------------------------------------- arguments


def quantization_flag_warning(extra_args: list[str], info: CheckpointInfo | None,
                              recipe_format: str | None = None) -> Reason | None:
    """A warning when the user passes ``--quantization modelopt`` for a ModelOpt checkpoint.

    vLLM detects ModelOpt from hf_quant_config.json; forcing the method by
    hand is what broke the user's start (issue #43858). Where the checkpoint is not on disk yet
    (a dry run before the download) the recipe's declared format stands in for it.
    """
    fmt = info.format if info is not None else recipe_format
    if fmt != "modelopt-nvfp4":
        return None
    for i, arg in enumerate(extra_args):
        if arg in ("--quantization", "-q") and i + 1 < len(extra_args):
            shown, value = f"{arg} {extra_args[i + 1]}", extra_args[i + 1]
        elif arg.startswith("--quantization="):
            shown, value = arg, arg.split("=", 1)[1]
        elif arg.startswith("-q") and not arg.startswith("--") and len(arg) > 2:
            shown, value = arg, arg[2:].lstrip("=")
        else:
            continue
        if value.startswith("modelopt"):
            return Reason(
                "checkpoint",
                f"`{shown}` was passed after `--` for a ModelOpt {(info and info.quant_algo) or 'NVFP4'} checkpoint",
                False,
                "drop it: vLLM detects ModelOpt from hf_quant_config.json, and forcing it is known to break the start",
            )
    return None
