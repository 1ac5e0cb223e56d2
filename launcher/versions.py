"""Installed package versions, read from metadata without importing anything
heavy (importing vllm or torch takes seconds; doctor and dry runs must not)."""

from __future__ import annotations

import re
from importlib import metadata, util
from pathlib import Path

PACKAGES = ("vllm", "torch", "transformers", "flashinfer-python", "flashinfer-cubin", "triton", "nvidia-modelopt")


def installed(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def all_installed() -> dict[str, str | None]:
    return {name: installed(name) for name in PACKAGES}


def torch_cuda() -> str | None:
    """torch's CUDA version, read from torch/version.py's text."""
    spec = util.find_spec("torch")
    if not spec or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "version.py"
    try:
        match = re.search(r"^cuda\s*(?::\s*\S+)?\s*=\s*['\"]([^'\"]+)", path.read_text(), re.M)
    except OSError:
        return None
    return match.group(1) if match else None
