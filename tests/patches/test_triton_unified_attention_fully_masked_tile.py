"""triton-unified-attention-fully-masked-tile: the released Triton unified attention
kernel, run by Triton's interpreter (TRITON_INTERPRET=1, numpy on the CPU; no GPU here),
gives NaN for sliding-window rows whose first KV tile lies wholly before their window
when every in-window score is strongly negative; with the patch those rows match a
float64 softmax reference.

The kernel, its helpers and the launcher are the tree's own files
(triton_attention_probe.py; only vLLM's platform/env/logger imports are stand-ins).
Triton comes from conftest.py's ``triton_probe`` (installed once, pinned, into the
project's cache).
"""

from __future__ import annotations

import pytest

PATCH_ID = "triton-unified-attention-fully-masked-tile"
VERSIONS = ["0.21.0", "0.26.0", "0.27.1", "0.29.0", "0.30.0", "0.31.0", "0.32.0"]

pytestmark = pytest.mark.network  # the released wheels and triton come from PyPI


@pytest.mark.parametrize("version", VERSIONS)
def test_rows_after_a_fully_masked_tile_match_the_reference(version, vllm_tree, triton_probe):
    got = triton_probe(vllm_tree(version, PATCH_ID))
    assert got["max_in_window_score"] < -104  # the case really underflows exp() in fp32
    assert got["nan_rows"] == []
    assert got["finite_rows"] == 48
    assert got["max_abs_err_finite_rows"] < 1e-3


@pytest.mark.parametrize("version", VERSIONS)
def test_the_released_kernel_gives_nan_on_the_case(version, stock_tree, triton_probe):
    """The baseline the patched run is compared with: the released kernel fails on
    exactly the rows whose first tile (keys 0-31) is outside their window (39-47)."""
    got = triton_probe(stock_tree(version))
    assert got["nan_rows"] == list(range(39, 48))
    assert got["max_abs_err_finite_rows"] < 1e-3  # the other rows are right either way


@pytest.mark.parametrize("version", VERSIONS)
def test_reduce_segments_leaves_padding_rows_and_empty_sequences_alone(version, vllm_tree, triton_probe):
    """0.33.0's two early returns: of 4 launched rows only row 0 is a query token with a
    sequence (rows 2-3 are CUDA-graph padding, row 1's sequence has length 0)."""
    got = triton_probe(vllm_tree(version, PATCH_ID), "--reduce-edges")
    assert got["error"] is None
    assert got["written_rows"] == [0] and got["row0_finite"]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_released_reduce_segments_writes_padding_rows(version, stock_tree, triton_probe):
    got = triton_probe(stock_tree(version), "--reduce-edges")
    assert got["error"] is not None or got["written_rows"] == [0, 1, 2, 3]
