"""One ``launcher serve`` run of a recipe profile inside an emulated card's memory, benchmarked (issue 27).

**An emulation.** The test GPU is a Hopper (sm_90) H100/H200: vLLM runs the
NVFP4 experts on Marlin there (weight-only FP4), not the sm_120/sm_121
CUTLASS/FlashInfer FP4 kernels; FLASH_ATTN is FA3 unless FA2 is forced
(``--vllm-arg`` below); the sampler is PyTorch's (the bundle carries no
FlashInfer). Memory is what the card would have: ``memfit.py`` explains the
cap and which vLLM 0.21.0 checks it satisfies.

What one run does, each step bounded by ``--deadline-s``:

1. ``mem_blocker.py`` starts, learns the GPU's total and holds everything but
   the card's total (``memfit.CARDS``);
2. the launcher starts the server: ``--launcher`` (the command line up to
   the options this script adds: the served branch's ``serve --test-gpu``, or
   on a launcher without it ``serve --force`` with the FP4 knobs ``--set`` to
   marlin) ``--recipe R --profile P --model M --port N --set
   serve.gpu_memory_utilization=<scaled>`` plus ``--drafter D`` or ``--set
   drafter=null``, then ``--`` and the ``--vllm-arg`` items; environment:
   ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` removed, and with
   ``--debug-log`` ``VLLM_LOGGING_LEVEL=DEBUG`` (the worker's own split of
   activation and non-torch memory is a DEBUG line; speed runs leave it off);
3. once ``/health`` answers: ``/metrics`` is read, ``launcher bench`` runs the
   recipe's random workload (1024 tokens in, 256 out, ``ignore_eos``) at
   ``--concurrency`` (``max`` = the profile's ``max_num_seqs``) through a copy
   of the recipe whose ``bench:`` names those levels, ``/metrics`` is polled
   every 2 s (KV cache usage, running and waiting requests) and read again;
   ``nvidia-smi`` is polled every second from step 1 on;
4. the server and the blocker are stopped; the log is parsed; the record
   ``<label>.json`` is written (also after a failure, with what is known).

``python tests/gpu/runs/fullsize_serve.py --label L --out DIR --profile P --recipe R --launcher CMD --model M
[--drafter D | --no-drafter] [--concurrency 1,4,16,max] [--vllm-arg ARG]... [--deadline-s S]``
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # tests/gpu
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)

import memfit  # noqa: E402

GIB = 1 << 30
EMULATION = ("emulation on a Hopper (sm_90) test GPU: Marlin NVFP4 MoE and bf16 GEMMs instead of the sm_12x "
             "FP4 kernels, PyTorch sampler; memory capped to the card's reported total by a blocker process "
             "and a scaled gpu_memory_utilization (tests/gpu/judging/memfit.py)")
STOP_GRACE_S = 30


def now() -> float:
    return time.monotonic()


class Poller(threading.Thread):
    """Calls ``fn`` every ``period`` seconds until stopped; keeps the maxima of what it returns.
    (``Thread`` has a ``_stop`` of its own: the event is ``_halt``.)"""

    def __init__(self, fn, period: float):
        super().__init__(daemon=True)
        self.fn, self.period = fn, period
        self.peaks: dict[str, float] = {}
        self.samples = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                for k, v in (self.fn() or {}).items():
                    self.peaks[k] = max(self.peaks.get(k, v), v)
                self.samples += 1
            except Exception:  # noqa: BLE001 - a poll that fails once is skipped, not fatal
                pass
            self._halt.wait(self.period)

    def stop(self) -> dict:
        self._halt.set()
        self.join(timeout=5)
        return {**self.peaks, "samples": self.samples}


def gpu_used_bytes() -> dict[str, float]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True, timeout=10, check=False).stdout.strip().splitlines()
    return {"gpu_used_bytes": float(out[0]) * (1 << 20)} if out else {}


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (OSError, ValueError):
        return 0, ""


def metrics_gauges(base: str) -> dict[str, float]:
    status, text = http_get(f"{base}/metrics")
    return memfit.parse_gauges(text) if status == 200 else {}


def metrics_counters(base: str) -> dict[str, float] | None:
    """None when /metrics does not answer: zeros would read as "no preemption"."""
    status, text = http_get(f"{base}/metrics")
    return memfit.parse_metrics(text) if status == 200 else None


def served_release() -> str | None:
    """The vLLM release this process would serve (the one on its path), without importing it."""
    from importlib import metadata

    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def start_by(args, deadline: float) -> float:
    """When waiting for the server ends: the deadline less the bench's reserve, or sooner where a
    start limit is given. (A fixed 420 s limit once cut a 0.33.0 drafter server ready after 431 s.)"""
    end = deadline - args.bench_reserve_s
    return end if args.start_timeout_s is None else min(end, now() + args.start_timeout_s)


def profile_settings(recipe: str, profile: str, release: str | None = None) -> dict:
    """The profile's serve values and the recipe file (the launcher's own reading of it), with the
    profile's ``serve_since`` entry for ``release`` over them, as the plan applies it."""
    from launcher import recipe as recipes

    rec = recipes.load(recipe)
    serve = rec.profiles[profile].serve.model_dump()
    since = rec.serve_since(profile, release) if release else None
    if since:
        serve.update(since[1])
    out = {"path": str(recipes.available().get(recipe, recipe))}
    for key in ("gpu_memory_utilization", "max_num_seqs", "max_model_len", "max_num_batched_tokens"):
        out[key] = serve.get(key) or getattr(rec.serve, key)
    if since:
        out["serve_since"] = since[0]
    return out


def keep_earlier(out: Path, label: str, settings: dict, extra_sets: list) -> Path | None:
    """Move an earlier record of ``label`` run with other settings (a profile being corrected) into
    ``out/attempts/<label>-<n>.*``, where the report lists it; the same settings are just replaced."""
    earlier = out / f"{label}.json"
    if not earlier.is_file():
        return None
    rec = json.loads(earlier.read_text())
    if rec.get("profile_settings") == settings and (rec.get("extra_sets") or []) == extra_sets:
        return None
    (out / "attempts").mkdir(exist_ok=True)
    n = 1 + sum(1 for _ in (out / "attempts").glob(f"{label}-*.json") if ".bench." not in _.name)
    stem = out / "attempts" / f"{label}-{n}"
    for suffix in (".json", ".bench.json", ".server-excerpt.log"):
        if (out / f"{label}{suffix}").is_file():
            (out / f"{label}{suffix}").rename(stem.with_name(stem.name + suffix))
    return stem.with_name(stem.name + ".json")


def bench_recipe(path: str, concurrency: list, out: Path) -> Path:
    """A copy of the recipe whose bench runs only the random workload, at ``concurrency``."""
    import yaml

    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    random_wl = next(w for w in data["bench"]["workloads"] if w.get("dataset") == "random")
    data["bench"]["workloads"] = [{**random_wl, "concurrency": list(concurrency)}]
    target = out / f"{data['name']}-bench.yaml"
    # Servers of one host may write it at once (speedup_frozen --gpus): each sees a whole file
    part = target.with_suffix(f".{os.getpid()}.part")
    part.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    os.replace(part, target)
    return target


def parse_concurrency(text: str) -> list:
    return [c if c == "max" else int(c) for c in text.split(",") if c]


def server_argv(args, fraction: float) -> list[str]:
    argv = shlex.split(args.launcher) + ["--recipe", args.recipe, "--profile", args.profile,
                                         "--model", str(args.model), "--port", str(args.port),
                                         "--set", f"serve.gpu_memory_utilization={fraction}"]
    argv += ["--set", "drafter=null"] if args.no_drafter else ["--drafter", str(args.drafter)]
    for item in args.set:
        argv += ["--set", item]
    if args.vllm_arg:
        argv += ["--", *args.vllm_arg]
    return argv


def server_env(debug: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", None)  # graph memory stays in the KV sizing
    if debug:
        env["VLLM_LOGGING_LEVEL"] = "DEBUG"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def stop_group(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


def wait_healthy(base: str, proc: subprocess.Popen, until: float) -> str:
    while now() < until:
        if proc.poll() is not None:
            return f"exited with code {proc.returncode} before it was ready"
        if http_get(f"{base}/health")[0] == 200:
            return ""
        time.sleep(2)
    return "not ready before the deadline"


def read_json_lines(stream, count: int, until: float) -> list[dict]:
    lines = []
    while len(lines) < count and now() < until:
        line = stream.readline()
        if not line:
            break
        try:
            lines.append(json.loads(line))
        except ValueError:
            continue
    return lines


def bench_summary(doc: dict | None) -> dict:
    """Per concurrency: the numbers issue 27's table wants."""
    out = {}
    for r in (doc or {}).get("runs", []):
        out[str(r["concurrency"])] = {
            "output_tok_s": r.get("output_throughput"), "ttft_ms": r.get("mean_ttft_ms"),
            "tpot_ms": r.get("mean_tpot_ms"), "successful": r.get("completed"), "failed": r.get("failed"),
            "requests": r.get("num_prompts"), "p99_tpot_ms": r.get("p99_tpot_ms"),
            "acceptance_length": (r.get("spec_decode") or {}).get("mean_acceptance_length")}
    return out


def run(args) -> dict:
    t0 = now()
    deadline = t0 + args.deadline_s
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    card = memfit.CARDS[args.card or args.profile]
    settings = profile_settings(args.recipe, args.profile, served_release())
    record: dict = {"label": args.label, "emulation": EMULATION, "recipe": args.recipe, "profile": args.profile,
                    "drafter": None if args.no_drafter else str(args.drafter), "profile_settings": settings,
                    "extra_sets": list(args.set), "series": args.series_hash,
                    "started": False, "fits": False, "why": []}
    kept = keep_earlier(out, args.label, settings, list(args.set))
    if kept:
        print(f"kept the earlier {args.label} (other settings) as {kept}", flush=True)
    blocker = server = None
    gpu_poll = Poller(gpu_used_bytes, 1.0)
    log_path = out / f"{args.label}.server.log"
    try:
        blocker = subprocess.Popen(shlex.split(args.blocker) + ["--leave-free", str(card.total_bytes)],
                                   stdout=subprocess.PIPE, text=True, start_new_session=True)
        events = read_json_lines(blocker.stdout, 2, min(deadline, now() + 120))
        if len(events) < 2:
            raise RuntimeError(f"the memory blocker did not report ({events})")
        start, holding = events
        record["plan"] = memfit.plan(card, settings["gpu_memory_utilization"], start["total"])
        record["blocker"] = {"held_bytes": holding["held"], "free_after_bytes": holding["free"],
                             "device": start["device"]}
        gpu_poll.start()
        time.sleep(1.5)
        try:
            used_before_server = gpu_used_bytes().get("gpu_used_bytes")
        except (OSError, subprocess.SubprocessError):
            used_before_server = None  # no nvidia-smi: no peak; the rest of the record stands
        record["blocker"]["gpu_used_before_server_bytes"] = used_before_server
        argv = server_argv(args, record["plan"]["scaled_fraction"])
        record["server_argv"] = argv
        print("starting: " + shlex.join(argv), flush=True)
        with open(log_path, "w") as log:
            server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=server_env(args.debug_log),
                                      cwd=REPO,
                                      start_new_session=True)
        base = f"http://127.0.0.1:{args.port}"
        problem = wait_healthy(base, server, start_by(args, deadline))
        record["start_s"] = round(now() - t0, 1)
        if problem:
            record["why"].append(f"server {problem}")
            return record
        record["started"] = True
        print(f"server ready after {record['start_s']} s", flush=True)
        before = metrics_counters(base)
        gauges = Poller(lambda: metrics_gauges(base), 2.0)
        gauges.start()
        recipe_copy = bench_recipe(settings["path"], parse_concurrency(args.concurrency), out)
        bench_out = out / f"{args.label}.bench.json"
        bench_out.unlink(missing_ok=True)  # an earlier run's rows must not pass for this one's
        bench_argv = [sys.executable, "-m", "launcher", "bench", "--recipe", str(recipe_copy), "--url", base,
                      "--profile", args.profile, "--client", "builtin", "--out", str(bench_out),
                      "--timeout", str(args.request_timeout_s)]
        if args.min_requests:
            bench_argv += ["--min-requests", str(args.min_requests)]
        remaining = deadline - now() - STOP_GRACE_S - 15
        try:
            subprocess.run(bench_argv, cwd=REPO, env={**os.environ, "PYTHONPATH": server_env()["PYTHONPATH"]},
                           timeout=max(remaining, 10), check=False)
        except subprocess.TimeoutExpired:
            record["why"].append("bench cut at the deadline")
        record["metrics_peaks"] = gauges.stop()
        after = metrics_counters(base)
        record["metrics_delta"] = memfit.counter_delta(before, after) if before and after else None
        bench_doc = json.loads(bench_out.read_text()) if bench_out.exists() else None
        record["bench"] = bench_summary(bench_doc)
        return record
    except Exception as exc:  # noqa: BLE001 - the record says what failed
        record["why"].append(f"{type(exc).__name__}: {exc}")
        return record
    finally:
        stop_group(server)
        stop_group(blocker)
        peaks = gpu_poll.stop() if gpu_poll.is_alive() else {}
        _finish(record, log_path, peaks, card)
        record["seconds"] = round(now() - t0, 1)
        (out / f"{args.label}.json").write_text(json.dumps(record, indent=1) + "\n")


def excerpt(log_path: Path, head: int = 3000, tail: int = 300, max_line: int = 2000) -> Path | None:
    """The log's start (where vLLM reports memory) and end (errors), for the results archive: a
    DEBUG log of a whole run can exceed what a transfer from the host should bring back."""
    if not log_path.exists():
        return None
    lines = log_path.read_text(errors="replace").splitlines()
    keep = lines if len(lines) <= head + tail else [*lines[:head], f"[... {len(lines) - head - tail} lines ...]",
                                                    *lines[-tail:]]
    out = log_path.with_name(log_path.name.replace(".server.log", ".server-excerpt.log"))
    out.write_text("\n".join(line[:max_line] for line in keep) + "\n")
    return out


def _finish(record: dict, log_path: Path, peaks: dict, card: memfit.Card) -> None:
    log = memfit.parse_log(log_path.read_text(errors="replace")) if log_path.exists() else {}
    excerpt(log_path)
    record["log"] = log
    plan = record.get("plan") or {}
    if plan:
        record["derived"] = memfit.derived(log, plan["requested_on_device_gib"])
    used_before = (record.get("blocker") or {}).get("gpu_used_before_server_bytes")
    if peaks.get("gpu_used_bytes") and used_before:
        server_peak = peaks["gpu_used_bytes"] - used_before
        record["gpu_peak"] = {"server_gib": round(server_peak / GIB, 3),
                              "card_headroom_gib": round((card.total_bytes - server_peak) / GIB, 3),
                              "samples": peaks.get("samples")}
    settings = record["profile_settings"]
    delta = record.get("metrics_delta")
    preemptions = None if delta is None else delta.get("preemptions")
    bench = {"runs": [{"concurrency": int(c), "completed": v["successful"], "failed": v["failed"],
                       "num_prompts": v["requests"]} for c, v in (record.get("bench") or {}).items()]}
    fits, why = memfit.verdict(started=record["started"], bench=bench, max_num_seqs=settings["max_num_seqs"],
                               preemptions=preemptions, oom="cuda_oom" in log.get("failures", []))
    record["fits"] = fits
    record["why"] = record["why"] + [w for w in why if w not in record["why"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--profile", required=True, choices=sorted(memfit.CARDS))
    parser.add_argument("--card", choices=sorted(memfit.CARDS), help="card to emulate (default: the profile's)")
    parser.add_argument("--recipe", default="gemma4-moe-dflash")
    parser.add_argument("--launcher", required=True,
                        help="launcher command up to the options added here, e.g. 'python3 -m launcher serve --test-gpu'")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--drafter", type=Path)
    parser.add_argument("--no-drafter", action="store_true")
    parser.add_argument("--set", action="append", default=[], help="extra --set for the launcher")
    parser.add_argument("--vllm-arg", action="append", default=[], help="extra vLLM argument (after --)")
    parser.add_argument("--series-hash", help="the patched site's series hash (remote.sh series_hash)")
    parser.add_argument("--concurrency", default="max")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--deadline-s", type=float, default=540)
    parser.add_argument("--start-timeout-s", type=float, default=None,
                        help="a start limit of its own (default: the deadline less the bench's reserve)")
    parser.add_argument("--bench-reserve-s", type=float, default=60, help="time kept for the bench after start")
    parser.add_argument("--request-timeout-s", type=float, default=300)
    parser.add_argument("--min-requests", type=int, help="launcher bench --min-requests: requests a level at least")
    parser.add_argument("--debug-log", action="store_true",
                        help="VLLM_LOGGING_LEVEL=DEBUG: the worker's activation / non-torch split (fit runs; "
                             "left off where speed is measured)")
    parser.add_argument("--blocker", default=shlex.join([sys.executable, str(HERE / "runs" / "mem_blocker.py")]),
                        help="command that holds the memory (tests replace it)")
    args = parser.parse_args(argv)
    if args.no_drafter == bool(args.drafter):
        parser.error("give --drafter DIR or --no-drafter")
    if "--" in shlex.split(args.launcher):
        parser.error("--launcher must not contain '--': pass vLLM arguments with --vllm-arg")
    record = run(args)
    print(json.dumps({k: record.get(k) for k in ("label", "started", "fits", "why", "start_s", "seconds")}))
    for c, row in (record.get("bench") or {}).items():
        print(f"  c={c}: {row}")
    return 0 if record["started"] else 1


if __name__ == "__main__":
    sys.exit(main())
