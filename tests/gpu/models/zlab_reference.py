"""z-lab's own DFlash loop as the acceptance reference (issue 50, item 4).

Runs ``dflash.model.dflash_generate`` from the PyPI package ``dflash==0.1.0``, installed
unchanged, with the trained target (transformers, bf16) and a drafter checkpoint. Decoding is
greedy, over every prompt of ``prompts.json``, in two passes that must agree. The loop needs
transformers 5.15 or later (``DynamicCache.activate_past_recording``).

One deviation, recorded in the output: the drafter's input embeddings. z-lab's torch loop looks
up the target's raw embedding table and multiplies by ``input_embedding_scale``. Its Gemma 4
backend (MLX) also multiplies by the target's own normalizer, sqrt(hidden_size).
``GemmaEmbeddingTarget`` gives the loop a table already multiplied by that normalizer, in the
model's dtype as Gemma's embedding does it, so the torch loop computes the Gemma 4 semantics.
Everything else (blocks, mask token, verification, the acceptance count) is z-lab's code.

Per prompt it records:

* the output tokens;
* z-lab's ``acceptance_lengths``: tokens produced per verify step, accepted drafts + 1, which is
  what vLLM's mean acceptance length counts;
* the target's top-1 / top-2 logit margins along that output (one teacher-forced forward of
  prompt + output). A comparison with vLLM trusts the tokens only up to the first position whose
  margin is under the noise bound fixed in ``bars.yaml``.

``python tests/gpu/models/zlab_reference.py MODELS --drafter NAME --out FILE.json [--prompts N]``
(``remote.sh zlab-reference``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
import gate  # noqa: E402

DEVIATION = ("drafter input embeddings: the target's table times its Gemma normalizer sqrt(hidden_size) "
             "(model dtype), times input_embedding_scale, as z-lab's Gemma 4 (MLX) backend; z-lab's torch "
             "loop omits the normalizer")


class GemmaEmbeddingTarget:
    """The target as ``dflash_generate`` sees it, its input-embedding table pre-scaled by Gemma's
    normalizer; every other attribute and the forward are the target's own."""

    def __init__(self, target):
        self._target = target
        emb = target.get_input_embeddings()
        self._table = SimpleNamespace(weight=emb.weight * emb.embed_scale.to(emb.weight.dtype))

    def __call__(self, *args, **kwargs):
        return self._target(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._target, name)

    def get_input_embeddings(self):
        return self._table


def margins(target, prompt: list[int], output: list[int]) -> list[float]:
    """Top-1 minus top-2 logit of the target at each output position, teacher-forced."""
    import torch

    ids = torch.tensor([prompt + output[:-1]], device=target.device)
    with torch.inference_mode():
        logits = target(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1:].float()
    top = torch.topk(logits, 2, dim=-1).values
    return [round(float(a - b), 5) for a, b in top.tolist()]


def run_pass(drafter, target, prompts: list[dict], max_tokens: int) -> list[dict]:
    import torch
    from dflash import model as zlab

    if target.device.type != "cuda":
        # The loop's clock synchronizes CUDA for its timing stats; on the CPU (the tests) a plain
        # clock stands in. Timing only: nothing decoded depends on it.
        zlab._cuda_time = time.perf_counter
    rows = []
    for p in prompts:
        ids = torch.tensor([p["token_ids"]], device=target.device)
        stats = zlab.dflash_generate(drafter, target, ids, max_tokens, None, temperature=0.0, return_stats=True)
        out = stats.output_ids[0, len(p["token_ids"]):].tolist()
        rows.append({"token_ids": out, "acceptance_lengths": [int(a) for a in stats.acceptance_lengths]})
    return rows


def summary(rows: list[dict], block_size: int) -> dict:
    """Acceptance pooled over every verify step, and per prompt (min / median / max)."""
    steps = [a for r in rows for a in r["acceptance_lengths"]]
    per_prompt = [sum(r["acceptance_lengths"]) / len(r["acceptance_lengths"]) for r in rows if r["acceptance_lengths"]]
    return {
        "verify_steps": len(steps),
        "mean_acceptance_length": round(sum(steps) / len(steps), 4) if steps else None,
        "per_prompt": {"min": round(min(per_prompt), 4), "median": round(statistics.median(per_prompt), 4),
                       "max": round(max(per_prompt), 4)} if per_prompt else None,
        # drafts both taken and refused: a reference that never rejects (or never accepts) judges nothing
        "steps_all_accepted": sum(1 for r in rows for a in r["acceptance_lengths"] if a >= block_size),
        "steps_none_accepted": sum(1 for a in steps if a == 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", type=Path, help="models folder with the trained target and the drafter")
    parser.add_argument("--drafter", required=True, help="the drafter's folder name under MODELS")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--prompts", type=int, default=0, help="the first N prompts (default: all)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)

    import dflash
    import torch
    import transformers
    from dflash.model import DFlashDraftModel

    import train_drafter
    import train_target

    target_dir = args.models / train_target.TARGET.name
    drafter_dir = args.models / args.drafter
    prompts = json.loads((target_dir / "prompts.json").read_text())
    prompts = prompts[:args.prompts] if args.prompts else prompts
    t0 = time.time()
    target = GemmaEmbeddingTarget(train_drafter.load_target(target_dir, args.device))
    drafter = DFlashDraftModel.from_pretrained(drafter_dir, dtype=torch.bfloat16).to(args.device).eval()
    first = run_pass(drafter, target, prompts, args.max_tokens)
    again = run_pass(drafter, target, prompts, args.max_tokens)
    for row, p in zip(first, prompts):
        row["margins"] = margins(target, p["token_ids"], row["token_ids"])
    train_record = json.loads((target_dir / "train-record.json").read_text())
    drafter_record = drafter_dir / train_drafter.RECORD_NAME
    result = {
        "oracle": f"dflash {getattr(dflash, '__version__', '0.1.0')} dflash_generate, greedy",
        "deviation": DEVIATION,
        "target_sha256": train_record["target_sha256"],
        "drafter": args.drafter,
        "drafter_sha256": (json.loads(drafter_record.read_text())["drafter_sha256"] if drafter_record.exists()
                           else train_drafter.drafter_sha256(drafter_dir)),
        "block_size": drafter.block_size,
        "max_tokens": args.max_tokens,
        "prompts": len(prompts),
        "passes_identical": [r["token_ids"] for r in first] == [r["token_ids"] for r in again]
        and [r["acceptance_lengths"] for r in first] == [r["acceptance_lengths"] for r in again],
        "gate": gate.nondegenerate([{"token_ids": r["token_ids"]} for r in first]),
        "acceptance": summary(first, drafter.block_size),
        "rows": first,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
        "wall_s": round(time.time() - t0, 1),
        "script_sha256": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
    }
    result["gate"]["passes"] = gate.passes(result["gate"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("passes_identical", "gate", "acceptance", "wall_s")}), flush=True)
    return 0 if result["passes_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
