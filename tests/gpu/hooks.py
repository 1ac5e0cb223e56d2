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
