"""Which modules stay unquantized, and the ModelOpt config that enforces it.

vLLM builds some modules without a quantization method, so their weights must
stay bf16 in the checkpoint: Gemma 4's MoE router (a plain ``GateLinear``),
the vision and audio towers and their embedders (Hugging Face modules inside
vLLM's ``gemma4_mm.py``), and lm_head. nvidia-modelopt 0.47.0's
NVFP4_DEFAULT_CFG already disables ``*lm_head*``, ``*router*``,
``*vision_tower*`` and ``*embed_vision*`` but not the audio tower and
embedder of the E2B/E4B variants; ``build_quant_config`` adds whatever a
given modelopt release lacks rather than trusting the list to stay put.
"""

from __future__ import annotations

import copy
from typing import Any

# Wildcards in ModelOpt's quantizer-name syntax.
KEEP_UNQUANTIZED: tuple[str, ...] = (
    "*lm_head*",
    "*router*",
    "*vision_tower*",
    "*embed_vision*",
    "*audio_tower*",
    "*embed_audio*",
)


def disabled_patterns(quant_cfg: Any) -> set[str]:
    """Quantizer-name patterns a ModelOpt config switches off.

    Handles both layouts: the list of entries of modelopt >= 0.4x
    ({"quantizer_name": ..., "enable": False}) and the older dict
    ({pattern: {"enable": False}}).
    """
    found: set[str] = set()
    if isinstance(quant_cfg, list):
        for entry in quant_cfg:
            if (
                isinstance(entry, dict)
                and entry.get("enable") is False
                and "parent_class" not in entry
                and isinstance(entry.get("quantizer_name"), str)
            ):
                found.add(entry["quantizer_name"])
    elif isinstance(quant_cfg, dict):
        for pattern, value in quant_cfg.items():
            if isinstance(value, dict) and value.get("enable") is False:
                found.add(pattern)
    return found


def build_quant_config(base: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A copy of ``base`` with every KEEP_UNQUANTIZED pattern disabled, and the patterns added."""
    cfg = copy.deepcopy(base)
    quant_cfg = cfg.get("quant_cfg")
    missing = [p for p in KEEP_UNQUANTIZED if p not in disabled_patterns(quant_cfg)]
    for pattern in missing:
        # Later entries win in ModelOpt's list layout, so appending overrides
        # any earlier enable for the same modules.
        if isinstance(quant_cfg, list):
            quant_cfg.append({"quantizer_name": pattern, "enable": False})
        elif isinstance(quant_cfg, dict):
            quant_cfg[pattern] = {"enable": False}
        else:
            raise ValueError(f"unrecognised ModelOpt quant_cfg layout: {type(quant_cfg).__name__}")
    return cfg, missing
