"""Is the oracle's cost beyond run-to-run spread? Alternating timed runs on one DFlash server (issue 53).

The curve judges the oracle against one run of the real drafter right before its planned-1.0
point (``speedup_curve.oracle_control``). One pair cannot tell a cost from the spread between two
runs: here one server at K and concurrency times, ``--rounds`` times in turn, the real drafter
with no plan and the oracle at a planned 1.0 (every draft rejected either way) with each
``--tails`` (``oracle.TAILS``: past the first wrong position the reference's tokens, as the curve
drafts, or the real drafter's own, so that a verify step differs from the real drafter's by one
token), on the point's prompts, each run as a curve point is timed (warm-up, check, timed run,
``/metrics`` around it). The record (``results/speedup-oracle-cost.json`` by default) keeps every
run, and a summary: each kind's mean TPOT and spread (max - min over mean), and each oracle
kind's cost (its mean over the real drafter's, less 1). It judges nothing: it says whether the
curve's bar (bars.yaml ``speedup_curve.max_oracle_cost``) compares a cost or the spread, and
whether the cost follows what the verify steps hold.

``python tests/gpu/runs/oracle_cost.py --vllm 0.33.0 --k 15 --concurrency 4 --rounds 3 ...`` (the
server arguments as ``speedup_curve.py run``; ``remote.sh speedup-oracle-cost``)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
import speedup_curve as curve  # noqa: E402
import speedup_grid as sg  # noqa: E402
import speedup_record as srec  # noqa: E402

RECORD = "tests/gpu/results/speedup-oracle-cost.json"
REAL = "real_drafter"


def oracle_kind(tail: str) -> str:
    return "oracle" if tail == "reference" else f"oracle_{tail}_tail"


def summary(runs: list[dict]) -> dict:
    """Each kind's mean TPOT and spread over its valid runs, and each oracle kind's cost against
    the real drafter's mean (None without both)."""
    out = {"kinds": {}, "costs": {}}
    for kind in dict.fromkeys(r["kind"] for r in runs):
        tpots = [r["tpot_ms_mean"] for r in runs if r["kind"] == kind and srec.valid(r, "dflash")]
        mean = sum(tpots) / len(tpots) if tpots else None
        out["kinds"][kind] = {"runs": len(tpots), "tpot_ms_mean": mean,
                              "spread": (max(tpots) - min(tpots)) / mean if len(tpots) > 1 else None}
    base = (out["kinds"].get(REAL) or {}).get("tpot_ms_mean")
    for kind, got in out["kinds"].items():
        if kind != REAL:
            out["costs"][kind] = got["tpot_ms_mean"] / base - 1.0 if got["tpot_ms_mean"] and base else None
    return out


def alternate(args, server, point: sg.Point, vocab: int, refs: Path, plan: Path, record: dict, meta: dict) -> None:
    """``--rounds`` times: the real drafter with no plan (its plan let go, as a control), then
    the oracle at a planned 1.0 with each tail (its plan read, as a point); each run saved as it
    ends."""
    import oracle

    planned = False
    for i in range(args.rounds):
        for tail in (None, *args.tails):
            kind = REAL if tail is None else oracle_kind(tail)
            if curve.left(args) < curve.POINT_S:
                raise curve.OutOfTime(f"{point.id}: round {i + 1}, {kind}: {curve.left(args):.0f} s left")
            if tail is None:
                dropped = oracle.dropped_marker(plan)
                dropped.unlink(missing_ok=True)
                plan.unlink(missing_ok=True)
                check = _marker_check(dropped if planned else None, f"{point.id}: the oracle still holds its plan")
            else:
                curve.point_plan(plan, point, refs, point.k, vocab, tail)
                planned = True
                check = _marker_check(curve.oracle_adopted(plan), f"{point.id}: the oracle did not read its plan")
            got = curve.measure(server.base, server.model, point, sg.prompts(point, vocab), with_drafter=True,
                                timeout=curve.request_timeout(args), check=check,
                                meta={**meta, "server": server.id})
            record["runs"].append({**got, "kind": kind, "round": i + 1, **({"tail": tail} if tail else {})})
            record["summary"] = summary(record["runs"])
            srec.save(record, args.record)


def _marker_check(marker: Path | None, problem: str):
    def check():
        if marker is not None and not marker.exists():
            raise RuntimeError(problem)
    return check


def run(args) -> int:
    from launcher.bench import workload

    point = sg.Point(args.vllm, args.k, args.concurrency, 1.0)
    meta = curve.run_meta(args)
    record = {"kind": "speedup-oracle-cost", "point": point.as_dict(), "rounds": args.rounds, "runs": []}
    args.work.mkdir(parents=True, exist_ok=True)
    refs = Path(args.refs)
    refs.mkdir(parents=True, exist_ok=True)
    plan = (Path(args.work) / f"oracle-cost-k{args.k}-c{args.concurrency}.plan.json").resolve()
    plan.unlink(missing_ok=True)
    vocab = workload.vocab_size(args.model)
    args.end = None if args.deadline_s is None else time.monotonic() + args.deadline_s
    batch = sg.Batch(args.vllm, f"k{args.k}", 1, (point,), f"c{args.concurrency}")
    usable = lambda p: curve.usable_reference(refs, p, args.k, False, meta)  # noqa: E731
    try:
        label = f"oracle-cost-k{args.k}-c{args.concurrency}"
        with curve.Server(args, label, args.k, curve.dflash_env(args, plan, later=True)) as server:
            record["server_start"] = curve.server_starts.get(label)
            curve.dflash_references(args, server, batch, args.k, [point], vocab, refs, meta, usable)
            if not usable(point):
                raise curve.OutOfTime(f"{point.id}: no time left to make its references")
            alternate(args, server, point, vocab, refs, plan, record, meta)
    except curve.OutOfTime as exc:
        print(f"{exc}: the record holds what ran", flush=True)
        return 3
    finally:
        srec.save(record, args.record)
    print(json.dumps(record["summary"], indent=1), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    curve.server_arguments(parser)
    parser.add_argument("--k", type=int, required=True, choices=sg.KS)
    parser.add_argument("--concurrency", type=int, required=True, choices=sg.CONCURRENCY)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tails", type=lambda v: [t for t in v.split(",") if t], default=["reference", "drafter"],
                        help="the oracle's tails, comma-separated (oracle.TAILS), each timed every round")
    parser.add_argument("--refs", type=Path, default=Path("/tmp/gpu-proof/speedup-refs"))
    parser.add_argument("--record", type=Path, default=curve.REPO / RECORD)
    parser.add_argument("--deadline-s", type=float, default=None)
    args = parser.parse_args(argv)
    import oracle

    bad = [t for t in args.tails if t not in oracle.TAILS]
    if bad or not args.tails:
        parser.error(f"--tails {','.join(args.tails)}: each one of {', '.join(oracle.TAILS)}")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
