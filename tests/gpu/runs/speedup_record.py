"""The speed-up curve's record (issue 53): points measured so far, what is still missing, and its frozen model's order.

``results/speedup-curve.json`` is written a point at a time and kept between batches: a rerun
reads it and measures only what is missing (``pending``). A point holds two measurements on the
same prompts, ``baseline`` (the server without the drafter) and ``dflash`` (the DFlash server at
the point's K with the oracle steering acceptance); each is valid only with at least
``speedup_grid.MIN_REQUESTS`` successful requests, and the DFlash one only with an acceptance read
from ``/metrics``. An invalid measurement stays in the record (the report shows it) and counts as
missing.

The record names its frozen model (``frozen``: the git blob hash of ``results/speedup-frozen.json``
when the curve started). ``frozen_order`` checks in git history that this version of the frozen
record was committed before the first commit of the curve that names it, and that it is still the
committed one: the prediction the curve is judged against predates the curve.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
import bars  # noqa: E402
import speedup_grid as sg  # noqa: E402

KIND = "speedup-curve"
CURVE_PATH = "tests/gpu/results/speedup-curve.json"
RUNS = Path(__file__).resolve().parent
# The oracle's code a measurement ran with, by file: oracle_graph.py absent means the eager gather
ORACLE_FILES = ("oracle.py", "oracle_graph.py")


def oracle_blobs() -> dict:
    """Each oracle file's git blob hash (``bars.blob_hash``), for the record's batches."""
    return {name: bars.blob_hash(RUNS / name) for name in ORACLE_FILES if (RUNS / name).is_file()}


def gather_of(measurement: dict) -> str:
    """How the oracle gathered its drafts in a measurement: ``graph`` (one CUDA graph replay a
    propose call), ``eager`` or ``unknown``, as the run recorded it (``speedup_curve.oracle_gather``);
    measurements from before ``oracle_graph`` record none: eager."""
    m = measurement or {}
    if "gather" in m:
        return m["gather"].split(":")[0]
    return "eager"
FROZEN_PATH = "tests/gpu/results/speedup-frozen.json"
PHASES = ("baseline", "dflash")


def new(frozen_file: Path) -> dict:
    """An empty record naming the frozen record at ``frozen_file`` (which must exist)."""
    frozen = json.loads(Path(frozen_file).read_text())
    return {"kind": KIND, "frozen": {"blob": bars.blob_hash(frozen_file), "series": frozen.get("series"),
                                     "date": frozen.get("date"), "vllm": frozen.get("vllm")},
            "bars": bars.blob_hash(), "min_requests": sg.MIN_REQUESTS, "prompts": sg.PROMPTS,
            "points": {}, "batches": []}


def load(path: Path, frozen_file: Path) -> dict:
    """The record at ``path`` (kept points), or a new one; refused when it names another frozen
    record than ``frozen_file`` (the curve would be judged against a model it did not start from)."""
    if not Path(path).is_file():
        return new(frozen_file)
    record = json.loads(Path(path).read_text())
    if record.get("prompts") != sg.PROMPTS:
        raise ValueError(f"{path} was measured with prompts {record.get('prompts')!r}, not {sg.PROMPTS!r}: "
                         "its baselines and DFlash runs would pair other prompts")
    blob = bars.blob_hash(frozen_file)
    if (record.get("frozen") or {}).get("blob") != blob:
        raise ValueError(f"{path} names frozen record {(record.get('frozen') or {}).get('blob')}, not {blob} "
                         f"({frozen_file}): a curve is measured against the frozen model it started from")
    return record


def valid(measurement: dict | None, phase: str) -> bool:
    if not measurement or (measurement.get("successful") or 0) < sg.MIN_REQUESTS:
        return False
    if measurement.get("output_tok_s") is None:
        return False
    if phase == "dflash":
        return ((measurement.get("acceptance") or {}).get("mean_acceptance_length")) is not None
    return True


def needs_control(point: sg.Point) -> bool:
    """A planned-1.0 plain point, or one of the second oracle's (``dtail``): the real drafter is
    timed on its prompts just before it, and the two are compared as one pair (that oracle's cost)."""
    return point.level == 1.0 and point.variant in ("base", sg.TAIL_VARIANT)


# Where the real drafter's controls are kept: the one timed right before a planned-1.0 point (the
# oracle's cost is judged against it) and the one right after it (shown beside, judging nothing).
BEFORE, AFTER = "oracle_controls", "oracle_controls_after"


def paired_control(record: dict, point: sg.Point, after: bool = False) -> dict | None:
    """The real drafter's control of a planned-1.0 plain point (``after``: the one timed after
    it), if it is valid and ran on the server that measured the point (the two are compared as
    one pair)."""
    control = (record.get(AFTER if after else BEFORE) or {}).get(control_key(point))
    dflash = ((record.get("points") or {}).get(point.id) or {}).get("dflash") or {}
    if not valid(control, "dflash") or control.get("server") is None or control.get("server") != dflash.get("server"):
        return None
    return control


def missing(record: dict, point: sg.Point) -> list[str]:
    """The phases of ``point`` the record lacks (or holds invalid). A planned-1.0 plain point
    without its paired control lacks its DFlash run too: the two are measured again together.
    A baseline measured on another GPU or series than the DFlash run is lacking: the two are
    compared as one pair."""
    row = record.get("points", {}).get(point.id) or {}
    out = [ph for ph in PHASES if not valid(row.get(ph), ph)]
    if not out and measured_where(row["baseline"]) != measured_where(row["dflash"]):
        out.append("baseline")
    if needs_control(point) and "dflash" not in out and paired_control(record, point) is None:
        out.append("dflash")
    return out


def measured_where(measurement: dict) -> tuple:
    """The GPU (the host's nvidia-smi lines) and series a measurement ran on."""
    return measurement.get("gpu"), measurement.get("series")


def pending(batch: sg.Batch, record: dict, has_reference) -> list[sg.Point]:
    """The points of ``batch`` this rerun measures. On the server without the drafter: those
    without a valid baseline, and those still needing their DFlash run whose reference
    continuation (``has_reference(point)``) is not on this machine; a second oracle's point
    once its DFlash run lacks a baseline of that run's GPU (before, its plain twin's may be
    shared). On a DFlash server: those without a valid DFlash run."""
    out = []
    for p in batch.points:
        need = missing(record, p)
        if batch.server == "nodrafter" and p.variant == sg.TAIL_VARIANT:
            if need == ["baseline"]:
                out.append(p)
        elif batch.server == "nodrafter":
            if "baseline" in need or ("dflash" in need and not has_reference(p)):
                out.append(p)
        elif "dflash" in need:
            out.append(p)
    return out


def put(record: dict, point: sg.Point, phase: str, measurement: dict) -> dict:
    """Store one measurement (a later one of the same phase replaces it)."""
    row = record.setdefault("points", {}).setdefault(point.id, point.as_dict())
    row[phase] = measurement
    return record


def control_key(point: sg.Point) -> str:
    """Where the real drafter's control of ``point`` (its release, K and concurrency; the second
    oracle's with its variant) is kept."""
    suffix = f"-{point.variant}" if point.variant == sg.TAIL_VARIANT else ""
    return f"v{point.vllm}-k{point.k}-c{point.concurrency}{suffix}"


def merge(record: dict, lane: dict) -> dict:
    """``lane``'s measurements into ``record`` (a lane's record started as a copy of it): a phase
    the lane holds valid where the record does not replaces it; the lane's batches are added.
    Refused when the two name other frozen records."""
    if (lane.get("frozen") or {}).get("blob") != (record.get("frozen") or {}).get("blob"):
        raise ValueError("a lane's record names another frozen record than the curve's")
    for pid, row in (lane.get("points") or {}).items():
        mine = record.setdefault("points", {}).setdefault(pid, {k: v for k, v in row.items() if k not in PHASES})
        for phase in PHASES:
            if row.get(phase) and (valid(row[phase], phase) or not mine.get(phase)) and not valid(mine.get(phase), phase):
                mine[phase] = row[phase]
    for slot in (BEFORE, AFTER):
        controls = record.setdefault(slot, {})
        for key, got in (lane.get(slot) or {}).items():
            # a lane's control comes with the planned-1.0 point it measured (its pair), so it goes
            # where that point went: a valid one over an invalid one, an invalid one kept to show
            if (valid(got, "dflash") and not valid(controls.get(key), "dflash")) or key not in controls:
                controls[key] = got
    collapsed = record.setdefault("collapsed", {})
    for key, level in (lane.get("collapsed") or {}).items():
        collapsed[key] = min(level, collapsed.get(key, level))
    seen = {(b.get("id"), tuple(b.get("measured") or ())) for b in record.get("batches", [])}
    record.setdefault("batches", []).extend(b for b in lane.get("batches", [])
                                            if (b.get("id"), tuple(b.get("measured") or ())) not in seen)
    return record


def save(record: dict, path: Path) -> None:
    """Write the record whole (a temporary file renamed over it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def grid_problems(record: dict, points: list[sg.Point] | None = None, current_series=None) -> list[str]:
    """Why the record does not hold the whole grid: each point of ``points`` (default the grid)
    with both phases valid and, where ``current_series(vllm)`` is given, both run on the current
    series; and per release, K and concurrency of the variant-free points, at least four levels
    reaching K + 1."""
    points = sg.GRID if points is None else points
    out = []
    for p in points:
        row = record.get("points", {}).get(p.id) or {}
        for ph in missing(record, p):
            out.append(f"{p.id}: {ph} missing or under {sg.MIN_REQUESTS} successful requests")
        if current_series is not None:
            for ph in PHASES:
                series = (row.get(ph) or {}).get("series")
                if ph in row and series != current_series(p.vllm):
                    out.append(f"{p.id}: {ph} ran on series {series}, not the current one")
    groups: dict[tuple, list[float]] = {}
    for p in points:
        if p.variant == "base":
            groups.setdefault((p.vllm, p.k, p.concurrency), []).append(p.level)
    for (vllm, k, c), levels in groups.items():
        if vllm == sg.MAIN_VLLM and (len(levels) < sg.MIN_LEVELS or max(levels) < k + 1):
            out.append(f"{vllm} K={k} c={c}: levels {sorted(levels)}: fewer than {sg.MIN_LEVELS} or not up to K + 1")
    return out


def frozen_order(repo: Path, curve_path: str = CURVE_PATH, frozen_path: str = FROZEN_PATH) -> list[str]:
    """Problems with the curve's frozen reference in ``repo``'s history (empty: in order).
    Nothing to check while no curve is committed."""
    curve_file = Path(repo) / curve_path
    if not curve_file.is_file():
        return []
    blob = (json.loads(curve_file.read_text()).get("frozen") or {}).get("blob")
    if not blob:
        return [f"{curve_path} names no frozen record"]
    frozen_file = Path(repo) / frozen_path
    if not frozen_file.is_file():
        return [f"{curve_path} names frozen record {blob}, but {frozen_path} is not there"]
    out = []
    if bars.blob_hash(frozen_file) != blob:
        out.append(f"{curve_path} names frozen record {blob}; {frozen_path} is {bars.blob_hash(frozen_file)}")
    try:
        frozen_commit = bars.committed_versions(repo, frozen_path).get(blob)
    except Exception:  # noqa: BLE001 - a repository without a commit yet
        frozen_commit = None
    if frozen_commit is None:
        return out + [f"frozen record {blob} was never committed"]
    curve_commit = bars.first_commit_naming(repo, blob, curve_path)
    if curve_commit is None:
        return out  # the curve is not committed yet: the frozen record it names already is
    if curve_commit == frozen_commit:
        return out + [f"frozen record {blob} was committed with the curve ({curve_commit[:12]}), not before it"]
    try:
        bars._git(repo, "merge-base", "--is-ancestor", frozen_commit, curve_commit)
    except Exception:  # noqa: BLE001 - git says "not an ancestor" by its exit status
        out.append(f"frozen record {blob} ({frozen_commit[:12]}) was not committed before the curve "
                   f"({curve_commit[:12]})")
    return out


# vLLM's own start-up lines, as 0.21.0 and 0.33.0 word them; a phase that occurs more than once
# (the target's and the drafter's weights) is summed
START_PHASES = {
    "load_weights_s": r"Loading weights took ([0-9.]+) seconds",
    "compile_s": r"torch\.compile took ([0-9.]+) s in total",
    "graph_capture_s": r"Graph capturing finished in ([0-9.]+) secs",
    "init_engine_s": r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s",
}


def start_phases(log: str) -> dict:
    """The start-up phases a vLLM server's log states (``START_PHASES``), in seconds; a phase
    the log does not state is left out."""
    import re

    out = {}
    for name, pattern in START_PHASES.items():
        found = [float(x) for x in re.findall(pattern, log)]
        if found:
            out[name] = round(sum(found), 1)
    return out
