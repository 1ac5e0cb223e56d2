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

``python tests/gpu/judging/conformance.py --zlab Z.json --twin T.json --served S.json --out results/``
writes ``conformance.json`` and ``conformance.md`` for one vLLM release per served record.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # tests/gpu
sys.path.insert(0, str(HERE))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
import bars  # noqa: E402
import caveats  # noqa: E402
import gate  # noqa: E402
import headline  # noqa: E402

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


def zlab_prefix_steps_whole(acceptance_lengths: list[int], prefix: int) -> int:
    """The tokens of the same steps as ``zlab_prefix_steps``, the crossing step counted whole: how
    vLLM's spec-decode counters count a request stopped at ``max_tokens`` (its last verify step's
    accepted drafts are counted, also those past the stop)."""
    _, steps = zlab_prefix_steps(acceptance_lengths, prefix)
    return sum(acceptance_lengths[:steps])


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
    # Beside: the crossing step whole, and step for step (vLLM's drafts are its verify steps).
    row["zlab_tokens_whole_steps"] = zlab_prefix_steps_whole(z["acceptance_lengths"], prefix)
    # And both sides cut at the prefix: vLLM's output tokens after the prefill's (its request
    # stopped at the prefix) over its verify steps, as z-lab's are counted above.
    row["vllm_tokens_cut"] = max(0, min(prefix, len(served["token_ids"])) - 1)
    if steps and row["vllm_drafts"] is not None:
        row["same_steps"] = row["vllm_drafts"] == steps \
            and row["vllm_drafts"] + row["vllm_accepted"] == row["zlab_tokens_whole_steps"]
    return row


def pooled(rows: list[dict]) -> dict:
    """z-lab: prefix tokens over verify steps; vLLM: 1 + accepted over drafts; both over every
    prompt that has both (a prefix of one token has no verify step)."""
    both = [r for r in rows if r["zlab_steps"] and r["vllm_drafts"]]
    z_tokens, z_steps = sum(r["zlab_tokens"] for r in both), sum(r["zlab_steps"] for r in both)
    v_acc, v_drafts = sum(r["vllm_accepted"] for r in both), sum(r["vllm_drafts"] for r in both)
    z_whole = sum(r["zlab_tokens_whole_steps"] for r in both)
    v_cut = sum(r.get("vllm_tokens_cut", 0) for r in both)
    out = {"prompts": len(both), "zlab_steps": z_steps,
           "zlab_acceptance": round(z_tokens / z_steps, 4) if z_steps else None,
           "vllm_acceptance": round(1 + v_acc / v_drafts, 4) if v_drafts else None,
           "zlab_acceptance_whole_steps": round(z_whole / z_steps, 4) if z_steps else None,
           "prompts_same_steps": sum(1 for r in both if r.get("same_steps"))}
    if all("vllm_tokens_cut" in r for r in both):
        out["vllm_acceptance_cut"] = round(v_cut / v_drafts, 4) if v_drafts else None
    if out["zlab_acceptance"] and out["vllm_acceptance"]:
        out["gap"] = round(out["vllm_acceptance"] / out["zlab_acceptance"] - 1, 4)
        out["within"] = abs(out["gap"]) <= ACCEPTANCE_GAP
        out["gap_whole_steps"] = round(out["vllm_acceptance"] / out["zlab_acceptance_whole_steps"] - 1, 4)
        out["within_whole_steps"] = abs(out["gap_whole_steps"]) <= ACCEPTANCE_GAP
    if out.get("vllm_acceptance_cut") and out["zlab_acceptance"]:
        out["gap_cut_both"] = round(out["vllm_acceptance_cut"] / out["zlab_acceptance"] - 1, 4)
        out["within_cut_both"] = abs(out["gap_cut_both"]) <= ACCEPTANCE_GAP
    return out


def identical_rows(rows: list[dict] | None, twin_rows: list[dict]) -> dict:
    """Lossless, strict: how many of ``rows`` carry exactly the twin's tokens (an error or a
    missing row is not identical)."""
    rows = rows or []
    same = [bool(r) and "token_ids" in r and r["token_ids"] == t.get("token_ids") for r, t in zip(rows, twin_rows)]
    return {"identical": sum(same), "of": len(twin_rows), "holds": len(rows) == len(twin_rows) and all(same),
            "first_differing": next((i for i, ok in enumerate(same) if not ok), None)}


def window_binding(zlab: dict, served: dict, window: int | None) -> dict | None:
    """The share of z-lab's draft steps in which a sliding layer's window cuts off context: a
    block starting at position c (the last verified token, then B - 1 masks) spans c..c+B-1, a
    query at p sees keys after p - window, so position 0 falls out once c + B - 1 >= window.
    Each step moves c by its acceptance length (prompt lengths from the served record)."""
    lengths = [r.get("prompt_tokens") for r in served["rows"]]
    if not window or None in lengths:
        return None
    block, steps, binding = zlab["block_size"], 0, 0
    for n, z in zip(lengths, zlab["rows"]):
        c = n  # the first block starts with the prefill's token, at position n (z-lab's ``start``)
        for a in z["acceptance_lengths"]:
            steps += 1
            binding += c + block - 1 >= window
            c += a
    return {"window": window, "block_size": block, "steps": steps, "binding": binding,
            "share": round(binding / steps, 4) if steps else None}


def label(served: dict) -> str:
    return served.get("vllm") + (f" ({served['variant']})" if served.get("variant") else "")


def needs_prefix_run(prefix: int, zlab_tokens: list[int]) -> bool:
    """A prompt served again stopped at its prefix: one that ends inside z-lab's output (at the
    output's end the whole request is that run; a prefix of one token has no verify step)."""
    return 1 < prefix < len(zlab_tokens)


def prefix_runs(zlab_rows: list[dict], rows: list[dict], served_rows: list[dict]) -> dict:
    """How many prompts need a run stopped at their prefix (served.py's ``wanted``), and how many
    the served record holds."""
    need = [needs_prefix_run(r["prefix"], z["token_ids"]) for z, r in zip(zlab_rows, rows)]
    # a request skipped at the deadline leaves prefix_acceptance None: not made
    made = [n and bool(((s or {}).get("prefix_acceptance") or {}).get("drafts")) for n, s in zip(need, served_rows)]
    return {"needed": sum(need), "made": sum(made)}


def measured(v: dict) -> bool:
    """Every prefix run the verdict needs is in the record (records made before the count
    existed have no such field: theirs were)."""
    runs = v.get("prefix_runs") or {}
    return runs.get("made", 0) == runs.get("needed", 0)


def verdict(v: dict) -> str:
    """The release's verdict on the pooled prefix acceptance: holds, misses, or not measured
    (some prefix runs absent: never a pass, and never judged on the prompts that remain)."""
    if not measured(v):
        return "not measured"
    return "holds" if v["holds"] else "misses"


def judge(zlab: dict, twin: dict, served: dict, window: int | None = None) -> dict:
    """The conformance verdict of one served release against z-lab's record, beside the
    served drafter's lossless check against its own no-drafter twin."""
    for key in ("target_sha256", "drafter_sha256"):
        # records made before the served side named its models carry neither
        if served.get(key) and zlab.get(key) and served[key] != zlab[key]:
            raise ValueError(f"the served record ran {key} {served[key][:8]}, z-lab's record {zlab[key][:8]}")
    if len(served["rows"]) != len(zlab["rows"]):
        raise ValueError(f"the served record has {len(served['rows'])} prompts, z-lab's {len(zlab['rows'])}")
    bound = noise_bound(zlab["rows"], twin["rows"])
    rows = [compare_prompt(z, s, bound) for z, s in zip(zlab["rows"], served["rows"])]
    if served.get("prefixes") is not None and served["prefixes"] != [r["prefix"] for r in rows]:
        # the served run stopped its prompts at the prefixes of another noise bound (a bars file
        # changed in between): its prefix runs measured other prefixes than these
        raise ValueError("the served run's prefixes differ from the ones judged here "
                         f"(its noise bound {served.get('noise_bound')}, this one {round(bound, 5)})")
    pool = pooled(rows)
    runs = prefix_runs(zlab["rows"], rows, served["rows"])
    complete = runs["made"] == runs["needed"]  # else not measured: never a pass
    count = (bars.at(served.get("bars")).get("conformance") or {}).get("acceptance_count", "cut")
    twin_gate = gate.nondegenerate([{"token_ids": r.get("token_ids") or []} for r in twin["rows"]])
    twin_gate["passes"] = gate.passes(twin_gate)
    identical = sum(1 for r in rows if r["identical_over_prefix"])

    teeth = {"zlab_reproduces": zlab.get("passes_identical") is True,
             "zlab_gate_passes": (zlab.get("gate") or {}).get("passes") is True,
             "drafts_accepted_and_rejected": bool(zlab["acceptance"]["steps_none_accepted"])
             and any(a > 1 for r in zlab["rows"] for a in r["acceptance_lengths"])}

    def passes(within) -> bool:
        return identical == len(rows) and bool(within) and all(teeth.values()) \
            and len(rows) >= bars.get("gate", "min_prompts")

    return {
        "vllm": served.get("vllm"), "variant": served.get("variant"), "label": label(served),
        "series": served.get("series"), "twin_series": twin.get("series"),
        "numerics": served.get("numerics"), "noise_bound": round(bound, 5),
        "noise_percentile": bars.get("noise", "margin_move_percentile"),
        "prompts": len(rows), "identical_over_prefix": identical,
        "outputs_identical": identical == len(rows),
        "acceptance": pool, "teeth": teeth,
        # Prompts whose prefix ends inside the output, and of those the ones the server ran again
        # stopped there: none when it started without z-lab's record, and then the pooled prefix
        # acceptance was not measured (not a pass)
        "prefix_runs": runs,
        # Lossless, strict (bars.yaml lossless): the drafter's outputs against its own twin, one at
        # a time and with every prompt in flight; the twin's outputs through the gate.
        "lossless_one_at_a_time": identical_rows(served["rows"], twin["rows"]),
        "lossless_batched": identical_rows(served.get("batched_rows"), twin["rows"]),
        "twin_gate": twin_gate,
        "window_binding": window_binding(zlab, served, window),
        # The verdict counts as the bars file the served record was made under says: z-lab's
        # steps cut at the prefix (the first version), or its crossing step whole, as vLLM counts.
        "acceptance_count": count,
        "holds": complete and passes(pool.get(COUNT_KEYS[count][2])),
        # Beside the verdict, never in its place
        "holds_whole_steps": complete and passes(pool.get("within_whole_steps")),
        "rows": rows,
    }


def served_acceptance(served: dict) -> dict:
    """The served drafter's acceptance over whole requests (1 + accepted over drafts, every
    prompt once): what issue 50's item 5 compares across trees on the same prompts."""
    return pooled_requests([r.get("acceptance") or {} for r in served["rows"] if r])


def pooled_requests(acc: list[dict]) -> dict:
    """vLLM's per-request counters pooled: 1 + accepted over drafts, each request once."""
    drafts = sum(a.get("drafts") or 0 for a in acc)
    accepted = sum(a.get("accepted_tokens") or 0 for a in acc)
    return {"requests": sum(1 for a in acc if a.get("drafts")), "drafts": drafts, "accepted_tokens": accepted,
            "mean_acceptance_length": round(1 + accepted / drafts, 4) if drafts else None}


def whole_request_vs(releases: list[dict]) -> dict:
    """Every other row's whole-request acceptance against the newest release's (the base)."""
    bases = [r for r in releases if not r.get("variant")]
    if not bases:
        return {}
    base = max(bases, key=lambda r: tuple(int(x) for x in r["vllm"].split(".")))
    ref = base["served_acceptance"]["mean_acceptance_length"]
    rows = {}
    for r in releases:
        mine = r["served_acceptance"]["mean_acceptance_length"]
        if r is not base and ref and mine:
            gap = round(mine / ref - 1, 4)
            rows[r["label"]] = {"mean_acceptance_length": mine, "gap": gap, "within": abs(gap) <= ACCEPTANCE_GAP}
    return {"base": base["label"], "mean_acceptance_length": ref, "rows": rows}


def twins_reproduce(twins: list[dict]) -> dict:
    """The no-drafter twins of one vLLM release (one per served job) must answer alike: the
    reference reproduces. {vllm: identical prompts out of all}, over releases with two or more."""
    out = {}
    for v in sorted({t.get("vllm") for t in twins}):
        same = [t for t in twins if t.get("vllm") == v]
        if len(same) > 1:
            out[v] = identical_rows(same[1]["rows"], same[0]["rows"]) | {"twins": len(same)}
    return out


# Per count: the pooled keys of z-lab's acceptance, vLLM's gap to it, and whether that is within the bar
COUNT_KEYS = {"cut": ("zlab_acceptance", "gap", "within"),
              "whole_steps": ("zlab_acceptance_whole_steps", "gap_whole_steps", "within_whole_steps")}
# What each count compares, for a reader of a verdict made under it
COUNTS = {
    "cut": "z-lab's step that crosses the prefix end cut at it, against vLLM's counters, which count its "
           "last verify step whole: unlike counts",
    "whole_steps": "z-lab's step that crosses the prefix end counted whole, as vLLM's counters count its last "
                   "verify step",
}


def counted(release: dict) -> tuple:
    """(z-lab's pooled acceptance, vLLM's gap to it) as the release's verdict counts z-lab's steps."""
    zlab, gap, _ = COUNT_KEYS[release.get("acceptance_count", "cut")]
    return release["acceptance"].get(zlab), release["acceptance"].get(gap)


def _earlier_lines(earlier: list[tuple[str, dict]]) -> list[str]:
    """Earlier runs of this procedure, each with the verdict of the bars file it was made under:
    a miss stays on the page beside the newer run."""
    if not earlier:
        return []
    lines = ["", "## Earlier runs", "",
             "Each judged by the bars file its records were made under; a verdict there stands as it was.", "",
             "| record | target / drafter | vLLM | bars | count | z-lab acceptance | vLLM acceptance | gap | "
             "identical over prefix | holds |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, doc in earlier:
        for v in doc["releases"]:
            if v.get("variant"):
                continue
            zlab, gap = counted(v)
            lines.append(f"| {name} | {_pair(doc)} | {v['label']} | {(doc.get('bars') or '')[:8]} "
                         f"| {v.get('acceptance_count', 'cut')} "
                         f"| {zlab} | {v['acceptance'].get('vllm_acceptance')} | {gap} | "
                         f"{v['identical_over_prefix']}/{v['prompts']} | {_verdict_mark(v)} |")
    lines.append("")
    lines += [f"- {count}: {COUNTS[count]}." for count in sorted({v.get("acceptance_count", "cut")
                                                                   for _, d in earlier for v in d["releases"]})]
    return lines


def _pair(doc: dict) -> str:
    return f"{str(doc.get('target_sha256'))[:8]} / {str(doc.get('drafter_sha256'))[:8]}"


def _window_cell(w: dict | None) -> str:
    return "n/a" if not w else f"{w['binding']}/{w['steps']} steps ({w['share']}), window {w['window']}"


def _verdict_mark(v: dict) -> str:
    return _mark(v["holds"]) if measured(v) else "not measured"


def _mark(ok) -> str:
    return "**yes**" if ok else "**no**"


def _summary_lines(doc: dict) -> list[str]:
    lines = ["| vLLM | series | numerics | prompts | identical over prefix | z-lab acceptance (z-lab's steps counted "
             "as the verdict counts) | vLLM acceptance | gap | noise bound | teeth | holds |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for v in doc["releases"]:
        a = v["acceptance"]
        zlab, gap = counted(v)
        lines.append(f"| {v['label']} | {(v['series'] or '')[:8]} | {v.get('numerics')} | {v['prompts']} | "
                     f"{v['identical_over_prefix']}/{v['prompts']} | {zlab} ({v['acceptance_count']}) | "
                     f"{a.get('vllm_acceptance')} | {gap} | {v['noise_bound']} (p{v['noise_percentile']}) | "
                     f"{', '.join(k for k, ok in v['teeth'].items() if not ok) or 'all'} | {_verdict_mark(v)} |")
    lines += ["", "Beside the verdict, not in its place: z-lab's step that crosses the prefix end counted "
              "whole, as vLLM's spec-decode counters count a request stopped at max_tokens (they count every "
              "draft its last verify step accepted, also past the stop), and step for step: vLLM's drafts "
              "equal to z-lab's verify steps and its tokens to theirs.", "",
              "| vLLM | z-lab verify steps over the prefixes | z-lab acceptance, crossing step whole | "
              "vLLM acceptance | gap | prompts step for step equal | holds counted so |", "|---|---|---|---|---|---|---|"]
    for v in doc["releases"]:
        a = v["acceptance"]
        lines.append(f"| {v['label']} | {a.get('zlab_steps')} | {a.get('zlab_acceptance_whole_steps')} | "
                     f"{a.get('vllm_acceptance')} | {a.get('gap_whole_steps')} | "
                     f"{a.get('prompts_same_steps')}/{a.get('prompts')} | "
                     f"{_mark(v.get('holds_whole_steps')) if measured(v) else 'not measured'} |")
    if any("vllm_acceptance_cut" in v["acceptance"] for v in doc["releases"]):
        lines += ["", "And both sides cut at the prefix, as the issue words it (acceptance over the prefix): "
                  "vLLM's output tokens after the prefill's over its verify steps, z-lab's as in the verdict.", "",
                  "| vLLM | z-lab acceptance, cut | vLLM acceptance, cut | gap | within 5 % |", "|---|---|---|---|---|"]
        for v in doc["releases"]:
            a = v["acceptance"]
            lines.append(f"| {v['label']} | {a.get('zlab_acceptance')} | {a.get('vllm_acceptance_cut')} | "
                         f"{a.get('gap_cut_both')} | "
                         f"{_mark(a.get('within_cut_both')) if measured(v) else 'not measured'} |")
    lines += ["", "Lossless, strict: the drafter's outputs against the same server without a drafter "
              "(one prompt at a time), and the twin's outputs through the gate.", "",
              "| vLLM | one at a time | all in flight | twin gate (looping / constant / median distinct) | "
              "whole-request acceptance | window binds |", "|---|---|---|---|---|---|"]
    for v in doc["releases"]:
        one, many, g, w = v["lossless_one_at_a_time"], v["lossless_batched"], v["twin_gate"], v["window_binding"]
        lines.append(f"| {v['label']} | {one['identical']}/{one['of']} {_mark(one['holds'])} | "
                     f"{many['identical']}/{many['of']} {_mark(many['holds'])} | "
                     f"{g.get('looping_sequences')} / {g.get('constant_sequences')} / "
                     f"{g.get('median_distinct_fraction')} {_mark(g.get('passes'))} | "
                     f"{v['served_acceptance']['mean_acceptance_length']} | "
                     f"{_window_cell(w)} |")
    vs = doc.get("whole_request_vs") or {}
    if vs.get("rows"):
        lines += ["", f"Whole-request acceptance against vLLM {vs['base']}'s, the same prompts (issue 50, item 5: "
                      f"0.21.0 with the per-layer drafter attention within {ACCEPTANCE_GAP:.0%}):", ""]
        lines += [f"- {label}: {r['mean_acceptance_length']} ({r['gap']:+.2%}, within: {_mark(r['within'])})"
                  for label, r in vs["rows"].items()]
    for v, r in doc["twins_reproduce"].items():
        lines.append(f"\nThe no-drafter twins of {v} ({r['twins']}) agree on {r['identical']}/{r['of']} prompts.")
    return lines


def _headline(doc: dict) -> list[str]:
    """Per release: tokens over the prefixes, the pooled prefix acceptance as set before the run,
    lossless against its twin; a series less one patch: its whole-request acceptance."""
    rows, vs = [], (doc.get("whole_request_vs") or {}).get("rows") or {}
    for v in doc["releases"]:
        variant = (v.get("variant") or "").removeprefix("without ")
        cell = headline.series_cell([{"vllm": v["vllm"], "series": v["series"], **({"revert": variant} if variant else {})}])
        a, one, many = v["acceptance"], v["lossless_one_at_a_time"], v["lossless_batched"]
        if variant:
            w = vs.get(v["label"]) or {}
            rows.append(("whole-request acceptance vs the newest release", v["label"], cell, "measured beside",
                         f"{w.get('mean_acceptance_length')} ({w.get('gap', 0):+.1%})"))
            continue
        rows += [("tokens over the common prefixes", v["label"], cell,
                  "holds" if v["outputs_identical"] else "misses", f"{v['identical_over_prefix']}/{v['prompts']}"),
                 (f"pooled prefix acceptance (z-lab's steps {v['acceptance_count']})", v["label"], cell,
                  *_prefix_cells(v)),
                 ("lossless vs its own twin", v["label"], cell, "holds" if one["holds"] and many["holds"] else "misses",
                  f"{one['identical']}/{one['of']} alone, {many['identical']}/{many['of']} in flight")]
    for name, earlier in doc.get("earlier") or []:
        for v in earlier["releases"]:
            if not v.get("variant"):
                rows.append((f"pooled prefix acceptance, earlier run {name} ({v.get('acceptance_count', 'cut')} count)",
                             v["label"], headline.series_cell([{"vllm": v["vllm"], "series": v["series"]}]),
                             verdict(v), f"{v['acceptance'].get('vllm_acceptance')} vs {counted(v)[0]} (Earlier runs)"))
    return headline.table(rows)


def _prefix_cells(v: dict) -> tuple[str, str]:
    """The pooled prefix acceptance's verdict and key number; "not measured" where the served
    record holds no prefix run (a record made before the count existed has no such field)."""
    a = v["acceptance"]
    runs = v.get("prefix_runs") or {}
    if not measured(v):
        return "not measured", f"{runs['made']} of the {runs['needed']} prefix runs in the served record"
    return (verdict(v),
            f"{a.get('vllm_acceptance')} vs {counted(v)[0]}; both cut at the prefix "
            f"{a.get('vllm_acceptance_cut')} vs {a.get('zlab_acceptance')}")


def markdown(doc: dict) -> str:
    lines = ["# The served drafter against z-lab's loop (issue 50)", "", *_headline(doc),
             f"Target / drafter: {_pair(doc)}. Oracle: {doc['oracle']}. Deviation: {doc['deviation']}.", "",
             "Generated by `python tests/gpu/judging/conformance.py`; do not edit.", "",
             *([caveats.TORCH_0_33_0, ""] if any(v["vllm"] == "0.33.0" for v in doc["releases"]) else []),
             *_summary_lines(doc), *_earlier_lines(doc.get("earlier") or [])]
    for v in doc["releases"]:
        lines += ["", f"## vLLM {v['label']}: per prompt", "",
                  "| # | prefix | identical | first difference | z-lab | vLLM | gap |", "|---|---|---|---|---|---|---|"]
        for i, r in enumerate(v["rows"]):
            lines.append(f"| {i} | {r['prefix']} | {r['identical_over_prefix']} | {r['first_difference']} | "
                         f"{r['zlab_acceptance']} | {r['vllm_acceptance']} | {r.get('gap')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zlab", type=Path, required=True)
    parser.add_argument("--twin", type=Path, action="append", required=True,
                        help="the no-drafter server's record: once for every --served, or once per --served")
    parser.add_argument("--served", type=Path, action="append", required=True,
                        help="a served record with the drafter (one per vLLM release or series variant)")
    parser.add_argument("--earlier", type=Path, action="append", default=[],
                        help="an earlier run's conformance.json, listed with its own verdict")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if len(args.twin) not in (1, len(args.served)):
        parser.error(f"{len(args.twin)} --twin for {len(args.served)} --served: give one, or one per --served")
    zlab = json.loads(args.zlab.read_text())
    twins = [json.loads(p.read_text()) for p in args.twin]
    twins = twins * len(args.served) if len(twins) == 1 else twins
    releases, made_under = [], set()
    for twin, path in zip(twins, args.served):
        served = json.loads(path.read_text())
        made_under.add(served.get("bars") or bars.blob_hash())
        try:
            release = judge(zlab, twin, served, served.get("drafter_window"))
        except ValueError as exc:
            raise SystemExit(f"{path}: {exc}") from None
        release["served_acceptance"] = served_acceptance(served)
        releases.append(release)
    doc = {"oracle": zlab["oracle"], "deviation": zlab["deviation"], "target_sha256": zlab["target_sha256"],
           # the bars version the served records were made under (each release is judged by its own)
           "drafter_sha256": zlab["drafter_sha256"], "bars": made_under.pop() if len(made_under) == 1 else None,
           "twins_reproduce": twins_reproduce([json.loads(p.read_text()) for p in args.twin]),
           "releases": releases, "whole_request_vs": whole_request_vs(releases)}
    earlier = [(p.name, json.loads(p.read_text())) for p in args.earlier]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "conformance.json").write_text(json.dumps(doc, indent=1) + "\n")
    page = markdown(doc | {"earlier": earlier})
    (args.out / "conformance.md").write_text(page)
    print(page.split("\n## ")[0])
    # The verdict is the record's; the exit status says whether it was written. A series less one
    # patch is measured beside the releases, not judged (issue 50, item 5).
    judged = [v for v in releases if not v.get("variant")]
    print(f"holds: {sum(v['holds'] for v in judged)}/{len(judged)} releases"
          f" ({sum(not measured(v) for v in judged)} not measured)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
