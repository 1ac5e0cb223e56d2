"""Regression test for gemma4-mtp-unpadded-per-group-block-tables (0.21.0/0007, backport of PR #43982).

Runs the released ``Gemma4Proposer.build_per_group_and_layer_attn_metadata``
with 17 running requests and per-group block tables padded to a CUDA graph
size of 24 rows; the metadata builder stand-in records what it is given
(block tables are lists: no GPU). Released, the builder gets 24 rows for 17
requests ("batch_size must be equal to batch_size_k" on a GPU).
"""

from __future__ import annotations

import pytest

VERSION = "0.21.0"
PATCH_ID = "gemma4-mtp-unpadded-per-group-block-tables"

pytestmark = pytest.mark.network  # first run downloads the release from PyPI


def test_each_group_gets_block_table_rows_for_the_drafting_batch_only(vllm_tree, probe):
    seen = probe(VERSION, vllm_tree(VERSION, PATCH_ID), "gemma4_block_tables")["gemma4_block_tables"]
    assert seen["per_group"] == [{"block_table_rows": 17, "batch": 17}] * 2
    assert seen["layers"] == ["draft.0", "draft.1"]
    # The caller's metadata is left as it was.
    assert seen["caller_table_rows"] == 17
