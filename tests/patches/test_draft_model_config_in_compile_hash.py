"""Regression test for draft-model-config-in-compile-hash (0.21.0/0017, backport of PR #47911).

Runs the released ``SpeculativeConfig.compute_hash`` (and the real ``safe_hash``) on stand-in
configs whose draft ``ModelConfig.compute_hash()`` names the checkpoint. That hash is half of the
key vLLM's compile cache gives the target's graph, the graph that returns the aux hidden states a
drafter reads. Two DFlash drafters of one target must get two keys, and a tree patched with this
series must not share a key with the released one: `dflash-target-layer-ids-offset` changes which
layers the target returns without changing any traced file, and on 2026-11-28 a GPU run loaded a
graph that another tree had compiled (tests/gpu/README.md, "One compile cache per vLLM tree").
"""

from __future__ import annotations

import pytest

VERSION = "0.21.0"
PATCH_ID = "draft-model-config-in-compile-hash"

pytestmark = pytest.mark.network  # first run downloads the release from PyPI


@pytest.fixture(scope="module")
def seen(vllm_tree, probe):
    return probe(VERSION, vllm_tree(VERSION, PATCH_ID), "spec_hash")["spec_hash"]


@pytest.fixture(scope="module")
def released(stock_tree, probe):
    return probe(VERSION, stock_tree(VERSION), "spec_hash")["spec_hash"]


def test_two_dflash_drafters_of_one_target_compile_under_two_keys(seen):
    assert seen["dflash_a"] != seen["dflash_b"]


def test_a_patched_tree_never_loads_a_graph_the_released_runner_compiled(seen, released):
    # The same drafter and target: the released key must not find the patched runner's graph.
    assert seen["dflash_a"] != released["dflash_a"]
    assert seen["eagle3"] != released["eagle3"]


def test_methods_without_aux_hidden_states_hash_unchanged(seen, released):
    assert seen["mtp"] == released["mtp"] and seen["ngram"] == released["ngram"]
    assert seen["mtp"] != seen["dflash_a"]
