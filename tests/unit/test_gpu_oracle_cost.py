"""tests/gpu/runs/oracle_cost.py: the real drafter and the oracle timed in turn on one DFlash server.

Stand-ins, because vLLM needs a GPU: the server (a base URL), its timed runs (what
``speedup_curve.measure`` returns, at TPOTs given here) and the server's oracle reading or letting
go of its plan file (the markers the real oracle leaves, ``oracle.adopted_marker`` and
``oracle.dropped_marker``). Real: the run's order, its checks, the plan files, the references
written and read, the record and its summary.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.gpu_scripts import StandInServer, load

cost = load("oracle_cost")
curve = cost.curve
oracle = load("oracle")


class _Server(StandInServer):
    server_id = "one-server"


def _setup(tmp_path, monkeypatch, tpot_of):
    from launcher.bench import workload

    plan = {}
    monkeypatch.setattr(curve, "Server", _Server)
    monkeypatch.setattr(curve.fsv, "server_env", lambda: {"PYTHONPATH": ""})
    monkeypatch.setattr(workload, "vocab_size", lambda model: 32000)
    monkeypatch.setattr(curve, "references_at", lambda base, model, prompts, n, c, timeout=None:
                        [[1000 + i] * n for i in range(len(prompts))])
    timed = []

    def measure(base, model, point, prompts, *, with_drafter, meta, timeout=None, check=None):
        # the warm-up: the server's oracle reads a new plan file, or lets a removed one go
        path = Path(next(iter(plan.values()))) if plan else None
        if path is not None and path.exists():
            curve.oracle_adopted(path).touch()
        elif path is not None:
            oracle.dropped_marker(path).touch()
        check()
        kind = "real_drafter"
        if path is not None and path.exists():
            kind = cost.oracle_kind(json.loads(path.read_text()).get("tail", "reference"))
        timed.append(kind)
        return {"successful": 32, "failed": 0, "output_tok_s": 100.0, "tpot_ms_mean": tpot_of(kind, len(timed)),
                "acceptance": {"mean_acceptance_length": 1.0}, **meta}

    real_plan = curve.point_plan

    def point_plan(path, *a, **kw):
        plan["path"] = path
        return real_plan(path, *a, **kw)

    monkeypatch.setattr(curve, "measure", measure)
    monkeypatch.setattr(curve, "point_plan", point_plan)
    argv = ["--vllm", "0.33.0", "--series-hash", "s" * 64, "--model", str(tmp_path), "--drafter", str(tmp_path),
            "--launcher", "x", "--work", str(tmp_path / "work"), "--refs", str(tmp_path / "refs"),
            "--k", "15", "--concurrency", "4", "--rounds", "3", "--record", str(tmp_path / "cost.json")]
    return argv, timed


def test_the_kinds_alternate_on_one_server_and_the_summary_sets_them_apart(tmp_path, monkeypatch):
    tpot = {"real_drafter": 10.0, "oracle": 10.4, "oracle_drafter_tail": 10.05}
    argv, timed = _setup(tmp_path, monkeypatch, lambda kind, n: tpot[kind] + 0.01 * n)
    assert cost.main(argv) == 0
    assert timed == ["real_drafter", "oracle", "oracle_drafter_tail"] * 3
    rec = json.loads((tmp_path / "cost.json").read_text())
    assert [r["kind"] for r in rec["runs"]] == timed and [r["round"] for r in rec["runs"]] == [1] * 3 + [2] * 3 + [3] * 3
    assert [r.get("tail") for r in rec["runs"][:3]] == [None, "reference", "drafter"]
    assert {r["server"] for r in rec["runs"]} == {"one-server"} and rec["point"]["id"] == "v0.33.0-k15-c4-a1-base"
    s = rec["summary"]
    real = [10.01, 10.04, 10.07]
    assert s["kinds"]["real_drafter"]["tpot_ms_mean"] == pytest.approx(sum(real) / 3)
    assert s["kinds"]["real_drafter"]["spread"] == pytest.approx((10.07 - 10.01) / (sum(real) / 3))
    assert s["costs"]["oracle"] == pytest.approx((10.4 + 0.05) / (10.0 + 0.04) - 1)
    assert s["costs"]["oracle_drafter_tail"] == pytest.approx((10.05 + 0.06) / (10.0 + 0.04) - 1)
    # one tail asked for: two kinds a round
    argv2, timed2 = _setup(tmp_path / "b", monkeypatch, lambda kind, n: tpot[kind])
    (tmp_path / "b").mkdir()
    assert cost.main([*argv2[:-2], "--record", str(tmp_path / "b.json"), "--tails", "reference"]) == 0
    assert timed2 == ["real_drafter", "oracle"] * 3
    with pytest.raises(SystemExit):
        cost.main([*argv2, "--tails", "random"])
    # the references were made on this server before any plan, and the plan names them
    assert json.loads((tmp_path / "refs" / "v0.33.0-k15-c4-base.json").read_text())["made_on"] == "k15"


def test_a_real_drafter_run_after_a_plan_needs_the_oracle_to_have_let_it_go(tmp_path, monkeypatch):
    argv, timed = _setup(tmp_path, monkeypatch, lambda kind, n: 10.0)
    real_measure = curve.measure

    def stubborn(*a, **kw):  # an oracle that never lets its plan go
        monkeypatch.setattr(oracle, "dropped_marker", lambda plan: Path(str(plan) + ".never"))
        return real_measure(*a, **kw)

    monkeypatch.setattr(curve, "measure", stubborn)
    with pytest.raises(RuntimeError, match="still holds its plan"):
        cost.main(argv)
    rec = json.loads((tmp_path / "cost.json").read_text())
    # the second round's real drafter was refused
    assert [r["kind"] for r in rec["runs"]] == ["real_drafter", "oracle", "oracle_drafter_tail"]


def test_the_deadline_stops_between_runs_and_keeps_what_ran(tmp_path, monkeypatch):
    argv, timed = _setup(tmp_path, monkeypatch, lambda kind, n: 10.0)
    clock = iter([10 ** 4] * 6 + [curve.POINT_S - 1] * 100)
    monkeypatch.setattr(curve, "left", lambda args: next(clock))
    assert cost.main(argv) == 3
    rec = json.loads((tmp_path / "cost.json").read_text())
    assert 0 < len(rec["runs"]) < 9 and rec["summary"]["costs"]["oracle"] == pytest.approx(0.0)


def test_the_summary_leaves_out_short_runs_and_a_kind_without_runs():
    runs = [{"kind": "real_drafter", "successful": 32, "output_tok_s": 1.0, "tpot_ms_mean": 10.0,
             "acceptance": {"mean_acceptance_length": 1.0}},
            {"kind": "oracle", "successful": 20, "output_tok_s": 1.0, "tpot_ms_mean": 99.0,
             "acceptance": {"mean_acceptance_length": 1.0}}]
    s = cost.summary(runs)
    assert s["kinds"]["real_drafter"] == {"runs": 1, "tpot_ms_mean": 10.0, "spread": None}
    assert s["kinds"]["oracle"]["runs"] == 0 and s["costs"]["oracle"] is None


def test_the_curves_page_shows_the_record(tmp_path, monkeypatch):
    report = load("speedup_report")
    tpot = {"real_drafter": 10.0, "oracle": 10.4, "oracle_drafter_tail": 10.05}
    argv, _ = _setup(tmp_path, monkeypatch, lambda kind, n: tpot[kind] + (0.1 if n == 1 else 0.0))
    assert cost.main(argv) == 0
    rec = json.loads((tmp_path / "cost.json").read_text())
    lines = "\n".join(report.oracle_cost_lines(rec))
    assert "K 15, concurrency 4 (vLLM 0.33.0), 3 rounds" in lines
    assert "| real_drafter | 3 | 10.03 | 1.0 % | - |" in lines  # 10.1, 10.0, 10.0
    assert "| oracle | 3 | 10.40 | 0.0 % | 3.7 % |" in lines
    assert report.oracle_cost_lines(None) == [] and report.oracle_cost_lines({"runs": []}) == []
