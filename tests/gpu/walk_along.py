"""The reference walk along a run's own output (issue 25, item 4).

train_drafter.evaluate walks the drafter along the Hugging Face target's greedy text. A vLLM run
under other numerics (batch-invariant kernels, NVFP4) writes another text: with this small
trained target, greedy outputs part at bf16 near-ties within tens of tokens (exact against
default numerics: median first difference 14-23 tokens of 128). A drafter's acceptance depends on
the text it drafts for, so a gap between vLLM and that walk mixes two things: the drafter side
(what the patches fix) and the target's text.

This walk takes the text out: the same reference drafter (dflash_reference.py, float32, the
release's attention semantics) drafts at every anchor of the run's own output, fed the Hugging
Face target's features of that output, and a draft counts as accepted while it equals the token
the run wrote there. Steps follow vLLM's bookkeeping (dflash_reference.walk), every request as
the run's concurrency groups sent it, so the summary is the one vLLM's counters give when its
drafter side computes what the reference does.

    python tests/gpu/walk_along.py --models MODELS --raw RAW_DIR_OR_FILES [--device cuda] [--write]

prints each run's summary as JSON (``acceptance_along_output``); ``--write`` stores it in the
run's raw record, where realshape.py's merge puts it beside vLLM's acceptance
(``remote.sh``'s ``trained_lanes`` does this on the GPU before its merge). On a CPU a capture
run takes 2-4 minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gate  # noqa: E402
import realshape  # noqa: E402
import train_drafter  # noqa: E402


def steps_along(model, drafter, shared, prompt: list[int], output: list[int], semantics: str, k: int,
                chunk_tokens: int) -> list[int]:
    """Accepted drafts per verify step of one request whose text is prompt + output.

    vLLM verifies all K drafts of a request's last step and counts what it accepts before it cuts
    the output at max_tokens (Scheduler.update_from_output: the spec-decode stats come first), so
    the text is extended past its end by the target's greedy continuation (K tokens), as
    train_drafter.evaluate's walk extends its own."""
    import torch

    seq = prompt + output + train_drafter.greedy_continue(model, [prompt + output], k)[0]
    feats, _, _ = train_drafter.target_features(model, [seq], list(drafter.g.target_layer_ids), chunk_tokens)
    tokens = torch.tensor(seq, device=feats.device)
    drafts = train_drafter.drafts_at_every_anchor(drafter, shared, feats[0].to(next(drafter.parameters()).dtype),
                                                  tokens, len(prompt), len(output), semantics, k)
    # prompt_steps compares block a's drafts with greedy[a:a + k], the tokens at a + 1 ..: here
    # the tokens the run wrote.
    return train_drafter.prompt_steps(drafts, tokens[1:], len(prompt), len(output), k)


def run_numerics(raw: dict) -> str:
    """The target numerics a run's drafter was fed: bf16, or its NVFP4 copy as vLLM ran it."""
    spec = realshape.RUNS.get(raw.get("name"))
    if spec is None or spec.quant != "modelopt-nvfp4":
        return "bf16"
    return realshape.nvfp4_numerics(raw)


def along_run(raw: dict, models: Path, device: str, k: int = realshape.NUM_SPECULATIVE_TOKENS,
              chunk_tokens: int = 8192) -> dict:
    """The walk along every request of a DFlash run's raw record (its ``groups``)."""
    held = json.loads((models / realshape.TRAINED_TARGET / "prompts.json").read_text())
    prompts = [p["token_ids"] for p in held]
    target_dir = models / realshape.TRAINED_TARGET
    model = train_drafter.load_target(target_dir, device)
    numerics = run_numerics(raw)
    if numerics != "bf16":
        # The features vLLM's drafter got came from the NVFP4 target of the run's numerics.
        from safetensors.torch import load_file

        import nvfp4_reference

        tensors = load_file(str(models / (realshape.TRAINED_TARGET + "-nvfp4") / "model.safetensors"))
        nvfp4_reference.apply(model, tensors, activations=numerics == "W4A4")
    drafter = train_drafter.load_drafter(models / realshape.TRAINED_DRAFTER_TRAINED, device)
    shared = train_drafter.shared_from_target(model, target_dir)
    semantics = f"vllm-{raw['vllm_version']}"
    cache: dict[tuple, list[int]] = {}
    steps: list[int] = []
    t0 = time.time()
    for _c, outputs in sorted(raw["groups"].items(), key=lambda kv: int(kv[0])):
        for i, out in enumerate(outputs):  # group c sent the first c prompts, in order
            key = (i, tuple(out["token_ids"]))
            if key not in cache:
                cache[key] = steps_along(model, drafter, shared, prompts[i], out["token_ids"], semantics, k,
                                         chunk_tokens)
            steps += cache[key]
    summary = gate.acceptance_summary(steps, k)
    summary.update(semantics=semantics, numerics=numerics, requests=sum(len(o) for o in raw["groups"].values()),
                   distinct_texts=len(cache), device=device, wall_s=round(time.time() - t0, 1))
    return summary


def walked_runs(paths: list[Path], models: Path, named: set[Path] | None = None) -> list[Path]:
    """The raw records this walk applies to: trained-drafter DFlash runs that generated, with the
    drafter in ``models``. A record named on the command line (``named``; default: all) of
    another drafter is refused by name, never walked with the wrong weights; one found in a
    folder is left out with a line that says so (a folder may hold an earlier drafter's runs)."""
    here = train_drafter.drafter_sha256(models / realshape.TRAINED_DRAFTER_TRAINED)
    named = set(paths) if named is None else named
    chosen = []
    for path in paths:
        raw = json.loads(path.read_text())
        spec = realshape.RUNS.get(raw.get("name"))
        if spec is None or spec.drafter != "trained" or not raw.get("groups") or spec.speed:
            continue
        if raw.get("drafter_sha256") != here:
            why = f"{path}: drafter {str(raw.get('drafter_sha256'))[:8]}, but {models} holds {here[:8]}"
            if path in named:
                raise SystemExit(f"{why}: walk it with the models it ran")
            print(f"{why}: left out", file=sys.stderr)
            continue
        chosen.append(path)
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, required=True)
    parser.add_argument("--raw", type=Path, nargs="+", required=True,
                        help="raw records (*.raw.json) or folders of them: every trained-drafter DFlash run")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--write", action="store_true",
                        help="store the summary in each raw record (acceptance_along_output), for the merge")
    parser.add_argument("--again", action="store_true", help="with --write: walk records that hold one already")
    args = parser.parse_args(argv)
    paths = [q for p in args.raw for q in (sorted(p.glob("*.raw.json")) if p.is_dir() else [p])]
    for path in walked_runs(paths, args.models, {p for p in args.raw if not p.is_dir()}):
        raw = json.loads(path.read_text())
        if args.write and raw.get("acceptance_along_output") and not args.again:
            continue  # walked by an earlier call: the same weights on the same text
        raw["acceptance_along_output"] = along_run(raw, args.models, args.device)
        print(json.dumps({"run": raw["name"], "acceptance_vllm": realshape.acceptance(raw.get("counters") or {}),
                          "acceptance_along_output": raw["acceptance_along_output"]}), flush=True)
        if args.write:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(raw) + "\n")
            tmp.replace(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
