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

sys.path.insert(0, str(Path(__file__).resolve().parent))
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


def summary(speed: dict, has_drafter: bool, k: int) -> dict:
    """Per concurrency: tok/s, the step times the projection needs (bench_report.phase_ms over
    the steady steps: verify steps forward c * (K + 1) tokens, decode steps c), and tau from
    the counters."""
    rows = {}
    for c, g in speed.items():
        n = int(c)
        row = {"tok_s": round(g["generated"] / g["wall_s"], 2) if g.get("wall_s") else None,
               "wall_s": g.get("wall_s"), "generated": g.get("generated")}
        m = bench_report.phase_ms({"forward_tokens": n * (k + 1) if has_drafter else n, "steps": g["steps"]})
        if has_drafter:
            row["verify_steps"] = m["steps"]
            row["t_verify_ms"] = None if None in (m["step_ms"], m["propose_ms"]) else \
                round(m["step_ms"] - m["propose_ms"], 4)
            row["t_draft_ms"] = m["propose_ms"]
            drafts = (g.get("counters") or {}).get("spec_drafts") or 0
            accepted = (g.get("counters") or {}).get("spec_accepted_tokens") or 0
            row["tau"] = round(1 + accepted / drafts, 4) if drafts else None
        else:
            row["decode_steps"] = m["steps"]
            row["t_decode_ms"] = m["step_ms"]
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
    ``--compare-without-drafter`` rows), the measured speed-up (output tok/s and TPOT, DFlash
    over alone) beside bench_report's projection at the acceptance the bench measured and the
    step times the servers' own engine cores timed (step_times/vllm_step_times.py): verify =
    steady DFlash step (c * (K + 1) tokens) less its ``propose``, decode = steady no-drafter
    step (c tokens)."""
    out = {}
    for row in comparison:
        c = int(row["concurrency"])
        d = bench_report.phase_ms({"forward_tokens": c * (k + 1), "steps": dflash_steps})
        a = bench_report.phase_ms({"forward_tokens": c, "steps": alone_steps})
        t_verify = None if None in (d["step_ms"], d["propose_ms"]) else round(d["step_ms"] - d["propose_ms"], 4)
        tau = row.get("mean_acceptance_length")
        inputs = (tau, a["step_ms"], d["propose_ms"], t_verify)
        projected = None if None in inputs else round(bench_report.projected_speedup(*inputs), 4)
        tok, tpot = row.get("output_tok_s") or {}, row.get("tpot_ms_mean") or {}
        measured = row.get("speedup")
        out[str(c)] = {
            "tok_s": {"dflash": tok.get("with_drafter"), "no_drafter": tok.get("without")},
            "measured_speedup": round(measured, 4) if measured else None,
            "measured_tpot_speedup": (round(tpot["without"] / tpot["with_drafter"], 4)
                                      if tpot.get("without") and tpot.get("with_drafter") else None),
            "projected_speedup": projected,
            "measured_over_projected": round(measured / projected, 4) if measured and projected else None,
            "tau": tau, "t_decode_ms": a["step_ms"], "t_draft_ms": d["propose_ms"], "t_verify_ms": t_verify,
            "verify_steps": d["steps"], "decode_steps": a["steps"]}
        # The host's view: how often a steady step starts. CUDA events span a step on the GPU;
        # host work between two steps (scheduling, the drafts' bookkeeping) is outside them.
        p_d, p_a = step_period_ms(dflash_steps, c * (k + 1)), step_period_ms(alone_steps, c)
        out[str(c)].update({"dflash_period_ms": p_d, "decode_period_ms": p_a,
                            "projected_speedup_by_period": (round(tau * p_a / p_d, 4)
                                                            if tau and p_a and p_d else None)})
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
