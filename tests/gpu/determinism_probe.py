"""Determinism probe for the batched no-drafter Gemma 4 run on vLLM 0.21.0.

One child process = one LLM; it runs the same 4-prompt batch REPEAT times
(prefix caching off by default, so repeats take the same code path), and
records, per generate call and per engine step:
  * the schedule (num_scheduled_tokens per request id),
  * a copy of the logits the Sampler saw (GPU clone, moved to CPU at the end,
    so no extra sync is added inside the step),
  * the sampled token ids,
plus a digest of every parameter/buffer after load and the device name.

Toggles (environment variables of this script, each independent):
  PROBE_ASYNC=0          LLM(async_scheduling=False)
  PROBE_PC=1             prefix caching on (default off)
  PROBE_HYBRID=0         disable_hybrid_kv_cache_manager=True
  PROBE_FORCE_2D=1       TRITON_ATTN: never take the 3D split-KV decode path
  PROBE_NAN_KV=1         fill every KV cache tensor with NaN before generate
  PROBE_NAN_SEGM=1       fill the 3D softmax segment buffers with NaN at every build
  PROBE_SCRIBBLE=1       leave NaN garbage in the CUDA caching allocator's free pool
  PROBE_SEQ1=1           max_num_seqs=1 (one request at a time)
  (VLLM_BATCH_INVARIANT=1 and CUDA_LAUNCH_BLOCKING=1 are plain env vars.)

Usage: python determinism_probe.py MODEL_DIR OUT.pt [REPEAT]
Compare two outputs with determinism_compare.py (remote.sh determinism runs the set).
"""

from __future__ import annotations

import hashlib
import os
import random
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

PROMPT_LENS = [17, 64, 200, 5]
MAX_TOKENS = 48
SEED = 20261126


def env(name: str, default: str = "0") -> bool:
    return os.environ.get(name, default) == "1"


def prompts(limit: int = 4000) -> list[list[int]]:
    rng = random.Random(SEED)
    return [[rng.randrange(3, limit) for _ in range(n)] for n in PROMPT_LENS]


def main() -> int:
    model, out = sys.argv[1], sys.argv[2]
    repeat = int(sys.argv[3]) if len(sys.argv) > 3 else 2

    if env("PROBE_FORCE_2D"):
        # triton_unified_attention.unified_attention reads this module global at
        # call time: `use_3d = not (... or is_batch_invariant)` (line ~624).
        import vllm.v1.attention.ops.triton_unified_attention as tua
        tua.is_batch_invariant = True

    if env("PROBE_NAN_SEGM"):
        from vllm.v1.attention.backends import triton_attn as ta
        _orig_build = ta.TritonAttentionMetadataBuilder.build

        def _poisoned_build(self, *a, **k):
            self.softmax_segm_output.fill_(float("nan"))
            self.softmax_segm_max.fill_(float("nan"))
            self.softmax_segm_expsum.fill_(float("nan"))
            return _orig_build(self, *a, **k)

        ta.TritonAttentionMetadataBuilder.build = _poisoned_build

    # Record the schedule and the sampler's logits.
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.sample.sampler import Sampler

    steps: list[dict] = []
    _orig_schedule = Scheduler.schedule

    def _schedule(self):
        so = _orig_schedule(self)
        steps.append({"sched": dict(so.num_scheduled_tokens)})
        return so

    Scheduler.schedule = _schedule

    logits_log: list[torch.Tensor] = []
    tokens_log: list[torch.Tensor] = []
    _orig_fwd = Sampler.forward

    def _fwd(self, logits, sampling_metadata, *a, **k):
        logits_log.append(logits.detach().float().clone())
        res = _orig_fwd(self, logits, sampling_metadata, *a, **k)
        tokens_log.append(res.sampled_token_ids.detach().clone())
        return res

    Sampler.forward = _fwd

    from vllm import LLM, SamplingParams

    kwargs = dict(
        model=model, skip_tokenizer_init=True, enforce_eager=True, dtype="bfloat16",
        max_model_len=1024, max_num_seqs=1 if env("PROBE_SEQ1") else 32,
        gpu_memory_utilization=0.5, seed=0, logprobs_mode="raw_logits",
        limit_mm_per_prompt={"image": 0, "video": 0},
        enable_prefix_caching=env("PROBE_PC"),
    )
    if os.environ.get("PROBE_ASYNC", "1") == "0":
        kwargs["async_scheduling"] = False
    if os.environ.get("PROBE_HYBRID", "1") == "0":
        kwargs["disable_hybrid_kv_cache_manager"] = True
    llm = LLM(**kwargs)

    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    digest = hashlib.sha256()
    for name, t in list(runner.model.named_parameters()) + list(runner.model.named_buffers()):
        digest.update(name.encode())
        digest.update(t.detach().float().cpu().numpy().tobytes())
    info = {
        "device": torch.cuda.get_device_name(),
        "param_digest": digest.hexdigest(),
        "async_scheduling": runner.vllm_config.scheduler_config.async_scheduling,
        "kv_groups": [
            (type(g.kv_cache_spec).__name__, g.kv_cache_spec.block_size, list(g.layer_names))
            for g in runner.kv_cache_config.kv_cache_groups
        ],
        "env": {k: v for k, v in os.environ.items() if k.startswith(("PROBE_", "VLLM_", "CUDA_", "CUBLAS"))},
    }

    if env("PROBE_NAN_KV"):
        # runner.kv_caches: one bf16 view per layer of the shared int8 tensors
        # allocated with torch.zeros in GPUModelRunner._allocate_kv_cache_tensors.
        for kv in runner.kv_caches:
            kv.fill_(float("nan"))
        torch.cuda.synchronize()

    if env("PROBE_SCRIBBLE"):
        junk = [torch.full((1 << k,), float("nan"), device="cuda")
                for k in range(6, 27) for _ in range(3)]
        del junk  # blocks return to the caching allocator, NaN-filled

    params = [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True,
                             logprobs=2, detokenize=False) for _ in PROMPT_LENS]
    toks = prompts()
    runs = []
    for r in range(repeat):
        s0, l0 = len(steps), len(logits_log)
        outs = llm.generate([{"prompt_token_ids": p} for p in toks], params, use_tqdm=False)
        runs.append({
            "token_ids": [list(o.outputs[0].token_ids) for o in outs],
            "request_ids": [o.request_id for o in outs],
            "steps": steps[s0:],
            "logits": [t.cpu() for t in logits_log[l0:]],
            "sampled": [t.cpu() for t in tokens_log[l0:]],
        })
    torch.save({"info": info, "runs": runs}, out)
    same = all(r["token_ids"] == runs[0]["token_ids"] for r in runs)
    print("DEVICE", info["device"], "DIGEST", info["param_digest"][:16],
          "ASYNC", info["async_scheduling"], "IN-PROCESS REPEATS IDENTICAL:", same)
    return 0


if __name__ == "__main__":
    sys.exit(main())
