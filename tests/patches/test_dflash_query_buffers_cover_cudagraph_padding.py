"""Regression test for dflash-query-buffers-cover-cudagraph-padding (0.21.0/0009; PR #50065).

Runs the tree's real ``DFlashProposer.__init__`` over the real
``SpecDecodeBaseProposer.__init__`` (both loaded from source with
``tests/patches/vllm_source.py``), whose ``CudagraphDispatcher`` is the real
one (``vllm/v1/cudagraph_dispatcher.py``, with the real ``CUDAGraphMode`` and
``BatchDescriptor``), then takes the padding path ``propose`` takes: the real
``initialize_cudagraph_keys`` and ``_determine_batch_execution_and_padding``
give the padded token count, and the query buffers are sliced to it as
``propose`` and ``dummy_run`` do (``self.positions[:num_input_tokens]``).
Buffers are real CPU torch tensors. Stand-ins, for what needs vLLM's compiled
code or a GPU: the multimodal registry (text-only drafter), ``CpuGpuBuffer``
(a CPU tensor), the platform (CUDA, not ROCm), the drafter model module's
``dflash_has_any_non_causal`` (non-causal), breakable CUDA graphs (off, as by default),
and the configs (the fields these
methods read).

The GPU proof's case: 17 requests x 16 query tokens = 272, not a capture size,
padded to 512. The released code allocates 272 positions, so the slice is 272
long while the graph reads 512 (tests/gpu/results/realshape.md).
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import sys
import types

import numpy
import pytest
import torch

from tests.integration.series_0_21_0_probe import _class, _exec, _module
from tests.patches.vllm_source import load

PATCH_ID = "dflash-query-buffers-cover-cudagraph-padding"
VERSIONS = ["0.21.0"]  # 0.27.1 and later have the fix; 0.26.0 runs the recipes' drafter on V2
MAX_NUM_SEQS = 17
NUM_SPECULATIVE_TOKENS = 15  # the recipe's
MAX_NUM_BATCHED_TOKENS = 8192
BATCH = MAX_NUM_SEQS * (1 + NUM_SPECULATIVE_TOKENS)  # 272 query tokens
# Capture sizes of the proof's kind: 272 is not one of them, 512 is the next.
CAPTURE_SIZES = [1, 2, 4, *range(8, 257, 8), 512]

pytestmark = pytest.mark.network  # first run downloads the release from PyPI


class _CpuGpuBuffer:
    """Stands in for vllm.v1.utils.CpuGpuBuffer (pinned host + device pair): one CPU tensor."""

    def __init__(self, *size, dtype, device, pin_memory, with_numpy=True):
        self.gpu = self.cpu = torch.zeros(*size, dtype=dtype)


@pytest.fixture(autouse=True)
def _qwen3_dflash(monkeypatch):
    # Later releases' __init__ imports dflash_has_any_non_causal from the drafter
    # model module, which needs vLLM's compiled code: a stand-in (non-causal).
    module = types.ModuleType("vllm.model_executor.models.qwen3_dflash")
    module.dflash_has_any_non_causal = lambda hf_config: True
    monkeypatch.setitem(sys.modules, module.__name__, module)
    # 0.26.0's CudagraphDispatcher.__init__ asks whether breakable CUDA graphs are on
    # (VLLM_USE_BREAKABLE_CUDAGRAPH, unset by default): they are not.
    for name in ("vllm", "vllm.compilation"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    breakable = types.ModuleType("vllm.compilation.breakable_cudagraph")
    breakable.is_breakable_cudagraph_enabled = lambda: False
    monkeypatch.setitem(sys.modules, breakable.__name__, breakable)


def _real_class(tree, rel: str, name: str) -> type:
    ns: dict = {"enum": enum, "dataclass": dataclasses.dataclass}
    _exec(ast.unparse(_class(_module(tree / rel), name)), ns)
    return ns[name]


def _proposer(tree, capture_sizes: list[int] | None):
    graph_mode = _real_class(tree, "vllm/config/compilation.py", "CUDAGraphMode")
    descriptor = _real_class(tree, "vllm/forward_context.py", "BatchDescriptor")
    dispatcher = load(tree, "vllm/v1/cudagraph_dispatcher.py",
                      overrides={"CUDAGraphMode": graph_mode, "BatchDescriptor": descriptor})
    base = load(tree, "vllm/v1/spec_decode/llm_base_proposer.py", overrides={
        "torch": torch, "np": numpy, "CUDAGraphMode": graph_mode,
        "CudagraphDispatcher": dispatcher["CudagraphDispatcher"], "CpuGpuBuffer": _CpuGpuBuffer,
        "MULTIMODAL_REGISTRY": types.SimpleNamespace(supports_multimodal_inputs=lambda model_config: False),
        "is_pin_memory_available": lambda: False, "current_platform": types.SimpleNamespace(is_rocm=lambda: False),
    })
    dflash = load(tree, "vllm/v1/spec_decode/dflash.py", overrides={
        "torch": torch, "SpecDecodeBaseProposer": base["SpecDecodeBaseProposer"], "override": lambda fn: fn,
    })
    drafter_hf = types.SimpleNamespace(dflash_config={"mask_token_id": 4}, causal=False)
    draft_model_config = types.SimpleNamespace(
        hf_config=drafter_hf, get_hidden_size=lambda: 2816, get_inputs_embeds_size=lambda: 2816,
        uses_mrope=False, uses_xdrope_dim=0)
    mode = graph_mode.FULL_AND_PIECEWISE if capture_sizes else graph_mode.NONE
    config = types.SimpleNamespace(
        speculative_config=types.SimpleNamespace(
            method="dflash", num_speculative_tokens=NUM_SPECULATIVE_TOKENS, draft_model_config=draft_model_config,
            parallel_drafting=True, use_local_argmax_reduction=False, disable_padded_drafter_batch=False,
            enforce_eager=False, moe_backend=None, use_heterogeneous_vocab=False,
            rejection_sample_method="standard", draft_sample_method="greedy"),
        model_config=types.SimpleNamespace(dtype=torch.bfloat16, max_model_len=131072, uses_xdrope_dim=0,
                                           use_fp64_gumbel=False),
        parallel_config=types.SimpleNamespace(data_parallel_rank=0, data_parallel_size=1),
        scheduler_config=types.SimpleNamespace(max_num_seqs=MAX_NUM_SEQS,
                                               max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS),
        compilation_config=types.SimpleNamespace(
            cudagraph_mode=mode, cudagraph_capture_sizes=capture_sizes,
            max_cudagraph_capture_size=max(capture_sizes) if capture_sizes else None, compile_sizes=[],
            is_attention_compiled_piecewise=lambda: True, cudagraph_specialize_lora=False),
        lora_config=None,
        num_speculative_tokens=NUM_SPECULATIVE_TOKENS,  # VllmConfig's own property from 0.26.0
    )
    drafter = dflash["DFlashProposer"](vllm_config=config, device="cpu")
    drafter.initialize_cudagraph_keys(mode)
    return drafter


@pytest.mark.parametrize("version", VERSIONS)
def test_padded_query_slices_are_as_long_as_the_padded_batch(version, vllm_tree):
    drafter = _proposer(vllm_tree(version, PATCH_ID), CAPTURE_SIZES)
    _, padded, _ = drafter._determine_batch_execution_and_padding(BATCH)
    assert padded == 512  # the dispatcher's padding, as on the GPU
    assert drafter.positions[:padded].numel() == padded
    assert drafter._slot_mapping_buffer[:padded].numel() == padded
    # The largest real batch still fits, and the context buffers are unchanged.
    assert drafter.max_query_tokens == BATCH
    assert drafter._context_positions_buffer.numel() == MAX_NUM_BATCHED_TOKENS
    # Positions of context + query tokens are addressed through arange.
    assert drafter.arange.numel() >= MAX_NUM_BATCHED_TOKENS + padded + 1


@pytest.mark.parametrize("version", VERSIONS)
def test_released_slices_fall_short_of_the_padded_batch(version, stock_tree):
    drafter = _proposer(stock_tree(version), CAPTURE_SIZES)
    _, padded, _ = drafter._determine_batch_execution_and_padding(BATCH)
    assert (padded, drafter.positions[:padded].numel()) == (512, BATCH)


@pytest.mark.parametrize("version", VERSIONS)
def test_eager_and_small_capture_sizes_unchanged(version, vllm_tree):
    # Without CUDA graphs or with captures below the largest batch, nothing is padded
    # past the batch and the buffers keep the released size: one slot per query token.
    for sizes in (None, [1, 2, 4, *range(8, 129, 8)]):
        drafter = _proposer(vllm_tree(version, PATCH_ID), sizes)
        _, padded, _ = drafter._determine_batch_execution_and_padding(BATCH)
        assert padded == BATCH
        assert drafter.positions.numel() == BATCH
        assert drafter._slot_mapping_buffer.numel() == BATCH
