"""From the full-size runs' records to ``fullsize.json`` and ``fullsize.md`` (issue 27). Pure Python.

Inputs, all optional but the shapes (a command cut short still reports what ran):

* ``fullsize-shapes.json`` (``make_fullsize_checkpoints.py``): parameters and shapes;
* ``roofline.json`` (``roofline.py``) and ``bandwidth.json`` (``copy_bandwidth.py``);
* the run records ``<label>.json`` of ``fullsize_serve.py`` in ``--runs``;
* the 6-layer step-time benchmark's ``bench.json`` (``--bench-json``).

What is measured and what is a projection:

* ``profiles``: per profile, the run with the recipe's drafter (the recipe as
  shipped) under the emulated card's memory; ``fits`` is issue 27's: started,
  every request of the ``max_num_seqs`` level successful, no preemption.
  Graph memory is what vLLM measured when it captured the graphs (the DEBUG
  line, else "Graph capturing finished ... took"), weights its "Model loading
  took", the activation peak the worker's DEBUG split.
* ``bench``: ``launcher bench`` (built-in client) per concurrency:
  ``no_drafter`` and ``dflash``. The drafter is random, so no draft is
  accepted: the ``dflash`` rows are DFlash's overhead, not its speed-up.
* ``roofline.achieved_fraction``: (bytes per decode token at batch 1) /
  (TPOT at concurrency 1 without the drafter) over the copy bandwidth
  measured on the same GPU. The server's TPOT includes its scheduling and
  output processing, so this is a lower bound on the kernels' efficiency.
* ``extrapolation_check``: full-depth TPOT against ``bench.json``'s 6-layer
  ``decode_30``. Different checkpoints (the 6-layer NVFP4 quantized every
  linear; NVIDIA's keeps attention and the dense MLP bf16) and different
  clocks (a server's TPOT vs the runner's step), so the ratio bounds the
  extrapolation, it does not validate it alone.
* ``projection``: labelled projections at the achieved fraction (``roofline.py``),
  beside the public anchors; with ``--acceptance``, DFlash at the trained
  drafter's measured acceptance length (issue 25's record named by
  ``--acceptance-run`` and ``--acceptance-drafter``): the full-size DFlash step
  measured with the random drafter (each step verifies 1 + 15 tokens and emits
  one) shared among that many tokens.
* ``profile_attempts``: the records in ``--attempts`` (earlier runs of a
  profile, before the recipe was corrected), each with the settings it ran.

A server log excerpt ``<label>.server-excerpt.log`` beside a record fills what
its ``log`` lacks (``memfit.parse_log``: the token budget, a cold or cached
torch.compile).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)

import bench_report  # noqa: E402
import headline  # noqa: E402
import memfit  # noqa: E402
import roofline  # noqa: E402
import series_now  # noqa: E402

TAUS = [2, 3, 4, 5, 6, 7, 8]
KNOBS = {
    "attention": "NVIDIA keeps attention bf16 (2.22 GB a token): an export that quantizes it (or FP8 attention "
                 "weights) reads a quarter to a half of that",
    "lm_head": "the bf16 tied LM head (1.48 GB a token; twice per DFlash step): an FP8/NVFP4 LM head",
    "dense_mlp": "the bf16 dense MLP (1.07 GB a token): quantized like the experts",
    "experts": "the MoE backend (Marlin here; CUTLASS/FlashInfer FP4 on sm_12x: --moe-backend) and the CUDA "
               "graph capture sizes that cover the batch (max_cudagraph_capture_size)",
    "kv_cache": "KV cache dtype (fp8 halves it) and the sliding window layers' share",
}


def _load(path: Path | None):
    if path is None or not Path(path).exists():
        return None
    return json.loads(Path(path).read_text())


def model_block(shapes: dict) -> dict:
    text = shapes["target_config"]["text_config"]
    vision = shapes["target_config"]["vision_config"]
    keep_text = ("num_hidden_layers", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_experts",
                 "top_k_experts", "num_attention_heads", "num_key_value_heads", "num_global_key_value_heads",
                 "head_dim", "global_head_dim", "vocab_size", "sliding_window", "max_position_embeddings")
    keep_vision = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "head_dim")
    drafter = shapes["drafter_config"]
    return {"params_total": shapes["params_total"], "params_text": shapes["params_text"],
            "params_vision": shapes["params_vision"], "params_active": shapes["params_active"],
            "shapes": {"text": {k: text[k] for k in keep_text}, "vision": {k: vision[k] for k in keep_vision},
                       "drafter": {k: drafter[k] for k in ("num_hidden_layers", "hidden_size", "intermediate_size",
                                                           "num_attention_heads", "num_key_value_heads",
                                                           "head_dim")}
                       | {"target_layer_ids": drafter["dflash_config"]["target_layer_ids"]}},
            "bytes_by_class": shapes["target"]["bytes_by_class"], "target_bytes": shapes["target"]["bytes"],
            "drafter_bytes": shapes["drafter"]["bytes"], "sources": shapes.get("sources")}


def profile_block(rec: dict) -> dict:
    log, derived, plan = rec.get("log") or {}, rec.get("derived") or {}, rec.get("plan") or {}
    graph = log.get("graph_actual_gib", log.get("graph_capture_gib"))
    delta = rec.get("metrics_delta") or {}
    return {"run": rec["label"], "profile": rec["profile"], "drafter": bool(rec.get("drafter")),
            "series": rec.get("series"),
            "extra_sets": rec.get("extra_sets") or [], "emulation": rec.get("emulation"),
            "memory_budget_gib": plan.get("memory_budget_gib"), "card_total_gib": plan.get("card_total_gib"),
            "scaled_fraction": plan.get("scaled_fraction"), "fits": rec.get("fits"), "why": rec.get("why"),
            "weights_gib": log.get("weights_gib"), "activation_peak_gib": log.get("activation_peak_gib"),
            "non_torch_gib": log.get("non_torch_gib"),
            "activation_and_non_torch_gib": derived.get("activation_and_non_torch_gib"),
            "graph_gib": graph, "graph_estimate_gib": log.get("graph_estimate_gib"),
            "kv_cache_gib": log.get("available_kv_gib"), "kv_cache_tokens": log.get("kv_cache_tokens"),
            "max_model_len": log.get("max_model_len", (rec.get("profile_settings") or {}).get("max_model_len")),
            "kv_tokens_per_max_model_len": derived.get("kv_tokens_per_max_model_len"),
            "estimated_max_model_len": log.get("estimated_max_len"),
            "preemptions": delta.get("preemptions") if delta else None,
            "peak_kv_cache_usage": (rec.get("metrics_peaks") or {}).get("kv_cache_usage_perc"),
            "peak_requests_running": (rec.get("metrics_peaks") or {}).get("requests_running"),
            "max_num_batched_tokens": log.get("max_num_batched_tokens"), "torch_compile": log.get("torch_compile"),
            "gpu_peak": rec.get("gpu_peak"), "start_s": rec.get("start_s")}


SETTINGS = ("max_model_len", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens")


def attempt_row(rec: dict) -> dict:
    """An earlier run of a profile: the settings it ran with and what came of them."""
    ran = {**(rec.get("log") or {}), **(rec.get("profile_settings") or {})}
    row = profile_block(rec)
    return {"run": row["run"], "record_file": rec.get("record_file"), "profile": rec["profile"],
            "series": row["series"], "device": (rec.get("blocker") or {}).get("device"),
            "settings": {k: ran.get(k) for k in SETTINGS}, "started": rec.get("started"),
            **{k: row[k] for k in ("fits", "why", "activation_peak_gib", "kv_cache_gib", "kv_cache_tokens",
                                   "estimated_max_model_len", "peak_requests_running", "peak_kv_cache_usage",
                                   "preemptions", "torch_compile")}}


def _is_fit(rec: dict) -> bool:
    """A fit-only run (``remote.sh fit``: label ``...-fit``, DEBUG memory split) as opposed to a speed run."""
    return str(rec.get("label", "")).endswith("-fit")


def _as_shipped(rec: dict) -> bool:
    """The recipe as shipped: no recipe field changed with ``--set`` (``remote.sh`` FIT_SETS)."""
    return not rec.get("extra_sets")


def bench_block(records: list[dict]) -> dict:
    out: dict = {}
    # Later wins: a speed run over a fit-only run; among them the recipe as shipped over changed fields.
    for rec in sorted(records, key=lambda r: (not _is_fit(r), _as_shipped(r))):
        if rec.get("profile") != "rtx5090" or not rec.get("bench"):
            continue
        key = "dflash" if rec.get("drafter") else "no_drafter"
        out[key] = {c: {k: row.get(k) for k in ("output_tok_s", "ttft_ms", "tpot_ms", "successful", "requests")}
                    for c, row in rec["bench"].items()}
        out.setdefault("runs", {})[key] = {"run": rec["label"], "extra_sets": rec.get("extra_sets") or []}
    if "dflash" in out:
        out["dflash_note"] = ("random drafter: no draft is accepted, so these rows are DFlash's overhead "
                              "(a 16-token verify and a draft per output token), not its speed-up")
    return out


def extrapolation_check(bench: dict, six_layer: dict | None, gpu: str | None) -> dict | None:
    if not six_layer or "no_drafter" not in bench:
        return None
    decode = ((six_layer.get("steps_ms") or {}).get("nvfp4") or {}).get("decode") or {}
    rows = {}
    for c, row in bench["no_drafter"].items():
        six = (decode.get(c) or {}).get("decode_30")
        if six and row.get("tpot_ms"):
            rows[c] = {"full_depth_tpot_ms": round(row["tpot_ms"], 3), "six_layer_decode_30_ms": six,
                       "ratio": round(row["tpot_ms"] / six, 3)}
    return {"rows": rows, "six_layer_device": six_layer.get("device"), "device": gpu,
            "same_device_kind": bool(gpu and six_layer.get("device") and
                                     gpu.split(",")[0] == six_layer["device"].split(",")[0]),
            "caveats": "different checkpoints (6-layer: every linear NVFP4; here NVIDIA's layout, attention and "
                       "dense MLP bf16) and different clocks (server TPOT vs the runner's step time)"}


def roofline_block(roof: dict | None, bandwidth: dict | None, bench: dict) -> dict | None:
    if not roof:
        return None
    out = {"context": roof["context"], "bytes_per_token": roof["bytes_per_token"],
           "decode_b1_terms": roof["decode_b1"], "decode_b16_bytes_per_token": roof["decode_b16_per_token"],
           "dflash_step_b1_terms": roof.get("dflash_step_b1"), "expected_experts": roof.get("expected_experts")}
    if bandwidth:
        out["bandwidth_gbps"] = bandwidth["copy_gbps"]
        out["read_gbps"] = bandwidth["read_gbps"]
    c1 = (bench.get("no_drafter") or {}).get("1") or {}
    if bandwidth and c1.get("tpot_ms"):
        out["tpot_c1_ms"] = c1["tpot_ms"]
        out["achieved_fraction"] = round(roofline.achieved_fraction(roof["bytes_per_token"], c1["tpot_ms"],
                                                                    bandwidth["copy_gbps"]), 4)
    terms = {k: v for k, v in roof["decode_b1"].items() if k != "total"}
    # Shares of bytes read (counted), not of profiled time: the full-size runs do not profile kernels.
    out["share_basis"] = "bytes read per step, counted from the checkpoint (not profiled time)"
    out["largest_share_b1"] = max(terms, key=terms.get)
    b16 = roof.get("decode_b16_terms")
    if b16:
        out["largest_share_b16"] = max((k for k in b16 if k != "total"), key=b16.get)
    return out


def projection_block(roof: dict | None) -> dict | None:
    if not roof or "achieved_fraction" not in roof:
        return None
    eff = roof["achieved_fraction"]
    out = {"label": "projection, not a measurement: tok/s = achieved_fraction x device bandwidth / bytes per token",
           "decode_c1": roofline.projections(roof["bytes_per_token"], eff), "anchors": roofline.ANCHORS}
    step = roof.get("dflash_step_b1_terms")
    if step:
        by_tau = {str(t): dflash_tok_s(step, t, eff) for t in TAUS}
        out["dflash_c1_by_acceptance"] = {name: {t: v[name] for t, v in by_tau.items()}
                                          for name in roofline.DEVICES_GBPS}
    return out


def dflash_tok_s(step: dict, tau: float, efficiency: float) -> dict[str, float]:
    """DFlash tok/s at batch 1 on each projected device, at acceptance ``tau`` and ``efficiency``."""
    return {name: round(roofline.dflash_projection(step, tau, bw, efficiency), 1)
            for name, bw in roofline.DEVICES_GBPS.items()}


def acceptance_projection(bench: dict, roof: dict | None, accepted: dict) -> dict | None:
    """DFlash at a measured acceptance length ``tau``: the full-size step (the random drafter's TPOT:
    one token a step) over ``tau`` tokens, per concurrency; and the bytes-read projection at ``tau``."""
    tau = accepted["mean_acceptance_length_vllm"]
    rows = {}
    for c, d in (bench.get("dflash") or {}).items():
        n = (bench.get("no_drafter") or {}).get(c) or {}
        if d.get("tpot_ms") and n.get("tpot_ms"):
            # The random drafter's TPOT is a whole DFlash step (draft + verify): bench_report's
            # formula with that step as one term.
            rows[c] = {"dflash_step_ms": round(d["tpot_ms"], 3), "no_drafter_tpot_ms": round(n["tpot_ms"], 3),
                       "projected_tpot_ms": round(d["tpot_ms"] / tau, 3),
                       "projected_speedup": round(bench_report.projected_speedup(tau, n["tpot_ms"], 0.0,
                                                                                 d["tpot_ms"]), 3)}
    if not rows:
        return None
    out = {"label": "projection, not a measurement: the trained small-width drafter's acceptance (issue 25) "
                    "applied to the full-size DFlash step measured with a random drafter",
           "acceptance_length": tau, "source": {k: accepted.get(k) for k in
                                                ("run", "vllm", "quantization", "drafter_sha256", "concurrency",
                                                 "mean_acceptance_length_reference")},
           "by_concurrency": rows}
    step = (roof or {}).get("dflash_step_b1_terms")
    if step and (roof or {}).get("achieved_fraction"):
        out["tok_s_c1_at_bandwidth"] = dflash_tok_s(step, tau, roof["achieved_fraction"])
    return out


def build(shapes: dict, *, records: list[dict], roof: dict | None, bandwidth: dict | None,
          six_layer: dict | None, gpu: str | None, attempts: list[dict] = (), accepted: dict | None = None) -> dict:
    bench = bench_block(records)
    profiles, without = {}, {}
    # Later wins: the recipe as shipped over changed fields; a fit-only run (DEBUG split) over a speed run.
    for rec in sorted(records, key=lambda r: (_as_shipped(r), _is_fit(r))):
        (profiles if rec.get("drafter") else without)[rec["profile"]] = profile_block(rec)
    roof_out = roofline_block(roof, bandwidth, bench)
    # Every run beside the chosen one: a start with a cold torch.compile cache has less KV cache.
    runs = {rec["label"]: profile_block(rec) for rec in sorted(records, key=lambda r: (r["profile"], r["label"]))}
    doc = {"model": model_block(shapes), "gpu": gpu, "profiles": profiles, "profiles_without_drafter": without,
           "profile_runs": runs,
           "bench": bench, "roofline": roof_out, "extrapolation_check": extrapolation_check(bench, six_layer, gpu),
           "projection": projection_block(roof_out)}
    at_acceptance = acceptance_projection(bench, roof_out, accepted) if accepted else None
    if at_acceptance:
        doc["projection"] = {**(doc["projection"] or {}), "dflash_at_measured_acceptance": at_acceptance}
    if attempts:
        doc["profile_attempts"] = [attempt_row(rec) for rec in attempts]
    if roof_out:
        doc["knobs"] = {"b1": KNOBS.get(roof_out["largest_share_b1"]),
                        "b16": KNOBS.get(roof_out.get("largest_share_b16", "experts"))}
    return doc


def _series_line(doc: dict) -> str:
    runs = [*(doc.get("profile_runs") or {}).values(), *(doc.get("profile_attempts") or [])]
    named = sorted({r["series"][:8] for r in runs if r.get("series")})
    missing = sum(1 for r in runs if not r.get("series"))
    line = ", ".join(named + ([f"not recorded in {missing} of {len(runs)}"] if missing else [])) or "-"
    # A run is current only on a hash of a series this checkout holds now; one without a series
    # cannot be shown current (issue 51).
    now = set(series_now.current_hashes().values())
    current = sum(1 for r in runs if r.get("series") in now)
    return f"{line}; **{current} of {len(runs)} on a current series**" if runs else line


def _f(v, fmt="{:.2f}"):
    return "-" if v is None else fmt.format(v)


def _headline(doc: dict) -> list[str]:
    """One row per profile run: the series it ran on, whether it fits, and its KV tokens."""
    rows = [(f"{p['profile']} memory fit: {p['run']}", "0.21.0",
             headline.series_cell([{"vllm": "0.21.0", "series": p.get("series")}]),
             "fits" if p.get("fits") else "does not fit",
             f"{p['kv_cache_tokens']:,} KV tokens" if p.get("kv_cache_tokens") else "-")
            for p in (doc.get("profile_runs") or {}).values()]
    return headline.table(rows)


def markdown(doc: dict) -> str:
    m = doc["model"]
    lines = ["# Full size: Gemma 4 26B-A4B (NVIDIA NVFP4 layout, random weights) on vLLM 0.21.0", "",
             *_headline(doc),
             f"GPU: {doc.get('gpu') or '-'}. Every serving number is an emulation on that GPU (Marlin NVFP4 on "
             "Hopper, not the sm_12x kernels).", "",
             f"Parameters: {m['params_total'] / 1e9:.2f} B ({m['params_text'] / 1e9:.2f} B text, "
             f"{m['params_vision'] / 1e9:.2f} B vision), {m['params_active'] / 1e9:.2f} B active per token; "
             f"target {m['target_bytes'] / 1e9:.2f} GB, drafter {m['drafter_bytes'] / 1e9:.2f} GB.", "",
             f"Series (the patched site's stamp, per run record): {_series_line(doc)}.", "",
             "## Memory fit", "",
             "| profile | run | budget GiB | fits | batched tokens | torch.compile | weights GiB | activation GiB | "
             "graphs GiB | KV GiB | KV tokens | KV tokens / max_model_len | peak KV use | preemptions | why |",
             "|" + "---|" * 15]
    for p in (doc.get("profile_runs") or {}).values():
        act = _f(p["activation_peak_gib"]) if p["activation_peak_gib"] is not None else \
            _f(p["activation_and_non_torch_gib"]) + " (with non-torch)"
        lines.append(f"| {p['profile']} | {p['run']} | {_f(p['memory_budget_gib'])} | {p['fits']} | "
                     f"{_f(p['max_num_batched_tokens'], '{:g}')} | {p['torch_compile'] or '-'} | "
                     f"{_f(p['weights_gib'])} | {act} | {_f(p['graph_gib'])} | "
                     f"{_f(p['kv_cache_gib'])} | {_f(p['kv_cache_tokens'], '{:,}')} | "
                     f"{_f(p['kv_tokens_per_max_model_len'], '{:.3f}')} | {_f(p['peak_kv_cache_usage'], '{:.0%}')} | "
                     f"{_f(p['preemptions'], '{:g}')} | {'; '.join(p['why'] or []) or '-'} |")
    lines += attempts_markdown(doc.get("profile_attempts") or [])
    lines += ["", "## Speed (rtx5090 profile, launcher bench, random 1024 in / 256 out)", "",
              "| drafter | concurrency | output tok/s | TTFT ms | TPOT ms | successful |", "|---|---|---|---|---|---|"]
    for key in ("no_drafter", "dflash"):
        for c, row in ((doc["bench"].get(key) or {}).items() if key in doc["bench"] else []):
            lines.append(f"| {key} | {c} | {_f(row['output_tok_s'], '{:.1f}')} | {_f(row['ttft_ms'], '{:.1f}')} | "
                         f"{_f(row['tpot_ms'])} | {row['successful']}/{row['requests']} |")
    if doc["bench"].get("dflash_note"):
        lines += ["", doc["bench"]["dflash_note"]]
    r = doc.get("roofline")
    if r:
        lines += ["", "## Roofline", "",
                  f"Bytes per decode token at batch 1, context {r['context']}: {r['bytes_per_token'] / 1e9:.3f} GB "
                  f"(largest: {r['largest_share_b1']}); at batch 16: {r['decode_b16_bytes_per_token'] / 1e9:.3f} GB "
                  f"a token. Copy bandwidth {_f(r.get('bandwidth_gbps'), '{:.0f}')} GB/s, read "
                  f"{_f(r.get('read_gbps'), '{:.0f}')} GB/s; achieved fraction at concurrency 1: "
                  f"{_f(r.get('achieved_fraction'), '{:.3f}')}."]
        knobs = doc.get("knobs") or {}
        lines += ["", f"Largest share ({r['share_basis']}) at batch 1: {r['largest_share_b1']}; what moves it: "
                  f"{knobs.get('b1') or '-'}.",
                  f"At batch 16: {r.get('largest_share_b16', '-')}; what moves it: {knobs.get('b16') or '-'}."]
    p = doc.get("projection")
    if p and p.get("decode_c1"):
        lines += ["", f"Projections ({p['label']}):", ""]
        for name, row in p["decode_c1"].items():
            lines.append(f"- {name}: {row['tok_s']} tok/s at {row['efficiency']:.1%} of {row['bandwidth_gbps']} GB/s "
                         f"(bound {row['tok_s_at_bandwidth_bound']})")
        lines += ["", "Anchors (published, concurrency 1): " + "; ".join(
            f"{a['device']} {a['what']}: {a.get('tok_s', a.get('tok_s_range'))} tok/s" for a in p["anchors"])]
    a = (p or {}).get("dflash_at_measured_acceptance")
    if a:
        lines += ["", f"DFlash at the measured acceptance length {a['acceptance_length']:.2f} ({a['label']}; "
                  f"source: {a['source']['run']}, vLLM {a['source']['vllm']}, drafter "
                  f"{(a['source']['drafter_sha256'] or '')[:8]}):", "",
                  "| concurrency | DFlash step ms | no-drafter TPOT ms | projected TPOT ms | projected speed-up |",
                  "|---|---|---|---|---|"]
        lines += [f"| {c} | {r['dflash_step_ms']} | {r['no_drafter_tpot_ms']} | {r['projected_tpot_ms']} | "
                  f"{r['projected_speedup']} |" for c, r in a["by_concurrency"].items()]
        if a.get("tok_s_c1_at_bandwidth"):
            lines += ["", "At concurrency 1 and the achieved fraction: " + "; ".join(
                f"{name} {v} tok/s" for name, v in a["tok_s_c1_at_bandwidth"].items()) + " (projection)."]
    x = doc.get("extrapolation_check")
    if x and x["rows"]:
        lines += ["", "## Full depth vs the 6-layer extrapolation", "", "| concurrency | full-depth TPOT ms | "
                  "6-layer decode_30 ms | ratio |", "|---|---|---|---|"]
        lines += [f"| {c} | {row['full_depth_tpot_ms']} | {row['six_layer_decode_30_ms']} | {row['ratio']} |"
                  for c, row in x["rows"].items()]
        lines += ["", f"Devices: {x['device']} / {x['six_layer_device']}. {x['caveats']}."]
    return "\n".join(lines) + "\n"


def attempts_markdown(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    out = ["", "### Earlier runs (before the profile was corrected)", "",
           "| profile | record | device | max_model_len | fraction | max_num_seqs | batched tokens | torch.compile | "
           "started | fits | activation GiB | KV GiB | KV tokens | estimated max len | peak running | preemptions | "
           "why |", "|" + "---|" * 17]
    for r in rows:
        st = r["settings"]
        out.append(f"| {r['profile']} | {r['record_file'] or r['run']} | {r['device'] or '-'} | "
                   f"{_f(st['max_model_len'], '{:g}')} | "
                   f"{_f(st['gpu_memory_utilization'], '{:g}')} | {_f(st['max_num_seqs'], '{:g}')} | "
                   f"{_f(st['max_num_batched_tokens'], '{:g}')} | {r['torch_compile'] or '-'} | {r['started']} | "
                   f"{r['fits']} | {_f(r['activation_peak_gib'])} | {_f(r['kv_cache_gib'])} | "
                   f"{_f(r['kv_cache_tokens'], '{:,}')} | {_f(r['estimated_max_model_len'], '{:,}')} | "
                   f"{_f(r['peak_requests_running'], '{:g}')} | {_f(r['preemptions'], '{:g}')} | "
                   f"{'; '.join(r['why'] or []) or '-'} |")
    return out


def load_records(folder: Path | None) -> list[dict]:
    """The run records in ``folder``; each record's ``log`` completed from its server excerpt."""
    records = []
    for path in sorted(folder.glob("*.json")) if folder and folder.is_dir() else []:
        rec = json.loads(path.read_text())
        if not (isinstance(rec, dict) and "label" in rec and "profile" in rec):
            continue
        # <label>.json and <label>.server-excerpt.log on the GPU host; an earlier run kept under another
        # name keeps the pair's stem.
        excerpt = path.with_name(f"{path.stem}.server-excerpt.log")
        rec.setdefault("record_file", path.name)
        if excerpt.is_file():
            parsed = memfit.parse_log(excerpt.read_text(errors="replace"))
            rec["log"] = {**{k: v for k, v in parsed.items() if k != "failures"}, **(rec.get("log") or {})}
        records.append(rec)
    return records


def accepted_record(path: Path, run: str, drafter: str) -> dict:
    """The acceptance record (``acceptance.json``) of ``run`` with a drafter hash starting ``drafter``:
    a row of its own, or a capture run joined to a row (``capture_run``), which takes the row's
    release, quantization and drafter."""
    rows = json.loads(path.read_text())
    joined = [{k: r.get(k) for k in ("vllm", "quantization", "drafter_sha256")} | r["capture_run"]
              for r in rows if r.get("capture_run")]
    found = [r for r in rows + joined
             if r.get("run") == run and str(r.get("drafter_sha256", "")).startswith(drafter)]
    if len(found) != 1:
        raise SystemExit(f"{path}: {len(found)} records of run {run!r} with drafter {drafter!r}, not one")
    return found[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=Path, required=True)
    parser.add_argument("--runs", type=Path, help="folder of fullsize_serve.py records")
    parser.add_argument("--roofline", type=Path)
    parser.add_argument("--bandwidth", type=Path)
    parser.add_argument("--bench-json", type=Path)
    parser.add_argument("--gpu")
    parser.add_argument("--gpu-file", type=Path, help="a file holding --gpu (remote.sh's gpu.txt)")
    parser.add_argument("--attempts", type=Path, help="folder of earlier runs' records (before a correction)")
    parser.add_argument("--acceptance", type=Path, help="acceptance.json (issue 25) for the DFlash projection")
    parser.add_argument("--acceptance-run", help="its record's run (with --acceptance)")
    parser.add_argument("--acceptance-drafter", default="", help="its drafter_sha256 prefix (with --acceptance)")
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--md", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.acceptance and not args.acceptance_run:
        parser.error("--acceptance needs --acceptance-run")
    if args.gpu_file:
        args.gpu = args.gpu_file.read_text().strip()
    accepted = (accepted_record(args.acceptance, args.acceptance_run, args.acceptance_drafter)
                if args.acceptance else None)
    doc = build(json.loads(args.shapes.read_text()), records=load_records(args.runs), roof=_load(args.roofline),
                bandwidth=_load(args.bandwidth), six_layer=_load(args.bench_json), gpu=args.gpu,
                attempts=load_records(args.attempts), accepted=accepted)
    args.json.write_text(json.dumps(doc, indent=1) + "\n")
    args.md.write_text(markdown(doc))
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
