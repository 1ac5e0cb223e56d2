"""vLLM PR #50169 (acceptance collapses when drafter layers share a KV cache group with
target layers), checked on each release the recipes run a sliding-window drafter on.

``drafter_kv_groups_probe.py`` runs each release's real KV cache grouping (its
docstring lists the stand-ins). Groups hold layers of one KV spec, so a drafter
layer joins target layers only when its spec equals theirs: same head size, KV
heads, dtype and sliding window. The public 26B-A4B drafter's sliding window is
2048 and Gemma 4's 1024, so with its own geometry each drafter layer gets a group
of its own on every release here (as the 0.33.0 GPU run showed); only a drafter
built with a target layer's exact spec would share. 0.21.0 is left out: its
drafter has no sliding layers (FACTS.md), 0.33.0 because its grouping moved to
``kv_cache_planning.py`` (covered by the GPU record instead).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.patch_trees import pristine, run_probe

PROBE = Path(__file__).with_name("drafter_kv_groups_probe.py")
VERSIONS = ["0.26.0", "0.27.1", "0.29.0", "0.30.0", "0.31.0", "0.32.0"]

pytestmark = pytest.mark.network  # first run downloads the releases from PyPI


@pytest.fixture(scope="module", params=VERSIONS)
def groups(request) -> dict:
    return run_probe(PROBE, pristine(request.param, "site-packages"))


def test_released_drafter_with_its_own_geometry_shares_no_group_with_the_target(groups):
    seen = groups["drafter_own_geometry"]
    assert seen["groups_mixing_drafter_and_target"] == 0
    assert seen["drafter_group_sizes"] == [1, 1, 1, 1, 1]


def test_released_drafter_with_target_specs_would_share_its_groups(groups):
    # The condition #50169 needs: only reachable with a drafter layer spec equal to a target's.
    seen = groups["drafter_with_target_specs"]
    assert seen["groups_mixing_drafter_and_target"] == 5
