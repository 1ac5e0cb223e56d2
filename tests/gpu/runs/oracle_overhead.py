"""What the oracle's timed path adds to one propose call, in host time and GPU time (issue 53).

The curve's control compares the real drafter with the oracle at a planned 1.0 on one server; at
K = 3, concurrency 1 the oracle ran 15 % slower (speedup-curve.md). This times the hook's own work
alone, outside vLLM: ``oracle._timed_v2`` on a stand-in batch whose real propose is a no-op, with a
plan (the drafts gathered and written: on CUDA by a graph replay, and by the eager gather with
``ORACLE_GRAPHS=0``) and without one (the hook's stat of the plan file only).
For each propose: host time without a sync (what the CPU spends, which async scheduling hides only while
the GPU step is longer), and GPU time from CUDA events. It prints numbers and judges nothing.

``python tests/gpu/runs/oracle_overhead.py --k 3 --rows 1 --calls 2000 [--device cuda] [--json F]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
import oracle  # noqa: E402
import speedup_grid as sg  # noqa: E402

REFERENCE_TOKENS = 271  # as the curve's references (speedup-curve.md, "What the references hold")
VOCAB = 262144


def stand_in(tmp: Path, k: int, rows: int, level: float, device):
    """An oracle watching a plan at ``level`` for ``rows`` requests, and the arguments
    ``_timed_v2`` reads (V2's input batch, rejected and sampled counts)."""
    import torch

    prompts = [[1000 + i, 7, 8, 9] for i in range(rows)]
    refs = [[42] * REFERENCE_TOKENS for _ in range(rows)]  # a fixed point, as the curve's references
    plan = tmp / "plan.json"
    oracle.make_plan_file(plan, prompts, refs, [REFERENCE_TOKENS - k - 1] * rows, VOCAB, (), seed=1, k=k,
                          f_cycles=[sg.f_cycle(level, k)] * rows)
    o = oracle.Oracle(oracle.load_plan(plan), None, later=plan)
    ids = [f"req-{i}" for i in range(rows)]
    for rid, prompt in zip(ids, prompts):
        o.note_prompt(rid, prompt)
    ib = SimpleNamespace(num_reqs=rows, req_ids=ids,
                         seq_lens=torch.full((rows,), len(prompts[0]) + 1, dtype=torch.int32, device=device))
    args = {"input_batch": ib, "num_rejected": torch.zeros(rows, dtype=torch.int32, device=device),
            "num_sampled": torch.ones(rows, dtype=torch.int32, device=device), "num_speculative_tokens": k}
    out = torch.zeros(rows, k, dtype=torch.long, device=device)
    return o, plan, args, out


def time_calls(o, args, out, calls: int, device) -> dict:
    """Mean host microseconds a propose (no sync), and GPU microseconds a propose (CUDA events)."""
    import torch

    cuda = device.type == "cuda"
    host, gpu = [], []
    for i in range(calls + 50):
        args["input_batch"].seq_lens.add_(1)  # a step on: the oracle's next proposal
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        oracle._timed_v2(o, args, lambda: out)
        t1 = time.perf_counter()
        if cuda:
            end.record()
            torch.cuda.synchronize()
        if i >= 50:  # after a warm-up
            host.append((t1 - t0) * 1e6)
            if cuda:
                gpu.append(start.elapsed_time(end) * 1e3)
    mean = lambda xs: round(sum(xs) / len(xs), 1) if xs else None  # noqa: E731
    return {"host_us": mean(host), "host_us_p50": round(sorted(host)[len(host) // 2], 1),
            "device_us": mean(gpu)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--rows", type=int, default=1, help="requests in the batch (the concurrency)")
    ap.add_argument("--level", type=float, default=1.0)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    import torch

    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        o, plan, call_args, out = stand_in(Path(tmp), args.k, args.rows, args.level, device)
        with_plan = time_calls(o, call_args, out, args.calls, device)
        os.environ["ORACLE_GRAPHS"] = "0"
        eager = time_calls(oracle.Oracle(o.plan, None, later=plan), call_args, out, args.calls, device)
        os.environ.pop("ORACLE_GRAPHS")
        plan.unlink()  # the control's state: the plan let go, the hook only stats the file
        without = time_calls(o, call_args, out, args.calls, device)
    rec = {"k": args.k, "rows": args.rows, "level": args.level, "calls": args.calls, "device": str(device),
           "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None, "torch": torch.__version__,
           "oracle": with_plan, "oracle_eager": eager, "no_plan": without,
           "graphs": o.device.graphs.captures if o.device.graphs else 0,
           "added_host_us": round(with_plan["host_us"] - without["host_us"], 1)}
    print(json.dumps(rec))
    if args.json:
        args.json.write_text(json.dumps(rec, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
