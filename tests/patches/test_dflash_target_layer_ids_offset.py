"""Regression test for dflash-target-layer-ids-offset (0.21.0/0004, backport of PR #40727).

Runs the released ``GPUModelRunner._get_eagle3_aux_layers_from_config`` on a
stand-in runner holding a drafter's Hugging Face config: Gemma 4 (like every
vLLM decoder) records aux hidden state ``i + 1`` after layer ``i``, so DFlash's
``target_layer_ids`` (indices of layers) must be shifted by one, while EAGLE-3
ids, already in vLLM's indexing, must not.
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
