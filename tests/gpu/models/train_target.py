"""Train the GPU proof's target: Gemma 4 26B-A4B's layer mix, small, on real text (issue 23).

Why: a random deep target is either chaotic in bf16 or, scaled down until bf16
and fp32 agree, a fixed point that copies its last prompt token forever (every
reference of the earlier real-shape proof did). A lossless verdict on such a
target cannot fail. A trained language model gives diverse, confident greedy
output, so a wrong token from a broken verify, rollback or KV layout shows.

What it does, in one command on the GPU host (``remote.sh train-target``):

1. corpus: the .py sources of the PyPI wheels ``corpus.json`` pins by sha256
   (``lm_files.collect_wheel_corpus``; ``--stdlib`` trains on a standard library
   instead, as targets before them did), split into train and held-out files by
   a hash of the path;
2. tokenizer: byte-level BPE (``tokenizers``) with Gemma 4's special tokens at
   fixed small ids, plus the chat template and the Gemma 4 processor files
   (``lm_files.write_lm_files``);
3. model: ``Gemma4ForConditionalGeneration``, 30 layers (25 sliding, head_dim
   256, window 1024 -> 128; 5 full, head_dim 512, K=V), 4 query / 2 KV / 1
   global KV heads (see TARGET), MoE top-8 of 32 experts, a small vision tower;
4. training: next-token cross entropy plus a token-level unlikelihood term
   (TrainConfig.unlikelihood: greedy output of plain maximum likelihood looped)
   on random windows of the train split, AdamW, fp32 master weights with bf16 autocast, fixed seed, fixed step count,
   deterministic kernels (eager attention; the experts' grouped GEMM below);
   then sequence-level unlikelihood steps on the model's own greedy continuations
   (TrainConfig.seq_steps), decoded by ``fast_decode``;
5. evaluation: held-out perplexity against the corpus's unigram perplexity
   (the bar: at most a third), and bf16 vs fp32 greedy agreement on held-out
   text (how often the trained model's argmax moves under bf16 rounding);
6. output: the bf16 checkpoint with tokenizer and processor files, a random
   DFlash drafter of the public drafter's shape for it, the held-out prompts
   the proof runs (``prompts.json``), calibration text for ``launcher
   quantize`` and ``train-record.json`` (loss curve, perplexities,
   ``target_sha256``).

Needs transformers 5.13.1 (vLLM 0.21.0 reads ``global_head_dim`` from the
text config, which 5.15+ moves) and a CUDA GPU; about nine and a half minutes on an H100
(1000 steps: 498 s of training, the rest evaluation and the greedy probe).
``python tests/gpu/models/train_target.py OUT_DIR [--steps N]``
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
import bars  # noqa: E402
import lm_files  # noqa: E402
import make_checkpoints as mc  # noqa: E402

# 26B-A4B's mix at width 256 (released: hidden 2816, 16 query / 8 KV / 2 global
# KV heads, 128 experts of 704, dense 2112, vocabulary 262144, window 1024).
# Heads 4 / 2 / 1 (sliding and full layers still differ in KV heads, as
# released), experts 128 -> 32, top-8 as released. Why so few heads: on the
# H100 the step is memory-bound on the per-head tensors (fp32 q/k/v norms,
# rotary, softmax: most of the CUDA time went to elementwise kernels at 8 / 4 / 1), and
# what decides the greedy output is tokens seen in the five-minute budget:
# 16 / 8 / 2 heads reached held-out perplexity 253 with 7 of 36 reference
# sequences constant; 8 / 4 / 1 reached 224 (73 with the q/k gain init) and
# still looped (median distinct fraction 0.137).
TARGET = mc.TargetShape(
    "trained-a4b-r30", 30, top_k_experts=8, hidden_size=256, num_attention_heads=4,
    num_key_value_heads=2, num_global_key_value_heads=1, num_experts=32,
    moe_intermediate_size=128, intermediate_size=256, sliding_window=128)
# The public drafter's shape (make_checkpoints.REALSHAPE_DRAFTER) at this width;
# window 2048 scaled by the target's 1/8. Random weights: it proposes, the
# target verifies (acceptance needs a trained drafter, a later issue).
DRAFTER = mc.DrafterShape(
    "dflash-r5-for-trained", TARGET.name, 5, [1, 6, 11, 17, 22, 27], hidden_size=256,
    num_attention_heads=8, num_key_value_heads=2, head_dim=128,
    layer_types=["sliding_attention"] * 4 + ["full_attention"], sliding_window=256)
MAX_POSITIONS = 4096
DEFAULT_CORPUS_DIR = Path(os.environ.get("CORPUS_WHEELS", "/tmp/corpus-wheels"))
# Held-out perplexity must be at most this share of the unigram perplexity.
PPL_BAR = 1 / 3


@dataclass(frozen=True)
class TrainConfig:
    """One fixed recipe: the same numbers give the same checkpoint on the same GPU kind."""

    seed: int = 20261126
    # 1000: held-out perplexity 31 without the unlikelihood term (680 steps:
    # 50.5); 508 s of training on an H100 with it, over the five minutes, which
    # pack-trained makes a one-time cost.
    steps: int = 1000
    seq_len: int = 1024
    micro_batch: int = 16
    accumulation: int = 1  # 16 windows of 1024 tokens per optimizer step
    lr: float = 3e-3
    warmup: int = 30
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    eval_windows: int = 64
    # Token-level unlikelihood (Welleck et al. 2019, "Neural text generation with
    # unlikelihood training"): weight of -log(1 - p(c)) summed over the tokens c already in
    # the window (the target excluded), added to the cross entropy. 0 is plain maximum
    # likelihood. Why: at 680 and 1000 steps the greedy output looped (median distinct
    # fraction 0.195 and 0.191 where the held-out text's own continuations have 0.57) while held-out
    # perplexity fell from 50 to 31; more steps do not stop the loops, and the gate needs
    # output that says something. With 1.0 (9ee9770c): 0.273 (0.25 over the
    # concurrency groups) at held-out perplexity 34.4; every record since names that target.
    unlikelihood: float = 1.0
    # Sequence-level unlikelihood (Welleck et al. 2019, section 5.2) after the token-level
    # steps: each step decodes ``seq_new`` greedy tokens after ``seq_batch`` train-split
    # prefixes of ``seq_prefix`` tokens and adds -log(1 - p(x_t)) at every token of an
    # ``seq_ngram``-gram the continuation already holds, beside the token-level loss on
    # ``seq_mle_windows`` fresh windows. Why: 9ee9770c (token-level only) still looped in 9 to
    # 14 of its 36 vLLM references, and the gate allows 10 %; the token-level term only sees
    # the corpus's text, never the model's own greedy output, which is where loops live.
    # 150 x 32: on the pinned corpus, 100 x 24 took the validation prompts from 17
    # to 10 to 5 looping of 32 at steps 0, 25 and 50 in the steps that ran (13.8 s a step
    # with transformers' generate; fast_decode's graph makes it about 2 s).
    seq_steps: int = 150
    seq_prefix: int = 128
    seq_new: int = 96
    seq_batch: int = 32
    seq_ngram: int = 4
    # Which continuation tokens the sequence-level term penalises: "ngram", every token of a
    # repeated seq_ngram-gram; "loop", only tokens that extend a stretch already repeating with
    # a period the gate counts (loop_mask), at least seq_loop_min_match tokens long.
    seq_mask: str = "ngram"
    seq_loop_min_match: int = 8
    # The sequence-level term's weight beside the token-level loss (per continuation token).
    seq_weight: float = 1.0
    seq_lr: float = 3e-4
    # None: seq_lr throughout; a number: seq_lr decays linearly to it over the steps.
    seq_lr_floor: float | None = None
    seq_mle_windows: int = 8
    # Rows times squared length (prefix and continuation) one forward of the sequence-level loss
    # may take; more rows go in chunks, each backward on its own, then the token-level loss's.
    # Why: eager attention's fp32 score matrices grow with rows x length^2, and the long polish's
    # 1,280-token prefixes at 32 rows need some 30 times what the first polish's 128-token ones do: on an H200 its
    # second step (384 + 128 tokens, 32 rows, 8.4 M) beside the token-level windows (8 x 1024^2)
    # ran out of its 140 GiB. Every recipe before it (at most 32 x 256^2 = 2.1 M) is one chunk,
    # one backward, as it was.
    seq_rows_len2: int = 1 << 22
    # The sequence phase's window draws: seed + this (a polish stage draws windows of its own).
    seq_seed_offset: int = 2
    # Prefix lengths the sequence-level steps take in turn (empty: ``seq_prefix`` at every step).
    seq_prefix_cycle: tuple[int, ...] = ()
    # Validation probes (the gate on prompts from held-out files the proof's prompts do not
    # use) every this many sequence-level steps: a diagnostic, never a choice of checkpoint.
    probe_every: int = 25
    # The validation prompts: this many in all, their lengths taken in turn from the tuple.
    validation_count: int = 32
    validation_lengths: tuple[int, ...] = (200,)
    log_every: int = 10
    vocab_size: int = lm_files.VOCAB_SIZE


# The polish stage (``--polish FROM``): more sequence-level steps on a finished target,
# nothing else; a second deterministic command on the first one's checkpoint, so a target is
# still rebuilt from pinned inputs alone (train, then polish). It draws windows with a seed of
# its own, decodes MAX_TOKENS = 128 new tokens (the length the gate judges) and decays its rate.
# Why: e3f0284d (TrainConfig above, H200) missed the gate by one sequence, 4 of 36 greedy probes
# looping where the bar allows 3, its validation count swinging between 2 and 10 of 32 from one
# probe to the next. A first polish (50 steps, the "ngram" mask, 3e-4 decaying to 3e-5: target
# 2b128741, its record keeps that recipe) made it 6 of 36: with about a third of every
# continuation in some repeated 4-gram, most of the penalty falls on repetition that ordinary
# code has, and little on the loops. This one penalises only the tokens that extend a loop the
# gate would count ("loop": loop_mask). Those are rarer than repeated 4-grams (about one
# continuation in six loops, so some 5 % of tokens against the 4-gram mask's 33 %), hence the
# weight 4: about the pressure the first phase ended with, all of it on loops. The aim is a loop
# rate well under the bar, not one that scrapes under it: at 36 prompts a model that loops one
# time in eight passes (3 or fewer) a third of the time, one in twenty 90 % of the time.
POLISH = dict(steps=0, seq_steps=60, seq_new=128, seq_mask="loop", seq_weight=4.0, seq_lr=3e-4,
              seq_lr_floor=3e-5, seq_seed_offset=7)
# A second polish on a polished target (``--polish FROM --polish-recipe long``). Why: 083e4869
# (POLISH on e3f0284d) loops in 1 of 36 greedy probes under transformers, but in 3 of 36 served by
# vLLM 0.21.0 and 4 of 36 by 0.33.0 (exact numerics, results/conformance/served-raw.tar.xz): the
# gate allows 3. Every one of those loops follows a long prompt (300, 790, 800, 1,400 and, under
# transformers, 1,040 tokens), with periods of 14 to 29, while the polish drew 128-token prefixes
# only and was watched on 200-token prompts. This one draws its prefixes at the lengths the gate's
# prompts have, and is watched on prompts of those lengths. "long-heavy" doubles the weight on
# the loop tokens. Which to keep, fixed before either ran: the one whose last validation probe
# loops least; a tie keeps "long"; neither is kept unless its transformers probe on the proof's
# prompts passes the gate (trained_pack.py choose-polish applies it).
POLISH_LONG = dict(POLISH, seq_prefix_cycle=(128, 384, 768, 1280), seq_seed_offset=11,
                   probe_every=15, validation_count=64, validation_lengths=(200, 600, 1000, 1400))
POLISH_RECIPES = {"polish": POLISH, "long": POLISH_LONG, "long-heavy": dict(POLISH_LONG, seq_weight=8.0)}


# ----------------------------------------------------------------- data


def encode_docs(tokenizer, docs: list[tuple[str, str]]) -> list[int]:
    """Every document's ids followed by eos: one stream to draw windows from."""
    eos = lm_files.CONFIG_IDS["eos_token_id"]
    ids: list[int] = []
    for enc in tokenizer.encode_batch([text for _, text in docs], add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos)
    return ids


def unigram_perplexity(train: list[int], heldout: list[int], vocab: int) -> float:
    """Perplexity of held-out tokens under the train split's token frequencies (add-one)."""
    counts = [1] * vocab
    for t in train:
        counts[t] += 1
    total = sum(counts)
    nll = -sum(math.log(counts[t] / total) for t in heldout) / len(heldout)
    return math.exp(nll)


def windows(stream, n: int, seq_len: int, rng: random.Random):
    """``n`` windows of ``seq_len`` tokens (an int64 array): bos, then a random stretch of ``stream``."""
    import numpy as np

    bos = lm_files.CONFIG_IDS["bos_token_id"]
    starts = [rng.randrange(0, len(stream) - seq_len) for _ in range(n)]
    out = np.empty((n, seq_len), dtype=np.int64)
    out[:, 0] = bos
    for row, start in enumerate(starts):
        out[row, 1:] = stream[start:start + seq_len - 1]
    return out


# ---------------------------------------------------------------- model


def target_config() -> dict:
    ids = {k: v for k, v in lm_files.CONFIG_IDS.items() if k != "mask_token_id"}
    cfg = mc.gemma4_config_dict(TARGET, vocab=lm_files.VOCAB_SIZE, ids=ids, max_positions=MAX_POSITIONS)
    cfg["text_config"]["initializer_range"] = 0.02
    cfg["initializer_range"] = 0.02
    # vLLM sizes image placeholders from the vision config (lm_files.VISION_CONFIG_EXTRA).
    cfg["vision_config"].update(lm_files.VISION_CONFIG_EXTRA)
    return cfg


def drafter_config() -> dict:
    return mc.drafter_config_dict(DRAFTER, vocab=lm_files.VOCAB_SIZE,
                                  mask_token_id=lm_files.CONFIG_IDS["mask_token_id"],
                                  max_positions=MAX_POSITIONS, num_target_layers=TARGET.num_layers)


def _permute_rows(rows, order, inverse):
    """``rows[order]`` for a permutation ``order`` (``inverse`` its inverse), as an autograd op.

    Plain indexing backpropagates through an accumulating index_put, which
    torch's deterministic mode runs as a sort; a permutation's gradient is
    just the inverse gather.
    """
    return _permute_op().apply(rows, order, inverse)


@functools.cache
def _permute_op():
    import torch  # here, so this module loads on hosts without torch

    class Permute(torch.autograd.Function):
        @staticmethod
        def forward(ctx, rows, order, inverse):
            ctx.save_for_backward(inverse)
            return rows[order]

        @staticmethod
        def backward(ctx, grad):
            (inverse,) = ctx.saved_tensors
            return grad[inverse], None, None

    return Permute


def _experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """Gemma 4's routed experts as two grouped bf16 GEMMs over token copies sorted by expert.

    transformers' own paths either loop over experts (slow: 30 layers x 32
    experts of small GEMMs) or scatter-add the results (float atomics: not
    run-to-run deterministic). Here every reduction is a gather or a plain
    sum, so the same inputs give the same bits.
    """
    import torch
    import torch.nn.functional as F

    copies, routing = expert_dispatch(hidden_states, top_k_index, self.num_experts)
    gate_up = F.grouped_mm(copies, self.gate_up_proj.to(torch.bfloat16).transpose(1, 2), offs=routing.offsets)
    gate, up = gate_up.chunk(2, dim=-1)
    down = F.grouped_mm(self.act_fn(gate) * up, self.down_proj.to(torch.bfloat16).transpose(1, 2),
                        offs=routing.offsets)
    return expert_combine(down, routing, top_k_weights, hidden_states.dtype)


@dataclass
class Routing:
    """Where each token copy went: the sort that groups copies by expert, and each group's end."""

    order: object
    inverse: object
    offsets: object  # int32 [experts]: cumulative copies per expert, grouped_mm's offs
    expert_of_copy: object  # the expert of each sorted copy


def expert_dispatch(hidden_states, top_k_index, num_experts: int):
    """(bf16 token copies sorted by expert, their Routing): the rows every expert's GEMM reads."""
    import torch

    tokens, k = top_k_index.shape
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    experts = torch.arange(num_experts, device=flat.device)
    offsets = torch.cumsum((flat.unsqueeze(1) == experts).sum(0), 0).to(torch.int32)
    copies = hidden_states.to(torch.bfloat16).unsqueeze(1).expand(tokens, k, -1).reshape(tokens * k, -1)
    return _permute_rows(copies, order, inverse), Routing(order, inverse, offsets, flat[order])


def expert_combine(down, routing: Routing, top_k_weights, dtype):
    """The experts' sorted outputs back to their tokens, weighted by the router and summed."""
    tokens, k = top_k_weights.shape
    down = _permute_rows(down, routing.inverse, routing.order)
    weighted = down.view(tokens, k, -1) * top_k_weights.unsqueeze(-1).to(down.dtype)
    return weighted.sum(dim=1).to(dtype)


def build_model(device: str):
    import torch
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    cfg = target_config()
    config = Gemma4Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    config.architectures = ["Gemma4ForConditionalGeneration"]
    model = Gemma4ForConditionalGeneration._from_config(
        config, attn_implementation="eager", dtype=torch.float32)
    _use_expert_kernel(model)
    unit_attention_logits(model)
    return model.to(device)


def _use_expert_kernel(model) -> None:
    for layer in model.model.language_model.layers:
        layer.experts.forward = _experts_forward.__get__(layer.experts)


def load_model(folder: Path, device: str):
    """A saved target (bf16 on disk) as fp32 master weights, built as ``build_model`` builds it."""
    import torch
    from transformers import Gemma4ForConditionalGeneration

    model = Gemma4ForConditionalGeneration.from_pretrained(folder, attn_implementation="eager",
                                                           dtype=torch.float32)
    _use_expert_kernel(model)
    return model.to(device)


def unit_attention_logits(model) -> None:
    """Start q_norm and k_norm gains at head_dim ** -0.25, so q.k starts with unit variance.

    Gemma 4 scores attention with scaling 1.0 and lets the learned q/k norm
    gains set the temperature. With transformers' init (gains of one) the
    logits of RMS-normalised q and k start with a standard deviation of
    sqrt(head_dim): 16 on sliding layers, 23 on full ones, so every head is a
    hard argmax over random keys, gradients through attention vanish, and the
    first H100 runs sat at unigram loss for 150 of 380 steps. The product of
    the two gains is what a 1/sqrt(head_dim) scaling would give; training
    moves them from there.
    """
    import torch

    with torch.no_grad():
        for layer in model.model.language_model.layers:
            attn = layer.self_attn
            gain = attn.head_dim ** -0.25
            attn.q_norm.weight.fill_(gain)
            if getattr(attn, "k_norm", None) is not None:
                attn.k_norm.weight.fill_(gain)


# ------------------------------------------------------------- training


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def seq_lr_at(step: int, cfg: TrainConfig) -> float:
    """The sequence phase's rate: constant, or linear from seq_lr to seq_lr_floor at the last step."""
    if cfg.seq_lr_floor is None:
        return cfg.seq_lr
    progress = step / max(1, cfg.seq_steps - 1)
    return cfg.seq_lr + (cfg.seq_lr_floor - cfg.seq_lr) * progress


def _loss(model, batch, unlikelihood: float = 0.0):
    import torch
    import torch.nn.functional as F

    with torch.autocast(batch.device.type, dtype=torch.bfloat16):
        logits = model(input_ids=batch, use_cache=False).logits
    logits = logits[:, :-1].float()
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    if not unlikelihood:
        return nll
    return nll + unlikelihood * unlikelihood_loss(logits, batch)


def unlikelihood_loss(logits, batch):
    """Mean over predicted positions of -sum log(1 - p(c)), c in the tokens seen so far in
    the window other than the one to predict. ``logits``: [B, T-1, V] for ``batch`` [B, T]."""
    import torch
    import torch.nn.functional as F

    vocab = logits.shape[-1]
    seen = F.one_hot(batch[:, :-1], vocab).cumsum(dim=1) > 0  # position t: tokens 0..t
    seen.scatter_(2, batch[:, 1:].unsqueeze(-1), False)  # the target is no candidate
    # The bos every window starts with is context, not a token to unlearn.
    seen[:, :, lm_files.CONFIG_IDS["bos_token_id"]] = False
    probs = torch.softmax(logits, dim=-1)
    penalty = -torch.log(torch.clamp(1.0 - probs, min=1e-5)) * seen
    return penalty.sum(dim=-1).mean()


def train(model, stream: list[int], cfg: TrainConfig, device: str) -> list[dict]:
    import numpy as np
    import torch

    rng = random.Random(cfg.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8,
                            fused=device.startswith("cuda"))
    data = np.asarray(stream, dtype=np.int64)
    curve, t0 = [], time.time()
    model.train()
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        total = 0.0
        for _ in range(cfg.accumulation):
            batch = torch.from_numpy(windows(data, cfg.micro_batch, cfg.seq_len, rng)).to(device)
            loss = _loss(model, batch, cfg.unlikelihood) / cfg.accumulation
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            curve.append({"step": step, "loss": round(total, 4), "lr": round(lr_at(step, cfg), 6),
                          "elapsed_s": round(time.time() - t0, 1)})
            print(f"step {step:4d} loss {total:.4f} ({time.time() - t0:.0f}s)", flush=True)
    model.eval()
    return curve


def repeated_ngram_mask(tokens: list[int], n: int) -> list[bool]:
    """True at every token of an ``n``-gram that already occurred earlier in ``tokens``.

    Welleck et al.'s candidate set for sequence-level unlikelihood: the tokens of each
    repeated n-gram of a continuation, so a loop is penalised from its first repeat on.
    """
    mask = [False] * len(tokens)
    seen: set[tuple[int, ...]] = set()
    for i in range(len(tokens) - n + 1):
        gram = tuple(tokens[i:i + n])
        if gram in seen:
            for j in range(i, i + n):
                mask[j] = True
        seen.add(gram)
    return mask


def loop_mask(tokens: list[int], start: int, max_period: int, min_match: int) -> list[bool]:
    """Per token of ``tokens[start:]``: whether it extends a loop, i.e. for some period
    p <= ``max_period`` it and the max(p, ``min_match``) tokens up to it each equal the token p
    before (a stretch that already repeats itself, which the gate's loop check is made of).
    Tokens before ``start`` (the prompt) count as context; only the continuation is marked."""
    run = [0] * (max_period + 1)
    mask = []
    for t, tok in enumerate(tokens):
        hit = False
        for p in range(1, max_period + 1):
            run[p] = run[p] + 1 if t >= p and tokens[t - p] == tok else 0
            hit = hit or run[p] >= max(p, min_match)
        if t >= start:
            mask.append(hit)
    return mask


def sequence_unlikelihood_loss(model, prefixes, cfg: TrainConfig):
    """(loss, share of continuation tokens penalised, backward done): greedy-decode ``seq_new``
    tokens after ``prefixes`` [B, P], then -log(1 - p(x_t)) at the tokens of repeated n-grams,
    summed and divided by all continuation tokens. Over ``seq_rows_len2`` the rows go in chunks,
    each backward already done (the loss returned is then a detached total)."""
    import torch

    import fast_decode

    shadow = _bf16_shadow(model)
    tokens, _ = fast_decode.greedy(shadow, prefixes.tolist(), cfg.seq_new)
    width = prefixes.shape[1]
    cont = torch.tensor(tokens, device=prefixes.device)
    out = torch.cat([prefixes, cont], dim=1)
    if cfg.seq_mask == "loop":
        rows = [loop_mask(row, width, bars.load()["gate"]["loop_max_period"], cfg.seq_loop_min_match)
                for row in out.tolist()]
    else:
        rows = [repeated_ngram_mask(row, cfg.seq_ngram) for row in cont.tolist()]
    mask = torch.tensor(rows, device=out.device)
    share = float(mask.float().mean())
    chunk = seq_chunk_rows(out.shape[0], out.shape[1], cfg)
    if chunk >= out.shape[0]:
        return _continuation_penalty(model, out, cont, mask, width, cfg, cont.numel()), share, False
    total = 0.0
    for start in range(0, out.shape[0], chunk):
        rows_ = slice(start, start + chunk)
        part = _continuation_penalty(model, out[rows_], cont[rows_], mask[rows_], width, cfg, cont.numel())
        part.backward()
        total += float(part.detach())
    return torch.tensor(total), share, True


def seq_chunk_rows(rows: int, length: int, cfg: TrainConfig) -> int:
    """Rows per forward of the sequence-level loss (``seq_rows_len2``); at least one."""
    return max(1, min(rows, cfg.seq_rows_len2 // (length * length)))


def _continuation_penalty(model, out, cont, mask, width: int, cfg: TrainConfig, denominator: int):
    """``seq_weight`` times -log(1 - p(x_t)) at the masked continuation tokens of ``out``,
    summed and divided by ``denominator`` (all continuation tokens of the step, so chunks add up)."""
    import torch

    with torch.autocast(out.device.type, dtype=torch.bfloat16):
        logits = model(input_ids=out, use_cache=False).logits
    # logits at width-1+t predict continuation token t
    logp = torch.log_softmax(logits[:, width - 1:-1].float(), dim=-1)
    p_tok = logp.gather(-1, cont.unsqueeze(-1)).squeeze(-1).exp()
    penalty = -torch.log(torch.clamp(1.0 - p_tok, min=1e-5)) * mask
    return cfg.seq_weight * penalty.sum() / denominator


_SHADOW: dict = {}


def _bf16_shadow(model):
    """A bf16 copy of ``model`` with its current weights, made once and refreshed in place:
    the greedy continuations decode as the saved bf16 checkpoint would (fast_decode)."""
    import copy

    import torch

    shadow = _SHADOW.get(id(model))
    if shadow is None:
        shadow = _SHADOW[id(model)] = copy.deepcopy(model).to(torch.bfloat16).eval()
    with torch.no_grad():
        for dst, src in zip(shadow.parameters(), model.parameters()):
            dst.copy_(src)
    return shadow


def seq_prefix_at(step: int, cfg: TrainConfig) -> int:
    """The prefix length of sequence-level step ``step``."""
    return cfg.seq_prefix_cycle[step % len(cfg.seq_prefix_cycle)] if cfg.seq_prefix_cycle else cfg.seq_prefix


def sequence_phase(model, stream: list[int], cfg: TrainConfig, device: str, probe_prompts: list[dict]) -> dict:
    """The sequence-level unlikelihood steps, with a validation probe every ``probe_every``."""
    import numpy as np
    import torch

    rng = random.Random(cfg.seed + cfg.seq_seed_offset)
    data = np.asarray(stream, dtype=np.int64)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.seq_lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0,
                            fused=device.startswith("cuda"))
    curve, probes, t0 = [], [], time.time()
    model.train()
    for step in range(cfg.seq_steps + 1):
        if probe_prompts and (step % cfg.probe_every == 0 or step == cfg.seq_steps):
            model.eval()
            probes.append({"step": step, **_probe_summary(greedy_probe(model, probe_prompts, device))})
            model.train()
            print(f"seq step {step} validation probe {probes[-1]}", flush=True)
        if step == cfg.seq_steps:
            break
        for group in opt.param_groups:
            group["lr"] = seq_lr_at(step, cfg)
        prefixes = torch.from_numpy(windows(data, cfg.seq_batch, seq_prefix_at(step, cfg), rng)).to(device)
        seq_loss, share, done = sequence_unlikelihood_loss(model, prefixes, cfg)
        batch = torch.from_numpy(windows(data, cfg.seq_mle_windows, cfg.seq_len, rng)).to(device)
        mle = _loss(model, batch, cfg.unlikelihood)
        (mle if done else seq_loss + mle).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % cfg.log_every == 0 or step == cfg.seq_steps - 1:
            curve.append({"step": step, "seq_loss": round(float(seq_loss.detach()), 4), "mle_loss": round(float(mle.detach()), 4),
                          "repeated_share": round(share, 4), "elapsed_s": round(time.time() - t0, 1)})
            print(f"seq step {step:4d} seq {float(seq_loss.detach()):.4f} mle {float(mle.detach()):.4f} "
                  f"repeated {share:.3f} ({time.time() - t0:.0f}s)", flush=True)
    model.eval()
    return {"curve": curve, "validation_probes": probes, "seconds": round(time.time() - t0, 1)}


def _probe_summary(probe: dict) -> dict:
    keep = ("sequences", "looping_sequences", "constant_sequences", "median_distinct_fraction", "passes",
            "looping_prompts")
    return {k: probe.get(k) for k in keep}


def validation_prompts(tokenizer, heldout: list[tuple[str, str]], taken: set[str], seed: int,
                       count: int = 32, lengths: tuple[int, ...] = (200,)) -> list[dict]:
    """``count`` prompts from held-out files the proof's prompts do not use, their lengths
    ``lengths`` in turn, one file each. The longest lengths take their files first (fewer files
    are that long); a length no file is left for goes short, and is said.

    The sequence phase is watched on these, so the proof's own prompts never steer training.
    """
    bos = lm_files.CONFIG_IDS["bos_token_id"]
    rng = random.Random(seed + 3)
    docs = [(path, text) for path, text in heldout if path not in taken]
    encoded = [(path, enc.ids) for (path, _), enc in
               zip(docs, tokenizer.encode_batch([t for _, t in docs], add_special_tokens=False))]
    pool = [d for d in encoded if len(d[1]) >= min(lengths)]
    rng.shuffle(pool)
    slots = [lengths[i % len(lengths)] for i in range(count)]
    chosen, used = {}, set()
    for i in sorted(range(count), key=lambda i: -slots[i]):  # stable: one length keeps the pool's order
        doc = next(((path, ids) for path, ids in pool if path not in used and len(ids) >= slots[i]), None)
        if doc is not None:
            used.add(doc[0])
            chosen[i] = {"source": doc[0], "start": 0, "token_ids": [bos] + doc[1][:slots[i] - 1],
                         "max_tokens": MAX_TOKENS}
    if len(chosen) < count:
        short = sorted({slots[i] for i in range(count) if i not in chosen})
        print(f"validation prompts: {len(chosen)} of {count}; too few held-out files of {short} tokens", flush=True)
    return [chosen[i] for i in sorted(chosen)]


def heldout_perplexity(model, stream: list[int], cfg: TrainConfig, device: str) -> float:
    import numpy as np
    import torch

    rng = random.Random(cfg.seed + 1)
    batches = windows(np.asarray(stream, dtype=np.int64), cfg.eval_windows, cfg.seq_len, rng)
    losses = []
    with torch.no_grad():
        for i in range(0, len(batches), cfg.micro_batch):
            batch = torch.from_numpy(batches[i:i + cfg.micro_batch]).to(device)
            losses.append(float(_loss(model, batch)) * len(batch))
    return math.exp(sum(losses) / len(batches))


def bf16_agreement(model, prompts: list[list[int]], device: str) -> dict:
    """Teacher-forced greedy argmax of the fp32 model vs its bf16 copy on the proof's prompts.

    A near-tie is an fp32 top-1/top-2 gap under one bf16 step at that magnitude
    (compare.bf16_step): there bf16 may pick either token without being wrong.
    """
    import copy

    import torch

    import compare

    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    agree = total = near = 0
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p], device=device)
            a = model(input_ids=ids, use_cache=False).logits[0].float()
            b = bf16(input_ids=ids, use_cache=False).logits[0].float()
            agree += int((a.argmax(-1) == b.argmax(-1)).sum())
            total += len(p)
            top2 = torch.topk(a, 2).values.tolist()
            near += sum(1 for t1, t2 in top2 if t1 - t2 <= compare.bf16_step(max(abs(t1), abs(t2))))
    del bf16
    return {"agree": agree, "positions": total, "fp32_near_ties": near}


def greedy_probe(model, prompts: list[dict], device: str, batch: int = 36) -> dict:
    """The non-degeneracy gate (gate.py) on the trained model's own greedy output, in bf16.

    ``max_tokens`` new tokens each with eos ignored, as the vLLM runs decode them,
    by ``fast_decode`` (each left-padded row positioned as if alone, as vLLM runs
    a request). It is a forecast: the records judge vLLM's output, but a
    checkpoint whose greedy text already loops here cannot pass there, and this
    costs seconds, not a serving run.
    """
    import fast_decode
    import gate

    shadow = _bf16_shadow(model)
    pad = lm_files.CONFIG_IDS["pad_token_id"]
    outputs = []
    for i in range(0, len(prompts), batch):
        group = prompts[i:i + batch]
        new = max(p["max_tokens"] for p in group)
        tokens, _ = fast_decode.greedy(shadow, [p["token_ids"] for p in group], new, pad=pad)
        outputs += [{"token_ids": row[:p["max_tokens"]]} for row, p in zip(tokens, group)]
    block = gate.nondegenerate(outputs)
    # Which prompts loop, at what period, and how long their prompt is: what a recipe change
    # has to go after (the counts alone do not say).
    block["looping_prompts"] = [{"prompt": i, "prompt_tokens": len(p["token_ids"]), "period": gate.loop_period(o["token_ids"])}
                                for i, (p, o) in enumerate(zip(prompts, outputs)) if gate.looping(o["token_ids"])]
    # The DFlash records judge their concurrency groups (the first c prompts for each c),
    # where the first prompts count several times: the same gate over that multiset.
    grouped = gate.nondegenerate(gate.as_groups(outputs), gate.as_groups(list(range(len(outputs)))))
    return {**block, "passes": gate.passes(block),
            "as_groups": {**grouped, "concurrency": list(gate.TRAINED_CONCURRENCY),
                          "passes": gate.passes(grouped)}}


# -------------------------------------------------------------- prompts

# Prompt lengths in tokens, bos included: 16 to 1,500, spread.
PROMPT_LENGTHS = [16, 300, 40, 1500, 96, 700, 24, 1200, 160, 64, 900, 256, 20, 480, 128, 1000,
                  48, 360, 200, 800, 32, 600, 1400, 80, 1100, 240, 560]
# Prompts that share one held-out file's first SHARED_PREFIX tokens, then go on
# for these many more: prefix-cache hits inside and across concurrent groups.
SHARED_PREFIX = 640
SHARED_TAILS = [16, 48, 96, 200, 320, 500, 24, 150, 400]
MAX_TOKENS = 128


def build_prompts(tokenizer, heldout: list[tuple[str, str]], seed: int) -> list[dict]:
    """Held-out text prompts. Each starts with bos at a line start of its own file;
    the shared-prefix ones are interleaved so every concurrency group holds some."""
    bos = lm_files.CONFIG_IDS["bos_token_id"]
    rng = random.Random(seed)
    encoded = [(path, enc.ids, enc.offsets) for (path, _), enc in
               zip(heldout, tokenizer.encode_batch([t for _, t in heldout], add_special_tokens=False))]
    need = max(PROMPT_LENGTHS + [SHARED_PREFIX + max(SHARED_TAILS)])
    long_docs = [d for d in encoded if len(d[1]) >= need]
    rng.shuffle(long_docs)
    if len(long_docs) < len(PROMPT_LENGTHS) + 1:
        raise SystemExit(f"held-out split has {len(long_docs)} files of >= {need} tokens; need more")
    shared_path, shared_ids, _ = long_docs[0]
    singles = [{"source": path, "start": 0, "token_ids": [bos] + ids[:n - 1]}
               for (path, ids, _), n in zip(long_docs[1:], PROMPT_LENGTHS)]
    shared = [{"source": shared_path, "start": 0, "shared_prefix": SHARED_PREFIX,
               "token_ids": [bos] + shared_ids[:SHARED_PREFIX + tail - 1]} for tail in SHARED_TAILS]
    prompts: list[dict] = []
    # Interleave: one shared-prefix prompt after every third single one.
    for i, p in enumerate(singles):
        prompts.append(p)
        if i % 3 == 2 and shared:
            prompts.append(shared.pop(0))
    prompts.extend(shared)
    for p in prompts:
        p["text"] = tokenizer.decode(p["token_ids"][1:])
        p["max_tokens"] = MAX_TOKENS
    return prompts


# ---------------------------------------------------------------- output


def _pinned_identities(corpus: dict, target_dir: Path) -> dict | None:
    """Whether this host rebuilt corpus.json's corpus digest and tokenizer (wheel corpora only)."""
    if corpus.get("source") != "wheels":
        return None
    pinned = json.loads(lm_files.PINNED_CORPUS.read_text())
    tokenizer = hashlib.sha256((target_dir / "tokenizer.json").read_bytes()).hexdigest()
    return {"corpus_sha256": corpus["sha256"] == pinned["corpus_sha256"],
            "tokenizer_sha256": tokenizer == pinned["tokenizer_sha256"]}


def polish_source(folder: Path, out: Path, corpus: dict, recipe: dict = POLISH) -> dict:
    """What the polish stage starts from, after refusing a folder it cannot build on: one whose
    weights are not its train record's, one trained on another corpus, or the output itself."""
    record_path = folder / "train-record.json"
    if not record_path.is_file():
        raise SystemExit(f"--polish {folder}: no train-record.json (train_target.py writes one)")
    record = json.loads(record_path.read_text())
    if (out / TARGET.name).resolve() == folder.resolve():
        raise SystemExit(f"--polish {folder}: the output folder would overwrite it; name another OUT")
    have = checkpoint_sha256(folder)
    if have != record.get("target_sha256"):
        raise SystemExit(f"--polish {folder}: its weights ({have[:12]}) are not its train record's "
                         f"({str(record.get('target_sha256'))[:12]})")
    if recipe is not POLISH and not record.get("polished_from"):
        raise SystemExit(f"--polish {folder}: a second polish builds on a polished target; this one is not")
    if record.get("corpus", {}).get("sha256") != corpus.get("sha256"):
        raise SystemExit(f"--polish {folder}: trained on corpus {record.get('corpus', {}).get('sha256')}, "
                         f"not this one ({corpus.get('sha256')})")
    return {"target_sha256": have, "train_config": record.get("train_config"),
            "greedy_probe": record.get("greedy_probe"), "gpu": record.get("gpu"), "recipe": recipe}


def checkpoint_sha256(folder: Path) -> str:
    """One hash over every weight, config, tokenizer and processor file (names and contents)."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = f.relative_to(folder).as_posix()
        if rel in ("train-record.json", "prompts.json", "calib.jsonl"):
            continue
        h.update(rel.encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def save_target(model, tokenizer, out: Path) -> list[str]:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(json.dumps(lm_files.generation_config_ids()) + "\n")
    return lm_files.write_lm_files(tokenizer, out, target_config()["vision_config"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="models folder: the target, the drafter and the records go here")
    parser.add_argument("--steps", type=int, help=f"optimizer steps (default {TrainConfig.steps})")
    parser.add_argument("--unlikelihood", type=float,
                        help=f"token-level unlikelihood weight (default {TrainConfig.unlikelihood})")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--corpus-wheels", type=Path, default=DEFAULT_CORPUS_DIR,
                        help="folder holding corpus.json's wheels (default %(default)s)")
    parser.add_argument("--stdlib", type=Path,
                        help="train on this standard library instead (the corpus of targets before 2026-11-29)")
    parser.add_argument("--seq-steps", type=int,
                        help=f"sequence-level unlikelihood steps (default {TrainConfig.seq_steps})")
    parser.add_argument("--polish", type=Path, metavar="FROM",
                        help="a polish stage on the target folder FROM, which this command trained")
    parser.add_argument("--polish-recipe", choices=sorted(POLISH_RECIPES), default="polish",
                        help="which polish (default %(default)s: POLISH; long: POLISH_LONG, on a polished target)")
    args = parser.parse_args(argv)
    if args.polish is None and args.polish_recipe != "polish":
        parser.error("--polish-recipe needs --polish FROM")
    recipe = POLISH_RECIPES[args.polish_recipe]
    cfg = TrainConfig() if args.polish is None else dataclasses.replace(TrainConfig(), **recipe)
    if args.steps is not None:
        cfg = dataclasses.replace(cfg, steps=args.steps)
    if args.unlikelihood is not None:
        cfg = dataclasses.replace(cfg, unlikelihood=args.unlikelihood)
    if args.seq_steps is not None:
        cfg = dataclasses.replace(cfg, seq_steps=args.seq_steps)

    import torch
    import transformers

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    t0 = time.time()

    corpus = (lm_files.collect_corpus(args.stdlib) if args.stdlib is not None
              else lm_files.collect_wheel_corpus(args.corpus_wheels))
    tokenizer = lm_files.train_tokenizer([text for _, text in corpus["train"]], cfg.vocab_size)
    train_ids = encode_docs(tokenizer, corpus["train"])
    heldout_ids = encode_docs(tokenizer, corpus["heldout"])
    unigram = unigram_perplexity(train_ids, heldout_ids, cfg.vocab_size)
    prompts = build_prompts(tokenizer, corpus["heldout"], cfg.seed)
    print(f"corpus: {corpus['files']} files, {len(train_ids)} train / {len(heldout_ids)} held-out tokens; "
          f"unigram perplexity {unigram:.1f}; {len(prompts)} prompts ({time.time() - t0:.0f}s)", flush=True)

    polished_from = None if args.polish is None else polish_source(args.polish, args.out, corpus, recipe)
    model = build_model(args.device) if args.polish is None else load_model(args.polish, args.device)
    n_params = sum(p.numel() for p in model.parameters())
    t_train = time.time()
    curve = train(model, train_ids, cfg, args.device)
    train_s = time.time() - t_train
    token_phase = None
    if cfg.steps:
        token_phase = {"heldout_perplexity": round(heldout_perplexity(model, heldout_ids, cfg, args.device), 3),
                       "greedy_probe": _probe_summary(greedy_probe(model, prompts, args.device))}
        print(f"after the token-level steps: {token_phase}", flush=True)
    validation = validation_prompts(tokenizer, corpus["heldout"], {p["source"] for p in prompts}, cfg.seed,
                                    cfg.validation_count, cfg.validation_lengths)
    seq_phase = sequence_phase(model, train_ids, cfg, args.device, validation) if cfg.seq_steps else None
    ppl = heldout_perplexity(model, heldout_ids, cfg, args.device)
    agreement = bf16_agreement(model, [p["token_ids"] for p in prompts], args.device)
    probe = greedy_probe(model, prompts, args.device)
    print(f"greedy probe (transformers, bf16): {probe}", flush=True)
    print(f"held-out perplexity {ppl:.2f} (unigram {unigram:.1f}, bar {unigram * PPL_BAR:.1f}); "
          f"bf16 vs fp32 {agreement}", flush=True)

    target_dir = args.out / TARGET.name
    save_target(model, tokenizer, target_dir)
    mc.write_drafter(DRAFTER, args.out / DRAFTER.name, config=drafter_config())
    (target_dir / "prompts.json").write_text(json.dumps(prompts) + "\n")
    with (args.out / "calib.jsonl").open("w") as f:
        for _, text in corpus["train"][:64]:
            f.write(json.dumps({"text": text[:4000]}) + "\n")
    record = {
        "target_name": TARGET.name,
        "target_sha256": checkpoint_sha256(target_dir),
        "drafter_name": DRAFTER.name,
        "corpus": {k: corpus[k] for k in ("source", "artifacts", "python", "stdlib", "sha256", "files", "bytes")
                   if k in corpus},
        "tokens": {"train": len(train_ids), "heldout": len(heldout_ids)},
        "tokenizer_sha256": hashlib.sha256((target_dir / "tokenizer.json").read_bytes()).hexdigest(),
        "pinned_identities": _pinned_identities(corpus, target_dir),
        "bars": bars.blob_hash(),
        "vocab_size": cfg.vocab_size,
        "params": n_params,
        "train_config": dataclasses.asdict(cfg),
        "tokens_seen": cfg.steps * cfg.accumulation * cfg.micro_batch * cfg.seq_len,
        "train_s": round(train_s, 1),
        "loss_curve": curve,
        "polished_from": polished_from,
        "token_phase": token_phase,
        "sequence_phase": seq_phase,
        "validation_prompts": len(validation),
        "heldout_perplexity": round(ppl, 3),
        "unigram_perplexity": round(unigram, 3),
        "perplexity_ratio": round(ppl / unigram, 5),
        "perplexity_bar_met": ppl <= unigram * PPL_BAR,
        "bf16_vs_fp32": agreement,
        "greedy_probe": probe,
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "prompts": len(prompts),
        "wall_s": round(time.time() - t0, 1),
    }
    (target_dir / "train-record.json").write_text(json.dumps(record, indent=1) + "\n")
    shapes = {"set": "trained", "vocab": cfg.vocab_size, "target": TARGET.name, "drafter": DRAFTER.name,
              "target_sha256": record["target_sha256"], "max_position_embeddings": MAX_POSITIONS,
              "prompt_token_limit": cfg.vocab_size,
              "mask_token_id": lm_files.CONFIG_IDS["mask_token_id"]}
    (args.out / "shapes.json").write_text(json.dumps(shapes, indent=1) + "\n")
    print(json.dumps({k: record[k] for k in ("target_sha256", "heldout_perplexity", "unigram_perplexity",
                                             "perplexity_bar_met", "train_s", "wall_s")}), flush=True)
    return 0 if record["perplexity_bar_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
