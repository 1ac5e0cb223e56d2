"""Load the GPU harness scripts (tests/gpu/*.py, not a package) as modules for CPU tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

GPU_DIR = Path(__file__).resolve().parents[1] / "gpu"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", GPU_DIR / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def tiny_gemma4_target(layers: int = 6):
    """A small random Gemma 4 target of the trained target's make (make_checkpoints' shape, the
    corpus tokenizer's special ids), float32 on the CPU, in eval: (model, its config dict)."""
    import torch
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    mc, tt = load("make_checkpoints"), load("train_target")
    shape = mc.TargetShape("t", layers, hidden_size=64, num_attention_heads=2, num_key_value_heads=1,
                           num_global_key_value_heads=1, num_experts=4, moe_intermediate_size=16,
                           intermediate_size=32, sliding_window=8)
    ids = {k: v for k, v in tt.lm_files.CONFIG_IDS.items() if k != "mask_token_id"}
    cfg = mc.gemma4_config_dict(shape, vocab=256, ids=ids, max_positions=512)
    config = Gemma4Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    config.architectures = ["Gemma4ForConditionalGeneration"]
    torch.manual_seed(0)
    model = Gemma4ForConditionalGeneration._from_config(config, attn_implementation="eager", dtype=torch.float32)
    return model.eval(), cfg
