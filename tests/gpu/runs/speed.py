"""Issue 25, item 5: output tok/s with DFlash and without the drafter at this width, beside
bench_report's projection at the acceptance and step times measured in the same runs.

Child side (``measure``, on the GPU, in the realshape engine's process): for each
concurrency c, the first c prompts are generated twice, a warm-up (Triton kernels compiled
and the prompts' prefixes cached on first use) and a timed pass. The timed pass gives the
wall time, the generated tokens, the engine's spec-decode counters over that pass, and CUDA
events around each engine step (``bench_steps.StepTimer``: the whole step, the target
forward and, with a drafter, ``propose``). Both engines see the same warm cache.

Record side (``summary``, ``pair``; pure Python): tok/s = generated tokens / wall seconds;
step times are bench_report.phase_ms's medians over the steady steps (those that forwarded
c tokens without a drafter, c * (K + 1) with DFlash; verify = step - propose, as bench_report
takes it); tau (mean acceptance
length) comes from the pass's counters. The projection is bench_report's formula with these
numbers, and the measured speed-up is the DFlash engine's tok/s over the no-drafter engine's.
Speed runs must have the GPU to themselves: run them outside RS_PARALLEL lanes.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
import bench_report  # noqa: E402


def measure(llm, runner, params: list, toks: list[list[int]], concurrency: tuple[int, ...],
            generate, counters) -> dict:
    """``generate(llm, params, batch)`` -> output records; ``counters(llm)`` -> the engine's
    counters. Returns {str(c): {"outputs", "wall_s", "generated", "steps", "counters"}}."""
    import torch

    import bench_steps

    timer = bench_steps.StepTimer(torch, runner)
    out: dict = {}
    for c in concurrency:
        batch = toks[:c]
        generate(llm, params, batch)  # warm-up
        before = counters(llm)
        timer.active = True
        t0 = time.perf_counter()
        outputs = generate(llm, params, batch)
        wall = time.perf_counter() - t0
        timer.active = False
        out[str(c)] = {"outputs": outputs, "wall_s": round(wall, 4),
                       "generated": sum(len(o["token_ids"]) for o in outputs),
                       "steps": timer.collect(), "counters": counter_delta(before, counters(llm))}
    return out


def counter_delta(before: dict, after: dict) -> dict:
    delta = {}
    for key, value in after.items():
        was = before.get(key)
        if isinstance(value, list):
            was = was or [0] * len(value)
            delta[key] = [a - b for a, b in zip(value, was)]
        elif isinstance(value, (int, float)):
            delta[key] = value - (was or 0)
    return delta


def step_times(steps: list[dict], n: int, k: int, has_drafter: bool) -> dict:
    """bench_report.phase_ms over the steady steps of concurrency ``n`` (verify steps forward
    n * (K + 1) tokens, decode steps n): the step times the projection needs."""
    m = bench_report.phase_ms({"forward_tokens": n * (k + 1) if has_drafter else n, "steps": steps})
    if not has_drafter:
        return {"decode_steps": m["steps"], "t_decode_ms": m["step_ms"]}
    return {"verify_steps": m["steps"], "t_draft_ms": m["propose_ms"],
            "t_verify_ms": (None if None in (m["step_ms"], m["propose_ms"])
                            else round(m["step_ms"] - m["propose_ms"], 4))}


def summary(speed: dict, has_drafter: bool, k: int) -> dict:
    """Per concurrency: tok/s, the step times the projection needs (step_times) and tau from
    the counters."""
    rows = {}
    for c, g in speed.items():
        row = {"tok_s": round(g["generated"] / g["wall_s"], 2) if g.get("wall_s") else None,
               "wall_s": g.get("wall_s"), "generated": g.get("generated"),
               **step_times(g["steps"], int(c), k, has_drafter)}
        if has_drafter:
            drafts = (g.get("counters") or {}).get("spec_drafts") or 0
            accepted = (g.get("counters") or {}).get("spec_accepted_tokens") or 0
            row["tau"] = round(1 + accepted / drafts, 4) if drafts else None
        rows[c] = row
    return rows


def pair(dflash: dict, no_drafter: dict) -> dict:
    """Per concurrency both engines ran: tok/s, the measured speed-up, bench_report's projection
    at the measured tau and step times, and measured over projected."""
    out = {}
    for c in sorted(set(dflash) & set(no_drafter), key=int):
        d, b = dflash[c], no_drafter[c]
        measured = round(d["tok_s"] / b["tok_s"], 4) if d.get("tok_s") and b.get("tok_s") else None
        inputs = (d.get("tau"), b.get("t_decode_ms"), d.get("t_draft_ms"), d.get("t_verify_ms"))
        projected = None if None in inputs else round(bench_report.projected_speedup(*inputs), 4)
        out[c] = {"tok_s": {"dflash": d.get("tok_s"), "no_drafter": b.get("tok_s")},
                  "measured_speedup": measured, "projected_speedup": projected,
                  "measured_over_projected": round(measured / projected, 4) if measured and projected else None,
                  "tau": d.get("tau"), "t_decode_ms": b.get("t_decode_ms"),
                  "t_draft_ms": d.get("t_draft_ms"), "t_verify_ms": d.get("t_verify_ms")}
    return out


def served_pair(comparison: list[dict], dflash_steps: list[dict], alone_steps: list[dict], k: int) -> dict:
    """Item 5 through `vllm serve`: per concurrency of `launcher bench`'s comparison (its
    ``--compare-without-drafter`` rows), ``pair`` of the two servers: the measured speed-up
    beside bench_report's projection at the acceptance the bench measured and the step times
    the servers' own engine cores timed (step_times/vllm_step_times.py); with the TPOT ratio
    and the host's step period beside them."""
    out = {}
    for row in comparison:
        c, n = str(int(row["concurrency"])), int(row["concurrency"])
        tok, tpot = row.get("output_tok_s") or {}, row.get("tpot_ms_mean") or {}
        d = {"tok_s": tok.get("with_drafter"), "tau": row.get("mean_acceptance_length"),
             **step_times(dflash_steps, n, k, True)}
        a = {"tok_s": tok.get("without"), **step_times(alone_steps, n, k, False)}
        # The host's view: how often a steady step starts. CUDA events span a step on the GPU;
        # host work between two steps (scheduling, the drafts' bookkeeping) is outside them.
        p_d, p_a = step_period_ms(dflash_steps, n * (k + 1)), step_period_ms(alone_steps, n)
        tau = d["tau"]
        out[c] = {**pair({c: d}, {c: a})[c],
                  "measured_tpot_speedup": (round(tpot["without"] / tpot["with_drafter"], 4)
                                            if tpot.get("without") and tpot.get("with_drafter") else None),
                  "verify_steps": d["verify_steps"], "decode_steps": a["decode_steps"],
                  "dflash_period_ms": p_d, "decode_period_ms": p_a,
                  "projected_speedup_by_period": round(tau * p_a / p_d, 4) if tau and p_a and p_d else None}
    return out


# Two steady steps further apart than this are not back to back (a request ended, or a level).
MAX_STEP_GAP_S = 0.2


def step_period_ms(steps: list[dict], tokens: int) -> float | None:
    """Median wall time from one steady step's start to the next's (the plugin's ``t``), over
    consecutive pairs of steps that both forwarded ``tokens``."""
    gaps = [b["t"] - a["t"] for a, b in zip(steps, steps[1:])
            if a.get("forward_tokens") == tokens == b.get("forward_tokens") and "t" in a and "t" in b
            and 0 <= b["t"] - a["t"] < MAX_STEP_GAP_S]
    return round(1000 * statistics.median(gaps), 4) if gaps else None
