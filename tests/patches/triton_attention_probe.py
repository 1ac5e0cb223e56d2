"""Run a released vLLM tree's Triton attention ops under TRITON_INTERPRET=1 (CPU).

Usage: triton_attention_probe.py TREE, triton_attention_probe.py TREE --reshape
KV_CACHE_DTYPE (the cache write, below), or triton_attention_probe.py TREE
--reduce-edges (reduce_segments' padding rows and empty sequences); prints JSON. The kernel, its helpers and
the ``unified_attention`` launcher are the tree's own files; only the modules
they import for platform facts, logging and env flags (which need vLLM's own
CUDA build to import) are stand-ins, and ``KVQuantMode`` is the tree's class,
rebuilt from the members of that class in its
kv_cache_interface.py.

The case: one sequence of 48 tokens, one head, sliding window 8, prefill
(the 2D kernel, TILE_SIZE 32, BLOCK_Q 16). The q-block of rows 32-47 starts
its tile loop at tile 0 (keys 0-31), which lies wholly before the windows of
rows 39-47. Every in-window score is about -144: below the fp32 underflow of
exp() on the CPU (about -104; the GPU's flush-to-zero exp already fails below
about -87).
"""

from __future__ import annotations

import ast
import enum
import importlib.util
import json
import logging
import sys
import types
from pathlib import Path

import torch

N, HEAD, WINDOW, BLOCK = 48, 32, 8, 16
OPS = "vllm/v1/attention/ops"


def _stand_ins(tree: Path) -> None:
    envs = types.ModuleType("vllm.envs")
    envs.VLLM_BATCH_INVARIANT = False
    logger = types.ModuleType("vllm.logger")
    logger.init_logger = logging.getLogger
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(fp8_dtype=lambda: torch.float8_e4m3fn)
    import triton
    import triton.language as tl

    triton_utils = types.ModuleType("vllm.triton_utils")
    triton_utils.tl, triton_utils.triton = tl, triton
    source = (tree / "vllm/v1/kv_cache_interface.py").read_text()
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "KVQuantMode")
    members = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in cls.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
    }
    kv = types.ModuleType("vllm.v1.kv_cache_interface")
    kv.KVQuantMode = enum.IntEnum("KVQuantMode", members)
    for name in ("vllm", "vllm.v1", "vllm.v1.attention", "vllm.v1.attention.ops"):
        sys.modules[name] = types.ModuleType(name)
    for mod in (envs, logger, platforms, triton_utils, kv):
        sys.modules[mod.__name__] = mod
    sys.modules["vllm"].envs = envs


def _load(tree: Path, name: str):
    spec = importlib.util.spec_from_file_location(f"vllm.v1.attention.ops.{name}", tree / OPS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main(tree: Path) -> dict:
    _stand_ins(tree)
    _load(tree, "triton_attention_helpers")
    ua = _load(tree, "triton_unified_attention")
    torch.manual_seed(0)
    axis = torch.zeros(HEAD)
    axis[0] = 1.0
    q = (12.0 * axis).expand(N, 1, HEAD) + 0.01 * torch.randn(N, 1, HEAD)
    k = (-12.0 * axis).expand(N, 1, HEAD) + 0.01 * torch.randn(N, 1, HEAD)
    v = torch.randn(N, 1, HEAD)
    blocks = N // BLOCK
    out = torch.full((N, 1, HEAD), 7.0)
    ua.unified_attention(
        q=q.contiguous(), k=k.reshape(blocks, BLOCK, 1, HEAD).contiguous(),
        v=v.reshape(blocks, BLOCK, 1, HEAD).contiguous(), out=out,
        cu_seqlens_q=torch.tensor([0, N], dtype=torch.int32), max_seqlen_q=N,
        seqused_k=torch.tensor([N], dtype=torch.int32), max_seqlen_k=N, softmax_scale=1.0, causal=True,
        window_size=(WINDOW - 1, 0), block_table=torch.arange(blocks, dtype=torch.int32).reshape(1, blocks),
        softcap=0, q_descale=None, k_descale=torch.ones(1), v_descale=torch.ones(1),
    )
    scores = q[:, 0].double() @ k[:, 0].double().T
    pos = torch.arange(N)
    allowed = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - WINDOW)
    ref = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ v[:, 0].double()
    got = out[:, 0].double()
    finite = torch.isfinite(got).all(-1)
    return {
        "max_in_window_score": scores[allowed].max().item(),
        "nan_rows": torch.isnan(got).any(-1).nonzero().flatten().tolist(),
        "max_abs_err_finite_rows": (got[finite] - ref[finite]).abs().max().item(),
        "finite_rows": int(finite.sum()),
    }


def reduce_edges(tree: Path) -> dict:
    """The tree's ``reduce_segments`` on a launch grid wider than its query tokens, as a
    CUDA graph pads it: 2 sequences of one query token each (lengths 40 and 0), 4 rows
    launched. Scratch rows no program wrote hold NaN; output rows start at 7.0. Returns
    which rows the kernel wrote, and whether it raised (the zero length divides by zero
    in the segment count without the early return)."""
    _stand_ins(tree)
    _load(tree, "triton_attention_helpers")
    ua = _load(tree, "triton_unified_attention")
    rows, heads, segments, head = 4, 1, 4, 32
    out = torch.full((rows, heads, head), 7.0)
    segm_out = torch.full((rows, heads, segments, head), float("nan"))
    segm_max = torch.full((rows, heads, segments), float("nan"))
    segm_sum = torch.full((rows, heads, segments), float("nan"))
    segm_out[0], segm_max[0], segm_sum[0] = 1.0, 0.0, 1.0  # the real row: every segment valid
    try:
        ua.reduce_segments[(rows, heads)](
            out, segm_out, segm_max, segm_sum, torch.tensor([40, 0], dtype=torch.int32), 2,
            num_query_heads=heads, out_scale_inv=1.0, output_stride_0=out.stride(0),
            output_stride_1=out.stride(1), block_table_stride=0, TILE_SIZE=16, HEAD_SIZE=head,
            HEAD_SIZE_PADDED=head, query_start_len_ptr=torch.tensor([0, 1, 2], dtype=torch.int32),
            BLOCK_Q=1, NUM_SEGMENTS_PER_SEQ=segments, USE_FP8=False,
        )
    except Exception as exc:  # the interpreter raises what the GPU would leave undefined
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}
    written = [r for r in range(rows) if not bool((out[r] == 7.0).all())]
    return {"error": None, "written_rows": written, "row0_finite": bool(torch.isfinite(out[0]).all())}


def _torch_utils_stand_in(tree: Path) -> types.ModuleType:
    """vllm.utils.torch_utils with only the tree's own ``is_quantized_kv_cache`` (the
    module imports vLLM's config and CUDA helpers, which cannot load here)."""
    source = (tree / "vllm/utils/torch_utils.py").read_text()
    fn = next(n for n in ast.parse(source).body
              if isinstance(n, ast.FunctionDef) and n.name == "is_quantized_kv_cache")
    module = types.ModuleType("vllm.utils.torch_utils")
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(tree / "vllm/utils/torch_utils.py"), "exec"),
         module.__dict__)
    return module


def reshape_and_cache(tree: Path, kv_cache_dtype: str) -> dict:
    """The tree's ``triton_reshape_and_cache_flash`` writes 5 tokens of 2 heads into a bf16
    cache of 4 blocks of 4 slots at scattered slots (one padded token, slot -1, is skipped),
    called with ``kv_cache_dtype`` as TRITON_ATTN's ``do_kv_cache_update`` passes the
    CLI value. Stand-ins: the platform (CUDA, sm_120: this CPU has no GPU to ask) and the
    quant_utils constants the module reads at import."""
    _stand_ins(tree)
    sys.modules["vllm.utils.torch_utils"] = _torch_utils_stand_in(tree)
    quant = types.ModuleType("vllm.model_executor.layers.quantization.utils.quant_utils")
    quant.FP8_DTYPE = torch.float8_e4m3fn
    quant.get_fp8_min_max = lambda: (-448.0, 448.0)
    sys.modules[quant.__name__] = quant
    platform = sys.modules["vllm.platforms"].current_platform
    platform.is_rocm = platform.is_xpu = lambda: False
    platform.has_device_capability = lambda capability: capability <= 120
    torch.cuda.get_device_capability = lambda device=None: (12, 0)
    ops = _load(tree, "triton_reshape_and_cache_flash")
    torch.manual_seed(0)
    tokens, heads, head, blocks, block = 5, 2, 16, 4, 4
    key = torch.randn(tokens, heads, head, dtype=torch.bfloat16)
    value = torch.randn(tokens, heads, head, dtype=torch.bfloat16)
    key_cache = torch.full((blocks, block, heads, head), 7.0, dtype=torch.bfloat16)
    value_cache = key_cache.clone()
    slots = torch.tensor([13, 2, 7, -1, 8], dtype=torch.int64)
    try:
        ops.triton_reshape_and_cache_flash(key, value, key_cache, value_cache, slots, kv_cache_dtype,
                                           torch.ones(1), torch.ones(1))
    except AssertionError as exc:
        return {"error": str(exc)}
    flat_k, flat_v = key_cache.view(-1, heads, head), value_cache.view(-1, heads, head)
    written = [(i, int(s)) for i, s in enumerate(slots) if s >= 0]
    untouched = sorted(set(range(blocks * block)) - {s for _, s in written})
    return {
        "error": None,
        "keys_stored": all(torch.equal(flat_k[s], key[i]) for i, s in written),
        "values_stored": all(torch.equal(flat_v[s], value[i]) for i, s in written),
        "other_slots_untouched": bool((flat_k[untouched] == 7.0).all() and (flat_v[untouched] == 7.0).all()),
    }


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[2] == "--reshape":
        print(json.dumps(reshape_and_cache(Path(sys.argv[1]), sys.argv[3])))
    elif len(sys.argv) == 3 and sys.argv[2] == "--reduce-edges":
        print(json.dumps(reduce_edges(Path(sys.argv[1]))))
    else:
        print(json.dumps(main(Path(sys.argv[1]))))
