"""GPU check of fast_decode: the captured decode equals the same step run eagerly, and how fast.

``python tests/gpu/models/fast_decode_check.py [OUT.json]`` on a GPU host with transformers 5.13.1
(``remote.sh fast-decode-check``). The target is train_target's shape with random weights
scaled up (a trained-like spread of logits, so greedy output is not one repeated token);
bf16, as the sequence-level steps and the greedy probe decode. Prints and writes: tokens per
second of transformers' ``generate``, of the step run eagerly and of the graph; whether graph
and eager tokens are identical row by row; agreement with ``generate`` (not required: its
left-padded rows take other positions, and bf16 batches round differently).
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
import fast_decode  # noqa: E402
import train_target  # noqa: E402


def main(argv: list[str]) -> int:
    import torch

    torch.manual_seed(0)
    model = train_target.build_model("cuda").eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(3.0)
    model = model.to(torch.bfloat16)
    rng = random.Random(0)
    prompts = [[2] + [rng.randrange(30, 8000) for _ in range(n - 1)]
               for n in (16, 300, 40, 200, 96, 128, 24, 160, 64, 250, 32, 129)]
    new = 96
    timings, outs = {}, {}
    for name, graph in (("eager", False), ("graph", True)):
        fast_decode.greedy(model, prompts, 4, graph=graph)  # warm-up
        torch.cuda.synchronize()
        t = time.time()
        outs[name], _ = fast_decode.greedy(model, prompts, new, graph=graph)
        torch.cuda.synchronize()
        timings[name] = time.time() - t
    ids, start = fast_decode.left_pad(prompts, 0)
    mask = (torch.arange(ids.shape[1]).view(1, -1) >= start.view(-1, 1)).long()
    t = time.time()
    with torch.no_grad():
        ref = model.generate(input_ids=ids.cuda(), attention_mask=mask.cuda(), do_sample=False,
                             max_new_tokens=new, min_new_tokens=new, pad_token_id=0, eos_token_id=None)
    torch.cuda.synchronize()
    timings["generate"] = time.time() - t
    ref = ref[:, ids.shape[1]:].tolist()
    result = {
        "gpu": torch.cuda.get_device_name(),
        "rows": len(prompts), "new_tokens": new,
        "ms_per_token": {k: round(1000 * v / new, 2) for k, v in timings.items()},
        "graph_equals_eager": [a == b for a, b in zip(outs["graph"], outs["eager"])],
        "eager_equals_generate": [a == b for a, b in zip(outs["eager"], ref)],
        "distinct_tokens_per_row": [len(set(r)) for r in outs["graph"]],
    }
    print(json.dumps(result), flush=True)
    if len(argv) > 1:
        Path(argv[1]).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if all(result["graph_equals_eager"]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
