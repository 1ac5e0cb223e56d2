"""The non-degeneracy gate: a GPU record proves something only if its outputs say something.

The first real-shape targets copied their last prompt token forever; a
lossless verdict between two constant sequences cannot fail. Every record of
the trained-target proof therefore carries this block, computed from the
generated token ids (and the raw top-2 logits where the run kept them), and
a verdict counts as proof only when the block passes.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
import bars  # noqa: E402
import compare  # noqa: E402

# The trained-target proof's concurrency groups: a grouped run serves the first c prompts for
# each c. Here, not in realshape.py, because the trainers forecast the gate over them too.
TRAINED_CONCURRENCY = (1, 4, 17, 32)


def as_groups(items: list, concurrency: tuple[int, ...] = TRAINED_CONCURRENCY) -> list:
    """``items`` (one per prompt) as a grouped run sees them: the first c for every c, in order.

    The first prompts count once per group they are in, so a gate over a grouped
    record weighs them more than a reference record does.
    """
    return [item for c in concurrency for item in items[:c]]


# From bars.yaml, the one place the criteria live (issue 51); never lower them there (issue 23).
MAX_CONSTANT_SEQUENCES = bars.get("gate", "max_constant_sequences")
MIN_MEDIAN_DISTINCT_FRACTION = bars.get("gate", "min_median_distinct_fraction")
MAX_NAN_POSITIONS = bars.get("gate", "max_nan_positions")
LOOP_WINDOW = bars.get("gate", "loop_window")
LOOP_MAX_PERIOD = bars.get("gate", "loop_max_period")
MIN_PROMPTS = bars.get("gate", "min_prompts")
MIN_GENERATED_TOKENS = bars.get("gate", "min_generated_tokens")
MAX_LOOPING_FRACTION = bars.get("gate", "max_looping_fraction")


def loop_period(tokens: list, window: int = LOOP_WINDOW, max_period: int = LOOP_MAX_PERIOD) -> int | None:
    """The smallest period p <= max_period with which the last ``window`` tokens repeat
    (token i equals token i + p throughout the window), or None.

    The constant-sequence count misses a model that says something and then stalls: a
    sequence ending in 93 copies of one token has many distinct tokens before them. A
    sequence shorter than the window is not judged here; the length bar catches it.
    """
    if len(tokens) < window:
        return None
    tail = tokens[-window:]
    for p in range(1, max_period + 1):
        if all(tail[i] == tail[i + p] for i in range(window - p)):
            return p
    return None


def looping(tokens: list) -> bool:
    return loop_period(tokens) is not None


def nondegenerate(outputs: list[dict], prompt_keys: list | None = None) -> dict:
    """``outputs``: records with ``token_ids`` and optionally ``top`` (per position, [token, logit, rank]).

    ``prompt_keys``: which prompt each output answered (one per output), where several outputs
    answer the same prompt (a grouped run serves the first c prompts for every c); without it
    every output is a prompt of its own. ``prompts_full_length`` counts the distinct prompts with
    an output of at least MIN_GENERATED_TOKENS tokens: the bar is on distinct text, not requests.

    ``nan_positions`` counts positions whose raw logits were NaN: the token there is
    whatever argmax makes of NaN, so such output says nothing (seen on the H100 runs).
    """
    keys = list(prompt_keys) if prompt_keys is not None else list(range(len(outputs)))
    if len(keys) != len(outputs):
        raise ValueError(f"{len(keys)} prompt keys for {len(outputs)} outputs")
    seqs = [o["token_ids"] for o in outputs if o.get("token_ids")]
    full = {k for k, o in zip(keys, outputs) if len(o.get("token_ids") or []) >= MIN_GENERATED_TOKENS}
    fractions = [len(set(s)) / len(s) for s in seqs]
    near = nan = 0
    for o in outputs:
        for pos in o.get("top") or []:
            counted = _position(pos)
            nan += counted == "nan"
            near += counted == "tie"
    return {
        "sequences": len(seqs),
        "constant_sequences": sum(1 for s in seqs if len(set(s)) == 1),
        "median_distinct_fraction": round(statistics.median(fractions), 4) if fractions else 0.0,
        "near_ties": near,
        "nan_positions": nan,
        "looping_sequences": sum(1 for s in seqs if looping(s)),
        "prompts": len(set(keys)),
        "prompts_full_length": len(full),
        "min_generated_tokens": min((len(s) for s in seqs), default=0),
    }


# A bf16 step at magnitude m is at most m * 2**-7 (compare.bf16_step): a wider top-1/top-2 gap
# is no tie, without computing the step. The gate runs over every position of every raw record.
_TIE_BOUND = 2.0 ** -compare.BF16_MANTISSA_BITS * (1.0 + 1e-6)


def _position(pos: list) -> str | None:
    """"nan" where a raw logit of the position is NaN, "tie" where its first rank-1 and rank-2
    entries are a bf16 tie (compare.is_tie), else None; one pass over the entries."""
    first = second = None
    for e in pos:
        value = e[1]
        if value != value:  # NaN, the one value unequal to itself
            return "nan"
        if e[2] == 1:
            if first is None:
                first = value
        elif e[2] == 2 and second is None:
            second = value
    if first is None or second is None:
        return None
    if first - second > max(abs(first), abs(second)) * _TIE_BOUND:
        return None
    return "tie" if compare.is_tie(first, second) else None


def failures(block: dict | None) -> list[str]:
    """Why ``block`` is not worth comparing; empty when it passes. A block written before the
    loop check (no ``looping_sequences``) fails: the loops were never counted."""
    if not block or not block.get("sequences"):
        return ["no output"]
    why = []
    if block["constant_sequences"] > MAX_CONSTANT_SEQUENCES:
        why.append(f"{block['constant_sequences']} constant sequences")
    if block["median_distinct_fraction"] < MIN_MEDIAN_DISTINCT_FRACTION:
        why.append(f"median distinct fraction {block['median_distinct_fraction']} < {MIN_MEDIAN_DISTINCT_FRACTION}")
    if block.get("nan_positions", 0) > MAX_NAN_POSITIONS:
        why.append(f"{block['nan_positions']} NaN positions")
    loops = block.get("looping_sequences")
    if loops is None:
        why.append("loops not counted")
    elif loops > MAX_LOOPING_FRACTION * block["sequences"]:
        why.append(f"{loops} of {block['sequences']} sequences looping (at most {MAX_LOOPING_FRACTION:.0%})")
    full = block.get("prompts_full_length")
    if full is None:
        why.append("prompt count not recorded")
    elif full < MIN_PROMPTS:
        why.append(f"{full} prompts of {MIN_GENERATED_TOKENS}+ tokens (at least {MIN_PROMPTS})")
    return why


def passes(block: dict | None) -> bool:
    """True when the outputs are worth comparing: no constant sequence, enough distinct tokens,
    no NaN logits, at most MAX_LOOPING_FRACTION looping, and MIN_PROMPTS distinct prompts of
    MIN_GENERATED_TOKENS tokens."""
    return not failures(block)


def bench_outputs(doc: dict, prompts: int | None = None) -> tuple[list[list[int]], list[int]] | None:
    """A `launcher bench --record-outputs` result's outputs at concurrency 1 that came back, and
    the prompt each answered (request i sent prompt i mod ``prompts``, by default the count of
    the prompt file the result names); None where it kept none."""
    prompts = prompts or (doc.get("prompts_file") or {}).get("prompts")
    one = next((r for r in doc.get("runs") or [] if r.get("concurrency") == 1), None)
    if not prompts or not one or not one.get("outputs"):
        return None
    pairs = [(i % prompts, ids) for i, ids in enumerate(one["outputs"]) if ids]
    return [ids for _, ids in pairs], [key for key, _ in pairs]


def bench_block(tokens: list[list[int]], keys: list[int]) -> dict:
    """The gate's block over a benchmark's outputs (bench_outputs), with the prompts that loop."""
    block = nondegenerate([{"token_ids": ids} for ids in tokens], keys)
    block["looping_prompts"] = sorted({key for key, ids in zip(keys, tokens) if looping(ids)})
    return block


def pair_outputs(nd: dict | None) -> tuple[str, list[str]]:
    """A speed row's two sides ({"reference": block, "dflash": block}) through the gate:
    "not recorded", "pass the gate" or "fail the gate", with the failures by side."""
    if not isinstance(nd, dict) or not nd.get("dflash") or not nd.get("reference"):
        return "not recorded", []
    why = [f"{side}: {w}" for side in ("reference", "dflash") for w in failures(nd[side])]
    return ("fail the gate" if why else "pass the gate"), why


def acceptance_summary(steps: list[int], k: int) -> dict:
    """vLLM's acceptance metrics of a list of verify steps: mean acceptance length (1 + accepted
    drafts per step), accepted drafts per step, per-position acceptance rate (the share of steps
    whose draft i was accepted, vLLM's spec_decode_num_accepted_tokens_per_pos / num_drafts), and
    the histogram of accepted lengths 0..K."""
    if not steps:
        return {"steps": 0, "mean_acceptance_length": None, "accepted_per_step": None,
                "per_position": [None] * k, "histogram": [0] * (k + 1)}
    hist = [0] * (k + 1)
    for f in steps:
        hist[f] += 1
    per_pos = [sum(1 for f in steps if f > i) / len(steps) for i in range(k)]
    mean = sum(steps) / len(steps)
    return {"steps": len(steps), "mean_acceptance_length": round(1 + mean, 4),
            "accepted_per_step": round(mean, 4), "per_position": [round(p, 4) for p in per_pos],
            "histogram": hist}
