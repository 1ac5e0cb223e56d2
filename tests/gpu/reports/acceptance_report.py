"""Issue 25's results file: results/acceptance.json and .md from realshape.json's trained-drafter records.

``python tests/gpu/reports/acceptance_report.py [--realshape results/realshape.json] [--out-dir results]``

One record per configuration (vLLM release, series, quantization, numerics) of the trained drafter's
DFlash runs:
vLLM's acceptance (its spec-decode counters) beside train_drafter.py's offline reference on the
same prompts and semantics, the draft equivalence of the capture run (draft_capture.py) and the
ablation rows of the capture runs on the series less one drafter-side patch, and the speed at this
width (speed.py: the trained-speed-* runs, DFlash against the target alone, beside bench_report's
projection at the measured acceptance and step times). Fields the runs have not measured yet stay
null and the markdown says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
import bars  # noqa: E402
import caveats  # noqa: E402
import gate  # noqa: E402
import series_now  # noqa: E402
import speed  # noqa: E402

HERE = Path(__file__).resolve().parents[1]  # tests/gpu
K = 15
# The issue's bars, from bars.yaml: vLLM's mean acceptance length at least 3 and within 10 % of
# the reference; draft equivalence for at least 99 % of at least 200 contexts.
MIN_ACCEPTANCE = bars.get("acceptance", "min_mean_acceptance_length")
MAX_RELATIVE_GAP = bars.get("acceptance", "max_relative_gap")
ISSUE_CONCURRENCY = (1, 8, 22)  # item 4's requests in flight
MIN_CONTEXTS = bars.get("equivalence", "min_contexts")
MIN_EQUAL_FRACTION = bars.get("equivalence", "min_equal_fraction")
# Speed: at concurrency 1 DFlash beats the target alone, and the measured speed-up is within
# 15 % of the projection.
MAX_PROJECTION_GAP = bars.get("speed", "max_projection_gap")


def _trained(records: list[dict]) -> list[dict]:
    # A run that loaded another tree's compiled target (realshape.stale_compile_artifacts) measured
    # that tree, not its own: no row, no ablation entry.
    return [r for r in records if r.get("drafter_kind") == "trained" and r.get("mode") == "dflash"
            and not r.get("stale_compile_artifacts")]


def _equivalence(rec: dict | None) -> dict | None:
    eq = (rec or {}).get("draft_equivalence")
    if not eq:
        return None
    contexts, equal = eq.get("contexts") or 0, eq.get("equal") or 0
    noise = eq.get("noise") or {}
    calibrated = noise.get("equal_or_within_noise_fraction")
    exact = eq.get("exact")
    beyond_p99 = noise.get("vllm_unequal_beyond_p99")
    return {"contexts": contexts, "equal": equal,
            # Strict first (issue 51): drafts identical to the reference's argmax, no tie allowed.
            "exact": exact,
            "holds_strict": None if exact is None else contexts >= MIN_CONTEXTS and exact >= MIN_EQUAL_FRACTION * contexts,
            # The bar as the issue asked it: equal, allowing for ties (compare.is_tie).
            "holds": contexts >= MIN_CONTEXTS and equal >= MIN_EQUAL_FRACTION * contexts,
            # Beside them, within the bf16 noise taken at its 99th percentile (bars.yaml's noise
            # procedure), not at its widest gap.
            "equal_or_within_noise_p99_fraction": None if beyond_p99 is None or not contexts
            else round((contexts - beyond_p99) / contexts, 4),
            # vLLM drafts in bf16, the reference in fp32: a differing draft within the gaps the
            # same weights show in bf16 is rounding (draft_capture.bf16_noise_verdict)
            "noise_bound": noise.get("noise_bound"),
            "unequal_beyond_noise": noise.get("vllm_unequal_beyond_noise"),
            # beside it, against the bulk of the noise (its 99th percentile) rather than its maximum
            "unequal_beyond_noise_p99": noise.get("vllm_unequal_beyond_p99"),
            "equal_or_within_noise_fraction": calibrated,
            "holds_within_noise": None if calibrated is None else
            contexts >= MIN_CONTEXTS and calibrated >= MIN_EQUAL_FRACTION,
            "features_min_cosine": (eq.get("features") or {}).get("min_cosine"),
            # equal drafts on the features vLLM fed say nothing of the features: a layer-offset
            # bug shows here (the captured stream against the Hugging Face target's at the same layers)
            "features_median_cosine": (eq.get("features") or {}).get("median_cosine")}


# What makes two records one configuration: a capture, ablation or speed run joins the rows of
# its release, quantization and numerics only (a -bi-noinductor row is not the default one),
# and of its series too except for an ablation run, whose tree is the series less one patch.
CONFIGURATION = ("vllm", "quantization", "batch_invariant", "compile_backend")


def _same_configuration(a: dict, b: dict, series: bool = True) -> bool:
    return all(a.get(k) == b.get(k) for k in CONFIGURATION + (("series",) if series else ()))


def _same_drafter(a: dict, b: dict) -> bool:
    """A capture or ablation joins the row of the drafter it ran: a retrained drafter's runs
    are rows of their own, and an ablation compares against its own drafter's baseline."""
    return a.get("drafter_sha256") == b.get("drafter_sha256")


def _speed(records: list[dict], rec: dict) -> dict:
    """The speed runs of ``rec``'s configuration, paired per concurrency."""
    def find(mode: str) -> dict | None:
        return next((r for r in records if r.get("speed") and r.get("mode") == mode and r.get("ok")
                     and _same_configuration(r, rec) and (mode != "dflash" or _same_drafter(r, rec))), None)

    dflash, alone = find("dflash"), find("reference-grouped")
    if not (dflash and alone):
        return {}
    return speed.pair(dflash["speed"], alone["speed"])


def _speed_bar(paired: dict) -> bool | None:
    return _speed_bar_at_one(paired.get("1"))


def _speed_bar_at_one(one: dict | None) -> bool | None:
    """At concurrency 1: DFlash beats the target alone, within 15 % of the projection."""
    if not one or one.get("measured_speedup") is None or one.get("projected_speedup") is None:
        return None
    return one["measured_speedup"] > 1 and abs(one["measured_over_projected"] - 1) <= MAX_PROJECTION_GAP


def _acceptance_bar(rec: dict) -> dict:
    """A run's acceptance beside its two references, and the bar (item 4)."""
    measured = _acceptance(rec)
    reference = (rec.get("acceptance_reference") or {}).get("mean_acceptance_length")
    gap = _gap(measured, reference)
    along = (rec.get("acceptance_along_output") or {}).get("mean_acceptance_length")
    along_gap = _gap(measured, along)
    # The bar's reference is the independent walk along the Hugging Face target's text, as the
    # issue set it (bars.yaml: acceptance.bar_reference). The walk along the run's own text
    # (walk_along.py) came later, after rows missed that bar: it stands beside it, never in its
    # place (issue 51).
    return {
        "mean_acceptance_length_vllm": measured, "mean_acceptance_length_reference": reference,
        # The model the offline walk ran: the bf16 target, or the NVFP4 one of the run's numerics.
        "reference_model": rec.get("acceptance_reference_model") or "bf16",
        "relative_gap": round(gap, 4) if gap is not None else None,
        "mean_acceptance_length_along_output": along,
        "relative_gap_along_output": round(along_gap, 4) if along_gap is not None else None,
        "acceptance_bar_reference": "reference",
        "acceptance_bar_met": (measured is not None and measured >= MIN_ACCEPTANCE
                               and gap is not None and gap <= MAX_RELATIVE_GAP),
        # beside it: the same bar against the walk along the run's own output (None where it did not run)
        "acceptance_bar_met_along_output": None if along_gap is None else
        (measured is not None and measured >= MIN_ACCEPTANCE and along_gap <= MAX_RELATIVE_GAP),
    }


def _capture_entry(capture: dict | None, rec: dict) -> dict | None:
    """The capture run that joined ``rec``'s row (its drafts gave the row's equivalence): a
    measurement of its own, at its own prompts and concurrency, so its acceptance is kept and
    judged beside the row's."""
    if capture is None or capture is rec:
        return None
    return {"run": capture["name"], "series": capture.get("series"), "concurrency": capture.get("concurrency"),
            **_acceptance_bar(capture)}


def _row(rec: dict, capture: dict | None, ablation: list[dict], paired: dict | None = None) -> dict:
    noise = rec.get("batch_noise") or {}
    return {
        "run": rec["name"], "vllm": rec.get("vllm"), "series": rec.get("series"),
        "quantization": rec.get("quantization"), "k": K,
        "target_sha256": rec.get("target_sha256"), "drafter_sha256": rec.get("drafter_sha256"),
        "concurrency": rec.get("concurrency"), "lossless": rec.get("lossless"),
        # identical prompt runs of the run's groups: the strict count beside the verdict with ties
        "verdict": rec.get("verdict"),
        # Default numerics are not batch invariant: realshape's calibrated verdict says whether
        # the divergences are the target's own batching noise (None where no noise run exists).
        "within_batch_noise": noise.get("within"),
        # the same with the bound at bars.yaml's percentile of the twin's moves (None where the
        # record predates it): the criterion done_when applies
        "within_batch_noise_p99": noise.get("within_p99"),
        # The noise run that verdict read (None where it had none), so undecided is told from unmeasured.
        "batch_noise_run": None if noise.get("reason") else noise.get("run"),
        **_acceptance_bar(rec),
        "capture_run": _capture_entry(capture, rec),
        "per_position": {"vllm": (rec.get("acceptance") or {}).get("per_position"),
                         "reference": (rec.get("acceptance_reference") or {}).get("per_position"),
                         "along_output": (rec.get("acceptance_along_output") or {}).get("per_position")},
        "draft_equivalence": _equivalence(capture),
        "ablation": [_ablation_entry(a, capture) for a in ablation],
        # Item 5, per concurrency of the speed runs (null where they have not run); the served
        # measurement replaces these where it joins (add_served_speed), the offline one stays in "speed".
        **_speed_fields("offline", paired or {}),
        "speed": paired or None,
        "speed_bar_met": _speed_bar(paired or {}),
        "batch_invariant": bool(rec.get("batch_invariant")),
        "served_speed": None,
        "served_speed_bar_met": None,
        # issue 51: the series it ran against the current one, and the gate over its own output
        # and its reference's as the record stored them (rejudge.md judges the raw tokens)
        "staleness": series_now.staleness(rec),
        "series_now": series_now.expected_hash(rec),
        **_gate_fields(rec),
    }


def _gate_fields(rec: dict) -> dict:
    why = gate.failures(rec.get("nondegenerate"))
    if rec.get("reference"):
        why += [f"reference: {w}" for w in gate.failures(rec.get("reference_nondegenerate"))]
    return {"gate_passes": not why, "gate_failures": why}


def _gap(measured: float | None, reference: float | None) -> float | None:
    return abs(measured - reference) / reference if measured and reference else None


def _ablation_entry(rec: dict, capture: dict | None) -> dict:
    """One reverted run, beside the acceptance of the capture run it reverts a patch of: that run
    has the ablation's prompts and concurrency, where the row's own run may have others (1, 8, 22)."""
    eq = _equivalence(rec) or {}
    return {"reverted": rec.get("revert"), "series": rec.get("series"),
            "draft_equivalence_equal": eq.get("equal"), "draft_equivalence_contexts": eq.get("contexts"),
            "features_median_cosine": eq.get("features_median_cosine"),
            "mean_acceptance_length_vllm": _acceptance(rec),
            "mean_acceptance_length_vllm_unreverted": _acceptance(capture) if capture else None}


def _acceptance(rec: dict) -> float | None:
    return (rec.get("acceptance") or {}).get("mean_acceptance_length")


def build(records: list[dict]) -> list[dict]:
    trained = [r for r in _trained(records) if not r.get("speed")]
    plain = [r for r in trained if not r.get("capture_drafts") and not r.get("revert")]
    # A capture run is a DFlash run of its own too: where no plain run shares its configuration
    # and series (it ran on a newer series than they did), it is the row.
    plain += [r for r in trained if r.get("capture_drafts") and not r.get("revert")
              and not any(_same_configuration(r, q) and _same_drafter(r, q) for q in plain)]
    rows = []
    for rec in plain:
        capture = next((r for r in trained if r.get("capture_drafts") and not r.get("revert")
                        and _same_configuration(r, rec) and _same_drafter(r, rec)), None)
        ablation = [r for r in trained if r.get("revert") and _same_configuration(r, rec, series=False)
                    and _same_drafter(r, rec)]
        rows.append(_row(rec, capture, ablation, _speed(records, rec)))
    return rows


# ------------------------------------------------------------ the headline (issue 51, item 3)

# The reference runs whose tokens the gate judges, per release: a prompt of the headline is
# looping where this run's greedy text of it loops (gate.looping).
HEADLINE_REFERENCE = {"0.21.0": "trained-ref-bf16", "0.33.0": "v33-trained-ref-bf16"}


def _per_prompt(steps: list[list[int]]) -> dict:
    """The acceptance of prompts each taken once: pooled over their verify steps (vLLM's
    definition, no prompt counted twice) and each prompt's own mean, as min / median / max."""
    import statistics

    own = [round(1 + sum(s) / len(s), 4) for s in steps if s]
    pooled = gate.acceptance_summary([f for s in steps for f in s], K)["mean_acceptance_length"]
    return {"prompts": len(own), "mean_acceptance_length": pooled,
            "per_prompt_min": min(own, default=None),
            "per_prompt_median": round(statistics.median(own), 4) if own else None,
            "per_prompt_max": max(own, default=None)}


def _reference_tokens(records: list[dict], vllm: str, target: str, index: list[dict]) -> tuple[dict | None, dict | None]:
    """The newest realshape.json record of the release's bf16 reference run on ``target`` and
    its raw record (rejudge.match: same run, the stored gate counts recomputed from its tokens)."""
    import rejudge

    name = HEADLINE_REFERENCE.get(vllm)
    recs = [r for r in records if r.get("name") == name and r.get("ok") and r.get("target_sha256") == target]
    if not recs:
        return None, None
    rec = recs[-1]
    raw, _ = rejudge.match(index, name, rec.get("nondegenerate"), rec)
    return rec, raw


def headline(records: list[dict], drafter_records: list[dict], index: list[dict]) -> list[dict]:
    """Issue 51, item 3: per drafter and release, every gated prompt once, unweighted.

    The only per-prompt acceptance the records hold is train_drafter.py's offline walk on the
    held-out prompts (``per_prompt_steps``, prompts.json's order, the order the reference runs
    serve them); vLLM's counters pool every request of a run, so its rows are concurrency mixes
    and stand beside this number, never choose it. The loop-free subset drops the prompts whose
    greedy text in the release's bf16 reference run loops (gate.looping on its raw tokens). The
    verdict is the gate's over that reference: a headline on a reference that fails the gate, or
    on a stale series, is not proof."""
    out = []
    seen = set()
    for dr in drafter_records:
        drafter, target = dr.get("drafter_sha256"), dr.get("target_sha256")
        ev = dr.get("evaluation") or {}
        for sem in sorted(k for k in ev if isinstance(ev.get(k), dict) and ev[k].get("per_prompt_steps")):
            vllm = sem.removeprefix("vllm-")
            if (drafter, vllm) in seen:
                continue
            seen.add((drafter, vllm))
            steps = ev[sem]["per_prompt_steps"]
            rec, raw = _reference_tokens(records, vllm, target, index)
            row = {"drafter_sha256": drafter, "target_sha256": target, "vllm": vllm,
                   "source": dr.get("_source"), "all_prompts": _per_prompt(steps),
                   "as_realshape_groups": (ev[sem].get("as_realshape_groups") or {}).get("mean_acceptance_length"),
                   "reference_run": rec.get("name") if rec else None,
                   "reference_series": rec.get("series") if rec else None,
                   "reference_raw": raw["source"] if raw else None}
            if raw is None or len(raw["tokens"]) != len(steps):
                why = "no raw reference tokens for these prompts" if raw is None else \
                    f"the reference has {len(raw['tokens'])} outputs for {len(steps)} prompts"
                row.update({"looping_prompts": None, "loop_free": None, "gate_passes": False,
                            "gate_failures": [why], "staleness": series_now.staleness(rec) if rec else None,
                            "proof": False})
            else:
                loops = [gate.looping(t) for t in raw["tokens"]]
                block = gate.nondegenerate([{"token_ids": t} for t in raw["tokens"]], raw["keys"])
                block["nan_positions"] = raw["block"]["nan_positions"]
                why = gate.failures(block)
                stale = series_now.staleness(rec)
                row.update({"looping_prompts": sum(loops),
                            "loop_free": _per_prompt([s for s, lp in zip(steps, loops) if not lp]),
                            "gate_passes": not why, "gate_failures": why, "staleness": stale,
                            "proof": not why and stale == "current"})
            out.append(row)
    return out


# The conformance run's folders inside its archive (remote.sh served-all, SERVED_JOBS
# conformance-twin,conformance): each gated prompt served alone by vLLM with the drafter, and by
# its no-drafter twin, exact numerics; z-lab's record names the target and drafter.
SERVED_FOLDERS = ("served", "served-v33")


def _per_request(accs: list[dict]) -> dict:
    """_per_prompt's figures from vLLM's per-request counters: pooled 1 + accepted / drafts over
    the requests, each request's own mean as min / median / max."""
    import statistics

    import conformance

    own = [round(a["mean_acceptance_length"], 4) for a in accs if a.get("drafts")]
    pooled = conformance.pooled_requests(accs)["mean_acceptance_length"]
    return {"prompts": len(own), "mean_acceptance_length": pooled,
            "per_prompt_min": min(own, default=None),
            "per_prompt_median": round(statistics.median(own), 4) if own else None,
            "per_prompt_max": max(own, default=None)}


def _in_repo(path: Path) -> str:
    """A path as the records name it: from the repository's root where it lies inside."""
    path = path.resolve()
    return str(path.relative_to(HERE.parent.parent)) if path.is_relative_to(HERE.parent.parent) else str(path)


def served_headline(archive: Path) -> list[dict]:
    """Issue 51, item 3, from vLLM's own counters: the conformance run serves every gated prompt
    once, alone, so each request's acceptance is one prompt's (no concurrency mix). Its reference
    is the same release's no-drafter twin, whose tokens the gate judges and whose looping prompts
    the loop-free subset drops; lossless makes the drafter's outputs those tokens. A request
    stopped at max_tokens counts its last verify step whole, as vLLM counts."""
    import tarfile

    out, shown = [], _in_repo(archive)
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        zlab = json.load(tar.extractfile("out/zlab-reference.json"))
        for folder in SERVED_FOLDERS:
            if f"{folder}/conformance.json" not in names:
                continue
            served = json.load(tar.extractfile(f"{folder}/conformance.json"))
            twin = json.load(tar.extractfile(f"{folder}/conformance-twin.json"))
            accs = [(r or {}).get("acceptance") or {} for r in served["rows"]]
            tokens = [(r or {}).get("token_ids") or [] for r in twin["rows"]]
            loops = [gate.looping(t) for t in tokens]
            why = gate.failures(gate.nondegenerate([{"token_ids": t} for t in tokens]))
            stale = series_now.staleness(served)
            out.append({"drafter_sha256": zlab.get("drafter_sha256"), "target_sha256": zlab.get("target_sha256"),
                        "vllm": served["vllm"], "source": f"{shown}!{folder}/conformance.json",
                        "measured_by": "vLLM's spec-decode counters, each prompt served alone",
                        "all_prompts": _per_request(accs), "as_realshape_groups": None,
                        "reference_run": twin.get("server"), "reference_series": twin.get("series"),
                        "reference_raw": f"{shown}!{folder}/conformance-twin.json",
                        "looping_prompts": sum(loops),
                        "loop_free": _per_request([a for a, lp in zip(accs, loops) if not lp]),
                        "gate_passes": not why, "gate_failures": why, "staleness": stale,
                        "proof": not why and stale == "current"})
    return out


def _headline_markdown(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    proof = sum(r["proof"] for r in rows)
    lines = ["## Headline: every gated prompt once, unweighted (issue 51)", "",
             f"**{proof} of {len(rows)} headline rows are proof.** " + (
                 "Every one of them rests on a reference that fails the current gate or ran on a "
                 "superseded series: they are not proof, and no acceptance claim stands on them until "
                 "the target meets the gate and the runs are repeated on the current series."
                 if not proof else "Those rest on references that pass the gate on the current series; "
                 "the others do not, and no claim stands on them."),
             "",
             "The acceptance of each held-out prompt taken once, pooled over the prompts' verify steps: "
             "vLLM's own counters where the reference is `conformance-twin` (the conformance run serves "
             "each gated prompt alone, so a request's counters are one prompt's), else train_drafter.py's "
             "offline walk; with "
             "the per-prompt minimum, median and maximum; beside it the loop-free prompts (those whose "
             "greedy text in the reference run does not loop, gate.looping). In the runs "
             "below vLLM's counters pool every request of a run: those rows are concurrency mixes (the first "
             "prompts count once per group), reported beside the headline and never used to choose it.",
             "",
             "| drafter | vLLM | reference (series) | series now | verdict | acceptance | loop-free acceptance |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        a, lf = r["all_prompts"], r["loop_free"]
        lines.append(
            f"| {str(r['drafter_sha256'])[:8]} | {r['vllm']} | {_cell(r['reference_run'])} "
            f"({str(r['reference_series'])[:8]}) | {_cell(r['staleness'])} | "
            f"{'proof' if r['proof'] else '**not proof**'} | {_cell(a['mean_acceptance_length'])} | "
            f"{_cell(lf and lf['mean_acceptance_length'])} |")
    lines += ["", "Per prompt, and why each row is not proof:", "",
              "| drafter | vLLM semantics | prompts | acceptance | per prompt min / median / max "
              "| loop-free prompts | loop-free acceptance | loop-free min / median / max "
              "| as the groups weight them | reference (series) | verdict |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]

    def mmm(a: dict | None) -> str:
        return "-" if not a else " / ".join(_cell(a[k]) for k in ("per_prompt_min", "per_prompt_median", "per_prompt_max"))

    for r in rows:
        a, lf = r["all_prompts"], r["loop_free"]
        why = ([] if r["gate_passes"] else r["gate_failures"]) + \
            ([f"series {r['staleness']}"] if r["staleness"] != "current" else [])
        lines.append(
            f"| {str(r['drafter_sha256'])[:8]} | {r['vllm']} | {a['prompts']} | {_cell(a['mean_acceptance_length'])} | "
            f"{mmm(a)} | {_cell(lf and lf['prompts'])} | {_cell(lf and lf['mean_acceptance_length'])} | {mmm(lf)} | "
            f"{_cell(r['as_realshape_groups'])} | {_cell(r['reference_run'])} ({str(r['reference_series'])[:8]}) | "
            f"{'proof' if r['proof'] else '**not proof**: ' + '; '.join(why)} |")
    return lines + [""]


def drafter_records(trained: Path) -> list[dict]:
    """The drafter train records under ``trained``, one per drafter (a rebuild's record is the
    same drafter's: the first by name is taken), each with its file as ``_source``."""
    out, seen = [], set()
    for path in sorted(trained.glob("drafter-train-record-*.json")):
        rec = json.loads(path.read_text())
        if rec.get("drafter_sha256") in seen:
            continue
        seen.add(rec.get("drafter_sha256"))
        out.append({**rec, "_source": str(path.relative_to(HERE.parent.parent))})
    return out


def drafter_side_patches() -> dict[str, set[str]]:
    """The patches each release's ablation reverts (realshape.DRAFTER_SIDE_PATCHES, which makes
    those runs): the issue asks for every one of them, each reverted on its own."""
    import realshape

    return {v: set(ids) for v, ids in realshape.DRAFTER_SIDE_PATCHES.items()}


def done_when(rows: list[dict]) -> list[dict]:
    """Issue 25's "Done when", per release and drafter (a retrained drafter's rows are judged on
    their own, never mixed with an earlier drafter's):
    every row's acceptance, and that of the capture run joined to it, at least 3 and within 10 %
    of its reference (bf16 and NVFP4 rows counted apart); the drafts of a capture run equal for
    99 % of at least 200 contexts (strictly or within the bf16 noise of the same weights); an
    ablation row for each drafter-side patch; output identical to the no-drafter reference in an
    exact-numerics row of each target, and no default-numerics divergence beyond the batching
    noise; and at concurrency 1 a DFlash win within 15 % of the projection, served (`launcher
    bench` against `vllm serve`; the offline engine's pair is reported beside it)."""
    expected = drafter_side_patches()
    out = []
    for vllm, drafter in sorted({(r["vllm"], r["drafter_sha256"]) for r in rows}, key=str):
        group = [r for r in rows if r["vllm"] == vllm and r["drafter_sha256"] == drafter]
        by_quant = {q: [r for r in group if (r["quantization"] == "bf16") == (q == "bf16")] for q in ("bf16", "nvfp4")}
        # A capture run that joined a row is a measurement too: its acceptance counts beside the row's.
        measured = {q: rs + [r["capture_run"] for r in rs if r.get("capture_run")] for q, rs in by_quant.items()}
        acceptance = {q: {"rows": sorted(r["run"] for r in rs),
                          "met": sorted(r["run"] for r in rs if r["acceptance_bar_met"])} for q, rs in measured.items()}
        equivalence = [r["draft_equivalence"] for r in group if r["draft_equivalence"]]
        recorded = {a["reverted"] for r in group for a in r["ablation"] if a["mean_acceptance_length_vllm"] is not None}
        # Item 4 measures "in bf16 and in NVFP4 ... at 1, 8 and 22 concurrent requests": a capture
        # run's 1, 8, 17 does not stand in for it, nor a bf16 row for an NVFP4 one.
        at_levels = {q: sorted(r["run"] for r in rs if set(ISSUE_CONCURRENCY) <= set(r.get("concurrency") or ()))
                     for q, rs in by_quant.items()}
        exact = {q: [r["lossless"] for r in rs if r["batch_invariant"]] for q, rs in by_quant.items()}
        served = [r["served_speed_bar_met"] for r in group if r["served_speed_bar_met"] is not None]
        offline = [r["speed_bar_met"] for r in group if r["speed_bar_met"] is not None]
        verdict = {
            "acceptance": bool(group) and all(len(a["met"]) == len(a["rows"]) for a in acceptance.values()),
            "concurrency": all(at_levels.values()),
            # "Output stays lossless": identical output is provable only where the target's numerics
            # are batch invariant, so each target needs such a row and every one identical; under
            # default numerics no divergence may lie beyond the target's own batching noise.
            # Every row: identical (with ties) or, under default numerics, within the noise bound
            # at its 99th percentile (bars.yaml); not decided is not a pass (issue 51).
            "lossless": all(v and all(x is True for x in v) for v in exact.values())
            and all(r["lossless"] is True or r["within_batch_noise_p99"] is True for r in group),
            # Every capture row holds the bar as asked (equal, allowing for ties); the noise-bound
            # figures stand beside it and do not replace it (issue 51: every row, not any).
            "draft_equivalence": bool(equivalence) and all(e["holds"] for e in equivalence),
            "ablation": expected.get(vllm, set()) <= recorded,
            # Item 5 measures through `launcher bench` against `vllm serve` now that serving has
            # landed: the offline engine's pair is shown beside it, and does not stand in for it.
            "speed": any(served),
            # issue 51: every row's output and reference pass the gate, and every row ran the
            # current series; a row that fails either is not proof of the claims above
            "gate": bool(group) and all(r["gate_passes"] for r in group),
            "current_series": bool(group) and all(r["staleness"] == "current" for r in group),
        }
        out.append({"vllm": vllm, "drafter_sha256": drafter, "series": sorted({str(r["series"]) for r in group}),
                    "acceptance": acceptance, "at_issue_concurrency": at_levels,
                    "exact_numerics_lossless": exact,
                    "draft_equivalence_contexts": max((e["contexts"] for e in equivalence), default=None),
                    "ablation_expected": sorted(expected.get(vllm, set())), "ablation_recorded": sorted(recorded),
                    "speed_served": any(served) if served else None,
                    "speed_offline": any(offline) if offline else None,
                    "met": verdict, "done": all(verdict.values())})
    return out


def _done_markdown(summary: list[dict]) -> list[str]:
    levels = "/".join(map(str, ISSUE_CONCURRENCY))
    lines = ["", "Done when (issue 25), per release and drafter: acceptance in every row (bf16 / NVFP4 rows met), "
             f"a bf16 and an NVFP4 row measured at {levels} in flight, "
             "lossless (exact-numerics rows of both targets identical to the reference, no default-numerics "
             "divergence beyond batching noise), "
             "draft equivalence in a capture run, an ablation row per drafter-side patch, the speed bar at "
             "concurrency 1 through `vllm serve` (the offline engine's pair beside it).", "",
             f"| vLLM | drafter | series | acceptance bf16 | acceptance NVFP4 | at {levels}: bf16 / NVFP4 rows "
             "| lossless, exact rows bf16 / NVFP4 | equivalence | ablation | speed served (offline) | gate "
             "| current series | done |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def mark(ok: bool | None) -> str:
        return "not measured" if ok is None else "met" if ok else "not met"

    for d in summary:
        acc, exact = d["acceptance"], d["exact_numerics_lossless"]
        missing = sorted(set(d["ablation_expected"]) - set(d["ablation_recorded"]))
        lines.append(
            f"| {d['vllm']} | {str(d['drafter_sha256'])[:8]} | {', '.join(s[:8] for s in d['series'])} | "
            f"{len(acc['bf16']['met'])}/{len(acc['bf16']['rows'])} | {len(acc['nvfp4']['met'])}/{len(acc['nvfp4']['rows'])} | "
            f"{len(d['at_issue_concurrency']['bf16'])} / {len(d['at_issue_concurrency']['nvfp4'])} | "
            f"{mark(d['met']['lossless'])} ({sum(x is True for x in exact['bf16'])}/{len(exact['bf16'])} / "
            f"{sum(x is True for x in exact['nvfp4'])}/{len(exact['nvfp4'])}) | "
            f"{mark(d['met']['draft_equivalence'])} ({_cell(d['draft_equivalence_contexts'])} contexts) | "
            f"{mark(d['met']['ablation'])}{' (missing: ' + ', '.join(missing) + ')' if missing else ''} | "
            f"{mark(d['speed_served'])} ({mark(d['speed_offline'])}) | "
            f"{mark(d['met']['gate'])} | {mark(d['met']['current_series'])} | "
            f"{'**done**' if d['done'] else 'no'} |")
    return lines


def add_served_speed(rows: list[dict], served: dict) -> None:
    """The served speed rows (served.py's speed phase: `launcher bench` against `vllm serve`,
    bf16 target, default numerics) into the rows of their release with those numerics, as
    ``served_speed``: item 5's measurement through the server, beside the offline one."""
    for srow in (r for r in served.get("servers") or [] if r.get("server") == "speed" and r.get("speed")):
        for row in rows:
            # rows written before served rows named their drafter join on the release alone
            if (row["vllm"] == srow.get("vllm") and row["quantization"] == "bf16"
                    and not row.get("batch_invariant")
                    and srow.get("drafter_sha256") in (None, row["drafter_sha256"])):
                outputs = gate.pair_outputs(srow.get("nondegenerate"))[0]
                row["served_speed"] = {"series": srow.get("series"), "bench": srow.get("bench"),
                                       "drafter_sha256": srow.get("drafter_sha256"),
                                       "per_concurrency": srow["speed"], "outputs": outputs}
                row.update(_speed_fields("served", _served_paired(srow["speed"])))
                # Item 5's bar through the server, where its engine cores timed their steps, over
                # output that passes the gate (bars.yaml speed.outputs_pass_the_gate)
                met = _speed_bar_at_one(next((c for c in srow["speed"] if c.get("concurrency") == 1), None))
                row["served_speed_bar_met"] = None if met is None else met and outputs == "pass the gate"


def _bar_cell(bar: bool | None, outputs: str | None) -> str:
    if bar is None:
        return "-"
    if bar:
        return "met"
    return "not met" if outputs in (None, "pass the gate") else f"not met (outputs {outputs})"


def _speed_fields(source: str, paired: dict) -> dict:
    """The issue's record fields (tok_s {dflash, no_drafter}, measured and projected speed-up,
    concurrency) from a pair per concurrency (speed.pair's shape), null where none ran."""
    if not paired:
        return {"speed_source": None, "speed_concurrency": None, "tok_s": None,
                "measured_speedup": None, "projected_speedup": None}
    return {"speed_source": source, "speed_concurrency": [int(c) for c in paired],
            "tok_s": {c: p["tok_s"] for c, p in paired.items()},
            "measured_speedup": {c: p.get("measured_speedup") for c, p in paired.items()},
            "projected_speedup": {c: p.get("projected_speedup") for c, p in paired.items()}}


def _served_paired(per_concurrency: list[dict]) -> dict:
    """served.json's speed entries in speed.pair's shape: item 5 measures through `vllm serve`
    once serving has landed, so these replace the offline pair's fields where they join."""
    return {str(c["concurrency"]): {"tok_s": {"dflash": c["output_tok_s"].get("with_drafter"),
                                              "no_drafter": c["output_tok_s"].get("without")},
                                    "measured_speedup": c.get("measured_speedup"),
                                    "projected_speedup": c.get("projected_speedup")} for c in per_concurrency}


def _cell(value) -> str:
    return "-" if value is None else str(value)


def _speed_cell(paired: dict | None) -> str:
    if not paired:
        return "-"
    return "; ".join(f"{c}: {_cell(p['tok_s']['dflash'])} / {_cell(p['tok_s']['no_drafter'])}, "
                     f"{_cell(p['measured_speedup'])} / {_cell(p['projected_speedup'])}" for c, p in paired.items())


def markdown(rows: list[dict], headline_rows: list[dict] | None = None) -> str:
    stale = sum(r["staleness"] == "stale" for r in rows)
    failing = sum(not r["gate_passes"] for r in rows)
    lines = [
        "# Trained DFlash drafter: acceptance, draft equivalence, ablation (issue 25)",
        "",
        f"**{stale} of {len(rows)} rows are stale** (ran on a series other than the current one: "
        + ", ".join(f"{v} {h[:8]}" for v, h in sorted({(r['vllm'], r['series_now']) for r in rows
                                                          if r['series_now']})) + "). "
        f"**{failing} of {len(rows)} rows fail the gate and are not proof** (gate.py, bars.yaml; "
        "`rejudge.md` judges their raw tokens).",
        "",
        *_headline_markdown(headline_rows or []),
        "## Every run (concurrency mixes)",
        "",
        "Regenerate: `make gpu-acceptance` on a GPU host: the runs, every merge and this report "
        "(tests/gpu/README.md, \"Commands\"). Acceptance length = 1 + accepted drafts per "
        f"verify step, from vLLM's counters; the reference is train_drafter.py's offline walk on the same prompts, "
        "on the bf16 target, or on the NVFP4 target of the run's numerics where nvfp4_reference.py ran (in brackets), "
        "along that target's own greedy text; \"along its output\" is the same walk along the text the run wrote "
        "(walk_along.py, the target's features of that text): other numerics write another text, and the walk "
        "along it takes that out of the gap. "
        f"Bars (bars.yaml): at least {MIN_ACCEPTANCE} and within {MAX_RELATIVE_GAP:.0%} of the reference "
        "(the walk along the run's output is shown beside it, and does not decide); drafts equal for "
        f"{MIN_EQUAL_FRACTION:.0%} of at least {MIN_CONTEXTS} contexts. `-`: not measured yet.",
        "",
        "| run | vLLM | series | drafter | quant | acceptance vLLM | reference | gap | along its output | gap "
        "| bar | draft equivalence | lossless "
        "| ablation (reverted: equal contexts, features' median cosine, acceptance (the capture run's)) | tok/s DFlash / alone, measured / projected speed-up "
        "(per concurrency) | series now | gate |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        eq = r["draft_equivalence"]
        eq_cell = (f"strict {_cell(eq['exact'])}/{eq['contexts']}, with ties {eq['equal']}/{eq['contexts']}, "
                   f"within noise (p99) {_cell(eq['equal_or_within_noise_p99_fraction'])}; "
                   f"beyond bf16 noise {_cell(eq['unequal_beyond_noise'])} "
                   f"(p99: {_cell(eq['unequal_beyond_noise_p99'])}), "
                   f"features {_cell(eq['features_median_cosine'])}") if eq else "-"
        cap = r.get("capture_run")
        if cap:
            eq_cell += (f"; in {cap['run']} at {'/'.join(map(str, cap['concurrency'] or []))}: acceptance "
                        f"{_cell(cap['mean_acceptance_length_vllm'])}, along its output "
                        f"{_cell(cap['mean_acceptance_length_along_output'])}, "
                        f"{'met' if cap['acceptance_bar_met'] else 'not met'}")
        abl = "; ".join(f"{a['reverted']}: {_cell(a['draft_equivalence_equal'])}/"
                        f"{_cell(a['draft_equivalence_contexts'])}, features {_cell(a.get('features_median_cosine'))}, "
                        f"{_cell(a['mean_acceptance_length_vllm'])} (unreverted "
                        f"{_cell(a.get('mean_acceptance_length_vllm_unreverted'))})"
                        for a in r["ablation"]) or "-"
        lines.append(
            f"| {r['run']} | {r['vllm']} | {str(r['series'])[:8]} | {str(r['drafter_sha256'])[:8]} | "
            f"{r['quantization']} | "
            f"{_cell(r['mean_acceptance_length_vllm'])} | {_cell(r['mean_acceptance_length_reference'])}"
            f"{'' if r['reference_model'] == 'bf16' else ' (' + r['reference_model'] + ')'} | "
            f"{_cell(r['relative_gap'])} | {_cell(r['mean_acceptance_length_along_output'])} | "
            f"{_cell(r['relative_gap_along_output'])} | {'met' if r['acceptance_bar_met'] else 'not met'}"
            f"{'' if r['acceptance_bar_met_along_output'] is None else ' (along its output: ' + ('met' if r['acceptance_bar_met_along_output'] else 'not met') + ')'} | {eq_cell} | "
            f"{_lossless_cell(r)} | {abl} | {_speed_cell(r['speed'])} | "
            f"{'**stale**' if r['staleness'] == 'stale' else r['staleness']} | "
            f"{'passes' if r['gate_passes'] else '**not proof**: ' + '; '.join(r['gate_failures'])} |")
    served = [r for r in rows if r.get("served_speed")]
    if served:
        lines += ["", "Through `vllm serve` (`launcher bench`, prompts workload; served.py's speed phase):", "",
                  "| run's release | served series | drafter | concurrency | tok/s DFlash / alone | speed-up, tok/s "
                  "| speed-up, TPOT | projected | measured / projected | acceptance | decode / verify / draft ms "
                  "| projected by the host's step period (decode / DFlash ms) | bar at 1 |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in served:
            s = r["served_speed"]
            for c in s["per_concurrency"]:
                tok = c["output_tok_s"]
                times = " / ".join(_cell(_round(c.get(k), 2)) for k in ("t_decode_ms", "t_verify_ms", "t_draft_ms"))
                bar = r["served_speed_bar_met"] if c["concurrency"] == 1 else None
                lines.append(f"| {r['vllm']} ({r['run']}) | {str(s['series'])[:8]} | "
                             f"{str(s.get('drafter_sha256') or '-')[:8]} | "
                             f"{c['concurrency']} | {_cell(_round(tok.get('with_drafter')))} / "
                             f"{_cell(_round(tok.get('without')))} | {_cell(_round(c.get('measured_speedup'), 3))} | "
                             f"{_cell(_round(c.get('measured_tpot_speedup'), 3))} | "
                             f"{_cell(_round(c.get('projected_speedup'), 3))} | "
                             f"{_cell(_round(c.get('measured_over_projected'), 3))} | "
                             f"{_cell(_round(c.get('mean_acceptance_length'), 3))} | {times} | "
                             f"{_cell(_round(c.get('projected_speedup_by_period'), 3))} "
                             f"({_cell(_round(c.get('decode_period_ms'), 2))} / "
                             f"{_cell(_round(c.get('dflash_period_ms'), 2))}) | "
                             f"{_bar_cell(bar, s.get('outputs'))} |")
    lines += _done_markdown(done_when(rows))
    return caveats.with_caveats("\n".join(lines) + "\n")


def _round(value, digits: int = 1):
    return None if value is None else round(value, digits)


def _lossless_cell(row: dict) -> str:
    """Strict first (issue 51): identical prompt runs, then lossless with ties (compare.py's
    verdict), then within batching noise where a noise run judged it."""
    v = row.get("verdict") or {}
    strict = f"strict {v['identical']}/{v['prompt_runs']}; " if v.get("prompt_runs") is not None else ""
    noise = row.get("within_batch_noise")
    if row["lossless"] is False and (noise is not None or row.get("batch_noise_run")):
        p99 = row.get("within_batch_noise_p99")
        return (f"{strict}with ties False; within batching noise (p99): {'not decided' if p99 is None else p99}; "
                f"at the widest move: {'not decided' if noise is None else noise}")
    return f"{strict}with ties {_cell(row['lossless'])}" if strict else _cell(row["lossless"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--realshape", type=Path, default=HERE / "results" / "realshape.json")
    parser.add_argument("--served", type=Path, default=HERE / "results" / "served.json",
                        help="served.json, whose speed rows join (skipped where the file is absent)")
    parser.add_argument("--trained", type=Path, default=HERE / "results" / "trained",
                        help="the drafter train records (their per-prompt steps give the headline)")
    parser.add_argument("--logs", type=Path, default=HERE / "results" / "realshape-logs",
                        help="the raw records' tarballs (the reference tokens the loop check reads)")
    parser.add_argument("--conformance", type=Path, action="append", default=[],
                        help="a conformance run's archive (served-raw.tar.xz): its per-request acceptance "
                             "gives headline rows of vLLM's own")
    parser.add_argument("--out-dir", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    records = json.loads(args.realshape.read_text())
    rows = build(records)
    if args.served.exists():
        add_served_speed(rows, json.loads(args.served.read_text()))
    import rejudge

    index = rejudge.raw_index(args.logs) if args.logs.is_dir() else []
    heads = headline(records, drafter_records(args.trained) if args.trained.is_dir() else [], index)
    heads += [row for archive in args.conformance for row in served_headline(archive)]
    # The JSON keeps its list of rows (one per run); the headline is written beside it.
    (args.out_dir / "acceptance.json").write_text(json.dumps(rows, indent=1) + "\n")
    (args.out_dir / "acceptance-headline.json").write_text(json.dumps(heads, indent=1) + "\n")
    (args.out_dir / "acceptance.md").write_text(markdown(rows, heads))
    print(f"{len(rows)} configuration(s): {args.out_dir / 'acceptance.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
