"""Puts every folder of the GPU harness on ``sys.path``, so that its modules import one another by name.

The harness is grouped by concern (tests/gpu/README.md, "The harness, by concern"): ``models/``
(checkpoints, training, references), ``runs/`` (what runs on the GPU host), ``judging/`` (bars,
gate, verdicts), ``reports/`` (records to pages), ``staging/`` (bundles, parts, vLLM trees). A
module starts with ``tests/gpu`` on its path and imports this one; scripts run from any folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
GROUPS = ("models", "runs", "judging", "reports", "staging")

for _group in reversed(GROUPS):
    if str(ROOT / _group) not in sys.path:
        sys.path.insert(0, str(ROOT / _group))
