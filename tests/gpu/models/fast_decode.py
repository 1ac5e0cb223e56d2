"""Greedy decoding of the trained Gemma 4 target, one CUDA graph replay per token.

Why: transformers' ``generate`` runs the 30-layer target at about 110-140 ms a token on an
H200 (the step is host-bound: some 150 small kernels a layer launched from Python), so the
sequence-level unlikelihood steps of ``train_target.py`` (96 greedy tokens each) took 13.8 s
a step and 100 of them did not fit a 30-minute GPU budget. The GPU work per token is tiny;
replaying it as one captured graph removes the launch cost.

How: the model's own modules run unchanged; only what depends on host state is replaced.
``StaticKV`` is the cache (``update`` writes at a position held in a device tensor and hands
back the whole buffer), the masks are built on the device from that position (full layers:
causal; sliding layers: also ``q - k < sliding_window``, as transformers' sliding mask), and
the positions are device tensors. Nothing in one decode step reads a value back to the host,
so the step can be captured once and replayed. Sliding layers keep every position in their
buffer and mask the old ones out: the same attention as a rolling window, at a cost that is
nothing at these lengths.

Prompts of different lengths are left-padded; padded key columns are masked and each row's
positions start at its first real token, so a row decodes as it would alone. ``greedy`` falls
back to running the same step eagerly (no graph) on the CPU, which the CPU tests compare with
transformers' ``generate``.
"""

from __future__ import annotations

from dataclasses import dataclass


class StaticKV:
    """A KV cache of fixed shape per layer; the write position is a device tensor."""

    def __init__(self, batch: int, length: int, device, dtype):
        self.batch, self.length, self.device, self.dtype = batch, length, device, dtype
        self.keys: dict[int, object] = {}
        self.values: dict[int, object] = {}
        self.write_at = None  # int64 [q]: the columns the next update writes

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        import torch

        if layer_idx not in self.keys:
            shape = (self.batch, key_states.shape[1], self.length, key_states.shape[-1])
            self.keys[layer_idx] = torch.zeros(shape, device=self.device, dtype=key_states.dtype)
            self.values[layer_idx] = torch.zeros(shape, device=self.device, dtype=value_states.dtype)
        k, v = self.keys[layer_idx], self.values[layer_idx]
        k.index_copy_(2, self.write_at, key_states)
        v.index_copy_(2, self.write_at, value_states)
        return k, v


@dataclass
class _Rows:
    start: object  # int64 [B]: the first real column of each row (left padding before it)
    width: int  # prompt columns (padded)


def _masks(cols, rows: _Rows, length: int, window: int, dtype):
    """Additive masks [B, 1, q, length] for query columns ``cols`` [q] (device)."""
    import torch

    keys = torch.arange(length, device=cols.device)
    q = cols.view(1, -1, 1)
    k = keys.view(1, 1, -1)
    # A padded query column sees itself: a row of nothing but masked keys would softmax to
    # NaN, and its NaN keys and values would reach every real row through the masked sum.
    allowed = ((k <= q) & (k >= rows.start.view(-1, 1, 1))) | (k == q)
    sliding = allowed & (q - k < window)
    neg = torch.finfo(dtype).min

    def additive(ok):
        return torch.zeros(ok.shape, device=cols.device, dtype=dtype).masked_fill(~ok, neg).unsqueeze(1)

    return {"full_attention": additive(allowed), "sliding_attention": additive(sliding)}


def last_logits(text_model, lm_head, ids, cols, rows: _Rows, cache: StaticKV, window: int, dtype):
    """One forward of ``ids`` [B, q] at columns ``cols`` [q]; the head's raw output at the last
    column [B, V] (before the final soft cap)."""
    cache.write_at = cols
    positions = cols.view(1, -1) - rows.start.view(-1, 1)
    hidden = text_model(input_ids=ids, attention_mask=_masks(cols, rows, cache.length, window, dtype),
                        position_ids=positions, past_key_values=cache, use_cache=True).last_hidden_state
    return lm_head(hidden[:, -1])


def _step(text_model, lm_head, ids, cols, rows: _Rows, cache: StaticKV, window: int, dtype):
    """The next token of every row [B]: the final soft cap is monotonic, so the argmax of the
    head's raw output is the model's."""
    return last_logits(text_model, lm_head, ids, cols, rows, cache, window, dtype).argmax(-1)


def left_pad(prompts: list[list[int]], pad: int):
    """(ids [B, W] left-padded, start [B]) as CPU int64 tensors."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    start = torch.empty(len(prompts), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(p)
        start[row] = width - len(p)
    return ids, start


def greedy(model, prompts: list[list[int]], new_tokens: int, *, pad: int = 0, graph: bool | None = None,
           dtype=None) -> tuple[list[list[int]], dict]:
    """``new_tokens`` greedy tokens after each prompt (eos ignored) and how they were decoded.

    ``graph``: capture the decode step as a CUDA graph (default: on CUDA). ``dtype``: the
    activation dtype the masks use (default: the model's parameters').
    """
    import torch

    device = next(model.parameters()).device
    dtype = dtype or next(model.parameters()).dtype
    graph = device.type == "cuda" if graph is None else graph
    text_model = model.model.language_model
    window = text_model.config.sliding_window
    ids, start = left_pad(prompts, pad)
    ids, start = ids.to(device), start.to(device)
    rows = _Rows(start, ids.shape[1])
    length = rows.width + new_tokens
    cache = StaticKV(len(prompts), length, device, dtype)
    out = torch.empty(len(prompts), new_tokens, dtype=torch.long, device=device)
    with torch.no_grad():
        out[:, 0] = _step(text_model, model.lm_head, ids, torch.arange(rows.width, device=device), rows,
                          cache, window, dtype)
        if new_tokens == 1:
            return out.tolist(), {"graph": False}
        # Static inputs of the decode step: the last token and its column.
        last = out[:, :1].clone()
        col = torch.full((1,), rows.width, dtype=torch.long, device=device)
        index = torch.zeros(1, dtype=torch.long, device=device)

        def decode():
            nxt = _step(text_model, model.lm_head, last, col, rows, cache, window, dtype)
            last.copy_(nxt.view(-1, 1))
            col.add_(1)
            index.add_(1)
            out.index_copy_(1, index, nxt.view(-1, 1))

        if not graph:
            for _ in range(new_tokens - 1):
                decode()
            return out.tolist(), {"graph": False}
        # Warm up on a side stream (allocations, lazy cache buffers), then undo its effects.
        saved = (last.clone(), col.clone(), index.clone())
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            decode()
        torch.cuda.current_stream().wait_stream(stream)
        for t, s in zip((last, col, index), saved):
            t.copy_(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            decode()
        # Capture records without running: replay every step, the first included.
        for _ in range(new_tokens - 1):
            g.replay()
        torch.cuda.synchronize()
        return out.tolist(), {"graph": True}
