"""Regression test for flash-attn-metadata-group-geometry (0.21.0/0010, backport of PR #53002 / #53336).

Runs the tree's real ``FlashAttentionMetadataBuilder.__init__`` (cut out of
``vllm/v1/attention/backends/flash_attn.py``) with the tree's real
``get_layers_from_vllm_config`` (``vllm/config/vllm.py``) and, where the tree
has it, the patch's ``_num_heads_q_from_layers``, for the attention groups of
a Gemma-4-26B-A4B-shaped model served text only (patch
gemma4-text-only-per-layer-attention-backend puts the sliding layers on
FLASH_ATTN) and of a DFlash drafter. Stand-ins, since neither torch's CUDA
build nor vLLM can be imported here: the base ``AttentionMetadataBuilder``
(stores its four arguments), ``get_flash_attn_version`` (3: Hopper, where the
AOT scheduler runs), ``get_dcp_group`` (DCP not initialised, as the code
allows), the ``Attention`` layer class (per-rank ``num_heads``, the attribute
the real layer sets) and the configs.

What FA3 plans with: ``build()``'s ``schedule`` hands ``self.num_heads_q``,
``self.num_heads_kv`` and ``self.headdim`` to ``get_scheduler_metadata`` (the
last test reads that call from the source). A GPU run of FA3 itself is not
part of this test.
"""

from __future__ import annotations

import ast
import sys
import types
from pathlib import Path

import pytest

from tests.integration.series_0_21_0_probe import _class, _class_source, _exec, _function, _method, _module

PATCH_ID = "flash-attn-metadata-group-geometry"
VERSION = "0.21.0"
FLASH_ATTN_PY = "vllm/v1/attention/backends/flash_attn.py"

# gemma-4-26B-A4B text config: 16 query heads everywhere; sliding layers head_dim 256 with
# 8 KV heads, full layers global_head_dim 512 with 2; ModelConfig.get_head_size() is 512.
MODEL = {"heads_q": 16, "kv_heads": 8, "head_size": 512}
SLIDING = {"num_kv_heads": 8, "head_size": 256}
DRAFTER = {"num_kv_heads": 8, "head_size": 128, "heads_q": 32}  # a Qwen3-style DFlash layer

pytestmark = pytest.mark.network  # first run downloads the release from PyPI


class Attention:
    """Stands in for vllm.model_executor.layers.attention.Attention: per-rank num_heads."""

    def __init__(self, num_heads: int):
        self.num_heads = num_heads


class _BaseBuilder:
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        self.kv_cache_spec, self.layer_names = kv_cache_spec, layer_names
        self.vllm_config, self.device = vllm_config, device


@pytest.fixture(autouse=True)
def _no_dcp(monkeypatch):
    def get_dcp_group():
        raise AssertionError("DCP group is not initialized")

    for name in ("vllm", "vllm.distributed"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    state = types.ModuleType("vllm.distributed.parallel_state")
    state.get_dcp_group = get_dcp_group
    monkeypatch.setitem(sys.modules, state.__name__, state)


def _builder_class(tree: Path) -> type:
    module = _module(tree / FLASH_ATTN_PY)
    ns: dict = {"Attention": Attention, "AttentionMetadataBuilder": _BaseBuilder,
                "get_flash_attn_version": lambda *a, **k: 3, "round_up": lambda x, m: -(-x // m) * m}
    _exec(ast.unparse(_function(_module(tree / "vllm/config/vllm.py"), "get_layers_from_vllm_config")), ns)
    if (helper := _function(module, "_num_heads_q_from_layers")) is not None:
        _exec(ast.unparse(helper), ns)
    cls = _class(module, "FlashAttentionMetadataBuilder")
    _exec(_class_source("FlashAttentionMetadataBuilder", "AttentionMetadataBuilder", [_method(cls, "__init__")]), ns)
    return ns["FlashAttentionMetadataBuilder"]


def _vllm_config(layers: dict) -> types.SimpleNamespace:
    model_config = types.SimpleNamespace(
        get_num_attention_heads=lambda parallel_config: MODEL["heads_q"],
        get_num_kv_heads=lambda parallel_config: MODEL["kv_heads"],
        get_head_size=lambda: MODEL["head_size"])
    return types.SimpleNamespace(
        model_config=model_config,
        parallel_config=types.SimpleNamespace(cp_kv_cache_interleave_size=1),
        cache_config=types.SimpleNamespace(cache_dtype="auto"),
        compilation_config=types.SimpleNamespace(
            static_forward_context=layers, max_cudagraph_capture_size=512,
            cudagraph_mode=types.SimpleNamespace(has_full_cudagraphs=lambda: False)),
        attention_config=types.SimpleNamespace(flash_attn_max_num_splits_for_cuda_graph=32),
        scheduler_config=types.SimpleNamespace(max_num_seqs=22))


def _geometry(tree: Path, spec: dict, layer_names: list[str], layers: dict) -> tuple[int, int, int]:
    kv_cache_spec = types.SimpleNamespace(block_size=16, dtype="bfloat16", **spec)
    builder = _builder_class(tree)(kv_cache_spec, layer_names, _vllm_config(layers), "cpu")
    assert builder.aot_schedule is True  # FA3: the AOT scheduler is what reads these
    return builder.num_heads_q, builder.num_heads_kv, builder.headdim


def _sliding_group(tree: Path):
    names = [f"language_model.model.layers.{i}.self_attn.attn" for i in range(5)]
    return _geometry(tree, SLIDING, names, {n: Attention(MODEL["heads_q"]) for n in names})


def test_sliding_layers_on_fa3_are_planned_with_their_own_head_size(vllm_tree):
    assert _sliding_group(vllm_tree(VERSION, PATCH_ID)) == (16, 8, 256)


def test_released_plans_them_with_the_model_wide_head_size_512(stock_tree):
    assert _sliding_group(stock_tree(VERSION)) == (16, 8, 512)


def test_drafter_group_is_planned_with_the_drafters_heads(vllm_tree):
    names = [f"model.layers.{30 + i}.self_attn.attn" for i in range(5)]
    spec = {k: DRAFTER[k] for k in ("num_kv_heads", "head_size")}
    layers = {n: Attention(DRAFTER["heads_q"]) for n in names}
    assert _geometry(vllm_tree(VERSION, PATCH_ID), spec, names, layers) == (32, 8, 128)


def test_layers_not_registered_fall_back_to_the_model_wide_query_heads_as_before(vllm_tree):
    assert _geometry(vllm_tree(VERSION, PATCH_ID), SLIDING, ["not.registered"], {})[0] == MODEL["heads_q"]


def test_fa3_schedule_reads_the_builder_geometry_unchanged(vllm_tree):
    source = (vllm_tree(VERSION, PATCH_ID) / FLASH_ATTN_PY).read_text()
    call = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)
                and isinstance(n.func, ast.Name) and n.func.id == "get_scheduler_metadata")
    args = {k.arg: ast.unparse(k.value) for k in call.keywords}
    assert args["headdim"] == "self.headdim"
    assert args["num_heads_kv"] == "self.num_heads_kv"
    assert args["num_heads_q"] == "self.num_heads_q * self.dcp_world_size"


def test_group_with_mixed_query_heads_keeps_the_model_wide_count_as_before(vllm_tree):
    # 0.21.0 adds KV-sharing layers (Gemma 4 MTP draft layers, 4 query heads here) to their
    # target layer's group; such a group keeps the model-wide count instead of failing.
    names = [f"language_model.model.layers.{i}.self_attn.attn" for i in range(5)] + ["draft.layers.0.self_attn.attn"]
    layers = {n: Attention(4 if n.startswith("draft") else MODEL["heads_q"]) for n in names}
    assert _geometry(vllm_tree(VERSION, PATCH_ID), SLIDING, names, layers) == (16, 8, 256)
