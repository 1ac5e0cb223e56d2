"""Full-size random-weight Gemma 4 26B-A4B (NVIDIA's NVFP4 export layout) and its DFlash drafter (issue 27).

Generated on the GPU host (no 19 GB transfer). Writes, under OUT:

* ``gemma4-26b-a4b-nvfp4/``: ``Gemma4ForConditionalGeneration`` at the released
  shapes (``fullsize_shapes.py``): 30 layers, 128 experts top-8, vocabulary
  262,144, the vision tower at its released 0.57 B parameters; the routed
  experts NVFP4 per expert (``.weight`` U8 [out, in/2], ``.weight_scale``
  F8_E4M3 [out, in/16], ``.weight_scale_2`` / ``.input_scale`` F32 scalars),
  everything NVIDIA keeps bf16 in bf16; NVIDIA's ``quantization_config`` and
  ``hf_quant_config.json``; the generated tokenizer and processor files
  (``fullsize_tokenizer.py``);
* ``dflash-26b-a4b/``: the drafter at its released shape (58 tensors);
* ``fullsize-shapes.json``: configs, sources, bytes per tensor class, parameter counts, timings.

Values are those of the step-time benchmark's checkpoints
(``make_bench_checkpoints._Random``: matrices N(0, 0.02), E2M1 codes uniform,
block scales that dequantize to about that std, norms one, post-branch norms
0.3), drawn on the GPU from one seeded generator per folder, tensor by
tensor in a fixed order: the same seed and device kind give the same bytes.

Host memory: one tensor at a time. Each is drawn on the GPU, copied to host
memory and written into a safetensors shard laid out beforehand
(``st_stream.py``), so the largest resident copy is the 1.48 GB embedding,
not a shard twice over as ``safetensors.torch.save_file`` would hold it.

Disk: 18.8 GB target + 0.86 GB drafter + 5 MB tokenizer = 19.7 GB (18.3 GiB);
the run refuses to start with less than that free plus 1 GiB. Time on an
H100/H200: about 1-2 minutes, mostly writing (``remote.sh full-size-checkpoints``).

``python make_fullsize_checkpoints.py OUT [--device cuda] [--tiny]``: ``--tiny``
shrinks every width (the CPU test of the generator).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)

import bench_shapes as bs  # noqa: E402
import fullsize_shapes as fs  # noqa: E402
import fullsize_tokenizer as ftok  # noqa: E402
import st_stream  # noqa: E402
from make_bench_checkpoints import (  # noqa: E402
    TINY_DRAFTER,
    TINY_SPECIAL_IDS,
    TINY_TEXT,
    _Random,
    drafter_layout,
    hf_state_shapes,
)

TARGET_DIR = "gemma4-26b-a4b-nvfp4"
DRAFTER_DIR = "dflash-26b-a4b"
SHARD_BYTES = 4 << 30  # several shards, as a real export has; none larger than 4 GiB
GIB = 1 << 30
SEED_TARGET = bs.SEED + 3
SEED_DRAFTER = bs.SEED + 4

TINY_VISION = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
               "num_key_value_heads": 2, "head_dim": 32, "position_embedding_size": 64}


def configs(tiny: bool) -> tuple[dict, dict]:
    """(target, drafter) config.json dicts."""
    if not tiny:
        return fs.target_config(), fs.drafter_config()
    layers = 12  # two of each 5:1 block: room below the last layer for the released taps' pattern, shrunk
    target = fs.target_config(vision=TINY_VISION, num_hidden_layers=layers, **TINY_TEXT)
    target.update(TINY_SPECIAL_IDS)
    drafter = fs.drafter_config(layers, target_layer_ids=[1, 3, 5, 7, 9], **TINY_DRAFTER)
    return target, drafter


def _as_bytes(tensor):
    """The tensor's bytes as a numpy uint8 array (numpy has no bf16 / fp8: view them as bytes first)."""
    import torch

    return tensor.reshape(-1).view(torch.uint8).numpy()


def write_tensors(out: Path, layout: dict[str, tuple[str, list[int]]], rnd: _Random, *, single_file: bool,
                  log=print) -> dict:
    """Shards (or one ``model.safetensors``) plus, for shards, the index; returns bytes and files."""
    plan = [list(layout)] if single_file else fs.shard_plan(layout, SHARD_BYTES)
    names = ["model.safetensors"] if single_file else \
        [f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors" for i in range(len(plan))]
    weight_map: dict[str, str] = {}
    total = 0
    t0 = time.time()
    for fname, tensors in zip(names, plan):
        specs = [(n, *layout[n]) for n in tensors]
        with st_stream.Writer(out / fname, specs, {"format": "pt"}) as w:
            for name in tensors:
                w.write(name, _as_bytes(rnd.value(name, *layout[name])))
            total += w.data_bytes
        weight_map.update(dict.fromkeys(tensors, fname))
        log(f"  {fname}: {len(tensors)} tensors, {w.data_bytes / GIB:.2f} GiB ({time.time() - t0:.0f}s)")
    if not single_file:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
    return {"bytes": total, "files": names, "tensors": len(layout)}


def _dump(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n")


def class_table(by_class: dict[str, int]) -> list[str]:
    total = sum(by_class.values())
    rows = [f"    {name:<12} {b / 1e9:8.3f} GB {b / GIB:8.3f} GiB {100 * b / total:5.1f} %"
            for name, b in sorted(by_class.items(), key=lambda kv: -kv[1])]
    return rows + [f"    {'total':<12} {total / 1e9:8.3f} GB {total / GIB:8.3f} GiB"]


def expected_bytes(target_layout: dict, drafter_layout_: dict) -> int:
    return sum(fs.nbytes(*v) for v in target_layout.values()) + sum(fs.nbytes(*v) for v in drafter_layout_.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--tiny", action="store_true", help="small widths (CPU test)")
    parser.add_argument("--device", default=None, help="where random values are drawn (default: cuda if present)")
    args = parser.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    target_cfg, drafter_cfg = configs(args.tiny)
    t0 = time.time()
    hf_names = hf_state_shapes(target_cfg)
    layout = fs.nvidia_layout(hf_names)
    d_layout = drafter_layout(drafter_cfg)
    need = expected_bytes(layout, d_layout)
    args.out.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(args.out).free
    if free < need + GIB:
        print(f"not enough disk under {args.out}: {free / GIB:.1f} GiB free, {need / GIB:.1f} GiB + 1 GiB needed",
              file=sys.stderr)
        return 2
    print(f"full-size checkpoints under {args.out} on {device}: {need / 1e9:.2f} GB to write "
          f"({free / GIB:.0f} GiB free)", flush=True)

    target_dir, drafter_dir = args.out / TARGET_DIR, args.out / DRAFTER_DIR
    for d in (target_dir, drafter_dir):
        d.mkdir(parents=True, exist_ok=True)
    manifest: dict = {"tiny": args.tiny, "device": device, "torch": torch.__version__,
                      "sources": fs.SOURCES, "seeds": {"target": SEED_TARGET, "drafter": SEED_DRAFTER},
                      "target_config": target_cfg, "drafter_config": drafter_cfg,
                      **fs.parameter_counts(hf_names, target_cfg["text_config"])}

    print(f"{TARGET_DIR}: {len(layout)} tensors", flush=True)
    written = write_tensors(target_dir, layout, _Random(device, SEED_TARGET), single_file=False,
                            log=lambda s: print(s, flush=True))
    _dump(target_dir / "config.json", target_cfg)
    _dump(target_dir / "hf_quant_config.json", fs.hf_quant_config(target_cfg["text_config"]["num_hidden_layers"]))
    manifest["tokenizer"] = ftok.write(target_dir, target_cfg)  # also writes generation_config.json
    manifest["target"] = {**written, "bytes_by_class": fs.bytes_by_class(layout)}
    t_target = time.time() - t0

    print(f"{DRAFTER_DIR}: {len(d_layout)} tensors", flush=True)
    d_written = write_tensors(drafter_dir, d_layout, _Random(device, SEED_DRAFTER), single_file=True,
                              log=lambda s: print(s, flush=True))
    _dump(drafter_dir / "config.json", drafter_cfg)
    manifest["drafter"] = {**d_written, "bytes_by_class": fs.bytes_by_class(d_layout, drafter=True)}
    manifest["seconds"] = {"target": round(t_target, 1), "total": round(time.time() - t0, 1)}
    _dump(args.out / "fullsize-shapes.json", manifest)

    print("bytes per tensor class (target):")
    print("\n".join(class_table(manifest["target"]["bytes_by_class"])))
    print(f"drafter: {d_written['bytes'] / 1e9:.3f} GB ({d_written['bytes'] / GIB:.3f} GiB)")
    print(f"parameters: {manifest['params_total'] / 1e9:.2f} B total ({manifest['params_text'] / 1e9:.2f} B "
          f"text), {manifest['params_active'] / 1e9:.2f} B active per token")
    print(f"done in {manifest['seconds']['total']:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
