"""Import torchvision on a CPU-only test venv, for the subprocess checks that load Gemma 4's processors.

PyPI's torchvision is a CUDA build: its _C cannot load against a CPU torch, and
importing torchvision then fails registering fake kernels for its ops. Gemma
4's processors use only transforms.v2.functional (pure torch), so the op
registrations are stubbed out when, and only when, that happens. The checks
run in subprocesses (a stub must not leak into the test session), which put
this folder on sys.path first.
"""

from __future__ import annotations

import sys
import types


def torchvision_without_ops() -> bool:
    """Import torchvision; True when its op registrations had to be stubbed."""
    try:
        import torchvision  # noqa: F401
        return False
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    for stub in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
        sys.modules[stub] = types.ModuleType(stub)
    import torchvision  # noqa: F401
    return True
