"""Regression test for dflash-query-buffers-cover-cudagraph-padding (0.21.0/0009, 0.26.0/0004; PR #50065).

Runs the real ``DFlashProposer.__init__`` of the tree (loaded from its source
with ``tests/patches/vllm_source.py``; the base proposer's ``__init__`` is a
stand-in that sets the fields DFlash's own ``__init__`` reads, and the
buffers are real CPU torch tensors), then slices the query buffers the way
``propose`` and ``dummy_run`` do for a CUDA-graph-padded batch:
``self.positions[:num_input_tokens]``.

The GPU proof's case: 17 requests x 16 query tokens = 272, padded to the
capture size 512. The released code allocates 272 positions, so the slice is
272 long while the graph reads 512 (tests/gpu/results/realshape.md).
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from tests.patches.vllm_source import load

PATCH_ID = "dflash-query-buffers-cover-cudagraph-padding"
VERSIONS = ["0.21.0", "0.26.0"]  # 0.27.1 and later have the fix
MAX_NUM_SEQS = 17
NUM_SPECULATIVE_TOKENS = 15  # the recipe's
MAX_NUM_BATCHED_TOKENS = 8192

pytestmark = pytest.mark.network  # first run downloads the release from PyPI


class _BaseProposer:
    """Stands in for SpecDecodeBaseProposer.__init__ (device buffers, the drafter model)."""

    def __init__(self, vllm_config, device, pass_hidden_states_to_model, runner=None):
        self.vllm_config = vllm_config
        self.device = device
        self.max_batch_size = vllm_config.scheduler_config.max_num_seqs
        self.num_speculative_tokens = vllm_config.speculative_config.num_speculative_tokens
        self.max_num_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.draft_model_config = vllm_config.speculative_config.draft_model_config


@pytest.fixture(autouse=True)
def _qwen3_dflash(monkeypatch):
    # Later releases' __init__ imports dflash_has_any_non_causal from the drafter
    # model module, which needs vLLM's compiled code: a stand-in (non-causal).
    module = types.ModuleType("vllm.model_executor.models.qwen3_dflash")
    module.dflash_has_any_non_causal = lambda hf_config: True
    monkeypatch.setitem(sys.modules, module.__name__, module)


def _proposer(tree, max_capture_size: int | None):
    ns = load(tree, "vllm/v1/spec_decode/dflash.py", overrides={
        "torch": torch, "SpecDecodeBaseProposer": _BaseProposer, "override": lambda fn: fn,
    })
    drafter_hf = types.SimpleNamespace(dflash_config={"mask_token_id": 4}, causal=False)
    config = types.SimpleNamespace(
        speculative_config=types.SimpleNamespace(
            method="dflash", num_speculative_tokens=NUM_SPECULATIVE_TOKENS,
            draft_model_config=types.SimpleNamespace(hf_config=drafter_hf)),
        scheduler_config=types.SimpleNamespace(max_num_seqs=MAX_NUM_SEQS,
                                               max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS),
        compilation_config=types.SimpleNamespace(max_cudagraph_capture_size=max_capture_size),
    )
    return ns["DFlashProposer"](vllm_config=config, device="cpu")


@pytest.mark.parametrize("version", VERSIONS)
def test_padded_query_slices_are_as_long_as_the_padded_batch(version, vllm_tree):
    drafter = _proposer(vllm_tree(version, PATCH_ID), max_capture_size=512)
    padded = 512  # 17 x 16 = 272 query tokens, dispatched to the capture size 512
    assert drafter.positions[:padded].numel() == padded
    assert drafter._slot_mapping_buffer[:padded].numel() == padded
    # The largest real batch still fits, and the context buffers are unchanged.
    assert drafter.max_query_tokens == MAX_NUM_SEQS * (1 + NUM_SPECULATIVE_TOKENS)
    assert drafter._context_positions_buffer.numel() == MAX_NUM_BATCHED_TOKENS
    # Positions of context + query tokens are addressed through arange.
    assert drafter.arange.numel() >= MAX_NUM_BATCHED_TOKENS + padded + 1


@pytest.mark.parametrize("version", VERSIONS)
def test_eager_and_small_capture_sizes_unchanged(version, vllm_tree):
    # Without CUDA graphs (no capture size) or with captures below the largest
    # batch, the buffers keep the released size: one slot per query token.
    for capture in (None, 128):
        drafter = _proposer(vllm_tree(version, PATCH_ID), max_capture_size=capture)
        assert drafter.positions.numel() == MAX_NUM_SEQS * (1 + NUM_SPECULATIVE_TOKENS)
        assert drafter._slot_mapping_buffer.numel() == MAX_NUM_SEQS * (1 + NUM_SPECULATIVE_TOKENS)
