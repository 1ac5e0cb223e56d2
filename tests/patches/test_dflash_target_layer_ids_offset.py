"""Regression test for dflash-target-layer-ids-offset (0.21.0/0004, backport of PR #40727).

Runs the released ``GPUModelRunner._get_eagle3_aux_layers_from_config`` on a
stand-in runner holding a drafter's Hugging Face config: Gemma 4 (like every
vLLM decoder) records aux hidden state ``i + 1`` after layer ``i``, so DFlash's
``target_layer_ids`` (indices of layers) must be shifted by one, while EAGLE-3
ids, already in vLLM's indexing, must not. And runs the released
``SpeculativeConfig.compute_hash``: the shifted layers must reach the hash
that keys the target's compiled graph, or a tree with this patch and one
without share one graph in the compile cache.
"""

from __future__ import annotations

import pytest

VERSION = "0.21.0"
PATCH_ID = "dflash-target-layer-ids-offset"

pytestmark = pytest.mark.network  # first run downloads the release from PyPI


@pytest.fixture(scope="module")
def seen(probe_section):
    return probe_section(VERSION, "aux_layers", PATCH_ID)


def test_dflash_target_layer_ids_are_shifted_to_aux_state_indices(seen):
    # The z-lab drafter config's target_layer_ids for a 30-layer target.
    assert seen["dflash_config"] == [2, 8, 14, 20, 26]


def test_eagle_ids_and_missing_ids_unchanged(seen, probe_section):
    stock = probe_section(VERSION, "aux_layers", None)
    assert seen["eagle_ids"] == stock["eagle_ids"] == [2, 15, 27]
    # Speculators-format DFlash configs write both; the EAGLE ids win, as before.
    assert seen["both"] == stock["both"] == [2, 8]
    assert seen["none"] is None and stock["none"] is None


def test_the_shifted_layers_compile_under_their_own_key(probe_section):
    patched = probe_section(VERSION, "spec_hash", PATCH_ID)
    released = probe_section(VERSION, "spec_hash", None)
    # One drafter, one target: the released runner's graph and this one's differ.
    assert patched["dflash_a"] != released["dflash_a"]
    # Drafters naming other layers get other graphs from the shift alone.
    assert patched["dflash_a"] != patched["dflash_b"]


def test_eagle3_and_methods_without_aux_states_hash_unchanged(probe_section):
    patched = probe_section(VERSION, "spec_hash", PATCH_ID)
    released = probe_section(VERSION, "spec_hash", None)
    for case in ("eagle3", "mtp", "ngram"):
        assert patched[case] == released[case], case
