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
def keys(probe_section):
    """The speculative config hashes, per case, on the patched tree and on the released one."""
    return {tree: probe_section(VERSION, "spec_hash", patch) for tree, patch in (("patched", PATCH_ID), ("released", None))}


def test_two_dflash_drafters_of_one_target_compile_under_two_keys(keys):
    assert keys["patched"]["dflash_a"] != keys["patched"]["dflash_b"]


def test_a_patched_tree_never_loads_a_graph_the_released_runner_compiled(keys):
    # The same drafter and target: the released key must not find the patched runner's graph.
    for case in ("dflash_a", "eagle3"):
        assert keys["patched"][case] != keys["released"][case], case


def test_methods_without_aux_hidden_states_hash_unchanged(keys):
    for case in ("mtp", "ngram"):
        assert keys["patched"][case] == keys["released"][case], case
    assert keys["patched"]["mtp"] != keys["patched"]["dflash_a"]
