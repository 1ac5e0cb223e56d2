"""Train the DFlash drafter for the trained target (issue 25), through dflash_reference.py.

Why: a random drafter never has a draft accepted, so lossless output cannot
show a drafter-side bug (wrong target layers, a missing embedding scale, a
broken window): the target verifies every draft either way. A trained
drafter has an acceptance length, and a drafter-side bug lowers it.

What it does, in one command on the GPU host (``remote.sh train-drafter``):

1. target: ``trained-a4b-r30`` (train_target.py) in bf16, eval, transformers'
   Gemma 4 with train_target's deterministic expert kernel;
2. data: windows of the corpus's train split (the target folder's
   tokenizer), each continued by the target's own greedy decoding for
   ``continuation`` tokens; a teacher-forced pass over prompt + continuation
   gives the drafter's context features (the stream after each of
   ``target_layer_ids``, read with forward hooks) and the target's argmax at
   every position;
3. objective: for blocks anchored at random positions of the continuation,
   the drafter (dflash_reference.Drafter: the target's embedding table and LM
   head frozen, Gemma 4's embedding scale and soft cap) sees the features of
   the positions before the anchor and ``[token at anchor, mask x K]``, and
   learns the target's argmax at anchor .. anchor + K - 1 by cross entropy,
   weighted exp(-(k-1)/loss_decay) over draft k (a draft only counts when every
   earlier one was accepted). Labels are the target's argmax, not the corpus:
   acceptance compares drafts with the target's greedy verify, and on the
   target's own continuation the two differ only at numeric near-ties;
4. attention semantics: each step's loss is the mean over ``semantics``
   (dflash_reference). The default is z-lab's reading alone (sliding layers
   causal with their window), which 0.21.0 and 0.33.0 with the series share;
   ``vllm-0.21.0-stock`` is released 0.21.0's reading (every layer
   non-causal, no window), which drafters meant to run on both had mixed in;
5. evaluation: the held-out prompts the proof runs (``prompts.json``), each
   continued greedily by the target; every block of the continuation is
   drafted, and vLLM's verify loop is walked as vLLM runs a request alone
   (dflash_reference.walk): mean acceptance length, per-position rates and
   the histogram, per semantics, unweighted and weighted as realshape's
   concurrency groups (1, 4, 17, 32) count requests;
6. output: ``dflash-r5-trained/`` (config.json exactly as the random
   drafter's, model.safetensors in bf16 under the names vLLM's qwen3_dflash
   loader reads, no embedding or LM head: vLLM shares the target's) and
   ``drafter-train-record.json`` (loss curve, acceptance, ``drafter_sha256``,
   ``target_sha256``).

Seeded: the same seed, target and GPU kind give the same weights. The default
recipe (4f7c6c17) took 20 minutes on an H200 beside three other trainings and
85 GB at peak: it does not fit an H100. Needs transformers 5.13.1 (the
bundle's), a CUDA GPU and, for extra_fraction, ``--extra-corpus``.
``python tests/gpu/models/train_drafter.py MODELS_DIR --extra-corpus ROOT [--steps N]``
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
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
import dflash_reference as ref  # noqa: E402
import gate  # noqa: E402
import lm_files  # noqa: E402
import train_target as tt  # noqa: E402

DRAFTER_NAME = "dflash-r5-trained"
RECORD_NAME = "drafter-train-record.json"


@dataclass(frozen=True)
class DrafterTrainConfig:
    """One fixed recipe: the same numbers give the same checkpoint on the same GPU kind."""

    seed: int = 20261127
    # Generation groups (rows, shortest prompt, longest prompt): prompts up to the
    # proof's 1,500 tokens, one generate call each (rows x longest^2 bounds the eager
    # attention's memory at prefill; decode steps, not rows, cost time). The two short groups
    # have twice d46bce41's rows: one data set's features then take about 85 GB at peak
    # (on an H200), so this recipe needs an H200; d46bce41's groups took 43 GB.
    gen_groups: tuple = ((2048, 16, 160), (1536, 160, 600), (320, 600, 1100), (160, 1100, 1500))
    # More data without more memory: the groups are made afresh (new windows) this many times,
    # each set trained on for steps / data_chunks steps and then freed (two sets at once did not
    # fit beside generation on an H100). More data was the lever: d46bce41 (two
    # sets of its groups, 4,544 rows) accepted 3.55 on its own windows but 2.61 held out; a
    # drafter sweep (tests/gpu/results/trained/sweep-2026-11-28) gave 2.99 held out for
    # 9,088 rows, 3.46 for 16,256 and 3.59 for these 20,320, with trained and fresh windows
    # now alike (3.86 / 3.74): it no longer learns its data by heart.
    data_chunks: int = 5
    # The share of each group's windows taken from --extra-corpus instead of the train split:
    # Python the target never trained on (the bundle's vllm/ sources; remote.sh train-drafter
    # passes them). The runs' prompts are that kind of code, and the corpus adds fresh data.
    extra_fraction: float = 0.5
    continuation: int = 128
    k: int = ref.K_DEFAULT
    # A step is about 3,000 small kernels whatever its size (5 layers, fwd + bwd, two semantics),
    # so its time is mostly launches: few large steps rather than many small ones.
    steps: int = 3000
    batch_rows: int = 64
    anchors_per_row: int = 16
    lr: float = 2e-3
    warmup: int = 60
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    loss_decay: float = 7.0
    init_std: float = 0.02
    # One reading: z-lab's, which both series read alike (dflash-drafter-per-layer-attention
    # on 0.21.0), so a second entry would train the same loss twice.
    semantics: tuple = ("vllm-0.33.0",)
    # Tokens per teacher-forced pass (rows = this // padded length).
    feature_chunk_tokens: int = 32768
    # The proof's 128 new tokens (evaluate continues K further: the last blocks' drafts are
    # checked against greedy tokens past max_tokens, as vLLM verifies them).
    eval_max_tokens: int = 128
    # 0: every prompt of prompts.json (smoke runs take fewer).
    eval_prompts: int = 0
    log_every: int = 50


# ------------------------------------------------------------------ target


def load_target(target_dir: Path, device: str):
    """The trained target in bf16, eager attention, the deterministic expert kernel."""
    import torch
    from transformers import Gemma4ForConditionalGeneration

    model = Gemma4ForConditionalGeneration.from_pretrained(
        target_dir, dtype=torch.bfloat16, attn_implementation="eager")
    for layer in model.model.language_model.layers:
        layer.experts.forward = tt._experts_forward.__get__(layer.experts)
    return model.to(device).eval()


def greedy_continue(model, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """The target's greedy continuation of each prompt, batched with left padding.

    ``fast_decode``: each row positioned as if alone (as vLLM runs a request), the decode step
    replayed as a CUDA graph (transformers' generate spent most of the 687 s of generation and
    features of 4f7c6c17 launching kernels). eos does not stop a row (vLLM's ignore_eos)."""
    import fast_decode

    tokens, _ = fast_decode.greedy(model, prompts, new_tokens, pad=lm_files.CONFIG_IDS["pad_token_id"])
    return tokens


def target_features(model, sequences: list[list[int]], layer_ids, chunk_tokens: int):
    """Teacher-forced pass over right-padded sequences (causal: padding after a row's end
    changes none of its positions). Returns features [R, T, len(ids) * H] (bf16, the stream
    after each layer of ``layer_ids``, in id order: vLLM's aux hidden states id + 1),
    the argmax [R, T] and the top-2 logits [R, T, 2] (values, then ids)."""
    import torch

    pad = lm_files.CONFIG_IDS["pad_token_id"]
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad, dtype=torch.long)
    for row, s in enumerate(sequences):
        ids[row, :len(s)] = torch.tensor(s)
    device = next(model.parameters()).device
    layers = model.model.language_model.layers
    captured: dict[int, torch.Tensor] = {}
    hooks = [layers[i].register_forward_hook(lambda _m, _a, out, i=i: captured.__setitem__(i, out))
             for i in layer_ids]
    feats, greedy, top = [], [], []
    rows = max(1, chunk_tokens // width)
    try:
        with torch.no_grad():
            for start in range(0, len(sequences), rows):
                logits = model(input_ids=ids[start:start + rows].to(device), use_cache=False).logits
                feats.append(torch.cat([captured[i] for i in layer_ids], -1).to(torch.bfloat16))
                values, index = torch.topk(logits.float(), 2, dim=-1)
                greedy.append(index[..., 0])
                top.append(torch.stack([values, index.float()], -1))
                captured.clear()
    finally:
        for h in hooks:
            h.remove()
    return torch.cat(feats), torch.cat(greedy), torch.cat(top)


# -------------------------------------------------------------------- data


def prompt_windows(stream, rows: int, shortest: int, longest: int, rng: random.Random) -> list[list[int]]:
    """``rows`` prompts of random length in [shortest, longest]: bos, then a random stretch of the stream."""
    bos = lm_files.CONFIG_IDS["bos_token_id"]
    out = []
    for _ in range(rows):
        n = rng.randint(shortest, longest)
        start = rng.randrange(0, len(stream) - n)
        out.append([bos] + list(stream[start:start + n - 1]))
    return out


def group_windows(stream, extra_stream, group: tuple[int, int, int], extra_fraction: float,
                  rng: random.Random) -> list[list[int]]:
    """One generation group's prompts: ``extra_fraction`` of them from ``extra_stream``, the rest
    from the train split, drawn in that order from the one seeded ``rng``."""
    rows, shortest, longest = group
    extra = round(rows * extra_fraction)
    windows = prompt_windows(stream, rows - extra, shortest, longest, rng)
    return windows + (prompt_windows(extra_stream, extra, shortest, longest, rng) if extra else [])


def make_group(model, prompts: list[list[int]], cfg: DrafterTrainConfig, layer_ids) -> dict:
    """One generation group on the device: prompts continued by the target, then the
    teacher-forced features and argmax. ``prompt_len`` [R]: where each continuation starts."""
    import torch

    conts = greedy_continue(model, prompts, cfg.continuation)
    seqs = [p + c for p, c in zip(prompts, conts)]
    feats, greedy, _ = target_features(model, seqs, layer_ids, cfg.feature_chunk_tokens)
    device = feats.device
    tokens = torch.zeros(greedy.shape, dtype=torch.long)
    for row, s in enumerate(seqs):
        tokens[row, :len(s)] = torch.tensor(s)
    plen = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    return {"features": feats, "tokens": tokens.to(device), "greedy": greedy,
            "prompt_len": plen.to(device), "consistency": continuation_consistency(seqs, plen, greedy)}


def continuation_consistency(seqs, plen, greedy) -> dict:
    """How often the generated token equals the teacher-forced argmax before it (decode vs one
    multi-token pass: they differ only where bf16 rounding moves a near-tie)."""
    agree = total = 0
    g = greedy.cpu()
    for row, s in enumerate(seqs):
        p = int(plen[row])
        pred = g[row, p - 1:len(s) - 1].tolist()
        agree += sum(1 for a, b in zip(pred, s[p:]) if a == b)
        total += len(s) - p
    return {"agree": agree, "positions": total}


# ---------------------------------------------------------------- training


def sample_blocks(group: dict, cfg: DrafterTrainConfig, gen):
    """Rows and anchors of one step, from a seeded CPU generator: ``batch_rows`` rows, each
    with ``anchors_per_row`` distinct anchors in its continuation such that all K labels exist."""
    import torch

    n_rows = group["features"].shape[0]
    rows = torch.randperm(n_rows, generator=gen)[:cfg.batch_rows]
    choices = cfg.continuation - cfg.k + 1
    offsets = torch.rand(len(rows), choices, generator=gen).argsort(-1)[:, :cfg.anchors_per_row]
    device = group["features"].device
    rows = rows.to(device)
    anchors = group["prompt_len"][rows][:, None] + offsets.to(device)
    return rows, anchors


def block_labels(group: dict, rows, anchors, k: int):
    """Bonus tokens [B, A] (the token at each anchor) and labels [B, A, K] (the target's argmax
    at anchor .. anchor + K - 1: draft j's position anchor + j is predicted there)."""
    import torch

    tokens, greedy = group["tokens"][rows], group["greedy"][rows]
    bonus = torch.gather(tokens, 1, anchors)
    pos = anchors[..., None] + torch.arange(k, device=anchors.device)
    labels = torch.gather(greedy, 1, pos.flatten(1)).view(pos.shape)
    return bonus, labels


def position_weights(k: int, decay: float, device):
    import torch

    return torch.exp(-torch.arange(k, dtype=torch.float32, device=device) / decay)


def block_loss(drafter, shared, group, rows, anchors, cfg: DrafterTrainConfig):
    """Mean over the semantics of the position-weighted cross entropy of the K drafts."""
    import torch
    import torch.nn.functional as F

    bonus, labels = block_labels(group, rows, anchors, cfg.k)
    feats = group["features"][rows]
    ctx_pos = torch.arange(feats.shape[1], device=feats.device).expand(feats.shape[0], -1)
    w = position_weights(cfg.k, cfg.loss_decay, feats.device)
    total = 0.0
    for sem in cfg.semantics:
        out = ref.draft_logits(drafter, shared, feats, ctx_pos, bonus, anchors, sem, cfg.k)
        ce = F.cross_entropy(out.float().flatten(0, -2), labels.flatten(), reduction="none").view(labels.shape)
        total = total + (ce * w).sum() / (w.sum() * ce.shape[0] * ce.shape[1])
    return total / len(cfg.semantics)


class Trainer:
    """AdamW on the drafter alone (the target's table is frozen); fp32 weights, bf16 autocast
    on CUDA. One optimizer, step count and sampling generator across the data chunks, so the
    learning-rate schedule runs once over all ``cfg.steps``."""

    def __init__(self, drafter, shared, cfg: DrafterTrainConfig, device: str):
        import torch

        self.drafter, self.shared, self.cfg, self.device = drafter, shared, cfg, device
        self.gen = torch.Generator().manual_seed(cfg.seed)
        decay = [p for p in drafter.parameters() if p.dim() >= 2]
        rest = [p for p in drafter.parameters() if p.dim() < 2]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                      {"params": rest, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95),
                                     eps=1e-8, fused=device.startswith("cuda"))
        self.step, self.curve, self.t0 = 0, [], None

    def chunk_steps(self, chunk: int) -> int:
        """Steps of data chunk ``chunk``: cfg.steps split as evenly as integers allow."""
        c, n = self.cfg.data_chunks, self.cfg.steps
        return (chunk + 1) * n // c - chunk * n // c

    def run(self, groups: list[dict], steps: int) -> None:
        """``steps`` steps on ``groups``, each drawing a group with probability proportional
        to its rows (with one chunk the draws and blocks come from the seeded generator in the
        order the one-chunk recipe always drew them: its checkpoints rebuild unchanged)."""
        import torch

        drafter, cfg, opt, gen = self.drafter, self.cfg, self.opt, self.gen
        weights = torch.tensor([float(g["features"].shape[0]) for g in groups])
        order = torch.multinomial(weights, steps, replacement=True, generator=gen).tolist()
        self.t0 = self.t0 or time.time()
        drafter.train()
        for gi in order:
            step = self.step
            for group in opt.param_groups:
                group["lr"] = tt.lr_at(step, cfg)
            rows, anchors = sample_blocks(groups[gi], cfg, gen)
            with torch.autocast(self.device.split(":")[0], dtype=torch.bfloat16,
                                enabled=self.device.startswith("cuda")):
                loss = block_loss(drafter, self.shared, groups[gi], rows, anchors, cfg)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step % cfg.log_every == 0 or step == cfg.steps - 1:
                elapsed = time.time() - self.t0
                self.curve.append({"step": step, "loss": round(float(loss.detach()), 4),
                                   "lr": round(tt.lr_at(step, cfg), 6), "elapsed_s": round(elapsed, 1)})
                print(f"step {step:4d} loss {float(loss.detach()):.4f} ({elapsed:.0f}s)", flush=True)
            self.step += 1
        drafter.eval()


def train(drafter, shared, groups: list[dict], cfg: DrafterTrainConfig, device: str) -> list[dict]:
    """All of ``cfg.steps`` on one set of groups (data_chunks 1)."""
    trainer = Trainer(drafter, shared, cfg, device)
    trainer.run(groups, cfg.steps)
    return trainer.curve


# --------------------------------------------------------------- evaluation


def drafts_at_every_anchor(drafter, shared, features, tokens, plen: int, n_anchors: int,
                           semantics: str, k: int):
    """Greedy drafts [n_anchors, K] of the blocks anchored at plen .. plen + n_anchors - 1 of
    one sequence (features [T, F], tokens [T]), each seeing the context before its anchor."""
    import torch

    anchors = plen + torch.arange(n_anchors, device=features.device)
    ctx_pos = torch.arange(features.shape[0], device=features.device)[None]
    bonus = tokens[anchors]
    with torch.no_grad():
        out = ref.draft_logits(drafter, shared, features[None], ctx_pos, bonus[None], anchors[None],
                               semantics, k)
    return out[0].argmax(-1)


def prompt_steps(drafts, greedy, plen: int, max_tokens: int, k: int) -> list[int]:
    """vLLM's verify steps of one request (dflash_reference.walk) from the drafts at every anchor
    (drafts[j]: the block at plen + j) and the teacher-forced argmax (greedy[t]: the token at t + 1)."""
    d, g = drafts.tolist(), greedy.tolist()

    def accepted_at(a: int) -> int:
        return ref.accepted_length(d[a - plen], g[a:a + k])

    return ref.walk(accepted_at, plen, max_tokens)


def evaluate(model, drafter, shared, prompts: list[dict], cfg: DrafterTrainConfig) -> dict:
    """Offline acceptance on the proof's held-out prompts, per semantics (module docstring, 5)."""
    k, max_tokens = cfg.k, cfg.eval_max_tokens
    ids = [p["token_ids"] for p in prompts]
    # Blocks anchored up to plen + max_tokens - 1 need greedy tokens K further.
    conts = greedy_continue(model, ids, max_tokens + k)
    seqs = [p + c for p, c in zip(ids, conts)]
    import torch

    feats, greedy, top = target_features(model, seqs, drafter.g.target_layer_ids, cfg.feature_chunk_tokens)
    plens = [len(p) for p in ids]
    result: dict = {"prompts": len(prompts), "max_tokens": max_tokens, "k": k,
                    "gate": eval_gate(seqs, plens, top, max_tokens),
                    "consistency": continuation_consistency(seqs, plens, greedy)}
    for sem in cfg.semantics:
        per_prompt = []
        for row, s in enumerate(seqs):
            tokens = torch.tensor(s, device=feats.device)
            drafts = drafts_at_every_anchor(drafter, shared, feats[row, :len(s)], tokens, plens[row],
                                            max_tokens, sem, k)
            per_prompt.append(prompt_steps(drafts, greedy[row, :len(s)], plens[row], max_tokens, k))
        result[sem] = {
            "all_prompts": gate.acceptance_summary([f for steps in per_prompt for f in steps], k),
            "as_realshape_groups": gate.acceptance_summary(
                [f for steps in gate.as_groups(per_prompt) for f in steps], k),
            "per_prompt_steps": per_prompt,
        }
    return result


def train_split_acceptance(model, drafter, shared, stream, heldout: list[dict], trained: list[list[int]],
                           cfg: DrafterTrainConfig) -> dict:
    """Where acceptance is lost, measured with the same walk as the held-out prompts:

    * ``trained_windows``: windows the drafter trained on (their continuations are its data);
    * ``fresh_windows``: as many new windows of the same train split, which the target learnt
      but the drafter never saw, of the held-out prompts' lengths.

    Trained far above fresh: the drafter has learnt its data by heart, more data is the lever.
    Fresh far above held-out: the target is surer on text it learnt (the held-out number is the
    drafter's honest one). All three close: the drafter itself (or the target's uncertainty)
    limits acceptance."""
    lengths = [len(p["token_ids"]) for p in heldout]
    fresh = prompt_windows(stream, len(lengths), min(lengths), max(lengths), random.Random(cfg.seed + 1))
    picked = random.Random(cfg.seed + 2).sample(trained, min(len(lengths), len(trained)))
    out = {}
    for name, windows in (("trained_windows", picked), ("fresh_windows", fresh)):
        ev = evaluate(model, drafter, shared, [{"token_ids": w} for w in windows], cfg)
        out[name] = {"prompts": ev["prompts"], "gate": ev["gate"],
                     **{sem: ev[sem]["all_prompts"] for sem in cfg.semantics}}
    return out


def eval_gate(seqs, plens, top, max_tokens: int) -> dict:
    """gate.py's block on the first max_tokens generated tokens, with the teacher-forced top-2
    logits (near-ties) of each."""
    outs = []
    for row, s in enumerate(seqs):
        p = plens[row]
        rows = top[row, p - 1:p - 1 + max_tokens].tolist()
        outs.append({"token_ids": s[p:p + max_tokens],
                     "top": [[[int(i1), v1, 1], [int(i2), v2, 2]] for (v1, i1), (v2, i2) in rows]})
    block = gate.nondegenerate(outs)
    return {**block, "passes": gate.passes(block)}


# ------------------------------------------------------------------ output


def save_drafter(drafter, config: dict, out: Path) -> None:
    """bf16 weights under the checkpoint's names, the random drafter's config.json unchanged."""
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {n: t.detach().to(torch.bfloat16).contiguous().cpu() for n, t in drafter.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def drafter_sha256(folder: Path) -> str:
    """One hash over the drafter's config and weights (names and contents)."""
    h = hashlib.sha256()
    for name in ("config.json", "model.safetensors"):
        h.update(name.encode() + b"\0" + hashlib.sha256((folder / name).read_bytes()).digest())
    return h.hexdigest()


def load_drafter(folder: Path, device: str):
    """A saved drafter (config.json, model.safetensors) as dflash_reference's float32 Drafter, in eval."""
    from safetensors.torch import load_file

    config = json.loads((folder / "config.json").read_text())
    drafter = ref.Drafter(ref.Geometry.from_config(config))
    drafter.load_state_dict({n: t.float() for n, t in load_file(str(folder / "model.safetensors")).items()})
    return drafter.to(device).eval()


def shared_from_target(model, target_dir: Path) -> ref.Shared:
    text = json.loads((target_dir / "config.json").read_text())["text_config"]
    table = model.model.language_model.embed_tokens.weight.detach()
    return ref.Shared.gemma4(table, text)


def build_drafter(config: dict, cfg: DrafterTrainConfig, device: str):
    import torch

    torch.manual_seed(cfg.seed)
    drafter = ref.Drafter(ref.Geometry.from_config(config))
    drafter.init_weights(cfg.init_std)
    return drafter.to(device)


def deterministic_torch(seed: int) -> None:
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.manual_seed(seed)
    random.seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


# Drafters trained before dflash-drafter-per-layer-attention: their records name
# "vllm-0.21.0" for what is now STOCK_0_21_0 (released 0.21.0's reading), so the
# recipe that rebuilds them spells it out.
BOTH_READINGS = {"semantics": [ref.STOCK_0_21_0, "vllm-0.33.0"]}


def config_from(steps: int | None, override: dict) -> DrafterTrainConfig:
    fields = dict(override)
    unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(DrafterTrainConfig)})
    if unknown:
        raise SystemExit(f"no DrafterTrainConfig field {', '.join(unknown)}")
    if steps is not None:
        fields["steps"] = steps
    if "gen_groups" in fields:
        fields["gen_groups"] = tuple(tuple(g) for g in fields["gen_groups"])
    if "semantics" in fields:
        fields["semantics"] = tuple(fields["semantics"])
    cfg = dataclasses.replace(DrafterTrainConfig(), **fields)
    if not 1 <= cfg.data_chunks <= cfg.steps:
        raise SystemExit(f"data_chunks {cfg.data_chunks}: between 1 and steps ({cfg.steps}), each chunk trains")
    if not 0 <= cfg.extra_fraction <= 1:
        raise SystemExit(f"extra_fraction {cfg.extra_fraction}: a share of each group's windows, in [0, 1]")
    return cfg


def extra_corpus(root: Path | None, cfg: DrafterTrainConfig) -> tuple[list, dict | None]:
    """(docs, record): the Python under ``root`` (every file, both of lm_files' splits: none of it
    is evaluated) where the recipe asks for windows from it, and what the drafter's record names
    of it; refused where the two disagree."""
    if (root is not None) != (cfg.extra_fraction > 0):
        raise SystemExit("--extra-corpus and a nonzero extra_fraction go together: "
                         f"got {root or 'no --extra-corpus'} and extra_fraction {cfg.extra_fraction}")
    if root is None:
        return [], None
    # A wheel (corpus.json's transformers 5.13.1, the same bytes on every host) or a folder.
    found = lm_files.collect_wheel_sources(root) if root.suffix == ".whl" else lm_files.collect_corpus(root)
    docs = found["train"] + found["heldout"]
    return docs, {"root": str(root), "sha256": found["sha256"], "files": len(docs)}


def target_corpus(target_record: dict, wheels: Path, stdlib: Path | None) -> dict:
    """The corpus the target trained on, as its record names it: corpus.json's wheels, or (targets
    before them) a standard library; refused where the rebuilt corpus is not the recorded one."""
    recorded = target_record["corpus"]
    corpus = (lm_files.collect_wheel_corpus(wheels) if recorded.get("source") == "wheels"
              else lm_files.collect_corpus(stdlib))
    if corpus["sha256"] != recorded["sha256"]:
        raise SystemExit(f"the corpus rebuilt here ({corpus['sha256'][:12]}) is not the target's "
                         f"({recorded['sha256'][:12]}): its drafter would train on other text")
    return corpus


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", type=Path, help="models folder: the trained target is read and the drafter "
                                                  "written here")
    parser.add_argument("--steps", type=int, help=f"optimizer steps (default {DrafterTrainConfig.steps})")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--stdlib", type=Path,
                        help="the corpus root of a target trained on a standard library (default: this interpreter's)")
    parser.add_argument("--corpus-wheels", type=Path, default=tt.DEFAULT_CORPUS_DIR,
                        help="folder holding corpus.json's wheels, for a target trained on them (default %(default)s)")
    parser.add_argument("--extra-corpus", type=Path, metavar="ROOT",
                        help="Python sources the target never trained on (remote.sh: the bundle's vllm/), "
                             "for the extra_fraction of each group's windows")
    parser.add_argument("--override", type=json.loads, default={},
                        help="DrafterTrainConfig fields as JSON, e.g. a CPU smoke run's smaller groups")
    parser.add_argument("--gpu-fraction", type=float,
                        help="cap this process's share of the GPU's memory (0-1]: servers started beside a "
                             "background training need the rest (unset, the caching allocator keeps up to "
                             "the whole card: 68-80 GB seen on an H100)")
    args = parser.parse_args(argv)
    if args.gpu_fraction is not None and not 0 < args.gpu_fraction <= 1:
        parser.error(f"--gpu-fraction must be in (0, 1], got {args.gpu_fraction}")
    cfg = config_from(args.steps, args.override)
    extra_docs, extra = extra_corpus(args.extra_corpus, cfg)

    import torch
    import transformers
    from tokenizers import Tokenizer

    on_gpu = args.device.startswith("cuda")
    if on_gpu and args.gpu_fraction is not None:
        # The allocator frees its cache and retries before it raises at the cap; the cap
        # changes where memory is kept, not what is computed.
        torch.cuda.set_per_process_memory_fraction(args.gpu_fraction)
    deterministic_torch(cfg.seed)
    t0 = time.time()
    target_dir = args.models / tt.TARGET.name
    target_record = json.loads((target_dir / "train-record.json").read_text())
    config = tt.drafter_config()
    layer_ids = config["dflash_config"]["target_layer_ids"]
    model = load_target(target_dir, args.device)
    shared = shared_from_target(model, target_dir)

    corpus = target_corpus(target_record, args.corpus_wheels, args.stdlib)
    tokenizer = Tokenizer.from_file(str(target_dir / "tokenizer.json"))
    stream = tt.encode_docs(tokenizer, corpus["train"])
    extra_stream = tt.encode_docs(tokenizer, extra_docs) if extra_docs else None
    print(f"target loaded, corpus {corpus['files']}, extra {extra and extra['files']} ({time.time() - t0:.0f}s)",
          flush=True)

    rng = random.Random(cfg.seed)
    drafter = build_drafter(config, cfg, args.device)
    trainer = Trainer(drafter, shared, cfg, args.device)
    gen_s = train_s = 0.0
    trained_windows: list[list[int]] = []  # a few of every group, for train_split_acceptance
    for chunk in range(cfg.data_chunks):
        t_gen, groups = time.time(), []
        for rows, shortest, longest in cfg.gen_groups:
            windows = group_windows(stream, extra_stream, (rows, shortest, longest), cfg.extra_fraction, rng)
            trained_windows += windows[:16]
            groups.append(make_group(model, windows, cfg, layer_ids))
            print(f"chunk {chunk} group {rows} x {shortest}-{longest}: {groups[-1]['consistency']} "
                  f"({time.time() - t0:.0f}s)", flush=True)
        t_train = time.time()
        gen_s += t_train - t_gen
        trainer.run(groups, trainer.chunk_steps(chunk))
        train_s += time.time() - t_train
        del groups
        if on_gpu:
            torch.cuda.empty_cache()
    curve = trainer.curve
    prompts = json.loads((target_dir / "prompts.json").read_text())
    prompts = prompts[:cfg.eval_prompts] if cfg.eval_prompts else prompts
    t_eval = time.time()
    # The weights as saved (bf16) are what vLLM drafts with.
    drafter16 = copy.deepcopy(drafter).to(torch.bfloat16)
    evaluation = evaluate(model, drafter16, shared, prompts, cfg)
    evaluation["train_split"] = train_split_acceptance(model, drafter16, shared, stream, prompts,
                                                       trained_windows, cfg)
    eval_s = time.time() - t_eval

    out = args.models / DRAFTER_NAME
    save_drafter(drafter, config, out)
    record = {
        "drafter_name": DRAFTER_NAME,
        "drafter_sha256": drafter_sha256(out),
        "target_name": tt.TARGET.name,
        "target_sha256": target_record["target_sha256"],
        "target_sha256_recomputed": tt.checkpoint_sha256(target_dir),
        "corpus_sha256": corpus["sha256"],
        "corpus_matches_target": corpus["sha256"] == target_record["corpus"]["sha256"],
        "extra_corpus": extra,
        "objective": ("cross entropy of the K drafts of blocks [token at anchor, mask x K] anchored in the "
                      "target's own greedy continuations of train-split windows (extra_fraction of them from "
                      "extra_corpus), against the target's argmax "
                      "at anchor .. anchor+K-1 (teacher-forced), weighted exp(-(k-1)/loss_decay); mean over "
                      "the semantics"),
        "train_config": dataclasses.asdict(cfg),
        "data": {"rows": sum(r for r, _, _ in cfg.gen_groups) * cfg.data_chunks,
                 "continuation_tokens": sum(r for r, _, _ in cfg.gen_groups) * cfg.data_chunks * cfg.continuation},
        "loss_curve": curve,
        "evaluation": evaluation,
        "timing_s": {"generate_and_features": round(gen_s, 1), "train": round(train_s, 1),
                     "evaluate": round(eval_s, 1)},
        "gpu": torch.cuda.get_device_name() if on_gpu else args.device,
        # what a server beside a background training can count on: the peak this process held
        "gpu_memory_gib": {"peak_allocated": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                           "peak_reserved": round(torch.cuda.max_memory_reserved() / 2**30, 2),
                           "fraction_cap": args.gpu_fraction} if on_gpu else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "wall_s": round(time.time() - t0, 1),
    }
    (out / RECORD_NAME).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(headline(record)), flush=True)
    return 0


def headline(record: dict) -> dict:
    """The numbers a reader wants first."""
    ev = record["evaluation"]
    return {"drafter_sha256": record["drafter_sha256"], "target_sha256": record["target_sha256"],
            "gate_passes": ev["gate"]["passes"],
            **{f"mean_acceptance_length[{s}]": ev[s]["all_prompts"]["mean_acceptance_length"]
               for s in record["train_config"]["semantics"]},
            **{f"acceptance_length[{s}][{w}]": ev["train_split"][w][s]["mean_acceptance_length"]
               for s in record["train_config"]["semantics"] if "train_split" in ev
               for w in ("trained_windows", "fresh_windows")},
            "final_loss": record["loss_curve"][-1]["loss"], "wall_s": record["wall_s"]}


if __name__ == "__main__":
    sys.exit(main())
