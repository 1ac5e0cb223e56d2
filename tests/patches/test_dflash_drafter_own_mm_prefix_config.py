"""Regression test for dflash-drafter-own-mm-prefix-config (0.21.0/0001, 0.33.0/0001).

Runs the released ``_create_draft_vllm_config`` of ``DFlashProposer`` over the
real ``SpecDecodeBaseProposer`` one (V1 runner) and, on 0.33.0, the real
``load_dflash_model`` (V2 runner), for a multimodal Gemma 4 target forced to
TRITON_ATTN with ``speculative_config.attention_backend=FLASH_ATTN``.
``ModelConfig`` is a pydantic dataclass made as vLLM's ``@config`` makes it,
carrying the tree's real ``is_mm_prefix_lm`` (a property in 0.21.0, a
``cached_property`` in 0.33.0) and, patched, ``without_mm_prefix_lm``, over
the real ``ModelArchitectureConfig``; see the probes in tests/integration.

The drafter's attention layers read ``is_mm_prefix_lm`` from the config they
are built with: True makes FLASH_ATTN without FA4 refuse them ("partial
multimodal token full attention not supported"). The target's config, read
by the runner and the target's own layers, must keep its flag.
"""

from __future__ import annotations

import pytest

PATCH_ID = "dflash-drafter-own-mm-prefix-config"
CASES = [("0.21.0", "multimodal_target"), ("0.33.0", "v1_dflash"), ("0.33.0", "v2_dflash")]

pytestmark = pytest.mark.network  # first run downloads the release from PyPI


def _facts(probed: dict, version: str, case: str) -> dict:
    facts = probed["dflash_drafter_config"][case] if version == "0.21.0" else probed[case]
    # 0.21.0's probe names it draft_model_config_is_target, 0.33.0's draft_is_target_object.
    facts = dict(facts)
    facts.setdefault("draft_is_target_object", facts.get("draft_model_config_is_target"))
    return facts


@pytest.fixture(scope="module", params=CASES, ids=[f"{v}-{c}" for v, c in CASES])
def drafter(request, vllm_tree, stock_tree, probe):
    version, case = request.param
    sections = ("dflash_drafter_config",) if version == "0.21.0" else ()
    return (
        _facts(probe(version, vllm_tree(version, PATCH_ID), *sections), version, case),
        _facts(probe(version, stock_tree(version), *sections), version, case),
    )


def test_drafter_config_has_mm_prefix_off(drafter):
    seen, _ = drafter
    assert seen["draft_is_mm_prefix_lm"] is False
    assert seen["draft_is_target_object"] is False


def test_target_mm_prefix_flag_and_config_unchanged(drafter):
    seen, _ = drafter
    assert seen["target_is_mm_prefix_lm"] is True
    assert seen["target_arch_object_kept"] is True
    # 0.33.0's released V1 path cleared the flag in place on the target's shared
    # arch config (dead: the cached flag had already been read) - not any more.
    assert seen.get("target_arch_is_mm_prefix_lm", True) is True


def test_drafter_backend_and_causality_unchanged(drafter):
    seen, stock = drafter
    for key in ("draft_backend", "draft_use_non_causal"):
        assert seen[key] == stock[key], key


def test_text_only_target_is_not_copied_as_before(vllm_tree, probe):
    seen = probe("0.21.0", vllm_tree("0.21.0", PATCH_ID), "dflash_drafter_config")["dflash_drafter_config"][
        "text_only_target"
    ]
    assert seen["draft_model_config_is_target"] is True and seen["draft_is_mm_prefix_lm"] is False


def test_0_33_0_copy_helper_copies_only_when_needed(vllm_tree, probe):
    seen = probe("0.33.0", vllm_tree("0.33.0", PATCH_ID))
    assert seen["model_config_methods"] == ["is_mm_prefix_lm", "without_mm_prefix_lm"]
    assert seen["without_mm_prefix_lm"]["draft_is_mm_prefix_lm"] is False
    assert seen["without_mm_prefix_lm"]["target_arch_is_mm_prefix_lm"] is True
    assert seen["without_mm_prefix_lm_on_text_only_is_self"] is True
