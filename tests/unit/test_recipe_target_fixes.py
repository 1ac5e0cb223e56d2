"""A recipe requires the fixes its target needs, not only its drafter's.

The TRITON_ATTN fully-masked-tile NaN is the target's own (it reproduced on an
H100 with no drafter): every Gemma 4 recipe puts target layers on TRITON_ATTN
on sm_12x (the lock without FA4), so each must require the fix on every
release whose series carries it.
"""

from __future__ import annotations

import pytest

from launcher import recipe
from launcher.patching.series import series_for

FIX = "triton-unified-attention-fully-masked-tile"
CASES = [(name, version) for name in sorted(recipe.available()) for version in recipe.load(name).vllm_versions
         if FIX in {p.id for p in series_for(version).patches}]


def test_the_fix_is_in_some_series():
    assert CASES


@pytest.mark.parametrize(("name", "version"), CASES, ids=[f"{n}-{v}" for n, v in CASES])
def test_every_recipe_requires_the_triton_fix_where_its_series_has_it(name, version):
    assert FIX in recipe.load(name).patches.get(version, [])
