"""Serve each small Gemma 4 target with vLLM without a drafter and with DFlash; record what happened.

One round (``--label stock`` or ``--label patched``) runs, for every
target/drafter pair in ``MODELS/shapes.json``, three modes:

* ``baseline``: the target alone;
* ``dflash-flash_attn``: DFlash with ``attention_backend: flash_attn``
  (the user's recipe);
* ``dflash-auto``: DFlash with the backend left to vLLM.

Each mode runs in its own subprocess (``--child``) so that one failure does
not take the others down, with the engine core in that process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the runner can be inspected: the
attention backend of every target and drafter layer and the KV cache
groups. A failure is recorded with its root cause (the innermost exception
of the chain, and the first ``...Error:`` line of the log that is not the
wrapping "Engine core initialization failed").

Decoding is greedy with ``ignore_eos``, 17 prompts in one batch (not a
CUDA-graph size; eager mode anyway), several prompt and output lengths, and
``logprobs_mode=raw_logits`` with 2 logprobs so that ``compare.py`` sees the
top-1/top-2 logits themselves (bf16 values) when it judges a divergence.

Usage (on the device, with vLLM importable from --site):
``python tests/gpu/runs/run_modes.py --models /tmp/models --site /tmp/site --label stock --out OUT.json``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

MODES = ("baseline", "dflash-flash_attn", "dflash-auto")
# Diagnostic modes (``--modes``), not part of a standard round:
# baseline-seq1 runs the target alone one request at a time, to show how far
# the target's own greedy tokens move with the batch shape; the -nohybrid
# modes turn the hybrid KV cache manager off (one group, a tensor per layer:
# the documented workaround on unpatched 0.21.0), to separate KV-sharing
# effects from everything else.
# baseline-rescore decodes like the baseline, then feeds every prompt plus its
# output back as one prompt (prompt_logprobs) and reports where the target's
# own argmax differs between that prefill path and the decode path.
DIAG_MODES = ("baseline-seq1", "baseline-rescore", "dflash-flash_attn-nohybrid",
              "dflash-auto-nohybrid")
NUM_SPECULATIVE_TOKENS = 15  # the user's recipe
PROMPT_SEED = 20261126
# 17 prompts: not a CUDA-graph capture size; lengths cross the 64-token
# sliding window of the small targets.
PROMPT_LENGTHS = [1, 3, 7, 12, 20, 33, 50, 63, 64, 65, 90, 128, 150, 200, 257, 300, 45]
MAX_TOKENS = [8, 16, 32, 64, 96, 128, 48, 24, 100, 64, 32, 16, 80, 64, 40, 128, 56]
CHILD_TIMEOUT_S = 300

_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception)): (.+)$")
_WRAPPERS = ("Engine core initialization failed", "EngineCore failed to start")
# What vLLM puts before a child process's line: "(EngineCore pid=3150) ", and on a logged
# traceback "ERROR 11-27 12:35:21 [core.py:1140] " too (0.21.0 logs the root cause only this way).
_LINE_PREFIX = re.compile(r"^\(\w+ pid=\d+\)\s*(?:ERROR \d\d-\d\d [\d:]+ \[[^\]]*\]\s*)?")
_BACKEND_EXPLICIT = re.compile(r"Using AttentionBackendEnum\.(\w+) backend")
_BACKEND_AUTO = re.compile(r"Using (\w+) attention backend out of potential backends")
# vLLM's AOT compile cache (on by default with torch >= 2.10): the folder is named by a key of the
# config and the forward's qualified name, not by what the runner sets on the model after building
# it (the DFlash target's aux hidden-state layers), so a patch to the runner can meet a graph that
# an unpatched runner compiled (tests/gpu/README.md, "Findings that stand").
_AOT_SAVED = re.compile(r"saved AOT compiled function to \S*torch_aot_compile/([0-9a-f]+)/")
_AOT_LOADED = re.compile(r"Directly load AOT compilation from path \S*torch_aot_compile/([0-9a-f]+)/")


def prompts(token_limit: int) -> list[list[int]]:
    rng = random.Random(PROMPT_SEED)
    return [[rng.randrange(3, token_limit) for _ in range(n)] for n in PROMPT_LENGTHS]


# --------------------------------------------------------------------- child


def _runner(llm):
    """The GPUModelRunner of an in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    core = llm.llm_engine.engine_core.engine_core
    return core.model_executor.driver_worker.worker.model_runner


def _inspect(llm) -> dict:
    try:
        runner = _runner(llm)
    except Exception as exc:  # recorded, not fatal: outputs still count
        return {"inspect_error": f"{type(exc).__name__}: {exc}"}
    return inspect_runner(runner)


def inspect_runner(runner) -> dict:
    """Attention backend per layer (target / drafter) and the KV cache groups of a model runner."""
    info: dict = {}
    # 0.21.0's GPUModelRunner keeps a drafter; 0.33.0's V2 runner a speculator.
    drafter = getattr(runner, "drafter", None) or getattr(runner, "speculator", None)
    draft_names = set(getattr(drafter, "_draft_attn_layer_names", None)
                      or getattr(drafter, "draft_attn_layer_names", None) or set())
    ctx = runner.vllm_config.compilation_config.static_forward_context
    target, draft = {}, {}
    for name, layer in ctx.items():
        backend = getattr(layer, "attn_backend", None)
        if backend is None:
            continue
        (draft if name in draft_names else target)[name] = backend.get_name()
    info["backends"] = {"target": target, "drafter": draft}
    groups = []
    kv_cfg = getattr(runner, "kv_cache_config", None)
    for gid, group in enumerate(getattr(kv_cfg, "kv_cache_groups", []) or []):
        spec = group.kv_cache_spec
        groups.append({
            "gid": gid,
            "spec": type(spec).__name__,
            "block_size": getattr(spec, "block_size", None),
            "head_size": getattr(spec, "head_size", None),
            "sliding_window": getattr(spec, "sliding_window", None),
            "layers": list(group.layer_names),
            "drafter_layers": sorted(set(group.layer_names) & draft_names),
        })
    info["kv_cache_groups"] = groups
    if kv_cfg is not None:
        info["num_kv_cache_tensors"] = len(getattr(kv_cfg, "kv_cache_tensors", []) or [])
    return info


def _root_cause(exc: BaseException) -> str:
    seen = set()
    root = exc
    while id(root) not in seen:
        seen.add(id(root))
        nxt = root.__cause__ or root.__context__
        if nxt is None:
            break
        root = nxt
    return f"{type(root).__name__}: {root}"


def run_child(spec: dict) -> dict:
    result: dict = {"mode": spec["mode"], "target": spec["target_name"],
                    "drafter": spec.get("drafter_name"), "ok": False}
    t0 = time.time()
    try:
        import vllm
        from vllm import LLM, SamplingParams

        result["vllm_version"] = vllm.__version__
        kwargs = dict(
            model=spec["target"],
            skip_tokenizer_init=True,
            enforce_eager=True,
            dtype="bfloat16",
            max_model_len=1024,
            max_num_seqs=32,
            gpu_memory_utilization=0.5,
            seed=0,
            logprobs_mode="raw_logits",
            # Text-only prompts: no image/video budget, so no HF processor
            # (and no tokenizer) is needed. The target stays the multimodal
            # Gemma4ForConditionalGeneration and keeps is_mm_prefix_lm.
            limit_mm_per_prompt={"image": 0, "video": 0},
        )
        mode = spec["mode"]
        if mode == "baseline-seq1":
            kwargs["max_num_seqs"] = 1
        elif not mode.startswith("baseline"):
            sc = {"method": "dflash", "model": spec["drafter"],
                  "num_speculative_tokens": NUM_SPECULATIVE_TOKENS}
            if mode.startswith("dflash-flash_attn"):
                sc["attention_backend"] = "flash_attn"
            kwargs["speculative_config"] = sc
            if mode.endswith("-nohybrid"):
                kwargs["disable_hybrid_kv_cache_manager"] = True
        llm = LLM(**kwargs)
        result["init_s"] = round(time.time() - t0, 1)
        result.update(_inspect(llm))
        params = [
            SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True,
                           logprobs=2, detokenize=False)
            for m in MAX_TOKENS
        ]
        toks = prompts(spec["prompt_token_limit"])
        t1 = time.time()
        outs = llm.generate([{"prompt_token_ids": p} for p in toks], params, use_tqdm=False)
        result["generate_s"] = round(time.time() - t1, 2)
        result["outputs"] = [_output_record(p, o) for p, o in zip(toks, outs)]
        if mode == "baseline-rescore":
            result["rescore"] = _rescore(llm, SamplingParams, toks, result["outputs"])
        result["ok"] = True
    except BaseException as exc:  # noqa: BLE001 - every failure is a result here
        traceback.print_exc()
        result["error"] = {"root_cause": _root_cause(exc),
                           "raised": f"{type(exc).__name__}: {exc}"}
    result["wall_s"] = round(time.time() - t0, 1)
    return result


def _rescore(llm, SamplingParams, toks: list[list[int]], outputs: list[dict]) -> dict:
    """Target argmax over prompt+output computed as one prefill vs as decode steps."""
    full = [p + o["token_ids"] for p, o in zip(toks, outputs)]
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=2, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": f} for f in full], params, use_tqdm=False)
    mismatches, positions = [], 0
    for i, (p, o, res) in enumerate(zip(toks, outputs, outs)):
        plp = res.prompt_logprobs or []
        for j, tok in enumerate(o["token_ids"]):
            entry = plp[len(p) + j] if len(p) + j < len(plp) else None
            if not entry:
                continue
            positions += 1
            ranked = sorted(entry.items(), key=lambda kv: kv[1].rank)
            pre_top = [[int(t), float(lp.logprob), int(lp.rank)] for t, lp in ranked]
            dec_top = o["top"][j]
            best = next((e for e in pre_top if e[2] == 1), None)
            if best is not None and best[0] != tok:
                mismatches.append({"prompt": i, "position": j, "decode_top": dec_top,
                                   "prefill_top": pre_top})
    # Prompt logprobs are logprobs whatever logprobs_mode says; only the
    # argmax is compared with the decode path's raw logits.
    return {"positions": positions, "argmax_mismatches": len(mismatches),
            "mismatches": mismatches}


def _output_record(prompt: list[int], out) -> dict:
    comp = out.outputs[0]
    top = []
    for pos in comp.logprobs or []:
        ranked = sorted(pos.items(), key=lambda kv: kv[1].rank)
        top.append([[int(tok), float(lp.logprob), int(lp.rank)] for tok, lp in ranked])
    # Prompt tokens served from the prefix cache, per request: vLLM 0.21.0's engine
    # counter drops the lookups of a step without outputs (async scheduling), so the
    # trained-target runs read hits from here too.
    return {"prompt_len": len(prompt), "token_ids": list(comp.token_ids), "top": top,
            "num_cached_tokens": getattr(out, "num_cached_tokens", None)}


# ------------------------------------------------------------------- parent


def parse_log(text: str) -> dict:
    """Backends named in the log, and the first root-cause error line."""
    lines = text.splitlines()
    explicit = [m.group(1) for ln in lines if (m := _BACKEND_EXPLICIT.search(ln))]
    auto = [m.group(1) for ln in lines if (m := _BACKEND_AUTO.search(ln))]
    error_line = None
    for ln in lines:
        m = _ERROR_LINE.match(_LINE_PREFIX.sub("", ln.strip()))
        if m and not any(w in ln for w in _WRAPPERS):
            error_line = f"{m.group(1)}: {m.group(2)}"
            break
    forced = any("Forcing TRITON_ATTN" in ln for ln in lines)
    return {"log_backends_explicit": explicit, "log_backends_auto": auto,
            "log_error_line": error_line, "log_forced_triton": forced,
            "compile_artifacts": {"saved": _matches(_AOT_SAVED, lines), "loaded": _matches(_AOT_LOADED, lines)}}


def _matches(pattern: re.Pattern, lines: list[str]) -> list[str]:
    return list(dict.fromkeys(m.group(1) for ln in lines if (m := pattern.search(ln))))


def run_logged(cmd: list[str], env: dict, log_file: Path, timeout: float) -> int | str:
    """Run one child with its output in ``log_file``; its exit code, or "timeout"."""
    with log_file.open("w") as lf:
        try:
            return subprocess.run(cmd, env=env, stdout=lf, stderr=subprocess.STDOUT,
                                  timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return "timeout"


def run_round(models: Path, site: str | None, label: str, logs: Path,
              deadline_s: float | None = None, modes: tuple[str, ...] = MODES,
              drafters: list[str] | None = None) -> dict:
    started = time.time()
    shapes = json.loads((models / "shapes.json").read_text())
    pairs = shapes["drafters"] + shapes.get("diagnostic_drafters", [])
    if drafters:
        unknown = set(drafters) - {d["name"] for d in pairs}
        if unknown:
            raise SystemExit(f"unknown drafter(s) {sorted(unknown)}")
        pairs = [d for d in pairs if d["name"] in drafters]
    else:
        pairs = shapes["drafters"]
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env["PYTHONUNBUFFERED"] = "1"
    if site:
        env["PYTHONPATH"] = site + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    runs = []
    for d in pairs:
        for mode in modes:
            spec = {
                "mode": mode,
                "target": str(models / d["target"]), "target_name": d["target"],
                "drafter": str(models / d["name"]), "drafter_name": d["name"],
                "prompt_token_limit": shapes["prompt_token_limit"],
            }
            if mode.startswith("baseline"):
                spec["drafter_name"] = None
            tag = f"{label}-{d['target']}-{d['name']}-{mode}"
            res_file = logs / f"{tag}.json"
            log_file = logs / f"{tag}.log"
            cmd = [sys.executable, __file__, "--child", json.dumps(spec), "--result", str(res_file)]
            print(f"[{label}] {d['target']} + {d['name']} {mode} ...", flush=True)
            t0 = time.time()
            if deadline_s is not None and t0 - started > deadline_s:
                # A command may run under a hard time limit; a skipped mode is recorded, not lost silently.
                runs.append({"mode": mode, "target": d["target"], "drafter": spec["drafter_name"],
                             "ok": False, "skipped": True, "drafter_shape": d,
                             "error": {"root_cause": f"skipped: round deadline {deadline_s:.0f}s passed"}})
                print("    skipped (deadline)", flush=True)
                continue
            timeout = CHILD_TIMEOUT_S
            if deadline_s is not None:
                timeout = max(60, min(timeout, deadline_s + 60 - (t0 - started)))
            rc = run_logged(cmd, env, log_file, timeout)
            log_text = log_file.read_text(errors="replace")
            if res_file.exists():
                res = json.loads(res_file.read_text())
            else:
                res = {"mode": mode, "target": d["target"], "drafter": spec["drafter_name"],
                       "ok": False, "error": {"root_cause": None, "raised": f"child exit {rc}"}}
            res["exit"] = rc
            res["drafter_shape"] = d
            res.update(parse_log(log_text))
            res["log_tail"] = log_text.splitlines()[-40:]
            status = "ok" if res.get("ok") else f"FAILED: {(res.get('error') or {}).get('root_cause')}"
            print(f"    {time.time() - t0:.0f}s {status}", flush=True)
            runs.append(res)
            if mode == "baseline" and not res.get("ok"):
                print("    baseline failed; DFlash modes still run", flush=True)
    return {"label": label, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--models", type=Path)
    parser.add_argument("--site", help="folder prepended to PYTHONPATH for the vLLM under test")
    parser.add_argument("--label", default="stock")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--logs", type=Path)
    parser.add_argument("--deadline-s", type=float, help="start no new mode after this many seconds")
    parser.add_argument("--modes", help=f"comma-separated, from {MODES + DIAG_MODES}")
    parser.add_argument("--drafters", help="comma-separated drafter names (default: the standard pairs)")
    args = parser.parse_args(argv)
    if args.child:
        res = run_child(json.loads(args.child))
        args.result.write_text(json.dumps(res) + "\n")
        return 0
    if not (args.models and args.out):
        parser.error("--models and --out are required")
    logs = args.logs or args.out.parent / f"logs-{args.label}"
    modes = tuple(args.modes.split(",")) if args.modes else MODES
    bad = set(modes) - set(MODES + DIAG_MODES)
    if bad:
        parser.error(f"unknown mode(s) {sorted(bad)}")
    drafters = args.drafters.split(",") if args.drafters else None
    data = run_round(args.models, args.site, args.label, logs, args.deadline_s, modes, drafters)
    args.out.write_text(json.dumps(data) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
