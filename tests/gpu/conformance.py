"""vLLM's served drafter judged by z-lab's loop (issue 50, items 4 and 7).

Inputs, all per prompt of the trained target's ``prompts.json``:

* ``zlab``: ``zlab_reference.py``'s record: z-lab's output tokens, its acceptance lengths (tokens
  produced per verify step) and the target's top-1/top-2 margins along that output;
* ``twin``: the served target without its drafter, one request at a time, logprobs on: its
  margins at the same positions, for the noise bound;
* ``served``: the served recipe with its drafter, one request at a time: output tokens and the
  request's acceptance from ``/metrics`` read before and after it; and, where the common prefix is
  shorter than the output, a second request stopped at that prefix (``prefix_requests``).

The noise bound is ``bars.yaml``'s procedure, fixed before any run: the ``margin_move_percentile``
percentile of |margin(z-lab's transformers target) - margin(vLLM twin)| over every position where
the two texts still agree. A prompt's common prefix ends at the first position whose reference
margin is under that bound: beyond it the two stacks may pick different tokens without either
being wrong. Over each prefix the outputs must be identical, and acceptance is compared pooled
(every prefix's tokens over its verify steps), with the per-prompt gaps listed.

``python tests/gpu/conformance.py --zlab Z.json --twin T.json --served S.json --out results/``
writes ``conformance.json`` and ``conformance.md`` for one vLLM release per served record.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bars  # noqa: E402

ACCEPTANCE_GAP = 0.05  # issue 50's Done-when: pooled acceptance within 5 % of z-lab's


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (no interpolation: the bound is a value that occurred)."""
    if not values:
        raise ValueError("no margin moves to take a percentile of")
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def margin_moves(zlab_rows: list[dict], twin_rows: list[dict]) -> list[float]:
    """|z-lab margin - twin margin| at every position before the two texts first differ."""
    moves = []
    for z, t in zip(zlab_rows, twin_rows):
        for i, (a, b) in enumerate(zip(z["token_ids"], t["token_ids"])):
            if a != b:
                break
            if i < len(z["margins"]) and i < len(t["margins"]):
                moves.append(abs(z["margins"][i] - t["margins"][i]))
    return moves


def noise_bound(zlab_rows: list[dict], twin_rows: list[dict]) -> float:
    return percentile(margin_moves(zlab_rows, twin_rows), bars.get("noise", "margin_move_percentile"))


def common_prefix(margins: list[float], bound: float) -> int:
    """Output tokens before the first position whose reference margin is under ``bound``."""
    for i, m in enumerate(margins):
        if m < bound:
            return i
    return len(margins)


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def zlab_prefix_steps(acceptance_lengths: list[int], prefix: int) -> tuple[int, int]:
    """(tokens, verify steps) of z-lab's loop over the first ``prefix`` output tokens. Token 0 is
    the prefill's; each step produces its acceptance length; a step that crosses the prefix end
    counts with the tokens it produced inside it."""
    need, done, steps = max(0, prefix - 1), 0, 0
    for a in acceptance_lengths:
        if done >= need:
            break
        steps += 1
        done += min(a, need - done)
    return done, steps


def compare_prompt(z: dict, served: dict, bound: float) -> dict:
    """One prompt: its common prefix, whether vLLM's tokens equal z-lab's over it, and both
    acceptances over it (vLLM's from the request stopped at the prefix, or the whole request
    where the prefix is the whole output)."""
    prefix = common_prefix(z["margins"], bound)
    diff = first_difference(z["token_ids"][:prefix], served["token_ids"][:prefix])
    tokens, steps = zlab_prefix_steps(z["acceptance_lengths"], prefix)
    vllm = served.get("prefix_acceptance") if prefix < len(z["token_ids"]) else served.get("acceptance")
    row = {
        "prefix": prefix,
        "identical_over_prefix": diff is None,
        "first_difference": diff,
        "zlab_tokens": tokens,
        "zlab_steps": steps,
        "zlab_acceptance": round(tokens / steps, 4) if steps else None,
        "vllm_drafts": vllm.get("drafts") if vllm else None,
        "vllm_accepted": vllm.get("accepted_tokens") if vllm else None,
        "vllm_acceptance": round(vllm["mean_acceptance_length"], 4) if vllm and vllm.get("mean_acceptance_length")
        else None,
    }
    if row["zlab_acceptance"] and row["vllm_acceptance"]:
        row["gap"] = round(row["vllm_acceptance"] / row["zlab_acceptance"] - 1, 4)
    return row


def pooled(rows: list[dict]) -> dict:
    """z-lab: prefix tokens over verify steps; vLLM: 1 + accepted over drafts; both over every
    prompt that has both (a prefix of one token has no verify step)."""
    both = [r for r in rows if r["zlab_steps"] and r["vllm_drafts"]]
    z_tokens, z_steps = sum(r["zlab_tokens"] for r in both), sum(r["zlab_steps"] for r in both)
    v_acc, v_drafts = sum(r["vllm_accepted"] for r in both), sum(r["vllm_drafts"] for r in both)
    out = {"prompts": len(both),
           "zlab_acceptance": round(z_tokens / z_steps, 4) if z_steps else None,
           "vllm_acceptance": round(1 + v_acc / v_drafts, 4) if v_drafts else None}
    if out["zlab_acceptance"] and out["vllm_acceptance"]:
        out["gap"] = round(out["vllm_acceptance"] / out["zlab_acceptance"] - 1, 4)
        out["within"] = abs(out["gap"]) <= ACCEPTANCE_GAP
    return out


def judge(zlab: dict, twin: dict, served: dict) -> dict:
    """The conformance verdict of one served release against z-lab's record."""
    bound = noise_bound(zlab["rows"], twin["rows"])
    rows = [compare_prompt(z, s, bound) for z, s in zip(zlab["rows"], served["rows"])]
    pool = pooled(rows)
    identical = sum(1 for r in rows if r["identical_over_prefix"])
    teeth = {"zlab_reproduces": zlab.get("passes_identical") is True,
             "zlab_gate_passes": (zlab.get("gate") or {}).get("passes") is True,
             "drafts_accepted_and_rejected": bool(zlab["acceptance"]["steps_none_accepted"])
             and any(a > 1 for r in zlab["rows"] for a in r["acceptance_lengths"])}
    return {
        "vllm": served.get("vllm"), "series": served.get("series"), "noise_bound": round(bound, 5),
        "noise_percentile": bars.get("noise", "margin_move_percentile"),
        "prompts": len(rows), "identical_over_prefix": identical,
        "outputs_identical": identical == len(rows),
        "acceptance": pool, "teeth": teeth,
        "holds": identical == len(rows) and bool(pool.get("within")) and all(teeth.values())
        and len(rows) >= bars.get("gate", "min_prompts"),
        "rows": rows,
    }


def markdown(doc: dict) -> str:
    lines = ["# The served drafter against z-lab's loop (issue 50)", "",
             f"Oracle: {doc['oracle']}. Deviation: {doc['deviation']}.", "",
             "Generated by `python tests/gpu/conformance.py`; do not edit.", "",
             "| vLLM | series | prompts | identical over prefix | z-lab acceptance | vLLM acceptance | gap | "
             "noise bound | teeth | holds |", "|---|---|---|---|---|---|---|---|---|---|"]
    for v in doc["releases"]:
        a = v["acceptance"]
        lines.append(f"| {v['vllm']} | {v['series']} | {v['prompts']} | {v['identical_over_prefix']}/{v['prompts']} | "
                     f"{a.get('zlab_acceptance')} | {a.get('vllm_acceptance')} | {a.get('gap')} | "
                     f"{v['noise_bound']} (p{v['noise_percentile']}) | "
                     f"{', '.join(k for k, ok in v['teeth'].items() if not ok) or 'all'} | "
                     f"{'**yes**' if v['holds'] else '**no**'} |")
    for v in doc["releases"]:
        lines += ["", f"## vLLM {v['vllm']}: per prompt", "",
                  "| # | prefix | identical | first difference | z-lab | vLLM | gap |", "|---|---|---|---|---|---|---|"]
        for i, r in enumerate(v["rows"]):
            lines.append(f"| {i} | {r['prefix']} | {r['identical_over_prefix']} | {r['first_difference']} | "
                         f"{r['zlab_acceptance']} | {r['vllm_acceptance']} | {r.get('gap')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zlab", type=Path, required=True)
    parser.add_argument("--twin", type=Path, required=True, help="the no-drafter server's record")
    parser.add_argument("--served", type=Path, action="append", required=True,
                        help="a served record with the drafter (one per vLLM release)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    zlab = json.loads(args.zlab.read_text())
    twin = json.loads(args.twin.read_text())
    doc = {"oracle": zlab["oracle"], "deviation": zlab["deviation"], "target_sha256": zlab["target_sha256"],
           "drafter_sha256": zlab["drafter_sha256"], "bars": bars.blob_hash(),
           "releases": [judge(zlab, twin, json.loads(p.read_text())) for p in args.served]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "conformance.json").write_text(json.dumps(doc, indent=1) + "\n")
    (args.out / "conformance.md").write_text(markdown(doc))
    print(markdown(doc).split("\n## ")[0])
    return 0 if all(v["holds"] for v in doc["releases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
