"""Diagnostic hooks for the NVFP4 + CUDA-graph device-side assert (issue 11).

The real-shape run with the NVFP4 target and CUDA graphs stops with
``index out of bounds: 0 <= tmpNN < 4096``: an Inductor-generated gather
whose table has 4096 rows. In these checkpoints two tables have 4096 rows,
the vocabulary (embedding lookup) and ``max_position_embeddings`` (the
rotary cos/sin cache), in the target and in the drafter alike. Eager mode
runs the same values through kernels without bounds checks, which would hide
the same bad index.

``install(path)`` wraps, in an in-process engine
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), the places where token ids and
positions enter a model forward outside CUDA-graph capture, synchronizes,
and checks them against their tables:

* the target: ``GPUModelRunner._model_forward`` (input_ids, positions);
* the DFlash drafter: ``DFlashProposer.set_inputs_first_pass`` (its inputs:
  next_token_ids, target_positions, query_start_loc, num_rejected) and
  ``build_model_inputs_first_pass`` (what the drafter's graph will read:
  input_ids and query positions up to the padded size, and the context
  positions its KV precompute reads).

Every check is counted; a bad value is written to ``path`` (JSON lines) with
the batch's metadata, and the run goes on, so the assert still fires where
it did and ``CUDA_LAUNCH_BLOCKING=1`` pins its kernel. This is diagnostic
code for the GPU host only; it changes no result.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
import hooks  # noqa: E402

MAX_REPORTS = 40


class _Probe:
    def __init__(self, path: Path, vocab: int, max_positions: int):
        self.path = path
        self.vocab = vocab
        self.max_positions = max_positions
        self.checks = {"target": 0, "drafter": 0}
        self.reports = 0
        self.last_drafter_inputs: dict = {}

    def _write(self, entry: dict) -> None:
        if self.reports >= MAX_REPORTS:
            return
        self.reports += 1
        with self.path.open("a") as fh:
            fh.write(json.dumps(entry) + "\n")

    def summary(self) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps({"summary": True, "checks": self.checks, "reports": self.reports}) + "\n")

    def check(self, where: str, name: str, t, limit: int, extra: dict | None = None) -> bool:
        import torch

        if t is None or t.numel() == 0:
            return True
        flat = t.reshape(-1)
        bad = (flat < 0) | (flat >= limit)
        if not bool(bad.any().item()):
            return True
        idx = torch.nonzero(bad).flatten()[:16].tolist()
        self._write({"where": where, "tensor": name, "limit": limit, "numel": flat.numel(),
                     "bad_count": int(bad.sum().item()), "bad_index": idx,
                     "bad_values": [int(flat[i].item()) for i in idx],
                     "head": flat[:64].tolist(), **(extra or {})})
        return False


def _tolist(t, n: int = 64):
    return None if t is None else t.reshape(-1)[:n].tolist()


def install(path: str | Path, vocab: int, max_positions: int) -> _Probe:
    import atexit

    import torch
    from vllm.v1.spec_decode.dflash import DFlashProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    probe = _Probe(Path(path), vocab, max_positions)
    atexit.register(probe.summary)

    model_forward = GPUModelRunner._model_forward

    def _model_forward(self, input_ids=None, positions=None, *args, **kwargs):
        if not hooks.capturing():
            torch.cuda.synchronize()
            probe.checks["target"] += 1
            probe.check("target", "input_ids", input_ids, probe.vocab)
            probe.check("target", "positions", positions, probe.max_positions)
        return model_forward(self, input_ids, positions, *args, **kwargs)

    set_inputs = DFlashProposer.set_inputs_first_pass

    def set_inputs_first_pass(self, target_token_ids, next_token_ids, target_positions,
                              target_hidden_states, token_indices_to_sample, cad,
                              num_rejected_tokens_gpu):
        out = set_inputs(self, target_token_ids, next_token_ids, target_positions,
                         target_hidden_states, token_indices_to_sample, cad,
                         num_rejected_tokens_gpu)
        torch.cuda.synchronize()
        probe.last_drafter_inputs = {
            "batch_size": cad.batch_size(), "num_context": int(target_token_ids.shape[0]),
            "next_token_ids": _tolist(next_token_ids),
            "query_start_loc": _tolist(cad.query_start_loc),
            "num_rejected": _tolist(num_rejected_tokens_gpu),
            "seq_lens": _tolist(cad.seq_lens),
            "target_positions_min_max": [int(target_positions.min().item()),
                                         int(target_positions.max().item())]
            if target_positions.numel() else None,
        }
        probe.check("drafter-inputs", "next_token_ids", next_token_ids, probe.vocab,
                    probe.last_drafter_inputs)
        return out

    build_inputs = DFlashProposer.build_model_inputs_first_pass

    def build_model_inputs_first_pass(self, num_tokens, num_input_tokens, mm_embed_inputs):
        torch.cuda.synchronize()
        probe.checks["drafter"] += 1
        extra = {"num_tokens": num_tokens, "num_input_tokens": num_input_tokens,
                 **probe.last_drafter_inputs}
        num_context = self._dflash_num_context
        probe.check("drafter", "context_positions", self._context_positions_buffer[:num_context],
                    probe.max_positions, extra)
        out = build_inputs(self, num_tokens, num_input_tokens, mm_embed_inputs)
        kwargs = out[0]
        probe.check("drafter", "input_ids", kwargs.get("input_ids"), probe.vocab, extra)
        probe.check("drafter", "positions", kwargs.get("positions"), probe.max_positions, extra)
        return out

    GPUModelRunner._model_forward = _model_forward
    DFlashProposer.set_inputs_first_pass = set_inputs_first_pass
    DFlashProposer.build_model_inputs_first_pass = build_model_inputs_first_pass
    return probe
