"""The speed-up curve's report (issue 53): break-even per K and concurrency against the frozen model, speedup-curve.md, its PNG, the launcher's table.

From ``results/speedup-curve.json`` and ``results/speedup-frozen.json`` alone:

* per (release, K, concurrency), the measured points (acceptance from ``/metrics``, output tok/s
  and TPOT with and without the drafter, their ratio) and the break-even acceptance read off them
  (``launcher.bench.breakeven.interpolate``), beside the frozen model's (``speedup_model``); a
  relative gap over bars.yaml's ``speedup_curve.max_break_even_gap`` is flagged;
* the ``logprobs`` and ``long`` points against the plain point they vary;
* which K the curve favours for a drafter's per-position acceptance (``k_choice``);
* what the oracle's references hold (the archives in ``speedup-curve/``: distinct tokens each);
* the oracle's cost timed in turn with the real drafter (``speedup-oracle-cost.json``, if run);
* ``speedup-curve.md`` (headline first), ``speedup-curve.png`` (speed-up against measured
  acceptance, one colour per K and concurrency, the frozen prediction dashed, 1.0 dashed black),
  and the launcher's table (``launcher/bench/breakeven.json``).

``python tests/gpu/reports/speedup_report.py --curve C --frozen F --md M --png P --table T``
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # tests/gpu
sys.path.insert(0, str(HERE))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
sys.path.insert(1, str(HERE.parents[1]))

import bars  # noqa: E402
import caveats  # noqa: E402
import headline  # noqa: E402
import k_choice  # noqa: E402
import png_plot  # noqa: E402
import speedup_grid as sg  # noqa: E402
import speedup_model as sm  # noqa: E402
import speedup_record as srec  # noqa: E402
from launcher.bench import breakeven  # noqa: E402

COLORS = {(3, 1): (31, 119, 180), (3, 4): (158, 202, 225), (7, 1): (214, 39, 40), (7, 4): (252, 146, 114),
          (15, 1): (44, 160, 44), (15, 4): (161, 217, 155)}
SPOT_COLOR = (148, 103, 189)


def ratio(a, b):
    return a / b if a is not None and b else None


def point_rows(curve: dict) -> list[dict]:
    """Every point with both phases valid, measured on one GPU and series: measured acceptance,
    speed-up, TPOT ratio."""
    rows = []
    for pid, row in sorted(curve.get("points", {}).items()):
        base, dfl = row.get("baseline"), row.get("dflash")
        if not (srec.valid(base, "baseline") and srec.valid(dfl, "dflash")) \
                or srec.measured_where(base) != srec.measured_where(dfl):
            continue
        rows.append({"id": pid, "vllm": row["vllm"], "k": row["k"], "concurrency": row["concurrency"],
                     "level": row["level"], "variant": row["variant"],
                     "acceptance": dfl["acceptance"]["mean_acceptance_length"],
                     "tok_s": {"dflash": dfl["output_tok_s"], "no_drafter": base["output_tok_s"]},
                     "tpot_ms": {"dflash": dfl.get("tpot_ms_mean"), "no_drafter": base.get("tpot_ms_mean")},
                     "speedup": ratio(dfl["output_tok_s"], base["output_tok_s"]),
                     "tpot_speedup": ratio(base.get("tpot_ms_mean"), dfl.get("tpot_ms_mean")),
                     "successful": min(base["successful"], dfl["successful"]),
                     "series": dfl.get("series")})
    return rows


def _measured(rows: list[dict], points) -> int:
    """How many of ``points`` have a row: the grid and the second oracle's points are counted apart."""
    ids = {p.id for p in points}
    return sum(1 for r in rows if r["id"] in ids)


def _drafter_only(curve: dict, rows: list[dict]) -> str:
    """The second oracle's points measured with the drafter that still lack their baseline."""
    have = {r["id"] for r in rows}
    n = sum(1 for p in sg.TAIL_POINTS if p.id not in have
            and srec.valid(((curve.get("points") or {}).get(p.id) or {}).get("dflash"), "dflash"))
    return f", {n} more with the drafter only: {NO_BASELINE}" if n else ""


def _range(r: list) -> str:
    return "-" if r[0] is None else f"{_f(r[0])}-{_f(r[1])}"


def oracle_costs(curve: dict) -> dict[tuple, dict]:
    """Per (release, K, concurrency, the oracle's tail: ``reference`` for the plain points,
    ``drafter`` for the second oracle's): the oracle's planned-1.0 point against the real drafter's
    control timed just before it on the same server and prompts (``speedup_record.paired_control``):
    the relative TPOT difference, held when within bars.yaml's ``speedup_curve.max_oracle_cost``
    and the two acceptances within ``max_control_acceptance_gap`` (else the TPOTs compare other
    step counts)."""
    bar, gap_bar = (bars.get("speedup_curve", key) for key in ("max_oracle_cost", "max_control_acceptance_gap"))
    out = {}
    for pid, row in (curve.get("points") or {}).items():
        dfl = row.get("dflash")
        point = sg.Point(row["vllm"], row["k"], row["concurrency"], row["level"], row["variant"])
        if not srec.needs_control(point) or not srec.valid(dfl, "dflash"):
            continue
        control = srec.paired_control(curve, point)
        if control is None or not control.get("tpot_ms_mean") or dfl.get("tpot_ms_mean") is None:
            continue
        cost = dfl["tpot_ms_mean"] / control["tpot_ms_mean"] - 1.0
        acc = {"oracle": dfl["acceptance"]["mean_acceptance_length"],
               "real_drafter": control["acceptance"]["mean_acceptance_length"]}
        again = srec.paired_control(curve, point, after=True) or {}
        after = again.get("tpot_ms_mean")
        out[(point.vllm, point.k, point.concurrency, point.tail)] = {
            "cost": cost, "holds": abs(cost) <= bar and abs(acc["oracle"] - acc["real_drafter"]) <= gap_bar,
            "tpot_ms": {"oracle": dfl["tpot_ms_mean"], "real_drafter": control["tpot_ms_mean"], "real_drafter_after": after},
            # two runs of the real drafter on one server, the point between them: how far apart
            # they lie says what a cost that size can be told from (shown, judging nothing)
            "controls_apart": after / control["tpot_ms_mean"] - 1.0 if after else None, "acceptance": acc,
            "gather": srec.gather_of(dfl)}
    return out


TAIL_OF_VARIANT = {"base": "reference", sg.TAIL_VARIANT: "drafter"}  # a curve's points by the oracle's tail
VARIANT_OF_TAIL = {tail: variant for variant, tail in TAIL_OF_VARIANT.items()}


def chosen_oracle(costs: dict, vllm: str, k: int, c: int) -> str | None:
    """The oracle (its tail) whose points state the curve at a release, K and concurrency: the
    plain one where its cost holds, else the second one where its cost holds; None where neither
    does."""
    for tail in ("reference", "drafter"):
        if (costs.get((vllm, k, c, tail)) or {}).get("holds") is True:
            return tail
    return None


def curve_variant(costs: dict, vllm: str, k: int, c: int) -> str:
    """The points that draw the curve at a release, K and concurrency: the chosen oracle's
    (``chosen_oracle``), the plain ones where neither oracle holds."""
    return VARIANT_OF_TAIL[chosen_oracle(costs, vllm, k, c) or "reference"]


# An oracle's cell whose cost was timed but none of whose points has both phases: its DFlash runs
# wait for a baseline measured on their GPU (speedup_record.missing)
NO_BASELINE = "no baseline on its GPU yet"
NO_BASELINE_WHY = "its points were measured with the drafter, not yet without it on the same GPU"


def break_evens(rows: list[dict], frozen: dict, costs: dict | None = None) -> list[dict]:
    """Per (release, K, concurrency, oracle) of the plain points and the second oracle's:
    measured and predicted break-even, and that oracle's cost there (``oracle_costs``; None: no
    control measured). A cell with a cost and no point measured both ways is listed, its
    break-even None (``NO_BASELINE``)."""
    gap_bar = bars.get("speedup_curve", "max_break_even_gap")
    costs = costs or {}
    groups: dict[tuple, list[dict]] = {key: [] for key in costs}
    for r in rows:
        if r["variant"] in TAIL_OF_VARIANT:
            groups.setdefault((r["vllm"], r["k"], r["concurrency"], TAIL_OF_VARIANT[r["variant"]]), []).append(r)
    out = []
    for (vllm, k, c, tail), members in sorted(groups.items(), key=lambda kv: (kv[0][0] != sg.MAIN_VLLM, kv[0])):
        got = breakeven.interpolate([(m["acceptance"], m["speedup"]) for m in members]) if members else \
            {"acceptance": None, "status": NO_BASELINE, "measured_range": [None, None], "points": 0}
        try:
            # the frozen model's step times are one release's: another release's curve has no prediction
            predicted = sm.break_even(frozen, k, c) if frozen.get("vllm") in (None, vllm) else None
        except KeyError:
            predicted = None
        gap = (abs(got["acceptance"] - predicted) / predicted
               if got["acceptance"] is not None and predicted else None)
        cost = costs.get((vllm, k, c, tail))
        out.append({"vllm": vllm, "k": k, "concurrency": c, "oracle": tail,
                    "break_even": got["acceptance"], "status": got["status"],
                    "measured_range": got["measured_range"], "points": got["points"], "predicted": predicted,
                    "relative_gap": gap, "over_bar": gap is not None and gap > gap_bar,
                    "oracle_cost": cost["cost"] if cost else None, "oracle_cost_holds": cost["holds"] if cost else None})
    return out


def variants(rows: list[dict]) -> list[dict]:
    """Each variant point (logprobs, long prompts) beside the plain point of the same release, K,
    concurrency and level; the second oracle's points have their own curve."""
    plain = {(r["vllm"], r["k"], r["concurrency"], r["level"]): r for r in rows if r["variant"] == "base"}
    out = []
    for r in rows:
        if r["variant"] in TAIL_OF_VARIANT:
            continue
        b = plain.get((r["vllm"], r["k"], r["concurrency"], r["level"]))
        out.append({"id": r["id"], "variant": r["variant"], "speedup": r["speedup"],
                    "plain_speedup": b["speedup"] if b else None, "acceptance": r["acceptance"],
                    "plain_acceptance": b["acceptance"] if b else None})
    return out


def launcher_table(curve: dict | None, frozen: dict | None) -> dict:
    """What launcher/bench/breakeven.json holds: the measured break-evens (no rows without a curve)."""
    if not curve or not frozen:
        return {"source": None, "note": "no speed-up curve is committed yet: no measured break-even", "rows": []}
    costs = oracle_costs(curve)
    table = break_evens(point_rows(curve), frozen, costs)
    # A break-even whose oracle was not shown to cost nothing (no control, or over the bar) is
    # not one a user is told: per release, K and concurrency, the plain oracle's where it holds,
    # else the second oracle's where that holds, else none.
    chosen = {(r["vllm"], r["k"], r["concurrency"]): chosen_oracle(costs, r["vllm"], r["k"], r["concurrency"])
              for r in table}
    mine = [r for r in table if chosen[(r["vllm"], r["k"], r["concurrency"])] == r["oracle"]]
    rows = [{"vllm": r["vllm"], "k": r["k"], "concurrency": r["concurrency"], "oracle": r["oracle"],
             "acceptance": r["break_even"], "status": r["status"], "measured_range": r["measured_range"]}
            for r in mine if r["points"]]
    left_out = [{"vllm": r["vllm"], "k": r["k"], "concurrency": r["concurrency"],
                 "why": "no control paired with its planned-1.0 point" if r["oracle_cost_holds"] is None
                 else "the oracle's cost is over the bar"}
                for r in table if r["oracle"] == "reference" and chosen[(r["vllm"], r["k"], r["concurrency"])] is None]
    left_out += [{"vllm": r["vllm"], "k": r["k"], "concurrency": r["concurrency"],
                  "why": NO_BASELINE_WHY} for r in mine if not r["points"]]
    return {"source": srec.CURVE_PATH, "frozen": curve.get("frozen"), "rows": rows, "left_out": left_out}


def _f(x, digits=2, suffix=""):
    return "-" if x is None else f"{x:.{digits}f}{suffix}"


def gpu_line(gpu: str | None) -> str | None:
    """nvidia-smi's lines, one a GPU, as one: ``2 x NAME`` where the GPUs are alike."""
    lines = (gpu or "").splitlines()
    if len(set(lines)) == 1 and len(lines) > 1:
        return f"{len(lines)} x {lines[0]}"
    return "; ".join(lines) or gpu


def oracle_label(tail: str) -> str:
    """How a table names the second oracle's rows (the plain oracle's need no name)."""
    return " (second oracle)" if tail == "drafter" else ""


def stated(b: dict) -> str:
    """The break-even as the report states it: none where the oracle was not shown to cost
    nothing there; what the points read is still given, marked."""
    if not b["points"]:
        return "not yet"
    if b["oracle_cost_holds"] is True:
        return _f(b["break_even"])
    return f"not stated (the points read {_f(b['break_even'])})"


def oracle_cost_lines(record: dict | None) -> list[str]:
    """The oracle's cost timed in turn with the real drafter (``runs/oracle_cost.py``), if run."""
    if not record or not record.get("summary"):
        return []
    s, point = record["summary"], record.get("point") or {}
    lines = ["", "## The oracle's cost, timed in turn", "",
             f"One server at K {point.get('k')}, concurrency {point.get('concurrency')} (vLLM {point.get('vllm')}), "
             f"{record.get('rounds')} rounds of the real drafter with no plan and the oracle at a planned 1.0 "
             "(with the reference's tokens past the first wrong position, as the curve drafts, and with the real "
             "drafter's own). The spread is a kind's largest TPOT less its smallest, over its mean. It judges "
             "nothing: a cost inside the spread is not one the one-pair bar can tell.", "",
             "| kind | runs | TPOT mean ms | spread | cost against the real drafter |", "|---|---|---|---|---|"]
    for kind, got in s.get("kinds", {}).items():
        cost = s.get("costs", {}).get(kind)
        lines.append(f"| {kind} | {got['runs']} | {_f(got['tpot_ms_mean'])} | "
                     f"{_f(None if got['spread'] is None else 100 * got['spread'], 1, ' %')} | "
                     f"{_f(None if cost is None else 100 * cost, 1, ' %')} |")
    return lines


def overhead_lines(record: dict | None) -> list[str]:
    """The oracle's own work per propose call, timed alone on the GPU host (``runs/oracle_overhead.py``):
    the eager gather the points before ``oracle_graph`` ran with, and now eager and graphed."""
    if not record or not record.get("runs"):
        return []
    before = {(r["k"], r["rows"]): r for r in (record.get("eager_before") or {}).get("runs", [])}
    lines = ["", "## The oracle's own work", "",
             f"Host and GPU microseconds a propose call of the oracle's timed path, outside vLLM, on {record.get('host')} "
             f"(`speedup-oracle-overhead.json`, means of {record['runs'][0].get('calls'):,} calls): where a step is short "
             "enough for the host to set its pace, the host's time adds to the step.", "",
             "| K | c | eager, as the points so far ran it | eager | graph | graph, GPU | no plan |",
             "|---|---|---|---|---|---|---|"]
    for r in sorted(record["runs"], key=lambda r: (r["k"], r["rows"])):
        old = before.get((r["k"], r["rows"]), {}).get("oracle", {}).get("host_us")
        lines.append(f"| {r['k']} | {r['rows']} | {_f(old, 0)} | {_f(r['oracle_eager']['host_us'], 0)} | "
                     f"{_f(r['oracle']['host_us'], 0)} | {_f(r['oracle']['device_us'], 0)} | {_f(r['no_plan']['host_us'], 0)} |")
    return lines


def start_lines(curve: dict) -> list[str]:
    """Each server's start as the batches recorded it (``batches[].server_start``): the seconds
    from launch to health, and the phases vLLM's log states. What decides how many batches a
    GPU host's hold measures; none before the record kept them."""
    starts = [(b["id"], b.get("lane"), b["server_start"]) for b in curve.get("batches", []) if b.get("server_start")]
    if not starts:
        return []
    lines = ["", "## Server starts", "",
             "Seconds from `launcher serve` to a healthy server, and the phases in vLLM's own log (the target's "
             "and the drafter's summed).", "",
             "| batch | lane | total | weights | torch.compile | graph capture | engine init |", "|---|---|---|---|---|---|---|"]
    for batch, lane, got in starts:
        cells = " | ".join(_f(got.get(key), 0) for key in srec.START_PHASES)
        lines.append(f"| {batch} | {lane or '-'} | {_f(got.get('total_s'), 0)} | {cells} |")
    return lines


def reference_sets(folder: Path | None) -> dict[str, dict]:
    """What the oracle's references hold, from the archives a run left (``speedup-refs/*.json``
    in ``folder/*.tar.gz``; a set in a later archive replaces an earlier one): per set, its
    references, their length, and the distinct tokens in each (median and largest)."""
    import statistics
    import tarfile

    out: dict[str, dict] = {}
    for archive in sorted(Path(folder).glob("*.tar.gz")) if folder and Path(folder).is_dir() else []:
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                if not (member.isfile() and member.name.endswith(".json")):
                    continue
                refs = json.loads(tar.extractfile(member).read())["references"]
                distinct = [len(set(r)) for r in refs] or [0]
                out[Path(member.name).stem] = {"references": len(refs), "length": max((len(r) for r in refs), default=0),
                                               "median_distinct": statistics.median(distinct),
                                               "max_distinct": max(distinct), "archive": archive.name}
    return out


def reference_lines(sets: dict[str, dict]) -> list[str]:
    if not sets:
        return []
    lines = ["", "## What the references hold", "",
             "The oracle steers acceptance on the target's own greedy continuations. A random-weight target "
             "falls into a fixed point: where a continuation repeats one token, every verify step of these "
             "points runs on repeated tokens, not on text, and the MoE's routing of a verify batch may differ "
             "from what text gives.", "",
             "| set | references | tokens each | distinct tokens: median, largest | archive |", "|---|---|---|---|---|"]
    for name, s in sorted(sets.items()):
        lines.append(f"| {name} | {s['references']} | {s['length']} | {s['median_distinct']:g}, {s['max_distinct']} | "
                     f"`speedup-curve/{s['archive']}` |")
    return lines


def k_lines(rows: list[dict], acceptance_rows: list[dict], costs: dict) -> list[str]:
    """The section on which K the curve favours (``k_choice``), on the main release, from the
    curves whose oracle cost holds."""
    lines = ["", "## Which K the curve favours", "",
             "A drafter's mean acceptance length at K is 1 plus its first K per-position acceptance rates at "
             "K = 15; the curve of each K gives the speed-up there (read between measured points only). "
             f"Only the Ks measured at vLLM {sg.MAIN_VLLM} whose oracle cost holds are compared, and a best K "
             "needs two of them.", "",
             "| drafter | c | K: acceptance, speed-up | best K |", "|---|---|---|---|"]
    variant = lambda k, c: curve_variant(costs, sg.MAIN_VLLM, k, c)  # noqa: E731
    drawn = {(r["k"], r["concurrency"]) for r in rows
             if r["vllm"] == sg.MAIN_VLLM and r["variant"] == variant(r["k"], r["concurrency"])}
    usable = lambda k, c: chosen_oracle(costs, sg.MAIN_VLLM, k, c) is not None and (k, c) in drawn  # noqa: E731
    for row in k_choice.table(rows, sg.MAIN_VLLM, acceptance_rows, usable, variant):
        cells = "; ".join(f"{k}: {v['tau']:.2f}, {_f(v['speedup'])}x" for k, v in row["per_k"].items())
        lines.append(f"| {row['profile']} | {row['concurrency']} | {cells or 'no K usable yet'} | {row['best_k'] or '-'} |")
    return lines


def markdown(curve: dict, frozen: dict, png_name: str = "speedup-curve.png",
             acceptance_rows: list[dict] | None = None, refs: dict[str, dict] | None = None,
             oracle_cost: dict | None = None, overhead: dict | None = None) -> str:
    rows = point_rows(curve)
    costs = oracle_costs(curve)
    table = break_evens(rows, frozen, costs)
    problems = srec.grid_problems(curve)
    records = [{"vllm": r["vllm"], "series": r["series"]} for r in rows]
    def verdict(b):
        if b["oracle_cost_holds"] is not True:
            return "oracle cost " + ("unmeasured" if b["oracle_cost_holds"] is None else "over the bar")
        return ("over the 15 % bar" if b["over_bar"] else "within 15 %") if b["relative_gap"] is not None \
            else b["status"]
    head = [(f"break-even K={b['k']} c={b['concurrency']}{oracle_label(b['oracle'])}", b["vllm"],
             headline.series_cell([r for r in records if r["vllm"] == b["vllm"]]),
             verdict(b), f"{stated(b)}, {_f(b['predicted'])} frozen" if b["oracle_cost_holds"] is not True or not b["points"]
             else f"{_f(b['break_even'])} measured / {_f(b['predicted'])} frozen") for b in table]
    head = head or [("speed-up curve", sg.MAIN_VLLM, "unrecorded", "no point measured", "-")]
    lines = ["# When DFlash pays: the measured speed-up curve (issue 53)", "", *headline.table(head),
             "Regenerate: `make gpu-speedup` on a GPU host: it measures the points the record lacks, then writes "
             "this page, its chart and the launcher's table (`speedup_report.py`).", ""]
    missing = len({p.split(":")[0] for p in problems if p.startswith("v")})
    lines += [f"Grid: {'complete' if not problems else f'{missing} points missing'} "
              f"({_measured(rows, sg.GRID)} of {len(sg.GRID)} grid points measured with both phases; "
              f"{_measured(rows, sg.TAIL_POINTS)} of {len(sg.TAIL_POINTS)} of the second oracle's"
              f"{_drafter_only(curve, rows)}). Frozen model: "
              f"`speedup-frozen.json` (blob {curve['frozen']['blob'][:12]}, {frozen.get('date')}, "
              f"{gpu_line(frozen.get('gpu'))}, vLLM {frozen.get('vllm')}), prediction `{sm.FORMULA}`, never fitted to "
              "this curve.", "",
              "An emulation on a Hopper GPU (Marlin for the FP4 kernels, the rtx5090 profile's memory); "
              "random weights, the oracle proposer setting acceptance while the drafter's forward runs.", "",
              f"![speed-up against measured acceptance]({png_name})", "",
              "The chart: x = measured mean acceptance length (grid line every 1), y = output tok/s with "
              "the drafter over without (grid line every 1, dashed black at 1.0). Colours: "
              "K=3 blue, K=7 red, K=15 green (dark: concurrency 1, light: 4), 0.21.0 purple; dashed in "
              "the same colour: the frozen prediction. Per K and concurrency it plots the points of the oracle "
              "that states the break-even there: the plain one where its cost holds, else the second one "
              "(`dtail`: the real drafter's tokens past the first wrong position) where its cost holds.", "",
              "## Break-even per K and concurrency", "",
              "| vLLM | K | c | measured break-even | frozen prediction | gap | points | measured acceptance |",
              "|---|---|---|---|---|---|---|---|"]
    for b in table:
        lines.append(f"| {b['vllm']} | {b['k']}{oracle_label(b['oracle'])} | {b['concurrency']} | {stated(b)} ({b['status']}) | "
                     f"{_f(b['predicted'])} | {_f(None if b['relative_gap'] is None else 100 * b['relative_gap'], 1, ' %')}"
                     f"{' **over the bar**' if b['over_bar'] else ''} | {b['points']} | "
                     f"{_range(b['measured_range'])} |")
    lines += ["", "## Points", "", "| point | acceptance | tok/s with / without | speed-up | TPOT with / without ms | "
              "requests |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['id']} | {_f(r['acceptance'])} | {_f(r['tok_s']['dflash'], 1)} / "
                     f"{_f(r['tok_s']['no_drafter'], 1)} | {_f(r['speedup'])}x | {_f(r['tpot_ms']['dflash'])} / "
                     f"{_f(r['tpot_ms']['no_drafter'])} | {r['successful']} |")
    lines += ["", "## What the oracle costs", "",
              f"The real drafter timed with no plan just before the oracle at a planned 1.0, on the same server and "
              f"prompts; bar: TPOT within {100 * bars.get('speedup_curve', 'max_oracle_cost'):g} % and acceptance within "
              f"{bars.get('speedup_curve', 'max_control_acceptance_gap'):g}. "
              "A K and concurrency without a control, or over the bar, states no break-even. Where the real drafter "
              "was timed again right after the point, the two controls' gap is shown beside the cost (it judges "
              "nothing). Gather: how the oracle set its drafts, `eager` (about 30 small operations a propose call) or "
              "`graph` (one CUDA graph replay); \"The oracle's own work\" below times both.", "",
              "| vLLM | K | c | gather | TPOT oracle / real drafter (before, after) ms | acceptance oracle / real drafter "
              "| cost | controls apart | holds |",
              "|---|---|---|---|---|---|---|---|---|"]
    for (vllm, k, c, tail), cost in sorted(costs.items()):
        tp = cost["tpot_ms"]
        lines.append(f"| {vllm} | {k}{oracle_label(tail)} | {c} | {cost['gather']} | {_f(tp['oracle'])} / "
                     f"{_f(tp['real_drafter'])}, {_f(tp['real_drafter_after'])} | "
                     f"{_f(cost['acceptance']['oracle'])} / {_f(cost['acceptance']['real_drafter'])} | "
                     f"{_f(100 * cost['cost'], 1, ' %')} | "
                     f"{_f(None if cost['controls_apart'] is None else 100 * cost['controls_apart'], 1, ' %')} | "
                     f"{cost['holds']} |")
    if not costs:
        lines.append("| - | - | - | - | no control measured | - | - | - | - |")
    var = variants(rows)
    if var:
        lines += ["", "## What logprobs and long prompts cost", "",
                  "| point | speed-up | the plain point's | acceptance / plain |", "|---|---|---|---|"]
        for v in var:
            lines.append(f"| {v['id']} | {_f(v['speedup'])}x | {_f(v['plain_speedup'])}x | "
                         f"{_f(v['acceptance'])} / {_f(v['plain_acceptance'])} |")
    lines += oracle_cost_lines(oracle_cost)
    lines += overhead_lines(overhead)
    lines += start_lines(curve)
    lines += reference_lines(refs or {})
    if rows:
        lines += k_lines(rows, acceptance_rows or [], costs)
    if problems:
        lines += ["", "## Gaps in the grid", "", *[f"- {p}" for p in problems[:60]]]
        if len(problems) > 60:
            lines.append(f"- ... and {len(problems) - 60} more")
    return caveats.with_caveats("\n".join(lines) + "\n")


def chart(curve: dict, frozen: dict) -> bytes:
    rows = point_rows(curve)
    costs = oracle_costs(curve)
    series = []
    for (k, c), color in COLORS.items():
        variant = curve_variant(costs, sg.MAIN_VLLM, k, c)
        pts = [(r["acceptance"], r["speedup"]) for r in rows
               if r["variant"] == variant and r["vllm"] == sg.MAIN_VLLM and (r["k"], r["concurrency"]) == (k, c)]
        if pts:
            series.append({"points": pts, "color": color})
            try:
                series.append({"points": [(a, sm.predict(frozen, a, k, c)) for a in (1.0, k + 1.0)],
                               "color": color, "dashed": True})
            except KeyError:
                pass
    spot = [(r["acceptance"], r["speedup"]) for r in rows if r["vllm"] == sg.SPOT_VLLM]
    if spot:
        series.append({"points": spot, "color": SPOT_COLOR})
    ys = [y for s in series for _, y in s["points"]] or [1.0]
    return png_plot.chart(series, x_range=(0.0, max(sg.KS) + 1.0), y_range=(0.0, max(2.0, float(int(max(ys)) + 1))),
                          reference_y=1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--curve", type=Path, required=True)
    parser.add_argument("--frozen", type=Path, required=True)
    parser.add_argument("--md", type=Path, required=True)
    parser.add_argument("--png", type=Path, required=True)
    parser.add_argument("--table", type=Path, help="the launcher's break-even table to write")
    parser.add_argument("--acceptance", type=Path,
                        help="per-position acceptance for the K choice (default: acceptance.json beside --curve)")
    parser.add_argument("--refs-dir", type=Path,
                        help="the runs' reference archives (default: speedup-curve/ beside --curve)")
    args = parser.parse_args(argv)
    curve, frozen = json.loads(args.curve.read_text()), json.loads(args.frozen.read_text())
    acceptance = args.acceptance or args.curve.with_name("acceptance.json")
    rows = json.loads(acceptance.read_text()) if acceptance.is_file() else []
    refs = reference_sets(args.refs_dir or args.curve.with_name("speedup-curve"))
    cost_path = args.curve.with_name("speedup-oracle-cost.json")
    cost = json.loads(cost_path.read_text()) if cost_path.is_file() else None
    overhead_path = args.curve.with_name("speedup-oracle-overhead.json")
    overhead = json.loads(overhead_path.read_text()) if overhead_path.is_file() else None
    args.md.write_text(markdown(curve, frozen, args.png.name, rows, refs, cost, overhead))
    args.png.write_bytes(chart(curve, frozen))
    if args.table:
        args.table.write_text(json.dumps(launcher_table(curve, frozen), indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
