"""Lossless verdicts for DFlash runs against the no-drafter baseline, and the results table.

Speculative decoding with greedy verification must reproduce the target's
own greedy tokens. On a GPU it can still differ where the target itself is
undecided: when the top-1 and top-2 logits at a position are equal, or one
bf16 step apart, a different batch shape (the verifier scores 16 tokens per
request at once) may round them the other way. So a DFlash run is
``"lossless": true`` only when, for every prompt, its tokens equal the
baseline's, or the first divergence sits on such a baseline tie and the
DFlash token is the baseline's runner-up there. Nothing after a first
divergence is judged: the contexts differ from then on.

The runs record ``logprobs_mode=raw_logits``, so the values compared are
the logits themselves (bf16 numbers widened to fp32), and "one bf16 step"
is the spacing of bf16 numbers at the larger of the two magnitudes.

Pure Python (no torch): the unit tests run in CI.

``python tests/gpu/judging/compare.py ROUND.json [ROUND.json ...] --meta META.json --json OUT.json --md OUT.md``
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

BF16_MANTISSA_BITS = 7


def bf16_step(value: float) -> float:
    """Spacing of bf16 numbers at |value| (the unit in the last place)."""
    mag = abs(value)
    if mag == 0.0 or not math.isfinite(mag):
        return 0.0
    _, exp = math.frexp(mag)  # mag = m * 2**exp, 0.5 <= m < 1
    return math.ldexp(1.0, exp - 1 - BF16_MANTISSA_BITS)


def is_tie(top1: float, top2: float) -> bool:
    """True when the two best values are equal or one bf16 step apart."""
    gap = top1 - top2
    step = bf16_step(max(abs(top1), abs(top2)))
    return gap <= step * (1.0 + 1e-6)


def _ranked(position: list) -> tuple[list | None, list | None]:
    """The first entry of rank 1 and the first of rank 2, in the position's order."""
    first = second = None
    for e in position:
        if e[2] == 1:
            if first is None:
                first = e
        elif e[2] == 2 and second is None:
            second = e
    return first, second


def compare_prompt(index: int, base: dict, cand: dict) -> dict | None:
    """None when the token ids match; else a record of the first divergence."""
    b, c = base["token_ids"], cand["token_ids"]
    if b == c:
        return None
    pos = next((i for i, (x, y) in enumerate(zip(b, c)) if x != y), None)
    if pos is None:
        return {"prompt": index, "position": min(len(b), len(c)), "tie": False,
                "reason": f"length differs: baseline {len(b)}, dflash {len(c)}"}
    rec: dict = {"prompt": index, "position": pos, "baseline_token": b[pos],
                 "dflash_token": c[pos]}
    cand_top = cand.get("top") or []
    if pos < len(cand_top):
        # The target's own logits in the DFlash run at the same context: how
        # far they moved from the baseline's tells numerics from a wrong cache.
        rec["dflash_top"] = cand_top[pos]
    top = base.get("top") or []
    if pos >= len(top):
        rec.update(tie=False, reason="baseline has no logprobs at that position")
        return rec
    first, second = _ranked(top[pos])
    if first is None or second is None:
        rec.update(tie=False, reason="baseline lacks a top-1 or top-2 entry there")
        return rec
    gap = first[1] - second[1]
    rec.update(top1=first[1], top2=second[1], gap=gap,
               bf16_step=bf16_step(max(abs(first[1]), abs(second[1]))))
    # On an exact tie the reported rank order need not match the token the
    # sampler took, so either of the two best may be the baseline's.
    if c[pos] not in (first[0], second[0]):
        rec.update(tie=False, reason="dflash token is not among the baseline's top two")
    elif not is_tie(first[1], second[1]):
        rec.update(tie=False, reason="baseline top-1/top-2 gap exceeds one bf16 step")
    else:
        rec.update(tie=True)
    return rec


def verdict(baseline: dict, candidate: dict) -> dict:
    """Lossless verdict of one DFlash run against its baseline run."""
    if not baseline.get("ok"):
        return {"lossless": False, "reason": "baseline run failed"}
    if not candidate.get("ok"):
        return {"lossless": False, "reason": "dflash run failed"}
    bo, co = baseline["outputs"], candidate["outputs"]
    if len(bo) != len(co):
        return {"lossless": False, "reason": f"prompt count differs: {len(bo)} vs {len(co)}"}
    divergences = [d for i, (b, c) in enumerate(zip(bo, co))
                   if (d := compare_prompt(i, b, c)) is not None]
    return {
        "lossless": all(d["tie"] for d in divergences),
        "prompts": len(bo),
        "identical": len(bo) - len(divergences),
        "tokens": sum(len(b["token_ids"]) for b in bo),
        "divergences": divergences,
    }


def target_path_flips(rounds: list[dict]) -> dict[str, dict[tuple[int, int], int]]:
    """Per target, the (prompt, position) where the target alone picks another argmax
    when that position is computed in one multi-token pass instead of a decode step.

    From ``baseline-rescore`` runs (run_modes.py): the baseline's outputs fed back
    as prompts. DFlash verification also scores positions in multi-token passes,
    so its tokens may follow these flips without any fault of the drafter.
    """
    flips: dict[str, dict[tuple[int, int], int]] = {}
    for rnd in rounds:
        for r in rnd["runs"]:
            rescore = r.get("rescore")
            if not rescore:
                continue
            table = flips.setdefault(r["target"], {})
            for m in rescore.get("mismatches", []):
                best = next((e for e in m["prefill_top"] if e[2] == 1), None)
                if best is not None:
                    table[(m["prompt"], m["position"])] = best[0]
    return flips


def annotate_path_flips(v: dict, flips: dict[tuple[int, int], int] | None) -> dict:
    """Mark each divergence that sits on a target-alone prefill/decode argmax flip.

    This never turns ``lossless`` true: it records why a strict failure happened.
    """
    divs = v.get("divergences")
    if flips is None or not divs:
        return v
    for d in divs:
        tok = flips.get((d["prompt"], d["position"]))
        d["target_prefill_argmax"] = tok
        d["on_target_path_flip"] = tok is not None and tok == d.get("dflash_token")
    v["strict_failures_all_on_target_path_flips"] = all(
        d["tie"] or d["on_target_path_flip"] for d in divs)
    return v


def summarize(rounds: list[dict]) -> list[dict]:
    """One row per run, DFlash rows carrying their verdict against the same round's baseline."""
    rows = []
    flips = target_path_flips(rounds)
    for rnd in rounds:
        baselines = {r["target"]: r for r in rnd["runs"] if r["mode"] == "baseline"}
        for r in rnd["runs"]:
            backends = r.get("backends") or {}
            groups = r.get("kv_cache_groups") or []
            draft_groups = sorted({g["gid"] for g in groups if g.get("drafter_layers")})
            row = {
                "round": rnd["label"], "target": r["target"], "drafter": r.get("drafter"),
                "mode": r["mode"], "ok": bool(r.get("ok")),
                "target_backends": sorted(set((backends.get("target") or {}).values())),
                "drafter_backends": sorted(set((backends.get("drafter") or {}).values())),
                "kv_cache_groups": len(groups),
                "drafter_kv_groups": draft_groups,
                "error": (r.get("error") or {}).get("root_cause") or r.get("log_error_line")
                if not r.get("ok") else None,
                "log_error_line": r.get("log_error_line"),
                "log_backends_auto": r.get("log_backends_auto"),
                "log_forced_triton": r.get("log_forced_triton"),
            }
            if r["mode"] not in ("baseline", "baseline-rescore"):
                base = baselines.get(r["target"])
                row["verdict"] = annotate_path_flips(verdict(base, r), flips.get(r["target"])) if base else {
                    "lossless": False, "reason": "no baseline run"}

            if r.get("rescore"):
                # Prompt logprobs come back as logprobs whatever logprobs_mode says,
                # so only the argmax comparison is kept, not a value drift.
                row["rescore"] = {k: r["rescore"][k] for k in ("positions", "argmax_mismatches")}
            rows.append(row)
    return rows


def _cell(row: dict) -> str:
    if not row["ok"]:
        return "failed: " + (row["error"] or "unknown").replace("|", "/")[:240]
    v = row.get("verdict")
    if v is None:
        return "serves"
    if v.get("lossless"):
        ties = [d for d in v.get("divergences", [])]
        extra = "" if not ties else (
            f"; {len(ties)} first divergence(s) on baseline ties at "
            + ", ".join(f"p{d['prompt']}@{d['position']} gap {d.get('gap', 0):.4g}" for d in ties))
        return f"lossless ({v['identical']}/{v['prompts']} identical{extra})"
    if v.get("reason"):
        return f"NOT lossless: {v['reason']}"
    bad = [d for d in v.get("divergences", []) if not d["tie"]]
    detail = ", ".join(f"p{d['prompt']}@{d['position']} gap {d.get('gap', float('nan')):.4g}"
                       for d in bad[:4]) + (", ..." if len(bad) > 4 else "")
    cell = f"NOT lossless: {v['identical']}/{v['prompts']} identical; {len(bad)} beyond a tie ({detail})"
    if v.get("strict_failures_all_on_target_path_flips"):
        cell += (f"; all {len(bad)} sit where the target alone (no drafter) flips its argmax"
                 " between a multi-token pass and a decode step, and DFlash took the"
                 " multi-token argmax")
    return cell


def markdown(rows: list[dict], meta: dict) -> str:
    out = [
        "# GPU proof: Gemma-4-shaped target + DFlash on vLLM " + str(meta.get("vllm", "?")),
        "",
        f"- date: {meta.get('date', '?')}",
        f"- GPU: {meta.get('gpu', '?')}",
        f"- vLLM: {meta.get('vllm', '?')} (wheel without FA2/FA4; torch {meta.get('torch', '?')})",
        f"- series: {meta.get('series', 'none (stock only)')}",
        f"- command: {meta.get('command', 'see tests/gpu/README.md')}",
        "",
        "| round | target | drafter | mode | target attn | drafter attn | KV groups (drafter in) | result |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["mode"] == "baseline-rescore":
            rs = r.get("rescore") or {}
            out.append(
                f"| {r['round']} | {r['target']} | - | {r['mode']} | "
                f"{'/'.join(r['target_backends']) or '-'} | - | {r['kv_cache_groups']} | "
                f"target alone: prefill-path argmax differs from the decode-path token at "
                f"{rs.get('argmax_mismatches', '?')} of {rs.get('positions', '?')} positions |")
            continue
        groups = f"{r['kv_cache_groups']} ({','.join(map(str, r['drafter_kv_groups'])) or '-'})"
        if not r["ok"] and r["kv_cache_groups"] == 0:
            groups = "-"
        target_attn = "/".join(r["target_backends"])
        drafter_attn = "/".join(r["drafter_backends"])
        if not r["ok"]:
            # A run that failed during start-up has no runner to inspect; the log
            # still names what was chosen (the target's forced backend, and the
            # backend picked automatically, which can only be the drafter's).
            if not target_attn and r.get("log_forced_triton"):
                target_attn = "TRITON_ATTN (log)"
            if not drafter_attn and r.get("log_backends_auto") and r["drafter"]:
                drafter_attn = "/".join(sorted(set(r["log_backends_auto"]))) + " (log)"
        out.append(
            f"| {r['round']} | {r['target']} | {r['drafter'] or '-'} | {r['mode']} | "
            f"{target_attn or '-'} | {drafter_attn or '-'} | {groups} | {_cell(r)} |"
        )
    notes = meta.get("notes") or []
    if notes:
        out += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rounds", nargs="+", type=Path)
    parser.add_argument("--meta", type=Path)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--md", type=Path, required=True)
    args = parser.parse_args(argv)
    rounds = [json.loads(p.read_text()) for p in args.rounds]
    meta = json.loads(args.meta.read_text()) if args.meta else {}
    rows = summarize(rounds)
    args.json.write_text(json.dumps({"meta": meta, "rows": rows, "rounds": rounds}) + "\n")
    args.md.write_text(markdown(rows, meta))
    print(markdown(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
