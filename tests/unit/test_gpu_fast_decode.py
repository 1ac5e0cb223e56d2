"""fast_decode (tests/gpu/models/fast_decode.py) against transformers' own greedy decoding, on the CPU.

The CUDA graph itself needs a GPU (remote.sh fast-decode-check compares it with the same step
run eagerly); what runs here is that step, eagerly: in float64, so no rounding can flip an
argmax, it must give transformers' ``generate`` tokens exactly, across the sliding window and
the full layers, and a left-padded row must decode as it does alone.
"""

from __future__ import annotations

import random
import sys
import types
from pathlib import Path

import pytest

GPU_DIR = Path(__file__).resolve().parents[1] / "gpu"
sys.path.insert(0, str(GPU_DIR))

torch = pytest.importorskip("torch", reason="the launcher venv installs CPU torch for these tests")
transformers = pytest.importorskip("transformers")

import fast_decode  # noqa: E402
import make_checkpoints as mc  # noqa: E402

WINDOW = 16
NEW = 12


def _loop_experts(self, hidden, top_k_index, top_k_weights):
    """Routed experts one token at a time: any dtype (transformers' grouped path takes no float64)."""
    out = torch.zeros_like(hidden)
    for t in range(hidden.shape[0]):
        for j in range(top_k_index.shape[1]):
            e = int(top_k_index[t, j])
            gate, up = torch.nn.functional.linear(hidden[t], self.gate_up_proj[e]).chunk(2, -1)
            out[t] += top_k_weights[t, j] * torch.nn.functional.linear(self.act_fn(gate) * up, self.down_proj[e])
    return out


@pytest.fixture(scope="module")
def model():
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    # 7 layers: sliding 0-4 and 6, full 5, as Gemma 4's 5:1 pattern puts them.
    shape = mc.TargetShape("fast-decode-test", 7, top_k_experts=2, hidden_size=64, num_attention_heads=2,
                           num_key_value_heads=1, num_global_key_value_heads=1, num_experts=4,
                           moe_intermediate_size=32, intermediate_size=64, sliding_window=WINDOW)
    cfg = mc.gemma4_config_dict(shape, vocab=512, max_positions=512)
    config = Gemma4Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    torch.manual_seed(0)
    m = Gemma4ForConditionalGeneration._from_config(config, attn_implementation="eager", dtype=torch.float64)
    with torch.no_grad():
        for p in m.parameters():  # a spread of logits that gives varied greedy text
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)  # logits that differ from token to token
    for layer in m.model.language_model.layers:
        layer.experts.forward = types.MethodType(_loop_experts, layer.experts)
    return m.eval()


def _prompts():
    rng = random.Random(1)
    # shorter than, equal to, and three times the window
    return [[2] + [rng.randrange(30, 500) for _ in range(n - 1)] for n in (5, WINDOW, 3 * WINDOW)]


def _generate(model, prompt):
    out = model.generate(input_ids=torch.tensor([prompt]), do_sample=False, max_new_tokens=NEW,
                         min_new_tokens=NEW, pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


def test_the_cached_step_gives_the_logits_of_a_full_forward(model):
    """Teacher-forced through the static cache, one token a step, past three windows: every
    step's logits equal transformers' uncached forward of the whole sequence at that position.
    (A random Gemma 4 decodes a fixed point greedily, so the tokens are forced: this is what
    checks positions, masks, the window and the cache.)"""
    rng = random.Random(2)
    seq = [2] + [rng.randrange(30, 500) for _ in range(4 * WINDOW)]
    prompt = 5
    text, head = model.model.language_model, model.lm_head
    cap = model.config.get_text_config().final_logit_softcapping
    with torch.no_grad():
        full = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0]
        ids, start = fast_decode.left_pad([seq[:prompt]], 0)
        rows = fast_decode._Rows(start, ids.shape[1])
        cache = fast_decode.StaticKV(1, len(seq), "cpu", torch.float64)
        got = [fast_decode.last_logits(text, head, ids, torch.arange(prompt), rows, cache, WINDOW, torch.float64)[0]]
        for col in range(prompt, len(seq) - 1):
            got.append(fast_decode.last_logits(text, head, torch.tensor([[seq[col]]]), torch.tensor([col]), rows,
                                               cache, WINDOW, torch.float64)[0])
    got = torch.stack(got)
    if cap:
        got = torch.tanh(got / cap) * cap
    want = full[prompt - 1:len(seq) - 1]
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-9, rtol=0), float((got - want).abs().max())
    # the logits differ from position to position: the check compares something
    assert len({int(a) for a in want.argmax(-1)}) > 3


def test_the_eager_step_decodes_what_transformers_generate_does(model):
    for prompt in _prompts():
        mine, info = fast_decode.greedy(model, [prompt], NEW, graph=False)
        assert info == {"graph": False}
        assert mine[0] == _generate(model, prompt)


def test_a_left_padded_row_decodes_as_it_does_alone(model):
    prompts = _prompts()
    batch, _ = fast_decode.greedy(model, prompts, NEW, graph=False)
    for prompt, row in zip(prompts, batch):
        alone, _ = fast_decode.greedy(model, [prompt], NEW, graph=False)
        assert row == alone[0]


def test_masks_keep_a_padded_column_finite_and_hide_it_from_real_rows():
    rows = fast_decode._Rows(start=torch.tensor([0, 3]), width=5)
    masks = fast_decode._masks(torch.arange(5), rows, 8, window=2, dtype=torch.float32)
    full, sliding = masks["full_attention"][:, 0], masks["sliding_attention"][:, 0]
    neg = torch.finfo(torch.float32).min
    # row 1's padded query columns 0-2 see themselves only (no row of nothing but masked keys)
    assert [int((full[1, q] == 0).sum()) for q in range(3)] == [1, 1, 1]
    # its real columns never see the padding
    assert bool((full[1, 3:, :3] == neg).all())
    # sliding: q - k < 2, so column 4 sees 3 and 4 only
    assert (sliding[0, 4] == 0).nonzero().flatten().tolist() == [3, 4]
    # full: causal, nothing after the query column
    assert (full[0, 2] == 0).nonzero().flatten().tolist() == [0, 1, 2]


def test_repeated_ngram_mask_marks_every_token_of_each_repeat():
    import train_target

    assert train_target.repeated_ngram_mask([1, 2, 3, 4, 5], 2) == [False] * 5
    # 1 2 1 2 1: the bigram (1, 2) repeats at 2-3, (2, 1) at 3-4
    assert train_target.repeated_ngram_mask([1, 2, 1, 2, 1], 2) == [False, False, True, True, True]
    assert train_target.repeated_ngram_mask([7] * 6, 4) == [False, True, True, True, True, True]
