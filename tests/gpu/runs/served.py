"""Issue 26 on the GPU: servers started by `launcher serve`, chat through the `openai` client, `launcher bench`.

Three phases, each its own server on 127.0.0.1, each leaving a raw record in
``--work`` (``<phase>.json``, ``<phase>.log``); every command then re-renders
``served.json`` / ``served.md`` in ``--out`` from all phases present, so the
phases may run in separate commands on one host:

* ``reference``: the recipe without its drafter (``--set drafter=null``), prefix
  caching off, the 22 requests of served_requests.build one at a time, twice
  (a verdict needs both passes to agree);
* ``dflash``: the recipe as is, the same requests at 1, 8 and 22 in flight, the
  drafter's acceptance from ``/metrics`` around them, then ``launcher bench
  --recipe gemma4-moe-dflash`` against the same server;
* ``stock``: unpatched vLLM. The launcher refuses it (the required patches are not
  applied): the refusal is recorded from ``--dry-run --json``, then it is started
  with ``--force`` and the first error (start-up, or the first image request) is
  recorded as ``stock_error``;
* ``bench``: the ``dflash`` server again, for ``launcher bench`` alone, where the
  ``dflash`` phase ran out of time for it (a host may limit a command to 10 minutes).

Every server is `launcher serve --recipe gemma4-moe-dflash --test-gpu ...
--wait`, run by the interpreter that runs this file with ``PYTHONPATH`` = the vLLM
site (the launcher then inspects and starts that vLLM: launcher/vllm_env.py).
The --set items and extra vLLM arguments every server gets are in ``SETS`` and
``EXTRA_ARGS``, each with its reason.

``python tests/gpu/runs/served.py --phases reference,dflash,stock --model M --drafter D
--site-patched P1:P2 --site-stock S --work W --out O`` (``remote.sh served`` wraps it).
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # tests/gpu
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
import gate  # noqa: E402
import seeded  # noqa: E402
import served_report as report  # noqa: E402
import served_requests as sr  # noqa: E402
import speed as speed_mod  # noqa: E402

# The step-time plugin (a vLLM general plugin; its folder on PYTHONPATH installs it) and the
# variable that names its output file.
STEP_TIMES_PLUGIN = HERE / "step_times"
STEP_TIMES_ENV = "VLLM_STEP_TIMES"

RECIPE = "gemma4-moe-dflash"  # the default; --recipe gemma4-moe-dflash-text serves text-only
# Ports above --port-base (8000): each phase its own, so phases may run side by side
# (--parallel), and a second served.py (the other vLLM version) takes another base.
PORT_OFFSETS = {"dflash": 0, "reference": 1, "stock": 2, "bench": 0, "speed-reference": 3, "speed-dflash": 4,
                "conformance": 5, "conformance-twin": 6}
# What a phase's server serves, where it is another phase's configuration.
SERVES = {"bench": "dflash", "speed-dflash": "dflash"}

# --set items every server gets: the GPU harness's trained target in place of the 26B.
SETS = [
    # The trained target is bf16: its NVFP4 copy's one-at-a-time reference does not reproduce
    # on Hopper (Marlin; tests/gpu/README.md, "Findings that stand").
    "target.format=bf16",
    # vLLM 0.21.0 refuses every FP4 MoE backend name for an unquantized MoE ("moe_backend='marlin'
    # is not supported for unquantized MoE"): the bf16 target's MoE backend is vLLM's choice.
    "intent.moe_fp4_backend=auto",
    # The target's max_position_embeddings: its rotary tables end there.
    "serve.max_model_len=4096",
    # With chunked multimodal input off (forced for Gemma 4) a chunk must hold the largest
    # multimodal item: 32 video frames x 78 tokens = 2,496 (gemma4_mm.get_mm_max_tokens_per_item);
    # 2,560 is also a boundary a ~2,600-token prompt crosses (the chunk-boundary request).
    "serve.max_num_batched_tokens=2560",
    # The device bundle leaves FlashInfer out (tests/gpu/bundle-requirements.txt).
    "VLLM_USE_FLASHINFER_SAMPLER=0",
]
# Extra vLLM arguments (after `--`), the same on every server.
EXTRA_ARGS = [
    # FLASH_ATTN as sm_12x runs it (FA2; Hopper would pick FA3).
    "--attention-config", '{"flash_attn_version": 2}',
    # The "logprobs" are the raw logits: compare.py's tie rule measures bf16 steps of logits.
    "--logprobs-mode", "raw_logits",
    # usage.prompt_tokens_details.cached_tokens: the prefix-cache hit of each request.
    "--enable-prompt-tokens-details",
    # vLLM 0.21.0 + transformers 5.13.1 cannot profile Gemma 4's vision encoder with the
    # processor cache on (tests/gpu/README.md, "Findings that stand").
    "--mm-processor-cache-gb", "0",
    # The trained target's template loops over a macro argument, which vLLM's detection reads
    # as the "string" format; that format moves every image to the front of its message.
    "--chat-template-content-format", "openai",
]
# The reference: no drafter, every prompt computed from scratch (a prefix-cache hit computes
# the rest of a prompt in another batch shape, which moves near-tie argmaxes: realshape.py).
REFERENCE_SETS = ["drafter=null", "serve.enable_prefix_caching=false"]
REFERENCE_EXTRA = ["--no-enable-prefix-caching"]  # vLLM's V1 default is on: off must be said
# The speed phase's baseline: the recipe without its drafter and nothing else changed (a
# speed-up is measured against what a user would serve instead).
PHASE_SETS = {"reference": REFERENCE_SETS, "speed-reference": ["drafter=null"], "conformance-twin": REFERENCE_SETS}
PHASE_EXTRA = {"reference": REFERENCE_EXTRA, "conformance-twin": REFERENCE_EXTRA}
NO_DRAFTER = ("reference", "speed-reference", "conformance-twin")
# Issue 25, item 5: end-to-end tok/s at these concurrencies, with and without the drafter.
SPEED_LEVELS = "1,4,16"

READY = re.compile(r"ready in ([\d.]+) s: ")
# Stopping a server (the launcher waits for vLLM's shutdown) and saving. SERVED_STOP_RESERVE_S
# sets it: the stops took 5-15 s on the H100, and a 0.33.0 server that is ready at 440 s of a
# 600 s call has no room for two benchmarks with 75.
STOP_RESERVE_S = float(os.environ.get("SERVED_STOP_RESERVE_S", "75"))
STARTING = "starting: "
# --exact-numerics. Found by the real-shape runs (tests/gpu/README.md, "The criteria": exact numerics):
# with default numerics the target alone parts from its one-at-a-time reference wherever
# batching moves a near-tie, so a server at 8 or 22 in flight cannot be lossless by the strict
# rule whatever DFlash does; with batch invariance and no inductor kernels DFlash gave 54/54.
EXACT_ENV = {"VLLM_BATCH_INVARIANT": "1"}
EXACT_ARGS = ["--compilation-config", '{"backend": "eager"}']
START_TIMEOUT_S = 480


def start_timeout_s() -> float:
    """A server's start limit: SERVED_START_TIMEOUT_S where set (ten servers starting side by side
    on one host share its cores, and 0.33.0's took up to 412 s beside one other), else 480 s."""
    return float(os.environ.get("SERVED_START_TIMEOUT_S") or START_TIMEOUT_S)
REQUEST_TIMEOUT_S = 300


# --------------------------------------------------------------- the servers


def serve_args(phase: str, model: str, drafter: str, port: int, more_sets: list[str] = (),
               more_args: list[str] = (), recipe: str = RECIPE) -> list[str]:
    """`launcher serve` arguments of a phase (without --wait, --timeout, --force, --dry-run);
    ``more_sets`` / ``more_args`` (--set / --vllm-arg) come last, the same on every server."""
    args = ["serve", "--recipe", recipe, "--model", model, "--test-gpu", "--host", "127.0.0.1", "--port", str(port)]
    sets = SETS + PHASE_SETS.get(phase, []) + list(more_sets)
    if phase not in NO_DRAFTER:
        args += ["--drafter", drafter]
    for item in sets:
        args += ["--set", item]
    return args + ["--", *EXTRA_ARGS, *PHASE_EXTRA.get(phase, []), *more_args]


def _with_flags(args: list[str], *flags: str) -> list[str]:
    """Launcher flags go before `--` (after it they would be vLLM's)."""
    cut = args.index("--")
    return args[:cut] + list(flags) + args[cut:]


def launcher_env(site: str, step_times: Path | None = None) -> dict:
    """The launcher's (and so vLLM's) environment; ``step_times``: the file the step-time
    plugin (step_times/vllm_step_times.py) writes the server's engine steps to."""
    env = dict(os.environ)
    # The vLLM site first; the launcher (this checkout) last, so nothing of it shadows vLLM's imports.
    env["PYTHONPATH"] = os.pathsep.join([site, str(REPO)])
    env["PYTHONUNBUFFERED"] = "1"
    env.pop(STEP_TIMES_ENV, None)
    if step_times is not None:
        env["PYTHONPATH"] += os.pathsep + str(STEP_TIMES_PLUGIN)
        env[STEP_TIMES_ENV] = str(step_times)
    return env


def dry_run(args: list[str], site: str, cwd: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "launcher", *_with_flags(args, "--dry-run", "--json")],
                          env=launcher_env(site), cwd=cwd, capture_output=True, text=True, timeout=300)
    try:
        return json.loads(proc.stdout)
    except ValueError:
        return {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-2000:]}"}


class Launched:
    """`launcher serve ... --wait`, its output in a log file.

    Kept in this process's session on purpose: a host that runs commands under a time limit
    ends a command's processes when the command ends (cut at its limit too), but not those of
    a new session, and a vLLM left running would hold the port and a quarter of the GPU for
    the next command."""

    def __init__(self, args: list[str], site: str, cwd: Path, log: Path, timeout: float, force: bool = False,
                 step_times: Path | None = None, env: dict | None = None):
        # env: variables of this server alone (CUDA_VISIBLE_DEVICES of one node of several)
        flags = ["--wait", "--timeout", str(int(timeout))] + (["--force"] if force else [])
        self.args = _with_flags(args, *flags)
        self.log_path = log
        self._log = log.open("w")
        self.proc = subprocess.Popen([sys.executable, "-m", "launcher", *self.args],
                                     env={**launcher_env(site, step_times), **(env or {})},
                                     cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT)
        self.t0 = time.time()

    @property
    def started_by(self) -> str:
        return shlex.join(["launcher", *self.args])

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def argv(self) -> list[str] | None:
        """The command the launcher printed before it started vLLM (what really ran)."""
        for line in self.text().splitlines():
            if line.startswith(STARTING):
                return shlex.split(line[len(STARTING):])
        return None

    def wait_ready(self, timeout: float) -> float | None:
        """Seconds to ready (the launcher's own "ready in" line: /health and a first chat),
        or None when the launcher exited first or ``timeout`` passed."""
        end = time.time() + timeout
        while time.time() < end:
            m = READY.search(self.text())
            if m:
                return float(m.group(1))
            if self.proc.poll() is not None:
                return None
            time.sleep(2)
        return None

    def stop(self) -> int | None:
        """SIGTERM to the launcher (it stops vLLM and waits for it); then SIGKILL to whatever
        the launcher started that is still there (vLLM's engine core, its API server)."""
        family = _descendants(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        for child in family:
            try:
                child.kill()
            except Exception:  # noqa: BLE001 - psutil.NoSuchProcess: already gone
                pass
        # A killed process holds its port until it has exited: the next phase binds that port
        # (a smoke test found it still taken right after stop).
        _wait_gone(family)
        code = self.proc.wait()
        self._log.close()
        return code


def _wait_gone(procs: list, timeout: float = 30) -> None:
    """Until every one of ``procs`` (psutil processes) has exited, or ``timeout`` has passed."""
    if procs:
        import psutil

        psutil.wait_procs(procs, timeout=timeout)


def _descendants(pid: int) -> list:
    """The processes ``pid`` started, by psutil (which tells a reused pid from the same one)."""
    try:
        import psutil

        return psutil.Process(pid).children(recursive=True)
    except Exception:  # noqa: BLE001 - no psutil, or the launcher is already gone
        return []


# --------------------------------------------------------------- the requests


def client(url: str):
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="EMPTY", max_retries=0, timeout=REQUEST_TIMEOUT_S)


def send(cli, model: str, req: sr.Req, timeout: float = REQUEST_TIMEOUT_S) -> dict:
    """One request through the openai client; its output record (token ids, top logits,
    usage), or the error."""
    rec: dict = {"id": req.id, "kind": req.kind, "images": req.images, "stream": req.stream}
    kwargs = dict(model=model, messages=sr.openai_messages(req), max_tokens=sr.MAX_TOKENS, temperature=0.0,
                  seed=0, logprobs=True, top_logprobs=sr.TOP_LOGPROBS, timeout=timeout,
                  extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True})
    if req.tools:
        kwargs.update(tools=req.tools, tool_choice="auto")
    t0 = time.time()
    try:
        content, text, usage, finish, calls = [], [], None, None, 0
        if req.stream:
            chunks = 0
            for chunk in cli.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
                chunks += 1
                usage = chunk.usage or usage
                for ch in chunk.choices:
                    if ch.logprobs is not None and ch.logprobs.content:
                        content += [c.model_dump() for c in ch.logprobs.content]
                    if ch.delta is not None and ch.delta.content:
                        text.append(ch.delta.content)
                    finish = ch.finish_reason or finish
            rec["chunks"] = chunks
        else:
            resp = cli.chat.completions.create(**kwargs)
            choice = resp.choices[0]
            content = [c.model_dump() for c in (choice.logprobs.content if choice.logprobs else None) or []]
            text = [choice.message.content or ""]
            calls = len(choice.message.tool_calls or [])
            finish, usage = choice.finish_reason, resp.usage
        rec.update(report.output_record(content))
        details = getattr(usage, "prompt_tokens_details", None) if usage is not None else None
        rec.update(prompt_tokens=getattr(usage, "prompt_tokens", None),
                   completion_tokens=getattr(usage, "completion_tokens", None),
                   # vLLM leaves the details out when nothing was cached
                   cached_tokens=(getattr(details, "cached_tokens", None) or 0),
                   finish_reason=finish, text_chars=len("".join(text)), tool_calls=calls)
    except Exception as exc:  # noqa: BLE001 - every failure is a result here
        rec["error"] = f"{type(exc).__name__}: {exc}"[:800]
    rec["wall_s"] = round(time.time() - t0, 2)
    return rec


def run_level(url: str, model: str, reqs: list[sr.Req], concurrency: int, deadline: float | None = None) -> list[dict]:
    """Every request with ``concurrency`` in flight; outputs in request order. A request not
    started by ``deadline`` is recorded as skipped (the command must end before a time limit cuts it)."""
    cli = client(url) if deadline is None or time.time() < deadline else None

    def one(req: sr.Req) -> dict:
        if deadline is not None and time.time() > deadline:
            return {"id": req.id, "kind": req.kind, "images": req.images, "error": "skipped: deadline"}
        # A request in flight may not outlast the command either (the stop reserve stays).
        left = REQUEST_TIMEOUT_S if deadline is None else deadline + STOP_RESERVE_S - 20 - time.time()
        return send(cli, model, req, timeout=max(10.0, min(REQUEST_TIMEOUT_S, left)))

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, reqs))


def server_tokenize(url: str, model: str, req: sr.Req) -> list[int] | None:
    """The server's own prompt ids for ``req`` (vLLM's /tokenize renders the chat and runs the
    multimodal processor); None when it will not say."""
    body = json.dumps({"model": model, "messages": sr.openai_messages(req), "add_generation_prompt": True}).encode()
    http = urllib.request.Request(f"{url}/tokenize", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(http, timeout=120) as resp:
            return json.loads(resp.read()).get("tokens")
    except (OSError, ValueError, urllib.error.URLError):
        return None


def scrape(url: str) -> str | None:
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
            return resp.read().decode("utf-8", "replace")
    except (OSError, urllib.error.URLError):
        return None


def served_name(plan: dict) -> str:
    argv = plan.get("argv") or []
    return argv[argv.index("--served-model-name") + 1] if "--served-model-name" in argv else "gemma4"


def batched_tokens(plan: dict) -> int:
    """The plan's prefill chunk; the value SETS asks for where the dry run said nothing."""
    argv = plan.get("argv") or []
    if "--max-num-batched-tokens" in argv:
        return int(argv[argv.index("--max-num-batched-tokens") + 1])
    return int(next(x for x in SETS if x.startswith("serve.max_num_batched_tokens=")).split("=")[1])


# --------------------------------------------------------------- the inputs


def text_only(plan: dict) -> bool:
    """The plan serves the language model alone (the text-only recipe's --language-model-only)."""
    return "--language-model-only" in (plan.get("argv") or [])


def inputs(model: Path, chunk: int, plan: dict | None = None) -> tuple[list[sr.Req], sr.Vision, object]:
    """The requests (the chunk-boundary one made for ``chunk``; only those without images
    where ``plan`` serves text only), the image geometry, the local tokenizer."""
    config = json.loads((model / "config.json").read_text())
    vision = sr.Vision.from_config(config)
    prompts = json.loads((model / "prompts.json").read_text())
    texts = [p["text"] for p in prompts]
    # The filler: held-out texts no other request uses, none of the shared-prefix ones (their
    # first blocks would come from the prefix cache and move the first chunk's start).
    filler = "\n".join(p["text"] for p in prompts[18:] if not p.get("shared_prefix"))
    tokenize = sr.local_tokenizer(model)
    chunk_req = sr.chunk_boundary_request(filler, tokenize, vision, chunk)
    reqs = sr.build(texts, chunk_req)
    if plan is not None and text_only(plan):
        reqs = [r for r in reqs if not r.images]
    return reqs, vision, tokenize


# --------------------------------------------------------------- the phases


class Phase:
    """One server's phase: plan, start, requests, stop; everything into a raw record."""

    def __init__(self, name: str, args, site: str):
        self.name, self.args, self.site, self.deadline = name, args, site, args.deadline
        self.work: Path = args.work
        self.cwd = self.work / "cwd"
        self.cwd.mkdir(parents=True, exist_ok=True)
        self.port = args.port_base + PORT_OFFSETS[name]
        self.url = f"http://127.0.0.1:{self.port}"
        self.serve = serve_args(SERVES.get(name, name), str(args.model), str(args.drafter),
                                self.port, args.set, args.vllm_arg, args.recipe)
        self.record: dict = {"server": name, "series": "stock" if name == "stock" else args.series_hash,
                             # e.g. "without dflash-drafter-per-layer-attention": a series less one patch
                             **({"variant": args.variant} if args.variant else {}),
                             # the criteria this record is judged by (bars.yaml's blob hash)
                             "bars": report.bars.blob_hash(),
                             "numerics": "exact" if args.exact_numerics else "default",
                             "launcher_env": {"PYTHONPATH": launcher_env(site)["PYTHONPATH"]}}
        # what it serves, by hash: the target always, the drafter where the server is given one
        hashes = model_hashes(args)
        self.record["target_sha256"] = hashes["target_sha256"]
        if "--drafter" in self.serve:
            self.record["drafter_sha256"] = hashes["drafter_sha256"]
        self.server: Launched | None = None
        self.step_times: Path | None = None  # set: the server's engine steps are timed into it

    def left(self) -> float:
        return self.deadline - time.time()

    @property
    def last_request(self) -> float:
        """No request starts after this: time to stop the server and save stays."""
        return self.deadline - STOP_RESERVE_S

    def failed(self, exc: BaseException) -> None:
        traceback.print_exc()
        self.record["error"] = f"{type(exc).__name__}: {exc}"[:2000]

    def plan(self) -> dict:
        plan = dry_run(self.serve, self.site, self.cwd)
        self.record["plan"] = plan
        self.record["vllm"] = plan.get("vllm_version")
        return plan

    def start(self, force: bool = False) -> bool:
        timeout = min(start_timeout_s(), self.left() - 60)
        if timeout < 120:
            self.record.update(started=False, skipped="deadline: no time left to start a server")
            return False
        self.record["started_at"] = time.time()  # with stopped_at: which servers ran side by side
        if self.step_times is not None:
            self.step_times.unlink(missing_ok=True)  # an earlier call's steps are not this server's
        self.server = Launched(self.serve, self.site, self.cwd, self.work / f"{self.name}.log", timeout, force,
                               self.step_times)
        self.record["started_by"] = self.server.started_by
        ready = self.server.wait_ready(timeout + 30)
        self.record.update(started=ready is not None, ready_s=ready, argv=self.server.argv())
        print(f"[{self.name}] {'ready in %.0f s' % ready if ready is not None else 'NOT ready'}", flush=True)
        return ready is not None

    def stop(self) -> None:
        if self.server is not None:
            self.record["exit_code"] = self.server.stop()
            self.record["stopped_at"] = time.time()
            self.record["log_facts"] = report.log_facts(self.server.text())
            self.server = None

    def save(self) -> None:
        _write_atomic(self.work / f"{self.name}.json", json.dumps(self.record) + "\n")
        seeded.unseed(self.work, f"{self.name}.json")


def reference(args) -> None:
    ph = Phase("reference", args, args.site_patched)
    try:
        plan = ph.plan()
        reqs, vision, _ = inputs(args.model, batched_tokens(plan), plan)
        ph.record.update(requests=[r.to_dict() for r in reqs], vision=vision.__dict__)
        if ph.start():
            model = served_name(plan)
            record_chunk_tokenize(ph, model, reqs)
            ph.record["passes"] = []
            for i in range(2):
                t0 = time.time()
                ph.record["passes"].append(run_level(ph.url, model, reqs, 1, ph.last_request))
                print(f"[reference] pass {i + 1}: {time.time() - t0:.0f} s", flush=True)
    except Exception as exc:  # noqa: BLE001 - recorded; the next phase still runs
        ph.failed(exc)
    finally:
        ph.stop()
        ph.save()


def record_chunk_tokenize(ph, model: str, reqs) -> None:
    """The server's own tokenization of the chunk-boundary image request, into the phase's record
    (none where the server takes no images)."""
    chunk = next((r for r in reqs if r.kind == "image_at_chunk_boundary"), None)
    ph.record["server_tokenize"] = server_tokenize(ph.url, model, chunk) if chunk else None


def dflash(args) -> None:
    ph = Phase("dflash", args, args.site_patched)
    try:
        plan = ph.plan()
        reqs, vision, tokenize = inputs(args.model, batched_tokens(plan), plan)
        ph.record.update(requests=[r.to_dict() for r in reqs], vision=vision.__dict__)
        if not ph.start():
            return
        model = served_name(plan)
        record_chunk_tokenize(ph, model, reqs)
        ph.record["metrics_before"] = scrape(ph.url)
        ph.record["levels"] = {}
        for c in sr.CONCURRENCY:
            t0 = time.time()
            ph.record["levels"][str(c)] = run_level(ph.url, model, reqs, c, ph.last_request)
            print(f"[dflash] concurrency {c}: {time.time() - t0:.0f} s", flush=True)
        ph.record["metrics_after"] = scrape(ph.url)
        ph.record["prefix_cache"] = report.prefix_cache(reqs, ph.record["levels"]["1"], vision, tokenize)
        ph.save()  # the requests' record is kept even if the benchmark runs out of time
        bench(ph, model)
    except Exception as exc:  # noqa: BLE001 - recorded; the next phase still runs
        ph.failed(exc)
    finally:
        ph.stop()
        ph.save()


def complete_tokens(url: str, model: str, ids: list[int], max_tokens: int) -> dict:
    """One /v1/completions request on token ids (the prompts of prompts.json, as z-lab's loop
    reads them), greedy, eos ignored: its token ids and top-1/top-2 margins, or the error."""
    body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0.0, "seed": 0,
            "logprobs": 2, "ignore_eos": True, "return_tokens_as_token_ids": True}
    http = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                  headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(http, timeout=REQUEST_TIMEOUT_S) as resp:
            lp = json.loads(resp.read())["choices"][0]["logprobs"]
    except (OSError, ValueError, KeyError, urllib.error.URLError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:800]}
    margins = []
    for top in lp.get("top_logprobs") or []:
        values = sorted((float(v) for v in (top or {}).values()), reverse=True)
        margins.append(round(values[0] - values[1], 5) if len(values) > 1 else None)
    return {"token_ids": [report.token_id(t) for t in lp["tokens"]], "margins": margins}


def conformance_rows(ph: Phase, model: str, prompts: list[dict], max_tokens=None) -> list[dict]:
    """Every prompt one at a time; with a drafter, the request's acceptance from /metrics read
    before and after it (nothing else runs on the server meanwhile). ``max_tokens``: per prompt
    (a prefix request), None for the prompt's own."""
    rows = []
    for i, p in enumerate(prompts):
        n = p["max_tokens"] if max_tokens is None else max_tokens[i]
        if n is None or time.time() > ph.last_request:
            rows.append(None if n is None else {"error": "skipped: deadline"})
            continue
        before = scrape(ph.url)
        row = complete_tokens(ph.url, model, p["token_ids"], n)
        row["acceptance"] = report.acceptance(before, scrape(ph.url))
        row["prompt_tokens"] = len(p["token_ids"])  # where the drafter's sliding window binds
        rows.append(row)
    return rows


def batched_rows(ph: Phase, model: str, prompts: list[dict]) -> list[dict]:
    """Every prompt in flight at once: under exact numerics the outputs must still equal the
    one-at-a-time twin's (lossless with the drafter at the batch a busy server sees)."""
    if time.time() > ph.last_request:
        return [{"error": "skipped: deadline"} for _ in prompts]
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        return list(pool.map(lambda p: complete_tokens(ph.url, model, p["token_ids"], p["max_tokens"]), prompts))


def drafter_window(drafter: Path) -> int | None:
    """The sliding window of the drafter's sliding layers as vLLM reads it (None: no such layer)."""
    from launcher.checkpoint import drafter_sliding_layers

    layers, window = drafter_sliding_layers(json.loads((drafter / "config.json").read_text()))
    return window if layers else None


def wait_for_twin(args, twin_path: Path, ph: Phase) -> bool:
    """The twin's record of this command, where the twin runs beside this phase (--parallel): its
    margins set the noise bound the prefix requests need. A record from before this command is
    not it; a twin of an earlier command (seeded) is, when this command does not run one."""
    if "conformance-twin" not in args.phases.split(","):
        return twin_path.exists()
    while time.time() < ph.last_request:
        if twin_path.exists() and twin_path.stat().st_mtime >= args.started:
            twin = json.loads(twin_path.read_text())
            if twin.get("rows") or twin.get("error") or twin.get("skipped") or twin.get("started") is False:
                return bool(twin.get("rows"))
        time.sleep(5)
    return False


def conformance_phase(args, name: str) -> None:
    """issue 50, item 4: prompts.json served one at a time. ``conformance-twin``: no drafter (its
    margins give conformance.py its noise bound). ``conformance``: the recipe, then, with
    ``--zlab`` and the twin's record present, each prompt again stopped at its common prefix."""
    import conformance

    ph = Phase(name, args, args.site_patched)
    try:
        plan = ph.plan()
        prompts = json.loads((args.model / "prompts.json").read_text())
        # A series less one patch is what the launcher's preflight refuses: started with --force.
        if not ph.start(force=bool(args.variant)):
            return
        model = served_name(plan)
        if name == "conformance":
            ph.record["drafter_window"] = drafter_window(args.drafter)
        ph.record["rows"] = conformance_rows(ph, model, prompts)
        ph.save()
        if name == "conformance":
            ph.record["batched_rows"] = batched_rows(ph, model, prompts)
            ph.save()
        twin_path = args.work / "conformance-twin.json"
        if name == "conformance" and args.zlab and wait_for_twin(args, twin_path, ph):
            zlab = json.loads(args.zlab.read_text())
            bound = conformance.noise_bound(zlab["rows"], json.loads(twin_path.read_text())["rows"])
            cut = [conformance.common_prefix(z["margins"], bound) for z in zlab["rows"]]
            wanted = [c if conformance.needs_prefix_run(c, z["token_ids"]) else None
                      for c, z in zip(cut, zlab["rows"])]
            prefix_rows = conformance_rows(ph, model, prompts, wanted)
            for row, pre in zip(ph.record["rows"], prefix_rows):
                if pre is not None:
                    row["prefix_acceptance"] = pre.get("acceptance")
            ph.record.update(noise_bound=bound, prefixes=cut)
    except Exception as exc:  # noqa: BLE001 - recorded; the next phase still runs
        ph.failed(exc)
    finally:
        ph.stop()
        ph.save()


def bench_phase(args) -> None:
    """The dflash server once more, for `launcher bench` alone."""
    ph = Phase("bench", args, args.site_patched)
    try:
        plan = ph.plan()
        if ph.start():
            bench(ph, served_name(plan))
    except Exception as exc:  # noqa: BLE001 - recorded
        ph.failed(exc)
    finally:
        ph.stop()
        ph.save()


# Both workloads at 1 and 22 in flight on the trained target: their requests took 26 s on an
# H100 under exact numerics (served-bench-0.33.0-text.json), the launcher's start and the
# tokenizer add some; 90 s with room. The estimate of 200 s it replaced skipped the speed
# phase's benchmarks with 262 s left. SERVED_BENCH_NEEDS_S sets it.
BENCH_NEEDS_S = float(os.environ.get("SERVED_BENCH_NEEDS_S", "90"))


def bench(ph: Phase, model: str, more: list[str] = (), tag: str = "") -> Path | None:
    """`launcher bench --recipe gemma4-moe-dflash` against the running server (``more``: its
    further arguments); the result file, or None where there was no time for it."""
    if ph.left() < BENCH_NEEDS_S + STOP_RESERVE_S:
        ph.record["bench_skipped"] = f"deadline: {ph.left():.0f} s left, the benchmark needs about {BENCH_NEEDS_S}"
        return None
    # One file per vLLM version, recipe and purpose: the text-only recipe's must not replace the other's.
    suffix = ph.args.recipe[len(RECIPE):] + tag
    out = ph.args.out / f"served-bench-{ph.record.get('vllm')}{suffix}.json"
    out.unlink(missing_ok=True)  # a file of an earlier command on this host must not stand in for this one's
    cmd = [sys.executable, "-m", "launcher", "bench", "--recipe", ph.args.recipe, "--url", ph.url, "--model", model,
           "--client", "builtin", "--tokenizer", str(ph.args.model), "--out", str(out), "--timeout", "300", *more]
    ph.record["bench_command"] = shlex.join(["launcher", *cmd[3:]])
    try:
        # The site for the launcher's own dependencies (pydantic travels in the bundle).
        proc = subprocess.run(cmd, env=launcher_env(ph.site), cwd=ph.cwd, capture_output=True, text=True,
                              timeout=ph.left() - STOP_RESERVE_S)
        ph.record["bench_exit"] = proc.returncode
        ph.record["bench_output"] = (proc.stdout + proc.stderr).strip().splitlines()[-20:]
    except subprocess.TimeoutExpired:
        ph.record["bench_exit"] = "timeout"
    if out.exists():
        ph.record["bench"] = f"tests/gpu/results/{out.name}"
        doc = json.loads(out.read_text())
        ph.record["bench_summary"] = [
            {"workload": r["workload"], "concurrency": r["concurrency"],
             "output_tok_s": r.get("output_throughput"), "mean_tpot_ms": r.get("mean_tpot_ms"),
             "mean_acceptance_length": (r.get("spec_decode") or {}).get("mean_acceptance_length")}
            for r in doc.get("runs") or []]
        if doc.get("comparison"):
            ph.record["bench_comparison"] = doc["comparison"]
    return out if out.exists() else None


def speed(args) -> None:
    """Issue 25, item 5: output tok/s through `launcher bench` at SPEED_LEVELS, against the recipe
    without its drafter and then with it (`--compare-without-drafter --baseline-result`). Both
    servers start side by side and are benched one after the other, so neither bench shares the
    GPU's compute; default numerics (main() refuses --exact-numerics: batch invariance is slower)."""
    pair = {name: Phase(name, args, args.site_patched) for name in ("speed-reference", "speed-dflash")}
    for ph in pair.values():
        ph.step_times = ph.work / f"{ph.name}-steps.jsonl"
    try:
        # the gated prompts before any server starts: a bad prompts.json costs no start-up
        prompts, count = speed_prompts(args, pair["speed-dflash"].work)
        for ph in pair.values():
            ph.plan()
        ready = {}
        starts = [threading.Thread(target=lambda n=n, p=p: ready.__setitem__(n, p.start())) for n, p in pair.items()]
        for t in starts:
            t.start()
        for t in starts:
            t.join()
        base, dfl = pair["speed-reference"], pair["speed-dflash"]
        if not all(ready.get(n) for n in pair):
            dfl.record["speed_skipped"] = "not started: " + ", ".join(n for n in pair if not ready.get(n))
        else:
            levels = speed_levels(prompts, count)
            baseline = bench(base, served_name(base.record["plan"]), levels, "-speed-no-drafter")
            if baseline is not None:
                mine = bench(dfl, served_name(dfl.record["plan"]),
                             [*levels, "--compare-without-drafter", "--baseline-result", str(baseline)], "-speed-dflash")
                if mine is not None:
                    dfl.record["speed_gate"] = speed_gate(mine, baseline, count)
    except Exception as exc:  # noqa: BLE001 - recorded
        pair["speed-dflash"].failed(exc)
    finally:
        for ph in pair.values():
            ph.stop()  # the step files grow while the engines run (a level's last few steps stay unwritten)
        try:
            project_speed(pair["speed-dflash"], pair["speed-reference"])
        except Exception as exc:  # noqa: BLE001 - recorded; the records are saved whatever happened
            pair["speed-dflash"].record["speed_projection_error"] = f"{type(exc).__name__}: {exc}"[:500]
        for ph in pair.values():
            ph.save()


def speed_prompts(args, work: Path) -> tuple[Path, int]:
    """The gated prompts (the target's prompts.json) as `launcher bench --prompts-file` reads
    them, token ids a line, and how many there are."""
    prompts = json.loads((args.model / "prompts.json").read_text())
    work.mkdir(parents=True, exist_ok=True)
    path = work / "speed-prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p["token_ids"]}) + "\n" for p in prompts))
    return path, len(prompts)


def speed_levels(prompts: Path, count: int) -> list[str]:
    """`launcher bench`'s arguments for both speed servers: the gated prompts (as token ids, each
    once per level at least) at the gate's length, with their outputs recorded, so that the
    measured servers' own output is judged by the gate (issue 51: a claim stands on records that
    pass it; a looping output drafts easily and would flatter the speed-up). At least the curve's
    requests per level (bars.yaml speedup_curve): at concurrency 1 the recipe's 4 let one slow
    first request move the tok/s ratio."""
    least = max(int(report.bars.get("speedup_curve", "min_requests")), count)
    return ["--workload", "prompts", "--concurrency", SPEED_LEVELS, "--min-requests", str(least),
            "--prompts-file", str(prompts), "--output-len", str(report.bars.get("gate", "min_generated_tokens")),
            "--record-outputs"]


def speed_gate(with_drafter: Path, without: Path, prompts: int) -> dict:
    """The gate over both speed benchmarks' outputs at concurrency 1 (the claim's level), each
    request keyed by its prompt (request i sent prompt i mod ``prompts``): {"reference": the
    server without the drafter, "dflash": with it}."""
    return {"reference": _bench_gate(json.loads(without.read_text()), prompts),
            "dflash": _bench_gate(json.loads(with_drafter.read_text()), prompts)}


def _bench_gate(doc: dict, count: int) -> dict | None:
    got = gate.bench_outputs(doc, count)
    if got is None:
        return None
    return gate.bench_block(*got)


def read_steps(path: Path | None) -> list[dict]:
    """The step records a server's plugin wrote; a line cut by the server's stop is left out."""
    if path is None or not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def project_speed(dfl: Phase, base: Phase) -> None:
    """bench_report's projection beside the measured speed-up, from the step times both
    servers' engine cores recorded during the benchmarks (speed.served_pair)."""
    steps = {ph.name: read_steps(ph.step_times) for ph in (dfl, base)}
    dfl.record["step_counts"] = {name: len(s) for name, s in steps.items()}
    k = spec_tokens(dfl.record.get("argv"))
    if dfl.record.get("bench_comparison") and all(steps.values()) and k:
        dfl.record["speed_projection"] = speed_mod.served_pair(
            dfl.record["bench_comparison"], steps[dfl.name], steps[base.name], k)


def spec_tokens(argv: list[str] | None) -> int | None:
    """num_speculative_tokens of the --speculative-config vLLM ran with (its argv)."""
    argv = argv or []
    for i, arg in enumerate(argv[:-1]):
        if arg == "--speculative-config":
            return json.loads(argv[i + 1]).get("num_speculative_tokens")
    return None


def stock_probe(reqs: list[sr.Req]) -> sr.Req:
    """The stock server's one request: the first image, where the seed error would meet it
    (the text requests come first in the list); text-only, the first text request."""
    by_id = {r.id: r for r in reqs}
    return by_id.get("image-first") or by_id["text-0"]


def stock(args) -> None:
    ph = Phase("stock", args, args.site_stock)
    try:
        plan = ph.plan()
        ph.record["refused_without_force"] = bool(plan.get("verdict") == "blocked")
        reqs, _, _ = inputs(args.model, batched_tokens(plan), plan)
        first = stock_probe(reqs)
        if ph.start(force=True):
            out = send(client(ph.url), served_name(plan), first)
            ph.record["first_image"] = {k: out.get(k) for k in ("id", "error", "completion_tokens", "prompt_tokens")}
            ph.record["request_counts"] = sr.counts([first])
            ph.record["stock_error"] = f"first image request: {out['error']}" if out.get("error") else None
            ph.record["stock_outcome"] = "started; the first image request " + \
                ("failed" if out.get("error") else "was answered")
        elif ph.record.get("skipped"):
            ph.record["stock_outcome"] = ph.record["skipped"]
        else:
            ph.stop()
            ph.record["stock_outcome"] = "did not start"  # the row reads the error off the log
    except Exception as exc:  # noqa: BLE001 - recorded
        ph.failed(exc)
    finally:
        ph.stop()
        ph.save()


# --------------------------------------------------------------- the record


def assemble(work: Path, out: Path, meta: dict) -> dict:
    """served.json / served.md from this folder's phases and the other rows already there. Under
    a lock on ``out``: phases of this command (--parallel) and another served.py (the other vLLM
    version, run beside this one) rewrite the same record."""
    out.mkdir(parents=True, exist_ok=True)
    # The lock is the folder itself: no lock file to clean up, none coming back in $OUT.
    fd = os.open(out, os.O_RDONLY)
    try:
        with _ASSEMBLING:
            fcntl.flock(fd, fcntl.LOCK_EX)
            return _assemble(work, out, meta)
    finally:
        os.close(fd)  # releases the flock too


_ASSEMBLING = threading.Lock()  # threads of one process take this first (their flocks would not wait)


def _assemble(work: Path, out: Path, meta: dict) -> dict:
    phases = {p: json.loads((work / f"{p}.json").read_text()) for p in PORT_OFFSETS  # every server a phase runs
              if (work / f"{p}.json").exists()}
    for name, phase in phases.items():
        # Read the server logs again where they are here: a record assembled later gets what
        # the log parser learnt since the phase ran.
        log = work / f"{name}.log"
        if log.exists() and phase.get("log_facts") is not None:
            phase["log_facts"] = report.log_facts(log.read_text(errors="replace"))
    rows = stamp_models(report.rows(phases), meta)
    earlier = out / "served.json"
    if earlier.exists():
        before = json.loads(earlier.read_text())
        listed = seeded.names(work)
        brought = {p for p in phases if f"{p}.json" in listed}
        rows = merge_rows(stamp_models(before.get("servers", []), before.get("meta") or {}), rows,
                          {r["server"] for r in rows if report.ROW_PHASES[r["server"]] & phases.keys() <= brought})
    doc = {"meta": meta, "servers": rows}
    _write_atomic(out / "served.json", json.dumps(doc, indent=1) + "\n")
    _write_atomic(out / "served.md", report.markdown(doc))
    return doc


def stamp_models(rows: list[dict], meta: dict) -> list[dict]:
    """Each row names the checkpoints it served (``meta`` is the command's that wrote it): a command
    with a retrained drafter rewrites the record's meta, and the rows it kept must still say
    which drafter they ran. A row that already names them keeps its own."""
    for r in rows:
        r.setdefault("target_sha256", meta.get("target_sha256"))
        if r.get("server") != "reference":  # the reference serves the target alone
            r.setdefault("drafter_sha256", meta.get("drafter_sha256"))
    return rows


def row_key(r: dict) -> tuple:
    """What one row of served.json stands for: the server of a vLLM and recipe (rows from before
    --recipe: the default; a series less one patch is a row of its own)."""
    return r.get("vllm"), r.get("recipe") or RECIPE, r.get("server"), r.get("variant")


def lost_rows(earlier: list[dict], mine: list[dict]) -> list[str]:
    """The rows of ``mine`` that would put a server that did not start in place of one that did
    (the stock server's failed start is its finding, so it is not counted)."""
    started = {row_key(r) for r in earlier if r.get("started")}
    return [" ".join(str(x) for x in row_key(r) if x) for r in mine
            if r.get("server") != "stock" and not r.get("started") and row_key(r) in started]


def merge_rows(earlier: list[dict], mine: list[dict], seeded_servers: set[str] = frozenset()) -> list[dict]:
    """The record's rows with this folder's in place of the same server of the same vLLM and
    recipe (one work folder per vLLM version and recipe, which may hold only some phases: a
    call that ran the speed phase alone keeps the reference and DFlash rows), new ones last.
    A row of ``seeded_servers`` (made only of phases an earlier machine ran, remote.sh
    seed_raw) fills a gap but replaces no row: the record's may be newer."""
    held = {row_key(r) for r in earlier}
    key = row_key
    mine = [r for r in mine if not (r.get("server") in seeded_servers and key(r) in held)]
    fresh = {key(r): r for r in mine}
    merged = [fresh.pop(key(r), r) for r in earlier]
    return merged + [r for r in mine if key(r) in fresh]


def _write_atomic(path: Path, text: str) -> None:
    """Readers (another phase's assemble, a copy) never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def keep_raw(work: Path, dest: Path, phase: str) -> None:
    """The raw phase record and its server log into ``dest`` (OUT/served-raw): the
    reference's outputs are what a dflash or stock phase on another machine (exact
    numerics repeat across H100s) is judged against, and a command cut short keeps its logs."""
    for raw in (work / f"{phase}.json", work / f"{phase}.log"):
        if raw.exists():
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(raw, dest / raw.name)


def model_hashes(args) -> dict:
    """The served target's and drafter's hashes, from their train records (None where a model has
    none: a random drafter)."""
    def read(path: Path, key: str):
        return json.loads(path.read_text()).get(key) if path.exists() else None

    return {"target_sha256": read(args.model / "train-record.json", "target_sha256"),
            "drafter_sha256": read(args.drafter / "drafter-train-record.json", "drafter_sha256")}


def meta(args) -> dict:
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "gpu": args.gpu, "model": str(args.model), "drafter": str(args.drafter), **model_hashes(args),
            "command": args.command, "sets": SETS + args.set,
            "extra_args": EXTRA_ARGS + args.vllm_arg, "reference_sets": REFERENCE_SETS + REFERENCE_EXTRA,
            "numerics": "exact: VLLM_BATCH_INVARIANT=1, compile backend eager" if args.exact_numerics else "default"}


PHASES = {"reference": reference, "dflash": dflash, "stock": stock, "bench": bench_phase, "speed": speed,
          "conformance-twin": lambda args: conformance_phase(args, "conformance-twin"),
          "conformance": lambda args: conformance_phase(args, "conformance")}
# The raw records a phase leaves (the speed phase runs two servers)
RECORDS = {"speed": ("speed-reference", "speed-dflash")}


def run_phase(args, name: str) -> None:
    print(f"[{name}] ...", flush=True)
    PHASES[name](args)
    # After each phase: a command cut short keeps what finished, the raw phase first, so a later
    # machine can take it back (remote.sh served seeds .stage/served-raw) whatever the record does.
    for record in RECORDS.get(name, (name,)):
        keep_raw(args.work, args.out / args.raw_name, record)
    try:
        assemble(args.work, args.out, meta(args))
    except Exception:  # noqa: BLE001 - the final assemble in main() reports it; the other phases go on
        traceback.print_exc()


def run_phases(args, names: list[str]) -> None:
    """One after another, or with --parallel side by side (starts ``--stagger-s`` apart: the
    servers' start-ups are CPU-bound and share the host's cores)."""
    if not args.parallel:
        for name in names:
            run_phase(args, name)
        return
    threads = []
    for i, name in enumerate(names):
        if i:
            time.sleep(args.stagger_s)
        threads.append(threading.Thread(target=run_phase, args=(args, name), name=f"phase-{name}"))
        threads[-1].start()
    for t in threads:
        t.join()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phases", default="reference,dflash,stock")
    parser.add_argument("--recipe", default=RECIPE, choices=[RECIPE, f"{RECIPE}-text"],
                        help="the multimodal recipe or its text-only twin (both serve the drafter)")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--drafter", type=Path, required=True)
    parser.add_argument("--site-patched", required=True, help="PYTHONPATH of the patched vLLM")
    parser.add_argument("--site-stock", help="PYTHONPATH of the stock vLLM")
    parser.add_argument("--series-hash", default=None)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--gpu", default="")
    parser.add_argument("--deadline-s", type=float, default=540, help="for every phase of this command together")
    parser.add_argument("--set", action="append", default=[], help="one more launcher --set for every server")
    parser.add_argument("--vllm-arg", action="append", default=[],
                        help="one more vLLM argument (after `--`) for every server, e.g. --vllm-arg=--enforce-eager")
    parser.add_argument("--exact-numerics", action="store_true",
                        help="every server with VLLM_BATCH_INVARIANT=1 and compile backend eager (EXACT_ENV, EXACT_ARGS)")
    parser.add_argument("--raw-name", default="served-raw",
                        help="OUT's folder for the raw phase records (remote.sh seeds .stage/NAME)")
    parser.add_argument("--port-base", type=int, default=8000,
                        help="the phases' ports are this plus PORT_OFFSETS; another served.py beside this one "
                             "takes another base")
    parser.add_argument("--parallel", action="store_true",
                        help="the phases side by side, each its own server (one GPU holds them: give every server "
                             "--kv-cache-memory-bytes, so that none sizes its cache from a memory profile the "
                             "others skew)")
    parser.add_argument("--stagger-s", type=float, default=15, help="--parallel: seconds between phase starts")
    parser.add_argument("--command", default="bash tests/gpu/remote.sh served",
                        help="the record's regeneration command (remote.sh passes the verb that ran)")
    parser.add_argument("--assemble-only", action="store_true")
    parser.add_argument("--zlab", type=Path, help="zlab_reference.py's record: the conformance phase's prefixes")
    parser.add_argument("--variant", default=None,
                        help="what sets --site-patched apart from the whole series (e.g. \"without ID\"), recorded")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Absolute: the launcher and launcher bench run in a folder of their own.
    for key in ("model", "drafter", "work", "out"):
        setattr(args, key, getattr(args, key).resolve())
    args.work.mkdir(parents=True, exist_ok=True)
    args.started = time.time()
    args.deadline = args.started + args.deadline_s
    names = [] if args.assemble_only else [p for p in args.phases.split(",") if p]
    for name in names:
        if name not in PHASES:
            parser.error(f"unknown phase {name!r}: {', '.join(PHASES)}")
        if name == "stock" and not args.site_stock:
            parser.error("the stock phase needs --site-stock")
        if name == "conformance" and not (args.zlab and args.zlab.is_file()):
            # read once, at the phase's start: without it no prompt is served again stopped at
            # its prefix, and the pooled prefix acceptance cannot be judged afterwards
            parser.error(f"the conformance phase needs z-lab's record (--zlab {args.zlab or 'not given'}): "
                         "run `remote.sh zlab-reference` first, or set SERVED_ZLAB to a committed record")
    if args.parallel and {"dflash", "bench"} <= set(names):
        parser.error("the dflash and bench phases share a port: not side by side")
    if "speed" in names and args.exact_numerics:
        parser.error("the speed phase measures the numerics users run: not with --exact-numerics")
    if "speed" in names and len(names) > 1:
        parser.error("the speed phase runs alone: another phase's server would share the GPU it measures")
    if args.exact_numerics:
        # Inherited by every `launcher serve` (launcher_env) and so by each vLLM it starts.
        os.environ.update(EXACT_ENV)
        args.vllm_arg = args.vllm_arg + EXACT_ARGS
    run_phases(args, names)
    assemble(args.work, args.out, meta(args))
    for line in ran_summary(args.work, names):
        print(line, flush=True)
    failed = failed_servers(args.work, names)
    for line in failed:
        print(f"FAILED {line}", file=sys.stderr, flush=True)
    return 1 if failed else 0


def failed_servers(work: Path, names: list[str]) -> list[str]:
    """This run's servers that did not do their part: a record missing, an error, a server that
    did not start or was skipped, a speed pair not benched. The stock phase's refusal or failed
    start is its finding, not a failure (the stock vLLM is expected to fail this recipe)."""
    out = []
    for name in names:
        for rec in RECORDS.get(name, (name,)):
            path = work / f"{rec}.json"
            phase = json.loads(path.read_text()) if path.exists() else None
            if phase is None:
                out.append(f"{rec}: no record in {work}")
            elif name == "stock":
                continue
            elif phase.get("error") or phase.get("skipped") or phase.get("started") is False:
                out.append(f"{rec}: {phase.get('error') or phase.get('skipped') or 'did not start'}")
            elif phase.get("speed_skipped"):
                out.append(f"{rec}: {phase['speed_skipped']}")
    return out


def ran_summary(work: Path, names: list[str]) -> list[str]:
    """One line per server the phases NAMES ran, from their own records in WORK. The assembled
    served.json also holds the rows of earlier runs and other folders: printed as this run's,
    a log of a twin-only run showed DFlash and stock results it never measured."""
    lines = []
    for name in names:
        for rec in RECORDS.get(name, (name,)):
            path = work / f"{rec}.json"
            if not path.exists():
                lines.append(f"{rec}: no record in {work}")
                continue
            phase = json.loads(path.read_text())
            row = next(iter(report.rows({rec: phase})), {})
            lines.append(f"{rec}: started={phase.get('started')} ready_s={phase.get('ready_s')} "
                         f"prompts={len(phase.get('rows') or [])} lossless={row.get('lossless')} "
                         f"acceptance={row.get('acceptance_length')} stock_error={row.get('stock_error')}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
