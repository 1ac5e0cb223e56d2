"""Measure the frozen step-time model's inputs on the GPU host and write ``speedup-frozen.json`` (issue 53).

Four servers of the full-size random-weight checkpoint, each through ``fullsize_serve.py`` (the
rtx5090 profile inside the card's memory, ``launcher serve``, ``launcher bench``'s random
workload at concurrency 1 and 4) with the step-time plugin (``step_times/``) writing every
engine step: without the drafter (the decode step), and with the DFlash drafter at K = 3, 7 and
15 (``--set drafter.num_speculative_tokens=K``: the verify step and the draft step). Random
weights accept next to nothing; a verify step forwards c * (K + 1) tokens whatever is accepted,
so its time is what the model needs.

Each server's steps are kept in ``OUT/frozen-<label>-steps.jsonl`` beside its fullsize record; a
rerun starts only the servers whose steps are missing (a deadline may cut the four short), and the
record is written once all four are there (``speedup_model.frozen_record``). The record then
belongs in ``results/`` and is committed before any curve point is measured.

``python tests/gpu/runs/speedup_frozen.py --out DIR --json FILE --model M --drafter D --launcher CMD
--series-hash H --vllm V --gpu-file F [--vllm-arg ARG].. [--deadline-s S] [--gpus 0,1]``

With ``--gpus`` the servers run as many at once as GPUs are named, one a GPU of the host (the record
says how many at once); without it, one after another.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # tests/gpu
sys.path.insert(0, str(HERE))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)

import bars  # noqa: E402
import fullsize_serve  # noqa: E402
import speedup_model as sm  # noqa: E402
from served import STEP_TIMES_ENV, STEP_TIMES_PLUGIN, read_steps  # noqa: E402

# A server start, its bench at 1 and 4 (32 requests a level) and its stop, on an H200 with vLLM
# 0.33.0, two servers at once: 317 s without the drafter (ready after 260 s); with the drafter at
# K 3 the start alone took about 425 s (torch.compile of both models, CUDA graphs captured twice
# for the memory estimate, the V2 runner's kernel warmup).
SERVER_S = 480
# A server waits for readiness until its deadline less this reserve for its bench.
BENCH_RESERVE_S = 90


def steps_file(out: Path, k: int | None) -> Path:
    return out / f"{sm.server_label(k)}-steps.jsonl"


def measured(out: Path, k: int | None) -> bool:
    """The server ran its bench (its fullsize record says it started) and its steps were written."""
    rec = out / f"{sm.server_label(k)}.json"
    if not (rec.is_file() and steps_file(out, k).is_file()):
        return False
    return bool(json.loads(rec.read_text()).get("started"))


def serve_argv(args, k: int | None, deadline_s: float) -> list[str]:
    argv = ["--label", sm.server_label(k), "--out", str(args.out), "--profile", sm.PROFILE,
            "--recipe", args.recipe, "--launcher", args.launcher, "--model", str(args.model),
            "--concurrency", ",".join(map(str, sm.CONCURRENCY)), "--deadline-s", str(int(deadline_s)),
            "--min-requests", str(bars.get("speedup_curve", "min_requests")),
            "--bench-reserve-s", str(BENCH_RESERVE_S)]
    if args.series_hash:
        argv += ["--series-hash", args.series_hash]
    argv += ["--no-drafter"] if k is None else ["--drafter", str(args.drafter),
                                                "--set", f"drafter.num_speculative_tokens={k}"]
    for item in args.set:
        argv += ["--set", item]
    for item in args.vllm_arg:
        argv.append(f"--vllm-arg={item}")
    return argv


# The harness each server runs in (a constant, so a test can put a stand-in in its place)
FULLSIZE_SERVE = HERE / "runs" / "fullsize_serve.py"
PORT = 8011


def start_server(args, k: int | None, deadline_s: float, gpu: str | None, port: int) -> subprocess.Popen:
    """One server through fullsize_serve in a process of its own, the step-time plugin on, on
    ``gpu`` (CUDA_VISIBLE_DEVICES; its memory blocker inherits it) where one is named."""
    path = steps_file(args.out, k)
    path.unlink(missing_ok=True)  # an earlier, cut run's steps are not this server's
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(STEP_TIMES_PLUGIN)]))
    env[STEP_TIMES_ENV] = str(path)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return subprocess.Popen([sys.executable, str(FULLSIZE_SERVE), *serve_argv(args, k, deadline_s),
                             "--port", str(port)], env=env)


def run_waves(args, pending: list, gpus: list, t0: float) -> int:
    """The pending servers, as many at once as GPUs are named (each on its own); 3 when the
    time left is under a server's before a wave starts, else 0."""
    while pending:
        left = args.deadline_s - (time.monotonic() - t0)
        if left < SERVER_S:
            print(f"{sm.server_label(pending[0])}: {left:.0f} s left, under a server's {SERVER_S}: run again", flush=True)
            return 3
        wave, pending = pending[:len(gpus)], pending[len(gpus):]
        procs = [start_server(args, k, min(left, 2 * SERVER_S), gpu, PORT + i)
                 for i, (k, gpu) in enumerate(zip(wave, gpus))]
        for proc in procs:
            proc.wait()
    return 0


def run_pending(args, gpus: list, t0: float) -> int:
    """The servers not yet measured, in waves; then, time allowing, once more those that did not
    measure (a server can miss its start limit on a busy host: the K 3 server was cut at 427 s
    once and ready after 431 s the next time). run_waves' code."""
    pending = [k for k in (None, *sm.KS) if not measured(args.out, k)]
    code = run_waves(args, pending, gpus, t0)
    retry = [k for k in pending if not measured(args.out, k)]
    if code == 0 and retry:
        print(f"not measured: {', '.join(map(sm.server_label, retry))}; started once more", flush=True)
        code = run_waves(args, retry, gpus, t0)
    return code


def meta(args) -> dict:
    gpu = args.gpu_file.read_text().strip() if args.gpu_file and args.gpu_file.is_file() else None
    return {"series": args.series_hash, "date": time.strftime("%Y-%m-%d", time.gmtime()), "gpu": gpu,
            "vllm": args.vllm, "bars": bars.blob_hash(), "profile": sm.PROFILE,
            # servers at once, one a GPU of one host (1: one after another)
            "servers_at_once": len(args.gpus.split(",")) if args.gpus else 1,
            "checkpoint": Path(args.model).name, "emulation": fullsize_serve.EMULATION,
            # every server's --set beyond the profile (a context the profile did not start with)
            "set": list(args.set),
            "command": args.command}


def build(args) -> dict:
    verify = {k: read_steps(steps_file(args.out, k)) for k in sm.KS}
    return sm.frozen_record(read_steps(steps_file(args.out, None)), verify, meta=meta(args))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the servers' records and step files")
    parser.add_argument("--json", type=Path, required=True, help="where speedup-frozen.json is written")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--drafter", type=Path, required=True)
    parser.add_argument("--launcher", required=True, help="as fullsize_serve.py --launcher")
    parser.add_argument("--recipe", default="gemma4-moe-dflash")
    parser.add_argument("--series-hash", required=True)
    parser.add_argument("--vllm", required=True, help="the served vLLM release")
    parser.add_argument("--gpu-file", type=Path, help="nvidia-smi's name, memory, driver line")
    parser.add_argument("--vllm-arg", action="append", default=[])
    parser.add_argument("--set", action="append", default=[], help="extra --set for every server's launcher")
    parser.add_argument("--deadline-s", type=float, default=3600)
    parser.add_argument("--command", default="bash tests/gpu/remote.sh speedup-frozen")
    parser.add_argument("--gpus", help="GPUs of this host (e.g. 0,1): that many servers at once, one a GPU")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    code = run_pending(args, args.gpus.split(",") if args.gpus else [None], t0)
    if code:
        return code
    record = build(args)
    gaps = sm.missing(record)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.json}" + (f"; missing: {', '.join(gaps)}" if gaps else ""), flush=True)
    return 1 if gaps else 0


if __name__ == "__main__":
    sys.exit(main())
