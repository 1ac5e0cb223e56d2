"""A profile's serve settings per vLLM release (``serve_since``): the newest entry at or below the
release that runs replaces the profile's own values, a ``--set`` still wins, and an entry for a
release the recipe does not cover is refused with the file, line and field."""

from __future__ import annotations

import re

import pytest

from launcher import recipe as recipes
from launcher.checks import resolve
from launcher.errors import LauncherError
from launcher.plan import Request
from tests.unit.conftest import RTX5090, make_ctx

TEXT = """name: x
description: d
target: {name: m}
vllm_versions: ["0.21.0", "0.26.0", "0.33.0"]
min_gpu_memory_gib: 8
profiles:
  rtx5090:
    serve: {max_model_len: 49152, max_num_seqs: 16}
    serve_since:
      "0.26.0": {max_model_len: 40960}
      "0.33.0": {max_model_len: 28672}
"""


def _max_model_len(plan) -> str:
    return plan.argv[plan.argv.index("--max-model-len") + 1]


@pytest.mark.parametrize("version, expected", [("0.21.0", None), ("0.26.0", ("0.26.0", {"max_model_len": 40960})),
                                               ("0.29.0", ("0.26.0", {"max_model_len": 40960})),
                                               ("0.33.0", ("0.33.0", {"max_model_len": 28672})),
                                               ("0.33.0+cu132", ("0.33.0", {"max_model_len": 28672}))])
def test_the_newest_entry_at_or_below_the_release_applies(version, expected):
    assert recipes.parse_recipe(TEXT, "x.yaml").serve_since("rtx5090", version) == expected


def test_an_entry_for_an_uncovered_release_names_file_line_and_field():
    with pytest.raises(LauncherError) as err:
        recipes.parse_recipe(TEXT.replace('"0.26.0": {max', '"0.27.1": {max'), "bad.yaml")
    assert re.search(r"^bad\.yaml:\d+:", err.value.message)
    assert "profiles.rtx5090.serve_since lists versions ['0.27.1']" in err.value.message


def test_the_shipped_profile_follows_the_release_and_a_set_still_wins(models):
    # gemma4-moe-dflash's rtx5090 profile: 49,152 tokens on 0.21.0, less on 0.33.0 (its KV cache
    # holds fewer tokens in the card's memory), and the plan says where the value came from.
    old = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0"), make_ctx(RTX5090))
    new = resolve(Request("gemma4-moe-dflash", vllm_version="0.33.0"), make_ctx(RTX5090))
    shipped = recipes.load("gemma4-moe-dflash")
    assert _max_model_len(old) == str(shipped.profiles["rtx5090"].serve.max_model_len)
    since = shipped.serve_since("rtx5090", "0.33.0")
    assert since and _max_model_len(new) == str(since[1]["max_model_len"]) != _max_model_len(old)
    assert "from vLLM 0.33.0 on (serve_since)" in new.profile_source
    assert "serve_since" not in old.profile_source
    mine = resolve(Request("gemma4-moe-dflash", vllm_version="0.33.0", sets=["serve.max_model_len=16384"]),
                   make_ctx(RTX5090))
    assert _max_model_len(mine) == "16384" and "serve_since" not in mine.profile_source
