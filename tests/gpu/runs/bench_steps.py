"""Step-time benchmark at Gemma 4 26B-A4B widths through vLLM itself (``make bench-gpu``).

Each entry of ``bench_shapes.RUNS`` is one vLLM engine (``vllm.LLM``, CUDA
graphs and torch.compile on, engine core in-process with
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` so the model runner can be timed) in a
subprocess of its own. Engine starts are the expensive part (torch.compile
and graph capture, 1-2 minutes each), so up to ``--parallel`` engines start
side by side (their KV caches are sized explicitly, so none runs vLLM's
free-memory profile), while the GPU is lent to one engine at a time for its
measurements: the parent stops every other engine's process group
(SIGSTOP) while one measures and resumes them after (SIGCONT), so no
compile or capture competes for CPU or GPU during a measurement.

What one engine measures (``child``), in order, writing its record after
each phase so that a cut call keeps what finished:

* ``decode-b{B}`` / ``verify-b{B}`` for B in 1, 4, 16, 32: B prompts of 64
  tokens; a call with max_tokens 1 (fills the prefix cache), a short warm-up
  call (``WALL_SHORT_TOKENS``; kernels compiled on first use), a long call
  and the short call again, all then equally served by the prefix cache; the
  long call is timed step by step with CUDA events (bench_report.py says
  which events and how they become step times); the difference of the long
  and the second short wall time over their difference in engine steps is
  the wall-clock time per step;
* ``ctx-{2k,16k,64k}`` (decode engines with ``contexts``): one prompt that
  long, batch 1, 64 greedy tokens with raw top-2 logits: the per-layer
  backend comparison and its lossless record (with ``lossless-short``:
  eight shorter prompts, untimed, batched and again one at a time, the
  engine against itself: the comparison's noise floor);
* ``profile`` (engines with ``profile``): torch.profiler over 8 steady steps
  at batch 1 and 16, kernel times by name (the breakdown).

The parent writes ``bench.json`` and ``bench.md`` (bench_report.py) after
every finished engine. ``--deadline-s`` bounds the whole run: no engine
starts when too little time is left, and all are stopped at the deadline.

``python tests/gpu/runs/bench_steps.py --models DIR --site SITE --out DIR [--runs a,b] [--deadline-s S]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # tests/gpu
sys.path.insert(0, str(HERE))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)

import bench_report  # noqa: E402
import bench_shapes as bs  # noqa: E402

START_TIMEOUT_S = 300  # engine start, excluding time stopped
MEASURE_TIMEOUT_S = 150
MIN_TIME_FOR_A_RUN_S = 120
GIB = 1 << 30


# ===================================================================== child


def _prompts(count: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    lo, hi = bs.PROMPT_TOKEN_RANGE
    return [[rng.randrange(lo, hi) for _ in range(length)] for _ in range(count)]


def _runner(llm):
    core = llm.llm_engine.engine_core.engine_core
    return core.model_executor.driver_worker.worker.model_runner


def _backends(llm) -> dict:
    """Attention backend (and FlashAttention version) of every target and drafter layer."""
    runner = _runner(llm)
    drafter = getattr(runner, "drafter", None)
    draft_names = set(getattr(drafter, "_draft_attn_layer_names", set()) or set())
    out: dict = {"target": {}, "drafter": {}}
    for name, layer in runner.vllm_config.compilation_config.static_forward_context.items():
        backend = getattr(layer, "attn_backend", None)
        if backend is None:
            continue
        fa = getattr(getattr(layer, "impl", None), "vllm_flash_attn_version", None)
        label = backend.get_name() + (f"/FA{fa}" if fa else "")
        out["drafter" if name in draft_names else "target"][name] = label
    return out


def _summary(backends: dict) -> dict:
    return {side: {b: list(layers.values()).count(b) for b in sorted(set(layers.values()))}
            for side, layers in backends.items()}


class StepTimer:
    """CUDA events around the runner's step functions (see bench_report.py).

    Counts engine steps always; records events only while ``active``.
    ``profiler.step()`` is called at each step entry when a profiler is set.

    Both runners vLLM ships are covered: V1's ``GPUModelRunner`` (0.21.0: ``_model_forward``
    and ``drafter.propose``) and V2's (0.33.0, ``vllm/v1/worker/gpu``: no ``_model_forward``,
    ``speculator.propose``). A step's token count is the scheduler's
    (``total_num_scheduled_tokens``) unless the forward span says it.

    ``sink``: streaming mode for a server's engine core, where nothing may synchronise the
    device: finished steps whose end event has completed are resolved every ``FLUSH_EVERY``
    steps and handed to ``sink`` (a list of records), the rest stay queued.
    """

    FLUSH_EVERY = 32

    def __init__(self, torch, runner, sink=None):
        self.torch, self.runner, self.sink = torch, runner, sink
        self.active, self.profiler = False, None
        self.steps: list[dict] = []
        self.calls = 0
        self._wrap(runner, "execute_model", self._on_step_start, None)
        self._wrap(runner, "sample_tokens", None, self._on_step_end)
        if hasattr(runner, "_model_forward"):
            self._wrap(runner, "_model_forward", *self._span("forward", count_tokens=True), label="forward")
        if hasattr(runner.model, "compute_logits"):
            self._wrap(runner.model, "compute_logits", *self._span("logits"), label="logits")
        proposer = getattr(runner, "drafter", None) or getattr(runner, "speculator", None)
        if proposer is not None and hasattr(proposer, "propose"):
            self._wrap(proposer, "propose", *self._span("propose"), label="propose")

    def _event(self):
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def _wrap(self, obj, name: str, before, after, label: str | None = None) -> None:
        """Replace ``obj.name``; under a profiler, its kernels are grouped as ``bench::label``."""
        original = getattr(obj, name)

        def wrapped(*args, **kwargs):
            token = before(args, kwargs) if before else None
            try:
                if label and self.profiler is not None:
                    with self.torch.profiler.record_function(f"bench::{label}"):
                        return original(*args, **kwargs)
                return original(*args, **kwargs)
            finally:
                if after:
                    after(token)

        setattr(obj, name, wrapped)

    def _span(self, key: str, count_tokens: bool = False):
        def before(args, kwargs):
            if not (self.active and self.steps):
                return None
            if count_tokens:
                x = kwargs.get("input_ids")
                x = kwargs.get("inputs_embeds") if x is None else x
                x = kwargs.get("positions") if x is None else x
                self.steps[-1]["forward_tokens"] = int(x.shape[-1] if x.dim() == 1 else x.shape[0])
            return self._event()

        def after(start):
            if start is not None:
                self.steps[-1].setdefault("_spans", []).append((key, start, self._event()))
        return before, after

    def _on_step_start(self, args, kwargs):
        self.calls += 1
        if self.profiler is not None:
            self.profiler.step()
        if self.sink is not None and len(self.steps) > self.FLUSH_EVERY:
            self.flush()
        if self.active:
            step = {"_start": self._event()}
            if self.sink is not None:
                step["t"] = time.time()  # a server's steps: which level a step belongs to, by time
            tokens = scheduled_tokens(args[0] if args else kwargs.get("scheduler_output"))
            if tokens is not None:
                step["forward_tokens"] = tokens
            self.steps.append(step)

    def _on_step_end(self, _token):
        if self.active and self.steps and "_end" not in self.steps[-1]:
            self.steps[-1]["_end"] = self._event()

    def collect(self) -> list[dict]:
        """Resolve the recorded events (one synchronisation, after the run)."""
        self.torch.cuda.synchronize()
        out = [self._resolve(s) for s in self.steps if "_end" in s]
        self.steps = []
        return out

    def flush(self) -> None:
        """Streaming mode: hand the finished steps whose events completed to the sink, without
        synchronising. The newest step stays: its spans may still be appended."""
        done = 0
        for s in self.steps[:-1]:
            if "_end" in s and not s["_end"].query():
                break
            done += 1
        ready, self.steps = self.steps[:done], self.steps[done:]
        records = [self._resolve(s) for s in ready if "_end" in s]
        if records:
            self.sink(records)

    @staticmethod
    def _resolve(s: dict) -> dict:
        rec = {"step_ms": s["_start"].elapsed_time(s["_end"]), "forward_tokens": s.get("forward_tokens")}
        for key, a, b in s.get("_spans", []):
            rec[f"{key}_ms"] = rec.get(f"{key}_ms", 0.0) + a.elapsed_time(b)
        if "t" in s:
            rec["t"] = s["t"]
        return {k: (round(v, 4) if isinstance(v, float) and k != "t" else v) for k, v in rec.items()}


def scheduled_tokens(scheduler_output) -> int | None:
    """The tokens a step forwards, as the scheduler handed them to the runner (both runners)."""
    n = getattr(scheduler_output, "total_num_scheduled_tokens", None)
    return int(n) if isinstance(n, int) else None


def _output(prompt: list[int], out) -> dict:
    comp = out.outputs[0]
    top = [[[int(t), float(lp.logprob), int(lp.rank)] for t, lp in sorted(pos.items(), key=lambda kv: kv[1].rank)]
           for pos in (comp.logprobs or [])]
    return {"prompt_len": len(prompt), "token_ids": list(comp.token_ids), "top": top}


def _timed_phase(llm, timer, SamplingParams, prompts, max_tokens: int, *, logprobs: int | None = None) -> dict:
    """Warm-up, short and long generate calls; the long one timed step by step."""
    inputs = [{"prompt_token_ids": p} for p in prompts]

    def params(n):
        return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False, logprobs=logprobs)

    llm.generate(inputs, params(1), use_tqdm=False)
    walls, outs = {}, None
    # The first short call only warms up (kernels compiled on first use); the second is timed.
    for label, n in (("warm", bs.WALL_SHORT_TOKENS), ("long", max_tokens), ("short", bs.WALL_SHORT_TOKENS)):
        timer.active = label == "long"
        calls, t0 = timer.calls, time.perf_counter()
        result = llm.generate(inputs, params(n), use_tqdm=False)
        walls[label] = (time.perf_counter() - t0, timer.calls - calls)
        timer.active = False
        outs = result if label == "long" else outs
    steps = timer.collect()
    generated = [len(o.outputs[0].token_ids) for o in outs]
    phase = {"batch": len(prompts), "prompt_len": len(prompts[0]), "max_tokens": max_tokens, "steps": steps,
             "wall_long_s": round(walls["long"][0], 5), "steps_long": walls["long"][1],
             "wall_short_s": round(walls["short"][0], 5), "steps_short": walls["short"][1],
             "generated_per_seq": generated}
    if walls["long"][1] > 1:
        # The first step is the prompt's; each later step adds tokens_per_step per sequence.
        phase["tokens_per_step"] = round((min(generated) - 1) / (walls["long"][1] - 1), 3)
    if logprobs:
        phase["outputs"] = [_output(p, o) for p, o in zip(prompts, outs)]
    return phase


def _kernel_rows(totals: dict[str, list[float]]) -> list[list]:
    return sorted(([name, round(us, 2), int(n)] for name, (us, n) in totals.items()), key=lambda r: -r[1])


def _kernels_under(evt, totals: dict[str, list[float]]) -> None:
    """Every device kernel launched inside a CPU range (its ops and runtime calls, recursively)."""
    for k in getattr(evt, "kernels", []) or []:
        row = totals.setdefault(k.name, [0.0, 0])
        row[0] += float(k.duration)
        row[1] += 1
    for child in getattr(evt, "cpu_children", []) or []:
        _kernels_under(child, totals)


def group_by_device_ranges(events: list[tuple[str, float, float]]) -> dict[str, dict[str, list[float]]]:
    """Kernels (name, start, end on the device clock) grouped by the ``bench::`` range
    they ran in, the innermost one where ranges nest.

    The ranges are the profiler's device-side copies of our ``record_function``
    spans. Kernels replayed from a CUDA graph have no CPU parent op to follow,
    but they do run inside those device-side spans."""
    ranges = sorted(((n.removeprefix("bench::"), a, b) for n, a, b in events if n.startswith("bench::")),
                    key=lambda r: r[2] - r[1])
    totals: dict[str, dict[str, list[float]]] = {}
    for name, start, end in events:
        if name.startswith(("bench::", "ProfilerStep")):
            continue
        label = next((r for r, a, b in ranges if a <= start < b), None)
        if label is None:
            continue
        row = totals.setdefault(label, {}).setdefault(name, [0.0, 0])
        row[0] += end - start
        row[1] += 1
    return totals


def _profile_phase(torch, llm, timer, SamplingParams, prompts) -> dict:
    """Kernel times (name, total us, calls) over 8 steady steps: all of them, and those
    inside each timed range (``bench::forward``, ``bench::logits``, ``bench::propose``)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, schedule

    got: dict = {}

    def ready(prof):
        rows = []
        for evt in prof.key_averages():
            us = getattr(evt, "self_device_time_total", None) or getattr(evt, "self_cuda_time_total", 0)
            if us and getattr(evt, "device_type", None) == DeviceType.CUDA:
                rows.append([evt.key, round(float(us), 2), int(evt.count)])
        got["kernels"] = sorted(rows, key=lambda r: -r[1])
        device = [(e.name, float(e.time_range.start), float(e.time_range.end)) for e in prof.events()
                  if getattr(e, "device_type", None) == DeviceType.CUDA]
        ranges = group_by_device_ranges(device)
        got["range_grouping"] = "device-time"
        if not ranges:  # no device-side ranges: follow each CPU range's ops to their kernels
            got["range_grouping"] = "cpu-tree"
            for evt in prof.events():
                if evt.name.startswith("bench::"):
                    _kernels_under(evt, ranges.setdefault(evt.name.removeprefix("bench::"), {}))
        got["ranges"] = {k: _kernel_rows(v) for k, v in ranges.items()}

    active = 8
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 schedule=schedule(wait=3, warmup=2, active=active, repeat=1), on_trace_ready=ready) as prof:
        timer.profiler = prof
        try:
            params = SamplingParams(temperature=0.0, max_tokens=3 + 2 + active + 4, ignore_eos=True, detokenize=False)
            llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        finally:
            timer.profiler = None
    return {"steps": active if got else 0, "kernels": got.get("kernels", []), "ranges": got.get("ranges", {}),
            "range_grouping": got.get("range_grouping")}


def _write(path: Path, record: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record) + "\n")
    tmp.replace(path)


def _wait_for_go(control: Path, name: str) -> None:
    (control / f"{name}.ready").touch()
    while not (control / f"{name}.go").exists():
        time.sleep(0.2)


def measure(llm, run: bs.EngineRun, record: dict, out: Path) -> None:
    import torch
    from vllm import SamplingParams

    timer = StepTimer(torch, _runner(llm))
    kind = "verify" if run.drafter else "decode"
    tokens = bs.VERIFY_TOKENS if run.drafter else bs.DECODE_TOKENS
    for i, b in enumerate(bs.BATCHES):
        phase = _timed_phase(llm, timer, SamplingParams, _prompts(b, bs.DECODE_PROMPT_LEN, 100 + i), tokens)
        phase["forward_tokens"] = b * (1 + run.spec_tokens)
        record["phases"][f"{kind}-b{b}"] = phase
        _write(out, record)
    if run.contexts:
        _optional(record, out, "contexts", lambda: _contexts(llm, timer, SamplingParams, record, out))
    if run.profile:
        _optional(record, out, "profile", lambda: _profiles(torch, llm, timer, SamplingParams, kind, record, out))


def _optional(record: dict, out: Path, what: str, fn) -> None:
    """A failure here is recorded and the engine's step times still count."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc()
        record.setdefault("errors", {})[what] = f"{type(exc).__name__}: {exc}"
        _write(out, record)


def _contexts(llm, timer, SamplingParams, record: dict, out: Path) -> None:
    """Batch 1 at 2k/16k/64k tokens of context, and eight shorter prompts: raw top-2 logits."""
    for i, (label, n) in enumerate(bs.CONTEXTS.items()):
        prompt = _prompts(1, n - bs.CONTEXT_DECODE_TOKENS, 200 + i)
        phase = _timed_phase(llm, timer, SamplingParams, prompt, bs.CONTEXT_DECODE_TOKENS, logprobs=2)
        phase["forward_tokens"] = 1
        record["phases"][f"ctx-{label}"] = phase
        _write(out, record)
    rng = random.Random(300)
    short = [_prompts(1, rng.randrange(50, 1500), 300 + j)[0] for j in range(8)]
    params = SamplingParams(temperature=0.0, max_tokens=bs.CONTEXT_DECODE_TOKENS, ignore_eos=True,
                            detokenize=False, logprobs=2)
    outs = llm.generate([{"prompt_token_ids": p} for p in short], params, use_tqdm=False)
    record["phases"]["lossless-short"] = {"outputs": [_output(p, o) for p, o in zip(short, outs)]}
    # The same prompts one at a time: how far the engine moves from itself with another
    # batch shape (the noise floor of the lossless comparison).
    alone = [llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0] for p in short]
    record["phases"]["lossless-short-alone"] = {"outputs": [_output(p, o) for p, o in zip(short, alone)]}
    _write(out, record)


def _profiles(torch, llm, timer, SamplingParams, kind: str, record: dict, out: Path) -> None:
    for b in (1, 16):
        prof = _profile_phase(torch, llm, timer, SamplingParams, _prompts(b, bs.DECODE_PROMPT_LEN, 400 + b))
        record["profile"][f"{kind}-b{b}"] = prof
        _write(out, record)


def child(spec: dict) -> int:
    run = bs.run_by_name(spec["run"])
    out, control = Path(spec["result"]), Path(spec["control"])
    record: dict = {"run": run.name, "ok": False, "spec": run.as_dict(), "phases": {}, "profile": {},
                    "bench_device": spec.get("device"), "series_hash": spec.get("series_hash")}
    t0 = time.time()
    try:
        import torch
        import vllm
        from vllm import LLM

        record.update(vllm=vllm.__version__, device=torch.cuda.get_device_name(0))
        target = Path(spec["models"]) / ("gemma4-bench-nvfp4" if run.target == "nvfp4" else "gemma4-bench-bf16")
        drafter = str(Path(spec["models"]) / "dflash-bench") if run.drafter else None
        kwargs = run.engine_kwargs(str(target), drafter)
        # A copy taken before LLM(): vLLM adds config objects to the
        # speculative_config dict it is given (seen on the H200: "Object of
        # type ModelConfig is not JSON serializable" for every DFlash run).
        record["engine_kwargs"] = json.loads(json.dumps(kwargs, default=str))
        llm = LLM(**kwargs)
        record["init_s"] = round(time.time() - t0, 1)
        record["backends"] = _backends(llm)
        record["backend_summary"] = _summary(record["backends"])
        _write(out, record)
        _wait_for_go(control, run.name)
        t1 = time.time()
        measure(llm, run, record, out)
        record["measure_s"] = round(time.time() - t1, 1)
        record["ok"] = True
    except BaseException as exc:  # noqa: BLE001 - every failure is a result here
        traceback.print_exc()
        record["error"] = f"{type(exc).__name__}: {exc}"
    record["wall_s"] = round(time.time() - t0, 1)
    _write(out, record)
    (control / f"{run.name}.done").touch()
    return 0


# ===================================================================== parent


class Child:
    def __init__(self, run: bs.EngineRun, proc: subprocess.Popen, result: Path, log: Path):
        self.run, self.proc, self.result, self.log = run, proc, result, log
        self.started = time.time()
        self.stopped_s = 0.0
        self._stopped_at: float | None = None
        self.measuring_since: float | None = None

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return
        if sig == signal.SIGSTOP and self._stopped_at is None:
            self._stopped_at = time.time()
        elif sig == signal.SIGCONT and self._stopped_at is not None:
            self.stopped_s += time.time() - self._stopped_at
            self._stopped_at = None

    def running_s(self) -> float:
        paused = self.stopped_s + (time.time() - self._stopped_at if self._stopped_at else 0.0)
        return time.time() - self.started - paused


def _gpu_total_gib() -> float:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
        return float(out.split()[0]) / 1024
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return 80.0


def _device_line() -> str | None:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


class Bench:
    def __init__(self, args):
        self.args = args
        self.out: Path = args.out
        self.control = self.out / "control"
        self.logs = self.out / "logs"
        for d in (self.control, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        self.records: dict[str, dict] = {}
        self.max_running = 0
        self.started = time.time()
        self.meta = {"device": _device_line(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     "command": "bash tests/gpu/remote.sh bench", "series_hash": args.series_hash,
                     "site": args.site}
        self.env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", PYTHONUNBUFFERED="1")
        self.env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        self.env.setdefault("HF_HUB_OFFLINE", "1")
        if args.site:
            self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.site, self.env.get("PYTHONPATH")]))

    def keep_earlier(self, rerun: set[str]) -> None:
        """Take the records of engines an earlier command ran on this host into the report.

        One command cannot start every engine inside a 10-minute command limit,
        yet every ratio must come from one host: a record counts only when
        it names the same GPU and series hash as this command."""
        known = {r.name for r in bs.RUNS}
        for path in sorted(self.out.glob("run-*.json")):
            rec = json.loads(path.read_text())
            name = rec.get("run")
            if name in rerun or name not in known:
                continue
            same = (rec.get("bench_device") == self.meta["device"]
                    and rec.get("series_hash") == self.meta["series_hash"])
            if same and rec.get("ok"):
                self.records[name] = rec
                self.log(f"kept {name} from an earlier call")

    def left_s(self) -> float:
        return self.args.deadline_s - (time.time() - self.started)

    def log(self, msg: str) -> None:
        print(f"[bench {time.time() - self.started:5.0f}s] {msg}", flush=True)

    def start(self, run: bs.EngineRun) -> Child:
        result = self.out / f"run-{run.name}.json"
        log = self.logs / f"{run.name}.log"
        spec = {"run": run.name, "models": str(self.args.models), "result": str(result), "control": str(self.control),
                "device": self.meta["device"], "series_hash": self.meta["series_hash"]}
        cmd = self.child_cmd(spec)
        with log.open("w") as fh:
            proc = subprocess.Popen(cmd, env=self.env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        self.log(f"start {run.name} (pid {proc.pid})")
        return Child(run, proc, result, log)

    def child_cmd(self, spec: dict) -> list[str]:
        return [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]

    def finish(self, c: Child, why: str | None = None) -> None:
        if c.proc.poll() is None:
            c.signal(signal.SIGCONT)
            c.signal(signal.SIGKILL)
            c.proc.wait()
        rec = json.loads(c.result.read_text()) if c.result.exists() else {"run": c.run.name, "ok": False}
        if why:
            rec.update(ok=False, error=rec.get("error") or why)
        rec["log_tail"] = c.log.read_text(errors="replace").splitlines()[-30:] if c.log.exists() else []
        self.records[c.run.name] = rec
        self.log(f"{c.run.name}: {'ok' if rec.get('ok') else 'FAILED ' + str(rec.get('error'))} "
                 f"(init {rec.get('init_s', '-')} s, measure {rec.get('measure_s', '-')} s) "
                 f"backends {rec.get('backend_summary')}")
        for name, phase in (rec.get("phases") or {}).items():
            if phase.get("steps"):
                m = bench_report.phase_ms(phase)
                print(f"    {name:14s} step {m['step_ms']} ms (forward {m['forward_ms']}, logits {m['logits_ms']}, "
                      f"propose {m['propose_ms']}), wall {m['wall_ms']} ms/step, {m['steps']} steps", flush=True)
        self.report()

    def report(self) -> None:
        from compare import verdict

        doc = bench_report.build(self.records, self.meta, verdict)
        doc["meta"]["elapsed_s"] = round(time.time() - self.started, 1)
        (self.out / "bench.json").write_text(json.dumps(doc, indent=1) + "\n")
        (self.out / "bench.md").write_text(bench_report.markdown(doc))

    def fits(self, run: bs.EngineRun, running: list[Child]) -> bool:
        budget = 0.8 * self.args.gpu_gib
        used = sum(c.run.weight_gib + c.run.kv_cache_bytes / GIB + 4 for c in running)
        return used + run.weight_gib + run.kv_cache_bytes / GIB + 4 <= budget

    def loop(self, runs: list[bs.EngineRun]) -> None:
        """Start engines side by side; lend the GPU to one ready engine at a time.

        New engines start only while none measures, and before the next one
        is chosen, so every engine but the measuring one is stopped."""
        self.queue, self.running, self.measuring = list(runs), [], None
        while self.queue or self.running:
            self._reap()
            if self.measuring is None:
                self._start_more()
                self._lend_gpu()
            time.sleep(0.5)

    def _start_more(self) -> None:
        min_left = getattr(self.args, "min_run_s", MIN_TIME_FOR_A_RUN_S)
        while (self.queue and len(self.running) < self.args.parallel and self.left_s() > min_left
               and self.fits(self.queue[0], self.running)):
            self.running.append(self.start(self.queue.pop(0)))
            self.max_running = max(self.max_running, len(self.running))
        if self.queue and not self.running and self.left_s() <= min_left:
            for run in self.queue:
                self.records[run.name] = {"run": run.name, "ok": False,
                                          "error": f"not started: {self.left_s():.0f}s left"}
            self.queue = []
            self.report()

    def _why_stop(self, c: Child) -> str | None:
        if c is not self.measuring and c.running_s() > START_TIMEOUT_S:
            return f"engine start exceeded {START_TIMEOUT_S}s"
        if c is self.measuring and time.time() - c.measuring_since > MEASURE_TIMEOUT_S:
            return f"measurement exceeded {MEASURE_TIMEOUT_S}s"
        return "deadline" if self.left_s() <= 0 else None

    def _reap(self) -> None:
        for c in list(self.running):
            done = (self.control / f"{c.run.name}.done").exists() or c.proc.poll() is not None
            why = None if done else self._why_stop(c)
            if not (done or why):
                continue
            if c is self.measuring:
                self.measuring = None
                for other in self.running:
                    other.signal(signal.SIGCONT)
            self.finish(c, why)
            self.running.remove(c)

    def _lend_gpu(self) -> None:
        ready = [c for c in self.running if (self.control / f"{c.run.name}.ready").exists()]
        if not ready:
            return
        self.measuring = ready[0]
        for other in self.running:
            if other is not self.measuring:
                other.signal(signal.SIGSTOP)
        self.measuring.measuring_since = time.time()
        (self.control / f"{self.measuring.run.name}.go").touch()
        self.log(f"measure {self.measuring.run.name} ({len(self.running) - 1} other engine(s) paused)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--models", type=Path)
    parser.add_argument("--site", help="folder prepended to PYTHONPATH for the vLLM under test")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--runs", help="comma-separated, from " + ",".join(r.name for r in bs.RUNS))
    parser.add_argument("--deadline-s", type=float, default=480.0)
    parser.add_argument("--parallel", type=int, default=None, help="engines starting side by side")
    parser.add_argument("--series-hash", default=None)
    parser.add_argument("--keep-earlier", action="store_true",
                        help="also report the finished records an earlier call left in --out (same device and series)")
    args = parser.parse_args(argv)
    if args.child:
        return child(json.loads(args.child))
    if not (args.models and args.out):
        parser.error("--models and --out are required")
    if not (args.models / "bench-shapes.json").exists():
        parser.error(f"{args.models} has no bench-shapes.json: run make_bench_checkpoints.py first")
    try:
        runs = [bs.run_by_name(n) for n in args.runs.split(",")] if args.runs else list(bs.RUNS)
    except KeyError as exc:
        parser.error(str(exc))
    args.gpu_gib = _gpu_total_gib()
    if args.parallel is None:
        args.parallel = 4  # memory permitting (Bench.fits); more would only share 16 CPU cores thinner
    bench = Bench(args)
    if args.keep_earlier:
        bench.keep_earlier({r.name for r in runs})
    bench.log(f"{len(runs)} engine runs, {args.parallel} starting side by side, deadline {args.deadline_s:.0f}s, "
              f"GPU {args.gpu_gib:.0f} GiB")
    bench.loop(runs)
    bench.report()
    print((args.out / "bench.md").read_text(), flush=True)
    bench.log(f"wrote {args.out / 'bench.json'} and bench.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
