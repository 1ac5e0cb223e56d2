"""What the device-side hooks share (oracle.py, draft_capture.py, input_trace.py, spec_probe.py):
reading a wrapped vLLM method's arguments by name, and knowing when a CUDA graph is being
captured (a hook must not synchronize or copy to the host then)."""

from __future__ import annotations

import inspect


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
