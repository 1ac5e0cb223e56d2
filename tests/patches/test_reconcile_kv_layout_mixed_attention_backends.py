"""Regression test for reconcile-kv-layout-mixed-attention-backends (0.21.0/0003).

Runs the released ``GPUModelRunner._allocate_kv_cache_tensors`` and
``_reshape_kv_cache_tensors`` (and, patched, the detector and the layout
updater they call) on the KV cache config the released ``get_kv_cache_groups``
/ ``get_kv_cache_config_from_groups`` make for a Gemma 4 26B-A4B-shaped target
(25 sliding + 5 full layers, TRITON_ATTN) and a 5-layer DFlash drafter, with
the real ``get_kv_cache_shape`` / ``get_kv_cache_stride_order`` of
TRITON_ATTN, FLASH_ATTN and FLEX_ATTENTION, on real CPU torch tensors (CPU
memory stands in for the GPU's; every shape, stride and view is vLLM's and
torch's). Each layer's blocks are mapped to the storage elements its view
reaches (tests/integration/series_0_21_0_probe.py ``kv_bytes``).
"""

from __future__ import annotations

import pytest

VERSION = "0.21.0"
PATCH_ID = "reconcile-kv-layout-mixed-attention-backends"
SECTIONS = ("kv_bytes", "kv_layout_guards")

pytestmark = pytest.mark.network  # first run downloads the release from PyPI


@pytest.fixture(scope="module")
def seen(vllm_tree, probe):
    return probe(VERSION, vllm_tree(VERSION, PATCH_ID), *SECTIONS)


@pytest.fixture(scope="module")
def stock(stock_tree, probe):
    return probe(VERSION, stock_tree(VERSION), *SECTIONS)


@pytest.mark.parametrize("drafter_backend", ["flash_drafter_shared", "flex_drafter_shared"])
def test_drafter_blocks_never_reach_bytes_of_other_target_blocks(seen, drafter_backend):
    kv = seen["kv_bytes"][drafter_backend]
    # The 5-layer drafter lands in one KV cache group whose layers share the
    # target's tensors (no 0002 needed for this shape).
    assert kv["shared_tensors"] == 5
    assert kv["draft_block_dim"] == 1
    assert kv["aliased_pairs"] == 0, kv["example"]
    # Its (2, num_blocks, ...) view now walks blocks first in memory.
    k_v_stride, block_stride = kv["draft_stride"][:2]
    assert block_stride == 2 * k_v_stride


def test_a_flex_drafter_cannot_read_its_restrided_shared_cache(seen):
    # Why the plan refuses drafter.attention_backend=flex_attention on 0.21.0
    # (launcher/plan.py _flex_drafter_refusal): FLEX reads its cache as
    # (2, num_blocks, ...) and views the key half flat, which the blocks-first
    # layout this patch gives a shared tensor cannot give.
    assert "view size is not compatible" in seen["kv_bytes"]["flex_drafter_shared"]["draft_flex_read"]


def test_target_layout_unchanged(seen, stock):
    for case in ("flash_drafter_shared", "flex_drafter_shared"):
        kv = seen["kv_bytes"][case]
        assert kv["target_stride"] == kv["target_contiguous_stride"] == stock["kv_bytes"][case]["target_stride"]


def test_layers_that_agree_or_share_nothing_unchanged(seen, stock):
    for case in ("triton_drafter_shared", "flash_drafter_own_tensors"):
        kv = seen["kv_bytes"][case]
        assert kv["aliased_pairs"] == 0
        assert kv["draft_stride"] == kv["draft_contiguous_stride"] == stock["kv_bytes"][case]["draft_stride"]


def test_layout_updater_skips_layers_without_kv_cache(seen):
    guards = seen["kv_layout_guards"]
    # A trailing group of encoder-only (runner-only) layers has no kernel block
    # size and no tensor: the updater and the detector both pass it by.
    assert guards["updater"] == "ok"
    assert guards["detector"] is False
    k_v_stride, block_stride = guards["decoder_restrided"][:2]
    assert block_stride == 2 * k_v_stride


def test_per_layer_target_sliding_blocks_never_reach_bytes_of_full_layer_blocks(seen):
    """gemma4-text-only-per-layer-attention-backend's own mix, without a drafter:
    the 256-dim sliding layers on FLASH_ATTN share each raw tensor with a 512-dim
    full layer on TRITON_ATTN (one layer of every group per tensor)."""
    kv = seen["kv_bytes"]["per_layer_target_shared"]
    assert kv["groups"] == 6 and kv["shared_tensors"] == 5
    assert kv["draft_block_dim"] == 1  # "draft" here: the first sliding layer, FLASH_ATTN
    assert kv["aliased_pairs"] == 0, kv["example"]
    k_v_stride, block_stride = kv["draft_stride"][:2]
    assert block_stride == 2 * k_v_stride


def test_released_per_layer_target_mix_aliases_blocks_across_groups(stock):
    # The released runner lays the FLASH_ATTN sliding layers out (2, num_blocks, ...)
    # over bytes the TRITON_ATTN full layers read as (num_blocks, 2, ...).
    assert stock["kv_bytes"]["per_layer_target_shared"]["aliased_pairs"] > 0
