"""How stable is a generated target's greedy argmax in bf16? (CPU, HF transformers)

A lossless check compares greedy tokens of two vLLM runs that compute the
same positions along different paths (a decode step vs a multi-token
verification pass). That only means something if the model itself does not
flip its argmax under bf16 rounding. This runs each target from
``make_checkpoints.py`` in HF transformers, in fp32 and in bf16, teacher-forced
on fixed token sequences, and counts the positions where the two argmaxes
agree and where the fp32 top-1/top-2 gap is under 1/16 (near-ties).

Measured for the committed generator (transformers 5.13.1, torch CPU):
gemma4-t6 1188/1190 agree, gemma4-t12 (post-branch norms 0.3) 1190/1190,
gemma4-t12-unscaled 1046/1190 with 16 near-ties.

``python tests/gpu/models/bf16_stability.py MODELS_DIR [NAME ...]``
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
from pathlib import Path

SEQ_LENGTHS = (40, 90, 150, 230, 300, 60, 120, 200)
NEAR_TIE = 1 / 16


def stability(path: Path, token_limit: int, device: str = "cpu") -> tuple[int, int, int]:
    import torch
    from transformers import Gemma4ForConditionalGeneration

    fp32 = Gemma4ForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval().to(device)
    bf16 = copy.deepcopy(fp32).to(torch.bfloat16)
    rng = random.Random(7)
    agree = total = near = 0
    for n in SEQ_LENGTHS:
        ids = torch.tensor([[rng.randrange(3, token_limit) for _ in range(n)]], device=device)
        with torch.no_grad():
            a = fp32(input_ids=ids).logits[0].float()
            b = bf16(input_ids=ids).logits[0].float()
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        total += n
        top2 = torch.topk(a, 2).values
        near += int(((top2[:, 0] - top2[:, 1]) < NEAR_TIE).sum())
    return agree, total, near


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", type=Path)
    parser.add_argument("names", nargs="*")
    parser.add_argument("--device", default="cpu", help="torch device (cuda on the GPU host: same check, faster)")
    args = parser.parse_args(argv)
    shapes = json.loads((args.models / "shapes.json").read_text())
    names = args.names or [t["name"] for t in shapes["targets"]]
    for name in names:
        agree, total, near = stability(args.models / name, shapes["prompt_token_limit"], args.device)
        print(f"{name}: bf16 vs fp32 argmax agree at {agree}/{total}; fp32 near-ties {near}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
