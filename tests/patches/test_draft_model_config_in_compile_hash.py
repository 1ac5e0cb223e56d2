"""Regression test for draft-model-config-in-compile-hash (0.21.0/0017, backport of PR #47911).

Runs the released ``SpeculativeConfig.compute_hash`` (and the real ``safe_hash``) on stand-in
configs whose draft ``ModelConfig.compute_hash()`` names the checkpoint. That hash is half of the
key vLLM's compile cache gives the target's graph, the graph that returns the aux hidden states a
drafter reads. Two DFlash drafters of one target must get two keys. That alone does not tell
apart two trees that differ in `dflash-target-layer-ids-offset` (same drafter, same config), which
changes which layers the target returns without changing any traced file: that patch hashes its
shifted layers, and the last test here checks the two together.
"""

from __future__ import annotations

import pytest

from tests.integration.patch_trees import patches_tree, pristine
from tests.patches.conftest import READS, on_stock, patch_named

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


def test_with_this_patch_trees_that_differ_only_in_the_layer_offset_get_two_keys(tmp_path, probe):
    # The incident this patch's header cites: a tree with the whole series and the same tree
    # less dflash-target-layer-ids-offset must not share the target's compiled graph.
    this = patch_named(VERSION, PATCH_ID)
    offset = patch_named(VERSION, "dflash-target-layer-ids-offset")
    if on_stock():  # the released tree for both, as every test here runs on it
        without = with_offset = pristine(VERSION, "site-packages")
    else:
        without = patches_tree(VERSION, [this], tmp_path / "without", extra=READS)
        with_offset = patches_tree(VERSION, [offset, this], tmp_path / "with", extra=READS)
    assert probe(VERSION, without, "spec_hash")["spec_hash"]["dflash_a"] != probe(
        VERSION, with_offset, "spec_hash")["spec_hash"]["dflash_a"]
