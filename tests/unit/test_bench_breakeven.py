"""`launcher bench --compare-without-drafter`: the measured acceptance beside the committed curve's
break-even for the server's K and concurrency, and a plain warning where the drafter is a loss."""

from __future__ import annotations

import json

from launcher.bench import breakeven, cli


def _table(tmp_path, rows):
    path = tmp_path / "breakeven.json"
    path.write_text(json.dumps({"source": "tests/gpu/results/speedup-curve.json", "rows": rows}))
    return breakeven.load(path)


ROWS = [{"vllm": "0.33.0", "k": 15, "concurrency": 1, "acceptance": 2.6, "status": breakeven.MEASURED,
         "measured_range": [1.1, 15.8]},
        {"vllm": "0.21.0", "k": 15, "concurrency": 1, "acceptance": 2.2, "status": breakeven.MEASURED,
         "measured_range": [1.4, 8.1]},
        {"vllm": "0.33.0", "k": 3, "concurrency": 4, "acceptance": None, "status": breakeven.LOSES,
         "measured_range": [1.0, 3.9]}]


def test_below_the_break_even_the_drafter_is_called_a_loss(tmp_path):
    table = _table(tmp_path, ROWS)
    lines = breakeven.advice(table, k=15, concurrency=1, acceptance=2.32, speedup=1.05, vllm="0.33.0")
    assert len(lines) == 1
    assert "2.32 is below the measured break-even 2.60" in lines[0] and "is a loss here" in lines[0]
    above = breakeven.advice(table, k=15, concurrency=1, acceptance=3.1, speedup=1.4, vllm="0.33.0")
    assert "above the measured break-even 2.60" in above[0] and "loss" not in above[0]
    # the server's own release where the curve has it
    older = breakeven.advice(table, k=15, concurrency=1, acceptance=2.32, speedup=None, vllm="0.21.0")
    assert "above the measured break-even 2.20 (vLLM 0.21.0 curve)" in older[0]


def test_a_measured_loss_is_said_whatever_the_curve(tmp_path):
    lines = breakeven.advice(None, k=15, concurrency=1, acceptance=2.32, speedup=0.79)
    assert "slower (0.79x)" in lines[0] and "is a loss here" in lines[0]
    assert "no measured break-even exists yet" in lines[1]
    loses = breakeven.advice(_table(tmp_path, ROWS), k=3, concurrency=4, acceptance=3.0, speedup=None)
    assert "lost at every acceptance measured, up to 3.90" in loses[0]


def test_no_curve_and_no_point_give_no_number(tmp_path):
    assert breakeven.load(tmp_path / "absent.json") is None
    empty = _table(tmp_path, [])
    assert empty is None
    (line,) = breakeven.advice(empty, k=15, concurrency=1, acceptance=2.32, speedup=1.2)
    assert "no measured break-even exists yet" in line and not any(ch.isdigit() for ch in line.split("acceptance 2.32")[1])
    (other,) = breakeven.advice(_table(tmp_path, ROWS), k=7, concurrency=1, acceptance=2.32, speedup=1.2)
    assert "no points here, so no measured break-even" in other and "2.60" not in other and "2.20" not in other


def test_a_measured_k_and_concurrency_whose_break_even_is_left_out_says_why(tmp_path):
    path = tmp_path / "breakeven.json"
    path.write_text(json.dumps({"rows": ROWS, "left_out": [
        {"vllm": "0.33.0", "k": 15, "concurrency": 4, "why": "the oracle's cost is over the bar"}]}))
    table = breakeven.load(path)
    (line,) = breakeven.advice(table, k=15, concurrency=4, acceptance=3.0, speedup=1.2, vllm="0.33.0")
    assert "states no break-even: the oracle's cost is over the bar (vLLM 0.33.0)" in line
    assert "no points here" not in line and "2.60" not in line
    # another K is still a K the curve has no points at
    (other,) = breakeven.advice(table, k=7, concurrency=4, acceptance=3.0, speedup=1.2)
    assert "no points here" in other


def test_the_server_k_comes_from_its_metrics():
    assert breakeven.speculative_tokens({"drafts": 10, "draft_tokens": 70}) == 7
    assert breakeven.speculative_tokens({"drafts": 0, "draft_tokens": 0}) is None


def test_bench_prints_the_warning_from_the_table_it_finds(tmp_path, monkeypatch):
    path = tmp_path / "breakeven.json"
    path.write_text(json.dumps({"source": "x", "rows": ROWS}))
    monkeypatch.setattr(breakeven, "TABLE", path)
    doc = {"server_vllm": "0.33.0", "num_speculative_tokens": 15,
           "runs": [{"workload": "random", "concurrency": 1, "spec_decode": {"drafts": 100, "draft_tokens": 700}},
                    {"workload": "random", "concurrency": 16, "spec_decode": {"drafts": 100, "draft_tokens": 1500}}],
           "comparison": [{"workload": "random", "concurrency": 1, "mean_acceptance_length": 2.0, "speedup": 1.1},
                          {"workload": "random", "concurrency": 16, "mean_acceptance_length": 2.0, "speedup": 0.9}]}
    lines = cli._break_even_lines(doc)
    # K from /metrics is 7 at c=1: no point there; the recipe's 15 does not stand in for it
    assert "K=7, concurrency 1" in lines[1] and "no measured break-even" in lines[1]
    assert any("slower (0.90x)" in line for line in lines) and any("K=15, concurrency 16" in line for line in lines)
    doc["runs"][0]["spec_decode"] = {"drafts": 100, "draft_tokens": 1500}
    assert "below the measured break-even 2.60" in cli._break_even_lines(doc)[1]


def test_two_workloads_at_one_concurrency_are_told_apart(tmp_path, monkeypatch):
    path = tmp_path / "breakeven.json"
    path.write_text(json.dumps({"source": "x", "rows": ROWS}))
    monkeypatch.setattr(breakeven, "TABLE", path)
    spec = {"drafts": 100, "draft_tokens": 1500}
    doc = {"server_vllm": "0.33.0", "num_speculative_tokens": 15,
           "runs": [{"workload": w, "concurrency": 1, "spec_decode": spec} for w in ("prompts", "random")],
           "comparison": [{"workload": w, "concurrency": 1, "mean_acceptance_length": a, "speedup": 1.2}
                          for w, a in (("prompts", 3.0), ("random", 2.0))]}
    _, first, second = cli._break_even_lines(doc)
    assert first.startswith("  prompts, K=15, concurrency 1: acceptance 3.00")
    assert second.startswith("  random, K=15, concurrency 1: acceptance 2.00")
    doc["comparison"], doc["runs"] = doc["comparison"][:1], doc["runs"][:1]
    assert cli._break_even_lines(doc)[1].startswith("  K=15, concurrency 1:")  # one workload: no name
