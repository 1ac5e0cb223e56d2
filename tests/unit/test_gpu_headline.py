"""Every results page opens with a headline table of at most 8 columns (tests/gpu/reports/headline.py)."""

from __future__ import annotations

import json

from tests.unit.gpu_scripts import GPU_DIR, load

hl = load("headline")
RESULTS = GPU_DIR / "results"
MAX_COLUMNS = 8


def first_table_columns(text: str) -> int | None:
    """The number of columns of the first Markdown table in ``text`` (None: no table)."""
    for line in text.splitlines():
        if line.startswith("|"):
            return line.strip().strip("|").count("|") + 1
    return None


def test_the_column_count_reads_the_first_table_only():
    assert first_table_columns("# t\n\n| a | b |\n|---|---|\n\n| 1 | 2 | 3 |\n") == 2
    assert first_table_columns("# t\n| " + " | ".join("abcdefghi") + " |\n") == 9
    assert first_table_columns("no table\n") is None


def test_every_results_page_opens_with_a_table_of_at_most_8_columns():
    pages = sorted(RESULTS.glob("*.md"))
    assert len(pages) >= 8
    wide = {p.name: first_table_columns(p.read_text()) for p in pages}
    assert all(n is not None and n <= MAX_COLUMNS for n in wide.values()), wide


def test_the_generated_pages_open_with_the_headline_columns():
    header = "| " + " | ".join(hl.COLUMNS) + " |"
    for name in ("realshape.md", "served.md", "fullsize.md", "rejudge.md", "multinode.md"):
        first = next(line for line in (RESULTS / name).read_text().splitlines() if line.startswith("|"))
        assert first == header, name


def test_the_series_cell_counts_states_and_names_one_state_alone():
    stock = {"series": "stock", "vllm": "0.21.0"}
    unrecorded = {"series": None, "vllm": "0.21.0"}
    assert hl.series_cell([stock, stock]) == "stock"
    assert hl.series_cell([stock, unrecorded, unrecorded]) == "unrecorded 2, stock 1"
    assert hl.series_cell([{"series": "0" * 64, "vllm": "0.21.0"}]) == "stale"


def test_the_table_keeps_a_cell_from_splitting_a_row():
    lines = hl.table([("a|b", "0.21.0", "stale", "not proof", 3)])
    assert lines[2] == "| a/b | 0.21.0 | stale | not proof | 3 |" and first_table_columns("\n".join(lines)) == 5


def test_the_served_headline_is_made_from_served_json():
    sr = load("served_report")
    doc = json.loads((RESULTS / "served.json").read_text())
    assert sr.markdown(doc) == (RESULTS / "served.md").read_text()
