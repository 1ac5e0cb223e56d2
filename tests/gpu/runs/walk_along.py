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

    python tests/gpu/runs/walk_along.py --models MODELS --raw RAW_DIR_OR_FILES [--device cuda] [--write]

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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
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


class Walker:
    """The walk's models, each loaded once for every run walked: the bf16 target and the NVFP4
    ones (one per numerics: nvfp4_reference.apply changes a model in place), the drafter, the
    held-out prompts. Steps are kept per text as well: runs that wrote the same text (an ablation
    under exact numerics and its patched run, one prompt in several groups) are walked once."""

    def __init__(self, models: Path, device: str, k: int = realshape.NUM_SPECULATIVE_TOKENS,
                 chunk_tokens: int = 8192) -> None:
        self.models, self.device, self.k, self.chunk_tokens = models, device, k, chunk_tokens
        self.target_dir = models / realshape.TRAINED_TARGET
        self.prompts = [p["token_ids"] for p in json.loads((self.target_dir / "prompts.json").read_text())]
        self.drafter = train_drafter.load_drafter(models / realshape.TRAINED_DRAFTER_TRAINED, device)
        self._targets: dict[str, object] = {}
        self._steps: dict[tuple, list[int]] = {}
        self.shared = train_drafter.shared_from_target(self.target("bf16"), self.target_dir)

    def target(self, numerics: str):
        if numerics not in self._targets:
            model = train_drafter.load_target(self.target_dir, self.device)
            if numerics != "bf16":
                # The features vLLM's drafter got came from the NVFP4 target of the run's numerics.
                from safetensors.torch import load_file

                import nvfp4_reference

                tensors = load_file(str(self.models / (realshape.TRAINED_TARGET + "-nvfp4") / "model.safetensors"))
                nvfp4_reference.apply(model, tensors, activations=numerics == "W4A4")
            self._targets[numerics] = model
        return self._targets[numerics]

    def run(self, raw: dict) -> dict:
        """The walk along every request of a DFlash run's raw record (its ``groups``)."""
        numerics, semantics = run_numerics(raw), f"vllm-{raw['vllm_version']}"
        model = self.target(numerics)
        steps: list[int] = []
        texts = set()
        t0 = time.time()
        for _c, outputs in sorted(raw["groups"].items(), key=lambda kv: int(kv[0])):
            for i, out in enumerate(outputs):  # group c sent the first c prompts, in order
                key = (numerics, semantics, i, tuple(out["token_ids"]))
                texts.add(key)
                if key not in self._steps:
                    self._steps[key] = steps_along(model, self.drafter, self.shared, self.prompts[i],
                                                   out["token_ids"], semantics, self.k, self.chunk_tokens)
                steps += self._steps[key]
        summary = gate.acceptance_summary(steps, self.k)
        summary.update(semantics=semantics, numerics=numerics, requests=sum(len(o) for o in raw["groups"].values()),
                       distinct_texts=len(texts), device=self.device, wall_s=round(time.time() - t0, 1))
        return summary


def walked_runs(paths: list[Path], models: Path, named: set[Path] | None = None) -> list[tuple[Path, dict]]:
    """The raw records this walk applies to, read: trained-drafter DFlash runs that generated,
    with the drafter in ``models``. A record named on the command line (``named``; default: all)
    of another drafter is refused by name, never walked with the wrong weights; one found in a
    folder is left out with a line that says so (a folder may hold an earlier drafter's runs)."""
    named = set(paths) if named is None else named
    here = None
    chosen = []
    for path in paths:
        raw = json.loads(path.read_text())
        spec = realshape.RUNS.get(raw.get("name"))
        if spec is None or spec.drafter != "trained" or not raw.get("groups") or spec.speed:
            continue
        here = here or train_drafter.drafter_sha256(models / realshape.TRAINED_DRAFTER_TRAINED)
        if raw.get("drafter_sha256") != here:
            why = f"{path}: drafter {str(raw.get('drafter_sha256'))[:8]}, but {models} holds {here[:8]}"
            if path in named:
                raise SystemExit(f"{why}: walk it with the models it ran")
            print(f"{why}: left out", file=sys.stderr)
            continue
        chosen.append((path, raw))
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
    runs = [(path, raw) for path, raw in walked_runs(paths, args.models, {p for p in args.raw if not p.is_dir()})
            # walked by an earlier call: the same weights on the same text
            if not (args.write and raw.get("acceptance_along_output") and not args.again)]
    walker = Walker(args.models, args.device) if runs else None
    for path, raw in runs:
        raw["acceptance_along_output"] = walker.run(raw)
        print(json.dumps({"run": raw["name"], "acceptance_vllm": realshape.acceptance(raw.get("counters") or {}),
                          "acceptance_along_output": raw["acceptance_along_output"]}), flush=True)
        if args.write:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(raw) + "\n")
            tmp.replace(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
