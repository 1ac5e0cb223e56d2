"""What the device-side hooks share (oracle.py, draft_capture.py, input_trace.py, spec_probe.py):
reading a wrapped vLLM method's arguments by name, and knowing when a CUDA graph is being
captured (a hook must not synchronize or copy to the host then)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass


def capturing() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def argument_reader(method):
    """A function (self, args, kwargs) -> {parameter name: value}, defaults filled in, for calls
    of ``method``: the release's own signature names what a call passed positionally."""
    sig = inspect.signature(method)

    def read(self, args: tuple, kwargs: dict) -> dict:
        bound = sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        return bound.arguments

    return read


def hand_runner_to_drafter(runner_cls, method: str = "propose_draft_token_ids") -> None:
    """vLLM 0.21.0's V1 proposer keeps no reference to its model runner, whose input batch
    maps its rows to requests: wrap the runner's ``method`` (once per class, however many
    hooks ask) so that each call leaves the runner on its drafter and the step's scheduler
    output on the runner. ``runner_of`` reads them back."""
    if getattr(runner_cls, "_hooks_hands_runner", False):
        return
    orig = getattr(runner_cls, method)

    def wrapper(self, scheduler_output, *args, **kwargs):
        self._hooks_scheduler_output = scheduler_output
        self.drafter._hooks_runner = self
        return orig(self, scheduler_output, *args, **kwargs)

    setattr(runner_cls, method, wrapper)
    runner_cls._hooks_hands_runner = True


def runner_of(drafter):
    """The model runner that called this drafter (hand_runner_to_drafter), or None."""
    return getattr(drafter, "_hooks_runner", None)


@dataclass
class ProposeBatch:
    """One DFlash propose call's rows, read before the real propose runs (it edits seq_lens
    in place): row i is request ``req_ids[i]``; ``rejected``: drafts its last verify
    rejected; ``sampled``: that step sampled a token for it (False: a prefill chunk that is
    not the last); ``bonus``: the token that step sampled, the drafter's first input."""

    req_ids: list[str]
    rejected: list[int]
    sampled: list[bool]
    bonus: list[int]


def v1_batch(runner, a: dict) -> ProposeBatch:
    """0.21.0: ``DFlashProposer.propose``'s bound arguments ``a`` and the model runner
    that called it (``runner_of``): rows follow ``runner.input_batch.req_ids``."""
    req_ids = list(runner.input_batch.req_ids)
    n = len(req_ids)
    rej = a.get("num_rejected_tokens_gpu")
    mask = getattr(getattr(runner, "discard_request_mask", None), "np", None)
    return ProposeBatch(req_ids, rej[:n].tolist() if rej is not None else [0] * n,
                        [not bool(mask[i]) if mask is not None else True for i in range(n)],
                        a["next_token_ids"][:n].tolist())


def v2_batch(a: dict) -> ProposeBatch:
    """0.33.0: ``DFlashSpeculator.propose``'s bound arguments. ``last_sampled`` is the
    request state's ``last_sampled_tokens``, one column per state slot
    (``(max_num_reqs, 1)``), indexed through ``input_batch.idx_mapping``."""
    ib = a["input_batch"]
    n = ib.num_reqs
    return ProposeBatch(list(ib.req_ids)[:n], a["num_rejected"][:n].tolist(),
                        [x > 0 for x in a["num_sampled"][:n].tolist()],
                        a["last_sampled"][ib.idx_mapping[:n]].reshape(-1).tolist())
