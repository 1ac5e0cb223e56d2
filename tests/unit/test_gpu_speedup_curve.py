"""Issue 53's CPU side: the frozen step-time model and its order before the curve, the curve's grid,
batches and resumption, break-even interpolation against the frozen prediction, the report."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from tests.unit.gpu_scripts import GPU_DIR, StandInServer, load

bars = load("bars")
sg = load("speedup_grid")
srec = load("speedup_record")
sm = load("speedup_model")
report = load("speedup_report")
oracle = load("oracle")
png_plot = load("png_plot")
REPO = GPU_DIR.parents[1]


# ------------------------------------------------------------------ the frozen model


def _steps(tokens: int, step_ms: float, propose_ms: float | None = None, n: int = 12) -> list[dict]:
    out = []
    for i in range(n):
        s = {"forward_tokens": tokens, "step_ms": step_ms, "t": 100.0 + 0.01 * i}
        if propose_ms is not None:
            s["propose_ms"] = propose_ms
        out.append(s)
    return out


META = {"series": "s" * 64, "date": "2030-01-01", "gpu": "H200", "vllm": "0.33.0", "bars": "b" * 40}


def _frozen(decode=(3.0, 3.6), verify_base=4.0, per_k=0.1, draft=0.5) -> dict:
    dec = _steps(1, decode[0]) + _steps(4, decode[1])
    ver = {k: _steps(k + 1, verify_base + per_k * k, draft) + _steps(4 * (k + 1), verify_base + 1 + per_k * k, draft)
           for k in sm.KS}
    return sm.frozen_record(dec, ver, meta=META)


def test_the_frozen_record_holds_decode_verify_and_draft_and_predicts_from_them_alone():
    rec = _frozen()
    assert sm.missing(rec) == []
    # K = 7 at concurrency 1: verify = step - propose = 4.7 - 0.5 = 4.2, draft 0.5, decode 3.0
    assert sm.times(rec, 7, 1) == pytest.approx((3.0, 0.5, 4.2))
    assert sm.break_even(rec, 7, 1) == pytest.approx((0.5 + 4.2) / 3.0)
    assert sm.predict(rec, 3.0, 7, 1) == pytest.approx(3.0 * 3.0 / 4.7)
    # K = 15 at concurrency 4: step 4.0 + 1 + 1.5 = 6.5, verify 6.5 - 0.5, draft 0.5, decode 3.6
    assert sm.break_even(rec, 15, 4) == pytest.approx((0.5 + 6.0) / 3.6)
    # the host's step period is kept beside (10 ms between the synthetic steps)
    assert rec["decode"]["1"]["period_ms"] == pytest.approx(10.0)


def test_a_frozen_record_without_a_k_or_its_meta_is_incomplete():
    rec = sm.frozen_record(_steps(1, 3.0) + _steps(4, 3.5), {3: _steps(4, 4.0, 0.5)}, meta={**META, "gpu": None})
    gaps = sm.missing(rec)
    assert "gpu" in gaps and "verify K=7 c=1" in gaps and "draft K=15 c=4" in gaps and "verify K=3 c=4" in gaps
    assert "verify K=3 c=1" not in gaps
    with pytest.raises(KeyError):
        sm.break_even(rec, 7, 1)


# ------------------------------------------------------------------ frozen before the curve (git)


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _repo(tmp_path):
    repo = tmp_path / "r"
    (repo / "tests" / "gpu" / "results").mkdir(parents=True)
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@t")
    _git(repo, "config", "user.name", "t")
    return repo


def _commit(repo, msg):
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", msg)


def _write(repo, rel, data):
    (repo / rel).write_text(json.dumps(data))


def test_the_frozen_record_must_be_committed_before_the_curve_that_names_it(tmp_path):
    repo = _repo(tmp_path)
    _write(repo, srec.FROZEN_PATH, _frozen())
    _commit(repo, "frozen")
    blob = bars.blob_hash(repo / srec.FROZEN_PATH)
    _write(repo, srec.CURVE_PATH, {"frozen": {"blob": blob}, "points": {}})
    assert srec.frozen_order(repo) == []  # not committed yet: the frozen one already is
    _commit(repo, "curve batch 1")
    assert srec.frozen_order(repo) == []
    # the frozen record measured again after the curve started: the curve names a stale version
    _write(repo, srec.FROZEN_PATH, _frozen(decode=(2.0, 2.5)))
    _commit(repo, "frozen again")
    problems = srec.frozen_order(repo)
    assert len(problems) == 1 and "names frozen record" in problems[0]


def test_a_frozen_record_committed_with_the_curve_is_out_of_order(tmp_path):
    repo = _repo(tmp_path)
    _write(repo, srec.FROZEN_PATH, _frozen())
    _write(repo, srec.CURVE_PATH, {"frozen": {"blob": bars.blob_hash(repo / srec.FROZEN_PATH)}})
    _commit(repo, "both at once")
    assert any("committed with the curve" in p for p in srec.frozen_order(repo))


def test_a_curve_naming_no_frozen_record_or_an_uncommitted_one_fails(tmp_path):
    repo = _repo(tmp_path)
    _write(repo, srec.CURVE_PATH, {"points": {}})
    assert srec.frozen_order(repo) == [f"{srec.CURVE_PATH} names no frozen record"]
    _write(repo, srec.FROZEN_PATH, _frozen())
    _write(repo, srec.CURVE_PATH, {"frozen": {"blob": bars.blob_hash(repo / srec.FROZEN_PATH)}})
    assert any("never committed" in p for p in srec.frozen_order(repo))


def test_the_committed_curve_names_the_committed_frozen_record_made_before_it():
    assert srec.frozen_order(REPO) == []
    if (REPO / srec.CURVE_PATH).is_file():  # once committed, the frozen record is there too
        assert (REPO / srec.FROZEN_PATH).is_file()


# ------------------------------------------------------------------ the grid


def _measure(successful=32, tok_s=100.0, acceptance=None, series="s" * 64, tpot=10.0):
    m = {"successful": successful, "failed": 0, "output_tok_s": tok_s, "tpot_ms_mean": tpot, "series": series}
    if acceptance is not None:
        m["acceptance"] = {"mean_acceptance_length": acceptance}
    return m


def _full_record(points=None, **kw) -> dict:
    """Every point measured; each planned-1.0 plain point with its control from the same server."""
    rec = {"frozen": {"blob": "f" * 40}, "points": {}}
    for p in (sg.GRID if points is None else points):
        srec.put(rec, p, "baseline", _measure(**kw))
        srec.put(rec, p, "dflash", {**_measure(acceptance=p.level, **kw), "server": "srv"})
        if p.level == 1.0 and p.variant == "base":
            rec.setdefault("oracle_controls", {})[srec.control_key(p)] = {**_measure(acceptance=1.0), "server": "srv"}
    return rec


def test_the_grid_covers_every_k_and_concurrency_up_to_k_plus_one_with_the_spot_check_and_variants():
    assert srec.grid_problems(_full_record()) == []
    main = [p for p in sg.GRID if p.vllm == "0.33.0" and p.variant == "base"]
    for k in (3, 7, 15):
        for c in (1, 4):
            levels = [p.level for p in main if (p.k, p.concurrency) == (k, c)]
            assert len(levels) >= 4 and max(levels) == k + 1 and min(levels) == 1
    assert {p.variant for p in sg.GRID} == {"base", "logprobs", "long"}
    assert [p for p in sg.GRID if p.variant == "long"][0].input_len >= 2000
    assert [p for p in sg.GRID if p.variant == "logprobs"][0].extra == {"logprobs": 2}
    spot = [p for p in sg.GRID if p.vllm == "0.21.0"]
    assert spot and {(p.k, p.concurrency) for p in spot} == {(15, 1)}
    assert all(p.requests >= 32 for p in sg.GRID)
    assert len({p.id for p in sg.GRID}) == len(sg.GRID)


def test_grid_gaps_are_named_missing_points_short_runs_stale_series_and_thin_levels():
    full = _full_record()
    gone = sg.GRID[5]
    del full["points"][gone.id]
    short = sg.GRID[9]
    full["points"][short.id]["dflash"]["successful"] = 31
    problems = srec.grid_problems(full, current_series=lambda v: "s" * 64)
    assert any(p.startswith(gone.id) for p in problems) and any(p.startswith(short.id + ": dflash") for p in problems)
    assert len(problems) == 3  # baseline and dflash of the gone point, the short run
    stale = srec.grid_problems(_full_record(series="old"), current_series=lambda v: "s" * 64)
    assert len(stale) == 2 * len(sg.GRID)
    thin = [sg.Point("0.33.0", 7, 1, level) for level in (1.0, 2.0, 8.0)]
    assert any("fewer than 4" in p for p in srec.grid_problems(_full_record(thin), thin))
    low = [sg.Point("0.33.0", 7, 1, level) for level in (1.0, 2.0, 3.0, 4.0)]
    assert any("not up to K + 1" in p for p in srec.grid_problems(_full_record(low), low))


def test_each_level_is_made_by_a_first_wrong_pattern_whose_mean_acceptance_is_the_level():
    for p in sg.GRID:
        cycle = sg.f_cycle(p.level, p.k)
        assert sg.planned_acceptance(cycle) == p.level and all(0 <= f <= p.k for f in cycle)
    assert sg.f_cycle(2.5, 7) == [1, 2] and sg.f_cycle(16.0, 15) == [15]
    with pytest.raises(ValueError):
        sg.f_cycle(5.0, 3)
    # the oracle follows the pattern, not its permutation, when the plan request has one
    req = {"f_cycle": [1, 2]}
    assert [oracle.planned_first_wrong(req, 0, 0, s, 7) for s in range(4)] == [1, 2, 1, 2]
    assert oracle.planned_first_wrong({}, 0, 0, 0, 7) == oracle.first_wrong(0, 0, 0, 7)


def test_the_oracle_with_its_log_off_writes_nothing_and_drafts_the_same(tmp_path):
    ref = list(range(100, 200))
    plan = {"k": 3, "seed": 0, "vocab_size": 1000, "requests": [{"prompt": [1, 2], "reference": ref,
                                                                  "max_tokens": 50, "f_cycle": [1]}]}
    row = oracle.Row("r", (1, 2), seq_len=2 + 4, num_rejected=0, drafts=0)
    logged = oracle.Oracle(plan, tmp_path / "log.jsonl").step([row], 3)
    quiet = oracle.Oracle(plan, None).step([row], 3)
    assert logged == quiet and (tmp_path / "log.jsonl").is_file()
    # n = 5 outputs; f = 1: the first draft is the reference's, the second is wrong
    assert quiet[0][0] == ref[5] and quiet[0][1] != ref[6]
    assert oracle.LOG_OFF == "off"


# ------------------------------------------------------------------ batches and resumption


def test_batches_hold_every_point_once_server_by_server_baselines_first():
    bs = sg.batches()
    ids = [p.id for b in bs if b.server == "nodrafter" for p in b.points]
    # the second oracle's points beside the plain ones on both kinds of server: without the
    # drafter for a baseline where their plain twins' was measured on another GPU
    assert sorted(ids) == sorted(p.id for p in sg.GRID + sg.TAIL_POINTS)
    dflash = [p.id for b in bs if b.server != "nodrafter" for p in b.points]
    assert sorted(dflash) == sorted(p.id for p in sg.GRID + sg.TAIL_POINTS)
    assert {p.id for p in sg.TAIL_POINTS}.isdisjoint({p.id for p in sg.GRID})
    assert all(b.server == f"k{p.k}" for b in bs if b.server != "nodrafter" for p in b.points)
    # as few server starts as the lanes allow: 0.33.0's points without the drafter in two batches
    # of whole Ks (one for each GPU of a two-GPU host), 0.21.0's four in one, a batch per K
    # the recipes' K first: a run cut by its deadline has measured what the recipes use
    assert [(b.vllm, b.server) for b in bs] == [("0.33.0", "nodrafter")] * 2 + [
        ("0.33.0", "k15"), ("0.33.0", "k7"), ("0.33.0", "k3"), ("0.21.0", "nodrafter"), ("0.21.0", "k15")]
    assert [sorted({p.k for p in b.points}) for b in bs[:2]] == [[15], [3, 7]]  # 22 points against 28
    assert sum(len(b.points) for b in bs[:2]) == sum(p.vllm == "0.33.0" for p in sg.GRID + sg.TAIL_POINTS)
    for vllm in ("0.33.0", "0.21.0"):
        mine = [b for b in bs if b.vllm == vllm]
        first_dflash = next(i for i, b in enumerate(mine) if b.server != "nodrafter")
        assert all(b.server == "nodrafter" for b in mine[:first_dflash])


def test_a_rerun_measures_only_what_the_saved_record_lacks(tmp_path):
    frozen = tmp_path / "speedup-frozen.json"
    frozen.write_text(json.dumps(_frozen()))
    path = tmp_path / "speedup-curve.json"
    record = srec.load(path, frozen)
    assert record["frozen"]["blob"] == bars.blob_hash(frozen) and record["points"] == {}
    batch = sg.batches(sg.GRID)[0]
    refs = set()
    has_ref = lambda p: p.id in refs  # noqa: E731
    assert srec.pending(batch, record, has_ref) == list(batch.points)
    # the first three points' baselines and references, then the batch is cut
    for p in batch.points[:3]:
        srec.put(record, p, "baseline", _measure())
        refs.add(p.id)
    srec.save(record, path)
    again = srec.load(path, frozen)
    assert srec.pending(batch, again, has_ref) == list(batch.points[3:])
    # a fresh machine without the references: those still needing DFlash are measured again for them
    assert srec.pending(batch, again, lambda p: False) == list(batch.points)
    # a DFlash batch of K: only points without a valid DFlash run; a short run counts as missing
    kb = next(b for b in sg.batches(sg.GRID) if b.server == "k3")
    srec.put(again, kb.points[0], "dflash", {**_measure(acceptance=1.0), "server": "srv"})
    again.setdefault("oracle_controls", {})[srec.control_key(kb.points[0])] = {**_measure(acceptance=1.0), "server": "srv"}
    srec.put(again, kb.points[1], "dflash", _measure(successful=20, acceptance=1.5))
    srec.put(again, kb.points[2], "dflash", _measure())  # no acceptance read
    assert srec.pending(kb, again, has_ref) == list(kb.points[1:])


def test_lanes_share_the_batches_and_their_records_merge_into_the_curve(tmp_path):
    curve = load("speedup_curve")
    mine = [b for b in sg.batches(sg.GRID) if b.vllm == sg.MAIN_VLLM]
    lanes = [curve.lane_batches(mine, f"{i}/2") for i in range(2)]
    assert sorted(b.id for lane in lanes for b in lane) == sorted(b.id for b in mine)  # each batch once
    assert not {b.id for b in lanes[0]} & {b.id for b in lanes[1]}
    assert all(lane[0].server == "nodrafter" for lane in lanes)  # references before drafts in each lane
    # each DFlash batch in the lane that made its references: no lane waits on the other
    for lane in lanes:
        made = {p.id for b in lane if b.server == "nodrafter" for p in b.points}
        assert all(p.id in made for b in lane if b.server != "nodrafter" for p in b.points)
    assert [[b.server for b in lane] for lane in lanes] == [["nodrafter", "k15"], ["nodrafter", "k7", "k3"]]
    assert curve.lane_batches(mine, None) == mine
    with pytest.raises(ValueError, match="0 <= I < N"):
        curve.lane_batches(mine, "2/2")
    frozen = tmp_path / "speedup-frozen.json"
    frozen.write_text(json.dumps(_frozen()))
    record = srec.new(frozen)
    a, b = mine[0].points[0], mine[1].points[0]
    srec.put(record, a, "baseline", _measure(successful=20))  # short: counts as missing
    lane0, lane1 = json.loads(json.dumps(record)), json.loads(json.dumps(record))
    srec.put(lane0, a, "baseline", _measure())
    lane0["batches"].append({"id": mine[0].id, "measured": [a.id]})
    srec.put(lane1, b, "baseline", _measure())
    srec.put(lane1, a, "baseline", _measure(successful=10))  # invalid: never replaces a valid one
    lane1["batches"].append({"id": mine[1].id, "measured": [b.id]})
    for lane in (lane0, lane1, lane0):
        srec.merge(record, lane)
    assert srec.missing(record, a) == ["dflash"] and srec.missing(record, b) == ["dflash"]
    assert [x["id"] for x in record["batches"]] == [mine[0].id, mine[1].id]  # a lane merged twice adds once
    with pytest.raises(ValueError, match="another frozen record"):
        srec.merge(record, {**lane0, "frozen": {"blob": "0" * 40}})


def test_a_run_on_two_gpus_starts_a_lane_each_with_its_own_record_and_port(tmp_path):
    curve = load("speedup_curve")
    argv = ["run", "--vllm", "0.33.0", "--gpus", "0,1", "--commit", "--record", "r.json", "--port=8021", "--batches", "2"]
    cmds = curve.lane_commands(argv, ["0", "1"], tmp_path, 8021)
    assert [env for _, env in cmds] == [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]
    for i, (cmd, _) in enumerate(cmds):
        assert "--gpus" not in cmd and "--commit" not in cmd and "r.json" not in cmd
        assert cmd[cmd.index("--lane") + 1] == f"{i}/2" and cmd[cmd.index("--port") + 1] == str(8021 + 10 * i)
        assert cmd[cmd.index("--record") + 1] == str(tmp_path / f"speedup-curve-lane-{i}.json")
        assert cmd[cmd.index("--batches") + 1] == "2" and cmd[cmd.index("run") + 1] == "--vllm"


def test_run_lanes_merges_what_each_lane_measured_into_the_curve(tmp_path, monkeypatch):
    # The lanes themselves need a GPU and a server: a stand-in process writes what a lane leaves,
    # its record with one point measured (vLLM and the servers cannot exist here).
    curve = load("speedup_curve")
    frozen = tmp_path / "speedup-frozen.json"
    frozen.write_text(json.dumps(_frozen()))
    points = [b.points[0] for b in sg.batches(sg.GRID)[:2]]

    class Lane:
        def __init__(self, cmd, env):
            self.record, self.lane = Path(cmd[cmd.index("--record") + 1]), int(cmd[cmd.index("--lane") + 1][0])
            self.gpu = env["CUDA_VISIBLE_DEVICES"]

        def wait(self):
            rec = json.loads(self.record.read_text()) if self.record.is_file() else srec.new(frozen)
            srec.put(rec, points[self.lane], "baseline", _measure())
            srec.save(rec, self.record)
            return self.lane  # lane 1 "fails": its exit code is the run's

    monkeypatch.setattr(curve.subprocess, "Popen", Lane)
    args = type("A", (), {"gpus": "0,1", "work": tmp_path, "port": 8021, "record": tmp_path / "curve.json",
                          "frozen": frozen, "commit": False, "vllm": "0.33.0", "lane_dir": None})()
    assert curve.run_lanes(args, ["run", "--vllm", "0.33.0", "--gpus", "0,1"]) == 1
    merged = json.loads((tmp_path / "curve.json").read_text())
    assert all(srec.missing(merged, p) == ["dflash"] for p in points)


def test_a_record_started_from_another_frozen_model_is_refused(tmp_path):
    frozen = tmp_path / "speedup-frozen.json"
    frozen.write_text(json.dumps(_frozen()))
    path = tmp_path / "speedup-curve.json"
    srec.save(srec.new(frozen), path)
    frozen.write_text(json.dumps(_frozen(decode=(2.0, 2.0))))
    with pytest.raises(ValueError, match="frozen model it started from"):
        srec.load(path, frozen)


# ------------------------------------------------------------------ break-even


def _curve_with(speedup_of, points, control_tpot=10.0) -> dict:
    """Points whose speed-up is ``speedup_of(point)``, TPOT 10 ms with the drafter, and the real
    drafter's control of each release, K and concurrency at ``control_tpot`` (None: no control)."""
    rec = {"frozen": {"blob": "f" * 40}, "points": {}}
    for p in points:
        srec.put(rec, p, "baseline", _measure(tok_s=100.0))
        srec.put(rec, p, "dflash", {**_measure(tok_s=100.0 * speedup_of(p), acceptance=p.level + 0.1), "server": "srv"})
        if control_tpot is not None and p.level == 1.0:
            rec.setdefault("oracle_controls", {})[srec.control_key(p)] = {
                **_measure(acceptance=1.1, tpot=control_tpot), "server": "srv"}
    return rec


def test_break_even_is_interpolated_on_measured_acceptance_and_compared_with_the_frozen_one():
    frozen = _frozen()  # K=7, c=1: predicted break-even 4.7 / 3.0
    pts = [sg.Point("0.33.0", 7, 1, level) for level in (1.0, 2.0, 3.0, 4.0, 8.0)]
    # speed-up linear in measured acceptance (level + 0.1): 1 at measured 1.6 exactly
    rec = _curve_with(lambda p: (p.level + 0.1) / 1.6, pts)
    row = report.break_evens(report.point_rows(rec), frozen)[0]
    assert row["break_even"] == pytest.approx(1.6) and row["status"] == "measured"
    assert row["predicted"] == pytest.approx(4.7 / 3.0)
    assert row["relative_gap"] == pytest.approx(abs(1.6 - 4.7 / 3.0) / (4.7 / 3.0)) and not row["over_bar"]
    # a break-even at measured 2.6: beyond the 15 % bar
    far = report.break_evens(report.point_rows(_curve_with(lambda p: (p.level + 0.1) / 2.6, pts)), frozen)[0]
    assert far["break_even"] == pytest.approx(2.6) and far["over_bar"]


def test_interpolation_between_points_and_without_a_crossing():
    from launcher.bench import breakeven

    # 0.8 at 1.5, 1.2 at 2.5: the line crosses 1 at 2.0
    assert breakeven.interpolate([(2.5, 1.2), (1.5, 0.8)])["acceptance"] == pytest.approx(2.0)
    # 0.5 at 1, 0.9 at 2, 1.9 at 3: between 2 and 3, at 2.1
    assert breakeven.interpolate([(1, 0.5), (2, 0.9), (3, 1.9)])["acceptance"] == pytest.approx(2.1)
    gains = breakeven.interpolate([(1.2, 1.1), (2, 1.5)])
    assert gains["acceptance"] is None and gains["status"] == breakeven.GAINS
    loses = breakeven.interpolate([(1.2, 0.3), (2, 0.7)])
    assert loses["acceptance"] is None and loses["status"] == breakeven.LOSES and loses["measured_range"] == [1.2, 2]


# ------------------------------------------------------------------ report, chart, launcher table


def test_the_report_opens_with_a_headline_of_at_most_8_columns_and_flags_the_gap():
    frozen = _frozen()
    pts = [sg.Point("0.33.0", 7, 1, level) for level in (1.0, 2.0, 3.0, 4.0, 8.0)]
    md = report.markdown(_curve_with(lambda p: (p.level + 0.1) / 2.6, pts), frozen)
    first = next(line for line in md.splitlines() if line.startswith("|"))
    assert first == "| what | vLLM | series | verdict | key number |"
    assert "over the 15 % bar" in md and "**over the bar**" in md and "2.60 measured / 1.57 frozen" in md
    # most of the grid is missing: counted in points, not in problems (two phases a point)
    assert f"{len(sg.GRID) - len(pts)} points missing" in md


def test_a_break_even_whose_oracle_costs_time_or_was_not_controlled_is_not_stated():
    frozen = _frozen()
    pts = [sg.Point("0.33.0", 7, 1, level) for level in (1.0, 2.0, 3.0, 4.0, 8.0)]
    held = _curve_with(lambda p: (p.level + 0.1) / 1.6, pts, control_tpot=9.8)  # 2 % slower: within 3 %
    cost = report.oracle_costs(held)[("0.33.0", 7, 1, "reference")]
    assert cost["cost"] == pytest.approx(10.0 / 9.8 - 1) and cost["holds"] is True
    assert [r["acceptance"] for r in report.launcher_table(held, frozen)["rows"]] == [pytest.approx(1.6)]
    over = _curve_with(lambda p: (p.level + 0.1) / 1.6, pts, control_tpot=9.0)  # 11 % slower
    assert report.oracle_costs(over)[("0.33.0", 7, 1, "reference")]["holds"] is False
    assert report.launcher_table(over, frozen)["rows"] == []
    over_md = report.markdown(over, frozen)
    assert "oracle cost over the bar" in over_md and "not stated (the points read 1.60), 1.57 frozen" in over_md
    assert "| 0.33.0 | 7 | 1 | 1.60 (measured)" not in over_md
    drift = _curve_with(lambda p: (p.level + 0.1) / 1.6, pts, control_tpot=10.0)
    drift["oracle_controls"]["v0.33.0-k7-c1"]["acceptance"]["mean_acceptance_length"] = 1.2  # 0.1 off
    assert report.oracle_costs(drift)[("0.33.0", 7, 1, "reference")]["holds"] is False
    apart = _curve_with(lambda p: (p.level + 0.1) / 1.6, pts, control_tpot=10.0)
    apart["oracle_controls"]["v0.33.0-k7-c1"]["server"] = "another"  # not a pair
    assert report.oracle_costs(apart) == {}
    bare = _curve_with(lambda p: (p.level + 0.1) / 1.6, pts, control_tpot=None)
    assert report.oracle_costs(bare) == {} and report.launcher_table(bare, frozen)["rows"] == []
    assert "oracle cost unmeasured" in report.markdown(bare, frozen)


def test_where_the_plain_oracle_costs_time_the_second_oracle_states_the_break_even_beside_the_miss():
    frozen = _frozen()
    plain = [sg.Point("0.33.0", 7, 1, level) for level in (1.0, 2.0, 3.0, 4.0, 8.0)]
    second = [sg.Point("0.33.0", 7, 1, level, sg.TAIL_VARIANT) for level in (1.0, 2.0, 3.0, 4.0, 8.0)]
    rec = _curve_with(lambda p: (p.level + 0.1) / 1.6, plain, control_tpot=9.0)  # 11 % slower: over
    tail = _curve_with(lambda p: (p.level + 0.1) / 1.5, second, control_tpot=9.8)  # 2 %: within
    rec["points"].update(tail["points"])
    rec["oracle_controls"].update(tail["oracle_controls"])
    assert sorted(rec["oracle_controls"]) == ["v0.33.0-k7-c1", "v0.33.0-k7-c1-dtail"]
    costs = report.oracle_costs(rec)
    assert costs[("0.33.0", 7, 1, "reference")]["holds"] is False and costs[("0.33.0", 7, 1, "drafter")]["holds"] is True
    table = report.launcher_table(rec, frozen)
    assert [(r["oracle"], r["acceptance"]) for r in table["rows"]] == [("drafter", pytest.approx(1.5))]
    assert table["left_out"] == []
    md = report.markdown(rec, frozen)
    # the grid's points are counted apart from the second oracle's (never "10 of 55"); K 7 at c 1
    # is not one of the second oracle's planned cells, so none of its points count there
    assert (f"(5 of {len(sg.GRID)} grid points measured with both phases; "
            f"0 of {len(sg.TAIL_POINTS)} of the second oracle's)") in md
    planned = [{"id": sg.TAIL_POINTS[0].id}, {"id": sg.GRID[0].id}]
    assert (report._measured(planned, sg.GRID), report._measured(planned, sg.TAIL_POINTS)) == (1, 1)
    # the plain oracle's miss stays on the page beside the second oracle's break-even
    assert "| break-even K=7 c=1 | 0.33.0 |" in md and "not stated (the points read 1.60)" in md
    assert "| break-even K=7 c=1 (second oracle) | 0.33.0 |" in md and "1.50 measured / 1.57 frozen" in md
    # neither holding: nothing stated, the plain oracle's reason given
    rec["oracle_controls"]["v0.33.0-k7-c1-dtail"]["tpot_ms_mean"] = 9.0
    table = report.launcher_table(rec, frozen)
    assert table["rows"] == [] and [r["why"] for r in table["left_out"]] == ["the oracle's cost is over the bar"]
    # both holding: the plain oracle's
    rec["oracle_controls"]["v0.33.0-k7-c1"]["tpot_ms_mean"] = 9.9
    rec["oracle_controls"]["v0.33.0-k7-c1-dtail"]["tpot_ms_mean"] = 9.9
    assert [r["oracle"] for r in report.launcher_table(rec, frozen)["rows"]] == ["reference"]


def test_a_second_oracle_whose_cost_holds_but_whose_points_lack_baselines_states_nothing_yet():
    # its DFlash runs measured on a GPU no baseline was measured on (speedup_record.missing): the
    # cell is listed, its break-even "not yet", the launcher told why, no K compared on it
    frozen = _frozen()
    plain = [sg.Point("0.33.0", 7, 1, level) for level in (1.0, 2.0, 3.0, 4.0, 8.0)]
    second = [sg.Point("0.33.0", 7, 1, level, sg.TAIL_VARIANT) for level in (1.0, 2.0, 3.0, 4.0, 8.0)]
    rec = _curve_with(lambda p: (p.level + 0.1) / 1.6, plain, control_tpot=9.0)  # the plain oracle: over
    tail = _curve_with(lambda p: (p.level + 0.1) / 1.5, second, control_tpot=9.8)  # the second: within
    for row in tail["points"].values():
        del row["baseline"]
    rec["points"].update(tail["points"])
    rec["oracle_controls"].update(tail["oracle_controls"])
    cell = [b for b in report.break_evens(report.point_rows(rec), frozen, report.oracle_costs(rec)) if b["oracle"] == "drafter"]
    assert [(b["points"], b["break_even"], b["status"], b["oracle_cost_holds"]) for b in cell] == \
        [(0, None, report.NO_BASELINE, True)]
    table = report.launcher_table(rec, frozen)
    assert table["rows"] == []
    assert table["left_out"] == [{"vllm": "0.33.0", "k": 7, "concurrency": 1,
                                  "why": report.NO_BASELINE_WHY}]
    md = report.markdown(rec, frozen, acceptance_rows=[{"profile": "p", "per_position": [0.5] * 15}])
    line = next(x for x in md.splitlines() if x.startswith("| break-even K=7 c=1 (second oracle) | 0.33.0 |"))
    assert line.endswith(f"| {report.NO_BASELINE} | not yet, 1.57 frozen |")
    assert f"0 of {len(sg.TAIL_POINTS)} of the second oracle's" in md and "-x" not in md


def test_the_frozen_models_gpus_read_as_one_line():
    assert report.gpu_line("H200, 1 MiB\nH200, 1 MiB") == "2 x H200, 1 MiB"
    assert report.gpu_line("H200, 1 MiB\nH100, 2 MiB") == "H200, 1 MiB; H100, 2 MiB"
    assert report.gpu_line("H200, 1 MiB") == "H200, 1 MiB" and report.gpu_line(None) is None


def test_the_chart_is_a_png_of_the_asked_size():
    data = png_plot.chart([{"points": [(1, 0.5), (3, 1.5)], "color": (255, 0, 0)},
                           {"points": [(1, 0.4), (16, 6.0)], "color": (0, 0, 255), "dashed": True}],
                          x_range=(0, 16), y_range=(0, 2), reference_y=1.0, width=120, height=80, margin=10)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (120, 80)
    idat = data.index(b"IDAT")
    size = struct.unpack(">I", data[idat - 4:idat])[0]
    raw = zlib.decompress(data[idat + 4:idat + 4 + size])
    assert len(raw) == 80 * (1 + 3 * 120) and bytes((255, 0, 0)) in raw


def test_the_launcher_table_is_what_the_committed_curve_gives():
    shipped = json.loads((REPO / "launcher" / "bench" / "breakeven.json").read_text())
    curve, frozen = REPO / srec.CURVE_PATH, REPO / srec.FROZEN_PATH
    if curve.is_file():
        assert shipped == json.loads(json.dumps(report.launcher_table(json.loads(curve.read_text()),
                                                                      json.loads(frozen.read_text()))))
    else:
        assert shipped["rows"] == [] and shipped["source"] is None


# ---------------------------------------------------------------- a run that ends before its host does


def test_a_lane_record_left_by_a_cut_run_keeps_its_points_when_the_lanes_start_again(tmp_path, monkeypatch):
    # A run cut by its deadline left lane 0's record in the lane folder ($OUT on the GPU host);
    # the next run starts each lane from that record merged with the curve, so nothing measured
    # is lost, and the merged curve holds it. (The lanes' servers cannot exist here: each lane
    # is a stand-in that measures nothing.)
    curve = load("speedup_curve")
    frozen = tmp_path / "speedup-frozen.json"
    frozen.write_text(json.dumps(_frozen()))
    lanes = tmp_path / "out"
    lanes.mkdir()
    point = sg.batches(sg.GRID)[0].points[0]
    cut = srec.new(frozen)
    srec.put(cut, point, "baseline", _measure())
    srec.save(cut, lanes / "speedup-curve-lane-0.json")

    class Lane:
        def __init__(self, cmd, env):
            pass

        def wait(self):
            return 0

    monkeypatch.setattr(curve.subprocess, "Popen", Lane)
    args = type("A", (), {"gpus": "0,1", "work": tmp_path, "port": 8021, "record": tmp_path / "curve.json",
                          "frozen": frozen, "commit": False, "vllm": "0.33.0", "lane_dir": lanes})()
    assert curve.run_lanes(args, ["run", "--vllm", "0.33.0", "--gpus", "0,1"]) == 0
    merged = json.loads((tmp_path / "curve.json").read_text())
    assert srec.missing(merged, point) == ["dflash"]
    assert srec.missing(json.loads((lanes / "speedup-curve-lane-0.json").read_text()), point) == ["dflash"]


def test_merge_puts_lane_records_brought_back_from_a_cut_run_into_the_curve(tmp_path):
    curve = load("speedup_curve")
    frozen = tmp_path / "speedup-frozen.json"
    frozen.write_text(json.dumps(_frozen()))
    points = [b.points[0] for b in sg.batches(sg.GRID)[:2]]
    paths = []
    for i, p in enumerate(points):
        rec = srec.new(frozen)
        srec.put(rec, p, "baseline", _measure())
        paths.append(tmp_path / f"speedup-curve-lane-{i}.json")
        srec.save(rec, paths[-1])
    record = tmp_path / "curve.json"
    assert curve.main(["merge", *map(str, paths), "--record", str(record), "--frozen", str(frozen)]) == 0
    merged = json.loads(record.read_text())
    assert all(srec.missing(merged, p) == ["dflash"] for p in points)


def _batch_args(tmp_path, seconds_left):
    import time

    return type("A", (), {"refs": tmp_path / "refs", "model": tmp_path, "work": tmp_path, "vllm": "0.33.0",
                          "record": tmp_path / "curve.json",
                          "end": None if seconds_left is None else time.monotonic() + seconds_left})()


def test_no_server_starts_without_the_time_for_its_start_and_one_point(tmp_path, monkeypatch):
    curve = load("speedup_curve")
    started = []
    monkeypatch.setattr(curve, "Server", lambda *a, **k: started.append(a) or pytest.fail("a server started"))
    frozen = tmp_path / "speedup-frozen.json"
    frozen.write_text(json.dumps(_frozen()))
    batch = sg.batches(sg.GRID)[0]
    args = _batch_args(tmp_path, curve.SERVER_START_S + curve.POINT_S - 5)
    with pytest.raises(curve.OutOfTime):
        curve.run_batch(args, batch, srec.new(frozen), {})
    assert started == []


def _oracle_sees_no_plan(plans) -> None:
    """What the server's oracle does at the warm-up's first propose once its plan file is gone."""
    import oracle

    for plan in set(map(Path, plans)):
        if not plan.exists():
            oracle.dropped_marker(plan).touch()


_PLANS: list = []  # the plan files the stand-in servers' oracles were given (reset by each setup)


def _stub_measure(base, model, point, prompts, *, with_drafter, meta, timeout=None, check=None):
    """A run that reaches the server: the warm-up (the stand-in oracle lets a removed plan go),
    the check, the timed run (acceptance at the planned level)."""
    _oracle_sees_no_plan(_PLANS)
    if check is not None:
        check()
    return {**_measure(acceptance=point.level), **meta}


def _plan_stub(adopt=True):
    """oracle_plan's stand-in: the plan noted, and read at once by the server's oracle."""
    def write(path, points, refs, k, vocab, tail="reference"):
        _PLANS.append(path)
        Path(path).write_text("{}")
        if adopt:
            load("speedup_curve").oracle_adopted(path).touch()
    _PLANS.clear()
    return write


_StandInServer = StandInServer  # a DFlash server's place (vLLM cannot run here)


def _dflash_batch_setup(curve, tmp_path, monkeypatch, acceptance_of):
    from launcher.bench import workload

    frozen = tmp_path / "speedup-frozen.json"
    frozen.write_text(json.dumps(_frozen()))
    batch = next(b for b in sg.batches(sg.GRID) if b.server == "k7")
    (tmp_path / "refs").mkdir()
    for p in batch.points:  # references this K's DFlash server made earlier
        curve.ref_path(tmp_path / "refs", p).write_text(json.dumps({"made_on": "k7"}))
    monkeypatch.setattr(curve, "Server", _StandInServer)
    plans = []

    def oracle_plan(path, *a, **k):  # the stand-in server's oracle reads the plan at once
        plans.append(path)
        Path(path).write_text("{}")
        curve.oracle_adopted(path).touch()
        return {}

    monkeypatch.setattr(curve, "oracle_plan", oracle_plan)
    monkeypatch.setattr(curve.fsv, "server_env", lambda: {"PYTHONPATH": ""})
    monkeypatch.setattr(workload, "vocab_size", lambda model: 262144)
    measured = []

    def measure(base, model, point, prompts, *, with_drafter, meta, timeout=None, check=None):
        if meta.get("oracle") == "no plan":  # the real drafter's control: no plan file on the server
            assert not any(Path(p).exists() for p in plans), "a control ran with a plan in place"
            _oracle_sees_no_plan(plans)
            check()
            return {**_measure(acceptance=1.0), **meta}
        check()
        measured.append(point)
        return {**_measure(acceptance=acceptance_of(point)), **meta}

    monkeypatch.setattr(curve, "measure", measure)
    return batch, srec.new(frozen), measured


def test_a_collapsed_acceptance_stops_higher_levels_on_that_server(tmp_path, monkeypatch):
    # The references diverge from what the server generates: from a planned 3 on, the measured
    # acceptance stays near 1. Lower levels are measured first; the first point planned at 3
    # or more that measures under 60 % of its plan ends every level at or above it.
    curve = load("speedup_curve")
    batch, record, measured = _dflash_batch_setup(
        curve, tmp_path, monkeypatch, lambda p: p.level if p.level < 3 else 1.2)
    done = curve.run_batch(_batch_args(tmp_path, None), batch, record, {})
    levels = [p.level for p in measured]
    assert levels == sorted(levels) and max(levels) == 3.0
    assert len(done) == len(measured) < len(batch.points)
    row = record["points"][measured[-1].id]["dflash"]
    assert row["off_plan"] is True and row["planned_level"] == 3.0
    assert all(record["points"][p.id]["dflash"]["off_plan"] is False for p in measured if p.level < 3)


def test_acceptance_that_follows_the_plan_measures_every_level(tmp_path, monkeypatch):
    curve = load("speedup_curve")
    batch, record, measured = _dflash_batch_setup(curve, tmp_path, monkeypatch, lambda p: p.level * 0.9)
    done = curve.run_batch(_batch_args(tmp_path, None), batch, record, {})
    assert sorted(done) == sorted(p.id for p in batch.points)
    # the real drafter's control at each concurrency, taken before the plan, kept for the report
    assert sorted(record["oracle_controls"]) == ["v0.33.0-k7-c1", "v0.33.0-k7-c4"]
    assert record["oracle_controls"]["v0.33.0-k7-c4"]["prompts_of"] == "v0.33.0-k7-c4-a1-base"


def test_the_real_drafter_is_timed_again_right_after_each_planned_1_point(tmp_path, monkeypatch):
    curve = load("speedup_curve")
    batch, record, measured = _dflash_batch_setup(curve, tmp_path, monkeypatch, lambda p: p.level)
    timed = []
    real = curve.measure
    monkeypatch.setattr(curve, "measure", lambda *a, **kw: timed.append((a[2].id, kw["meta"].get("oracle"))) or real(*a, **kw))
    curve.run_batch(_batch_args(tmp_path, None), batch, record, {})
    for p in (p for p in batch.points if p.level == 1.0):
        at = timed.index((p.id, None))
        assert timed[at - 1: at + 2] == [(p.id, "no plan"), (p.id, None), (p.id, "no plan")]
        assert srec.paired_control(record, p, after=True)["server"] == "stand-in"
    assert sorted(record[srec.AFTER]) == ["v0.33.0-k7-c1", "v0.33.0-k7-c4"]
    # the plan was removed for it and read again for the next point: every other point measured
    assert sorted(p.id for p in measured) == sorted(p.id for p in batch.points)
    # under two points' time once a planned-1.0 point is measured: its control after is left
    # out, and the time goes to the next point
    left_out, clock = srec.new(tmp_path / "speedup-frozen.json"), {"short": False}
    monkeypatch.setattr(curve, "left", lambda args: 2 * curve.POINT_S - 1 if clock["short"] else 10 ** 4)

    def measure(*a, **kw):
        got = real(*a, **kw)
        clock["short"] = clock["short"] or (a[2].level == 1.0 and kw["meta"].get("oracle") is None)
        return got

    monkeypatch.setattr(curve, "measure", measure)
    one = next(p for p in batch.points if p.level == 1.0)
    curve.run_batch(_batch_args(tmp_path, None), batch, left_out, {})  # (the other planned 1.0 is left out too)
    assert srec.paired_control(left_out, one) is not None and left_out.get(srec.AFTER, {}) == {}
    assert srec.valid(left_out["points"][next(p for p in batch.points if p.concurrency == one.concurrency
                                               and p.level == 1.5).id].get("dflash"), "dflash")


def test_a_measurement_names_the_oracle_it_ran_with_and_the_page_its_gather(tmp_path):
    """run_meta names the oracle's files by blob hash; a point records how its server's oracle
    said it gathered (its marker beside the plan; none: unknown), points from before it were
    gathered eagerly, and the cost table says which."""
    import types

    args = types.SimpleNamespace(series_hash="s", vllm="0.33.0", gpu_file=None, lane=None)
    meta = load("speedup_curve").run_meta(args)
    runs = Path(srec.__file__).parent
    assert meta["oracle"] == {name: bars.blob_hash(runs / name) for name in ("oracle.py", "oracle_graph.py")}
    assert srec.gather_of({"tpot_ms_mean": 1.0, "oracle": meta["oracle"], "gather": "graph"}) == "graph"
    assert srec.gather_of({"oracle": meta["oracle"], "gather": "eager: no CUDA device"}) == "eager"
    assert srec.gather_of({"oracle": meta["oracle"], "gather": "unknown"}) == "unknown"
    assert srec.gather_of({}) == "eager"  # measured before the oracle said
    frozen = _frozen()
    pts = [p for p in sg.GRID if (p.vllm, p.k, p.concurrency, p.variant) == ("0.33.0", 7, 1, "base")]
    rec = _curve_with(lambda p: (p.level + 0.1) / 1.6, pts, control_tpot=9.6)
    rec["points"][pts[0].id]["dflash"].update(oracle=meta["oracle"], gather="graph")
    assert "| 0.33.0 | 7 | 1 | graph | 10.00 / 9.60" in report.markdown(rec, frozen)
    scurve = load("speedup_curve")
    plan = tmp_path / "k7.plan.json"
    assert scurve.oracle_gather(plan) == "unknown"
    o = oracle.Oracle(oracle.empty_plan(), None, later=plan)
    oracle.make_plan_file(plan, [[5, 6, 7]], [[9] * 40], [20], 100, (), seed=1, k=3)
    torch = pytest.importorskip("torch")
    assert o.read_later_plan()
    out = torch.zeros(1, 3, dtype=torch.long)
    o.device.timed(["r"], lambda rid: (5, 6, 7), torch.tensor([4]), None, torch.tensor([1]), lambda: out, 3)
    assert scurve.oracle_gather(plan) == "eager: no CUDA device" and out.tolist() != [[0, 0, 0]]


def test_the_report_shows_how_far_the_two_controls_lie_apart_and_judges_on_the_first():
    frozen = _frozen()
    pts = [sg.Point("0.33.0", 7, 1, level) for level in (1.0, 2.0, 3.0, 4.0, 8.0)]
    rec = _curve_with(lambda p: (p.level + 0.1) / 1.6, pts, control_tpot=9.6)  # 4.2 % over the first
    key = srec.control_key(pts[0])
    rec[srec.AFTER] = {key: {**rec[srec.BEFORE][key], "tpot_ms_mean": 10.1}}  # the second is close
    cost = report.oracle_costs(rec)[("0.33.0", 7, 1, "reference")]
    assert cost["holds"] is False and cost["controls_apart"] == pytest.approx(10.1 / 9.6 - 1)
    md = report.markdown(rec, frozen)
    assert "| 0.33.0 | 7 | 1 | eager | 10.00 / 9.60, 10.10 |" in md and "| 5.2 % | False |" in md
    # a control after from another server is no pair: nothing shown
    rec[srec.AFTER][key]["server"] = "another"
    assert report.oracle_costs(rec)[("0.33.0", 7, 1, "reference")]["controls_apart"] is None
    # lanes carry it into the curve
    merged = srec.merge({"frozen": rec["frozen"]}, {"frozen": rec["frozen"], srec.AFTER: {key: rec[srec.BEFORE][key]}})
    assert merged[srec.AFTER] == {key: rec[srec.BEFORE][key]}


def test_a_planned_1_point_is_measured_again_with_its_control_unless_they_paired_on_one_server(tmp_path, monkeypatch):
    curve = load("speedup_curve")
    batch, record, measured = _dflash_batch_setup(curve, tmp_path, monkeypatch, lambda p: p.level * 0.9)
    ones = [p for p in batch.points if p.level == 1.0]
    for p, server in zip(ones, ("old", "other")):  # c=1 paired on one server; c=4's control from another
        srec.put(record, p, "dflash", {**_measure(acceptance=1.0), "server": "old"})
        record.setdefault("oracle_controls", {})[srec.control_key(p)] = {**_measure(acceptance=1.0), "server": server}
    timed = []
    real = curve.measure
    monkeypatch.setattr(curve, "measure", lambda *a, **kw: timed.append((a[2].id, kw["meta"].get("oracle"))) or real(*a, **kw))
    curve.run_batch(_batch_args(tmp_path, None), batch, record, {})
    assert (ones[0].id, "no plan") not in timed and ones[0] not in measured
    # the unpaired one: its control, then the point right after it, on this server
    at = timed.index((ones[1].id, "no plan"))
    assert timed[at + 1] == (ones[1].id, None)
    assert srec.paired_control(record, ones[1])["server"] == "stand-in"


def test_a_server_that_does_not_start_leaves_no_blocker_behind(tmp_path, monkeypatch):
    # The memory blocker is a real process (a sleeping stand-in: the real one holds GPU memory);
    # the server's start fails as a vLLM that exits before it is ready would make it fail.
    curve = load("speedup_curve")
    server = curve.Server(type("A", (), {"port": 8021})(), "b", None, {})

    def start():
        server.blocker = subprocess.Popen(["sleep", "300"], start_new_session=True)
        raise RuntimeError("b: server exited with code 1 before it was ready")

    monkeypatch.setattr(server, "_start", start)
    with pytest.raises(RuntimeError):
        server.__enter__()
    assert server.blocker.wait(timeout=10) is not None


def test_another_releases_curve_is_not_judged_against_the_frozen_model():
    # The frozen step times are 0.33.0's: 0.21.0's spot check gets its measured break-even and
    # no prediction, so no gap is flagged against a model of another release.
    frozen = {**_frozen(), "vllm": "0.33.0"}
    pts = [sg.Point("0.21.0", 7, 1, level) for level in (1.0, 2.0, 3.0, 4.0)]
    row = report.break_evens(report.point_rows(_curve_with(lambda p: (p.level + 0.1) / 2.6, pts)), frozen)[0]
    assert row["break_even"] == pytest.approx(2.6)
    assert row["predicted"] is None and row["relative_gap"] is None and not row["over_bar"]


def _nodrafter_batch_setup(curve, tmp_path, monkeypatch):
    """The first batch without the drafter, a stand-in server and stand-in references; a new record."""
    from launcher.bench import workload

    frozen = tmp_path / "speedup-frozen.json"
    frozen.write_text(json.dumps(_frozen()))
    monkeypatch.setattr(curve, "Server", _StandInServer)
    monkeypatch.setattr(workload, "vocab_size", lambda model: 262144)
    monkeypatch.setattr(curve, "reference", lambda base, model, prompt, n, timeout=None: [1] * n)
    return srec.new(frozen), sg.batches(sg.GRID)[0]


def test_the_server_without_the_drafter_measures_one_baseline_a_concurrency_and_variant(tmp_path, monkeypatch):
    # Without the drafter a run costs the same whatever K or level a point plans: one measurement
    # a (concurrency, variant) stands for the others, each copy naming its source. The server and
    # its measurements are stand-ins (vLLM cannot run here).
    curve = load("speedup_curve")
    record, batch = _nodrafter_batch_setup(curve, tmp_path, monkeypatch)
    measured = []

    def measure(base, model, point, prompts, *, with_drafter, meta, timeout=None, check=None):
        measured.append(point)
        return {**_measure(), **meta}

    monkeypatch.setattr(curve, "measure", measure)
    meta = {"gpu": "H200", "series": "s" * 64}
    done = curve.run_batch(_batch_args(tmp_path, None), batch, record, meta)
    kinds = {(p.concurrency, p.variant) for p in batch.points}
    assert sorted(done) == sorted(p.id for p in batch.points)
    assert sorted((p.concurrency, p.variant) for p in measured) == sorted(kinds)
    rows = [record["points"][p.id]["baseline"] for p in batch.points]
    assert sum("shared_from" not in r for r in rows) == len(kinds)
    for p in batch.points:
        src = record["points"][p.id]["baseline"].get("shared_from")
        if src:
            assert (record["points"][src]["concurrency"], record["points"][src]["variant"]) == (p.concurrency, p.variant)
    # references are made on the DFlash servers (the default), none here
    assert not any(curve.ref_path(tmp_path / "refs", p).is_file() for p in batch.points)
    # a baseline from another GPU is not shared
    other = next(p for p in batch.points if "shared_from" in record["points"][p.id]["baseline"])
    assert curve.shared_baseline(record, other, {"gpu": "H100", "series": "s" * 64}) is None


def test_a_pilot_measures_only_the_points_it_names(tmp_path, monkeypatch):
    curve = load("speedup_curve")
    batch, record, measured = _dflash_batch_setup(curve, tmp_path, monkeypatch, lambda p: p.level)
    pilot = max(batch.points, key=lambda p: p.level)
    args = _batch_args(tmp_path, None)
    args.only = {pilot.id}
    assert curve.run_batch(args, batch, record, {}) == [pilot.id] and measured == [pilot]


class _RecordingServer(_StandInServer):
    """A stand-in server that notes its K, its oracle environment and whether the plan file was
    there when it started."""

    starts: list = []

    def __init__(self, args, label, k, env):
        super().__init__()
        plan = env.get("ORACLE_PLAN")
        _RecordingServer.starts.append((k, plan is not None and Path(plan).exists(), env.get("ORACLE_PLAN_LATER"),
                                        env.get("VLLM_USE_V2_MODEL_RUNNER")))


def test_references_are_made_on_a_dflash_server_at_the_points_k_and_concurrency(tmp_path, monkeypatch):
    # The default: the DFlash server at K starts before its oracle plan exists (the real
    # drafter's drafts are all but never accepted), makes each point's references at the
    # point's concurrency in lockstep waves, then the plan is written and the points measured on
    # the same server. The server without the drafter makes none.
    from launcher.bench import workload

    curve = load("speedup_curve")
    frozen = tmp_path / "speedup-frozen.json"
    frozen.write_text(json.dumps(_frozen()))
    batch = next(b for b in sg.batches(sg.GRID) if b.server == "k3")
    _RecordingServer.starts = []
    monkeypatch.setattr(curve, "Server", _RecordingServer)
    monkeypatch.setattr(workload, "vocab_size", lambda model: 262144)
    monkeypatch.setattr(curve.fsv, "server_env", lambda: {"PYTHONPATH": ""})
    plans, events = [], []

    stub = _plan_stub()

    def oracle_plan(path, points, refs, k, vocab, tail="reference"):  # the plan written, and read by the server's oracle
        plans.append([p.id for p in points])
        events.append("plan")
        stub(path, points, refs, k, vocab)

    monkeypatch.setattr(curve, "oracle_plan", oracle_plan)
    in_flight = {"now": 0, "max": 0}
    import threading

    lock = threading.Lock()

    def reference(base, model, prompt, n, timeout=None):
        with lock:
            events.append("reference")
            in_flight["now"] += 1
            in_flight["max"] = max(in_flight["max"], in_flight["now"])
        import time

        time.sleep(0.01)
        with lock:
            in_flight["now"] -= 1
        return [7] * n

    monkeypatch.setattr(curve, "reference", reference)
    monkeypatch.setattr(curve, "measure", _stub_measure)
    record = srec.new(frozen)
    done = curve.run_batch(_batch_args(tmp_path, None), batch, record, {"gpu": "H200"})
    assert sorted(done) == sorted(p.id for p in batch.points)
    assert _RecordingServer.starts == [(3, False, "1", "1")]  # one server, its plan read later
    # every reference first, a set a concurrency (the levels share prompts), then a plan a point
    assert events == ["reference"] * sum(p.requests for p in batch.points if p.level == 1.0) + ["plan"] * len(done)
    order = sorted(batch.points, key=lambda p: p.level)
    assert plans == [[p.id] for p in order]
    assert in_flight["max"] == max(p.concurrency for p in batch.points)
    made = json.loads(curve.ref_path(tmp_path / "refs", batch.points[0]).read_text())
    assert made["made_on"] == "k3" and len(made["references"]) == batch.points[0].requests
    assert record["points"][batch.points[0].id]["dflash"]["refs_from"] == "k3"


def test_with_refs_from_nodrafter_the_server_without_the_drafter_makes_them(tmp_path, monkeypatch):
    curve = load("speedup_curve")
    record, batch = _nodrafter_batch_setup(curve, tmp_path, monkeypatch)
    monkeypatch.setattr(curve, "measure", _stub_measure)
    args = _batch_args(tmp_path, None)
    args.refs_from = "nodrafter"
    curve.run_batch(args, batch, record, {})
    assert all(curve.ref_path(tmp_path / "refs", p).is_file() for p in batch.points)


def test_a_lane_killed_by_a_signal_or_ending_nonzero_is_the_runs_exit_code():
    curve = load("speedup_curve")
    assert curve.lanes_code([0, 0]) == 0
    assert curve.lanes_code([-9, 0]) == 137  # killed (the OOM killer's SIGKILL) is not a clean run
    assert curve.lanes_code([0, 3]) == 3


def test_lanes_balance_the_batches_when_dflash_servers_make_their_references():
    curve = load("speedup_curve")
    batches = [b for b in sg.batches(sg.GRID) if b.vllm == "0.33.0"]
    lanes = curve.balanced_lanes(batches, 2)
    assert sorted(b.id for lane in lanes for b in lane) == sorted(b.id for b in batches)
    loads = [sum(curve.batch_cost(b) for b in lane) for lane in lanes]
    assert max(loads) - min(loads) <= max(curve.batch_cost(b) for b in batches if b.server == "nodrafter")
    for lane in lanes:  # baselines before the DFlash servers of a lane
        kinds = [b.server == "nodrafter" for b in lane]
        assert kinds == sorted(kinds, reverse=True)
    assert curve.lane_batches(batches, "1/2", "dflash") == lanes[1]
    # references from the servers without the drafter keep their owners' lanes
    assert curve.lane_batches(batches, "0/2", "nodrafter")[0].id == "v0.33.0-nodrafter-1"


def test_references_made_another_way_or_elsewhere_are_not_drafted_on(tmp_path):
    curve = load("speedup_curve")
    point = sg.batches(sg.GRID)[2].points[0]
    refs = tmp_path / "refs"
    refs.mkdir()
    meta = {"gpu": "H200", "series": "s" * 64}
    assert not curve.usable_reference(refs, point, 3, False, meta)  # none yet
    curve.ref_path(refs, point).write_text(json.dumps({"references": []}))  # the old way: no made_on
    assert curve.reference_origin(refs, point)["made_on"] == "nodrafter"
    assert not curve.usable_reference(refs, point, 3, False, meta)
    assert curve.usable_reference(refs, point, 3, True, meta)
    curve.ref_path(refs, point).write_text(json.dumps({"made_on": "k3", "gpu": "H100", "series": "s" * 64}))
    assert not curve.usable_reference(refs, point, 3, False, meta)  # another GPU's rounding
    assert not curve.usable_reference(refs, point, 7, False, {**meta, "gpu": "H100"})  # another K's
    assert curve.usable_reference(refs, point, 3, False, {**meta, "gpu": "H100"})


def test_a_collapse_holds_per_concurrency_and_a_rerun_keeps_it(tmp_path, monkeypatch):
    curve = load("speedup_curve")
    # c=1 parts from its references from a planned 3 on; c=4 follows its plan
    batch, record, measured = _dflash_batch_setup(
        curve, tmp_path, monkeypatch, lambda p: 1.2 if (p.concurrency == 1 and p.level >= 3) else p.level)
    curve.run_batch(_batch_args(tmp_path, None), batch, record, {})
    c1 = [p.level for p in measured if p.concurrency == 1]
    c4 = [p.level for p in measured if p.concurrency == 4]
    assert max(c1) == 3.0 and sorted(c4) == sorted(p.level for p in batch.points if p.concurrency == 4)
    assert record["collapsed"] == {"v0.33.0-k7-c1-refs-dflash": 3.0}
    # a rerun on the saved record does not start over at the collapsed levels
    measured.clear()
    saved = json.loads((tmp_path / "curve.json").read_text())
    curve.run_batch(_batch_args(tmp_path, None), batch, saved, {})
    assert all(not (p.concurrency == 1 and p.level >= 3) for p in measured)


def test_an_error_in_one_batch_does_not_end_the_lane(tmp_path, monkeypatch):
    # A server that dies mid-batch raises what urllib raises, not a RuntimeError: the batch
    # fails, the run goes on to the next one, and exits 1.
    import urllib.error

    curve = load("speedup_curve")
    frozen = tmp_path / "speedup-frozen.json"
    frozen.write_text(json.dumps(_frozen()))
    ran = []

    def run_batch(args, batch, record, meta):
        ran.append(batch.id)
        if len(ran) == 1:
            raise urllib.error.URLError("connection refused")
        return []

    monkeypatch.setattr(curve, "run_batch", run_batch)
    monkeypatch.setattr(curve, "frozen_committed", lambda frozen: True)
    argv = ["run", "--vllm", "0.33.0", "--series-hash", "s" * 64, "--model", str(tmp_path), "--drafter", str(tmp_path),
            "--launcher", "x", "--record", str(tmp_path / "curve.json"), "--frozen", str(frozen),
            "--work", str(tmp_path / "work"), "--refs", str(tmp_path / "refs")]
    assert curve.main(argv) == 1
    assert ran == [b.id for b in sg.release_batches("0.33.0")] and len(ran) == 7


def test_a_stopped_server_leaves_no_process_of_its_group_and_its_port_free(tmp_path):
    # Real processes: a group whose leader has exited while a child (vLLM's engine core in a
    # server) still runs, and a port held a moment longer.
    import socket
    import threading

    curve = load("speedup_curve")
    leader = subprocess.Popen(["bash", "-c", "sleep 300 & exit 0"], start_new_session=True)
    leader.wait(timeout=10)
    curve.gone(leader.pid, timeout=10)
    with pytest.raises(ProcessLookupError):
        os.killpg(leader.pid, 0)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    threading.Timer(1.0, sock.close).start()
    assert curve.port_free(port, timeout=10)


def _make_here_setup(curve, tmp_path, monkeypatch, adopt=True):
    """A K 3 batch whose references this server makes (none staged); stand-in server and runs."""
    from launcher.bench import workload

    frozen = tmp_path / "speedup-frozen.json"
    frozen.write_text(json.dumps(_frozen()))
    monkeypatch.setattr(curve, "Server", _StandInServer)
    monkeypatch.setattr(workload, "vocab_size", lambda model: 262144)
    monkeypatch.setattr(curve.fsv, "server_env", lambda: {"PYTHONPATH": ""})
    monkeypatch.setattr(curve, "oracle_plan", _plan_stub(adopt))
    monkeypatch.setattr(curve, "reference", lambda base, model, prompt, n, timeout=None: [7] * n)
    monkeypatch.setattr(curve, "measure", _stub_measure)
    return next(b for b in sg.batches(sg.GRID) if b.server == "k3"), srec.new(frozen)


def test_a_plan_the_oracle_never_read_records_nothing(tmp_path, monkeypatch):
    # The server ran with the real drafter throughout (acceptance about 1): such points would
    # pass for collapsed ones. Without the oracle's marker the batch fails and records nothing.
    curve = load("speedup_curve")
    batch, record = _make_here_setup(curve, tmp_path, monkeypatch, adopt=False)
    with pytest.raises(RuntimeError, match="did not read its plan"):
        curve.run_batch(_batch_args(tmp_path, None), batch, record, {})
    assert not any(row.get("dflash") for row in record.get("points", {}).values())


def test_references_cut_by_the_deadline_measure_what_was_made_and_ask_for_another_run(tmp_path, monkeypatch):
    curve = load("speedup_curve")
    batch, record = _make_here_setup(curve, tmp_path, monkeypatch)
    args = _batch_args(tmp_path, None)
    clock = {"refs": 0}
    real = curve.references_at

    def references_at(*a, **kw):  # the first set (c=1) leaves too little time for the second (c=4)
        clock["refs"] += 1
        if clock["refs"] == 1:
            import time

            args.end = time.monotonic() + 2 * curve.POINT_S - 1  # references stop, points still fit
        return real(*a, **kw)

    monkeypatch.setattr(curve, "references_at", references_at)
    with pytest.raises(curve.OutOfTime):
        curve.run_batch(args, batch, record, {})
    assert clock["refs"] == 1
    # the c=1 points on the references made; the planned 1.0 one waits for the time of its control too
    assert sorted(curve.batch_done[batch.id]) == sorted(p.id for p in batch.points if p.concurrency == 1 and p.level > 1)


def test_dflash_made_references_give_a_baseline_batch_and_a_batch_per_k_and_concurrency():
    whole = sg.release_batches("0.33.0", "nodrafter")
    assert [b.id for b in whole if b.server != "nodrafter"] == ["v0.33.0-k15-1", "v0.33.0-k7-1", "v0.33.0-k3-1"]
    assert [b.id for b in whole if b.server == "nodrafter"] == ["v0.33.0-nodrafter-1", "v0.33.0-nodrafter-2"]
    split = sg.release_batches("0.33.0", "dflash")
    # one server without the drafter: it only measures the baselines, which levels and Ks share
    assert [b.id for b in split if b.server == "nodrafter"] == ["v0.33.0-nodrafter-1"]
    dflash = [b for b in split if b.server != "nodrafter"]
    assert [b.id for b in dflash] == [f"v0.33.0-k{k}-c{c}" for k in (15, 7, 3) for c in (1, 4)]
    assert all({p.concurrency for p in b.points} == {int(b.split[1:])} for b in dflash)
    assert not {b.id for b in dflash} & {b.id for b in whole}  # records and plans never mix the two
    # the same points either way, each in one batch of its server kind
    key = lambda bs: sorted((b.server == "nodrafter", p.id) for b in bs for p in b.points)  # noqa: E731
    assert key(split) == key(whole)
    spot = sg.release_batches("0.21.0", "dflash")
    assert [b.id for b in spot] == ["v0.21.0-nodrafter-1", "v0.21.0-k15-c1"]
    # a host of eight GPUs: a batch a lane
    lanes = [curve_lanes(split, i, 8) for i in range(8)]
    assert sorted(b.id for lane in lanes for b in lane) == sorted(b.id for b in split)
    assert sorted(len(lane) for lane in lanes) == [0] + [1] * 7
    # two GPUs: the recipes' K at both concurrencies comes first, one in each lane, the
    # baselines before it in theirs
    two = [curve_lanes(split, i, 2) for i in range(2)]
    firsts = [[b.id for b in lane if b.server != "nodrafter"][0] for lane in two]
    assert sorted(firsts) == ["v0.33.0-k15-c1", "v0.33.0-k15-c4"]
    assert any(lane[0].server == "nodrafter" for lane in two)


def curve_lanes(batches, i, n):
    return load("speedup_curve").lane_batches(batches, f"{i}/{n}", "dflash")


def test_the_levels_of_a_concurrency_and_variant_share_prompts_and_references():
    curve = load("speedup_curve")
    a, b = sg.Point("0.33.0", 15, 1, 1.5), sg.Point("0.33.0", 15, 1, 8.0)
    assert sg.prompts(a) == sg.prompts(b) == sg.prompts(sg.Point("0.33.0", 3, 1, 2.0))
    assert sg.prompts(a) != sg.prompts(sg.Point("0.33.0", 15, 4, 1.5))
    assert sg.prompts(a) != sg.prompts(sg.Point("0.33.0", 15, 1, 2.5, "logprobs"))
    refs = Path("/refs")
    assert curve.ref_path(refs, a) == curve.ref_path(refs, b) != curve.ref_path(refs, sg.Point("0.33.0", 7, 1, 1.5))


def test_each_timed_run_has_a_cache_salt_of_its_own(monkeypatch):
    # Levels share prompts: without a salt a point's run would find the last point's prompts in
    # vLLM's prefix cache and skip their prefill.
    from launcher.bench import client, metrics

    curve = load("speedup_curve")
    sent = []

    def run_level(target, run, prompts, *, extra=None, **kw):
        sent.append(dict(extra or {}))
        return {"completed": len(prompts), "failed": 0, "errors": [], "output_throughput": 1.0, "duration": 1.0,
                "mean_tpot_ms": 1.0, "p99_tpot_ms": 1.0, "mean_ttft_ms": 1.0, "total_output_tokens": 1}

    monkeypatch.setattr(client, "run_level", run_level)
    monkeypatch.setattr(metrics, "scrape", lambda base: {})
    monkeypatch.setattr(metrics, "acceptance", lambda before, after: {"mean_acceptance_length": 1.0})
    point = sg.Point("0.33.0", 15, 1, 2.5, "logprobs")
    for _ in range(2):
        curve.measure("http://x", "m", point, sg.prompts(point)[:2], with_drafter=True, meta={})
    salts = [e["cache_salt"] for e in sent]
    assert len(set(salts)) == 4  # two warm-ups, two timed runs
    assert all(e.get("logprobs") == sg.LOGPROBS for e in sent)


def test_a_control_after_a_plan_needs_the_oracle_to_have_let_the_plan_go(tmp_path, monkeypatch):
    # c=4's planned-1.0 point comes after c=1's plans: its control must run on the real drafter,
    # so without the oracle's drop marker the batch fails before the control's timed run.
    curve = load("speedup_curve")
    batch, record = _make_here_setup(curve, tmp_path, monkeypatch)
    monkeypatch.setitem(globals(), "_oracle_sees_no_plan", lambda plans: None)
    with pytest.raises(RuntimeError, match="still holds its last plan"):
        curve.run_batch(_batch_args(tmp_path, None), batch, record, {})
    assert "v0.33.0-k3-c4" not in (record.get("oracle_controls") or {})
    assert srec.paired_control(record, next(p for p in batch.points if p.level == 1.0 and p.concurrency == 1))


def test_the_page_says_how_many_distinct_tokens_the_references_hold(tmp_path):
    import io
    import tarfile

    def archive(name, sets):
        with tarfile.open(tmp_path / name, "w:gz") as tar:
            for set_name, refs in sets.items():
                data = json.dumps({"prompts": [], "references": refs}).encode()
                info = tarfile.TarInfo(f"speedup-refs/{set_name}.json")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

    archive("refs-a.tar.gz", {"v0.33.0-k7-c1-base": [[5] * 10, [6] * 10], "v0.33.0-k3-c1-base": [[1, 2, 3, 1]]})
    archive("refs-b.tar.gz", {"v0.33.0-k7-c1-base": [[5, 6, 7] * 3, [8] * 9, [1, 2] * 4]})  # made again later
    sets = report.reference_sets(tmp_path)
    assert sets["v0.33.0-k7-c1-base"] == {"references": 3, "length": 9, "median_distinct": 2, "max_distinct": 3,
                                          "archive": "refs-b.tar.gz"}
    assert sets["v0.33.0-k3-c1-base"]["median_distinct"] == 3
    md = "\n".join(report.reference_lines(sets))
    assert "| v0.33.0-k7-c1-base | 3 | 9 | 2, 3 | `speedup-curve/refs-b.tar.gz` |" in md
    assert report.reference_sets(tmp_path / "none") == {} and report.reference_lines({}) == []
    # the committed archives: the page's statement that the random-weight target repeats one token
    committed = report.reference_sets(GPU_DIR / "results" / "speedup-curve")
    assert committed and all(s["max_distinct"] == 1 for s in committed.values())


def test_plan_lists_the_batches_run_makes_and_what_each_lacks(tmp_path, capsys):
    curve = load("speedup_curve")
    frozen = tmp_path / "speedup-frozen.json"
    frozen.write_text(json.dumps(_frozen()))
    record = srec.new(frozen)
    done = sg.Point("0.33.0", 15, 1, 1.5)
    srec.put(record, done, "baseline", _measure())
    srec.put(record, done, "dflash", {**_measure(acceptance=1.5), "server": "s"})
    srec.save(record, tmp_path / "curve.json")
    assert curve.main(["plan", "--record", str(tmp_path / "curve.json"), "--frozen", str(frozen)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [b.id for v in ("0.33.0", "0.21.0") for b in sg.release_batches(v)]
    k15 = next(line for line in lines if line.startswith("v0.33.0-k15-c1 "))
    assert done.id not in k15 and "v0.33.0-k15-c1-a2-base" in k15 and "11/12 pending" in k15
    # --lanes 2: the lane of each batch, as each lane of a two-GPU run will take it
    assert curve.main(["plan", "--record", str(tmp_path / "curve.json"), "--frozen", str(frozen), "--lanes", "2"]) == 0
    lanes = {line.split()[0]: line.split("lane ")[1].split()[0] for line in capsys.readouterr().out.splitlines()}
    left = lambda b: len(srec.pending(b, record, lambda p: True))  # noqa: E731
    batches = sg.release_batches("0.33.0")
    for i in range(2):
        assert {b.id for b in curve.lane_batches(batches, f"{i}/2", "dflash", left)} == {
            b for b, lane in lanes.items() if lane == f"{i}/2" and b.startswith("v0.33.0")}


@pytest.mark.parametrize("release", ["0.21.0", "0.33.0"])
def test_start_phases_read_the_start_up_lines_each_release_logs(release):
    # The released wheel's own format strings, formatted with known numbers: a phase whose wording
    # a release changed would no longer be found in its tree, or no longer parse.
    import re

    from tests.integration.patch_trees import pristine

    source = "\n".join(p.read_text(errors="replace") for p in (pristine(release, "site-packages") / "vllm").rglob("*.py"))
    lines, want = [], {}
    for i, (name, pattern) in enumerate(srec.START_PHASES.items()):
        literal = re.search(pattern.replace("([0-9.]+)", r"%\.\d+f").replace("%s", ""), source)
        assert literal, f"{release} no longer logs {name} as {pattern!r}"
        number = 10.0 * (i + 1)  # whole seconds: one release logs the capture with %.0f
        lines.append("INFO 11-30 10:00:00 [x.py:1] " + literal.group(0).replace("%%", "%") % number)
        want[name] = number
    lines.append(lines[0])  # the drafter's weights: a second load adds
    want["load_weights_s"] *= 2
    assert srec.start_phases("\n".join(lines)) == want
    assert srec.start_phases("no start-up lines here") == {}


def test_the_second_oracles_points_share_the_plain_points_prompts_references_and_baselines(tmp_path, monkeypatch):
    # K 7 at concurrency 4 as a record holds it once its plain points are measured: the batch
    # the run makes next measures the dtail points alone, each with the drafter tail, on one
    # server, with the plain points' references (none made) and baselines (no server without the
    # drafter), and the dtail control kept apart from the plain one.
    curve = load("speedup_curve")

    frozen = tmp_path / "speedup-frozen.json"
    frozen.write_text(json.dumps(_frozen()))
    batch = next(b for b in sg.release_batches("0.33.0") if b.id == "v0.33.0-k7-c4")
    plain = [p for p in batch.points if p.variant == "base"]
    tails = [p for p in batch.points if p.variant == sg.TAIL_VARIANT]
    assert len(tails) == len(plain) == len(sg.LEVELS[7]) and {p.tail for p in tails} == {"drafter"}
    for p, t in zip(plain, tails):
        assert sg.prompts(t) == sg.prompts(p) and curve.ref_path(tmp_path, t) == curve.ref_path(tmp_path, p)
    meta = {"gpu": "H200", "series": "s"}
    record = srec.new(frozen)
    for p in plain:
        srec.put(record, p, "baseline", {**_measure(), **meta})
        srec.put(record, p, "dflash", {**_measure(acceptance=p.level), **meta, "server": "earlier"})
    record[srec.BEFORE] = {srec.control_key(plain[0]): {**_measure(acceptance=1.0), **meta, "server": "earlier"}}
    (tmp_path / "refs").mkdir()
    curve.ref_path(tmp_path / "refs", plain[0]).write_text(json.dumps({"made_on": "k7", **meta}))
    monkeypatch.setattr(curve, "Server", _StandInServer)
    monkeypatch.setattr(curve.fsv, "server_env", lambda: {"PYTHONPATH": ""})
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 262144}}))  # the model folder
    monkeypatch.setattr(curve, "reference", lambda *a, **k: pytest.fail("references made again"))
    stub, tails_written = _plan_stub(), []

    def oracle_plan(path, points, refs, k, vocab, tail="reference"):
        tails_written.append((points[0].id, tail))
        stub(path, points, refs, k, vocab)

    monkeypatch.setattr(curve, "oracle_plan", oracle_plan)
    monkeypatch.setattr(curve, "measure", _stub_measure)
    done = curve.run_batch(_batch_args(tmp_path, None), batch, record, meta)
    assert sorted(done) == sorted(p.id for p in tails)
    assert tails_written == [(p.id, "drafter") for p in sorted(tails, key=lambda q: q.level)]
    for t in tails:
        assert record["points"][t.id]["baseline"]["shared_from"] in {p.id for p in plain}
        assert srec.missing(record, t) == []
    key = srec.control_key(tails[0])
    assert key == "v0.33.0-k7-c4-dtail" and record[srec.BEFORE][key]["server"] == "stand-in"
    assert record[srec.BEFORE]["v0.33.0-k7-c4"]["server"] == "earlier"  # the plain control stays
    # none of it is part of the grid a record must hold
    assert not any(t.id in line for t in tails for line in srec.grid_problems(srec.new(frozen)))


def test_a_dtail_point_measured_in_one_lane_takes_the_baseline_another_lane_measured(tmp_path):
    curve = load("speedup_curve")
    frozen = tmp_path / "speedup-frozen.json"
    frozen.write_text(json.dumps(_frozen()))
    record = srec.new(frozen)
    tail = next(p for p in sg.TAIL_POINTS if (p.k, p.level) == (15, 2.0))
    plain = sg.Point(tail.vllm, tail.k, tail.concurrency, tail.level)
    lanes = [json.loads(json.dumps(record)) for _ in range(2)]
    srec.put(lanes[0], plain, "baseline", {**_measure(), "gpu": "H200", "series": "s"})
    srec.put(lanes[1], tail, "dflash", {**_measure(acceptance=2.0), "gpu": "H200", "series": "s"})
    paths = []
    for i, lane in enumerate(lanes):
        paths.append(tmp_path / f"lane-{i}.json")
        srec.save(lane, paths[-1])
    assert srec.missing(curve.merge_into(json.loads(json.dumps(record)), paths[1:]), tail) == ["baseline"]
    merged = curve.merge_into(record, paths)
    assert srec.missing(merged, tail) == [] and merged["points"][tail.id]["baseline"]["shared_from"] == plain.id
    # a baseline from another GPU is not taken
    other = srec.new(frozen)
    srec.put(other, plain, "baseline", {**_measure(), "gpu": "H100", "series": "s"})
    srec.save(other, paths[0])
    assert srec.missing(curve.merge_into(srec.new(frozen), paths), tail) == ["baseline"]


def test_a_rerun_balances_its_lanes_on_what_is_left_to_measure(tmp_path):
    # K 15 and 7 at concurrency 4 left with their second oracle's points only, K 3 at
    # concurrency 1 with its plain points only, K 3 at 4 not begun: the two GPUs split the work
    # left, not the batches' whole sizes.
    curve = load("speedup_curve")
    frozen = tmp_path / "speedup-frozen.json"
    frozen.write_text(json.dumps(_frozen()))
    record = srec.new(frozen)
    for p in sg.GRID:
        if p.vllm == "0.33.0":
            srec.put(record, p, "baseline", _measure())  # the baselines all measured
        if p.vllm == "0.33.0" and (p.k, p.concurrency) != (3, 4):
            srec.put(record, p, "dflash", {**_measure(acceptance=p.level), "server": "s"})
            if srec.needs_control(p):
                record.setdefault(srec.BEFORE, {})[srec.control_key(p)] = {**_measure(acceptance=1.0), "server": "s"}
    batches = sg.release_batches("0.33.0")
    left = lambda b: len(srec.pending(b, record, lambda p: True))  # noqa: E731
    lanes = [curve.lane_batches(batches, f"{i}/2", "dflash", left) for i in range(2)]
    work = [sorted((b.id, left(b)) for b in lane if left(b)) for lane in lanes]
    assert sorted(work) == [[("v0.33.0-k15-c4", 10), ("v0.33.0-k7-c4", 8)], [("v0.33.0-k3-c1", 6), ("v0.33.0-k3-c4", 12)]]
    whole = [[left(b) for b in curve.lane_batches(batches, f"{i}/2", "dflash") if left(b)] for i in range(2)]
    assert sorted(map(sum, whole)) == [16, 20]  # what balancing on whole sizes would have done


def test_the_page_shows_each_servers_start_where_the_record_kept_it():
    frozen = _frozen()
    pts = [sg.Point("0.33.0", 7, 1, level) for level in (1.0, 2.0, 3.0, 4.0, 8.0)]
    rec = _curve_with(lambda p: (p.level + 0.1) / 1.6, pts)
    assert "## Server starts" not in report.markdown(rec, frozen)  # older batches kept none
    rec["batches"] = [{"id": "v0.33.0-k7-c1", "lane": "1/2", "measured": [],
                       "server_start": {"total_s": 251.4, "load_weights_s": 10.0, "compile_s": 71.2,
                                        "init_engine_s": 218.6}},
                      {"id": "v0.33.0-nodrafter-1", "measured": [], "server_start": None}]
    md = report.markdown(rec, frozen)
    header = next(line for line in md.split("## Server starts")[1].splitlines() if line.startswith("| batch"))
    assert header.count("|") - 1 == 3 + len(srec.START_PHASES)  # a column for each phase the run reads
    assert "| v0.33.0-k7-c1 | 1/2 | 251 | 10 | 71 | - | 219 |" in md
    assert "v0.33.0-nodrafter-1 |" not in md.split("## Server starts")[1]


def test_the_page_shows_the_oracles_own_work_from_its_record():
    """The committed benchmark's numbers, each from its run (the eager gather the points before the
    graph ran with beside the eager and graphed ones now); no record, no section."""
    record = json.loads((GPU_DIR / "results" / "speedup-oracle-overhead.json").read_text())
    frozen = _frozen()
    rec = _curve_with(lambda p: (p.level + 0.1) / 1.6, [sg.Point("0.33.0", 7, 1, level) for level in (1.0, 2.0, 4.0)])
    assert "## The oracle's own work" not in report.markdown(rec, frozen)
    md = report.markdown(rec, frozen, overhead=record)
    for run in record["runs"]:
        before = next(b for b in record["eager_before"]["runs"] if (b["k"], b["rows"]) == (run["k"], run["rows"]))
        row = (f"| {run['k']} | {run['rows']} | {before['oracle']['host_us']:.0f} | {run['oracle_eager']['host_us']:.0f} | "
               f"{run['oracle']['host_us']:.0f} | {run['oracle']['device_us']:.0f} | {run['no_plan']['host_us']:.0f} |")
        assert row in md, row


def test_a_deadline_that_holds_no_server_start_is_refused_at_once(tmp_path, capsys):
    """A budget under one server's start and one point used to end every run with "run again"
    (exit 3) before any server started; it is now refused with the budget that would run."""
    curve = load("speedup_curve")
    short = curve.SERVER_START_S + curve.POINT_S - 1
    with pytest.raises(SystemExit) as info:
        curve.main(["run", "--vllm", "0.33.0", "--series-hash", "33ead67f", "--model", str(tmp_path / "m"),
                    "--drafter", str(tmp_path / "d"), "--launcher", "launcher serve", "--work", str(tmp_path / "work"),
                    "--deadline-s", str(short)])
    assert info.value.code == 2
    said = capsys.readouterr().err
    assert f"give {curve.SERVER_START_S + curve.POINT_S} or more" in said
    assert f"SPEEDUP_BUDGET_S {curve.SERVER_START_S + curve.POINT_S + 120} or more" in said
    assert not any(tmp_path.iterdir())  # refused before anything was made


def test_a_dtail_point_measured_on_another_host_takes_a_baseline_measured_where_it_ran(tmp_path, monkeypatch, capsys):
    # The plain points' baselines from a host of two GPUs; K 15's second oracle at concurrency 4
    # then measured on a host of one (the gpu lines differ): no baseline stands for it until the
    # server without the drafter measures one on a GPU like that one. K 3's at concurrency 1, not
    # run yet, takes one there too, since that server starts anyway.
    curve = load("speedup_curve")
    frozen = tmp_path / "speedup-frozen.json"
    frozen.write_text(json.dumps(_frozen()))
    two, one = {"gpu": "H200\nH200", "series": "s"}, {"gpu": "H200", "series": "s"}
    record = srec.new(frozen)
    for p in sg.GRID:
        if p.vllm == "0.33.0":
            srec.put(record, p, "baseline", {**_measure(), **two})
    tails = [p for p in sg.TAIL_POINTS if (p.k, p.concurrency) == (15, 4)]
    for t in tails:
        srec.put(record, t, "dflash", {**_measure(acceptance=t.level), **one, "server": "one"})
    record[srec.BEFORE] = {srec.control_key(tails[0]): {**_measure(acceptance=1.0), **one, "server": "one"}}
    curve.share_tail_baselines(record)
    assert all(srec.missing(record, t) == ["baseline"] for t in tails)
    # a pair measured on two hosts is no pair: the plain point's DFlash run on the host of one
    plain = sg.Point("0.33.0", 15, 4, 2.0)
    srec.put(record, plain, "dflash", {**_measure(acceptance=2.0), **one, "server": "one"})
    assert srec.missing(record, plain) == ["baseline"]
    assert plain.id not in {r["id"] for r in report.point_rows(record)}
    del record["points"][plain.id]["dflash"]

    batch = next(b for b in sg.release_batches("0.33.0") if b.server == "nodrafter")
    assert {p.id for p in tails} <= {p.id for p in srec.pending(batch, record, lambda p: True)}
    k3c1 = [p for p in sg.TAIL_POINTS if (p.k, p.concurrency) == (3, 1)]
    assert not {p.id for p in k3c1} & {p.id for p in srec.pending(batch, record, lambda p: True)}
    measured = []

    def measure(base, model, point, prompts, *, with_drafter, meta, timeout=None, check=None):
        assert not with_drafter
        measured.append(point.id)
        return {**_measure(), **meta}

    monkeypatch.setattr(curve, "Server", _StandInServer)
    monkeypatch.setattr(curve, "measure", measure)
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 262144}}))
    # on a host of two GPUs: no server started for them, and they stay without one
    monkeypatch.setattr(curve, "Server", lambda *a, **k: pytest.fail("a server started"))
    elsewhere = json.loads(json.dumps(record))
    curve.run_batch(_batch_args(tmp_path, None), batch, elsewhere, two)
    assert all(srec.missing(elsewhere, t) == ["baseline"] for t in tails) and measured == []
    assert "its baseline is measured on the GPU and series of its DFlash run ('H200'" in capsys.readouterr().out
    # on a host of one: one baseline a concurrency, the rest share it (the second oracle's
    # points at K 3 and 7, concurrency 4, not run yet here, among them)
    monkeypatch.setattr(curve, "Server", _StandInServer)
    done = curve.run_batch(_batch_args(tmp_path, None), batch, record, one)
    assert sorted(done) == sorted(p.id for p in sg.TAIL_POINTS)
    assert measured == [tails[0].id, k3c1[0].id]
    assert all(srec.missing(record, t) == [] for t in tails)
    assert {record["points"][t.id]["baseline"].get("shared_from") for t in tails[1:]} == {tails[0].id}
    assert all(srec.missing(record, t) == ["dflash"] for t in k3c1)
    assert all(record["points"][t.id]["baseline"]["gpu"] == "H200" for t in tails + k3c1)
