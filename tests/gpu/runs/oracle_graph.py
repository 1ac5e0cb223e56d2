"""The oracle's timed gather as one CUDA graph per batch shape (issue 53): a propose call then costs
the host a few launches, not the 30 or so small operations of ``DeviceDrafts.compute``.

On an H200 host those operations take more than half a millisecond of host time a call, and the
GPU waits on them (results/speedup-oracle-overhead.json). Where a step is short enough for the host
to set its pace (K = 3 at concurrency 1, concurrency 4) that time was part of what the curve's
control measured as the oracle's cost. Here the rows' values are copied into inputs the graph
holds, the graph (the same ``compute``) replays after the real propose, and one ``where`` writes
its drafts over the propose output. A graph is captured the first time a (rows, K, dtype) occurs
under a plan, during a run's warm-up; a plan adopted later, or the proposal counters grown, capture
again. A capture that fails leaves the eager path in place for the rest of the process, said once
on stderr and in the marker beside the watched plan (``oracle.gather_marker``), which the curve
records with each point. Test harness only, like ``oracle.py``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass
class _Inputs:
    """What a graph reads, at one batch size: the rows' values, copied each call, and the rows'
    (plan request, counter slot, prompt length), copied when the batch's requests change."""
    seq: object
    rej: object
    sampled: object
    rows: object
    rows_src: object = None


@dataclass
class _Graph:
    graph: object
    drafts: object  # [rows, k], the output's dtype
    mask: object  # [rows, k]: where the drafts go
    # what the graph reads by address, held so that it outlives the graph (never freed under it)
    tables: object
    steps: object


class GraphedDrafts:
    def __init__(self, device_drafts):
        self.dd = device_drafts
        self.inputs: dict[int, _Inputs] = {}
        self.graphs: dict[tuple, _Graph] = {}
        self.pool = None  # one memory pool for the graphs of one plan (and counters)
        self.captures = 0
        self.failed = None  # the capture's error, once one failed

    def timed(self, req_ids, prompt_of, seq_lens, rejected, sampled, run, k=None):
        """As ``DeviceDrafts.timed``, on a CUDA device: the real propose outside inference mode as
        there, the oracle's own work inside it. Every call is assumed on the stream the engine
        proposes on (one stream: the inputs and outputs are reused call after call)."""
        import torch

        if not req_ids:
            return run()
        with torch.inference_mode():
            inp = self._stage(req_ids, prompt_of, seq_lens, rejected, sampled)
        out = run()
        k = out.shape[-1] if k is None else int(k)
        if k == 0:
            return out
        with torch.inference_mode():
            g = self._graph(len(req_ids), k, out.dtype, seq_lens.device)
            if g is None:  # no graph: this call, and every later one, the eager way
                drafts, use, keep = self.dd.compute(*inp.rows, inp.seq, inp.rej, inp.sampled, k)
                self.dd.write(out, drafts, use, k, keep)
                return out
            g.graph.replay()
            view = out[:len(req_ids), :k]
            torch.where(g.mask, g.drafts, view, out=view)
        return out

    def _stage(self, req_ids, prompt_of, seq_lens, rejected, sampled) -> _Inputs:
        """The rows' values into the inputs of their batch size, before the real propose runs."""
        dd = self.dd
        device = seq_lens.device
        dd.ready(device)
        dd.row_tensors(req_ids, prompt_of, device)  # dd.rows; the counters grown to fit, too
        inp = self._inputs(len(req_ids), device)
        inp.seq.copy_(seq_lens, non_blocking=True)
        if rejected is None:
            inp.rej.zero_()
        else:
            inp.rej.copy_(rejected, non_blocking=True)
        inp.sampled.copy_(sampled, non_blocking=True)
        if inp.rows_src is not dd.rows:  # a new batch of requests
            inp.rows.copy_(dd.rows, non_blocking=True)
            inp.rows_src = dd.rows
        return inp

    def _inputs(self, n: int, device) -> _Inputs:
        import torch

        if n not in self.inputs:
            self.inputs[n] = _Inputs(*(torch.zeros(n, dtype=t, device=device) for t in (torch.long, torch.long, torch.bool)),
                                     torch.zeros(3, n, dtype=torch.long, device=device))
        return self.inputs[n]

    def _graph(self, n: int, k: int, dtype, device) -> _Graph | None:
        """The graph for n rows; a first capture under a plan takes every batch size up to n at
        once, so that a run's tail (fewer rows as requests finish) replays without capturing."""
        if self.failed is not None:
            return None
        dd = self.dd
        # a graph reads the plan's tables and the counters by address: new ones, new graphs (the
        # graphs hold the objects, so an id here is never one a freed object had)
        where = (id(dd.tables), id(dd.steps))
        if (n, k, dtype) + where not in self.graphs:
            self.graphs = {key: g for key, g in self.graphs.items() if key[3:] == where}
            if not self.graphs:
                # Every graph on the pool is gone: its use count is 0, and the allocator asserts
                # when a capture joins such a pool (an H200 run did, "use_count > 0"). A new
                # plan's graphs take a new pool; the old one's blocks go back at the allocator's next release.
                self.pool = None
            try:
                for m in range(1, n + 1):
                    if (m, k, dtype) + where not in self.graphs:
                        self.graphs[(m, k, dtype) + where] = self._capture(self._inputs(m, device), k, dtype, device)
            except Exception as exc:  # noqa: BLE001  (any capture error: keep serving, eagerly)
                self.failed = f"{type(exc).__name__}: {exc}"
                print(f"oracle: CUDA graph capture failed, the eager gather stays: {self.failed}",
                      file=sys.stderr, flush=True)
                return None
        return self.graphs[(n, k, dtype) + where]

    def _capture(self, inp: _Inputs, k: int, dtype, device) -> _Graph:
        """Captured on a side stream: capture runs nothing, so the counters move only on replay.
        ``thread_local``: the engine's other threads may use the GPU meanwhile. No
        ``torch.cuda.graph`` context: its synchronize, gc and empty_cache would stall serving."""
        import torch

        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream(device=device)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
            try:
                drafts, use, keep = self.dd.compute(*inp.rows, inp.seq, inp.rej, inp.sampled, k)
                mask = (use[:, None] if keep is None else use[:, None] & keep).expand(-1, k)
                drafts = drafts.to(dtype)
            finally:
                graph.capture_end()
        torch.cuda.current_stream(device).wait_stream(stream)
        self.captures += 1
        return _Graph(graph, drafts, mask, self.dd.tables, self.dd.steps)
