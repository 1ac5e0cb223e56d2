"""tests/gpu/reports/acceptance_report.py: issue 25's acceptance.json rows from realshape records."""

from __future__ import annotations

import pytest

from launcher.patching.series import series_for
from tests.unit.gpu_scripts import json_tar
from tests.unit.gpu_scripts import load as _load

ar = _load("acceptance_report")
gate = _load("gate")


# The rows below ran the current 0.21.0 series, and their output and reference pass the gate
# (32 prompts of 128 distinct tokens), unless a test says otherwise.
SERIES = series_for("0.21.0").hash
ABC = SERIES[:8]
_GOOD = gate.nondegenerate([{"token_ids": list(range(i * 128, (i + 1) * 128))} for i in range(32)])


def _rec(name, acc, ref=4.0, **kw):
    return {"name": name, "mode": "dflash", "drafter_kind": "trained", "vllm": "0.21.0", "quantization": "bf16",
            "series": SERIES, "acceptance": {"mean_acceptance_length": acc, "per_position": [0.5]},
            "acceptance_reference": {"mean_acceptance_length": ref, "per_position": [0.4]},
            "reference": "ref", "nondegenerate": _GOOD, "reference_nondegenerate": _GOOD, "lossless": True, **kw}


# Exact-numerics rows, identical to the reference, of both targets (the lossless item).
EXACT = [_rec("bf16-exact", 3.4, ref=3.5, batch_invariant=True, compile_backend="eager", lossless=True),
         _rec("nvfp4-exact", 3.3, ref=3.4, quantization="modelopt-nvfp4", batch_invariant=True,
              compile_backend="eager", lossless=True)]


def test_a_row_per_configuration_with_its_capture_and_ablation_runs():
    eq = {"contexts": 250, "equal": 249, "features": {"min_cosine": 0.998}}
    records = [
        _rec("plain", 4.2),
        _rec("capture", 4.1, capture_drafts=True, draft_equivalence=eq),
        _rec("capture-without-x", 1.3, capture_drafts=True, revert="x",
             draft_equivalence={"contexts": 250, "equal": 12}),
        _rec("random", 1.0) | {"drafter_kind": "random"},
        _rec("nvfp4", 3.5) | {"quantization": "modelopt-nvfp4"},
    ]
    rows = {r["run"]: r for r in ar.build(records)}
    assert set(rows) == {"plain", "nvfp4"}
    plain = rows["plain"]
    assert plain["relative_gap"] == 0.05 and plain["acceptance_bar_met"] is True
    assert plain["draft_equivalence"] == {"contexts": 250, "equal": 249, "holds": True, "features_min_cosine": 0.998,
                                          "features_median_cosine": None, "noise_bound": None,
                                          "unequal_beyond_noise": None, "unequal_beyond_noise_p99": None,
                                          "equal_or_within_noise_fraction": None,
                                          "holds_within_noise": None, "exact": None, "holds_strict": None,
                                          "equal_or_within_noise_p99_fraction": None}
    assert plain["ablation"] == [{"reverted": "x", "series": SERIES, "draft_equivalence_equal": 12,
                                  "draft_equivalence_contexts": 250, "features_median_cosine": None,
                                  "mean_acceptance_length_vllm": 1.3, "mean_acceptance_length_vllm_unreverted": 4.1}]
    assert rows["nvfp4"]["draft_equivalence"] is None and rows["nvfp4"]["ablation"] == []
    assert rows["nvfp4"]["relative_gap"] == 0.125 and rows["nvfp4"]["acceptance_bar_met"] is False


def test_bars_refuse_low_acceptance_and_too_few_contexts():
    rows = ar.build([_rec("low", 2.9, ref=2.9),
                     _rec("cap", 2.9, ref=2.9, capture_drafts=True,
                          draft_equivalence={"contexts": 150, "equal": 150})])
    assert rows[0]["acceptance_bar_met"] is False  # under 3 although equal to the reference
    assert rows[0]["draft_equivalence"]["holds"] is False  # fewer than 200 contexts
    assert "not met" in ar.markdown(rows) and "150/150" in ar.markdown(rows)



def test_a_default_numerics_row_shows_its_batch_noise_verdict():
    rows = {r["run"]: r for r in ar.build([
        _rec("noisy", 3.1, lossless=False, batch_noise={"run": "refgroups", "within": True}),
        _rec("corrupt", 3.1, lossless=False, batch_noise={"run": "refgroups", "within": False}),
        _rec("exact", 3.1, lossless=True),
        # A swap whose token fell outside the kept logprobs: measured, not decided.
        _rec("open", 3.1, lossless=False, batch_noise={"run": "refgroups", "within": None, "unmeasured": 2}),
        _rec("alone", 3.1, lossless=False, batch_noise={"run": "refgroups", "within": None,
                                                        "reason": "no batch-noise run"}),
    ])}
    assert rows["noisy"]["within_batch_noise"] is True and rows["exact"]["within_batch_noise"] is None
    assert rows["open"]["batch_noise_run"] == "refgroups" and rows["alone"]["batch_noise_run"] is None
    md = ar.markdown(list(rows.values()))
    assert "| with ties False; within batching noise (p99): not decided; at the widest move: True |" in md
    assert "| with ties False; within batching noise (p99): not decided; at the widest move: False |" in md
    assert md.count("| with ties False; within batching noise (p99): not decided; at the widest move: not decided |") == 1
    assert md.count("| False |") == 1
    assert "| True |" in md


def test_equivalence_and_lossless_show_the_strict_count_first():
    """Issue 51, item 4: strict, with ties, within the noise bound (its 99th percentile), in that
    order; the bar as asked (with ties) decides, and holds in every capture row or not at all."""
    eq = {"contexts": 1000, "equal": 995, "exact": 800,
          "noise": {"vllm_unequal_beyond_p99": 3, "equal_or_within_noise_fraction": 0.999}}
    (row,) = ar.build([_rec("capture", 3.5, capture_drafts=True, draft_equivalence=eq, lossless=False,
                            verdict={"prompt_runs": 31, "identical": 2},
                            batch_noise={"run": "refgroups", "within": True, "within_p99": False})])
    e = row["draft_equivalence"]
    assert e["holds_strict"] is False and e["holds"] is True  # 800 < 990 <= 995
    assert e["equal_or_within_noise_p99_fraction"] == 0.997  # (1000 - 3) / 1000
    md = ar.markdown([row])
    assert "strict 800/1000, with ties 995/1000, within noise (p99) 0.997" in md
    assert "| strict 2/31; with ties False; within batching noise (p99): False; at the widest move: True |" in md
    # one capture row short of the bar with ties: not met, though another holds it
    low = dict(eq, equal=900)
    rows = ar.build([_rec("capture", 3.5, capture_drafts=True, draft_equivalence=eq),
                     _rec("capture", 3.5, capture_drafts=True, draft_equivalence=low, quantization="modelopt-nvfp4")])
    rows[0]["served_speed_bar_met"] = True
    (done,) = ar.done_when(rows)
    assert done["met"]["draft_equivalence"] is False


# ------------------------------------------------------------------ speed at this width (item 5)

sp = _load("speed")
br = _load("bench_report")


def _steps(n_tokens, step_ms, count, propose_ms=None):
    return [{"step_ms": step_ms, "forward_tokens": n_tokens, **({"propose_ms": propose_ms} if propose_ms else {})}
            for _ in range(count)]


def test_speed_summary_reads_steady_steps_and_the_passes_counters():
    # Concurrency 4: a 16-token prefill step is not a verify step (4 * 16 = 64 tokens are).
    dflash = {"4": {"wall_s": 2.0, "generated": 512,
                    "steps": _steps(300, 9.0, 1, 1.0) + _steps(64, 5.0, 20, 1.5) + _steps(64, 7.0, 1, 1.5),
                    "counters": {"spec_drafts": 100, "spec_accepted_tokens": 300}}}
    alone = {"4": {"wall_s": 4.0, "generated": 512, "steps": _steps(300, 9.0, 1) + _steps(4, 2.0, 127)}}
    d = sp.summary(dflash, True, 15)["4"]
    # bench_report's steady steps: the right token count, its first SKIP_STEPS dropped.
    assert (d["tok_s"], d["verify_steps"], d["t_verify_ms"], d["t_draft_ms"], d["tau"]) == \
        (256.0, 21 - br.SKIP_STEPS, 3.5, 1.5, 4.0)
    a = sp.summary(alone, False, 15)["4"]
    assert (a["tok_s"], a["decode_steps"], a["t_decode_ms"]) == (128.0, 127 - br.SKIP_STEPS, 2.0)
    paired = sp.pair(sp.summary(dflash, True, 15), sp.summary(alone, False, 15))["4"]
    # tau 4 tokens for 1.5 + 3.5 ms against one token per 2 ms: 1.6; measured 256 / 128 = 2.
    assert paired["projected_speedup"] == 1.6 and paired["measured_speedup"] == 2.0
    assert paired["measured_over_projected"] == 1.25
    assert br.projected_speedup(4, 2.0, 1.5, 3.5) == 1.6


def test_counter_deltas_are_per_pass():
    before = {"spec_drafts": 10, "spec_accepted_per_pos": [5, 3], "preemptions": 0}
    after = {"spec_drafts": 25, "spec_accepted_per_pos": [9, 4], "preemptions": 1}
    assert sp.counter_delta(before, after) == {"spec_drafts": 15, "spec_accepted_per_pos": [4, 1], "preemptions": 1}
    assert sp.counter_delta({}, {"spec_accepted_per_pos": [2]}) == {"spec_accepted_per_pos": [2]}


def test_rows_carry_the_speed_runs_of_their_configuration_and_the_bar_at_concurrency_1():
    def speed_rec(name, mode, summary, **kw):
        return {"name": name, "mode": mode, "drafter_kind": "trained" if mode == "dflash" else "random",
                "vllm": "0.21.0", "quantization": "bf16", "series": SERIES, "ok": True, "speed": summary, **kw}
    fast = {"1": {"tok_s": 300.0, "tau": 4.0, "t_draft_ms": 1.0, "t_verify_ms": 3.0}}
    alone = {"1": {"tok_s": 100.0, "t_decode_ms": 3.0}}
    records = [_rec("plain", 4.2), speed_rec("s-dflash", "dflash", fast), speed_rec("s-alone", "reference-grouped", alone),
               speed_rec("s-other-quant", "reference-grouped", alone) | {"quantization": "modelopt-nvfp4"}]
    rows = {r["run"]: r for r in ar.build(records)}
    assert set(rows) == {"plain"}  # a speed run is no acceptance row of its own
    row = rows["plain"]
    assert row["tok_s"] == {"1": {"dflash": 300.0, "no_drafter": 100.0}}
    assert row["projected_speedup"] == {"1": 3.0} and row["measured_speedup"] == {"1": 3.0}
    assert row["speed_bar_met"] is True and "300.0 / 100.0, 3.0 / 3.0" in ar.markdown([row])
    # Slower than the projection by more than 15 %: the bar is not met.
    records[1]["speed"] = {"1": dict(fast["1"], tok_s=240.0)}
    assert ar.build(records)[0]["speed_bar_met"] is False
    # No speed runs: nothing is made up.
    lone = ar.build([_rec("plain", 4.2)])[0]
    assert lone["tok_s"] is None and lone["speed_bar_met"] is None and lone["projected_speedup"] is None


def test_speed_runs_time_the_gpu_alone_and_pair_dflash_with_the_target_alone():
    rs = _load("realshape")
    names = [n for n, s in rs.RUNS.items() if s.speed]
    assert sorted(names) == sorted(f"{v}trained-speed-{k}-fa2-cg-{q}" for v in ("", "v33-")
                                   for k in ("dflash-trained", "nodrafter") for q in ("bf16", "nvfp4"))
    for v, q in [(v, q) for v in ("", "v33-") for q in ("bf16", "nvfp4")]:
        d = rs.RUNS[f"{v}trained-speed-dflash-trained-fa2-cg-{q}"]
        a = rs.RUNS[f"{v}trained-speed-nodrafter-fa2-cg-{q}"]
        assert d.vllm == a.vllm == ("0.33.0" if v else "0.21.0")
        assert (d.mode, d.drafter, a.mode) == ("dflash", "trained", "reference-grouped")
        assert d.concurrency == a.concurrency == (1, 4, 16) and d.quant == a.quant
        assert not d.batch_invariant and d.cuda_graphs and d.flash_attn_version == 2
    assert rs.lane_problems("trained-speed-nodrafter-fa2-cg-bf16;trained-ref-bf16", rs.Path("/nonexistent"))
    assert rs.lane_problems("trained-speed-nodrafter-fa2-cg-bf16,trained-speed-dflash-trained-fa2-cg-bf16",
                            rs.Path("/nonexistent")) == []


def test_measure_times_the_second_pass_of_each_group_through_the_runners_steps(monkeypatch):
    """speed.measure on a stand-in engine: the GPU's CUDA events are replaced by a clock that
    advances 2 ms per event (mocked: no GPU here); the runner's step methods are the ones
    bench_steps.StepTimer wraps in vLLM 0.21.0."""
    torch = __import__("pytest").importorskip("torch", reason="speed.measure imports torch (the test venv has it)")

    class Event:
        clock = [0.0]

        def __init__(self, enable_timing=True):
            self.t = None

        def record(self):
            Event.clock[0] += 2.0
            self.t = Event.clock[0]

        def elapsed_time(self, other):
            return other.t - self.t

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    class Runner:
        def __init__(self):
            self.model = type("M", (), {"compute_logits": lambda self, h: h})()
            self.drafter = type("D", (), {"propose": lambda self: None})()

        def execute_model(self):
            return None

        def _model_forward(self, input_ids=None):
            return input_ids

        def sample_tokens(self):
            return None

    runner = Runner()
    counters = {"spec_drafts": 0, "spec_accepted_tokens": 0}

    def generate(llm, params, batch):
        for _ in range(3):  # three verify steps of len(batch) * 16 tokens
            runner.execute_model()
            runner._model_forward(input_ids=torch.zeros(len(batch) * 16))
            runner.model.compute_logits(None)
            runner.drafter.propose()
            runner.sample_tokens()
            counters["spec_drafts"] += len(batch)
            counters["spec_accepted_tokens"] += 2 * len(batch)
        return [{"token_ids": [1] * 10} for _ in batch]

    out = sp.measure(None, runner, [], [[1]] * 4, (1, 4), generate, lambda llm: dict(counters))
    assert set(out) == {"1", "4"}
    four = out["4"]
    assert four["generated"] == 40 and len(four["outputs"]) == 4
    # Only the timed pass: its own 3 steps and counters (the warm-up's are not in them).
    assert len(four["steps"]) == 3 and four["counters"] == {"spec_drafts": 12, "spec_accepted_tokens": 24}
    assert all(s["forward_tokens"] == 64 and s["propose_ms"] > 0 for s in four["steps"])
    row = sp.summary({"4": four}, True, 15)["4"]
    assert row["verify_steps"] == 3 and row["tau"] == 3.0


def test_capture_ablation_and_speed_join_only_rows_of_their_numerics_and_ablations_any_series():
    eq = {"contexts": 250, "equal": 249}
    records = [
        _rec("plain", 4.2), _rec("plain-bi-noinductor", 4.1, batch_invariant=True, compile_backend="eager"),
        _rec("capture", 4.1, capture_drafts=True, draft_equivalence=eq),
        # The reverted tree has its own series hash.
        _rec("capture-without-x", 1.3, capture_drafts=True, revert="x", series="def",
             draft_equivalence={"contexts": 250, "equal": 12}),
    ]
    rows = {r["run"]: r for r in ar.build(records)}
    assert rows["plain"]["draft_equivalence"]["equal"] == 249 and len(rows["plain"]["ablation"]) == 1
    assert rows["plain-bi-noinductor"]["draft_equivalence"] is None and rows["plain-bi-noinductor"]["ablation"] == []


def test_a_capture_run_on_a_newer_series_than_every_plain_run_is_a_row_of_its_own():
    """The capture ran on the series with one more patch than the plain run's: it is not that
    configuration, so it reports its own acceptance and equivalence rather than vanish."""
    eq = {"contexts": 1248, "equal": 1204}
    records = [
        _rec("plain", 2.68, series="old"),
        _rec("capture", 2.80, capture_drafts=True, draft_equivalence=eq, series="new"),
        _rec("capture-without-x", 1.66, capture_drafts=True, revert="x", series="reverted",
             draft_equivalence={"contexts": 2056, "equal": 0}),
    ]
    rows = {r["run"]: r for r in ar.build(records)}
    assert set(rows) == {"plain", "capture"}
    assert rows["plain"]["draft_equivalence"] is None
    capture = rows["capture"]
    assert capture["series"] == "new" and capture["mean_acceptance_length_vllm"] == 2.80
    assert capture["draft_equivalence"]["equal"] == 1204 and capture["draft_equivalence"]["holds"] is False
    assert [a["reverted"] for a in capture["ablation"]] == ["x"]


def test_the_calibrated_equivalence_holds_where_every_unequal_context_is_bf16_noise():
    noise = {"noise_bound": 0.5, "vllm_unequal_beyond_noise": 1, "equal_or_within_noise_fraction": 0.996}
    eq = {"contexts": 250, "equal": 240, "noise": noise}
    row = ar.build([_rec("plain", 4.2), _rec("capture", 4.1, capture_drafts=True, draft_equivalence=eq)])[0]
    assert row["draft_equivalence"]["holds"] is False and row["draft_equivalence"]["holds_within_noise"] is True
    few = {"contexts": 150, "equal": 150, "noise": {**noise, "equal_or_within_noise_fraction": 1.0}}
    row = ar.build([_rec("plain", 4.2), _rec("capture", 4.1, capture_drafts=True, draft_equivalence=few)])[0]
    assert row["draft_equivalence"]["holds_within_noise"] is False  # under 200 contexts


def test_served_speed_rows_join_their_releases_default_numerics_bf16_rows():
    records = [_rec("plain", 2.7), _rec("plain-bi", 2.5, batch_invariant=True),
               _rec("nvfp4", 2.4) | {"quantization": "modelopt-nvfp4"}, _rec("v33", 2.6) | {"vllm": "0.33.0"}]
    rows = ar.build(records)
    speed_rows = [{"concurrency": 1, "output_tok_s": {"with_drafter": 300.0, "without": 200.0},
                   "measured_speedup": 1.5, "mean_acceptance_length": 2.8, "tpot_ms_mean": {}}]
    ar.add_served_speed(rows, {"servers": [
        {"server": "speed", "vllm": "0.21.0", "series": "newer", "bench": "b.json", "speed": speed_rows},
        {"server": "dflash", "vllm": "0.33.0", "speed": speed_rows}]})
    joined = {r["run"]: r["served_speed"] for r in rows}
    assert joined["plain"] == {"series": "newer", "bench": "b.json", "drafter_sha256": None,
                               "per_concurrency": speed_rows, "outputs": "not recorded"}
    assert joined["plain-bi"] is None and joined["nvfp4"] is None and joined["v33"] is None
    # The record fields come from the served measurement (item 5, serving has landed).
    plain = next(r for r in rows if r["run"] == "plain")
    assert plain["speed_source"] == "served" and plain["speed_concurrency"] == [1]
    assert plain["tok_s"] == {"1": {"dflash": 300.0, "no_drafter": 200.0}}
    assert plain["measured_speedup"] == {"1": 1.5} and plain["projected_speedup"] == {"1": None}
    assert next(r for r in rows if r["run"] == "nvfp4")["tok_s"] is None
    # no step times: no projection, so the bar is not judged
    assert {r["run"]: r["served_speed_bar_met"] for r in rows}["plain"] is None
    assert ("| 0.21.0 (plain) | newer | - | 1 | 300.0 / 200.0 | 1.5 | - | - | - | 2.8 | - / - / - | - (- / -) | - |"
            in ar.markdown(rows))


def _gate_block(looping: int) -> dict:
    return {"sequences": 36, "constant_sequences": 0, "median_distinct_fraction": 0.5, "nan_positions": 0,
            "looping_sequences": looping, "prompts": 36, "prompts_full_length": 36}


@pytest.mark.parametrize("measured, projected, looping, met, outputs", [
    (1.5, 1.4, 0, True, "pass the gate"), (1.5, 1.2, 0, False, "pass the gate"),
    (0.95, 0.96, 0, False, "pass the gate"),
    # within the projection, but over looping output (4 of 36 > 10 %), or output never recorded
    (1.5, 1.4, 4, False, "fail the gate"), (1.5, 1.4, None, False, "not recorded")])
def test_the_served_bar_at_one_asks_for_a_win_within_15_percent_of_the_projection_over_gated_output(
        measured, projected, looping, met, outputs):
    rows = ar.build([_rec("plain", 2.7)])
    one = {"concurrency": 1, "output_tok_s": {"with_drafter": 1.0, "without": 1.0}, "measured_speedup": measured,
           "projected_speedup": projected, "measured_over_projected": round(measured / projected, 4),
           "mean_acceptance_length": 3.2, "tpot_ms_mean": {}}
    nd = None if looping is None else {"reference": _gate_block(0), "dflash": _gate_block(looping)}
    ar.add_served_speed(rows, {"servers": [{"server": "speed", "vllm": "0.21.0", "speed": [one], "nondegenerate": nd}]})
    assert rows[0]["served_speed_bar_met"] is met and rows[0]["served_speed"]["outputs"] == outputs


def test_a_retrained_drafter_is_a_row_of_its_own_and_ablations_join_their_own_drafters_row():
    eq = {"contexts": 250, "equal": 240}
    records = [
        _rec("capture", 2.8, capture_drafts=True, draft_equivalence=eq, drafter_sha256="old"),
        _rec("capture-without-x", 1.7, capture_drafts=True, revert="x", drafter_sha256="old",
             draft_equivalence={"contexts": 250, "equal": 0}),
        _rec("capture", 3.0, capture_drafts=True, draft_equivalence=dict(eq, equal=245), drafter_sha256="new"),
    ]
    rows = {r["drafter_sha256"]: r for r in ar.build(records)}
    assert set(rows) == {"old", "new"}
    assert [a["reverted"] for a in rows["old"]["ablation"]] == ["x"] and rows["new"]["ablation"] == []
    assert rows["old"]["draft_equivalence"]["equal"] == 240 and rows["new"]["draft_equivalence"]["equal"] == 245
    md = ar.markdown(list(rows.values()))
    assert f"| capture | 0.21.0 | {ABC} | new | bf16 | 3.0 |" in md


def test_a_served_speed_row_joins_only_the_rows_of_the_drafter_it_served():
    rows = ar.build([_rec("capture", 2.8, capture_drafts=True, drafter_sha256="old"),
                     _rec("capture", 3.0, capture_drafts=True, drafter_sha256="new")])
    speed_rows = [{"concurrency": 1, "output_tok_s": {"with_drafter": 300.0, "without": 200.0}}]
    ar.add_served_speed(rows, {"servers": [{"server": "speed", "vllm": "0.21.0", "drafter_sha256": "new",
                                            "speed": speed_rows}]})
    assert {r["drafter_sha256"]: bool(r["served_speed"]) for r in rows} == {"old": False, "new": True}


def test_a_run_that_measured_another_trees_compiled_target_is_no_ablation_entry():
    stale = [{"artifact": "ffe83d1f", "saved_by": ["capture-without-y"], "trees": ["5ae8"]}]
    records = [_rec("capture", 3.0, capture_drafts=True),
               _rec("capture-without-x", 1.8, capture_drafts=True, revert="x", stale_compile_artifacts=stale),
               _rec("capture-without-y", 3.0, capture_drafts=True, revert="y")]
    (row,) = ar.build(records)
    assert [a["reverted"] for a in row["ablation"]] == ["y"]


# ------------------------------------------------------------------ the "Done when"

OFFSET, EMBED = "dflash-target-layer-ids-offset", "gemma4-dflash-embed-scale-logit-softcap"


def test_the_ablation_asks_for_every_drafter_side_patch_realshape_reverts():
    """From realshape's own runs: both drafter-side patches on 0.21.0, the embed scale on 0.33.0
    (the layer offset is upstream there)."""
    assert ar.drafter_side_patches() == {"0.21.0": {OFFSET, EMBED}, "0.33.0": {EMBED}}


def _done(records: list[dict]) -> dict:
    return {(d["vllm"], d["drafter_sha256"]): d for d in ar.done_when(ar.build(records))}


def test_done_when_judges_each_drafter_apart_and_names_what_is_missing():
    eq = {"contexts": 250, "equal": 249}
    new = dict(drafter_sha256="new")
    records = [
        # The earlier drafter: under 3, its ablation whole.
        _rec("capture", 2.7, ref=2.7, capture_drafts=True, draft_equivalence=eq, drafter_sha256="old"),
        _rec("capture-without-o", 2.0, capture_drafts=True, revert=OFFSET, drafter_sha256="old"),
        _rec("capture-without-e", 1.5, capture_drafts=True, revert=EMBED, drafter_sha256="old"),
        # The new one: every row at 3.5, one reverted patch recorded of the two.
        _rec("capture", 3.5, ref=3.6, capture_drafts=True, draft_equivalence=eq, **new),
        _rec("nvfp4", 3.4, ref=3.5, quantization="modelopt-nvfp4", **new),
        _rec("capture-without-e", 1.9, capture_drafts=True, revert=EMBED, **new),
    ]
    done = _done(records)
    old, fresh = done[("0.21.0", "old")], done[("0.21.0", "new")]
    assert old["met"] == {"acceptance": False, "concurrency": False, "lossless": False, "draft_equivalence": True,
                          "ablation": True, "speed": False, "gate": True, "current_series": True}
    assert fresh["met"]["acceptance"] is True and fresh["acceptance"]["nvfp4"] == {"rows": ["nvfp4"], "met": ["nvfp4"]}
    # The old drafter's offset ablation does not stand in for the new one's.
    assert fresh["met"]["ablation"] is False and fresh["ablation_recorded"] == [EMBED]
    assert fresh["speed_served"] is None and fresh["done"] is False
    md = ar.markdown(ar.build(records))
    assert (f"| 0.21.0 | new | {ABC} | 1/1 | 1/1 | 0 / 0 | not met (0/0 / 0/0) | met (250 contexts) "
            f"| not met (missing: {OFFSET}) "
            "| not measured (not measured) | met | met | no |") in md


def _done_when_records() -> list[dict]:
    """A release's rows that meet every Done-when item but the served speed: a capture run,
    bf16 and NVFP4 at 1/8/22, the exact-numerics rows, and an ablation per drafter-side patch."""
    eq = {"contexts": 300, "equal": 299}
    levels = dict(concurrency=[1, 8, 22])
    return [_rec("capture", 3.5, ref=3.6, capture_drafts=True, draft_equivalence=eq, concurrency=[1, 8, 17]),
            _rec("bf16", 3.4, ref=3.5, **levels),
            _rec("nvfp4", 3.3, ref=3.4, quantization="modelopt-nvfp4", **levels), *EXACT,
            _rec("capture-without-o", 2.0, capture_drafts=True, revert=OFFSET),
            _rec("capture-without-e", 1.5, capture_drafts=True, revert=EMBED)]


def test_done_when_needs_every_row_and_a_served_speed_win_at_concurrency_1():
    base = _done_when_records()
    rows = ar.build(base)
    rows[0]["speed_bar_met"] = True
    # The offline engine's pair does not stand in for the served measurement (serving has landed).
    (done,) = ar.done_when(rows)
    assert done["speed_offline"] is True and done["met"]["speed"] is False and done["done"] is False
    rows[0]["served_speed_bar_met"] = True
    (done,) = ar.done_when(rows)
    assert done["done"] is True and "| met (met) | met | met | **done** |" in ar.markdown(rows)
    assert done["acceptance"]["bf16"]["rows"] == ["bf16", "bf16-exact", "capture"]  # the joined capture counts
    # One row under the bar (an exact-numerics row at 2.9) undoes it.
    rows = ar.build(base + [_rec("exact", 2.9, ref=3.0, batch_invariant=True)])
    rows[0]["served_speed_bar_met"] = True
    (done,) = ar.done_when(rows)
    assert done["met"]["acceptance"] is False and done["acceptance"]["bf16"]["met"] == ["bf16", "bf16-exact", "capture"]
    assert done["done"] is False
    # A measured speed bar that failed is "not met", not "not measured".
    rows[0]["served_speed_bar_met"] = False
    (done,) = ar.done_when(rows)
    assert done["speed_served"] is False and done["met"]["speed"] is False
    assert "| not met (not measured) |" in ar.markdown(rows)


def test_done_when_needs_a_bf16_and_an_nvfp4_row_at_1_8_and_22():
    """Item 4 measures both targets at 1, 8 and 22 in flight: capture runs at 1, 8, 17 alone, or
    bf16 rows alone, leave it open however well they accept."""
    eq = {"contexts": 300, "equal": 299}
    base = [_rec("capture", 3.5, ref=3.6, capture_drafts=True, draft_equivalence=eq, concurrency=[1, 8, 17]),
            _rec("capture-without-o", 2.0, capture_drafts=True, revert=OFFSET),
            _rec("capture-without-e", 1.5, capture_drafts=True, revert=EMBED), *EXACT]

    def judged(extra):
        rows = ar.build(base + extra)
        rows[0]["served_speed_bar_met"] = True
        return ar.done_when(rows)[0]

    only_capture = judged([])
    assert only_capture["met"]["acceptance"] is True and only_capture["met"]["concurrency"] is False
    assert only_capture["done"] is False
    bf16_only = judged([_rec("bf16", 3.4, ref=3.5, concurrency=[1, 8, 22])])
    assert bf16_only["at_issue_concurrency"] == {"bf16": ["bf16"], "nvfp4": []} and bf16_only["done"] is False
    both = judged([_rec("bf16", 3.4, ref=3.5, concurrency=[1, 8, 22]),
                   _rec("nvfp4", 3.3, ref=3.4, quantization="modelopt-nvfp4", concurrency=[1, 8, 22])])
    assert both["met"]["concurrency"] is True and both["done"] is True
    assert "| 3/3 | 2/2 | 1 / 1 | met (1/1 / 1/1) |" in ar.markdown(ar.build(base + [_rec("bf16", 3.4, ref=3.5, concurrency=[1, 8, 22]),
                                                                  _rec("nvfp4", 3.3, ref=3.4, quantization="modelopt-nvfp4",
                                                                       concurrency=[1, 8, 22])]))


def test_a_joined_capture_run_keeps_its_own_acceptance_and_is_judged_with_the_row():
    """The capture run at 1, 8, 17 joins the row of the run at 1, 8, 22: its equivalence is the
    row's, and its own acceptance is kept beside the row's, not lost, and counts for the bar."""
    eq = {"contexts": 900, "equal": 890}
    capture = _rec("capture", 2.5, ref=4.0, capture_drafts=True, draft_equivalence=eq, concurrency=[1, 8, 17],
                   acceptance_along_output={"mean_acceptance_length": 2.52})
    (row,) = ar.build([_rec("plain", 3.9, concurrency=[1, 8, 22]), capture])
    assert row["run"] == "plain" and row["draft_equivalence"]["equal"] == 890
    assert row["capture_run"]["run"] == "capture" and row["capture_run"]["concurrency"] == [1, 8, 17]
    assert row["capture_run"]["mean_acceptance_length_vllm"] == 2.5
    assert row["capture_run"]["relative_gap_along_output"] == 0.0079
    assert row["capture_run"]["acceptance_bar_met"] is False  # under 3
    (done,) = ar.done_when([row])
    assert done["acceptance"]["bf16"] == {"rows": ["capture", "plain"], "met": ["plain"]}
    assert done["met"]["acceptance"] is False
    assert "in capture at 1/8/17: acceptance 2.5, along its output 2.52, not met" in ar.markdown([row])
    # A capture run that is the row itself names no capture run beside it.
    (alone,) = ar.build([capture])
    assert alone["capture_run"] is None


@pytest.mark.parametrize("extra, met", [
    ([], True),
    # no exact-numerics NVFP4 row: nothing proves its output identical
    ([("drop", "nvfp4-exact")], False),
    # an exact row that diverged
    ([("lossless", False)], False),
    # a default-numerics row whose divergences lie beyond the batching noise (its 99th percentile)
    ([("noise", False)], False),
    # undecided (a swapped token outside the kept logprobs) is not a pass (issue 51)
    ([("noise", None)], False),
    # within the twin's widest move but not within its 99th percentile: the percentile decides
    ([("widest", True), ("noise", False)], False),
])
def test_done_when_asks_for_identical_exact_numerics_rows_of_both_targets(extra, met):
    records = [dict(r) for r in EXACT] + [_rec("plain", 3.4, ref=3.5, lossless=False,
                                               batch_noise={"run": "refgroups", "within": True, "within_p99": True})]
    for what, value in extra:
        if what == "drop":
            records = [r for r in records if r["name"] != value]
        elif what == "lossless":
            records[0]["lossless"] = value
        elif what == "widest":
            records[-1]["batch_noise"]["within"] = value
        else:
            records[-1]["batch_noise"]["within_p99"] = value
    (done,) = ar.done_when(ar.build(records))
    assert done["met"]["lossless"] is met


def test_a_stale_row_or_one_that_fails_the_gate_is_marked_and_keeps_done_open():
    """Issue 51: a row that ran a superseded series is marked stale in the JSON and the headline;
    a row whose reference loops fails the gate and is shown as not proof; either keeps "done" open."""
    base = _done_when_records()

    def judged(records):
        rows = ar.build(records)
        rows[0]["served_speed_bar_met"] = True
        return rows, ar.done_when(rows)[0]

    rows, done = judged(base)
    assert done["done"] is True and all(r["staleness"] == "current" and r["gate_passes"] for r in rows)
    # the same rows on another series: stale, and not done
    old = [dict(r, series="f" * 64) for r in base]
    rows, done = judged(old)
    assert {r["staleness"] for r in rows} == {"stale"} and done["met"]["current_series"] is False
    assert done["done"] is False and f"**{len(rows)} of {len(rows)} rows are stale**" in ar.markdown(rows)
    # a reference with 4 of 32 sequences ending in 93 copies of one token: 12.5 % looping
    loops = [{"token_ids": list(range(i * 128, i * 128 + 35)) + [7] * 93} for i in range(4)]
    looping = gate.nondegenerate(loops + [{"token_ids": list(range(i * 128, (i + 1) * 128))} for i in range(4, 32)])
    bad = [dict(base[1], reference_nondegenerate=looping)] + [r for r in base if r is not base[1]]
    rows, done = judged(bad)
    row = next(r for r in rows if r["run"] == "bf16")
    assert row["gate_passes"] is False and any("looping" in w for w in row["gate_failures"])
    assert done["met"]["gate"] is False and done["done"] is False
    assert "**not proof**: reference: 4 of 32 sequences looping" in ar.markdown(rows)


# ---------------------------------------------------------------- the headline (issue 51, item 3)


def _outputs(prompts: int, loops: int) -> list[list[int]]:
    """Greedy outputs of 128 seeded random tokens, the first ``loops`` of them ending in a
    2-token cycle of 64 tokens (gate.looping's case)."""
    import random

    tokens = []
    for i in range(prompts):
        r = random.Random(i)
        seq = [r.randrange(5000) for _ in range(128)]
        if i < loops:
            seq[-64:] = [7, 8] * 32
        tokens.append(seq)
    return tokens


def _headline_case(loops: int, prompts: int = 36, series: str = "0" * 64):
    """A drafter record whose prompt i accepts i % 5 drafts a step, and the release's bf16
    reference run whose first ``loops`` outputs loop (a 2-token cycle at their end)."""
    target, drafter = "9" * 64, "4f" * 32
    steps = [[i % 5] * (10 + i) for i in range(prompts)]
    dr = {"drafter_sha256": drafter, "target_sha256": target, "_source": "x.json",
          "evaluation": {"vllm-0.21.0": {"per_prompt_steps": steps,
                                         "as_realshape_groups": {"mean_acceptance_length": 9.9}}}}
    tokens = _outputs(prompts, loops)
    rec = {"name": "trained-ref-bf16", "ok": True, "target_sha256": target, "series": series,
           "vllm": "0.21.0", "nondegenerate": None}
    raw = {"name": "trained-ref-bf16", "source": "t.tar.xz!ref.raw.json", "series": series,
           "target_sha256": target, "drafter_sha256": None, "tokens": tokens,
           "keys": list(range(prompts)), "block": {"near_ties": 0, "nan_positions": 0}}
    return [rec], [dr], [raw], steps


def test_the_headline_takes_every_prompt_once_with_min_median_max_and_the_loop_free_subset():
    records, drafters, index, steps = _headline_case(loops=3)
    [row] = ar.headline(records, drafters, index)
    a = row["all_prompts"]
    # pooled over every prompt's steps once, not weighted by the concurrency groups (9.9)
    flat = [f for s in steps for f in s]
    assert a["prompts"] == 36 and a["mean_acceptance_length"] == round(1 + sum(flat) / len(flat), 4)
    assert row["as_realshape_groups"] == 9.9
    assert (a["per_prompt_min"], a["per_prompt_median"], a["per_prompt_max"]) == (1.0, 3.0, 5.0)
    # prompts 0, 1, 2 loop in the reference: the subset leaves them out (they accept 0, 1, 2)
    assert row["looping_prompts"] == 3 and row["loop_free"]["prompts"] == 33
    kept = [f for s in steps[3:] for f in s]
    assert row["loop_free"]["mean_acceptance_length"] == round(1 + sum(kept) / len(kept), 4)
    # 3 of 36 is under 10 % looping, and all 36 prompts have 128 tokens: the gate passes; the
    # record's series is not the current one, so the headline is still not proof
    assert row["gate_passes"] and row["staleness"] == "stale" and row["proof"] is False
    md = ar.markdown([], [row])
    assert "**0 of 1 headline rows are proof.**" in md and "**not proof**: series stale" in md


def test_a_headline_whose_reference_fails_the_gate_or_has_no_tokens_is_not_proof(monkeypatch):
    records, drafters, index, _ = _headline_case(loops=11)
    monkeypatch.setattr(ar.series_now, "staleness", lambda rec: "current")
    [row] = ar.headline(records, drafters, index)
    assert row["gate_failures"] == ["11 of 36 sequences looping (at most 10%)"] and row["proof"] is False
    [row] = ar.headline(records, drafters, [])
    assert row["loop_free"] is None and row["gate_failures"] == ["no raw reference tokens for these prompts"]
    assert not row["proof"]
    records, drafters, index, _ = _headline_case(loops=0)
    [row] = ar.headline(records, drafters, index)
    assert row["gate_passes"] and row["proof"] is True


def test_the_committed_headline_is_the_offline_walk_of_every_prompt_once_and_not_proof():
    import json
    from pathlib import Path

    results = Path(__file__).resolve().parents[1] / "gpu" / "results"
    heads = json.loads((results / "acceptance-headline.json").read_text())
    row = next(r for r in heads if r["drafter_sha256"].startswith("4f7c6c17") and r["vllm"] == "0.21.0")
    train = json.loads((results / "trained" / "drafter-train-record-4f7c6c17-h200.json").read_text())
    assert row["all_prompts"]["mean_acceptance_length"] == \
        train["evaluation"]["vllm-0.21.0"]["all_prompts"]["mean_acceptance_length"]
    assert row["all_prompts"]["prompts"] == 36 and row["loop_free"]["prompts"] == 36 - row["looping_prompts"]
    # the offline walks rest on references that fail the gate or ran on a superseded series
    assert not any(r["proof"] for r in heads if r["reference_run"] != "conformance-twin")


def test_the_committed_headline_of_the_gated_target_is_vllms_own_and_proof_on_both_releases():
    """The conformance run on 84c26c18: its rows agree with conformance.py's own reading of the
    same records (served_acceptance), and rest on twins that pass the gate on the current series."""
    import json
    from pathlib import Path

    results = Path(__file__).resolve().parents[1] / "gpu" / "results"
    heads = json.loads((results / "acceptance-headline.json").read_text())
    conf = json.loads((results / "conformance.json").read_text())
    served = [r for r in heads if r["reference_run"] == "conformance-twin"]
    assert sorted(r["vllm"] for r in served) == ["0.21.0", "0.33.0"]
    for row in served:
        release = next(v for v in conf["releases"] if v["vllm"] == row["vllm"] and not v.get("variant"))
        assert row["all_prompts"]["mean_acceptance_length"] == pytest.approx(
            release["served_acceptance"]["mean_acceptance_length"], abs=1e-4)
        assert row["all_prompts"]["prompts"] == 36 and row["target_sha256"] == conf["target_sha256"]
        assert row["looping_prompts"] == release["twin_gate"]["looping_sequences"]
        assert row["proof"] is True and row["staleness"] == "current"
    assert "**2 of" in (results / "acceptance.md").read_text().split("## Every run")[0]


def _conformance_archive(tmp_path, loops: int, series: str | None = None):
    """A conformance run's archive as served-all leaves it: 36 prompts of 128 tokens, the first
    ``loops`` of the twin's outputs ending in a loop; request i accepts i % 5 of 2 drafts' tokens."""
    series = series or ar.series_now.current_hash("0.21.0")  # this checkout's series: current
    tokens = _outputs(36, loops)
    acc = [{"drafts": 2, "accepted_tokens": i % 5, "mean_acceptance_length": 1 + (i % 5) / 2} for i in range(36)]
    files = {"out/zlab-reference.json": {"target_sha256": "t" * 64, "drafter_sha256": "d" * 64},
             "served/conformance.json": {"vllm": "0.21.0", "series": series, "server": "conformance",
                                         "rows": [{"token_ids": t, "acceptance": a} for t, a in zip(tokens, acc)]},
             "served/conformance-twin.json": {"vllm": "0.21.0", "series": series, "server": "conformance-twin",
                                              "rows": [{"token_ids": t} for t in tokens]}}
    return json_tar(tmp_path / "served-raw.tar.xz", files), acc


def test_a_conformance_run_gives_a_headline_of_vllms_per_request_counters(tmp_path):
    path, acc = _conformance_archive(tmp_path, loops=3)
    [row] = ar.served_headline(path)
    a = row["all_prompts"]
    # pooled over the requests' drafts, each prompt once; min / median / max of the requests' own
    assert a["mean_acceptance_length"] == round(1 + sum(x["accepted_tokens"] for x in acc) / 72, 4)
    assert (a["per_prompt_min"], a["per_prompt_median"], a["per_prompt_max"]) == (1.0, 2.0, 3.0)
    # the twin's looping prompts (0, 1, 2: they accept 0, 1, 2 tokens) leave the loop-free subset
    assert row["looping_prompts"] == 3 and row["loop_free"]["prompts"] == 33
    kept = acc[3:]
    assert row["loop_free"]["mean_acceptance_length"] == round(
        1 + sum(x["accepted_tokens"] for x in kept) / (2 * len(kept)), 4)
    assert row["proof"] is True and row["target_sha256"] == "t" * 64 and row["vllm"] == "0.21.0"
    assert row["source"].endswith("served-raw.tar.xz!served/conformance.json")
    # the twin failing the gate (4 of 36 looping), or a superseded series: not proof
    [row] = ar.served_headline(_conformance_archive(tmp_path, loops=4)[0])
    assert row["gate_failures"] == ["4 of 36 sequences looping (at most 10%)"] and row["proof"] is False
    [row] = ar.served_headline(_conformance_archive(tmp_path, loops=0, series="0" * 64)[0])
    assert row["gate_passes"] and row["staleness"] == "stale" and row["proof"] is False
