"""The re-judge of the committed real-shape records under the new gate (issue 51, item 2).

The hand-built cases below build a results folder (realshape.json and a log tarball) whose
verdicts are known from how they were built; the last test re-runs the documented command on
the committed records and checks that the committed rejudge.{json,md} are its output.
"""

from __future__ import annotations

import json
import random
import tarfile
from pathlib import Path

import pytest

from tests.unit.gpu_scripts import json_tar
from tests.unit.gpu_scripts import load as _load

gate = _load("gate")
rj = _load("rejudge")

RESULTS = Path(__file__).resolve().parents[1] / "gpu" / "results"
SHA = "9" * 64


def _diverse(n, seed=0, length=128):
    rngs = [random.Random(seed * 1000 + i) for i in range(n)]
    return [[r.randrange(5000) for _ in range(length)] for r in rngs]


def _loop_tail(i):
    # 35 distinct tokens, then 93 copies of one: the example
    return list(range(3000 + i * 40, 3035 + i * 40)) + [7] * 93


def _tar(path: Path, members: dict[str, dict]) -> None:
    json_tar(path, members)


def _stored(outs, keys=None):
    """The block the harness stored before the loop check: the old fields only."""
    block = gate.nondegenerate(outs, keys)
    return {k: block[k] for k in rj.OLD_FIELDS}


def _folder(tmp_path: Path, ref_tokens, run_groups, proof=True) -> Path:
    results = tmp_path / "results"
    (results / "realshape-logs").mkdir(parents=True)
    ref_outs = [{"token_ids": t} for t in ref_tokens]
    ref_raw = {"name": "trained-ref-bf16", "ok": True, "target_sha256": SHA, "series_hash": "a" * 64,
               "passes": [ref_outs, ref_outs]}
    run_raw = {"name": "trained-dflash-trained-fa2-cg-bf16", "ok": True, "target_sha256": SHA,
               "series_hash": "a" * 64,
               "groups": {str(len(g)): [{"token_ids": t} for t in g] for g in run_groups}}
    _tar(results / "realshape-logs" / "run.tar.xz",
         {"raw/trained-ref-bf16.raw.json": ref_raw, "raw/run.raw.json": run_raw})
    run_outs = [o for g in run_raw["groups"].values() for o in g]
    run_keys = [i for g in run_raw["groups"].values() for i in range(len(g))]
    records = [
        {"name": "trained-ref-bf16", "ok": True, "mode": "reference", "vllm": "0.21.0", "series": "a" * 64,
         "target_sha256": SHA, "nondegenerate": _stored(ref_outs), "proof": proof},
        {"name": "trained-dflash-trained-fa2-cg-bf16", "ok": True, "mode": "dflash", "vllm": "0.21.0",
         "series": "a" * 64, "target_sha256": SHA, "reference": "trained-ref-bf16",
         "nondegenerate": _stored(run_outs, run_keys), "reference_nondegenerate": _stored(ref_outs),
         "proof": proof},
    ]
    (results / "realshape.json").write_text(json.dumps(records))
    return results


def test_repeat_length_counts_the_exact_repeat_at_the_end():
    assert rj.repeat_length(_loop_tail(0)) == 92  # 93 copies: 92 equal the one before
    assert rj.repeat_length(list(range(100)) + [1, 2, 3] * 12) == 33  # 36 tokens of period 3
    assert rj.repeat_length(list(range(128))) == 0


def test_a_looping_reference_is_not_proof_and_a_clean_one_is(tmp_path):
    ref = _diverse(36)
    # 36 prompts of 128 tokens, none looping, grouped 1/4/32: both records pass
    groups = [ref[:1], ref[:4], ref[:32]]
    report = rj.rejudge(_folder(tmp_path / "clean", ref, groups))
    assert [r["verdict"] for r in report["records"]] == ["proof", "proof"]
    assert report["records"][1]["gate"]["block"]["prompts"] == 32
    # 5 of 36 references end in 93 copies of one token (13.9 % > 10 %): neither is proof
    looping = [_loop_tail(i) for i in range(5)] + ref[5:]
    groups = [looping[:1], looping[:4], looping[:32]]
    report = rj.rejudge(_folder(tmp_path / "loops", looping, groups))
    ref_row, run_row = report["records"]
    assert ref_row["gate"]["block"]["looping_sequences"] == 5
    assert ref_row["gate"]["block"]["prompts_ending_in_repeat_32"] == 5
    assert ref_row["recorded_proof"] is True and ref_row["verdict"] == "not proof"
    assert any("looping" in w for w in ref_row["why"])
    assert run_row["reference"]["block"]["looping_sequences"] == 5 and run_row["verdict"] == "not proof"


def test_a_grouped_run_of_22_prompts_is_not_proof(tmp_path):
    ref = _diverse(36)
    report = rj.rejudge(_folder(tmp_path, ref, [ref[:1], ref[:8], ref[:22]]))
    run = report["records"][1]
    assert run["gate"]["block"]["sequences"] == 31 and run["gate"]["block"]["prompts"] == 22
    assert run["verdict"] == "not proof" and any("22 prompts" in w for w in run["why"])


def test_a_raw_record_of_other_tokens_is_not_taken_for_the_record(tmp_path):
    ref = _diverse(36)
    results = _folder(tmp_path, ref, [ref[:1], ref[:4], ref[:32]])
    records = json.loads((results / "realshape.json").read_text())
    records[0]["nondegenerate"]["near_ties"] = 5  # the stored counts no longer match the raw run
    (results / "realshape.json").write_text(json.dumps(records))
    row = rj.rejudge(results)["records"][0]
    assert row["gate"]["raw"] is None and row["verdict"] == "not proof"
    assert "loops not counted" in " ".join(row["why"])


# That the committed rejudge.{json,md} are the command's output is checked by the replay of every
# results page (test_gpu_evidence: its rejudge step, byte for byte), not again here.


def test_the_committed_rejudge_holds_the_audits_counts():
    """Issue 51's audit counted, from the raw files: 14 of 36 references of trained-ref-bf16 end
    in an exact repeat of 32+ tokens, and the DFlash rows of drafter 4f7c6c17 cover 22 distinct
    prompts (31 requests)."""
    rows = json.loads((RESULTS / "rejudge.json").read_text())["records"]
    ref = [r for r in rows if r["name"] == "trained-ref-bf16" and (r["series"] or "").startswith("7430914d")]
    assert ref and all(r["gate"]["block"]["prompts_ending_in_repeat_32"] == 14
                       and r["gate"]["block"]["sequences"] == 36 for r in ref)
    dflash = [r for r in rows if r["drafter_sha256"] == "4f7c6c17" and r["concurrency"] == [1, 8, 22]]
    assert dflash and all(r["gate"]["block"]["prompts"] == 22 and r["gate"]["block"]["sequences"] == 31
                          for r in dflash)
    assert all(r["verdict"] == "not proof" for r in ref + dflash)


def test_reasons_are_counted_per_record():
    rows = [{"why": ["recorded: not proof", "gate: 11 of 36 sequences looping (at most 10%)",
                     "reference gate: 11 of 36 sequences looping (at most 10%)"]},
            {"why": ["gate: 22 prompts of 128+ tokens (at least 32)"]},
            {"why": []}]
    counts = rj.reason_counts(rows)
    assert counts["more than 10 % looping"] == 1 and counts["fewer than 32 prompts of 128+ tokens"] == 1
    assert sum(counts.values()) == 2


def _served_folder(tmp_path: Path, n: int) -> Path:
    results = _folder(tmp_path, _diverse(36), [_diverse(36)[:32]])
    (results / "served").mkdir()
    outs = [{"id": f"r{i}", "token_ids": t} for i, t in enumerate(_diverse(n, seed=7))]
    ref_phase = {"server": "reference", "vllm": "0.21.0", "series": "a" * 64, "passes": [outs, outs]}
    dfl_phase = {"server": "dflash", "vllm": "0.21.0", "series": "a" * 64,
                 "levels": {"1": outs[:1], str(n): outs}}
    _tar(results / "served" / "served.tar.xz", {"s/reference.json": ref_phase, "s/dflash.json": dfl_phase})
    ref_block = _stored(outs)
    dfl_block = _stored(outs[:1] + outs)
    (results / "served.json").write_text(json.dumps({"servers": [
        {"server": "reference", "vllm": "0.21.0", "series": "a" * 64, "nondegenerate": ref_block},
        {"server": "dflash", "vllm": "0.21.0", "series": "a" * 64, "lossless": True,
         "nondegenerate": {"reference": ref_block, "dflash": dfl_block, "passes": True}},
    ]}))
    return results


def test_served_rows_are_judged_from_their_phases(tmp_path):
    report = rj.rejudge(_served_folder(tmp_path / "32", 32))
    ref, dfl = report["served"]
    assert ref["own"]["raw"].endswith("s/reference.json") and dfl["dflash"]["raw"].endswith("s/dflash.json")
    # the DFlash phase answered 33 requests of 32 distinct prompts: it passes
    assert dfl["dflash"]["block"]["sequences"] == 33 and dfl["dflash"]["block"]["prompts"] == 32
    assert ref["gate_passes"] and dfl["gate_passes"] and report["served_summary"]["gate_passes"] == 2
    # 22 requests: not proof, whatever the row stored
    report = rj.rejudge(_served_folder(tmp_path / "22", 22))
    assert [r["verdict"] for r in report["served"]] == ["not proof", "not proof"]
    assert any("22 prompts" in w for w in report["served"][1]["why"])


def test_a_speed_row_is_judged_from_the_outputs_its_benchmarks_recorded(tmp_path):
    """served.py's speed phase stores a gate block per side; the re-judge reads the benchmark
    files' own token ids instead (request i answered prompt i mod 36). Built so that the stored
    blocks claim clean output while the DFlash benchmark's outputs loop in 5 of 36 prompts:
    the raw tokens decide."""
    results = _folder(tmp_path, _diverse(36), [_diverse(36)[:32]])
    clean = _diverse(36, seed=3)
    looping = [t[:60] + [1, 2, 3, 4] * 17 if i < 5 else t for i, t in enumerate(clean)]

    def bench(outputs):
        return {"prompts_file": {"prompts": 36}, "runs": [{"concurrency": 1, "outputs": outputs},
                                                          {"concurrency": 4, "outputs": outputs}]}

    (results / "served-bench-0.21.0-speed-dflash.json").write_text(json.dumps(bench(looping)))
    (results / "served-bench-0.21.0-speed-no-drafter.json").write_text(json.dumps(bench(clean)))
    claimed = gate.nondegenerate([{"token_ids": t} for t in clean])
    row = {"server": "speed", "vllm": "0.21.0", "series": "a" * 64,
           "bench": "tests/gpu/results/served-bench-0.21.0-speed-dflash.json",
           "baseline_bench": "tests/gpu/results/served-bench-0.21.0-speed-no-drafter.json",
           "nondegenerate": {"reference": claimed, "dflash": claimed}}
    (results / "served.json").write_text(json.dumps({"servers": [row]}))
    (judged,) = rj.rejudge(results)["served"]
    assert judged["dflash"]["raw"] == "served-bench-0.21.0-speed-dflash.json"
    assert judged["dflash"]["block"]["looping_sequences"] == 5 and judged["reference"]["block"]["looping_sequences"] == 0
    assert judged["verdict"] == "not proof" and judged["why"] == ["dflash gate: 5 of 36 sequences looping (at most 10%)"]


def test_an_archives_index_is_cached_by_its_bytes_and_recomputed_when_they_change(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_SM12X_CACHE", str(tmp_path / "cache"))
    results = _folder(tmp_path, [list(range(i, i + 128)) for i in range(4)], [[list(range(128))]])
    archive = results / "realshape-logs" / "run.tar.xz"
    first = rj.raw_index(results / "realshape-logs")
    assert sorted(e["name"] for e in first) == ["trained-dflash-trained-fa2-cg-bf16", "trained-ref-bf16"]
    assert len(list((tmp_path / "cache" / "raw-index").glob("*.pickle"))) == 1

    def no_decoding(path):
        raise AssertionError("decoded again although the archive did not change")

    monkeypatch.setattr(rj, "_archive_members", no_decoding)
    assert rj.raw_index(results / "realshape-logs") == first  # from the cache
    _tar(archive, {"raw/trained-ref-bf16.raw.json": {"name": "trained-ref-bf16", "ok": True, "target_sha256": SHA,
                                                     "passes": [[{"token_ids": [7] * 128}]]}})
    with pytest.raises(AssertionError, match="decoded again"):  # new bytes: a new key, decoded afresh
        rj.raw_index(results / "realshape-logs")
