"""The lossless verdict of the GPU proof (tests/gpu/judging/compare.py), on hand-made runs.

No GPU and no torch: the runs are written here the way run_modes.py records
them (token ids, and per position [token, value, rank] entries for the top
two), and the bf16 spacing is worked out by hand in each test.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "gpu" / "judging" / "compare.py"
_spec = importlib.util.spec_from_file_location("gpu_compare", _PATH)
compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare)


def _pos(top1_tok, top1, top2_tok, top2):
    return [[top1_tok, top1, 1], [top2_tok, top2, 2]]


def _run(outputs, ok=True, mode="baseline", target="t6", drafter=None):
    return {"mode": mode, "target": target, "drafter": drafter, "ok": ok, "outputs": outputs}


def _out(tokens, top):
    return {"prompt_len": 4, "token_ids": tokens, "top": top}


# bf16 keeps 8 significant bits: numbers in [4, 8) are 2**2 * 1.xxxxxxx, so
# neighbours there are 2**(2-7) = 1/32 apart; in [1, 2) they are 1/128 apart;
# in [16, 32) 1/8 apart.
@pytest.mark.parametrize(
    ("value", "step"),
    [(1.0, 1 / 128), (1.5, 1 / 128), (-1.99, 1 / 128), (4.0, 1 / 32), (5.0, 1 / 32),
     (-7.9, 1 / 32), (0.75, 1 / 256), (16.0, 1 / 8), (29.9, 1 / 8), (0.0, 0.0)],
)
def test_bf16_step(value, step):
    assert compare.bf16_step(value) == step


def test_is_tie_counts_equal_and_adjacent_bf16_values_only():
    assert compare.is_tie(5.0, 5.0)
    assert compare.is_tie(5.0, 5.0 - 1 / 32)
    assert not compare.is_tie(5.0, 5.0 - 2 / 32)
    # At 20 a step is 1/8: a 1/8 gap ties, 1/4 does not.
    assert compare.is_tie(20.0, 20.0 - 1 / 8)
    assert not compare.is_tie(20.0, 20.0 - 1 / 4)


def test_identical_tokens_are_lossless():
    top = [_pos(7, 5.0, 9, 3.0), _pos(8, 6.0, 2, 1.0)]
    base = _run([_out([7, 8], top)])
    cand = _run([_out([7, 8], top)], mode="dflash-auto", drafter="d2")
    v = compare.verdict(base, cand)
    assert v["lossless"] is True
    assert v["identical"] == 1 and v["divergences"] == []


def test_divergence_on_exact_tie_is_lossless_and_reported():
    base = _run([_out([7, 8, 8], [_pos(7, 5.0, 9, 3.0), _pos(8, 6.0, 4, 6.0), _pos(8, 2.0, 1, 1.0)])])
    cand = _run([_out([7, 4, 1], [])], mode="dflash-flash_attn", drafter="d2")
    v = compare.verdict(base, cand)
    assert v["lossless"] is True
    (d,) = v["divergences"]
    assert (d["prompt"], d["position"], d["baseline_token"], d["dflash_token"]) == (0, 1, 8, 4)
    assert d["tie"] is True and d["gap"] == 0.0


def test_divergence_one_bf16_step_apart_is_lossless():
    base = _run([_out([3, 8], [_pos(3, 1.0, 5, 0.5), _pos(8, 5.0, 4, 5.0 - 1 / 32)])])
    cand = _run([_out([3, 4], [])], mode="dflash-auto", drafter="d2")
    assert compare.verdict(base, cand)["lossless"] is True


def test_divergence_two_steps_apart_is_not_lossless_with_position_and_gap():
    base = _run([
        _out([1, 2], [_pos(1, 3.0, 0, 1.0), _pos(2, 5.0, 4, 3.0)]),
        _out([3, 8, 9], [_pos(3, 1.0, 5, 0.5), _pos(8, 5.0, 4, 5.0 - 2 / 32), _pos(9, 1.0, 0, 0.0)]),
    ])
    cand = _run([_out([1, 2], []), _out([3, 4, 9], [])], mode="dflash-auto", drafter="d2")
    v = compare.verdict(base, cand)
    assert v["lossless"] is False
    (d,) = v["divergences"]
    assert (d["prompt"], d["position"]) == (1, 1)
    assert d["gap"] == pytest.approx(2 / 32)
    assert d["bf16_step"] == 1 / 32
    assert d["tie"] is False


def test_divergence_to_a_token_outside_the_baseline_top_two_is_not_lossless():
    # The gap is a tie, but the DFlash token (6) is neither of the two candidates.
    base = _run([_out([7, 8], [_pos(7, 5.0, 9, 3.0), _pos(8, 6.0, 4, 6.0)])])
    cand = _run([_out([7, 6], [])], mode="dflash-auto", drafter="d2")
    v = compare.verdict(base, cand)
    assert v["lossless"] is False
    assert "top two" in v["divergences"][0]["reason"]


def test_exact_tie_reported_in_either_rank_order_is_lossless():
    # Equal values: the logprobs list 3041 first, but the baseline's sampler took 2056.
    base = _run([_out([2056], [_pos(3041, 5.40625, 2056, 5.40625)])])
    cand = _run([_out([3041], [])], mode="dflash-auto", drafter="d3")
    v = compare.verdict(base, cand)
    assert v["lossless"] is True
    assert v["divergences"][0]["tie"] is True


def test_path_flip_annotation_explains_but_never_passes_a_strict_failure():
    base = _run([_out([5, 6], [_pos(5, 3.0, 9, 1.0), _pos(6, 6.0, 7, 5.5)])], target="t12")
    cand = _run([_out([5, 7], [])], mode="dflash-auto", drafter="d3", target="t12")
    rescore = {"label": "stock-diag", "runs": [{
        "mode": "baseline-rescore", "target": "t12", "ok": True, "outputs": [],
        "rescore": {"positions": 2, "argmax_mismatches": 1, "mismatches": [
            {"prompt": 0, "position": 1, "decode_top": _pos(6, 6.0, 7, 5.5),
             "prefill_top": [[7, -1.0, 1], [6, -1.25, 2]]}]}}]}
    rows = compare.summarize([{"label": "patched", "runs": [base, cand]}, rescore])
    row = next(r for r in rows if r["mode"] == "dflash-auto")
    v = row["verdict"]
    assert v["lossless"] is False
    assert v["divergences"][0]["on_target_path_flip"] is True
    assert v["strict_failures_all_on_target_path_flips"] is True
    rs_row = next(r for r in rows if r["mode"] == "baseline-rescore")
    assert rs_row["rescore"] == {"positions": 2, "argmax_mismatches": 1}
    assert "verdict" not in rs_row
    # A flip to a different token than the one DFlash took explains nothing.
    rescore["runs"][0]["rescore"]["mismatches"][0]["prefill_top"] = [[8, -1.0, 1], [6, -1.25, 2]]
    row = next(r for r in compare.summarize([{"label": "patched", "runs": [base, cand]}, rescore])
               if r["mode"] == "dflash-auto")
    assert row["verdict"]["strict_failures_all_on_target_path_flips"] is False


def test_shorter_output_is_not_lossless():
    base = _run([_out([7, 8], [_pos(7, 5.0, 9, 3.0), _pos(8, 6.0, 4, 1.0)])])
    cand = _run([_out([7], [])], mode="dflash-auto", drafter="d2")
    v = compare.verdict(base, cand)
    assert v["lossless"] is False
    assert "length differs" in v["divergences"][0]["reason"]


def test_failed_runs_are_never_lossless():
    ok = _run([_out([1], [_pos(1, 1.0, 2, 0.0)])])
    failed = {"mode": "dflash-auto", "target": "t6", "ok": False,
              "error": {"root_cause": "AssertionError: All drafting layers should belong to the same kv cache group"}}
    assert compare.verdict(ok, failed) == {"lossless": False, "reason": "dflash run failed"}
    assert compare.verdict({"ok": False}, ok)["lossless"] is False


def test_summary_and_table_carry_backends_groups_errors_and_verdicts(tmp_path):
    top = [_pos(7, 5.0, 9, 3.0)]
    stock = {"label": "stock", "runs": [
        {**_run([_out([7], top)]), "backends": {"target": {"l0": "TRITON_ATTN", "l5": "TRITON_ATTN"}, "drafter": {}},
         "kv_cache_groups": [{"gid": 0, "layers": ["l0"], "drafter_layers": []},
                             {"gid": 1, "layers": ["l5"], "drafter_layers": []}]},
        {"mode": "dflash-flash_attn", "target": "t6", "drafter": "d2", "ok": False,
         "error": {"root_cause": "ValueError: Selected backend AttentionBackendEnum.FLASH_ATTN is not valid "
                                 "for this configuration. Reason: ['partial multimodal token full attention not supported']"}},
    ]}
    patched = {"label": "patched", "runs": [
        {**_run([_out([7], top)]), "backends": {"target": {"l0": "TRITON_ATTN"}, "drafter": {}}},
        {**_run([_out([7], top)], mode="dflash-auto", drafter="d2"),
         "backends": {"target": {"l0": "TRITON_ATTN"}, "drafter": {"l6": "FLASH_ATTN", "l7": "FLASH_ATTN"}},
         "kv_cache_groups": [{"gid": 0, "layers": ["l0"], "drafter_layers": []},
                             {"gid": 2, "layers": ["l6", "l7"], "drafter_layers": ["l6", "l7"]}]},
    ]}
    rows = compare.summarize([stock, patched])
    by = {(r["round"], r["mode"]): r for r in rows}
    assert by[("stock", "baseline")]["target_backends"] == ["TRITON_ATTN"]
    assert "partial multimodal token" in by[("stock", "dflash-flash_attn")]["error"]
    assert by[("stock", "dflash-flash_attn")]["verdict"]["lossless"] is False
    auto = by[("patched", "dflash-auto")]
    assert auto["drafter_backends"] == ["FLASH_ATTN"] and auto["drafter_kv_groups"] == [2]
    assert auto["verdict"]["lossless"] is True

    stock_p, patched_p, meta_p = tmp_path / "s.json", tmp_path / "p.json", tmp_path / "m.json"
    stock_p.write_text(json.dumps(stock))
    patched_p.write_text(json.dumps(patched))
    meta_p.write_text(json.dumps({"date": "2026-11-26", "gpu": "H100", "vllm": "0.21.0", "series": "abc"}))
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    assert compare.main([str(stock_p), str(patched_p), "--meta", str(meta_p),
                         "--json", str(out_json), "--md", str(out_md)]) == 0
    table = out_md.read_text()
    assert "| patched | t6 | d2 | dflash-auto | TRITON_ATTN | FLASH_ATTN | 2 (2) | lossless (1/1 identical) |" in table
    assert "failed: ValueError: Selected backend" in table
    assert json.loads(out_json.read_text())["meta"]["gpu"] == "H100"
