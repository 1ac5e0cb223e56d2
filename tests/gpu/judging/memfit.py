"""Emulating a smaller card's memory on a larger test GPU for vLLM 0.21.0, and reading the result (issue 27).

Pure Python: the arithmetic, the log and /metrics parsing, the verdict. The
processes (blocker, server, bench) are ``fullsize_serve.py``'s.

What vLLM 0.21.0 checks and sizes (``vllm/v1/worker``, released wheel)
-----------------------------------------------------------------------
1. ``utils.request_memory`` at worker start: ``requested = ceil(total x
   gpu_memory_utilization)`` with ``total`` from ``cudaMemGetInfo`` (the
   device's whole memory, whoever uses it), and ``ValueError("Free memory
   on device ... is less than desired GPU memory utilization")`` unless
   ``free >= requested``. So on an 80 GB H100 a blocker that leaves 31.36 GiB
   free plus the rtx5090 profile's 0.80 asks for 0.80 x 79 GiB and fails.
2. ``gpu_worker.determine_available_memory``: KV cache = ``requested`` -
   (weights + peak activation of the profile run + non-torch memory growth
   during it) - the CUDA graph estimate (``profile_cudagraph_memory``; applied
   because ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` is 1 by default, and
   the fit runs leave it so). Memory other processes hold is in neither term.
3. ``kv_cache_utils``: refuses to start when one ``max_model_len`` request
   does not fit the KV cache ("... the estimated maximum model length is N").
   On unified-memory GPUs (``is_integrated_gpu``: the GB10) ``free`` is
   ``psutil.virtual_memory().available`` instead; total is still
   ``cudaMemGetInfo``'s.

The cap (both halves, so that both vLLM's arithmetic and the physical limit are the card's)
------------------------------------------------------------------------------------------
* fraction: ``f' = floor_6(card_total x f / device_total)``, so ``requested``
  on the test GPU is the card's requested memory (never more): KV cache
  sizing (2) sees the card's budget. This alone would let a run use memory
  the card does not have without failing;
* blocker: before vLLM starts, a separate process allocates ``free -
  card_total`` bytes and holds them, so the GPU has the card's total free
  (as a headless card has before its first process), and anything vLLM
  allocates beyond its own estimate fails as it would on the card. Check (1)
  passes because ``card_total - vLLM's context >= f x card_total``.

``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0`` is never set: it would leave
graph memory out of (2) and hide exactly what the fit must include.

The card totals are what ``cudaMemGetInfo`` reports (``CARDS``), in bytes;
GiB = 2^30 bytes throughout.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

GIB = 1 << 30
BLOCK = 2 << 20  # cudaMalloc granularity: a blocker rounded down to it never takes more than asked


@dataclass(frozen=True)
class Card:
    name: str
    total_bytes: int
    source: str

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB


CARDS = {
    # nvidia-smi shows 32607 MiB (noonghunna/club-3090 issues #1229, #1251); cudaMemGetInfo, which vLLM
    # reads, reports less: "free: 33136967680, total: 33668857856" in a PyTorch allocator line on an RTX
    # 5090 (a public failure-signature notes file), and "total capacity of 31.36 GiB" in many RTX 5090
    # out-of-memory messages.
    "rtx5090": Card("rtx5090", 33_668_857_856,
                    "RTX 5090 cudaMemGetInfo total 33,668,857,856 B = 31.36 GiB (nvidia-smi: 32607 MiB)"),
    # The GB10's 128 GB are shared with the OS; CUDA reports the OS's memory total. 128,501,256,192 B =
    # 119.68 GiB (leptonai/gpud PR #1170, a DGX Spark; PyTorch messages on Sparks say 119.6-119.7 GiB);
    # later DGX OS kernels report 121.69 GiB (unslothai/unsloth PR #10283). The smaller is used: a fit
    # on it holds on both. Issue 27's "128 GB x 0.70" is this total x the profile's 0.70.
    "dgx-spark": Card("dgx-spark", 128_501_256_192,
                      "DGX Spark GB10 total 128,501,256,192 B = 119.68 GiB (121.69 GiB on later kernels)"),
}


def requested_bytes(total: int, fraction: float) -> int:
    """vLLM 0.21.0 ``request_memory``."""
    return math.ceil(total * fraction)


def scaled_fraction(card: Card, fraction: float, device_total: int) -> float:
    """The fraction of the test GPU that requests the card's ``fraction`` of its total, rounded down."""
    if device_total < card.total_bytes:
        raise ValueError(f"the test GPU ({device_total / GIB:.2f} GiB) is smaller than {card.name} "
                         f"({card.total_gib:.2f} GiB)")
    scaled = math.floor(card.total_bytes * fraction / device_total * 1e6) / 1e6
    assert requested_bytes(device_total, scaled) <= requested_bytes(card.total_bytes, fraction)
    return scaled


def blocker_bytes(free_now: int, card: Card) -> int:
    """What a blocker allocates so that ``card.total_bytes`` stay free (rounded down to 2 MiB)."""
    extra = free_now - card.total_bytes
    if extra < 0:
        raise ValueError(f"only {free_now / GIB:.2f} GiB free, less than {card.name}'s {card.total_gib:.2f} GiB")
    return extra // BLOCK * BLOCK


def plan(card: Card, fraction: float, device_total: int) -> dict:
    f = scaled_fraction(card, fraction, device_total)
    return {"card": card.name, "card_total_bytes": card.total_bytes, "card_total_gib": round(card.total_gib, 3),
            "card_source": card.source, "profile_fraction": fraction,
            "memory_budget_gib": round(requested_bytes(card.total_bytes, fraction) / GIB, 3),
            "device_total_bytes": device_total, "scaled_fraction": f,
            "requested_on_device_gib": round(requested_bytes(device_total, f) / GIB, 3)}


# ------------------------------------------------------------------ server log

_NUM = r"(-?[0-9][0-9,]*\.?[0-9]*)"  # signed: "Available KV cache memory: -1.1 GiB" when nothing is left
LOG_PATTERNS = {
    "weights_gib": rf"Model loading took {_NUM} GiB",
    "available_kv_gib": rf"Available KV cache memory: {_NUM} GiB",
    "graph_estimate_gib": rf"Estimated CUDA graph memory: {_NUM} GiB",
    "graph_capture_gib": rf"Graph capturing finished in {_NUM} secs, took {_NUM} GiB",
    "graph_pool_actual_gib": rf"CUDA graph pool memory: {_NUM} GiB \(actual\)",
    "kv_cache_tokens": rf"GPU KV cache size: {_NUM} tokens",
    "max_concurrency": rf"Maximum concurrency for {_NUM} tokens per request: {_NUM}x",
    # DEBUG level (VLLM_LOGGING_LEVEL=DEBUG): the worker's own split of the non-KV memory.
    "actual_usage": rf"Actual usage is {_NUM} GiB for weight, {_NUM} GiB for peak activation, {_NUM} GiB for "
                    rf"non-torch memory, and {_NUM} GiB for CUDAGraph memory",
    # DEBUG level too, logged by the profile run itself (utils/mem_utils.py), so a server that
    # then fails for want of KV memory still says where the memory went.
    "profile_split": rf"Total non KV cache memory: {_NUM} ?GiB; torch peak memory increase: {_NUM} ?GiB; "
                     rf"non-torch forward increase memory: {_NUM} ?GiB; weights memory: {_NUM} ?GiB",
    "requested_gib": rf"worker requested memory: {_NUM} ?GiB",
    "free_at_start": rf"Free memory on device \({_NUM}/{_NUM} GiB\) on startup",
    "estimated_max_len": rf"the estimated maximum model length is {_NUM}",
    # The scheduler's token budget: it sizes the profile run's activation peak.
    "max_num_batched_tokens": rf"max_num_batched_tokens={_NUM}",
}
# A start that compiles the model (no torch.compile cache yet) peaks higher in the profile run than
# one that loads the compiled graphs: about 2.5 against 1.58 GiB at full size, the rtx5090 profile.
COMPILE_EVIDENCE = {"cold": "Compiling a graph for compile range", "cached": "Directly load the compiled graph(s)"}
FAILURES = {
    "free_memory_check": "is less than desired GPU memory utilization",
    "kv_too_small": "KV cache is needed, which is larger than the available KV cache memory",
    "no_kv_memory": "No available memory for the cache blocks",
    "cuda_oom": "CUDA out of memory",
    "engine_failed": "Engine core initialization failed",
}


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def parse_log(text: str) -> dict:
    """Memory figures and failures from a vLLM 0.21.0 server log (first match of each; the engine
    core logs them once)."""
    found: dict = {}
    for key, pattern in LOG_PATTERNS.items():
        m = re.search(pattern, text)
        if not m:
            continue
        values = [_num(g) for g in m.groups()]
        if key == "graph_capture_gib":
            found["graph_capture_s"], found[key] = values
        elif key == "max_concurrency":
            found["max_model_len"], found[key] = int(values[0]), values[1]
        elif key == "actual_usage":
            (found["weights_debug_gib"], found["activation_peak_gib"], found["non_torch_gib"],
             found["graph_actual_gib"]) = values
        elif key == "profile_split":
            found["non_kv_gib"], peak, non_torch, weights = values
            # the start's own "Actual usage" line (matched first) is the later word where it exists
            found.setdefault("activation_peak_gib", peak)
            found.setdefault("non_torch_gib", non_torch)
            found.setdefault("weights_debug_gib", weights)
        elif key == "free_at_start":
            found["free_at_start_gib"], found["device_total_gib"] = values
        elif key in ("kv_cache_tokens", "estimated_max_len", "max_num_batched_tokens"):
            found[key] = int(values[0])
        else:
            found[key] = values[0]
    found["failures"] = [name for name, needle in FAILURES.items() if needle in text]
    compiled = [name for name, needle in COMPILE_EVIDENCE.items() if needle in text]
    if compiled:
        found["torch_compile"] = compiled[0]
    return found


def derived(log: dict, requested_gib: float) -> dict:
    """What the log does not say outright: activation peak + non-torch memory as the rest of the
    requested budget (when the DEBUG line is absent), and kv tokens per max_model_len."""
    out = {}
    parts = ("weights_gib", "available_kv_gib", "graph_estimate_gib")
    if all(k in log for k in parts):
        out["activation_and_non_torch_gib"] = round(requested_gib - sum(log[k] for k in parts), 2)
    if "kv_cache_tokens" in log and log.get("max_model_len"):
        out["kv_tokens_per_max_model_len"] = round(log["kv_cache_tokens"] / log["max_model_len"], 3)
    return out


# ------------------------------------------------------------------ /metrics

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
METRICS = {
    "preemptions": "vllm:num_preemptions_total",
    "requests_finished": "vllm:request_success_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
}


def parse_metrics(text: str) -> dict[str, float]:
    """Counters of one /metrics scrape (summed over labels: engines, finish reasons)."""
    out = dict.fromkeys(METRICS, 0.0)
    wanted = {v: k for k, v in METRICS.items()}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m and m.group("name") in wanted:
            try:
                out[wanted[m.group("name")]] += float(m.group("value"))
            except ValueError:
                pass
    return out


def counter_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in METRICS}


GAUGES = {
    "kv_cache_usage_perc": "vllm:kv_cache_usage_perc",  # a fraction (0..1), despite the name
    "requests_running": "vllm:num_requests_running",
    "requests_waiting": "vllm:num_requests_waiting",
}


def parse_gauges(text: str) -> dict[str, float]:
    """Gauges of one /metrics scrape (summed over engines); absent ones are left out."""
    out: dict[str, float] = {}
    wanted = {v: k for k, v in GAUGES.items()}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m and m.group("name") in wanted:
            try:
                key = wanted[m.group("name")]
                out[key] = out.get(key, 0.0) + float(m.group("value"))
            except ValueError:
                pass
    return out


# ------------------------------------------------------------------ verdict


def verdict(*, started: bool, bench: dict | None, max_num_seqs: int, preemptions: float | None,
            oom: bool) -> tuple[bool, list[str]]:
    """Issue 27's "fits": the server starts and runs the bench workload at the profile's
    ``max_num_seqs`` with every request successful and no preemption (and nothing ran out of memory)."""
    why: list[str] = []
    if not started:
        why.append("the server did not start")
    runs = [r for r in (bench or {}).get("runs", []) if r.get("concurrency") == max_num_seqs]
    if started and not runs:
        why.append(f"no bench run at concurrency {max_num_seqs}")
    for r in runs:
        if r.get("failed") or not r.get("completed"):
            why.append(f"concurrency {max_num_seqs}: {r.get('completed', 0)} of {r.get('num_prompts')} requests "
                       "successful")
    if preemptions is None and started:
        why.append("preemptions unknown (/metrics not read)")
    elif preemptions:
        why.append(f"{preemptions:g} preemptions")
    if oom:
        why.append("CUDA out of memory")
    return not why, why
