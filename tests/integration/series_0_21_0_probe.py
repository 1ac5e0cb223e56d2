"""Runs the code the vLLM 0.21.0 series changes, without importing vLLM, in its own process.

Usage: ``python series_0_21_0_probe.py CODE_ROOT [SECTION ...]``. ``CODE_ROOT``
holds the released or patched files under test. Prints one JSON object with
what each scenario of the named sections (all when none are named, see
``SECTIONS``) observed; the test decides what is right.

vLLM cannot be imported here (``vllm.config`` needs vLLM's own torch build,
CUDA libraries, its compiled extensions and its other dependencies; the test
environment only has a CPU torch of another version, for the quantize tests).
What runs is the real source cut out of the files, against stand-ins for what
it calls:

* KV cache grouping: the real ``vllm/v1/kv_cache_interface.py`` is loaded as
  a module, and every top-level function of ``vllm/v1/core/kv_cache_utils.py``
  is executed in one namespace, so ``get_kv_cache_groups`` and
  ``get_kv_cache_config_from_groups`` run as written. Stand-ins: ``torch``
  (only ``torch.dtype`` annotations and ``torch.float32`` are touched),
  ``get_dtype_size`` (2 bytes for the bf16 stand-in), ``vllm.logger``
  (``logging``), the attention backend registry enum (unused by the specs
  built here), and a ``VllmConfig`` with the three fields these functions read.
* KV layouts: the real ``GPUModelRunner._shared_kv_cache_tensors_mix_block_dims``
  on a stand-in runner, with backends assembled from the real
  ``AttentionBackend.get_kv_cache_block_dim`` and the real
  ``get_kv_cache_shape`` / ``get_kv_cache_stride_order`` of TRITON_ATTN,
  FLASH_ATTN and FLEX_ATTENTION (``get_kv_cache_layout`` answers "NHD");
  raw tensors are objects with a ``data_ptr``, shared exactly as the KV cache
  config says.
* KV bytes: the real ``_allocate_kv_cache_tensors``, ``_reshape_kv_cache_tensors``
  and the layout methods they call, on a stand-in runner, with real CPU torch
  tensors (imported around the stand-in, see ``_real_torch``): which blocks of
  which layers reach the same bytes of a shared tensor.
* Proposers: the real ``_create_draft_vllm_config`` of the base proposer and
  of the subclass (and the real module-level helpers they call), on classes
  made of just those methods; ``ModelConfig`` is a pydantic dataclass made
  the way vLLM's ``@config`` makes it, carrying the real ``is_mm_prefix_lm``
  property and the real ``ModelArchitectureConfig``.
* Real Gemma 4 shapes: the KV geometry of gemma-4-26B-A4B and gemma-4-31B
  (``TARGETS``) through the same grouping functions.
* ``GPUModelRunner._get_eagle3_aux_layers_from_config`` and
  ``Gemma4Proposer.build_per_group_and_layer_attn_metadata``: the real
  methods on stand-in objects (block tables are lists; the metadata builder
  records what it is given).

A subprocess, because the stand-ins register ``vllm`` and ``torch`` names in
``sys.modules``.
"""

from __future__ import annotations

import __future__
import ast
import copy
import dataclasses
import enum
import functools
import importlib.util
import itertools
import json
import logging
import sys
import textwrap
import types
from collections import defaultdict
from pathlib import Path
from typing import Any

from pydantic import ConfigDict
from pydantic.dataclasses import dataclass as pydantic_dataclass

# ---------------------------------------------------------------- source cutting


def _module(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _class(module: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == name)


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _function(module: ast.Module, name: str) -> ast.FunctionDef | None:
    return next((n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _class_source(name: str, bases: str, methods: list[ast.FunctionDef], extra: str = "") -> str:
    body = "\n\n".join(textwrap.indent(ast.unparse(m), "    ") for m in methods)
    return f"class {name}({bases}):\n{extra}{body or '    pass'}\n"


def _exec(source: str, ns: dict) -> None:
    # Annotations stay strings, as in the vLLM files that use the same future import.
    exec(compile(source, "<probe>", "exec", flags=__future__.annotations.compiler_flag), ns)


def _identity(fn):
    return fn


# ---------------------------------------------------------------- module stand-ins


class _DType:
    def __init__(self, name: str, itemsize: int):
        self.name, self.itemsize = name, itemsize

    def __repr__(self) -> str:
        return f"torch.{self.name}"


BF16 = _DType("bfloat16", 2)


def _install_stand_ins(code_root: Path) -> None:
    def module(name: str, **attrs) -> types.ModuleType:
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        sys.modules[name] = mod
        return mod

    module("torch", dtype=_DType, float32=_DType("float32", 4), bfloat16=BF16)
    for name in ("vllm", "vllm.utils", "vllm.v1", "vllm.v1.attention", "vllm.v1.attention.backends"):
        module(name, __path__=[])
    module("vllm.logger", init_logger=logging.getLogger)
    module(
        "vllm.utils.torch_utils",
        get_dtype_size=lambda dtype: dtype.itemsize,
        nvfp4_kv_cache_full_dim=lambda head_size: head_size,
    )
    module("vllm.v1.attention.backends.registry", MambaAttentionBackendEnum=enum.Enum("M", "MAMBA2"))
    _load("vllm.utils.math_utils", code_root / "vllm" / "utils" / "math_utils.py")


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses and pydantic resolve names through it
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------- KV cache grouping


def kv_cache_namespace(code_root: Path) -> tuple[types.ModuleType, dict]:
    kvi = _load("vllm.v1.kv_cache_interface", code_root / "vllm" / "v1" / "kv_cache_interface.py")
    module = _module(code_root / "vllm" / "v1" / "core" / "kv_cache_utils.py")
    ns: dict[str, Any] = {
        "defaultdict": defaultdict, "replace": dataclasses.replace, "copy": copy,
        "cast": lambda _t, value: value, "logger": logging.getLogger("kv_cache_utils"),
        "cdiv": sys.modules["vllm.utils.math_utils"].cdiv,
        "round_up": sys.modules["vllm.utils.math_utils"].round_up,
    }
    ns.update({k: v for k, v in vars(kvi).items() if not k.startswith("__")})
    for node in module.body:
        if isinstance(node, ast.FunctionDef):
            _exec(ast.unparse(node), ns)
    return kvi, ns


def _vllm_config() -> types.SimpleNamespace:
    return types.SimpleNamespace(
        scheduler_config=types.SimpleNamespace(disable_hybrid_kv_cache_manager=False),
        cache_config=types.SimpleNamespace(num_gpu_blocks_override=None),
        speculative_config=None,
    )


def _specs(kvi, pattern: list[str], draft_layers: int, draft: dict) -> dict:
    """Layer name -> spec: a Gemma-4-shaped target and a DFlash-shaped drafter.

    Target sliding layers: head_dim 256, full layers: head_dim 512 (as Gemma 4);
    the drafter's full-attention layers have their own head_dim, and are marked
    as the drafter's where the tree's KVCacheSpec has ``is_draft``.
    """
    has_is_draft = "is_draft" in {f.name for f in dataclasses.fields(kvi.KVCacheSpec)}
    specs = {}
    for i, kind in enumerate(pattern):
        name = f"language_model.model.layers.{i}.self_attn.attn"
        if kind == "sliding":
            specs[name] = kvi.SlidingWindowSpec(
                block_size=16, num_kv_heads=4, head_size=256, dtype=BF16, sliding_window=1024
            )
        else:
            specs[name] = kvi.FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=512, dtype=BF16)
    marker = {"is_draft": True} if has_is_draft else {}
    for j in range(draft_layers):
        name = f"model.layers.{len(pattern) + j}.self_attn.attn"
        specs[name] = kvi.FullAttentionSpec(block_size=16, dtype=BF16, **draft, **marker)
    return specs


def _groups_facts(groups, draft_names: set[str]) -> dict:
    draft_groups = [i for i, g in enumerate(groups) if draft_names & set(g.layer_names)]
    return {
        "groups": [list(g.layer_names) for g in groups],
        "draft_group_ids": draft_groups,
        "draft_groups_hold_only_draft_layers": all(
            set(groups[i].layer_names) <= draft_names for i in draft_groups
        ),
    }


def kv_grouping(code_root: Path) -> dict:
    kvi, ns = kv_cache_namespace(code_root)
    qwen_like = {"num_kv_heads": 4, "head_size": 128}
    target_like = {"num_kv_heads": 2, "head_size": 512}
    toy = ["sliding"] * 5 + ["full"]
    gemma4_26b = (["sliding"] * 5 + ["full"]) * 5
    scenarios = {
        # The GPU repro: 6-layer target (5 sliding + 1 full), 2-layer drafter.
        "toy_2_drafter_layers": (toy, 2, qwen_like),
        # 26B-A4B shape: 25 sliding + 5 full; 5- and 6-layer drafters.
        "26b_5_drafter_layers": (gemma4_26b, 5, qwen_like),
        "26b_6_drafter_layers": (gemma4_26b, 6, qwen_like),
        # Drafter spec equal to the target's full-attention spec (apart from is_draft).
        "toy_drafter_like_full_layers": (toy, 3, target_like),
        "target_only_toy": (toy, 0, qwen_like),
        "target_only_26b": (gemma4_26b, 0, qwen_like),
        # Non-hybrid: 4 full layers + an EAGLE-like 1-layer drafter of the same spec.
        "uniform_with_drafter": (["full"] * 4, 1, target_like),
    }
    out = {}
    for name, (pattern, n_draft, draft) in scenarios.items():
        specs = _specs(kvi, pattern, n_draft, draft)
        draft_names = set(list(specs)[len(pattern):])
        groups = ns["get_kv_cache_groups"](_vllm_config(), dict(specs))
        facts = _groups_facts(groups, draft_names)
        config = ns["get_kv_cache_config_from_groups"](_vllm_config(), groups, 1 << 30)
        facts["tensors"] = [list(t.shared_by) for t in config.kv_cache_tensors]
        facts["num_blocks"] = config.num_blocks
        out[name] = facts
    return out


# ---------------------------------------------------------------- KV layouts


BACKEND_FILES = (
    ("TRITON_ATTN", "triton_attn.py", "TritonAttentionBackend"),
    ("FLASH_ATTN", "flash_attn.py", "FlashAttentionBackend"),
    ("FLEX_ATTENTION", "flex_attention.py", "FlexAttentionBackend"),
)


def backends(code_root: Path) -> dict[str, type]:
    """The backends from their real get_kv_cache_shape / get_kv_cache_stride_order and the
    real AttentionBackend.get_kv_cache_block_dim. ``get_kv_cache_layout`` answers "NHD",
    vLLM's default on CUDA without a KV connector."""
    base_cls = _class(_module(code_root / "vllm" / "v1" / "attention" / "backend.py"), "AttentionBackend")
    kvi = sys.modules["vllm.v1.kv_cache_interface"]
    ns: dict[str, Any] = {
        "kv_cache_uses_per_token_head_scales": kvi.kv_cache_uses_per_token_head_scales,
        "get_kv_cache_layout": lambda: "NHD",
    }
    _exec(_class_source("AttentionBackend", "", [
        _method(base_cls, "get_kv_cache_block_dim"), _method(base_cls, "get_kv_cache_stride_order")
    ]), ns)
    out = {}
    for label, rel, cls_name in BACKEND_FILES:
        cls = _class(_module(code_root / "vllm/v1/attention/backends" / rel), cls_name)
        methods = [m for m in (_method(cls, "get_kv_cache_shape"), _method(cls, "get_kv_cache_stride_order")) if m]
        _exec(_class_source(cls_name, "AttentionBackend", methods), ns)
        out[label] = ns[cls_name]
    return out


class _RawTensor:
    def __init__(self, ptr: int):
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


def kv_layouts(code_root: Path) -> dict:
    runner = _class(_module(code_root / "vllm" / "v1" / "worker" / "gpu_model_runner.py"), "GPUModelRunner")
    method = _method(runner, "_shared_kv_cache_tensors_mix_block_dims")
    if method is None:
        return {"check_present": False}
    kvi, ns = kv_cache_namespace(code_root)
    attn = backends(code_root)
    exec_ns: dict[str, Any] = {"defaultdict": defaultdict, "AttentionSpec": kvi.AttentionSpec}
    _exec(_class_source("Runner", "", [method]), exec_ns)

    def mixes(draft_backend: str, draft_spec: dict, share: bool = True) -> bool:
        specs = _specs(kvi, ["sliding"] * 5 + ["full"], 2, draft_spec)
        groups = ns["get_kv_cache_groups"](_vllm_config(), dict(specs))
        config = ns["get_kv_cache_config_from_groups"](_vllm_config(), groups, 1 << 30)
        raw = {}
        for ptr, tensor in enumerate(config.kv_cache_tensors):
            for layer in tensor.shared_by:
                # share=False: every layer gets a tensor of its own (no hybrid manager).
                raw[layer] = _RawTensor(ptr if share else id(layer))
        draft_names = set(list(specs)[6:])
        attn_groups = [
            types.SimpleNamespace(
                kv_cache_spec=g.kv_cache_spec, kv_cache_group_id=gid, layer_names=g.layer_names,
                backend=attn[draft_backend if draft_names & set(g.layer_names) else "TRITON_ATTN"],
            )
            for gid, g in enumerate(groups)
        ]
        runner_obj = object.__new__(exec_ns["Runner"])
        runner_obj._kv_cache_spec_attn_group_iterator = lambda: iter(attn_groups)
        runner_obj.cache_config = types.SimpleNamespace(cache_dtype="auto")
        runner_obj.runner_only_attn_layers = set()
        kernel_block_sizes = [g.kv_cache_spec.block_size for g in groups]
        return runner_obj._shared_kv_cache_tensors_mix_block_dims(raw, kernel_block_sizes)

    qwen_like = {"num_kv_heads": 4, "head_size": 128}
    return {
        "check_present": True,
        "block_dims": {k: v.get_kv_cache_block_dim(16, 4, 128) for k, v in attn.items()},
        "flash_drafter_sharing_triton_tensors": mixes("FLASH_ATTN", qwen_like),
        "triton_drafter_sharing_triton_tensors": mixes("TRITON_ATTN", qwen_like),
        "flash_drafter_own_tensors": mixes("FLASH_ATTN", qwen_like, share=False),
    }


# ---------------------------------------------------------------- real Gemma 4 shapes

# KV geometry of the released checkpoints' text configs (head_dim / global_head_dim,
# num_key_value_heads / num_global_key_value_heads, layer_types: 5 sliding then 1 full).
TARGETS = {
    "toy": {"layers": 6, "sliding_kv_heads": 4, "full_kv_heads": 2},  # the GPU proof's small target
    "gemma-4-26B-A4B": {"layers": 30, "sliding_kv_heads": 8, "full_kv_heads": 2},
    "gemma-4-31B": {"layers": 60, "sliding_kv_heads": 16, "full_kv_heads": 4},
}
# A Qwen3-style DFlash drafter layer (full attention); only its own bucket depends on it.
DRAFTER = {"num_kv_heads": 8, "head_size": 128}


def gemma4_specs(kvi, target: str, draft_layers: int, draft: dict | None = None, dtype=BF16) -> dict:
    """Layer name -> KV cache spec of a Gemma 4 target (sliding window 1024, head_dim 256;
    full layers head_dim 512) and a drafter, marked as the drafter's where the tree can."""
    shape = TARGETS[target]
    has_is_draft = "is_draft" in {f.name for f in dataclasses.fields(kvi.KVCacheSpec)}
    specs = {}
    for i in range(shape["layers"]):
        name = f"language_model.model.layers.{i}.self_attn.attn"
        if i % 6 == 5:
            specs[name] = kvi.FullAttentionSpec(
                block_size=16, num_kv_heads=shape["full_kv_heads"], head_size=512, dtype=dtype
            )
        else:
            specs[name] = kvi.SlidingWindowSpec(
                block_size=16, num_kv_heads=shape["sliding_kv_heads"], head_size=256, dtype=dtype,
                sliding_window=1024,
            )
    marker = {"is_draft": True} if has_is_draft else {}
    for j in range(draft_layers):
        specs[f"model.layers.{shape['layers'] + j}.self_attn.attn"] = kvi.FullAttentionSpec(
            block_size=16, dtype=dtype, **(draft or DRAFTER), **marker
        )
    return specs


def kv_grouping_real(code_root: Path) -> dict:
    """Groups and pool split for each target shape with 0, 2, 5, 6 and 11 drafter layers."""
    kvi, ns = kv_cache_namespace(code_root)
    out = {}
    for target in TARGETS:
        for n_draft in (0, 2, 5, 6, 11):
            specs = gemma4_specs(kvi, target, n_draft)
            draft_names = {n for n in specs if n.startswith("model.")}
            groups = ns["get_kv_cache_groups"](_vllm_config(), dict(specs))
            facts = _groups_facts(groups, draft_names)
            config = ns["get_kv_cache_config_from_groups"](_vllm_config(), groups, 1 << 30)
            facts["tensors"] = [list(t.shared_by) for t in config.kv_cache_tensors]
            facts["num_blocks"] = config.num_blocks
            out[f"{target}/{n_draft}"] = facts
    return out


# ---------------------------------------------------------------- KV bytes


@functools.cache
def _real_torch():
    """PyTorch itself (the CPU build the test environment installs), for real KV cache
    tensors. The vLLM modules loaded here see the stand-in under the name ``torch``,
    so the real one is imported (once) around it."""
    stand_in = sys.modules.pop("torch")
    try:
        import torch
    finally:
        sys.modules["torch"] = stand_in
    return torch


RUNNER_KV_METHODS = (
    "_allocate_kv_cache_tensors", "_kv_cache_spec_attn_group_iterator", "_reshape_kv_cache_tensors",
    "_update_hybrid_attention_mamba_layout", "_shared_kv_cache_tensors_mix_block_dims",
)


def kv_runner_class(code_root: Path, kvi, torch) -> type:
    """GPUModelRunner's KV cache allocation, reshaping and layout methods, as written in the tree."""
    runner = _class(_module(code_root / "vllm" / "v1" / "worker" / "gpu_model_runner.py"), "GPUModelRunner")
    methods = [m for m in (_method(runner, name) for name in RUNNER_KV_METHODS) if m is not None]
    ns: dict[str, Any] = {
        "torch": torch, "defaultdict": defaultdict, "itertools": itertools,
        "AttentionSpec": kvi.AttentionSpec, "MambaSpec": kvi.MambaSpec,
        "get_dtype_size": lambda dtype: dtype.itemsize,
    }
    _exec(_class_source("Runner", "", methods), ns)
    return ns["Runner"]


def _block_owner(torch, view, block_dim: int, blocks: int):
    """For each element of the view's storage, the block id (< ``blocks``) whose view reaches it, else -1."""
    size = view.untyped_storage().nbytes() // view.element_size()
    index = torch.arange(size).as_strided(view.size(), view.stride(), view.storage_offset())
    owner = torch.full((size,), -1, dtype=torch.int64)
    for block in range(blocks):
        owner[(index[block] if block_dim == 0 else index[:, block]).flatten()] = block
    return owner


def kv_bytes(code_root: Path, draft_backend: str, share: bool = True, blocks: int = 3,
             draft_layers: int = 5, target_sliding_backend: str = "TRITON_ATTN") -> dict:
    """Allocate and reshape the KV caches of a 26B-A4B-shaped target (TRITON_ATTN) and a
    5-layer drafter (``draft_backend``) with the tree's real runner code on real CPU
    tensors, then check whether block ids of different groups reach the same bytes of
    a shared tensor.

    ``share=False`` gives every layer a tensor of its own (what
    --disable-hybrid-kv-cache-manager amounts to for the bytes).
    ``target_sliding_backend`` is the backend of the target's sliding layers
    (FLASH_ATTN under gemma4-text-only-per-layer-attention-backend; the full
    layers stay on TRITON_ATTN); ``draft_layers=0`` leaves the drafter out.
    """
    torch = _real_torch()
    kvi, ns = kv_cache_namespace(code_root)
    attn = backends(code_root)
    specs = gemma4_specs(kvi, "gemma-4-26B-A4B", draft_layers, dtype=torch.bfloat16)
    draft_names = {n for n in specs if n.startswith("model.")}

    def backend_of(group) -> type:
        if draft_names & set(group.layer_names):
            return attn[draft_backend]
        sliding = isinstance(group.kv_cache_spec, kvi.SlidingWindowSpec)
        return attn[target_sliding_backend if sliding else "TRITON_ATTN"]

    groups = ns["get_kv_cache_groups"](_vllm_config(), dict(specs))
    page = max(g.kv_cache_spec.page_size_bytes for g in groups)
    config = ns["get_kv_cache_config_from_groups"](_vllm_config(), groups, blocks * page * len(groups[0].layer_names))
    if not share:
        config.kv_cache_tensors = [
            kvi.KVCacheTensor(size=t.size, shared_by=[layer]) for t in config.kv_cache_tensors for layer in t.shared_by
        ]
    runner = object.__new__(kv_runner_class(code_root, kvi, torch))
    runner.kv_cache_config = config
    runner.runner_only_attn_layers = set()
    runner.cache_config = types.SimpleNamespace(cache_dtype="auto")
    runner.device = "cpu"
    runner.attn_groups = [
        [types.SimpleNamespace(
            backend=backend_of(g), layer_names=list(g.layer_names), kv_cache_spec=g.kv_cache_spec,
            kv_cache_group_id=gid,
        )]
        for gid, g in enumerate(config.kv_cache_groups)
    ]
    kernel_block_sizes = [g.kv_cache_spec.block_size for g in config.kv_cache_groups]
    raw = runner._allocate_kv_cache_tensors(config)
    caches = runner._reshape_kv_cache_tensors(raw, kernel_block_sizes)

    block_dim = {}
    for group in itertools.chain.from_iterable(runner.attn_groups):
        spec = group.kv_cache_spec
        for layer in group.layer_names:
            block_dim[layer] = group.backend.get_kv_cache_block_dim(spec.block_size, spec.num_kv_heads, spec.head_size)
    group_of = {layer: gid for gid, g in enumerate(config.kv_cache_groups) for layer in g.layer_names}
    aliased = []
    # The owner map depends only on the view's layout (storage size, shape, strides, offset, block
    # dim): most layers share one, so each layout's map and each pair of layouts' first clash is
    # computed once (the same pairs, in the same order, as comparing every layer with every other).
    owner_of: dict[tuple, Any] = {}
    first_clash: dict[tuple, int | None] = {}

    def layout(layer: str) -> tuple:
        view = caches[layer]
        key = (view.untyped_storage().nbytes(), view.element_size(), tuple(view.size()), tuple(view.stride()),
               view.storage_offset(), block_dim[layer])
        if key not in owner_of:
            owner_of[key] = _block_owner(torch, view, block_dim[layer], blocks)
        return key

    for tensor in config.kv_cache_tensors:
        keys = {layer: layout(layer) for layer in tensor.shared_by}
        for a, b in itertools.combinations(tensor.shared_by, 2):
            if group_of[a] == group_of[b]:
                continue
            # Different groups hold different block ids of the one pool: a byte that
            # block i of one layer and block j != i of the other both reach is aliased.
            oa, ob = owner_of[keys[a]], owner_of[keys[b]]
            if (keys[a], keys[b]) not in first_clash:
                clash = (oa >= 0) & (ob >= 0) & (oa != ob)
                first_clash[keys[a], keys[b]] = int(clash.nonzero()[0]) if bool(clash.any()) else None
            first = first_clash[keys[a], keys[b]]
            if first is not None:
                aliased.append([a, int(oa[first]), b, int(ob[first])])
    # The first layer of the drafter, or with none the first sliding layer of the target.
    draft_layer = sorted(draft_names)[0] if draft_names else "language_model.model.layers.0.self_attn.attn"
    target_layer = sorted(set(specs) - draft_names)[0]
    return {
        "groups": len(config.kv_cache_groups),
        "shared_tensors": sum(len(t.shared_by) > 1 for t in config.kv_cache_tensors),
        "aliased_pairs": len(aliased),
        "example": aliased[0] if aliased else None,
        "draft_block_dim": block_dim[draft_layer],
        "draft_stride": list(caches[draft_layer].stride()),
        "draft_contiguous_stride": list(torch.empty(caches[draft_layer].shape).stride()),
        "target_stride": list(caches[target_layer].stride()),
        "target_contiguous_stride": list(torch.empty(caches[target_layer].shape).stride()),
        "draft_flex_read": _flex_read(caches[draft_layer], specs[draft_layer]) if block_dim[draft_layer] == 1 else None,
    }


def _flex_read(kv_cache, spec) -> str:
    """What FlexAttentionImpl.forward does first with a layer's cache
    (``kv_cache.unbind(0)``, then ``key_cache.view(-1, num_kv_heads, head_size)``):
    "ok", or the error torch raises."""
    key_cache, _ = kv_cache.unbind(0)
    try:
        key_cache.view(-1, spec.num_kv_heads, spec.head_size)
    except RuntimeError as exc:
        return str(exc).splitlines()[0]
    return "ok"


def kv_layout_guards(code_root: Path) -> dict:
    """The layout updater and the detector with a trailing group of layers without KV
    cache (an encoder-only layer: a runner-only layer, in a group past kernel_block_sizes)."""
    torch = _real_torch()
    kvi, ns = kv_cache_namespace(code_root)
    attn = backends(code_root)
    runner_cls = kv_runner_class(code_root, kvi, torch)
    spec = kvi.FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    encoder_spec = kvi.EncoderOnlyAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    runner = object.__new__(runner_cls)
    runner.kv_cache_config = types.SimpleNamespace(kv_cache_groups=["decoder", "encoder-only"])
    runner.runner_only_attn_layers = {"encoder.attn"}
    runner.cache_config = types.SimpleNamespace(cache_dtype="auto")
    runner.attn_groups = [
        [types.SimpleNamespace(backend=attn["FLASH_ATTN"], layer_names=["decoder.attn"],
                               kv_cache_spec=spec, kv_cache_group_id=0)],
        [types.SimpleNamespace(backend=attn["FLASH_ATTN"], layer_names=["encoder.attn"],
                               kv_cache_spec=encoder_spec, kv_cache_group_id=1)],
    ]
    raw = torch.zeros(4 * spec.page_size_bytes, dtype=torch.int8)
    shape = attn["FLASH_ATTN"].get_kv_cache_shape(4, 16, 2, 64)
    caches = {"decoder.attn": raw.view(torch.bfloat16).view(shape)}
    out: dict[str, Any] = {}
    try:
        runner._update_hybrid_attention_mamba_layout(caches, [16])
        out["updater"] = "ok"
    except Exception as exc:  # the released updater indexes past kernel_block_sizes
        out["updater"] = type(exc).__name__
    out["decoder_restrided"] = list(caches["decoder.attn"].stride())
    if hasattr(runner, "_shared_kv_cache_tensors_mix_block_dims"):
        out["detector"] = runner._shared_kv_cache_tensors_mix_block_dims({"decoder.attn": raw}, [16])
    return out


# ---------------------------------------------------------------- proposer configs


@dataclasses.dataclass
class AttentionConfig:
    backend: Any = None
    use_non_causal: bool = False


@dataclasses.dataclass
class KernelConfig:
    moe_backend: Any = None


@dataclasses.dataclass
class VllmConfig:
    model_config: Any
    attention_config: AttentionConfig
    kernel_config: KernelConfig = dataclasses.field(default_factory=KernelConfig)


def model_config_classes(code_root: Path):
    """A ModelConfig stand-in with the tree's real is_mm_prefix_lm, and the real arch config."""
    arch_module = _load("vllm.config.model_arch", code_root / "vllm" / "config" / "model_arch.py")
    prop = _method(_class(_module(code_root / "vllm" / "config" / "model.py"), "ModelConfig"), "is_mm_prefix_lm")
    ns: dict[str, Any] = {}
    _exec(_class_source("ModelConfig", "", [prop], "    model: str = 'google/gemma-4-26B-A4B-it'\n"), ns)
    model_config = pydantic_dataclass(config=ConfigDict(arbitrary_types_allowed=True, extra="forbid"))(
        ns["ModelConfig"]
    )
    return model_config, arch_module.ModelArchitectureConfig, ast.unparse(prop.decorator_list[0])


def _target(model_config_cls, arch_cls, mm_prefix: bool):
    arch = arch_cls(
        architectures=["Gemma4ForConditionalGeneration"], model_type="gemma4",
        text_model_type="gemma4_text", hidden_size=2816, total_num_hidden_layers=30,
        total_num_attention_heads=16, head_size=512, vocab_size=262144, total_num_kv_heads=8,
        num_experts=128, quantization_config=None, is_deepseek_mla=False,
        is_mm_prefix_lm=mm_prefix, derived_max_model_len_and_key=(131072.0, "max_position_embeddings"),
    )
    target = model_config_cls()
    # Set in ModelConfig.__post_init__ in vLLM, as these two are here.
    target.model_arch_config = arch
    target.config_updated = True
    return target, arch


def proposer_class(code_root: Path, rel: str, name: str, helpers: tuple[str, ...] = ()):
    """``name`` made of its real _create_draft_vllm_config over the real base one."""
    base_module = _module(code_root / "vllm" / "v1" / "spec_decode" / "llm_base_proposer.py")
    base = _method(_class(base_module, "SpecDecodeBaseProposer"), "_create_draft_vllm_config")
    module = _module(code_root / rel)
    sub = _method(_class(module, name), "_create_draft_vllm_config")
    ns: dict[str, Any] = {
        "replace": dataclasses.replace, "override": _identity, "copy": copy,
        "VllmConfig": VllmConfig, "ModelConfig": object,
    }
    for helper in helpers:
        if (fn := _function(module, helper)) is not None:
            _exec(ast.unparse(fn), ns)
    _exec(_class_source("SpecDecodeBaseProposer", "", [base]), ns)
    _exec(_class_source(name, "SpecDecodeBaseProposer", [sub]), ns)
    return ns[name]


def _speculative_config(attention_backend=None):
    return types.SimpleNamespace(moe_backend=None, attention_backend=attention_backend)


def dflash_drafter_config(code_root: Path) -> dict:
    model_config_cls, arch_cls, decorator = model_config_classes(code_root)
    cls = proposer_class(
        code_root, "vllm/v1/spec_decode/dflash.py", "DFlashProposer", ("_model_config_without_mm_prefix",)
    )
    out: dict[str, Any] = {"is_mm_prefix_lm_decorator": decorator}
    for label, mm_prefix in (("multimodal_target", True), ("text_only_target", False)):
        target, arch = _target(model_config_cls, arch_cls, mm_prefix)
        proposer = object.__new__(cls)
        proposer.speculative_config = _speculative_config("FLASH_ATTN")
        proposer.vllm_config = VllmConfig(target, AttentionConfig(backend="TRITON_ATTN"))
        draft = proposer._create_draft_vllm_config()
        out[label] = {
            "draft_is_mm_prefix_lm": draft.model_config.is_mm_prefix_lm,
            "draft_model_config_is_target": draft.model_config is target,
            "draft_shares_hf_identity": draft.model_config.model == target.model,
            "draft_arch_other_fields_kept": dataclasses.replace(
                draft.model_config.model_arch_config, is_mm_prefix_lm=mm_prefix
            ) == arch,
            "draft_backend": draft.attention_config.backend,
            "draft_use_non_causal": draft.attention_config.use_non_causal,
            "target_is_mm_prefix_lm": target.is_mm_prefix_lm,
            "target_arch_object_kept": target.model_arch_config is arch,
            "target_vllm_config_model_kept": proposer.vllm_config.model_config is target,
            "target_backend": proposer.vllm_config.attention_config.backend,
        }
    return out


def aux_layers(code_root: Path) -> dict:
    runner = _class(_module(code_root / "vllm" / "v1" / "worker" / "gpu_model_runner.py"), "GPUModelRunner")
    ns: dict[str, Any] = {}
    _exec(_class_source("Runner", "", [_method(runner, "_get_eagle3_aux_layers_from_config")]), ns)

    def run(**hf_fields):
        obj = object.__new__(ns["Runner"])
        hf_config = types.SimpleNamespace(**hf_fields)
        obj.speculative_config = types.SimpleNamespace(
            draft_model_config=types.SimpleNamespace(hf_config=hf_config)
        )
        result = obj._get_eagle3_aux_layers_from_config()
        return list(result) if result is not None else None

    return {
        "dflash_config": run(dflash_config={"target_layer_ids": [1, 7, 13, 19, 25], "mask_token_id": 4}),
        "eagle_ids": run(eagle_aux_hidden_state_layer_ids=[2, 15, 27]),
        # Speculators-format DFlash: both are written, the eagle ids win.
        "both": run(eagle_aux_hidden_state_layer_ids=[2, 8],
                    dflash_config={"target_layer_ids": [2, 8]}),
        "none": run(),
    }


def spec_hash(code_root: Path) -> dict:
    """``SpeculativeConfig.compute_hash`` and the ``safe_hash`` it calls, both real, on stand-in
    configs: the draft ``ModelConfig`` answers ``compute_hash()`` with one value per checkpoint
    (its real hash needs vLLM's pydantic ``ModelConfig`` built from a checkpoint on disk)."""
    import _hashlib
    import hashlib

    spec = _class(_module(code_root / "vllm" / "config" / "speculative.py"), "SpeculativeConfig")
    hashing = _module(code_root / "vllm" / "utils" / "hashing.py")
    ns: dict[str, Any] = {"hashlib": hashlib, "HASH": object,
                          "UnsupportedDigestmodError": _hashlib.UnsupportedDigestmodError}
    _exec(ast.unparse(_function(hashing, "safe_hash")), ns)
    _exec(_class_source("Spec", "", [_method(spec, "compute_hash")]), ns)

    def run(method: str, checkpoint: str | None = None, **hf_fields) -> str:
        obj = object.__new__(ns["Spec"])
        obj.method = method
        obj.draft_model_config = None if checkpoint is None else types.SimpleNamespace(
            hf_config=types.SimpleNamespace(**hf_fields), compute_hash=lambda: f"model-config-of-{checkpoint}")
        return obj.compute_hash()

    return {
        # Two z-lab DFlash drafters of one target, their layers named only in dflash_config.
        "dflash_a": run("dflash", "dflash-a", dflash_config={"target_layer_ids": [1, 7, 13, 19, 25]}),
        "dflash_b": run("dflash", "dflash-b", dflash_config={"target_layer_ids": [2, 9, 15, 21, 27]}),
        "eagle3": run("eagle3", "eagle3-a", eagle_aux_hidden_state_layer_ids=[2, 15, 27]),
        "mtp": run("mtp", "mtp-a"),
        "ngram": run("ngram"),
    }


def _kv_bytes_cases(code: Path) -> dict:
    return {
        "flash_drafter_shared": kv_bytes(code, "FLASH_ATTN"),
        "flex_drafter_shared": kv_bytes(code, "FLEX_ATTENTION"),
        "triton_drafter_shared": kv_bytes(code, "TRITON_ATTN"),
        "flash_drafter_own_tensors": kv_bytes(code, "FLASH_ATTN", share=False),
        # gemma4-text-only-per-layer-attention-backend's own mix, no drafter: sliding
        # layers FLASH_ATTN, full layers TRITON_ATTN, on the tensors they share.
        "per_layer_target_shared": kv_bytes(code, "FLASH_ATTN", draft_layers=0, target_sliding_backend="FLASH_ATTN"),
    }


SECTIONS = {
    "kv_grouping": kv_grouping,
    "kv_layouts": kv_layouts,
    "dflash_drafter_config": dflash_drafter_config,
    "aux_layers": aux_layers,
    "spec_hash": spec_hash,
    "kv_grouping_real": kv_grouping_real,
    "kv_bytes": _kv_bytes_cases,
    "kv_layout_guards": kv_layout_guards,
}


def main(code_root: str, sections: list[str]) -> None:
    """Print the named sections (all when none are named) as one JSON object."""
    code = Path(code_root)
    _install_stand_ins(code)
    print(json.dumps({name: SECTIONS[name](code) for name in sections or SECTIONS}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
