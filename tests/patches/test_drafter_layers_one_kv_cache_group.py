"""Regression test for drafter-layers-one-kv-cache-group (0.21.0/0002).

Runs the released ``vllm/v1/kv_cache_interface.py`` specs and every function
of ``vllm/v1/core/kv_cache_utils.py`` (``get_kv_cache_groups``,
``get_kv_cache_config_from_groups``) on Gemma 4 layer mixes with the KV
geometry of the released checkpoints: the GPU proof's 6-layer target (5
sliding + 1 full), gemma-4-26B-A4B (25 + 5; 8 and 2 KV heads) and
gemma-4-31B (50 + 10; 16 and 4 KV heads), with a Qwen3-style DFlash drafter
of 2, 5, 6 or 11 full-attention layers (8 KV heads of 128; only the drafter's
own bucket depends on that). Stand-ins (probe): torch dtypes and the logger.
"""

from __future__ import annotations

import pytest

VERSION = "0.21.0"
PATCH_ID = "drafter-layers-one-kv-cache-group"

pytestmark = pytest.mark.network  # first run downloads the release from PyPI


@pytest.fixture(scope="module")
def seen(probe_section):
    return probe_section(VERSION, "kv_grouping_real", PATCH_ID)


@pytest.fixture(scope="module")
def stock(probe_section):
    return probe_section(VERSION, "kv_grouping_real", None)


# Drafters with more layers than the target's KV cache groups, which the
# released grouping cuts across groups ("All drafting layers should belong to
# the same kv cache group").
SPLIT = ["toy/2", "toy/5", "toy/6", "toy/11", "gemma-4-26B-A4B/6", "gemma-4-26B-A4B/11", "gemma-4-31B/11"]
# Drafters that already fit one group, and targets alone.
FITS = ["gemma-4-26B-A4B/2", "gemma-4-26B-A4B/5", "gemma-4-31B/2", "gemma-4-31B/5", "gemma-4-31B/6"]
ALONE = ["toy/0", "gemma-4-26B-A4B/0", "gemma-4-31B/0"]


@pytest.mark.parametrize("case", SPLIT)
def test_drafter_layers_share_one_group(seen, case):
    facts = seen[case]
    assert len(facts["draft_group_ids"]) == 1
    assert facts["draft_groups_hold_only_draft_layers"]


@pytest.mark.parametrize("case", SPLIT)
def test_target_groups_as_before(seen, stock, case):
    # The target's layers are grouped exactly as they are without a drafter.
    target, n_draft = case.split("/")
    draft_group = seen[case]["draft_group_ids"][0]
    target_groups = [g for i, g in enumerate(seen[case]["groups"]) if i != draft_group]
    assert target_groups == stock[f"{target}/0"]["groups"]


def test_memory_cost_is_the_drafter_only_share_of_the_pool(seen, stock):
    # 26B-A4B, 6 drafter layers: 6 tensors, the target's groups of 5 use the
    # first 5, the 6th holds drafter K/V only (1/6 of the pool).
    facts = seen["gemma-4-26B-A4B/6"]
    assert len(facts["tensors"]) == 6
    target_only = [t for t in facts["tensors"] if all(n.startswith("model.") for n in t)]
    assert len(target_only) == 1 and len(target_only[0]) == 1
    alone = stock["gemma-4-26B-A4B/0"]
    assert len(alone["tensors"]) == 5
    # Same 1 GiB budget, 6 tensors instead of 5: each group gets 5/6 of the blocks.
    assert facts["num_blocks"] == alone["num_blocks"] * 5 // 6


@pytest.mark.parametrize("case", FITS + ALONE)
def test_groups_that_already_fit_unchanged(seen, stock, case):
    assert seen[case] == stock[case]
    if not case.endswith("/0"):
        assert len(seen[case]["draft_group_ids"]) == 1
