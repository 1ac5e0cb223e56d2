"""memfit.py: the emulated card's budget, the blocker's size, the vLLM 0.21.0 log and /metrics, the verdict."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))

import memfit  # noqa: E402

H100_TOTAL = 85_031_714_816  # an 80 GB card as cudaMemGetInfo reports it (79.19 GiB)
H200_TOTAL = 150_754_820_096  # 140.4 GiB
MIB2 = 2 << 20


def test_the_cards_are_what_they_report_in_gib():
    assert round(memfit.CARDS["rtx5090"].total_gib, 2) == 31.36
    assert round(memfit.CARDS["dgx-spark"].total_gib, 2) == 119.68


@pytest.mark.parametrize("card,fraction,device", [("rtx5090", 0.80, H100_TOTAL), ("rtx5090", 0.80, H200_TOTAL),
                                                  ("dgx-spark", 0.70, H200_TOTAL)])
def test_scaled_fraction_requests_the_cards_budget_never_more(card, fraction, device):
    c = memfit.CARDS[card]
    want = math.ceil(c.total_bytes * fraction)  # vLLM 0.21.0 request_memory on the card itself
    f = memfit.scaled_fraction(c, fraction, device)
    got = math.ceil(device * f)
    assert got <= want
    assert want - got <= device * 1e-6 + 1  # rounded down to six places: at most ~150 KB short
    plan = memfit.plan(c, fraction, device)
    assert plan["memory_budget_gib"] == round(want / 2**30, 3)
    assert plan["scaled_fraction"] == f


def test_a_smaller_test_gpu_is_refused():
    with pytest.raises(ValueError, match="smaller than dgx-spark"):
        memfit.scaled_fraction(memfit.CARDS["dgx-spark"], 0.70, H100_TOTAL)


def test_blocker_leaves_the_cards_total_free():
    card = memfit.CARDS["rtx5090"]
    free = 84_000_000_000
    held = memfit.blocker_bytes(free, card)
    assert held % MIB2 == 0
    assert 0 <= (free - held) - card.total_bytes < MIB2
    with pytest.raises(ValueError, match="less than rtx5090"):
        memfit.blocker_bytes(card.total_bytes - 1, card)


def test_blocked_gpu_passes_vllms_free_memory_check():
    """Check (1) with the blocker in place: free = card total less vLLM's own context (0.5 GiB)."""
    card = memfit.CARDS["rtx5090"]
    f = memfit.scaled_fraction(card, 0.80, H100_TOTAL)
    free_at_vllm_start = card.total_bytes - (512 << 20)
    assert free_at_vllm_start >= memfit.requested_bytes(H100_TOTAL, f)
    # ...and the profile's own fraction with only a blocker fails it, as issue 27 says
    assert free_at_vllm_start < memfit.requested_bytes(H100_TOTAL, 0.80)


LOG = """\
(APIServer pid=1) INFO 11-27 10:00:00 [api_server.py:1] vLLM API server version 0.21.0
(EngineCore_DP0 pid=2) DEBUG 11-27 10:00:01 [gpu_worker.py:306] worker requested memory: 25.09GiB
(EngineCore_DP0 pid=2) INFO 11-27 10:00:30 [gpu_model_runner.py:4960] Model loading took 18.34 GiB memory and 25.123456 seconds
(EngineCore_DP0 pid=2) INFO 11-27 10:01:10 [gpu_model_runner.py:6143] Estimated CUDA graph memory: 0.61 GiB total
(EngineCore_DP0 pid=2) INFO 11-27 10:01:11 [gpu_worker.py:463] Available KV cache memory: 3.21 GiB
(EngineCore_DP0 pid=2) INFO 11-27 10:01:12 [kv_cache_utils.py:1710] GPU KV cache size: 140,352 tokens
(EngineCore_DP0 pid=2) INFO 11-27 10:01:12 [kv_cache_utils.py:1711] Maximum concurrency for 131,072 tokens per request: 1.07x
(EngineCore_DP0 pid=2) INFO 11-27 10:02:00 [gpu_model_runner.py:6244] Graph capturing finished in 21 secs, took 0.58 GiB
(EngineCore_DP0 pid=2) INFO 11-27 10:02:00 [gpu_worker.py:622] CUDA graph pool memory: 0.58 GiB (actual), 0.61 GiB (estimated), difference: 0.03 GiB (5.2%).
(EngineCore_DP0 pid=2) DEBUG 11-27 10:02:00 [gpu_worker.py:675] Free memory on device (30.86/79.19 GiB) on startup. Desired GPU memory utilization is (0.316864, 25.09 GiB). Actual usage is 18.34 GiB for weight, 2.1 GiB for peak activation, 0.35 GiB for non-torch memory, and 0.58 GiB for CUDAGraph memory. Replace gpu_memory_utilization config with `--kv-cache-memory=1` (0.0 GiB) to fit into requested memory
"""


def test_log_figures():
    log = memfit.parse_log(LOG)
    assert (log["weights_gib"], log["available_kv_gib"], log["graph_estimate_gib"]) == (18.34, 3.21, 0.61)
    assert (log["graph_capture_s"], log["graph_capture_gib"], log["graph_pool_actual_gib"]) == (21, 0.58, 0.58)
    assert (log["kv_cache_tokens"], log["max_model_len"], log["max_concurrency"]) == (140352, 131072, 1.07)
    assert (log["activation_peak_gib"], log["non_torch_gib"], log["graph_actual_gib"]) == (2.1, 0.35, 0.58)
    assert (log["free_at_start_gib"], log["device_total_gib"], log["requested_gib"]) == (30.86, 79.19, 25.09)
    assert log["failures"] == []
    d = memfit.derived(log, 25.09)
    assert d["activation_and_non_torch_gib"] == round(25.09 - 18.34 - 3.21 - 0.61, 2)
    assert d["kv_tokens_per_max_model_len"] == round(140352 / 131072, 3)


def test_log_failures_and_the_estimated_length():
    text = ("ValueError: To serve at least one request with the models's max seq len (131072), (5.0 GiB KV cache "
            "is needed, which is larger than the available KV cache memory (2.1 GiB). Based on the available memory, "
            "the estimated maximum model length is 55,296. Try increasing\n"
            "RuntimeError: Engine core initialization failed. See root cause above.\n")
    log = memfit.parse_log(text)
    assert log["estimated_max_len"] == 55296
    assert log["failures"] == ["kv_too_small", "engine_failed"]
    assert memfit.parse_log("Free memory on device (1/2 GiB) on startup is less than desired GPU memory "
                            "utilization")["failures"] == ["free_memory_check"]


# The engine core's lines of the first full-size fit run (H100, 2026-11-27, rtx5090 profile with
# the drafter, recipe as shipped: max_num_batched_tokens 32768), as vLLM 0.21.0 logged them.
NO_KV_LOG = """\
(EngineCore pid=1302) DEBUG 11-27 18:22:13 [v1/worker/gpu_worker.py:461] Memory profiling takes 161.17 seconds. \
Total non KV cache memory: 25.29GiB; torch peak memory increase: 6.24GiB; non-torch forward increase memory: 0.24GiB; \
weights memory: 18.81GiB.
(EngineCore pid=1302) INFO 11-27 18:22:13 [v1/worker/gpu_worker.py:462] Available KV cache memory: -1.1 GiB
(EngineCore pid=1302) ERROR 11-27 18:22:13 [v1/engine/core.py:1140] ValueError: No available memory for the cache \
blocks. Try increasing `gpu_memory_utilization` when initializing the engine.
"""


def test_a_start_that_leaves_no_kv_memory_still_says_where_the_memory_went():
    log = memfit.parse_log(NO_KV_LOG)
    assert log["available_kv_gib"] == -1.1  # signed: the budget was overdrawn
    assert (log["non_kv_gib"], log["activation_peak_gib"], log["non_torch_gib"], log["weights_debug_gib"]) == \
        (25.29, 6.24, 0.24, 18.81)
    assert log["failures"] == ["no_kv_memory"]
    # the start's "Actual usage" line, where a start got that far, stays the word on the split
    both = memfit.parse_log(LOG + NO_KV_LOG)
    assert both["activation_peak_gib"] == 2.1


METRICS = """\
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="gemma4"} 3.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="gemma4"} 90.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="gemma4"} 2.0
vllm:generation_tokens_total{engine="0",model_name="gemma4"} 23040.0
vllm:kv_cache_usage_perc{engine="0",model_name="gemma4"} 0.25
vllm:num_requests_running{engine="0",model_name="gemma4"} 22.0
vllm:num_requests_waiting{engine="0",model_name="gemma4"} 4.0
vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 4.0
"""


def test_metrics_counters_and_gauges():
    m = memfit.parse_metrics(METRICS)
    assert (m["preemptions"], m["requests_finished"], m["generation_tokens"], m["prompt_tokens"]) == (3, 92, 23040, 0)
    before = dict(m, preemptions=1.0, requests_finished=2.0)
    assert memfit.counter_delta(before, m)["preemptions"] == 2 and memfit.counter_delta(before, m)[
        "requests_finished"] == 90
    assert memfit.parse_gauges(METRICS) == {"kv_cache_usage_perc": 0.25, "requests_running": 22.0,
                                            "requests_waiting": 4.0}


def _bench(c: int, completed: int, failed: int = 0) -> dict:
    return {"runs": [{"concurrency": 1, "completed": 4, "failed": 0, "num_prompts": 4},
                     {"concurrency": c, "completed": completed, "failed": failed, "num_prompts": completed + failed}]}


def test_verdict():
    assert memfit.verdict(started=True, bench=_bench(22, 88), max_num_seqs=22, preemptions=0, oom=False) == (True, [])
    ok, why = memfit.verdict(started=True, bench=_bench(22, 80, 8), max_num_seqs=22, preemptions=2, oom=False)
    assert not ok and why == ["concurrency 22: 80 of 88 requests successful", "2 preemptions"]
    ok, why = memfit.verdict(started=True, bench=_bench(16, 64), max_num_seqs=22, preemptions=0, oom=False)
    assert why == ["no bench run at concurrency 22"]
    ok, why = memfit.verdict(started=False, bench=None, max_num_seqs=22, preemptions=None, oom=True)
    assert why == ["the server did not start", "CUDA out of memory"]
    assert memfit.verdict(started=True, bench=_bench(22, 88), max_num_seqs=22, preemptions=None,
                          oom=False)[1] == ["preemptions unknown (/metrics not read)"]


def test_the_cards_agree_with_the_launchers_profiles():
    """The emulation (memfit) and `serve --test-gpu` (launcher.profiles) give a card the same total."""
    from launcher.profiles import PROFILES

    for name, card in memfit.CARDS.items():
        assert PROFILES[name].cuda_total_bytes == card.total_bytes


def test_log_token_budget_and_compile_cache():
    cold = ("INFO [config.py:1] Chunked prefill is enabled with max_num_batched_tokens=8192.\n"
            "INFO [backends.py:393] Compiling a graph for compile range (1, 8192) takes 30.40 s\n")
    cached = ("INFO [backends.py:292] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, "
              "took 2.183 s\n")
    log = memfit.parse_log(cold)
    assert (log["max_num_batched_tokens"], log["torch_compile"]) == (8192, "cold")
    assert memfit.parse_log(cached)["torch_compile"] == "cached"
    assert "torch_compile" not in memfit.parse_log("INFO nothing compiled here\n")
