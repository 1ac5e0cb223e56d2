"""tests/gpu/acceptance_report.py: issue 25's acceptance.json rows from realshape records."""

from __future__ import annotations

from tests.unit.gpu_scripts import load as _load

ar = _load("acceptance_report")


def _rec(name, acc, ref=4.0, **kw):
    return {"name": name, "mode": "dflash", "drafter_kind": "trained", "vllm": "0.21.0", "quantization": "bf16",
            "series": "abc", "acceptance": {"mean_acceptance_length": acc, "per_position": [0.5]},
            "acceptance_reference": {"mean_acceptance_length": ref, "per_position": [0.4]}, **kw}


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
    assert plain["draft_equivalence"] == {"contexts": 250, "equal": 249, "holds": True, "features_min_cosine": 0.998}
    assert plain["ablation"] == [{"reverted": "x", "series": "abc", "draft_equivalence_equal": 12,
                                  "draft_equivalence_contexts": 250, "mean_acceptance_length_vllm": 1.3}]
    assert rows["nvfp4"]["draft_equivalence"] is None and rows["nvfp4"]["ablation"] == []
    assert rows["nvfp4"]["relative_gap"] == 0.125 and rows["nvfp4"]["acceptance_bar_met"] is False


def test_bars_refuse_low_acceptance_and_too_few_contexts():
    rows = ar.build([_rec("low", 2.9, ref=2.9),
                     _rec("cap", 2.9, ref=2.9, capture_drafts=True,
                          draft_equivalence={"contexts": 150, "equal": 150})])
    assert rows[0]["acceptance_bar_met"] is False  # under 3 although equal to the reference
    assert rows[0]["draft_equivalence"]["holds"] is False  # fewer than 200 contexts
    assert "not met" in ar.markdown(rows) and "150/150" in ar.markdown(rows)
