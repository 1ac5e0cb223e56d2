"""Verdicts and the record of tests/gpu/runs/served.py (issue 26): results/served.json and .md.

Pure Python: it reads the raw phase files served.py leaves in its work folder
(``reference.json``, ``dflash.json``, ``stock.json``) and turns them into one row
per server, so a later command on the same host re-renders the record from
every phase run so far, and the CPU tests check the verdicts on made-up phases.

Lossless, as compare.py says it: a DFlash request's greedy tokens equal the
one-at-a-time reference's, or the first divergence sits on a reference tie (top-1
and top-2 raw logits at most one bf16 step apart, the DFlash token the runner-up).
The servers run ``--logprobs-mode raw_logits``, so the "logprobs" they return are the
logits themselves. A verdict needs a reference whose two passes agree, and outputs
worth comparing (gate.py).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # tests/gpu
sys.path.insert(0, str(HERE))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
sys.path.insert(1, str(HERE.parents[1]))  # the launcher (bench metrics)
import compare  # noqa: E402
import bars  # noqa: E402
import caveats  # noqa: E402
import gate  # noqa: E402
import headline  # noqa: E402
import series_now  # noqa: E402
import run_modes  # noqa: E402
import served_requests as sr  # noqa: E402

from launcher.bench import metrics  # noqa: E402

ACCEPTANCE_BAR = bars.get("acceptance", "served_min_mean_acceptance_length")  # issue 26, from bars.yaml
TOKEN_PREFIX = "token_id:"


# ------------------------------------------------------------------ outputs


def token_id(token: str) -> int:
    """A token as vLLM returns it with ``return_tokens_as_token_ids``: "token_id:123"."""
    if not isinstance(token, str) or not token.startswith(TOKEN_PREFIX):
        raise ValueError(f"not a token id: {token!r} (was return_tokens_as_token_ids honoured?)")
    return int(token[len(TOKEN_PREFIX):])


def _value(x) -> float:
    return float("nan") if x is None else float(x)


def output_record(content: list[dict]) -> dict:
    """``choices[0].logprobs.content`` (as dicts) -> token ids and, per position, the top
    entries [token, value, rank] compare.py and gate.py read (rank by value, best first)."""
    ids, top = [], []
    for pos in content:
        ids.append(token_id(pos["token"]))
        entries = {}
        for e in pos.get("top_logprobs") or []:
            entries.setdefault(token_id(e["token"]), _value(e.get("logprob")))
        order = sorted(entries.items(), key=lambda kv: -kv[1] if not math.isnan(kv[1]) else math.inf)
        top.append([[tok, val, rank] for rank, (tok, val) in enumerate(order, 1)])
    return {"token_ids": ids, "top": top}


# ------------------------------------------------------------------ verdicts


def by_id(outputs: list[dict]) -> dict[str, dict]:
    return {o["id"]: o for o in outputs}


def passes_agree(first: list[dict], second: list[dict]) -> dict:
    """Do the reference's two passes give the same tokens, request by request?"""
    a, b = by_id(first), by_id(second)
    differ = sorted(i for i in a if i in b and a[i].get("token_ids") != b[i].get("token_ids"))
    failed = sorted(i for i in set(a) | set(b) if (a.get(i) or {}).get("error") or (b.get(i) or {}).get("error"))
    return {"reproducible": not differ and not failed and set(a) == set(b), "differing": differ, "failed": failed}


def judge(reference: list[dict], outputs: list[dict]) -> dict:
    """One concurrency level's outputs against the reference's first pass."""
    ref = by_id(reference)
    divergences, errors, identical = [], [], 0
    for out in outputs:
        base = ref.get(out["id"])
        if out.get("error") or base is None or base.get("error"):
            errors.append({"id": out["id"], "error": out.get("error") or (base or {}).get("error")
                           or "no reference output"})
            continue
        d = compare.compare_prompt(0, base, out)
        if d is None:
            identical += 1
        else:
            d.pop("prompt", None)
            divergences.append({"id": out["id"], "kind": out.get("kind"), **d})
    return {"prompt_runs": len(outputs), "identical": identical, "divergences": divergences, "errors": errors,
            "lossless": not errors and all(d["tie"] for d in divergences)}


def lossless_by_kind(levels: dict[str, dict], kinds: dict[str, str]) -> dict[str, bool]:
    """Per request kind: no error and no divergence off a tie, at any level."""
    out = {kind: True for kind in sorted(set(kinds.values()))}
    for verdict in levels.values():
        for d in verdict["divergences"]:
            if not d["tie"]:
                out[kinds[d["id"]]] = False
        for e in verdict["errors"]:
            out[kinds.get(e["id"], "unknown")] = False
    return out


def images_change_output(outputs: list[dict], reqs: list[sr.Req]) -> dict:
    """The probe requests hold one prompt with each image: every pair must decode differently."""
    got = by_id(outputs)
    probes = [r.id for r in reqs if r.probe == "images"]
    if not probes:  # a text-only server was sent no image
        return {"value": None, "pairs": {}}
    pairs = {}
    for i, a in enumerate(probes):
        for b in probes[i + 1:]:
            ta, tb = (got.get(a) or {}).get("token_ids"), (got.get(b) or {}).get("token_ids")
            pairs[f"{a} vs {b}"] = None if ta is None or tb is None else ta != tb
    value = bool(pairs) and all(v is True for v in pairs.values())
    return {"value": value if all(v is not None for v in pairs.values()) else None, "pairs": pairs}


def acceptance(before: str | None, after: str | None) -> dict | None:
    """Acceptance over the window between two /metrics texts (launcher.bench.metrics)."""
    if before is None or after is None:
        return None
    return metrics.acceptance(metrics.parse(before), metrics.parse(after))


def chunk_boundary(req: sr.Req, out: dict | None, server_ids: list[int] | None, vision: sr.Vision,
                   log: dict) -> dict:
    """The straddling image: the arithmetic, the server's own tokenization of the prompt,
    the prompt length it reported, and whether vLLM forced whole multimodal inputs."""
    info = dict(req.notes)
    if server_ids:
        if vision.boi_id in server_ids:  # the server expanded the placeholder itself
            start = server_ids.index(vision.boi_id)
            end = server_ids.index(vision.eoi_id, start) + 1
        else:
            start = server_ids.index(vision.image_id)
            end = start + info.get("span", 0)
        info["server_image_start"], info["server_image_end"] = start, end
        info["server_agrees"] = (start, end) == (info.get("image_start"), info.get("image_end"))
        # the server's tokenization decides (the local one is the plan it was built with)
        info["straddles_local"], info["straddles"] = info.get("straddles"), sr.straddles(start, end, info["chunk"])
    if out is not None:
        info["prompt_tokens"] = out.get("prompt_tokens")
        info["cached_tokens"] = out.get("cached_tokens")
    info["disable_chunked_mm_input_forced"] = log.get("forced_whole_mm_input")
    # The scheduler keeps the span whole iff chunked mm input is off: vLLM then rolls the
    # first chunk back to the image's start (v1/core/sched/scheduler.py).
    info["span_kept_whole"] = bool(info.get("straddles") and log.get("forced_whole_mm_input")
                                   and out is not None and not out.get("error"))
    return info


def prefix_cache(reqs: list[sr.Req], outputs: list[dict], vision: sr.Vision, tokenize=None) -> dict:
    """The multi-turn request one at a time: how many prompt tokens came from the cache, and
    whether that covers its image (the first turn's image, cached by ``image-first``)."""
    out = by_id(outputs).get("multi-turn")
    if out is None:
        return {"cached_tokens": None}
    info = {"cached_tokens": out.get("cached_tokens"), "prompt_tokens": out.get("prompt_tokens")}
    req = next(r for r in reqs if r.id == "multi-turn")
    if tokenize is not None:
        (start, end), = sr.expanded_spans(tokenize(req.messages), [sr.IMAGES[i] for i in req.images], vision)
        info["image_span"] = [start, end]
        info["hit_covers_image"] = (out.get("cached_tokens") or 0) >= end
    return info


# ------------------------------------------------------------------ logs


def log_facts(text: str) -> dict:
    """What the server log says about the run: forced whole multimodal inputs, FA version,
    attention backends, the detected chat template format, the first root-cause error."""
    parsed = run_modes.parse_log(text)
    fa = sorted({ln.rsplit("version", 1)[1].strip() for ln in text.splitlines()
                 if "Using FlashAttention version" in ln})
    formats = sorted({ln.split("to be '", 1)[1].split("'", 1)[0] for ln in text.splitlines()
                      if "chat template content format to be '" in ln})
    launcher = [ln for ln in text.splitlines() if ln.startswith(("error: ", "hint: "))]
    return {"forced_whole_mm_input": "Forcing --disable_chunked_mm_input" in text,
            # the launcher's own refusal (a blocked preflight, a port in use), with its hint
            "launcher_error": " ".join(launcher[:2]) or None,
            "forced_triton": parsed["log_forced_triton"],
            "backends": sorted(set(parsed["log_backends_explicit"] + parsed["log_backends_auto"])),
            "flash_attn_versions": fa, "chat_template_content_format": formats,
            "error_line": parsed["log_error_line"]}


# ------------------------------------------------------------------ rows


def _numerics(plan: dict, argv: list[str] | None) -> str | None:
    if not argv:
        return None
    eager = any('"backend": "eager"' in a for a in argv)
    invariant = (plan.get("env") or {}).get("VLLM_BATCH_INVARIANT") == "1"
    return "exact" if eager and invariant else "default"


def _common(phase: dict) -> dict:
    plan = phase.get("plan") or {}
    return {
        "server": phase["server"], "vllm": phase.get("vllm"), "series": phase.get("series"),
        # bars.yaml's blob hash where the phase recorded it (records from before it have none)
        **({"bars": phase["bars"]} if phase.get("bars") else {}),
        # exact (batch-invariant, no inductor) or default; read off the server's environment and
        # argv in records from before the phase kept it
        "numerics": phase.get("numerics") or _numerics(plan, phase.get("argv")),
        "recipe": plan.get("recipe"), "profile": plan.get("profile"),
        "test_gpu": plan.get("test_gpu"),
        "started_by": phase.get("started_by"), "argv": phase.get("argv"),
        "env": {k: v for k, v in (plan.get("env") or {}).items()},
        "started": phase.get("started"), "ready_s": phase.get("ready_s"),
        "phase_error": phase.get("error"), "skipped": phase.get("skipped"),
        "preflight_blocking": [r["message"] for r in plan.get("reasons") or [] if r.get("blocking")],
        "log": phase.get("log_facts"),
    }


def reference_row(phase: dict) -> dict:
    reqs = [sr.Req(**d) for d in phase.get("requests") or []]
    passes = phase.get("passes") or []
    first = passes[0] if passes else []
    vision = sr.Vision(**phase["vision"]) if phase.get("vision") else sr.Vision()
    row = _common(phase)
    row.update({
        "requests": sr.counts(reqs), "concurrency": [1],
        "reproducible": passes_agree(*passes[:2]) if len(passes) >= 2 else None,
        "images_change_output": images_change_output(first, reqs)["value"] if first else None,
        "images_change_detail": images_change_output(first, reqs) if first else None,
        "nondegenerate": gate.nondegenerate([o for o in first if not o.get("error")]) if first else None,
        "lossless": None, "acceptance_length": None, "bench": None, "stock_error": None,
        "errors": [{"id": o["id"], "error": o["error"]} for o in first if o.get("error")],
    })
    chunk = next((r for r in reqs if r.kind == "image_at_chunk_boundary"), None)
    if chunk is not None:
        row["chunk_boundary"] = chunk_boundary(chunk, by_id(first).get(chunk.id), phase.get("server_tokenize"),
                                               vision, phase.get("log_facts") or {})
    return row


def dflash_row(phase: dict, reference: dict | None) -> dict:
    reqs = [sr.Req(**d) for d in phase.get("requests") or []]
    kinds = {r.id: r.kind for r in reqs}
    levels = phase.get("levels") or {}
    row = _common(phase)
    ref_passes = (reference or {}).get("passes") or []
    ref_first = ref_passes[0] if ref_passes else None
    reproducible = passes_agree(*ref_passes[:2]) if len(ref_passes) >= 2 else None
    verdicts = {c: judge(ref_first, outs) for c, outs in levels.items()} if ref_first else {}
    ref_gate = gate.nondegenerate([o for o in ref_first if not o.get("error")]) if ref_first else None
    own = [o for outs in levels.values() for o in outs if not o.get("error")]
    # every level serves the same requests: the size bar counts distinct requests, not outputs
    own_gate = gate.nondegenerate(own, [o.get("id", i) for i, o in enumerate(own)]) if own else None
    if not ref_first:
        lossless, why = None, "no reference phase"
    elif not (reproducible or {}).get("reproducible"):
        lossless, why = None, "reference not reproducible"
    else:
        lossless, why = all(v["lossless"] for v in verdicts.values()) if verdicts else None, None
    acc = acceptance(phase.get("metrics_before"), phase.get("metrics_after"))
    vision = sr.Vision(**phase["vision"]) if phase.get("vision") else sr.Vision()
    one = levels.get("1") or []
    row.update({
        "requests": sr.counts(reqs), "concurrency": [int(c) for c in levels],
        "images_change_output": images_change_output(ref_first, reqs)["value"] if ref_first else None,
        "images_change_output_dflash": images_change_output(one, reqs)["value"] if one else None,
        "lossless": lossless, "lossless_reason": why,
        "lossless_by_kind": lossless_by_kind(verdicts, kinds) if verdicts else None,
        "verdict": {c: {k: v[k] for k in ("prompt_runs", "identical", "lossless")}
                    | {"divergences": v["divergences"], "errors": v["errors"]} for c, v in verdicts.items()},
        "nondegenerate": {"reference": ref_gate, "dflash": own_gate,
                          "passes": gate.passes(ref_gate) and gate.passes(own_gate)},
        "acceptance_length": (acc or {}).get("mean_acceptance_length"),
        "acceptance": acc,
        "acceptance_above_bar": None if not acc or acc.get("mean_acceptance_length") is None
        else acc["mean_acceptance_length"] > ACCEPTANCE_BAR,
        "bench": phase.get("bench"), "bench_summary": phase.get("bench_summary"),
        "bench_skipped": None if phase.get("bench") else phase.get("bench_skipped"),
        "bench_command": phase.get("bench_command"),
        # set where the benchmark ran against a server of its own (the bench phase)
        "bench_started_by": phase.get("bench_started_by"), "bench_numerics": phase.get("bench_numerics"),
        "prefix_cache": phase.get("prefix_cache"),
        "tool": tool_check(one, reqs),
        "stock_error": None,
        "errors": [{"level": c, "id": o["id"], "error": o["error"]} for c, outs in levels.items()
                   for o in outs if o.get("error")],
    })
    chunk = next((r for r in reqs if r.kind == "image_at_chunk_boundary"), None)
    if chunk is not None:
        row["chunk_boundary"] = chunk_boundary(chunk, by_id(one).get(chunk.id), phase.get("server_tokenize"),
                                               vision, phase.get("log_facts") or {})
    return row


def tool_check(outputs: list[dict], reqs: list[sr.Req]) -> dict | None:
    """A small model calls no tool: the request must be accepted and answered without an error."""
    ids = [r.id for r in reqs if r.kind == "tool"]
    got = by_id(outputs)
    if not ids or ids[0] not in got:
        return None
    out = got[ids[0]]
    return {"accepted": not out.get("error"), "error": out.get("error"),
            "answered": bool(out.get("text_chars") or out.get("tool_calls")),
            "tool_calls": out.get("tool_calls"), "finish_reason": out.get("finish_reason")}


def stock_error(phase: dict) -> str | None:
    """The stock server's first error: the request's, or for a server that never became ready
    the log's root cause (the launcher's own refusal, else its exit code)."""
    if phase.get("started") or phase.get("stock_outcome") != "did not start":
        return phase.get("stock_error")
    facts = phase.get("log_facts") or {}
    found = facts.get("error_line") or facts.get("launcher_error")
    if found:
        return f"start-up: {found}"
    return phase.get("stock_error") or f"start-up: launcher exit {phase.get('exit_code')} before ready"


def stock_row(phase: dict) -> dict:
    row = _common(phase)
    row.update({
        "requests": phase.get("request_counts"), "concurrency": [1] if phase.get("first_image") else [],
        "images_change_output": None, "lossless": None, "nondegenerate": None, "acceptance_length": None,
        "bench": None,
        "stock_error": stock_error(phase),
        "stock_outcome": phase.get("stock_outcome"),
        "refused_without_force": phase.get("refused_without_force"),
        "first_image": phase.get("first_image"),
        "exit_code": phase.get("exit_code"),
    })
    return row


# The phases whose measurement each row is (a DFlash row reads the reference only to judge).
ROW_PHASES = {"reference": {"reference"}, "dflash": {"dflash", "bench"}, "stock": {"stock"},
              "speed": {"speed-dflash", "speed-reference"}}


def rows(phases: dict[str, dict]) -> list[dict]:
    """One row per server phase present, reference first."""
    out = []
    if "reference" in phases:
        out.append(reference_row(phases["reference"]))
    if "dflash" in phases:
        dflash = phases["dflash"]
        later = phases.get("bench") or {}
        if not dflash.get("bench") and later.get("bench"):
            # the benchmark ran in a command of its own, against the same server configuration
            dflash = {**dflash, **{k: later[k] for k in ("bench", "bench_summary", "bench_command") if k in later},
                      "bench_started_by": later.get("started_by"), "bench_numerics": later.get("numerics")}
        out.append(dflash_row(dflash, phases.get("reference")))
    if "stock" in phases:
        out.append(stock_row(phases["stock"]))
    if "speed-dflash" in phases:
        out.append(speed_row(phases["speed-dflash"], phases.get("speed-reference")))
    return out


def speed_row(dflash: dict, baseline: dict | None) -> dict:
    """Issue 25, item 5: `launcher bench` tok/s with the drafter and without it, per concurrency."""
    row = _common(dflash)
    row.update({
        "server": "speed", "concurrency": sorted({c["concurrency"] for c in dflash.get("bench_comparison") or []}),
        "lossless": None, "acceptance_length": None, "images_change_output": None,
        # the gate over both servers' outputs at concurrency 1 (served.speed_gate; None: a run
        # that did not record them, which the headline then leaves unjudged)
        "nondegenerate": dflash.get("speed_gate"),
        "stock_error": None, "bench": dflash.get("bench"), "bench_command": dflash.get("bench_command"),
        "baseline_bench": (baseline or {}).get("bench"), "baseline_started_by": (baseline or {}).get("started_by"),
        "bench_skipped": (dflash.get("speed_skipped") or (baseline or {}).get("bench_skipped")
                          or dflash.get("bench_skipped")),
        "speed": [_speed_entry(c, (dflash.get("speed_projection") or {}).get(str(c["concurrency"])))
                  for c in dflash.get("bench_comparison") or []],
        "step_counts": dflash.get("step_counts"),
    })
    return row


def _speed_entry(c: dict, projection: dict | None) -> dict:
    """One concurrency: `launcher bench`'s comparison, and where the servers timed their steps,
    bench_report's projection from those step times (speed.served_pair)."""
    entry = {"concurrency": c["concurrency"], "output_tok_s": c["output_tok_s"],
             "measured_speedup": c["speedup"], "mean_acceptance_length": c["mean_acceptance_length"],
             "tpot_ms_mean": c["tpot_ms_mean"], **({"requests": c["requests"]} if "requests" in c else {})}
    if projection:
        entry.update({k: projection.get(k) for k in (
            "measured_tpot_speedup", "projected_speedup", "measured_over_projected",
            "t_decode_ms", "t_verify_ms", "t_draft_ms", "verify_steps", "decode_steps",
            "decode_period_ms", "dflash_period_ms", "projected_speedup_by_period")})
    return entry


# ------------------------------------------------------------------ markdown


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, dict):
        return ", ".join(f"{k} {_cell(x)}" for k, x in v.items())
    if isinstance(v, list):
        sep = "; " if any(isinstance(x, str) and " " in x for x in v) else " "
        return sep.join(map(str, v)) or "-"
    return str(v)


def gate_failures(nd: dict | None) -> list[str]:
    """The gate (gate.py) over a row's block as it stands now, not the verdict stored with it: a
    reference row's block, or a DFlash row's pair (its reference's and its own)."""
    if isinstance(nd, dict) and "dflash" in nd:
        return ([f"reference: {w}" for w in gate.failures(nd.get("reference"))]
                + [f"dflash: {w}" for w in gate.failures(nd.get("dflash"))])
    return gate.failures(nd)


def _speed_key(row: dict) -> str | None:
    """The concurrency-1 speed-up beside its step-time projection, judged by bars.yaml's
    speed.max_projection_gap (issue 25, item 5; issue 51's re-established claim)."""
    one = next((s for s in row.get("speed") or [] if s.get("concurrency") == 1), None)
    if not one or one.get("measured_speedup") is None:
        return None
    ratio, gap = one.get("measured_over_projected"), bars.get("speed", "max_projection_gap")
    judged = "no projection" if ratio is None else \
        f"projected {one['projected_speedup']:.2f}x, within {gap:.0%}: {'yes' if abs(ratio - 1) <= gap else 'no'}"
    n = (one.get("requests") or {}).get("with_drafter")
    return (f"speed-up at 1 in flight {one['measured_speedup']:.2f}x{f' over {n} requests' if n else ''} ({judged}; "
            f"{_speed_gate_said(row.get('nondegenerate'))})")


def _speed_gate_said(nd: dict | None) -> str:
    """bars.yaml speed.outputs_pass_the_gate: the speed servers' own outputs through the gate."""
    said, why = gate.pair_outputs(nd)
    return {"not recorded": "outputs not recorded: not proof",
            "pass the gate": "outputs pass the gate"}.get(said, f"outputs fail the gate: {'; '.join(why)}")


def _headline(rows: list[dict]) -> list[str]:
    """One row per recipe and release: the series of its servers, whether their output passes
    the gate, and the drafter's acceptance length where a server measured one."""
    out = []
    for vllm, recipe in dict.fromkeys((r.get("vllm"), r.get("recipe")) for r in rows):
        mine = [r for r in rows if (r.get("vllm"), r.get("recipe")) == (vllm, recipe)]
        judged = [r for r in mine if isinstance(r.get("nondegenerate"), dict)]
        failing = sum(bool(gate_failures(r["nondegenerate"])) for r in judged)
        verdict = "not proof" if failing or not judged else "passes the gate"
        key = ", ".join([f"{r['server']} acceptance {r['acceptance_length']:.2f}" for r in mine
                         if isinstance(r.get("acceptance_length"), (int, float))]
                        + [_speed_key(r) for r in mine if r.get("server") == "speed" and _speed_key(r)]) or "-"
        out.append((f"{recipe}: {', '.join(r.get('server') or '?' for r in mine)}", vllm,
                    headline.series_cell(mine), f"{verdict} ({failing} of {len(judged)} fail the gate)", key))
    return headline.table(out)


def markdown(doc: dict) -> str:
    meta = doc.get("meta") or {}
    lines = [
        "# Served: `launcher serve` -> `vllm serve`, chat with images, `launcher bench` (issue 26)",
        "",
        *_headline(doc.get("servers") or []),
        "Regenerate: `make gpu-served` on a GPU host, and the speed rows `make gpu-speed` (tests/gpu/README.md, "
        "\"Commands\"). The last rows merged "
        f"came from `{meta.get('command', 'bash tests/gpu/remote.sh served')}`, "
        f"{meta.get('date', '')}, {meta.get('gpu', '')}. Target `{meta.get('model', '')}`, drafter "
        f"`{meta.get('drafter', '')}`. Greedy, {sr.MAX_TOKENS} new tokens, `ignore_eos`, top "
        f"{sr.TOP_LOGPROBS} raw logits; lossless = identical to the one-at-a-time reference or the first "
        "divergence on a reference tie (compare.py).",
        "",
        "| server | vLLM | recipe | series | series now | drafter | numerics | profile | ok | requests | concurrency "
        "| images change output | lossless | nondegenerate | acceptance length | bench | stock error |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = doc.get("servers") or []
    stale = sum(series_now.staleness(r) == "stale" for r in rows)
    failing = sum(bool(gate_failures(r.get("nondegenerate"))) for r in rows if r.get("nondegenerate"))
    lines[2:2] = [f"**{stale} of {len(rows)} rows are stale** (ran on a series other than the current one); "
                  f"**{failing} of {sum(bool(r.get('nondegenerate')) for r in rows)} rows with output fail the "
                  "gate and are not proof** (gate.py, bars.yaml).", ""]
    for r in rows:
        nd = r.get("nondegenerate")
        why = gate_failures(nd) if isinstance(nd, dict) else None
        nd_cell = None if why is None else "passes" if not why else "**not proof**: " + "; ".join(why)
        state = series_now.staleness(r)
        lines.append(
            f"| {r['server']} | {_cell(r.get('vllm'))} | {_cell(r.get('recipe'))} | {str(r.get('series') or '-')[:12]} "
            f"| {'**stale**' if state == 'stale' else state} "
            f"| {str(r.get('drafter_sha256') or '-')[:8]} | {_cell(r.get('numerics'))} | {_cell(r.get('profile'))} "
            f"| {_cell(r.get('started'))} | {_cell(r.get('requests'))} | {_cell(r.get('concurrency'))} "
            f"| {_cell(r.get('images_change_output'))} | {_cell(r.get('lossless'))} | {_cell(nd_cell)} "
            f"| {_cell(r.get('acceptance_length'))} | {_cell(r.get('bench'))} | {_cell(r.get('stock_error'))} |")
    for r in doc.get("servers") or []:
        lines += ["", f"## {r['server']}, vLLM {r.get('vllm')}, {r.get('recipe')}", "",
                  f"- started by: `{r.get('started_by')}`",
                  f"- argv: `{' '.join(r.get('argv') or [])}`"]
        if r.get("test_gpu"):
            lines.append(f"- test GPU: {r['test_gpu'].get('stands_in_for')} <- {r['test_gpu'].get('gpu')}: "
                         f"{_cell(r['test_gpu'].get('sets'))}")
        for key in ("phase_error", "skipped", "stock_outcome", "refused_without_force", "preflight_blocking", "bench_skipped", "bench_summary",
                    "bench_command", "bench_started_by", "bench_numerics", "baseline_started_by", "speed",
                    "reproducible", "lossless_reason", "lossless_by_kind", "nondegenerate",
                    "chunk_boundary", "prefix_cache", "tool", "acceptance", "images_change_detail", "first_image",
                    "log", "errors"):
            if r.get(key) not in (None, [], {}):
                lines.append(f"- {key}: {_cell(r[key])}")
        for level, v in (r.get("verdict") or {}).items():
            divs = v["divergences"]
            worst = max((d.get("gap") or 0 for d in divs), default=0)
            lines.append(f"- concurrency {level}: {v['identical']}/{v['prompt_runs']} identical, {len(divs)} "
                         f"divergent ({sum(d['tie'] for d in divs)} on ties, max gap {worst:.3g}), "
                         f"{len(v['errors'])} errors")
            for d in divs:
                if not d["tie"]:
                    lines.append(f"  - {d['id']} ({d.get('kind')}) position {d['position']}: "
                                 f"{d.get('reason', '')} (gap {_cell(d.get('gap'))}, bf16 step {_cell(d.get('bf16_step'))})")
    return caveats.with_caveats("\n".join(lines) + "\n")
