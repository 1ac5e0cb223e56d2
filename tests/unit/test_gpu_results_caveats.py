"""Every results page that reports vLLM 0.33.0 says which torch those rows ran on.

vLLM 0.33.0 pins torch 2.14.0; the GPU host runs 2.11.0, so a 0.33.0 number
here is not what a user of 0.33.0 would measure until it is rerun on 2.14.
"""

from __future__ import annotations

from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[1] / "gpu" / "results"
CAVEAT = "vLLM 0.33.0 rows ran on torch 2.11.0+cu130"
PAGES = sorted(p for p in RESULTS.rglob("*.md") if "| 0.33.0 |" in p.read_text() or "vLLM 0.33.0" in p.read_text())


def test_some_page_reports_0_33_0():
    assert PAGES, "no results page reports vLLM 0.33.0: the caveat check below would check nothing"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_0_33_0_page_carries_the_torch_caveat(page):
    assert CAVEAT in page.read_text()
