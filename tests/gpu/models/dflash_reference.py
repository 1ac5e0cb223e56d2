"""A PyTorch DFlash drafter written from vLLM's and z-lab's descriptions (issue 25).

This is the drafter the trained checkpoint is trained through, and the
reference its vLLM runs are compared with. It is written here, from reading
vLLM 0.21.0 (``vllm/model_executor/models/qwen3_dflash.py``,
``vllm/v1/spec_decode/dflash.py``, ``copy_and_expand_dflash_inputs_kernel``
in ``vllm/v1/spec_decode/utils.py``) and 0.33.0 (the same model file and
``vllm/v1/worker/gpu/spec_decode/dflash/speculator.py``), the project's
patches 0004 and 0005 (0.21.0) / 0003 (0.33.0), and z-lab/dflash's
``dflash/model.py`` as documentation. No code is taken from them.
tests/unit/test_drafter_conformance.py checks it against z-lab's ``dflash``
0.1.0 (its ``DFlashDraftModel``, on the CPU).

How vLLM drafts one block (what this module computes):

* context: the target's residual stream after each layer in
  ``target_layer_ids`` (vLLM records the stream *entering* layer ``i`` as
  aux state ``i``, so the ids are shifted by one: 0.21.0 patch 0004, upstream
  from 0.22.0), concatenated in id order, ``fc`` (no bias), then
  ``hidden_norm``. Every drafter layer projects this same normed context to
  its own K (then ``k_norm`` and RoPE at the context positions) and V. The
  context does not pass through the layers: vLLM precomputes these K/V and
  writes them into the drafter's KV cache
  (``precompute_and_store_context_kv``).
* query block: ``[bonus, mask x K]``: the token the target just sampled (the
  last verified token, at position ``a``) followed by K copies of
  ``mask_token_id``, at positions ``a .. a + K``. Tokens are embedded with
  the target's table times the target's own scale (Gemma 4's
  sqrt(hidden_size): 0.21.0 patch 0005 / 0.33.0 patch 0003; without the
  series the drafter gets the bare table) times the drafter config's
  ``dflash_config.input_embedding_scale`` (default 1.0), as z-lab's Gemma 4
  backend (``model_mlx.py``) scales them.
* layers: qwen3 pre-norm blocks: ``input_layernorm``, q/k/v from the block's
  hidden states, per-head ``q_norm`` / ``k_norm``, RoPE (neox) at the block
  positions, attention of the block's queries over [context K/V, the block's
  own K/V], ``o_proj``, residual; ``post_attention_layernorm``, SiLU MLP,
  residual; then ``norm``.
* which keys a query sees (``LayerAttention``): all context positions before
  the block, and the block itself. Each layer follows the config
  (``_resolve_layer_attention`` in 0.26.0 and later, backported to 0.21.0 by
  the series' ``dflash-drafter-per-layer-attention``): a
  ``sliding_attention`` layer is causal with the config's ``sliding_window``,
  a full layer non-causal; z-lab's reference does the same. A window keeps
  keys with ``q_pos - k_pos < window``. Released 0.21.0 without that patch
  runs every layer non-causal and full (``causal=False`` in
  ``DFlashProposer``, no drafter windows): ``vllm-0.21.0-stock``, kept for
  the drafters trained under it and to measure what the patch changes.
* logits: the target's LM head (Gemma 4 ties it to the embedding table),
  soft-capped with the target's ``final_logit_softcapping`` (patch 0005/0003;
  monotone, so greedy drafts do not depend on it). Draft k (1..K) is the
  argmax at mask k, i.e. at position ``a + k``: each mask predicts the token
  at its own position; the bonus position is not sampled.

Acceptance is defined once, as vLLM counts it: a verify step accepts the
leading drafts equal to the target's greedy tokens; the mean acceptance
length is 1 + accepted drafts per step (the bonus token counts one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

# The number of speculative tokens the proof runs (realshape.NUM_SPECULATIVE_TOKENS).
K_DEFAULT = 15


@dataclass(frozen=True)
class Geometry:
    """What the forward needs from a drafter config.json (make_checkpoints.drafter_config_dict)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    layer_types: tuple[str, ...]
    sliding_window: int | None
    # z-lab's dflash_config.input_embedding_scale: multiplies the target's own embedding scale.
    input_embedding_scale: float = 1.0

    @classmethod
    def from_config(cls, cfg: dict) -> "Geometry":
        dflash = cfg["dflash_config"]
        # 0.33.0's other per-layer knobs (_resolve_layer_attention) are not modelled: refuse them.
        unmodelled = {"use_swa", "causal", "attention_sink_bias", "attention_value_scale"} & set(dflash)
        if unmodelled or "is_causal" in cfg or not cfg.get("is_neox_style", True):
            raise ValueError(f"drafter config sets what the reference does not model: {sorted(unmodelled)}")
        layers = cfg["num_hidden_layers"]
        theta = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 1e6)
        return cls(cfg["hidden_size"], cfg["intermediate_size"], layers, cfg["num_attention_heads"],
                   cfg["num_key_value_heads"], cfg["head_dim"], cfg["rms_norm_eps"], float(theta),
                   tuple(dflash["target_layer_ids"]), dflash["mask_token_id"],
                   tuple(cfg.get("layer_types") or ["full_attention"] * layers),
                   dflash.get("swa_window_size", cfg.get("sliding_window")),
                   float(dflash.get("input_embedding_scale", 1.0)))


@dataclass(frozen=True)
class LayerAttention:
    """Which keys one drafter layer's queries see: a window (None: all) and in-block causality."""

    window: int | None
    causal: bool


# What each vLLM release runs for a drafter config with the series (module docstring).
SEMANTICS = ("vllm-0.21.0", "vllm-0.33.0")
# Released 0.21.0 without dflash-drafter-per-layer-attention: every layer non-causal, unwindowed.
STOCK_0_21_0 = "vllm-0.21.0-stock"
MODELLED = SEMANTICS + (STOCK_0_21_0,)


def layer_attention(geom: Geometry, semantics: str) -> list[LayerAttention]:
    if semantics == STOCK_0_21_0:
        return [LayerAttention(None, False)] * geom.num_layers
    if semantics in SEMANTICS:
        return [LayerAttention(geom.sliding_window, True) if t == "sliding_attention"
                else LayerAttention(None, False) for t in geom.layer_types]
    raise ValueError(f"unknown semantics {semantics!r} (one of {MODELLED})")


# ---------------------------------------------------------------- modules


class RMSNorm(nn.Module):
    """qwen3 / vLLM RMSNorm: normalise in fp32, back to the input dtype, times the weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.to(x.dtype) * self.weight.to(x.dtype)


def rope_tables(positions, d: int, theta: float):
    """cos and sin [..., S, 1, d] (fp32) of the neox rotary embedding at ``positions`` [..., S]."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, device=positions.device, dtype=torch.float32) / d))
    angles = positions.to(torch.float32)[..., None] * inv_freq  # [..., S, d/2]
    angles = torch.cat([angles, angles], -1)[..., None, :]
    return angles.cos(), angles.sin()


def apply_rope(x, tables):
    """Neox-style rotation (vLLM's default for this drafter) of ``x`` [..., S, heads, d], in fp32."""
    cos, sin = tables
    d = x.shape[-1]
    xf = x.float()
    rotated = torch.cat([-xf[..., d // 2:], xf[..., :d // 2]], -1)
    return (xf * cos + rotated * sin).to(x.dtype)


def rope(x, positions, theta: float):
    return apply_rope(x, rope_tables(positions, x.shape[-1], theta))


class DrafterLayer(nn.Module):
    def __init__(self, g: Geometry):
        super().__init__()
        self.g = g
        h, hd = g.hidden_size, g.head_dim
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(h, g.num_heads * hd, bias=False)
        self.self_attn.k_proj = nn.Linear(h, g.num_kv_heads * hd, bias=False)
        self.self_attn.v_proj = nn.Linear(h, g.num_kv_heads * hd, bias=False)
        self.self_attn.o_proj = nn.Linear(g.num_heads * hd, h, bias=False)
        self.self_attn.q_norm = RMSNorm(hd, g.rms_norm_eps)
        self.self_attn.k_norm = RMSNorm(hd, g.rms_norm_eps)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(h, g.intermediate_size, bias=False)
        self.mlp.up_proj = nn.Linear(h, g.intermediate_size, bias=False)
        self.mlp.down_proj = nn.Linear(g.intermediate_size, h, bias=False)
        self.input_layernorm = RMSNorm(h, g.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, g.rms_norm_eps)

    def context_kv(self, ctx, ctx_rope):
        """This layer's K (normed, roped at the context positions) and V of the normed context [B, T, H]."""
        a, g = self.self_attn, self.g
        k = a.k_norm(a.k_proj(ctx).unflatten(-1, (g.num_kv_heads, g.head_dim)))
        v = a.v_proj(ctx).unflatten(-1, (g.num_kv_heads, g.head_dim))
        return apply_rope(k, ctx_rope), v

    def forward(self, h, ctx, ctx_rope, q_pos, q_rope, ctx_visible, attn: LayerAttention):
        """``h`` [B, A, S, H]: A blocks of S tokens; ``q_pos`` [B, A, S]; ``ctx_visible``
        [B, A, S, T] (context keys before each block, windowed); ``*_rope``: rope_tables."""
        a, g = self.self_attn, self.g
        x = self.input_layernorm(h)
        q = a.q_norm(a.q_proj(x).unflatten(-1, (g.num_heads, g.head_dim)))
        kb = a.k_norm(a.k_proj(x).unflatten(-1, (g.num_kv_heads, g.head_dim)))
        vb = a.v_proj(x).unflatten(-1, (g.num_kv_heads, g.head_dim))
        q, kb = apply_rope(q, q_rope), apply_rope(kb, q_rope)
        kc, vc = self.context_kv(ctx, ctx_rope)
        out = block_attention(q, kc, vc, kb, vb, ctx_visible, block_visible(q_pos, attn))
        h = h + a.o_proj(out.flatten(-2))
        x = self.post_attention_layernorm(h)
        return h + self.mlp.down_proj(F.silu(self.mlp.gate_proj(x)) * self.mlp.up_proj(x))


def block_visible(q_pos, attn: LayerAttention):
    """[B, A, S, S]: which of its own block's keys each query sees."""
    diff = q_pos[..., :, None] - q_pos[..., None, :]  # query position - key position
    vis = torch.ones_like(diff, dtype=torch.bool)
    if attn.causal:
        vis &= diff >= 0
    if attn.window is not None:
        vis &= diff < attn.window
        if not attn.causal:  # z-lab's reading of a non-causal window: symmetric
            vis &= -diff < attn.window
    return vis


def context_visible(ctx_pos, q_pos, anchors, attn: LayerAttention):
    """[B, A, S, T]: a query sees the context positions before its block (padding rows carry a
    position past every anchor), within the layer's window."""
    vis = ctx_pos[:, None, None, :] < anchors[:, :, None, None]
    if attn.window is not None:
        vis = vis & (q_pos[..., None] - ctx_pos[:, None, None, :] < attn.window)
    return vis


def block_attention(q, kc, vc, kb, vb, ctx_vis, blk_vis):
    """Softmax attention of block queries over [context keys, own block keys], grouped heads.

    q [B, A, S, nh, d]; kc, vc [B, T, nkv, d]; kb, vb [B, A, S, nkv, d]. Query head h reads
    KV head h // (nh / nkv), as vLLM's kernels (and repeat_interleave) do. Scores and
    softmax in fp32. Every query sees at least itself, so no row is fully masked.
    """
    b, a, s, nh, d = q.shape
    nkv = kc.shape[-2]
    qg = q.unflatten(-2, (nkv, nh // nkv))  # [B, A, S, nkv, g, d]
    scale = d ** -0.5
    s_ctx = torch.einsum("basngd,btnd->bnagst", qg, kc).float() * scale
    s_blk = torch.einsum("basngd,bajnd->bnagsj", qg, kb).float() * scale
    s_ctx = s_ctx.masked_fill(~ctx_vis[:, None, :, None], float("-inf"))
    s_blk = s_blk.masked_fill(~blk_vis[:, None, :, None], float("-inf"))
    p = torch.softmax(torch.cat([s_ctx, s_blk], -1), -1).to(q.dtype)
    t = kc.shape[1]
    out = torch.einsum("bnagst,btnd->basngd", p[..., :t], vc)
    out = out + torch.einsum("bnagsj,bajnd->basngd", p[..., t:], vb)
    return out.flatten(-3, -2)  # [B, A, S, nh, d]


class Drafter(nn.Module):
    """The DFlash drafter. Parameter names are the checkpoint's (make_checkpoints._drafter_tensors),
    so ``state_dict()`` is what vLLM's qwen3_dflash loader reads."""

    def __init__(self, g: Geometry):
        super().__init__()
        self.g = g
        self.fc = nn.Linear(g.hidden_size * len(g.target_layer_ids), g.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        self.layers = nn.ModuleList(DrafterLayer(g) for _ in range(g.num_layers))
        self.norm = RMSNorm(g.hidden_size, g.rms_norm_eps)

    def init_weights(self, std: float = 0.02) -> None:
        """Matrices N(0, std), norms one (call after torch.manual_seed for a seeded init)."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, std)
                else:
                    p.fill_(1.0)

    def forward(self, features, ctx_pos, block_embeds, anchors, attention: list[LayerAttention]):
        """Final hidden states [B, A, S, H] of A blocks per row.

        features [B, T, n_ids * H]: the target's stream after each target layer, per context
        row; ctx_pos [B, T]; block_embeds [B, A, S, H] (scaled embeddings of [bonus, masks]);
        anchors [B, A]: the bonus token's position (block positions anchors + 0..S-1).
        """
        s = block_embeds.shape[2]
        q_pos = anchors[..., None] + torch.arange(s, device=anchors.device)
        if not torch.is_autocast_enabled(features.device.type):
            # Inputs come in the target's dtype (bf16); without autocast the weights' dtype rules.
            features, block_embeds = (t.to(self.fc.weight.dtype) for t in (features, block_embeds))
        ctx = self.hidden_norm(self.fc(features))
        # One rotary table per position set: every layer rotates at the same positions.
        ctx_rope = rope_tables(ctx_pos, self.g.head_dim, self.g.rope_theta)
        q_rope = rope_tables(q_pos, self.g.head_dim, self.g.rope_theta)
        h = block_embeds
        visible = {}
        for layer, attn in zip(self.layers, attention):
            if attn not in visible:
                visible[attn] = context_visible(ctx_pos, q_pos, anchors, attn)
            h = layer(h, ctx, ctx_rope, q_pos, q_rope, visible[attn], attn)
        return self.norm(h)


# ------------------------------------------------------------- embeddings, logits


def block_tokens(bonus, mask_token_id: int, k: int = K_DEFAULT):
    """[..., K + 1] token ids of blocks: each bonus token followed by K mask tokens."""
    masks = torch.full((*bonus.shape, k), mask_token_id, dtype=bonus.dtype, device=bonus.device)
    return torch.cat([bonus[..., None], masks], -1)


def embed(table, ids, scale: float | None):
    """The target's embedding rows times ``scale`` rounded to the table's dtype (as Gemma 4
    and the series apply it); ``scale`` None: the bare table (stock vLLM)."""
    rows = F.embedding(ids, table)
    if scale is None:
        return rows
    return rows * torch.tensor(scale, dtype=table.dtype, device=table.device)


def logits(hidden, head, softcap: float | None):
    """Draft logits (fp32): the target's LM head in the hidden states' dtype, then its final
    soft cap. vLLM caps in bf16; the cap is monotone, so only bf16 ties could pick otherwise."""
    out = (hidden @ head.to(hidden.dtype).T).float()
    if softcap:
        out = torch.tanh(out / softcap) * softcap
    return out


@dataclass(frozen=True)
class Shared:
    """What the drafter takes from the target: embedding table (= LM head for Gemma 4),
    embedding scale and logit soft cap."""

    table: torch.Tensor
    embed_scale: float | None
    softcap: float | None

    @classmethod
    def gemma4(cls, table, text_config: dict) -> "Shared":
        return cls(table, math.sqrt(text_config["hidden_size"]), text_config.get("final_logit_softcapping"))


def draft_logits(drafter: Drafter, shared: Shared, features, ctx_pos, bonus, anchors, semantics: str,
                 k: int = K_DEFAULT):
    """Logits [B, A, K, V] of the K drafts of blocks anchored at ``anchors`` [B, A] with bonus
    tokens ``bonus`` [B, A]: mask j (1..K) predicts the token at anchor + j."""
    ids = block_tokens(bonus, drafter.g.mask_token_id, k)
    scale = None if shared.embed_scale is None else shared.embed_scale * drafter.g.input_embedding_scale
    hidden = drafter(features, ctx_pos, embed(shared.table, ids, scale), anchors,
                     layer_attention(drafter.g, semantics))
    return logits(hidden[:, :, 1:], shared.table, shared.softcap)


# ------------------------------------------------------------------ acceptance


def accepted_length(drafts, greedy) -> int:
    """Drafts a greedy verify step accepts: the leading drafts equal to the target's greedy
    tokens at the same positions (vLLM's rejection sampler at temperature 0)."""
    n = 0
    for d, t in zip(drafts, greedy):
        if d != t:
            break
        n += 1
    return n


def walk(accepted_at, first_anchor: int, max_tokens: int) -> list[int]:
    """Accepted drafts of each verify step of one request, as vLLM runs it alone.

    ``accepted_at(a)``: accepted drafts of the block anchored at position ``a``. The first
    block is anchored at the first generated token (``first_anchor``, one output token
    after prefill); a step that accepts f drafts emits f + 1 tokens (the bonus), so the next
    block starts f + 1 later. A proposal made once ``max_tokens`` tokens exist is never
    verified (tests/gpu/runs/oracle.py ideal_path: the same bookkeeping)."""
    steps, n, a = [], 1, first_anchor
    while n < max_tokens:
        f = accepted_at(a)
        steps.append(f)
        n += f + 1
        a += f + 1
    return steps
