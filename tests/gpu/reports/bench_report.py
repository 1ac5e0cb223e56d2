"""From the benchmark's per-engine records to bench.json and bench.md: step times, ratios, projection, breakdown.

Pure Python (no torch, no vLLM): the unit tests run it in CI on made-up
records. ``bench_steps.py`` (on the GPU) writes one record per engine run
(``run_record`` below says what a record holds) and calls ``build`` after
each finished run, so a command cut short still leaves a report of what ran.

How each number is obtained (and what is a projection)
------------------------------------------------------
Measured, per engine step, from CUDA events recorded on the runner's stream
at the entry and exit of ``GPUModelRunner.execute_model`` /
``sample_tokens`` (the whole step: input preparation, the target forward
from its CUDA graph, the LM head, sampling or rejection sampling, and the
drafter's ``propose``), of ``_model_forward`` (the target forward),
``model.compute_logits`` (LM head) and ``drafter.propose`` (the DFlash
step: its forward over the 16-token block and its logits). Events time the
GPU stream, so host gaps inside a step count and nothing is synchronised
mid-run. The median over the steady steps of one generate call (steps
whose forward has the expected token count; the first ``SKIP_STEPS``
dropped) is the step time.

* decode (no drafter): ``step`` at batch B, prompts of 64 tokens;
* verify: a DFlash engine's step minus its ``propose``. Random weights
  accept no drafts, so every step verifies 16 tokens per sequence (the
  records keep the generated-token count per step to show it);
* draft: ``propose``.
* wall: generate() wall time of a long minus a short run with the same
  prompts, divided by the extra steps: the engine's per-token cost seen by a
  caller (scheduler and output processing included).

Extrapolated to the released 30 layers (bench_shapes.py says why this is
fair): ``T30 = T_step + 4 * T_forward`` for decode and verify steps; the
drafter is measured at its full released depth and is not scaled.

Projected (not measured): the DFlash speed-up ``tau * T_decode30 /
(T_draft + T_verify30)`` for acceptance lengths tau = 2..8 and the
published ones (PR #41703 on a B200: 7.73 on HumanEval, 4.25 on MT-Bench).

Breakdown: kernel times from ``torch.profiler`` over 8 steady steps, those
launched inside the target forward (a ``bench::forward`` range around
``_model_forward``) classified by kernel name (attention, MoE, other), which
splits the measured forward time; the LM head and the drafter from their
events, the rest of the step (sampling, input preparation) by difference.
``coverage`` is the profiled kernel time per step over the measured forward
time, so a profile that missed kernels (e.g. inside CUDA graphs) shows as
low coverage rather than as a wrong split. Without range grouping, every
kernel of the step is classified (``kernel_scope`` "step").
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)

import bench_shapes as bs  # noqa: E402

SKIP_STEPS = 2
SCALE_TO_30 = bs.TARGET_TEXT["num_hidden_layers"] / bs.BENCH_LAYERS  # 5.0
TAUS = [2, 3, 4, 5, 6, 7, 8]
PUBLISHED_TAUS = {"humaneval": 7.73, "mt-bench": 4.25}
PUBLISHED_SOURCE = "vLLM PR #41703 (Gemma 4 26B-A4B + z-lab DFlash drafter, B200)"
FORMULA = "speedup(tau) = tau * T_decode30 / (T_draft + T_verify30)"

ATTENTION_KERNELS = re.compile(
    r"attention|attn|flash|fmha|reshape_and_cache|unified|paged|flex|triton_tem_fused", re.I)
MOE_KERNELS = re.compile(r"moe|expert|topk|top_k|routing|align_block|marlin_repack|count_and_sort", re.I)


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def steady_steps(phase: dict) -> list[dict]:
    """Steps of one phase whose target forward had the phase's token count, warm-up dropped."""
    want = phase.get("forward_tokens")
    steps = [s for s in phase.get("steps", []) if want is None or s.get("forward_tokens") == want]
    return steps[SKIP_STEPS:] if len(steps) > SKIP_STEPS + 2 else steps


def phase_ms(phase: dict) -> dict:
    """Median step components of one phase, and the wall-clock time per step."""
    steps = steady_steps(phase)
    out = {key: median([s[key] for s in steps if s.get(key) is not None])
           for key in ("step_ms", "forward_ms", "logits_ms", "propose_ms")}
    out["steps"] = len(steps)
    long_s, short_s = phase.get("wall_long_s"), phase.get("wall_short_s")
    extra = (phase.get("steps_long") or 0) - (phase.get("steps_short") or 0)
    out["wall_ms"] = round(1000 * (long_s - short_s) / extra, 4) if long_s and short_s and extra > 0 else None
    if phase.get("tokens_per_step") is not None:
        out["tokens_per_step"] = phase["tokens_per_step"]
    return out


def to_30_layers(step_ms: float | None, forward_ms: float | None) -> float | None:
    if step_ms is None or forward_ms is None:
        return None
    return round(step_ms + (SCALE_TO_30 - 1) * forward_ms, 4)


def decode_times(record: dict) -> dict:
    """batch -> measured components and the 30-layer decode step."""
    out = {}
    for b in bs.BATCHES:
        phase = record.get("phases", {}).get(f"decode-b{b}")
        if phase:
            m = phase_ms(phase)
            out[str(b)] = {"measured_6_layers": m, "decode_30": to_30_layers(m["step_ms"], m["forward_ms"])}
    return out


def verify_times(record: dict) -> dict:
    """batch -> measured components, the draft (propose) and the 30-layer verify step."""
    out = {}
    for b in bs.BATCHES:
        phase = record.get("phases", {}).get(f"verify-b{b}")
        if not phase:
            continue
        m = phase_ms(phase)
        verify6 = None if m["step_ms"] is None or m["propose_ms"] is None else m["step_ms"] - m["propose_ms"]
        out[str(b)] = {"measured_6_layers": m, "draft": m["propose_ms"],
                       "verify_6": None if verify6 is None else round(verify6, 4),
                       "verify_30": to_30_layers(verify6, m["forward_ms"])}
    return out


def drafter_key(run: bs.EngineRun) -> str:
    if run.drafter == "flash_attn":
        return f"flash_attn_fa{run.fa_version or 3}"
    return str(run.drafter)


def steps_ms(records: dict[str, dict]) -> dict:
    """dtype -> decode / verify / draft times from every finished engine run."""
    out: dict = {}
    for run in bs.RUNS:
        rec = records.get(run.name)
        if not rec or not rec.get("phases"):  # a run cut mid-way still gives its finished phases
            continue
        d = out.setdefault(run.target, {"decode": {}, "verify": {}, "draft": {}})
        if run.drafter is None and run.locked:
            d["decode"] = decode_times(rec)
        elif run.drafter is not None:
            v = verify_times(rec)
            d["draft"][drafter_key(run)] = {b: x["draft"] for b, x in v.items()}
            d["verify"].setdefault("by_engine", {})[run.name] = v
            if run.drafter == "flash_attn" and run.fa_version == 3:
                d["verify"].update({b: x["verify_30"] for b, x in v.items()})
    return out


def _draft_for(steps: dict, dtype: str, backend: str) -> tuple[dict, str]:
    """The drafter's step times for ``backend``: this dtype's engine, else the bf16 one
    (the drafter and the embedding/LM head it shares are bf16 in both targets)."""
    own = steps.get(dtype, {}).get("draft", {}).get(backend)
    if own:
        return own, dtype
    return steps.get("bf16", {}).get("draft", {}).get(backend, {}), "bf16"


def projected_speedup(tau: float, t_decode: float, t_draft: float, t_verify: float) -> float:
    """FORMULA: tau tokens a DFlash step (draft + verify) against one token a decode step."""
    return tau * t_decode / (t_draft + t_verify)


def ratios_and_projection(steps: dict) -> tuple[dict, dict]:
    ratios: dict = {}
    projection: dict = {"formula": FORMULA, "taus": TAUS, "published": {**PUBLISHED_TAUS, "source": PUBLISHED_SOURCE},
                        "layers": bs.TARGET_TEXT["num_hidden_layers"], "projected": True}
    backends = sorted({k for d in steps.values() for k in d.get("draft", {})})
    for dtype, d in steps.items():
        for backend in backends:
            draft, draft_from = _draft_for(steps, dtype, backend)
            for b in map(str, bs.BATCHES):
                t_dec = (d["decode"].get(b) or {}).get("decode_30")
                t_ver, t_dr = d["verify"].get(b), draft.get(b)
                if None in (t_dec, t_ver, t_dr):
                    continue
                ratios.setdefault(dtype, {}).setdefault(backend, {})[b] = {
                    "draft_over_verify": round(t_dr / t_ver, 4),
                    "verify_over_decode": round(t_ver / t_dec, 4),
                    "draft_from": draft_from,
                }
                row = {str(t): round(projected_speedup(t, t_dec, t_dr, t_ver), 3) for t in TAUS}
                row |= {name: round(projected_speedup(t, t_dec, t_dr, t_ver), 3) for name, t in PUBLISHED_TAUS.items()}
                projection.setdefault(dtype, {}).setdefault(backend, {})[b] = row
    return ratios, projection


def classify(kernel: str) -> str:
    if MOE_KERNELS.search(kernel):
        return "moe"
    if ATTENTION_KERNELS.search(kernel):
        return "attention"
    return "other"


def breakdown(records: dict[str, dict]) -> dict:
    """Per profiled phase: attention / MoE / other-forward / LM head / rest, measured and per 30 layers."""
    out = {}
    for run in bs.RUNS:
        rec = records.get(run.name) or {}
        for phase_name, prof in (rec.get("profile") or {}).items():
            phase = rec.get("phases", {}).get(phase_name)
            if not phase or not prof.get("steps"):
                continue
            m = phase_ms(phase)
            # Kernels inside the target forward when the profile could group them by range;
            # otherwise every kernel of the step (then a drafter's kernels are mixed in).
            forward = kernel_rows((prof.get("ranges") or {}).get("forward") or [])
            rows = forward or kernel_rows(prof.get("kernels", []))
            sums = {"attention": 0.0, "moe": 0.0, "other": 0.0}
            for name, total_us, _count in rows:
                sums[classify(name)] += total_us / 1000.0 / prof["steps"]
            res = _split(m, sums, prof, "forward" if forward else "step", drafter=run.drafter is not None)
            out[f"{run.name}/{phase_name}"] = res
    return out


def kernel_rows(rows: list) -> list:
    """Device rows that are kernels or copies: the profiler also lists its step markers
    (``ProfilerStep#N``) and our ``bench::`` ranges as device rows, each spanning many
    kernels, which would count those kernels twice."""
    return [r for r in rows if not (r[0].startswith("ProfilerStep") or r[0].startswith("bench::"))]


def _layer_split(sums: dict, fwd: float, scope: str) -> dict:
    """The target forward's time by kernel kind, at the benchmark's depth.

    Inside the forward range the kernels are the forward's, so its measured time
    is split by their mix. Over a whole step (no range grouping, e.g. kernels
    replayed from a CUDA graph) attention and MoE kernels still run only in the
    forward when there is no drafter, so their totals count as measured and the
    rest of the forward time is "other"."""
    kernels = sum(sums.values())
    if scope == "forward":
        return {k: fwd * v / kernels for k, v in sums.items()}
    return {"attention": sums["attention"], "moe": sums["moe"],
            "other": max(fwd - sums["attention"] - sums["moe"], 0.0)}


def _split(m: dict, sums: dict, prof: dict, scope: str, drafter: bool = False) -> dict:
    step, fwd, logits = m.get("step_ms"), m.get("forward_ms"), m.get("logits_ms") or 0.0
    draft = m.get("propose_ms") or 0.0
    kernels = sum(sums.values())
    against = fwd if scope == "forward" else step
    res: dict = {"kernel_scope": scope, "kernels_ms_per_step": {k: round(v, 4) for k, v in sums.items()},
                 "coverage": round(kernels / against, 3) if against else None,
                 "lm_head_ms": logits, "draft_ms": draft, "top_kernels": kernel_rows(prof.get("kernels", []))[:12]}
    if scope == "step" and drafter:
        # The drafter's attention and dense kernels would be counted as the target's.
        res["split"] = "none: kernels not grouped by range and a drafter ran in the same step"
        return res
    if step and fwd and kernels:
        # What lies outside the forward, LM head and drafter (sampler, input preparation) is "rest".
        layers = _layer_split(sums, fwd, scope)
        rest = max(step - fwd - logits - draft, 0.0)
        per30 = {"attention": layers["attention"] * SCALE_TO_30, "moe": layers["moe"] * SCALE_TO_30,
                 "other_forward": layers["other"] * SCALE_TO_30, "lm_head": logits, "drafter": draft,
                 "rest": rest}
        total = sum(per30.values())
        res["per_30_layers_ms"] = {k: round(v, 4) for k, v in per30.items()}
        res["per_30_layers_share"] = {k: round(v / total, 3) for k, v in per30.items()}
    return res


def per_layer_backend(records: dict[str, dict], lossless_fn) -> dict:
    """Decode at 2k/16k/64k, batch 1: the per-layer patch against the lock, same call, FA2."""
    locked, patched = records.get("bf16-decode-locked"), records.get("bf16-decode-per-layer")
    # decode_speedup: per-token wall time as a caller sees it; _gpu: the engine
    # step (CUDA events); _forward: the 6-layer model forward alone, where the
    # attention kernels are; _30: the engine step extrapolated to 30 layers like
    # every other step here. At batch 1 the 6-layer step is mostly host time, so
    # the forward and 30-layer ratios are the ones that say what the kernels do.
    out: dict = {"patch_id": bs.PER_LAYER_PATCH_ID, "decode_speedup": {}, "decode_speedup_gpu": {},
                 "decode_speedup_forward": {}, "decode_speedup_30": {},
                 "decode_ms": {}, "lossless": None, "goal": ">= 1.3x decode throughput at 16k, batch 1"}
    if not (locked and locked.get("phases") and patched and patched.get("phases")):
        out["missing"] = "both bf16-decode-locked and bf16-decode-per-layer must finish"
        return out
    base_runs, cand_runs = [], []
    for label in bs.CONTEXTS:
        lp, pp = (r["phases"].get(f"ctx-{label}") for r in (locked, patched))
        if not (lp and pp):
            continue
        lm, pm = phase_ms(lp), phase_ms(pp)
        out["decode_ms"][label] = {"locked": lm, "per_layer": pm}
        if lm["wall_ms"] and pm["wall_ms"]:
            out["decode_speedup"][label] = round(lm["wall_ms"] / pm["wall_ms"], 3)
        if lm["step_ms"] and pm["step_ms"]:
            out["decode_speedup_gpu"][label] = round(lm["step_ms"] / pm["step_ms"], 3)
        if lm["forward_ms"] and pm["forward_ms"]:
            out["decode_speedup_forward"][label] = round(lm["forward_ms"] / pm["forward_ms"], 3)
            l30, p30 = (to_30_layers(m["step_ms"], m["forward_ms"]) for m in (lm, pm))
            if l30 and p30:
                out["decode_speedup_30"][label] = round(l30 / p30, 3)
    for phase in [f"ctx-{label}" for label in bs.CONTEXTS] + ["lossless-short"]:
        lp, pp = (r["phases"].get(phase) or {} for r in (locked, patched))
        if lp.get("outputs") and pp.get("outputs"):
            base_runs += lp["outputs"]
            cand_runs += pp["outputs"]
    out["short_context_decode_ms"] = {"locked": decode_times(locked), "per_layer": decode_times(patched)}
    out["noise_floor"] = _noise_floor(locked, lossless_fn)
    out["backends"] = {"locked": locked.get("backend_summary"), "per_layer": patched.get("backend_summary")}
    if base_runs:
        verdict = lossless_fn({"ok": True, "outputs": base_runs}, {"ok": True, "outputs": cand_runs})
        out["lossless"] = verdict["lossless"]
        out["lossless_detail"] = verdict
    return out


def _noise_floor(record: dict, lossless_fn) -> dict | None:
    """The locked engine against itself: batched vs one prompt at a time."""
    batched = (record["phases"].get("lossless-short") or {}).get("outputs")
    alone = (record["phases"].get("lossless-short-alone") or {}).get("outputs")
    if not (batched and alone):
        return None
    return lossless_fn({"ok": True, "outputs": batched}, {"ok": True, "outputs": alone})


def build(records: dict[str, dict], meta: dict, lossless_fn) -> dict:
    """The bench.json document."""
    steps = steps_ms(records)
    ratios, projection = ratios_and_projection(steps)
    first = next((r for r in records.values() if r.get("vllm")), {})
    return {
        "ratios": ratios,
        "steps_ms": steps,
        "projection": projection,
        "per_layer_backend": per_layer_backend(records, lossless_fn),
        "device": meta.get("device") or first.get("device"),
        "vllm": first.get("vllm"),
        "breakdown": breakdown(records),
        "meta": meta,
        "shapes": {"sources": bs.SOURCES, "target_text": bs.TARGET_TEXT, "drafter": bs.DRAFTER,
                   "bench_layers": bs.BENCH_LAYERS, "drafter_taps": bs.drafter_taps(bs.BENCH_LAYERS)},
        "runs": {name: {k: v for k, v in rec.items() if k not in ("phases", "profile")}
                 for name, rec in records.items()},
    }


# ------------------------------------------------------------------ markdown


def _fmt(v, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def _series_md(doc: dict) -> str:
    """Whether the benchmark ran the current series of its release (issue 51)."""
    import series_now

    ran = (doc.get("meta") or {}).get("series_hash")
    state = series_now.staleness({"vllm": doc.get("vllm"), "series": ran})
    now = series_now.current_hash(doc.get("vllm")) if doc.get("vllm") else None
    mark = {"stale": "**stale**", "current": "current"}.get(state, state)
    return f"Series: {ran[:8] if ran else 'not recorded'} ({mark}; the current {doc.get('vllm')} series is {(now or '-')[:8]})."


def markdown(doc: dict) -> str:
    lines = [f"# Step-time benchmark ({doc.get('device')}, vLLM {doc.get('vllm')})", "",
             _series_md(doc), "",
             "Measured at 6 layers (5 sliding + 1 full), extrapolated to 30: "
             "`T30 = T_step + 4 * T_forward`. Speed-ups are projections.", ""]
    for dtype, d in doc["steps_ms"].items():
        lines += [f"## {dtype}", "", "| batch | decode30 ms | verify30 ms | " +
                  " | ".join(f"draft {k} ms" for k in sorted(d.get("draft", {}))) + " |",
                  "|---|---|---|" + "---|" * len(d.get("draft", {}))]
        for b in map(str, bs.BATCHES):
            dec = (d["decode"].get(b) or {}).get("decode_30")
            drafts = [_fmt(d["draft"][k].get(b)) for k in sorted(d.get("draft", {}))]
            lines.append(f"| {b} | {_fmt(dec)} | {_fmt(d['verify'].get(b))} | " + " | ".join(drafts) + " |")
        lines.append("")
    lines += _ratios_md(doc["ratios"])
    lines += _projection_md(doc["projection"], doc["ratios"]) + _per_layer_md(doc["per_layer_backend"])
    lines += _breakdown_md(doc["breakdown"])
    return "\n".join(lines) + "\n"


def _ratios_md(ratios: dict) -> list[str]:
    out = ["## Ratios (measured, 30-layer target steps)", "",
           "| target | drafter | batch | draft / verify | verify / decode | drafter step from |",
           "|---|---|---|---|---|---|"]
    for dtype, by_backend in ratios.items():
        for backend, by_batch in by_backend.items():
            for b, r in by_batch.items():
                out.append(f"| {dtype} | {backend} | {b} | {_fmt(r['draft_over_verify'], 3)} | "
                           f"{_fmt(r['verify_over_decode'], 3)} | {r['draft_from']} engine |")
    return out + ["", "The drafter is bf16 in both recipes; where no NVFP4 engine ran a drafter "
                  "backend, its step time comes from the bf16 engine.", ""]


def _projection_md(proj: dict, ratios: dict) -> list[str]:
    cols = [str(t) for t in TAUS] + list(PUBLISHED_TAUS)
    out = ["## Projected DFlash speed-up (not measured)", "", f"`{proj['formula']}`; "
           f"published acceptance: HumanEval {PUBLISHED_TAUS['humaneval']}, MT-Bench "
           f"{PUBLISHED_TAUS['mt-bench']} ({PUBLISHED_SOURCE}).", "",
           "| target | drafter (step from) | batch | " + " | ".join(
               f"τ={PUBLISHED_TAUS[c]} ({c})" if c in PUBLISHED_TAUS else f"τ={c}" for c in cols) + " |",
           "|---|---|---|" + "---|" * len(cols)]
    for dtype, by_backend in proj.items():
        if not isinstance(by_backend, dict) or dtype == "published":
            continue
        for backend, by_batch in by_backend.items():
            for b, row in by_batch.items():
                src = ((ratios.get(dtype) or {}).get(backend) or {}).get(b, {}).get("draft_from", dtype)
                out.append(f"| {dtype} | {backend} ({src}) | {b} | " + " | ".join(_fmt(row.get(c)) for c in cols) + " |")
    return out + [""]


def _per_layer_md(plb: dict) -> list[str]:
    out = [f"## Per-layer attention backend ({plb['patch_id']}), decode at batch 1", "",
           "| context | locked ms/token | per-layer ms/token | speed-up (wall) | speed-up (GPU step) "
           "| locked / per-layer forward ms (6 layers) | speed-up (forward) | speed-up (30 layers, extrapolated) |",
           "|---|---|---|---|---|---|---|---|"]
    for label, ms in plb.get("decode_ms", {}).items():
        out.append(f"| {label} | {_fmt(ms['locked']['wall_ms'], 3)} | {_fmt(ms['per_layer']['wall_ms'], 3)} | "
                   f"{_fmt(plb['decode_speedup'].get(label), 3)} | {_fmt(plb['decode_speedup_gpu'].get(label), 3)} | "
                   f"{_fmt(ms['locked']['forward_ms'], 3)} / {_fmt(ms['per_layer']['forward_ms'], 3)} | "
                   f"{_fmt(plb.get('decode_speedup_forward', {}).get(label), 3)} | "
                   f"{_fmt(plb.get('decode_speedup_30', {}).get(label), 3)} |")
    backends = plb.get("backends") or {}
    out += ["", f"Backends: locked {backends.get('locked')}; per-layer {backends.get('per_layer')}."]
    floor = plb.get("noise_floor") or {}
    return out + ["", f"Lossless against the lock (within bf16 ties): {plb.get('lossless')}; "
                  f"the locked engine against itself (batched vs alone): {floor.get('lossless')}", ""]


def _breakdown_md(bd: dict) -> list[str]:
    out = ["## Where the time goes (30-layer shares)", ""]
    for key, b in bd.items():
        share, ms = b.get("per_30_layers_share"), b.get("per_30_layers_ms") or {}
        if share:
            out.append(f"- {key} ({b['kernel_scope']} kernels, coverage {b['coverage']}): " +
                       ", ".join(f"{k} {_fmt(ms.get(k))} ms ({100 * v:.0f}%)" for k, v in share.items()))
        elif b.get("split"):
            out.append(f"- {key}: no split ({b['split'].removeprefix('none: ')})")
    return out + [""]


def rerender(doc: dict, records: dict[str, dict]) -> dict:
    """``doc`` with its breakdown recomputed from ``records`` (the engines' full records,
    which bench.json leaves out) and every other part kept: for a report whose code
    changed after the GPU run."""
    return {**doc, "breakdown": breakdown(records) or doc.get("breakdown", {})}


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    parser = argparse.ArgumentParser(description="re-render bench.md (and the breakdown) from bench.json")
    parser.add_argument("bench_json", type=Path)
    parser.add_argument("records", type=Path, nargs="*", help="run-*.json files of the same call(s)")
    args = parser.parse_args(argv)
    doc = json.loads(args.bench_json.read_text())
    records = {}
    for path in args.records:
        rec = json.loads(path.read_text())
        records[rec["run"]] = rec
    doc = rerender(doc, records)
    args.bench_json.write_text(json.dumps(doc, indent=1) + "\n")
    args.bench_json.with_suffix(".md").write_text(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
