"""The oracle's wiring into realshape.py (issue 24), on CPU: the oracle runs and their
references, the plan made from a reference's raw record, the refusal without one, the
ordering of runs and lanes, and the verdict (reference cut to the oracle's length,
vLLM's histogram against the oracle's).

Nothing here starts vLLM. What stands in for the GPU: raw records written by hand in
the shape run_child writes them, vLLM's counters made with oracle.counters_from_accepted
(what SpecDecodingStats.observe_draft adds up), and oracle logs written as Oracle.step
writes them, analysed by the real oracle.analyse.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

from tests.unit.gpu_scripts import load as _load

rs = _load("realshape")
oracle = rs.oracle
K = rs.NUM_SPECULATIVE_TOKENS
TRIPLES = [  # oracle run, the DFlash run whose engine it has, its reference
    ("trained-oracle-fa2-cg-bf16", "trained-dflash-fa2-cg-bf16", "trained-ref-bf16"),
    ("trained-oracle-fa2-cg-nvfp4", "trained-dflash-fa2-cg-nvfp4", "trained-ref-nvfp4"),
    ("trained-oracle-fa2-cg-bf16-smallkv", "trained-dflash-fa2-cg-bf16-smallkv", "trained-ref-bf16"),
    ("trained-oracle-fa2-cg-nvfp4-smallkv", "trained-dflash-fa2-cg-nvfp4-smallkv", "trained-ref-nvfp4"),
]
SHA = "a" * 64


# ------------------------------------------------------------------ the runs


@pytest.mark.parametrize("name,dflash,ref", TRIPLES)
def test_oracle_runs_have_their_dflash_engine_and_reference(name, dflash, ref, tmp_path):
    spec, twin = rs.RUNS[name], rs.RUNS[dflash]
    assert spec.oracle and not twin.oracle and spec.trained and spec.vllm == "0.21.0"
    assert spec.reference == ref and rs.reference_for(spec).name == ref
    assert rs.RUNS[ref].mode == "reference" and rs.RUNS[ref].quant == spec.quant
    # Same engine: every LLM(...) argument equal to the DFlash run's.
    kw = rs.trained_engine_kwargs(spec, tmp_path)
    assert kw == rs.trained_engine_kwargs(twin, tmp_path)
    sc = kw["speculative_config"]
    assert (sc["method"], sc["num_speculative_tokens"], sc["attention_backend"]) == ("dflash", 15, "flash_attn")
    assert kw["attention_config"] == {"flash_attn_version": 2} and "compilation_config" in kw
    assert kw["enforce_eager"] is False and kw["enable_prefix_caching"] is True
    assert spec.series == "patched" and spec.concurrency == twin.concurrency
    # Its own record identity: an oracle record never replaces the DFlash one.
    assert spec.key()["mode"] == "oracle" and spec.key() != twin.key()
    assert {k: v for k, v in spec.key().items() if k != "mode"} == \
        {k: v for k, v in twin.key().items() if k != "mode"}


def test_the_small_pool_oracle_run_forces_preemption_and_only_oracle_runs_are_oracles():
    assert rs.RUNS["trained-oracle-fa2-cg-bf16-smallkv"].kv_blocks == rs.TRAINED_SMALL_POOL
    assert rs.RUNS["trained-oracle-fa2-cg-bf16-smallkv"].concurrency == (17, 32)
    assert {n for n, s in rs.RUNS.items() if s.oracle and s.vllm == "0.21.0"} == \
        {t[0] + suffix for t in TRIPLES for suffix in ("", "-bi", "-bi-noinductor")}
    # 0.33.0's oracle runs (exact numerics) are judged by 0.33.0's references.
    v33 = [s for s in rs.RUNS.values() if s.oracle and s.vllm == "0.33.0"]
    assert v33 and all(rs.RUNS[s.reference].vllm == "0.33.0" for s in v33)
    # The default order (all trained runs, remote.sh without RUNS) has each reference first.
    names = list(rs.RUNS)
    for name, _, ref in TRIPLES:
        assert names.index(ref) < names.index(name)


def test_oracle_runs_move_after_their_reference_and_keep_their_order():
    asked = ["trained-oracle-fa2-cg-bf16", "trained-oracle-fa2-cg-bf16-smallkv", "trained-dflash-fa2-cg-bf16",
             "trained-ref-bf16", "trained-ref-nvfp4"]
    assert rs.order_runs(asked) == ["trained-dflash-fa2-cg-bf16", "trained-ref-bf16", "trained-oracle-fa2-cg-bf16",
                                    "trained-oracle-fa2-cg-bf16-smallkv", "trained-ref-nvfp4"]
    # Without its reference in the call (a raw record of an earlier call), nothing moves.
    assert rs.order_runs(["trained-oracle-fa2-cg-nvfp4", "trained-ref-bf16"]) == \
        ["trained-oracle-fa2-cg-nvfp4", "trained-ref-bf16"]


def test_lanes_refuse_an_oracle_whose_reference_runs_elsewhere_or_nowhere(tmp_path):
    ok = "trained-ref-bf16,trained-oracle-fa2-cg-bf16;trained-ref-nvfp4"
    assert rs.lane_problems(ok, tmp_path) == []
    split = "trained-ref-bf16;trained-oracle-fa2-cg-bf16"
    assert rs.lane_problems(split, tmp_path) == \
        ["trained-oracle-fa2-cg-bf16: its reference trained-ref-bf16 runs in another lane or has no raw "
         "record yet: put trained-ref-bf16 in the same lane"]
    alone = "trained-oracle-fa2-cg-nvfp4;trained-dflash-fa2-cg-bf16"
    assert len(rs.lane_problems(alone, tmp_path)) == 1
    (tmp_path / "trained-ref-nvfp4.raw.json").write_text("{}")  # from an earlier call
    assert rs.lane_problems(alone, tmp_path) == []
    assert rs.main(["--models", str(tmp_path), "--raw-dir", str(tmp_path), "--check-lanes", split]) == 2


# ------------------------------------------------------------------ the plan


def _prompts(n=6):
    rng = random.Random(1)
    return [[2] + [rng.randrange(30, 8000) for _ in range(rng.randrange(15, 60))] for _ in range(n)]


def _tokens(seed, n=128):
    rng = random.Random(seed)
    return [rng.randrange(30, 8000) for _ in range(n)]


def _models(tmp_path, prompts, sha=SHA):
    """The files run_child and prepare_oracle read: prompts.json and train-record.json."""
    target = tmp_path / "models" / rs.TRAINED_TARGET
    target.mkdir(parents=True)
    (target / "prompts.json").write_text(json.dumps([{"token_ids": p, "max_tokens": 128} for p in prompts]))
    (target / "train-record.json").write_text(json.dumps({"target_sha256": sha}))
    return tmp_path / "models"


def _out(prompt, tokens):
    return {"prompt_len": len(prompt), "token_ids": tokens,
            "top": [[[t, 10.0, 1], [t + 1, 8.0, 2]] for t in tokens]}


def _reference_raw(prompts, sha=SHA, n=128):
    """A reference raw record as run_child writes it: two identical one-at-a-time passes."""
    outs = [_out(p, _tokens(i, n)) for i, p in enumerate(prompts)]
    return {"name": "trained-ref-bf16", "ok": True, "target_sha256": sha, "passes": [outs, outs]}


def _setup(tmp_path, ref_raw=None, prompts=None):
    prompts = prompts or _prompts()
    models = _models(tmp_path, prompts)
    raw_dir = tmp_path / "raw"
    raw_dir.mkdir()
    if ref_raw is not False:
        ref_raw = ref_raw or _reference_raw(prompts)
        (raw_dir / "trained-ref-bf16.raw.json").write_text(json.dumps(ref_raw))
    return models, raw_dir, prompts


def test_plan_is_made_from_the_references_raw_record(tmp_path):
    models, raw_dir, prompts = _setup(tmp_path)
    spec = rs.RUNS["trained-oracle-fa2-cg-bf16"]
    plan_path, log_path = rs.oracle_paths(spec, raw_dir)
    log_path.write_text('{"stale": 1}\n')  # an earlier call's log must not count again
    env = rs.prepare_oracle(spec, models, raw_dir)
    assert env == {"ORACLE_PLAN": str(plan_path), "ORACLE_LOG": str(log_path), "VLLM_USE_V2_MODEL_RUNNER": "0"}
    assert plan_path.parent == raw_dir and not log_path.exists()
    plan = oracle.load_plan(plan_path)
    assert plan["k"] == K == 15 and plan["seed"] == rs.ORACLE_SEED
    assert plan["vocab_size"] == rs.lm_files.VOCAB_SIZE
    assert set(plan["special_ids"]) == set(rs.lm_files.SPECIAL_TOKENS.values())
    assert [r["prompt"] for r in plan["requests"]] == prompts
    assert [r["reference"] for r in plan["requests"]] == [_tokens(i) for i in range(len(prompts))]
    # 128-token references leave 113 new tokens: every draft stays inside the reference.
    assert [r["max_tokens"] for r in plan["requests"]] == [113] * len(prompts)
    assert not any(r["short"] for r in plan["requests"])
    # What the child does with it: the plan's lengths, and an Oracle that drafts the reference.
    assert rs.oracle_workload(plan, prompts) == [113] * len(prompts)
    with pytest.raises(RuntimeError, match="other prompts"):
        rs.oracle_workload(plan, prompts[::-1])
    orc = oracle.Oracle(plan)
    n = 40  # output tokens so far: the verify step's seq_len is prompt + n - 1 (+ no rejections)
    (draft,) = orc.step([oracle.Row("r0", tuple(prompts[2]), len(prompts[2]) + n - 1, 0, 0)]).values()
    f = oracle.first_wrong(rs.ORACLE_SEED, 2, 0, K)
    assert draft[:f] == _tokens(2)[n:n + f] and (f == K or draft[f] != _tokens(2)[n + f])


def test_a_missing_reference_fails_the_oracle_run_by_name(tmp_path):
    models, raw_dir, _ = _setup(tmp_path, ref_raw=False)
    spec = rs.RUNS["trained-oracle-fa2-cg-bf16"]
    with pytest.raises(rs.OracleSetupError, match="needs its reference trained-ref-bf16"):
        rs.prepare_oracle(spec, models, raw_dir)
    # run_one returns a failed raw record without starting a child (exit None) ...
    raw = rs.run_one(spec, models, "/nonexistent-site", raw_dir, 0, 1)
    assert raw["ok"] is False and raw["exit"] is None
    assert "trained-ref-bf16" in raw["error"]["root_cause"]
    # ... which becomes a failed record, not a missing one.
    rec = rs.record(spec, raw, None, {})
    assert rec["ok"] is False and rec["proof"] is False and "trained-ref-bf16" in rec["error"]


def test_main_records_the_missing_reference_as_a_failed_oracle_run(tmp_path):
    models, raw_dir, _ = _setup(tmp_path, ref_raw=False)
    out, md = tmp_path / "realshape.json", tmp_path / "realshape.md"
    assert rs.main(["--models", str(models), "--raw-dir", str(raw_dir), "--runs", "trained-oracle-fa2-cg-nvfp4",
                    "--out", str(out), "--md", str(md)]) == 0
    (rec,) = json.loads(out.read_text())
    assert rec["name"] == "trained-oracle-fa2-cg-nvfp4" and rec["mode"] == "oracle" and not rec["ok"]
    assert "trained-ref-nvfp4" in rec["error"]
    assert "## Oracle runs (issue 24)" in md.read_text()


@pytest.mark.parametrize("change,reason", [
    (dict(target_sha256="b" * 64), "ran target"),
    (dict(ok=False, error={"root_cause": "CUDA OOM"}), "failed"),
])
def test_a_reference_of_another_target_or_a_failed_one_makes_no_plan(tmp_path, change, reason):
    prompts = _prompts()
    models, raw_dir, _ = _setup(tmp_path, ref_raw=dict(_reference_raw(prompts), **change), prompts=prompts)
    with pytest.raises(rs.OracleSetupError, match=reason):
        rs.prepare_oracle(rs.RUNS["trained-oracle-fa2-cg-bf16"], models, raw_dir)


def test_the_child_refuses_an_engine_core_in_another_process(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(RuntimeError, match="VLLM_ENABLE_V1_MULTIPROCESSING=0"):
        rs.install_oracle(rs.RUNS["trained-oracle-fa2-cg-bf16"])


def test_113_tokens_cover_every_length_over_the_runs_groups_but_not_in_one_request():
    """Why oracle_max_tokens = 128 - 15 is enough: one request needs 137 for a full cycle,
    the groups of a run (1, 4, 17, 32 or 17, 32 requests) cover every length many times."""
    assert rs.oracle_max_tokens(128) == 113 < oracle.min_tokens_for_full_cycle(K)
    for name, _, _ in TRIPLES:
        hist = [0] * (K + 1)
        for c in rs.RUNS[name].concurrency:
            hist = [a + b for a, b in zip(hist, oracle.plan([113] * c, rs.ORACLE_SEED, K)["histogram"])]
        assert min(hist) >= 10, (name, hist)
    assert not oracle.plan([113], rs.ORACLE_SEED, K)["every_f_occurs"]


# ------------------------------------------------------------------ the verdict


def _log(fs_per_request):
    """Oracle log lines as Oracle.step writes them for requests that each verify every
    proposal in full (no preemption, no trimmed drafts): proposal s of a request at n
    output tokens with first-wrong f; the next line (d = K drafts verified) at n + f + 1."""
    lines, call = [], 0
    for p, fs in enumerate(fs_per_request):
        n, d = 1, 0
        for step, f in enumerate(fs + [None]):
            call += 1
            rec = {"call": call, "row": 0, "req": f"r{p}", "p": p, "d": d, "sampled": True, "n": n}
            if f is not None:
                rec.update(step=step, f=f, f_eff=f, k=K, tail=False)
                n, d = n + f + 1, K
            lines.append(rec)
    return lines


def _oracle_raw(prompts, refs, accepted_fs, counted_fs=None, lengths=113):
    """An oracle run's raw record: outputs equal to the references' first ``lengths``
    tokens, vLLM's counters from ``counted_fs`` (default: what the oracle planned)."""
    counted = [f for fs in (counted_fs or accepted_fs) for f in fs]
    drafts, pos = oracle.counters_from_accepted(counted, K)
    outs = [_out(p, r[:lengths]) for p, r in zip(prompts, refs)]
    return {"ok": True, "target_sha256": SHA, "oracle_max_tokens": [113] * len(prompts),
            "groups": {"1": outs[:1], str(len(outs)): outs},
            "counters": {"spec_drafts": drafts, "spec_accepted_per_pos": pos, "preemptions": 0},
            "oracle_analysis": oracle.analyse(_log(accepted_fs), K)}


ALL = [[f for f in range(K + 1)], [K - f for f in range(K + 1)]]


def _case(**kw):
    prompts = _prompts(2)
    ref = _reference_raw(prompts)
    refs = [o["token_ids"] for o in ref["passes"][0]]
    return rs.RUNS["trained-oracle-fa2-cg-bf16"], ref, _oracle_raw(prompts, refs, **kw)


def test_the_judge_cuts_the_reference_to_the_oracles_length():
    _, ref, raw = _case(accepted_fs=ALL)
    assert rs.judge(ref, raw)["lossless"] is False  # uncut: every prompt "differs in length"
    v = rs.judge_oracle(ref, raw)
    assert v["lossless"] is True and v["identical"] == v["prompt_runs"] == 3
    # A wrong token inside the compared 113 is a divergence (no tie: gap 2.0).
    bad = json.loads(json.dumps(raw))
    bad["groups"]["2"][1]["token_ids"][50] += 1
    assert rs.judge_oracle(ref, bad)["lossless"] is False
    # A short output is not hidden by the cut: the cut is to what the run asked for.
    short = json.loads(json.dumps(raw))
    short["groups"]["1"][0]["token_ids"].pop()
    assert rs.judge_oracle(ref, short)["lossless"] is False
    assert rs.judge_oracle(ref, dict(raw, oracle_max_tokens=None))["lossless"] is None


def test_an_oracle_record_of_two_prompts_of_113_tokens_fails_the_gate():
    """The gate's size bar (32 prompts of 128 tokens, bars.yaml) holds for oracle records too:
    an oracle run cut to 113 tokens is not proof, however clean its histograms."""
    spec, ref, raw = _case(accepted_fs=ALL)
    rec = rs.record(spec, raw, ref, {"series_hash": "h" * 64})
    assert rec["oracle_checks"]["nondegenerate"] is False and rec["proof"] is False
    assert all(v for k, v in rec["oracle_checks"].items() if k != "nondegenerate")


def test_an_oracle_record_is_proof_only_with_every_length_and_equal_histograms(monkeypatch):
    # The oracle's own checks, on a case small enough to build by hand: the gate's size bar is
    # lowered to the case's size here only (the test above keeps it).
    monkeypatch.setattr(rs.gate, "MIN_PROMPTS", 2)
    monkeypatch.setattr(rs.gate, "MIN_GENERATED_TOKENS", 113)
    spec, ref, raw = _case(accepted_fs=ALL)
    rec = rs.record(spec, raw, ref, {"series_hash": "h" * 64})
    assert rec["mode"] == "oracle" and rec["lossless"] is True
    assert rec["accepted_hist"] == rec["planned_hist"] == [2] * (K + 1)
    assert rec["hist_equal"] is True and rec["proof"] is True
    assert set(rec["oracle_checks"]) == {"lossless", "nondegenerate", "every_length", "hist_equal",
                                         "oracle_log_clean"}
    assert rec["target_sha256"] == SHA and rec["preemptions"] == 0 and "prefix_cache_hits" in rec
    # Length 7 never accepted: the histograms agree, but the verify step never ran that case.
    no7 = [[f for f in fs if f != 7] for fs in ALL]
    rec = rs.record(spec, _case(accepted_fs=no7)[2], ref, {})
    assert rec["hist_equal"] is True and rec["accepted_hist"][7] == 0
    assert rec["oracle_checks"]["every_length"] is False and rec["proof"] is False
    # vLLM counted other lengths than the oracle planned (one full acceptance became 14).
    counted = [ALL[0][:-1] + [14], ALL[1]]
    rec = rs.record(spec, _case(accepted_fs=ALL, counted_fs=counted)[2], ref, {})
    assert rec["hist_equal"] is False and rec["proof"] is False
    # No per-position counter at all: no histogram, no proof.
    raw_nc = dict(raw, counters={"preemptions": 0})
    rec = rs.record(spec, raw_nc, ref, {})
    assert rec["accepted_hist"] is None and rec["proof"] is False


def test_an_oracle_log_with_a_mismatch_is_not_proof():
    spec, ref, raw = _case(accepted_fs=ALL)
    lines = _log(ALL)
    lines[3]["n"] += 1  # the verify step accepted one more than planned
    raw["oracle_analysis"] = oracle.analyse(lines, K)
    rec = rs.record(spec, raw, ref, {})
    assert rec["oracle"]["num_mismatches"] >= 1
    assert rec["oracle_checks"]["oracle_log_clean"] is False and rec["proof"] is False


def test_an_oracle_record_of_looping_output_is_not_proof():
    """Both sides constant: lossless and equal histograms, but the gate (gate.py) fails."""
    spec, ref, raw = _case(accepted_fs=ALL)
    for outs in [*ref["passes"], *raw["groups"].values()]:
        for o in outs:
            o["token_ids"] = [9] * len(o["token_ids"])
    rec = rs.record(spec, raw, ref, {})
    assert rec["lossless"] is True and rec["hist_equal"] is True
    assert rec["oracle_checks"]["nondegenerate"] is False and rec["proof"] is False


def test_oracle_records_keep_apart_from_dflash_records_and_get_their_own_section(monkeypatch):
    # the section's layout on the hand-built case: the gate's size bar lowered to its size
    monkeypatch.setattr(rs.gate, "MIN_PROMPTS", 2)
    monkeypatch.setattr(rs.gate, "MIN_GENERATED_TOKENS", 113)
    spec, ref, raw = _case(accepted_fs=ALL)
    orc = rs.record(spec, raw, ref, {"series_hash": "h" * 64})
    dfl = rs.record(rs.RUNS["trained-dflash-fa2-cg-bf16"], dict(raw, counters={}), ref, {"series_hash": "h" * 64})
    merged = rs.merge([dfl], [orc])
    assert [r["mode"] for r in merged] == ["dflash", "oracle"]
    md = rs.markdown(merged, {})
    head, section = md.split("## Oracle runs (issue 24)")
    assert "trained-oracle-fa2-cg-bf16" not in head  # not in the DFlash table
    row = next(ln for ln in section.splitlines() if ln.startswith("| trained-oracle-fa2-cg-bf16 "))
    assert " ".join(["2"] * (K + 1)) in row and "| 113 |" in row and row.count("True") >= 5


def test_batch_invariant_twins_are_judged_against_the_batch_invariant_reference():
    for name, dflash, ref in TRIPLES:
        for base, suffix in itertools.product((name, dflash, ref), ("-bi", "-bi-noinductor")):
            twin = rs.RUNS[base + suffix]
            assert twin.batch_invariant and not rs.RUNS[base].batch_invariant
            assert twin.reference == (rs.RUNS[base].reference + suffix if rs.RUNS[base].reference else None)
            assert twin.key() != rs.RUNS[base].key()
            # Without inductor the graphs are still captured: only the compile backend changes.
            assert (rs._run_knobs(twin, Path("d"))["compilation_config"].get("backend") == "eager") == \
                (suffix == "-bi-noinductor")
    noinductor = rs.RUNS["trained-dflash-fa2-cg-bf16-bi-noinductor"]
    assert noinductor.noise == "trained-refgroups-bf16-bi-noinductor" and noinductor.cuda_graphs
    assert rs.RUNS["trained-refgroups-bf16-bi-noinductor"].reference == "trained-ref-bf16-bi-noinductor"
    # An oracle twin plans from its own reference's raw record: order_runs puts that first.
    assert rs.order_runs(["trained-oracle-fa2-cg-bf16-bi", "trained-ref-bf16-bi"]) == \
        ["trained-ref-bf16-bi", "trained-oracle-fa2-cg-bf16-bi"]


def test_the_preemption_controls_differ_from_the_small_pool_run_in_one_knob_each():
    base = rs.RUNS["trained-dflash-fa2-cg-bf16-smallkv-bi-noinductor"]
    sync = rs.RUNS["trained-dflash-fa2-cg-bf16-smallkv-sync-bi-noinductor"]
    alone = rs.RUNS["trained-refgroups-bf16-tinykv-bi-noinductor"]
    assert rs._run_knobs(sync, Path("d"))["async_scheduling"] is False
    assert "async_scheduling" not in rs._run_knobs(base, Path("d"))
    assert {k: v for k, v in sync.key().items() if k != "async_scheduling"} == \
        {k: v for k, v in base.key().items() if k != "async_scheduling"}
    # The target alone, exact numerics, in a pool under the small one (it did not preempt in that).
    assert alone.kv_blocks < base.kv_blocks and alone.mode == "reference-grouped" and not alone.has_drafter
    assert alone.reference == sync.reference == "trained-ref-bf16-bi-noinductor"
    assert rs.trained_engine_kwargs(sync, Path("m"))["async_scheduling"] is False
