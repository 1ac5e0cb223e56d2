"""Speculative-decoding counters from a vLLM server's Prometheus ``/metrics``.

Names as vLLM 0.21.0 registers them (``vllm/v1/spec_decode/metrics.py``,
``SpecDecodingProm``): counters ``vllm:spec_decode_num_drafts``,
``vllm:spec_decode_num_draft_tokens``, ``vllm:spec_decode_num_accepted_tokens``
and ``vllm:spec_decode_num_accepted_tokens_per_pos`` (label ``position``);
prometheus_client exposes each counter as ``<name>_total``. They exist only
when the server runs a drafter. Each has one series per engine; they are
summed. Acceptance is computed on the difference of two scrapes, as
``vllm bench serve`` does: rate = accepted / drafted tokens, mean acceptance
length = 1 + accepted / drafts (the bonus token counted).
"""

from __future__ import annotations

import math
import re
import urllib.request
from dataclasses import dataclass, field

PREFIX = "vllm:spec_decode_"
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos")
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_POSITION = re.compile(r'position="(\d+)"')


@dataclass
class SpecCounters:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position: dict[int, float] = field(default_factory=dict)


def parse(text: str) -> SpecCounters | None:
    """The summed counters, or None when the server exposes none (no drafter)."""
    out = SpecCounters()
    found = False
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if not m or not m.group("name").startswith(PREFIX) or not m.group("name").endswith("_total"):
            continue
        kind = m.group("name")[len(PREFIX):-len("_total")]
        if kind not in COUNTERS:
            continue
        found = True
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        if not math.isfinite(value):
            continue  # a NaN or inf counter says nothing about acceptance: read it as absent
        if kind == "num_drafts":
            out.drafts += value
        elif kind == "num_draft_tokens":
            out.draft_tokens += value
        elif kind == "num_accepted_tokens":
            out.accepted += value
        else:
            pos = _POSITION.search(m.group("labels") or "")
            if pos:
                key = int(pos.group(1))
                out.per_position[key] = out.per_position.get(key, 0.0) + value
    return out if found else None


def scrape(base_url: str, timeout: float = 10.0) -> SpecCounters | None:
    """None when /metrics is absent or has no spec-decode counters."""
    try:
        with urllib.request.urlopen(f"{base_url}/metrics", timeout=timeout) as resp:
            return parse(resp.read().decode("utf-8", "replace"))
    except OSError:
        return None


def acceptance(before: SpecCounters | None, after: SpecCounters | None) -> dict | None:
    """Acceptance over the window between two scrapes; None without a drafter."""
    if before is None or after is None:
        return None
    drafts = after.drafts - before.drafts
    draft_tokens = after.draft_tokens - before.draft_tokens
    accepted = after.accepted - before.accepted
    if not all(math.isfinite(v) for v in (drafts, draft_tokens, accepted)):
        drafts = draft_tokens = accepted = 0.0
    if drafts <= 0 or draft_tokens <= 0:
        return {"drafts": int(drafts), "draft_tokens": int(draft_tokens), "accepted_tokens": int(accepted),
                "acceptance_rate_pct": None, "mean_acceptance_length": None, "per_position_acceptance": []}
    positions = sorted(after.per_position)
    return {
        "drafts": int(drafts),
        "draft_tokens": int(draft_tokens),
        "accepted_tokens": int(accepted),
        "acceptance_rate_pct": 100.0 * accepted / draft_tokens,
        "mean_acceptance_length": 1.0 + accepted / drafts,
        "per_position_acceptance": [
            (after.per_position[p] - before.per_position.get(p, 0.0)) / drafts for p in positions
        ],
    }
