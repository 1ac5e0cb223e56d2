"""triton-reshape-and-cache-native-kv-dtype: the released 0.21.0
``triton_reshape_and_cache_flash`` (TRITON_ATTN's KV cache write), run by Triton's
interpreter on the CPU (triton_attention_probe.py ``--reshape``; only vLLM's platform,
logger and quant-constant imports are stand-ins), refuses ``--kv-cache-dtype bfloat16``,
which the recipes pass; with the patch it stores the keys and values at their slots, as
it does for ``auto``.
"""

from __future__ import annotations

import pytest

PATCH_ID = "triton-reshape-and-cache-native-kv-dtype"
VERSION = "0.21.0"  # 0.26.0 on have PR #43330 (patches/vllm/README.md)

pytestmark = pytest.mark.network  # the released wheel and triton come from PyPI


@pytest.mark.parametrize("kv_cache_dtype", ["bfloat16", "float16", "float32"])
def test_an_explicit_unquantized_cache_dtype_is_stored_like_auto(kv_cache_dtype, vllm_tree, triton_probe):
    got = triton_probe(vllm_tree(VERSION, PATCH_ID), "--reshape", kv_cache_dtype)
    assert got == {"error": None, "keys_stored": True, "values_stored": True, "other_slots_untouched": True}


def test_auto_is_stored_unchanged(vllm_tree, triton_probe):
    got = triton_probe(vllm_tree(VERSION, PATCH_ID), "--reshape", "auto")
    assert got == {"error": None, "keys_stored": True, "values_stored": True, "other_slots_untouched": True}


def test_an_unknown_cache_dtype_is_still_refused_as_before(vllm_tree, triton_probe):
    got = triton_probe(vllm_tree(VERSION, PATCH_ID), "--reshape", "int8")
    assert got["error"] == "unsupported kv_cache_dtype (str), got int8."


def test_the_released_write_refuses_bfloat16(stock_tree, triton_probe):
    """The baseline: the error the first served run on a GPU met (tests/gpu/results/served)."""
    got = triton_probe(stock_tree(VERSION), "--reshape", "bfloat16")
    assert got["error"] == "unsupported kv_cache_dtype (str), got bfloat16."
