"""The non-degeneracy gate: a GPU record proves something only if its outputs say something.

The first real-shape targets copied their last prompt token forever; a
lossless verdict between two constant sequences cannot fail. Every record of
the trained-target proof therefore carries this block, computed from the
generated token ids (and the raw top-2 logits where the run kept them), and
a verdict counts as proof only when the block passes.
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
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


# Never lower these (issue 23); raise them when the pilot shows more is reachable.
MAX_CONSTANT_SEQUENCES = 0
MIN_MEDIAN_DISTINCT_FRACTION = 0.2


def nondegenerate(outputs: list[dict]) -> dict:
    """``outputs``: records with ``token_ids`` and optionally ``top`` (per position, [token, logit, rank]).

    ``nan_positions`` counts positions whose raw logits were NaN: the token there is
    whatever argmax makes of NaN, so such output says nothing (seen on the H100 runs).
    """
    seqs = [o["token_ids"] for o in outputs if o.get("token_ids")]
    fractions = [len(set(s)) / len(s) for s in seqs]
    near = nan = 0
    for o in outputs:
        for pos in o.get("top") or []:
            if any(isinstance(e[1], float) and math.isnan(e[1]) for e in pos):
                nan += 1
                continue
            first, second = compare._ranked(pos)
            if first is not None and second is not None and compare.is_tie(first[1], second[1]):
                near += 1
    return {
        "sequences": len(seqs),
        "constant_sequences": sum(1 for s in seqs if len(set(s)) == 1),
        "median_distinct_fraction": round(statistics.median(fractions), 4) if fractions else 0.0,
        "near_ties": near,
        "nan_positions": nan,
    }


def passes(block: dict | None) -> bool:
    """True when the outputs are worth comparing (no constant sequence, enough distinct
    tokens, no NaN logits)."""
    return bool(block) and block["sequences"] > 0 \
        and block["constant_sequences"] <= MAX_CONSTANT_SEQUENCES \
        and block["median_distinct_fraction"] >= MIN_MEDIAN_DISTINCT_FRACTION \
        and block.get("nan_positions", 0) == 0


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
