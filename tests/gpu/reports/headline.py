"""The headline table every results page opens with: what, vLLM, series, verdict, key number.

At most 8 columns (tests/unit/test_gpu_headline.py checks every results/*.md); the details follow it.
The series cell says whether the rows ran on the current series (series_now.staleness): ``current``,
``stale``, ``stock`` or ``unrecorded``, with counts where the rows differ.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
import series_now  # noqa: E402

COLUMNS = ("what", "vLLM", "series", "verdict", "key number")


def series_cell(records: list[dict]) -> str:
    """``stale`` where every record is stale, else the counts of each state (``stale 3, current 1``)."""
    counts = Counter(series_now.staleness(r) for r in records)
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{state} {n}" for state, n in counts.most_common())


def table(rows: list[tuple]) -> list[str]:
    """The headline's Markdown lines, a blank line after: one row per (what, vLLM, series, verdict, key)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(c).replace("|", "/") for c in row) + " |" for row in rows]
    return lines + [""]
