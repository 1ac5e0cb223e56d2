"""Which series a record ran on against the series this checkout holds now (issue 51, item 6).

A record's ``series`` is the hash of the tree it ran (launcher.patching.series.Series.hash, as
the patched tree's stamp recorded it). Its configuration's hash now is the same hash over this
checkout's ``patches/vllm/<version>/series``: the whole series, or for an ablation run
(``revert``) the series less that patch. A record whose hash differs ran on a superseded
series and is stale: its verdicts say nothing of what the current series does.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[3]))  # the launcher, for the series hash
from launcher.patching.series import available_versions, series_for  # noqa: E402

# The patch whose reversal remote.sh's mm_patches_root builds for the random-target mm-prefix
# runs of 0.21.0 (the series less it); realshape._series_of names that tree's hash for them.
TEXT_ONLY_PATCH = "gemma4-text-only-per-layer-attention-backend"


@functools.cache
def current_hash(version: str, without: str | None = None) -> str | None:
    """The current series hash of ``version`` (less patch id ``without``); None when this
    checkout has no series for it or the series has no such patch."""
    if version not in available_versions():
        return None
    series = series_for(version)
    if without is None:
        return series.hash
    kept = [p for p in series.patches if p.id != without]
    if len(kept) == len(series.patches):
        return None
    return dataclasses.replace(series, patches=kept).hash


def current_hashes() -> dict[str, str]:
    """vLLM version -> the current whole-series hash, for every version with a series."""
    return {v: current_hash(v) for v in available_versions()}


def expected_hash(record: dict) -> str | None:
    """The hash a record of this configuration would name if it ran now."""
    version = record.get("vllm")
    if not version:
        return None
    if record.get("revert"):
        return current_hash(version, record["revert"])
    if record.get("mm_prefix") and record.get("target_kind") != "trained" and version == "0.21.0":
        return current_hash(version, TEXT_ONLY_PATCH)
    return current_hash(version)


def staleness(record: dict) -> str:
    """"current", "stale" (ran on another series than the current one), "stock" (no series:
    the unpatched release) or "unrecorded" (the record names no series or no release)."""
    series = record.get("series")
    if series == "stock":
        return "stock"
    if not series or not record.get("vllm"):
        return "unrecorded"
    expected = expected_hash(record)
    return "current" if expected is not None and series == expected else "stale"
