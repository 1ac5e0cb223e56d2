"""tests/gpu/runs/draft_capture.py without vLLM or a GPU: the capture's bookkeeping on a propose
call's arguments (CPU tensors in vLLM's layout), and the equivalence verdict against
dflash_reference.py's drafter on a small random geometry (on CPU)."""

from __future__ import annotations

import pytest
import torch

from tests.unit.gpu_scripts import GPU_DIR
from tests.unit.gpu_scripts import load as _load

K = 3
VOCAB = 50
CONFIG = {
    "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 8, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 4,
    "dflash_config": {"target_layer_ids": [0, 1], "mask_token_id": 3},
}


@pytest.fixture(scope="module")
def dc():
    import sys

    sys.path.insert(0, str(GPU_DIR))  # draft_capture imports compare and dflash_reference
    try:
        yield _load("draft_capture")
    finally:
        sys.path.remove(str(GPU_DIR))


def _step(dc_capture, rid_rows, rejected, sampled=None, width=32, seed=0):
    """One propose call: rid_rows = [(request id, first position, n rows)] in batch order."""
    gen = torch.Generator().manual_seed(seed)
    bounds, positions, tokens = [0], [], []
    for _, first, n in rid_rows:
        positions += list(range(first, first + n))
        tokens += [(7 * p) % VOCAB for p in range(first, first + n)]
        bounds.append(bounds[-1] + n)
    hidden = torch.randn(bounds[-1], width, generator=gen).to(torch.bfloat16)
    drafts = [[5, 6, 7] for _ in rid_rows]
    dc_capture.step([r for r, _, _ in rid_rows], bounds, positions, tokens, hidden, rejected,
                    [11 + i for i in range(len(rid_rows))], drafts, sampled or [True] * len(rid_rows))
    return hidden


def test_capture_keeps_accepted_rows_and_anchors_after_the_last_one(dc):
    cap = dc.Capture(max_len=64)
    hidden = _step(cap, [("a", 0, 10), ("b", 0, 6)], [0, 0], sampled=[True, False])  # b: partial prefill
    _step(cap, [("a", 10, 4)], [2], seed=1)  # 2 rejected drafts: positions 12, 13 are not context
    a = cap.requests["a"]
    assert a.valid[:12] == [True] * 12 and a.valid[12:14] == [False, False]
    assert torch.equal(a.features[3], hidden[3])
    assert [c["anchor"] for c in a.contexts] == [10, 12] and a.contexts[0]["bonus"] == 11
    assert cap.requests["b"].contexts == [] and cap.requests["b"].valid[:6] == [True] * 6


def _reference(dc):
    import dflash_reference as ref

    torch.manual_seed(0)
    drafter = ref.Drafter(ref.Geometry.from_config(CONFIG))
    drafter.init_weights(0.3)
    shared = ref.Shared(torch.randn(VOCAB, 16), 4.0, 30.0)
    return drafter.eval(), shared


def _capture_with_reference_drafts(dc, drafter, shared, semantics):
    cap = dc.Capture(max_len=32)
    _step(cap, [("a", 0, 12)], [0])
    _step(cap, [("a", 12, 4)], [1], seed=2)
    req = cap.requests["a"]
    logits = dc.reference_drafts(drafter, shared, req.features[:15], [c["anchor"] for c in req.contexts],
                                 [c["bonus"] for c in req.contexts], semantics, K)
    for c, lg in zip(req.contexts, logits):
        c["drafts"] = lg.argmax(-1).tolist()
    return cap, logits


def test_the_reference_drafts_on_the_captured_inputs_are_equal(dc):
    drafter, shared = _reference(dc)
    cap, _ = _capture_with_reference_drafts(dc, drafter, shared, "vllm-0.33.0")
    out = dc.compare_capture(cap, drafter, shared, "vllm-0.33.0", K)
    assert (out["contexts"], out["equal"], out["exact"], out["unequal"]) == (2, 2, 2, 0)


def test_a_draft_far_from_the_reference_top_is_unequal_and_reported(dc):
    drafter, shared = _reference(dc)
    cap, logits = _capture_with_reference_drafts(dc, drafter, shared, "vllm-0.33.0")
    worst = int(logits[1, 0].argmin())
    cap.requests["a"].contexts[1]["drafts"][0] = worst
    out = dc.compare_capture(cap, drafter, shared, "vllm-0.33.0", K)
    assert (out["equal"], out["unequal"]) == (1, 1)
    assert out["first_unequal"][0]["anchor"] == cap.requests["a"].contexts[1]["anchor"]


def test_semantics_matter_drafts_made_under_one_release_differ_under_the_other(dc):
    # Released 0.21.0 runs every drafter layer without a window; 0.33.0 keeps the sliding layer's
    # window of 4: with 12 context rows the drafts must not all agree, or the check is blind.
    drafter, shared = _reference(dc)
    _, new = _capture_with_reference_drafts(dc, drafter, shared, "vllm-0.33.0")
    _, old = _capture_with_reference_drafts(dc, drafter, shared, "vllm-0.21.0-stock")
    assert not torch.allclose(new, old)


def test_contexts_with_unfed_rows_are_left_out_and_counted(dc):
    drafter, shared = _reference(dc)
    cap = dc.Capture(max_len=32)
    _step(cap, [("a", 4, 8)], [0])  # positions 0-3 never fed (a prefix-cache hit)
    out = dc.compare_capture(cap, drafter, shared, "vllm-0.21.0", K)
    assert (out["contexts"], out["incomplete_contexts"]) == (0, 1)


def test_vllms_own_warm_up_requests_are_left_out_and_counted(dc):
    drafter, shared = _reference(dc)
    cap, _ = _capture_with_reference_drafts(dc, drafter, shared, "vllm-0.33.0")
    cap.requests["_warmup_0_"] = cap.requests["a"]
    cap.requests["_warmup_0_"].contexts = [dict(c, drafts=[0] * K) for c in cap.requests["a"].contexts]
    del cap.requests["a"]
    out = dc.compare_capture(cap, drafter, shared, "vllm-0.33.0", K)
    assert (out["contexts"], out["warmup_contexts_left_out"]) == (0, 2)


def _bf16_copy(dc, drafter):
    import dflash_reference as ref

    copy = ref.Drafter(ref.Geometry.from_config(CONFIG))
    copy.load_state_dict(drafter.state_dict())
    return copy.to(torch.bfloat16).eval()


def test_drafts_a_bf16_drafter_makes_are_within_the_noise_and_a_far_draft_is_not(dc):
    """vLLM drafting exactly as the same weights do in bf16: every context is equal or within
    the noise the bf16 reference itself shows against the fp32 one; the worst token is not."""
    drafter, shared = _reference(dc)
    drafter16 = _bf16_copy(dc, drafter)
    cap, _ = _capture_with_reference_drafts(dc, drafter16, shared, "vllm-0.33.0")
    out = dc.compare_capture(cap, drafter, shared, "vllm-0.33.0", K, drafter16)
    assert out["noise"]["vllm_unequal_beyond_noise"] == 0
    assert out["noise"]["equal_or_within_noise_fraction"] == 1.0

    logits = dc.reference_drafts(drafter, shared, cap.requests["a"].features[:15],
                                 [c["anchor"] for c in cap.requests["a"].contexts],
                                 [c["bonus"] for c in cap.requests["a"].contexts], "vllm-0.33.0", K)
    cap.requests["a"].contexts[1]["drafts"][2] = int(logits[1, 2].argmin())
    out = dc.compare_capture(cap, drafter, shared, "vllm-0.33.0", K, drafter16)
    assert out["noise"]["vllm_unequal_beyond_noise"] == 1 and out["unequal_positions"][2] >= 1
    assert out["unequal_requests"] == 1 and out["unequal_most_in_one_request"][0][0] == "a"
    assert out["noise"]["vllm_max_gap"] > out["noise"]["noise_bound"]


def test_the_noise_verdict_bounds_by_the_bf16_references_largest_gap(dc):
    ref16 = [[(3, 0.25)], [], [(1, 0.5)]]
    vllm = [[(2, 0.4)], [(0, 0.6)], []]
    v = dc.bf16_noise_verdict(vllm, ref16, 4)
    assert v["noise_bound"] == 0.5 and v["reference_bf16_contexts_differing"] == 2
    assert (v["vllm_unequal_within_noise"], v["vllm_unequal_beyond_noise"]) == (1, 1)
    assert v["equal_or_within_noise_fraction"] == round(2 / 3, 4)
    assert v["reference_bf16_positions"] == [0, 1, 0, 1]
    assert v["noise_gap_p99"] == 0.5 and v["vllm_unequal_beyond_p99"] == 1 and v["reference_bf16_differing_drafts"] == 2
    many = [[(0, 0.01 * i)] for i in range(1, 201)] + [[(0, 5.0)]]  # one outlier among 201 gaps
    v = dc.bf16_noise_verdict([[(1, 1.0)]], many, 4)
    assert v["noise_bound"] == 5.0 and v["noise_gap_p99"] == 1.99
    assert (v["vllm_unequal_beyond_noise"], v["vllm_unequal_beyond_p99"]) == (0, 0)
    v = dc.bf16_noise_verdict([[(1, 3.0)]], many, 4)
    assert (v["vllm_unequal_beyond_noise"], v["vllm_unequal_beyond_p99"]) == (0, 1)
