"""Which KV cache groups a sliding-window DFlash drafter's layers land in, per vLLM release.

Usage: ``python drafter_kv_groups_probe.py CODE_ROOT``; prints one JSON object.
Runs the release's real ``get_kv_cache_groups`` (every top-level function of
``vllm/v1/core/kv_cache_utils.py`` over the real ``kv_cache_interface.py``,
with the stand-ins of ``series_0_21_0_probe.py``; from 0.26.0 also the real
``kv_cache_spec_registry.py`` and, from 0.29.0, ``kv_cache_layout.py``, and ``get_hisparse_kv_cache_groups`` answers None: no
HiSparse model here) for a gemma-4-26B-A4B-shaped target (25 sliding layers,
window 1024, head_dim 256, 8 KV heads; 5 full layers, head_dim 512, 2 KV heads)
and a 5-layer drafter with 4 sliding layers and 1 full layer, in two
geometries: its own (window 2048 as the public drafter's config has, head_dim
128) and one whose every layer has the spec of a target layer.

vLLM PR #50169 reports draft acceptance collapsing when drafter layers share
a KV cache group with target layers; this shows when that can happen.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.integration import series_0_21_0_probe as probe  # noqa: E402

GEOMETRIES = {
    "drafter_own_geometry": ({"num_kv_heads": 8, "head_size": 128, "sliding_window": 2048},
                             {"num_kv_heads": 8, "head_size": 128}),
    "drafter_with_target_specs": ({"num_kv_heads": 8, "head_size": 256, "sliding_window": 1024},
                                  {"num_kv_heads": 2, "head_size": 512}),
}


def _specs(kvi, draft_sliding: dict, draft_full: dict) -> dict:
    marker = {"is_draft": True} if "is_draft" in {f.name for f in dataclasses.fields(kvi.KVCacheSpec)} else {}
    out = {}
    for i in range(30):
        name = f"language_model.model.layers.{i}.self_attn.attn"
        out[name] = (kvi.FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=512, dtype=probe.BF16)
                     if i % 6 == 5 else
                     kvi.SlidingWindowSpec(block_size=16, num_kv_heads=8, head_size=256, dtype=probe.BF16,
                                           sliding_window=1024))
    for j in range(5):
        name = f"model.layers.{30 + j}.self_attn.attn"
        out[name] = (kvi.FullAttentionSpec(block_size=16, dtype=probe.BF16, **draft_full, **marker) if j == 4 else
                     kvi.SlidingWindowSpec(block_size=16, dtype=probe.BF16, **draft_sliding, **marker))
    return out


def main(code_root: str) -> None:
    root = Path(code_root)
    probe._install_stand_ins(root)
    for extra in ("kv_cache_spec_registry", "kv_cache_layout"):  # modules kv_cache_interface imports, 0.26.0+
        path = root / "vllm" / "v1" / f"{extra}.py"
        if path.exists():
            probe._load(f"vllm.v1.{extra}", path)
    kvi, ns = probe.kv_cache_namespace(root)
    ns.setdefault("get_hisparse_kv_cache_groups", lambda *args, **kwargs: None)
    config = probe._vllm_config()
    layouts = sys.modules.get("vllm.v1.kv_cache_layout")
    resolved = next(iter(layouts.KVCacheLayout)) if layouts else "NHD"
    config.cache_config.get_resolved_kv_cache_layout = lambda: resolved
    out = {}
    for label, (sliding, full) in GEOMETRIES.items():
        groups = ns["get_kv_cache_groups"](config, _specs(kvi, sliding, full))
        names = [list(g.layer_names) for g in groups]
        out[label] = {
            "groups": len(names),
            "drafter_group_sizes": [len(g) for g in names if any(n.startswith("model.") for n in g)],
            "groups_mixing_drafter_and_target": sum(
                any(n.startswith("model.") for n in g) and any(n.startswith("language_model.") for n in g)
                for g in names),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
