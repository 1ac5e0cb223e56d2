"""Load the GPU harness scripts (tests/gpu/*.py, not a package) as modules for CPU tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

GPU_DIR = Path(__file__).resolve().parents[1] / "gpu"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", GPU_DIR / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
