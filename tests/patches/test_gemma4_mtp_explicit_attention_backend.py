"""Regression test for gemma4-mtp-explicit-attention-backend (0.21.0/0006, 0.33.0/0002).

Runs the released ``_create_draft_vllm_config`` of ``Gemma4Proposer`` (V1
runner, over the real ``SpecDecodeBaseProposer`` one) and, on 0.33.0, of
``Gemma4Speculator`` (V2 runner), with the patch's module-level
``gemma4_mtp_attention_backend`` where the tree has it. Configs are plain
dataclasses with the fields these methods read; backends are members of an
enum named like vLLM's ``AttentionBackendEnum`` (the real one lives in a
module that needs torch).

The MTP draft layers read the target's KV cache, so a backend other than the
target's cannot work; released vLLM drops such a choice silently, patched it
is refused with a message that says what to set.
"""

from __future__ import annotations

import pytest

PATCH_ID = "gemma4-mtp-explicit-attention-backend"
RUNNERS = [("0.21.0", "gemma4_mtp_backends"), ("0.33.0", "v1_gemma4_mtp"), ("0.33.0", "v2_gemma4_mtp")]

pytestmark = pytest.mark.network  # first run downloads the release from PyPI


def _outcomes(rows) -> dict:
    return {(s, t): {k: v for k, v in r.items() if k != "model_config_is_draft"} for s, t, r in rows}


@pytest.fixture(scope="module", params=RUNNERS, ids=[f"{v}-{r}" for v, r in RUNNERS])
def outcomes(request, vllm_tree, stock_tree, probe):
    version, runner = request.param
    sections = ("gemma4_mtp_backends",) if version == "0.21.0" else ()
    return (
        _outcomes(probe(version, vllm_tree(version, PATCH_ID), *sections)[runner]),
        _outcomes(probe(version, stock_tree(version), *sections)[runner]),
        runner,
    )


@pytest.mark.parametrize("explicit", ["FLASH_ATTN", "FLEX_ATTENTION"])
def test_backend_that_cannot_read_the_target_cache_is_refused(outcomes, explicit):
    seen, _, _ = outcomes
    error = seen[(explicit, "TRITON_ATTN")]["error"]
    assert f"speculative_config.attention_backend={explicit} cannot be used for a Gemma4 MTP drafter" in error
    assert "read the target model's KV cache, which the TRITON_ATTN backend lays out" in error
    assert "Leave attention_backend unset" in error and "set it to TRITON_ATTN" in error


def test_target_backend_or_no_choice_unchanged(outcomes):
    seen, stock, runner = outcomes
    cases = [("TRITON_ATTN", "TRITON_ATTN"), (None, "TRITON_ATTN"), (None, None)]
    if runner != "v2_gemma4_mtp":
        # V1: without a target backend the base proposer already applied the explicit one.
        cases.append(("FLASH_ATTN", None))
    for case in cases:
        assert seen[case] == stock[case], case
    assert seen[(None, "TRITON_ATTN")] == {"backend": "TRITON_ATTN"}


@pytest.fixture(scope="module")
def v2(vllm_tree, probe):
    return _outcomes(probe("0.33.0", vllm_tree("0.33.0", PATCH_ID))["v2_gemma4_mtp"])


def test_v2_explicit_backend_used_when_the_target_has_none(v2):
    # Released V2 drops it there too; V1's base proposer applies it. Now one rule.
    assert v2[("FLASH_ATTN", None)] == {"backend": "FLASH_ATTN"}
