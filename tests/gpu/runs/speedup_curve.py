"""Measure the speed-up curve on the GPU host, a batch at a time, into ``speedup-curve.json`` (issue 53).

Each batch (``speedup_grid.batches``) starts one server of the full-size random-weight checkpoint
through ``launcher serve`` (the rtx5090 profile inside the card's memory, as ``fullsize_serve.py``
does: the memory blocker, the scaled fraction) and measures the batch's pending points on it
(``speedup_record.pending``), saving the record after every measurement:

* the server without the drafter: each point's baseline (a warm-up round with a cache salt, then
  the point's prompts at its concurrency, greedy, ``ignore_eos``; output tok/s and TPOT from
  ``launcher.bench.client``), measured once a concurrency and variant and shared by that
  concurrency's other Ks and levels (``shared_baseline``);
* the references (each prompt's greedy continuation, ``output_len + 15`` token ids, kept in
  ``--refs``: the oracle's plan needs them; one set a release, K, concurrency and variant, whose
  levels share their prompts), by default on the DFlash server at the point's K and
  concurrency before its plan exists, so with the real drafter (``dflash_references``: the verify
  steps' rounding, which the timed runs have; the plugin reads the plan once it is written,
  ``ORACLE_PLAN_LATER``), with ``--refs-from nodrafter`` on the server without the drafter one
  request at a time;
* the real drafter's control (``oracle_control``): on the DFlash server right before each
  planned-1.0 point, with no plan, that point's prompts timed as a point is; the report sets the
  oracle's planned-1.0 TPOT against it when both ran on one server (bars.yaml ``max_oracle_cost``);
* a DFlash server at K: the oracle proposer's plugin (``oracle_plugin/``) with, before each
  point, that point's plan (its prompts, references and first-wrong pattern, ``speedup_grid.f_cycle``), its
  log off (``ORACLE_LOG=off``: drafts gathered on the device, ``oracle.DeviceDrafts``): the
  drafter's forward runs, its proposals are replaced. Each point: the same warm-up and timed
  run, and the acceptance from ``/metrics`` around the run.

A batch ends with the record written to ``--record`` (and, with ``--commit``, committed there);
a rerun reads it and measures only what is missing. The record must name the frozen record
(``--frozen``) it started from. With ``--deadline-s`` no server starts without the time for its
start and one point, and no point starts without its time: the run stops between points, its
record saved, and exits 3 (run again). A server that does not start fails its batch alone.
A DFlash server measures its points by planned level, lowest first. A point whose measured
acceptance is under ``OFF_PLAN`` of its planned level is marked ``off_plan``; at a planned level
of 3 or more no point of that level or higher is measured on the server (the references no longer
follow what it generates, so those levels cannot be reached).

``python tests/gpu/runs/speedup_curve.py plan``  the batches and what each still has to measure
``python tests/gpu/runs/speedup_curve.py run --vllm V --site-label L ...``  the pending batches of release V
``python tests/gpu/runs/speedup_curve.py merge LANE.json ...``  lanes' records (a run's ``--lane-dir``) into ``--record``
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import traceback
import types
import urllib.request
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # tests/gpu
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
sys.path.insert(1, str(REPO))

import fullsize_serve as fsv  # noqa: E402
import memfit  # noqa: E402
import speedup_grid as sg  # noqa: E402
import speedup_record as srec  # noqa: E402

ORACLE_PLUGIN = HERE / "oracle_plugin"
REFERENCE_EXTRA = max(sg.KS)  # tokens past output_len: a verify may accept drafts past max_tokens
WARM_UP_TOKENS = 16
# A server's start with the drafter on vLLM 0.33.0 at full size took up to 431 s (speedup_frozen).
SERVER_START_S = 480
# One point: its warm-up and 32 requests of 256 tokens at concurrency 1, about 9 ms a token at
# K 15 (75 s), and on the server without the drafter its 32 references one at a time (about 40 s).
POINT_S = 150
# A DFlash point measuring under this fraction of its planned acceptance length is off plan.
OFF_PLAN = 0.6
# Where a DFlash point's references come from (the first is the default): a DFlash server at the
# point's K and concurrency with the real drafter, or the server without the drafter one request
# at a time.
REFS_FROM = ("dflash", "nodrafter")
# One request of 256 tokens takes seconds: a server that stops answering must not hold a lane
# past the run's deadline for long.
REQUEST_TIMEOUT_S = 180.0


class OutOfTime(Exception):
    """The deadline leaves no time for the next server or point: run again."""


def left(args) -> float:
    """Seconds to the run's deadline (infinite without one)."""
    end = getattr(args, "end", None)
    return float("inf") if end is None else end - time.monotonic()


def request_timeout(args) -> float:
    """A request's limit: REQUEST_TIMEOUT_S, less where the deadline is nearer (a server that
    stops answering must not hold the lane past it)."""
    return max(10.0, min(REQUEST_TIMEOUT_S, left(args)))


def off_plan(point: sg.Point, measurement: dict) -> bool:
    acc = (measurement.get("acceptance") or {}).get("mean_acceptance_length")
    return acc is not None and acc < OFF_PLAN * point.level


# ------------------------------------------------------------------ one measurement


def _run(concurrency: int, output_len: int):
    """What launcher.bench.client.run_level reads of a workload run."""
    return types.SimpleNamespace(concurrency=concurrency, workload=types.SimpleNamespace(output_len=output_len))


def measure(base: str, model: str, point: sg.Point, prompts: list, *, with_drafter: bool, meta: dict,
            timeout: float = REQUEST_TIMEOUT_S, check=None) -> dict:
    """One timed run of the point's prompts at its concurrency, after an unmeasured warm-up
    round; the acceptance is the /metrics counters' difference around the timed run. ``check``:
    called after the warm-up, before the timed run (it raises when the server is not ready for
    it: the oracle has not read its plan, or has not let it go)."""
    from launcher.bench import client, metrics

    target = client.Target(base, model, None)
    run = _run(point.concurrency, sg.OUTPUT_LEN)
    common = dict(temperature=0.0, seed=0, ignore_eos=True, timeout=timeout)
    client.run_level(target, run, prompts[:point.concurrency], max_tokens=WARM_UP_TOKENS,
                     extra={**point.extra, "cache_salt": f"speedup-warm-up-{uuid.uuid4().hex}"}, **common)
    if check is not None:
        check()
    before = metrics.scrape(base)
    # a salt of its own: the points of a concurrency share their prompts (speedup_grid.prompts)
    res = client.run_level(target, run, prompts, extra={**point.extra, "cache_salt": f"speedup-{uuid.uuid4().hex}"},
                           **common)
    after = metrics.scrape(base)
    return {**meta, "with_drafter": with_drafter, "successful": res["completed"], "failed": res["failed"],
            "errors": res["errors"], "output_tok_s": res["output_throughput"], "duration_s": res["duration"],
            "tpot_ms_mean": res["mean_tpot_ms"], "tpot_ms_p99": res["p99_tpot_ms"],
            "ttft_ms_mean": res["mean_ttft_ms"], "output_tokens": res["total_output_tokens"],
            "acceptance": metrics.acceptance(before, after) if with_drafter else None}


def reference(base: str, model: str, prompt: list[int], max_tokens: int,
              timeout: float = REQUEST_TIMEOUT_S) -> list[int]:
    """The server's greedy continuation of ``prompt`` as token ids (``return_token_ids``, else
    the logprobs' ``token_id:N`` strings)."""
    # salted: the timed run of the same prompts must not find them in the prefix cache
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "return_token_ids": True, "logprobs": 1, "return_tokens_as_token_ids": True,
            "cache_salt": "speedup-references"}
    req = urllib.request.Request(f"{base}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        choice = json.loads(resp.read())["choices"][0]
    return token_ids(choice)


def token_ids(choice: dict) -> list[int]:
    if isinstance(choice.get("token_ids"), list):
        return [int(t) for t in choice["token_ids"]]
    tokens = (choice.get("logprobs") or {}).get("tokens") or []
    if not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens) or not tokens:
        raise ValueError("the server returned neither token_ids nor token_id:N logprob tokens")
    return [int(t.split(":", 1)[1]) for t in tokens]


def shared_baseline(record: dict, point: sg.Point, meta: dict) -> dict | None:
    """A baseline this point can take from another: without the drafter the run's cost does not
    depend on K or the planned level, only on the release, concurrency and variant (prompt
    length, logprobs), so one 32-request measurement a (concurrency, variant) stands for all its
    points, measured on the same GPU and series; the copy names the point it came from. A
    ``dtail`` point sends the plain points' requests (``requests_like``), so it takes theirs, and
    they its own where it measured one."""
    for pid, row in sorted(record.get("points", {}).items()):
        base = row.get("baseline")
        if (pid != point.id and srec.valid(base, "baseline") and not base.get("shared_from")
                and (row.get("vllm"), row.get("concurrency"), sg.requests_like(row.get("variant")))
                == (point.vllm, point.concurrency, point.requests_like)
                and base.get("gpu") == meta.get("gpu") and base.get("series") == meta.get("series")):
            return {**base, "shared_from": pid}
    return None


# ------------------------------------------------------------------ references


def ref_path(refs: Path, point: sg.Point) -> Path:
    """A point's references, shared by the levels of its release, K, concurrency and variant
    (they send the same prompts and are made at that K; a ``dtail`` point's are the plain ones)."""
    return refs / f"v{point.vllm}-k{point.k}-c{point.concurrency}-{point.requests_like}.json"


def has_reference(refs: Path):
    return lambda point: ref_path(refs, point).is_file()


def reference_origin(refs: Path, point: sg.Point) -> dict | None:
    """Where a point's references were made (``made_on``: ``k<K>`` or ``nodrafter``, the GPU and
    series), or None without them."""
    path = ref_path(refs, point)
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return {key: data.get(key) for key in ("made_on", "gpu", "series")} | {
        "made_on": data.get("made_on") or "nodrafter"}


def usable_reference(refs: Path, point: sg.Point, k: int, from_nodrafter: bool, meta: dict) -> bool:
    """References this DFlash server may draft on: made the way the run asks (on a DFlash server
    at this K, or on the server without the drafter), on the same GPU and series where they say."""
    origin = reference_origin(refs, point)
    if origin is None:
        return False
    if origin["made_on"] != ("nodrafter" if from_nodrafter else f"k{k}"):
        return False
    return all(origin.get(key) in (None, meta.get(key)) for key in ("gpu", "series"))


def oracle_plan(path: Path, points: list[sg.Point], refs: Path, k: int, vocab_size: int, tail: str = "reference") -> dict:
    """A plan for a DFlash server: the points' prompts, references and first-wrong pattern (the
    curve writes one point's before each point: the levels share their prompts); ``tail``: what
    a proposal holds past its first wrong position (``oracle.TAILS``)."""
    import oracle

    prompts, references, max_tokens, cycles = [], [], [], []
    for p in points:
        data = json.loads(ref_path(refs, p).read_text())
        cycle = sg.f_cycle(p.level, k)
        for prompt, ref in zip(data["prompts"], data["references"]):
            prompts.append(prompt)
            references.append(ref)
            max_tokens.append(sg.OUTPUT_LEN)
            cycles.append(cycle)
    return oracle.make_plan_file(path, prompts, references, max_tokens, vocab_size, k=k, f_cycles=cycles, tail=tail)


# ------------------------------------------------------------------ a server


class Server:
    """The memory blocker and ``launcher serve`` (fullsize_serve's helpers), stopped on exit."""

    def __init__(self, args, label: str, k: int | None, env: dict):
        self.args, self.label, self.k, self.env = args, label, k, env
        self.blocker = self.proc = self.log = None
        self.base = f"http://127.0.0.1:{args.port}"
        self.id = uuid.uuid4().hex[:12]  # names the server in its measurements (a control's pair)

    def __enter__(self):
        try:
            return self._start()
        except BaseException:
            self.__exit__()  # a server that did not start leaves no blocker or half-started vLLM behind
            raise

    def _start(self):
        a = self.args
        card = memfit.CARDS[a.profile]
        settings = fsv.profile_settings(a.recipe, a.profile, fsv.served_release())
        self.blocker = subprocess.Popen(shlex.split(a.blocker) + ["--leave-free", str(card.total_bytes)],
                                        stdout=subprocess.PIPE, text=True, start_new_session=True)
        events = fsv.read_json_lines(self.blocker.stdout, 2, fsv.now() + 120)
        if len(events) < 2:
            raise RuntimeError(f"the memory blocker did not report ({events})")
        fraction = memfit.plan(card, settings["gpu_memory_utilization"], events[0]["total"])["scaled_fraction"]
        ns = types.SimpleNamespace(launcher=a.launcher, recipe=a.recipe, profile=a.profile, model=a.model,
                                   port=a.port, no_drafter=self.k is None, drafter=a.drafter,
                                   set=[] if self.k is None else [f"drafter.num_speculative_tokens={self.k}"],
                                   vllm_arg=a.vllm_arg)
        env = {**fsv.server_env(), **self.env}
        self.log = log = open(Path(a.work) / f"{self.label}.server.log", "w")
        started = time.monotonic()
        self.proc = subprocess.Popen(fsv.server_argv(ns, fraction), stdout=log, stderr=subprocess.STDOUT,
                                     env=env, cwd=REPO, start_new_session=True)
        problem = fsv.wait_healthy(self.base, self.proc, fsv.now() + min(a.start_timeout_s, left(a) - POINT_S))
        if problem:
            raise RuntimeError(f"{self.label}: server {problem} after {time.monotonic() - started:.0f} s (log {log.name})")
        log.flush()
        server_starts[self.label] = {"total_s": round(time.monotonic() - started, 1),
                                     **srec.start_phases(Path(log.name).read_text(errors="replace"))}
        from launcher.bench.runner import server_models

        self.model = server_models(self.base, None)[0]
        return self

    def __exit__(self, *exc):
        for proc in (self.proc, self.blocker):
            if proc is not None:
                fsv.stop_group(proc)
                gone(proc.pid)
        if self.proc is not None:
            port_free(self.args.port)
        if getattr(self, "log", None):
            self.log.close()
        return False


def gone(pgid: int, timeout: float = 60.0) -> None:
    """Until no process of the group ``pgid`` is left: the launcher's exit does not end vLLM's
    engine core, whose GPU memory and port the next server on this lane needs."""
    end = time.monotonic() + timeout
    try:
        os.killpg(pgid, signal.SIGKILL)
        while time.monotonic() < end:
            os.killpg(pgid, 0)
            time.sleep(0.5)
    except (ProcessLookupError, PermissionError):
        pass


def port_free(port: int, timeout: float = 60.0) -> bool:
    """Until 127.0.0.1:``port`` passes the check the next ``launcher serve`` makes of it."""
    from launcher.errors import LauncherError
    from launcher.runtime.native import ensure_port_free

    end = time.monotonic() + timeout
    while True:
        try:
            ensure_port_free("127.0.0.1", port)
            return True
        except LauncherError:
            if time.monotonic() >= end:
                return False
        time.sleep(0.5)


# ------------------------------------------------------------------ batches


# The points each batch has measured so far in this run (kept when OutOfTime ends one midway)
batch_done: dict[str, list[str]] = {}
# A server's start by label (a batch's id): seconds from launch to its health check, and the
# phases vLLM's log states (speedup_record.start_phases). The record keeps them, since a server's start, not its
# points, decides how many batches fit a GPU host's hold
server_starts: dict[str, dict] = {}

def run_batch(args, batch: sg.Batch, record: dict, meta: dict) -> list[str]:
    """Measure the batch's pending points; the record is saved after each. Returns their ids."""
    refs = Path(args.refs)
    refs.mkdir(parents=True, exist_ok=True)
    from_nodrafter = getattr(args, "refs_from", REFS_FROM[0]) == "nodrafter"
    only = getattr(args, "only", None)
    shared = share_baselines(record, [p for p in batch.points if not only or p.id in only], meta)
    if shared:
        srec.save(record, args.record)
    todo = srec.pending(batch, record, has_reference(refs) if from_nodrafter else (lambda p: True))
    if only:
        todo = [p for p in todo if p.id in only]
    if batch.server == "nodrafter":
        todo = baselines_measurable_here(record, todo, meta)
        if todo:  # the server starts: the second oracle's points still to run take a baseline too
            todo += [p for p in tail_baselines_to_come(record, batch, meta) if not only or p.id in only]
    if not todo:
        return shared if batch.server == "nodrafter" else []
    if left(args) < SERVER_START_S + POINT_S:
        raise OutOfTime(f"{batch.id}: {left(args):.0f} s left, under a server's start and a point")
    from launcher.bench import workload

    vocab = workload.vocab_size(args.model)
    if batch.server == "nodrafter":
        return nodrafter_batch(args, batch, todo, record, meta, vocab, refs if from_nodrafter else None)
    return dflash_batch(args, batch, todo, record, meta, vocab, refs, from_nodrafter)


def baselines_measurable_here(record: dict, todo: list, meta: dict) -> list:
    """``todo`` less the points whose DFlash run was measured on another GPU or series than this
    run's: a baseline is paired with the DFlash run of the same GPU and series, so theirs must be
    measured on a host like the one that ran it (each left out is named)."""
    keep = []
    for p in todo:
        dflash = (record.get("points", {}).get(p.id) or {}).get("dflash") or {}
        where = (dflash.get("gpu"), dflash.get("series"))
        if srec.valid(dflash, "dflash") and where != (meta.get("gpu"), meta.get("series")):
            print(f"{p.id}: its baseline is measured on the GPU and series of its DFlash run "
                  f"({where[0]!r}, series {str(where[1])[:8]}), not here", flush=True)
            continue
        keep.append(p)
    return keep


def tail_baselines_to_come(record: dict, batch: sg.Batch, meta: dict) -> list:
    """The batch's second-oracle points with neither phase whose plain twins' baseline was not
    measured on this run's GPU and series: on a server without the drafter started for others,
    a baseline is measured for them here (the first; the rest of its cell share it), in case
    their DFlash run follows on this GPU (a run elsewhere measures its own)."""
    return [p for p in batch.points if p.variant == sg.TAIL_VARIANT
            and srec.missing(record, p)[:2] == ["baseline", "dflash"] and shared_baseline(record, p, meta) is None]


def share_baselines(record: dict, points: list, meta: dict) -> list[str]:
    """The points lacking a baseline that another point's can stand for (``shared_baseline``),
    given it here: a batch whose points need nothing else starts no server."""
    out = []
    for p in points:
        if "baseline" in srec.missing(record, p):
            base = shared_baseline(record, p, meta)
            if base is not None:
                srec.put(record, p, "baseline", base)
                out.append(p.id)
    return out


def nodrafter_batch(args, batch, todo, record, meta, vocab, refs) -> list[str]:
    """Baselines (shared a concurrency and variant), and with ``refs`` the references too."""
    done = []
    with Server(args, f"{batch.id}", None, {}) as server:
        for p in todo:
            if left(args) < POINT_S:
                raise OutOfTime(f"{p.id}: {left(args):.0f} s left, under a point's {POINT_S}")
            prompts = sg.prompts(p, vocab)
            if "baseline" in srec.missing(record, p):
                srec.put(record, p, "baseline", shared_baseline(record, p, meta) or measure(
                    server.base, server.model, p, prompts, with_drafter=False, meta=meta,
                    timeout=request_timeout(args)))
                srec.save(record, args.record)
            if refs is not None and "dflash" in srec.missing(record, p) and not ref_path(refs, p).is_file():
                outs = [reference(server.base, server.model, q, sg.OUTPUT_LEN + REFERENCE_EXTRA,
                                  timeout=request_timeout(args)) for q in prompts]
                write_reference(refs, p, prompts, outs, "nodrafter", meta)
            done.append(p.id)
            batch_done[batch.id] = done
    return done


def dflash_env(args, plan: Path, later: bool = False) -> dict:
    """A DFlash server's environment: the oracle plugin on the path and its plan; ``later``: the
    plan is written after the server started, one point's at a time, and read again whenever it
    is replaced (until the first, the real drafter proposes: references, controls)."""
    env = {"ORACLE_LOG": "off", "ORACLE_RELEASE": args.vllm, "ORACLE_PLAN": str(plan)}
    if later:
        env["ORACLE_PLAN_LATER"] = "1"
    if args.vllm == sg.MAIN_VLLM:
        env["VLLM_USE_V2_MODEL_RUNNER"] = "1"  # the oracle's 0.33.0 hook is the V2 runner's
    env["PYTHONPATH"] = fsv.server_env()["PYTHONPATH"] + ":" + str(ORACLE_PLUGIN)
    return env


def references_at(base: str, model: str, prompts: list, max_tokens: int, concurrency: int,
                  timeout: float = REQUEST_TIMEOUT_S) -> list[list[int]]:
    """Each prompt's greedy continuation, ``concurrency`` requests at a time in lockstep waves
    (the batch shape the point's timed run has)."""
    from concurrent.futures import ThreadPoolExecutor

    outs = []
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for i in range(0, len(prompts), concurrency):
            outs += list(pool.map(lambda q: reference(base, model, q, max_tokens, timeout=timeout),
                                  prompts[i:i + concurrency]))
    return outs


def dflash_references(args, server, batch, k: int, points: list, vocab: int, refs: Path, meta: dict,
                      usable=lambda p: False) -> None:
    """References made on the DFlash server at K before the oracle's plan exists, so with the
    real drafter, whose random drafts are all but never accepted: every token is the target's
    argmax as the timed runs' verify steps compute it (K + 1 tokens a request a step, the point's
    concurrency), not as a one-token decode step does, whose other rounding parts a random
    target's near-tied tokens."""
    for p in points:
        if usable(p):  # made for another level of the same concurrency and variant
            continue
        if left(args) < 2 * POINT_S:  # keep the time to measure a point on them
            print(f"{batch.id}: references stop at {p.id}, {left(args):.0f} s left", flush=True)
            break
        prompts = sg.prompts(p, vocab)
        outs = references_at(server.base, server.model, prompts, sg.OUTPUT_LEN + REFERENCE_EXTRA, p.concurrency,
                             timeout=request_timeout(args))
        write_reference(refs, p, prompts, outs, f"k{k}", meta)


def write_reference(refs: Path, point: sg.Point, prompts: list, outs: list, made_on: str, meta: dict) -> None:
    """A point's references, written whole (another lane may pack the folder meanwhile)."""
    path = ref_path(refs, point)
    tmp = path.with_suffix(".partial")
    tmp.write_text(json.dumps({"prompts": prompts, "references": outs, "made_on": made_on,
                               "gpu": meta.get("gpu"), "series": meta.get("series")}))
    tmp.replace(path)


def pack_references(args, refs: Path) -> None:
    """The references beside the record (``<record>-refs.tar.gz``; a lane's in its lane folder),
    so that a host released mid-run has sent them back and a later one stages them again."""
    import tarfile

    out = Path(args.record).with_name(Path(args.record).stem + "-refs.tar.gz")
    tmp = out.with_suffix(".partial")
    with tarfile.open(tmp, "w:gz") as tar:
        for f in sorted(refs.glob("*.json")):
            tar.add(f, arcname=f"speedup-refs/{f.name}")
    tmp.replace(out)


def oracle_adopted(plan: Path) -> Path:
    """The marker the oracle leaves once it has read a plan written after its server started."""
    import oracle

    return oracle.adopted_marker(plan)


def oracle_gather_marker(plan: Path) -> Path:
    """The marker in which the server's oracle says how it gathers its drafts."""
    import oracle

    return oracle.gather_marker(plan)


def oracle_gather(plan: Path) -> str:
    """How the server's oracle gathered its drafts, as it said (``graph``, or ``eager: `` and why);
    ``unknown`` where it said nothing."""
    said = oracle_gather_marker(plan)
    return said.read_text().strip() if said.exists() else "unknown"


def ready_points(todo: list, usable) -> list:
    """The points with usable references; the others said."""
    ready = [p for p in todo if usable(p)]
    for p in sorted(set(todo) - set(ready), key=lambda q: q.id):
        print(f"{p.id}: no usable references here (made on this run's kind of server, GPU and series)", flush=True)
    return ready


def point_plan(plan: Path, point: sg.Point, refs: Path, k: int, vocab: int, tail: str = "reference") -> None:
    """The oracle's plan for one point, written whole over the last (the server's oracle reads it
    at its next propose call, the warm-up's), its marker removed first: after the timed run the
    marker shows that this plan was read."""
    oracle_adopted(plan).unlink(missing_ok=True)
    oracle_plan(plan, [point], refs, k, vocab, tail)


def collapse_key(point: sg.Point, k: int, from_nodrafter: bool) -> str:
    """Where a collapse holds: one release, K and concurrency, with references made one way
    (references made another way are tried afresh)."""
    return f"v{point.vllm}-k{k}-c{point.concurrency}-refs-{'nodrafter' if from_nodrafter else 'dflash'}"


def oracle_control(args, server, point: sg.Point, record: dict, meta: dict, vocab: int, plan: Path,
                   planned: bool, after: bool = False) -> None:
    """The real drafter timed on ``point``'s prompts right before the point, on its server, with
    no plan (a plan written earlier on this server is removed first, and the oracle must mark that
    it let it go before the timed run): the oracle's planned-1.0 run then rejects every draft as
    the random drafter does. What differs is what the oracle costs (bars.yaml
    ``speedup_curve.max_oracle_cost``, judged against this control). ``after``: the same control
    again right after the point (``srec.AFTER``), so the report shows how far two runs of the real
    drafter on one server lie apart beside the cost; it judges nothing."""
    import oracle

    dropped = oracle.dropped_marker(plan)
    dropped.unlink(missing_ok=True)
    plan.unlink(missing_ok=True)

    def let_go():
        if planned and not dropped.exists():
            raise RuntimeError(f"{point.id}: the oracle still holds its last plan; no control recorded")

    got = measure(server.base, server.model, point, sg.prompts(point, vocab), with_drafter=True,
                  timeout=request_timeout(args), check=let_go,
                  meta={**meta, "prompts_of": point.id, "oracle": "no plan", "server": server.id})
    record.setdefault(srec.AFTER if after else srec.BEFORE, {})[srec.control_key(point)] = got
    srec.save(record, args.record)


def dflash_batch(args, batch, todo, record, meta, vocab, refs: Path, from_nodrafter: bool) -> list[str]:
    """The DFlash points of one K on one server: their references first where they are made on
    a DFlash server and are not here yet, before any plan exists; then each point with its own
    plan (``point_plan``), a planned-1.0 point right after the real drafter's control on its
    prompts (``oracle_control``)."""
    k = int(batch.server[1:])
    usable = lambda p: usable_reference(refs, p, k, from_nodrafter, meta)  # noqa: E731
    unmade = [p for p in todo if not usable(p)]
    make_here = bool(unmade) and not from_nodrafter
    plan = (Path(args.work) / f"{batch.id}.plan.json").resolve()  # the server's cwd is another
    plan.unlink(missing_ok=True)  # an earlier run's plan must not be read before this one's
    oracle_adopted(plan).unlink(missing_ok=True)
    oracle_gather_marker(plan).unlink(missing_ok=True)
    if not make_here and not any(usable(p) for p in todo):
        ready_points(todo, usable)  # says which lack references
        return []
    done, collapsed, planned = [], record.setdefault("collapsed", {}), False
    with Server(args, batch.id, k, dflash_env(args, plan, later=True)) as server:
        if make_here:
            try:
                dflash_references(args, server, batch, k, unmade, vocab, refs, meta, usable)
            finally:
                pack_references(args, refs)
        ready = ready_points(todo, usable)
        if not ready:
            raise OutOfTime(f"{batch.id}: no time left to make its references")
        for p in sorted(ready, key=lambda q: (q.variant != "base", q.level)):
            at = collapsed.get(collapse_key(p, k, from_nodrafter))
            if at is not None and p.level >= at:
                print(f"{p.id}: not measured, acceptance collapsed at a planned {at:g}", flush=True)
                continue
            if srec.needs_control(p):
                if left(args) < 2 * POINT_S:
                    print(f"{p.id}: not measured, {left(args):.0f} s left for it and its control", flush=True)
                    continue
                oracle_control(args, server, p, record, meta, vocab, plan, planned)
            if left(args) < POINT_S:
                raise OutOfTime(f"{p.id}: {left(args):.0f} s left, under a point's {POINT_S}")
            point_plan(plan, p, refs, k, vocab, p.tail)
            planned = True

            def adopted(p=p):
                if not oracle_adopted(plan).exists():
                    raise RuntimeError(f"{p.id}: the oracle did not read its plan {plan}; nothing recorded")

            got = measure(server.base, server.model, p, sg.prompts(p, vocab), with_drafter=True,
                          timeout=request_timeout(args), check=adopted,
                          meta={**meta, "f_cycle": sg.f_cycle(p.level, k), "planned_level": p.level,
                                "refs_from": reference_origin(refs, p)["made_on"], "server": server.id})
            got["off_plan"] = off_plan(p, got)
            got["gather"] = oracle_gather(plan)
            srec.put(record, p, "dflash", got)
            srec.save(record, args.record)
            done.append(p.id)
            batch_done[batch.id] = done
            if srec.needs_control(p) and left(args) >= 2 * POINT_S:  # the next point's time kept
                oracle_control(args, server, p, record, meta, vocab, plan, planned, after=True)
            if got["off_plan"] and p.level >= 3:
                collapsed[collapse_key(p, k, from_nodrafter)] = p.level
                srec.save(record, args.record)
                print(f"{p.id}: acceptance {got['acceptance'].get('mean_acceptance_length'):.2f} against a planned "
                      f"{p.level:g}: the references no longer follow this server's output; no higher level "
                      "is measured on it", flush=True)
    unmade = [p for p in todo if not usable(p)]
    if make_here and unmade:  # the deadline stopped the references: what was made is measured
        raise OutOfTime(f"{batch.id}: {len(unmade)} points still without references")
    return done


def lane_batches(batches: list, lane: str | None, refs_from: str = "nodrafter", pending=None) -> list:
    """``I/N``: a lane's share (None: all). With references from the server without the drafter,
    those servers go round the lanes in order and each DFlash batch runs in the lane that made
    the references of its points, after that lane's servers without the drafter, so no lane
    drafts on references another has yet to make. With references made by the DFlash batches
    themselves, the batches are balanced (``balanced_lanes``) on what each still has to measure
    (``pending(batch)``: its count of points; None: all of them)."""
    if not lane:
        return batches
    i, n = (int(x) for x in lane.split("/"))
    if not 0 <= i < n:
        raise ValueError(f"--lane {lane}: I/N with 0 <= I < N")
    if refs_from == "dflash":
        return balanced_lanes(batches, n, pending)[i]
    made = [b for b in batches if b.server == "nodrafter"]
    owner = {p.id: j % n for j, b in enumerate(made) for p in b.points}
    mine = [b for j, b in enumerate(made) if j % n == i]
    for b in batches:
        if b.server != "nodrafter":
            lanes = [owner.get(p.id, 0) for p in b.points]
            if max(set(lanes), key=lanes.count) == i:
                mine.append(b)
    return mine


def batch_cost(batch: sg.Batch, pending: int | None = None) -> int:
    """A batch's weight in minutes, roughly: a server start about 5, and on a DFlash server two
    runs a point (its timed run, and its share of the references and controls, which its
    concurrency's levels share); the baselines without the drafter are shared, a few runs a batch.
    ``pending``: how many of its points are still to measure (0: it starts no server)."""
    points = len(batch.points) if pending is None else pending
    if points == 0:
        return 0
    if batch.server == "nodrafter":
        return 5 + 4
    return 5 + 2 * points


def balanced_lanes(batches: list, n: int, pending=None) -> list[list]:
    """The batches in ``n`` lanes, the costliest first into the lightest lane (``batch_cost``, on
    ``pending(batch)`` points where given: a rerun balances what is left); in each lane the
    servers without the drafter first, then the DFlash batches, each in the order ``batches`` gives."""
    cost = {b.id: batch_cost(b, None if pending is None else pending(b)) for b in batches}
    lanes, load = [[] for _ in range(n)], [0] * n
    for b in sorted(batches, key=lambda b: cost[b.id], reverse=True):
        j = load.index(min(load))
        lanes[j].append(b)
        load[j] += cost[b.id]
    order = {b.id: (b.server != "nodrafter", k) for k, b in enumerate(batches)}
    return [sorted(lane, key=lambda b: order[b.id]) for lane in lanes]


def lane_commands(argv: list[str], gpus: list[str], lane_dir: Path, port: int) -> list[tuple[list[str], dict]]:
    """One ``run`` per GPU: this command's arguments less ``--gpus`` and ``--commit``, with its lane,
    a record of its own in ``lane_dir``, a port of its own, and CUDA_VISIBLE_DEVICES."""
    import side_by_side

    base = side_by_side.without_options(argv, ("--gpus", "--record", "--port", "--lane-dir"), ("--commit",))
    n = len(gpus)
    return [([sys.executable, str(Path(__file__).resolve()), *base, "--lane", f"{i}/{n}",
              "--record", str(lane_record(lane_dir, i)), "--port", str(port + 10 * i)],
             {"CUDA_VISIBLE_DEVICES": g}) for i, g in enumerate(gpus)]


def lane_record(lane_dir: Path, i: int) -> Path:
    return lane_dir / f"speedup-curve-lane-{i}.json"


def merge_into(record: dict, paths: list[Path]) -> dict:
    """Every lane record in ``paths`` that exists merged into ``record``; then each dtail point
    measured in one lane while its plain twin's baseline was measured in another takes that
    baseline (measured on the GPU and series of its own DFlash run)."""
    for path in paths:
        if Path(path).is_file():
            srec.merge(record, json.loads(Path(path).read_text()))
    share_tail_baselines(record)
    return record


def share_tail_baselines(record: dict) -> list[str]:
    """Each measured dtail point without a baseline takes its plain twin's, measured on the GPU
    and series of its own DFlash run: the twin's may come later than the point (another lane, or
    a pilot's batches, the server without the drafter last)."""
    out = []
    for p in sg.TAIL_POINTS:
        dflash = (record.get("points", {}).get(p.id) or {}).get("dflash") or {}
        if srec.valid(dflash, "dflash"):
            out += share_baselines(record, [p], {"gpu": dflash.get("gpu"), "series": dflash.get("series")})
    return out


def run_lanes(args, argv: list[str]) -> int:
    """The release's pending batches on several GPUs at once, a lane each, then their records
    merged into ``--record`` (and committed with ``--commit``). Each lane saves its record in
    ``--lane-dir`` after every point, so what a cut run measured can be merged afterwards
    (``merge``); a lane record already there is kept and the curve merged into it."""
    gpus = args.gpus.split(",")
    lane_dir = args.lane_dir or args.work
    lane_dir.mkdir(parents=True, exist_ok=True)
    lanes = lane_commands(argv, gpus, lane_dir, args.port)
    paths = [lane_record(lane_dir, i) for i in range(len(gpus))]
    for path in paths:  # each lane starts from what the curve and its own earlier record hold
        start = merge_into(srec.load(args.record, args.frozen), [path])
        srec.save(start, path)
    procs = [subprocess.Popen(cmd, env={**os.environ, **env}) for cmd, env in lanes]
    codes = [p.wait() for p in procs]
    record = merge_into(srec.load(args.record, args.frozen), paths)
    srec.save(record, args.record)
    print(f"lanes on GPUs {args.gpus}: exit {codes}; record {args.record}", flush=True)
    if args.commit:
        commit(args.record, f"speedup-curve: lanes on {len(gpus)} GPUs (vLLM {args.vllm})")
    return lanes_code(codes)


def lanes_code(codes: list[int]) -> int:
    """The run's exit code: 0 when every lane ended 0, else the first other (a lane killed by a
    signal N as 128 + N, the shell's way), so no crash reads as a clean run."""
    from launcher.runtime.native import exit_status

    bad = [exit_status(c) for c in codes if c != 0]
    return bad[0] if bad else 0


def commit(record_path: Path, message: str) -> None:
    """Commit the record alone, where the checkout has git (a GPU host's copy may not)."""
    if subprocess.run(["git", "-C", str(REPO), "rev-parse", "--git-dir"], capture_output=True).returncode != 0:
        print("no git here: the record is in place, commit it where the checkout has git", flush=True)
        return
    subprocess.run(["git", "-C", str(REPO), "add", str(record_path)], check=True)
    subprocess.run(["git", "-C", str(REPO), "commit", "-m", message, "--", str(record_path)], check=False)


def frozen_committed(frozen: Path) -> bool:
    """This version of the frozen record is in git history (True where the checkout has no git:
    tests/unit/test_gpu_speedup_curve.py checks the order once the records are committed)."""
    import bars

    try:
        versions = bars.committed_versions(REPO, srec.FROZEN_PATH)
    except Exception:  # noqa: BLE001 - no git, or no history
        return True
    return bars.blob_hash(frozen) in versions


def plan_lines(record: dict, refs: Path, refs_from: str, lanes: int = 1) -> list[str]:
    """Each release's batches as ``run`` makes them, what each still has to measure, and with
    ``lanes`` > 1 (``--gpus`` of that many) the lane that runs it."""
    out = []
    ready = has_reference(refs) if refs_from == "nodrafter" else (lambda p: True)
    left = lambda b: len(srec.pending(b, record, ready))  # noqa: E731
    for vllm in dict.fromkeys(p.vllm for p in sg.GRID):
        batches = sg.release_batches(vllm, refs_from)
        lane_of = {b.id: f"lane {i}/{lanes}" for i in range(lanes)
                   for b in lane_batches(batches, f"{i}/{lanes}", refs_from, left)} if lanes > 1 else {}
        for b in batches:
            todo = srec.pending(b, record, ready)
            out.append(f"{b.id:28} {len(todo)}/{len(b.points)} pending  {lane_of.get(b.id, ''):10} "
                       f"{' '.join(p.id for p in todo)}".rstrip())
    return out


def server_arguments(p: argparse.ArgumentParser) -> None:
    """What a command that starts the curve's servers is told: the release, the checkpoints, how
    to start ``launcher serve``, and where its servers run."""
    p.add_argument("--vllm", required=True, choices=sorted({pt.vllm for pt in sg.GRID}))
    p.add_argument("--series-hash", required=True)
    p.add_argument("--gpu-file", type=Path)
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--drafter", type=Path, required=True)
    p.add_argument("--launcher", required=True, help="as fullsize_serve.py --launcher")
    p.add_argument("--recipe", default="gemma4-moe-dflash")
    p.add_argument("--profile", default="rtx5090")
    p.add_argument("--vllm-arg", action="append", default=[])
    p.add_argument("--port", type=int, default=8021)
    p.add_argument("--work", type=Path, default=Path("/tmp/gpu-proof/speedup"))
    p.add_argument("--start-timeout-s", type=float, default=600)
    p.add_argument("--blocker", default=shlex.join([sys.executable, str(HERE / "runs" / "mem_blocker.py")]))


def run_meta(args) -> dict:
    """What every measurement of a run names: series, release, GPU, date, the oracle's code (and its lane)."""
    gpu = args.gpu_file.read_text().strip() if args.gpu_file and args.gpu_file.is_file() else None
    return {"series": args.series_hash, "vllm": args.vllm, "gpu": gpu, "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "oracle": srec.oracle_blobs(),
            # a lane ran beside others, one a GPU of the same host
            **({"lane": args.lane} if getattr(args, "lane", None) else {})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_plan = sub.add_parser("plan")
    p_plan.add_argument("--lanes", type=int, default=1, help="the GPUs run will have: which lane runs each batch")
    p_run = sub.add_parser("run")
    for p in (p_plan, p_run):
        p.add_argument("--record", type=Path, default=REPO / srec.CURVE_PATH)
        p.add_argument("--frozen", type=Path, default=REPO / srec.FROZEN_PATH)
        p.add_argument("--refs", type=Path, default=Path("/tmp/gpu-proof/speedup-refs"))
    server_arguments(p_run)
    p_run.add_argument("--batches", type=int, default=0, help="stop after this many batches (0: all pending)")
    p_run.add_argument("--commit", action="store_true", help="git commit the record after each batch")
    p_run.add_argument("--lane", help="I/N: the I-th of every N pending batches (run_lanes starts them)")
    p_run.add_argument("--gpus", help="GPUs of this host (e.g. 0,1): a lane each, records merged after")
    p_run.add_argument("--lane-dir", type=Path, help="where each lane saves its record (default: --work)")
    for p in (p_plan, p_run):
        p.add_argument("--refs-from", choices=REFS_FROM, default=REFS_FROM[0],
                       help="where references are made (dflash: a DFlash server at the point's K and concurrency)")
    p_run.add_argument("--only", type=lambda v: set(filter(None, v.split(","))),
                       help="measure only these point ids (a pilot: does acceptance follow the plan?)")
    p_run.add_argument("--deadline-s", type=float, default=None,
                       help="stop between points before this many seconds have passed, exit 3 (default: none)")
    p_merge = sub.add_parser("merge")
    p_merge.add_argument("lanes", nargs="+", type=Path, help="lane records (speedup-curve-lane-I.json)")
    for p in (p_merge,):
        p.add_argument("--record", type=Path, default=REPO / srec.CURVE_PATH)
        p.add_argument("--frozen", type=Path, default=REPO / srec.FROZEN_PATH)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.cmd == "run" and args.deadline_s is not None and args.deadline_s < SERVER_START_S + POINT_S:
        # Each batch refuses to start its server without this much left: below it the run
        # would only say "run again" (exit 3), every time.
        parser.error(f"--deadline-s {args.deadline_s:g} holds no server start ({SERVER_START_S} s) and point "
                     f"({POINT_S} s): nothing would run; give {SERVER_START_S + POINT_S} or more "
                     f"(remote.sh speedup-curve: SPEEDUP_BUDGET_S {SERVER_START_S + POINT_S + 120} or more)")
    if not args.frozen.is_file():
        parser.error(f"{args.frozen}: measure and commit the frozen model first (remote.sh speedup-frozen)")
    record = srec.load(args.record, args.frozen)
    if args.cmd == "merge":
        srec.save(merge_into(record, args.lanes), args.record)
        print(f"merged {len(args.lanes)} lane record(s) into {args.record}", flush=True)
        return 0
    if args.cmd == "plan":
        for line in plan_lines(record, args.refs, args.refs_from, args.lanes):
            print(line)
        return 0
    if not frozen_committed(args.frozen):
        parser.error(f"{args.frozen} is not committed: commit the frozen model before the curve")
    args.work.mkdir(parents=True, exist_ok=True)
    if args.gpus and (len(args.gpus.split(",")) > 1 or args.lane_dir):
        return run_lanes(args, argv)  # one GPU with --lane-dir: a lane too, its record saved there
    meta = run_meta(args)
    args.end = None if args.deadline_s is None else time.monotonic() + args.deadline_s
    ran, code = 0, 0
    todo = has_reference(args.refs) if args.refs_from == "nodrafter" else (lambda p: True)
    batches = lane_batches(sg.release_batches(args.vllm, args.refs_from), args.lane, args.refs_from,
                           lambda b: len(srec.pending(b, record, todo)))
    if args.only:  # a pilot: acceptance first, the baselines after
        batches = sorted(batches, key=lambda b: b.server == "nodrafter")
    for batch in batches:
        try:
            done = run_batch(args, batch, record, meta)
        except OutOfTime as exc:
            print(f"{exc}: run again", flush=True)
            done, code = batch_done.get(batch.id, []), 3
        except Exception as exc:  # noqa: BLE001 - a server that did not start, or died, fails its batch, not the lane
            print(f"{batch.id}: {exc}\n{traceback.format_exc()}", flush=True)
            done, code = batch_done.get(batch.id, []), max(code, 1)
        if done:
            record.setdefault("batches", []).append({"id": batch.id, **meta, "measured": done,
                                                     "server_start": server_starts.get(batch.id)})
            srec.save(record, args.record)
            print(f"{batch.id}: measured {len(done)} points; record {args.record}", flush=True)
            if args.commit:
                commit(args.record, f"speedup-curve: batch {batch.id} ({len(done)} points, vLLM {args.vllm})")
            ran += 1
        if code == 3 or (args.batches and ran >= args.batches):
            break
    if share_tail_baselines(record):
        srec.save(record, args.record)
    return code


if __name__ == "__main__":
    sys.exit(main())
