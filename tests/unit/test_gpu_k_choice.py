"""Which K the speed-up curve favours (tests/gpu/reports/k_choice.py), on the committed acceptance
record and on curves made here with known answers."""

from __future__ import annotations

import json

import pytest

from tests.unit.gpu_scripts import GPU_DIR, load

kc = load("k_choice")
report = load("speedup_report")


def _rows(k: int, c: int, speedup_of) -> list[dict]:
    """A K's measured points at acceptance 1, 2, 4 and K + 1, speed-up ``speedup_of(acceptance)``."""
    return [{"vllm": "0.33.0", "k": k, "concurrency": c, "variant": "base", "acceptance": a, "speedup": speedup_of(a)}
            for a in (1.0, 2.0, 4.0, k + 1.0)]


def test_truncation_gives_the_mean_acceptance_length_vllm_measured_at_15():
    rows = json.loads((GPU_DIR / "results" / "acceptance.json").read_text())
    profile = kc.trained_profile(rows)
    assert profile is not None and len(profile["per_position"]) == 15
    row = next(r for r in rows if r["run"] == kc.TRAINED_ROW["run"] and r["vllm"] == "0.33.0"
               and r["drafter_sha256"].startswith(kc.TRAINED_ROW["drafter_sha256"]))
    # vLLM's mean acceptance length is 1 plus the per-position rates (rounded to 4 places each)
    assert kc.tau(profile["per_position"], 15) == pytest.approx(row["mean_acceptance_length_vllm"], abs=2e-3)
    assert kc.tau(profile["per_position"], 3) < kc.tau(profile["per_position"], 7) < kc.tau(profile["per_position"], 15)
    with pytest.raises(ValueError, match="longer than"):
        kc.tau(profile["per_position"], 16)


def test_a_published_mean_spreads_into_rates_that_give_it_back():
    for mean in (1.0, 2.32, 7.8, 16.0):
        rates = kc.geometric(mean)
        assert kc.tau(rates, 15) == pytest.approx(mean, abs=1e-6)
        assert all(a >= b for a, b in zip(rates, rates[1:]))  # a later position is never likelier
    with pytest.raises(ValueError):
        kc.geometric(17.0)


def test_the_speed_up_is_read_between_measured_points_only():
    pts = [(1.0, 0.5), (2.0, 1.0), (4.0, 2.0)]
    assert kc.speedup_at(pts, 3.0) == pytest.approx(1.5) and kc.speedup_at(pts, 1.0) == pytest.approx(0.5)
    assert kc.speedup_at(pts, 0.9) is None and kc.speedup_at(pts, 4.1) is None and kc.speedup_at([], 2.0) is None


def test_the_best_k_is_the_fastest_at_its_own_acceptance_and_needs_two_curves():
    rates = kc.geometric(4.0)  # tau(7) about 3.8, tau(15) 4.0
    profile = {"name": "p", "per_position": rates}
    # K = 7 steps cost less: at nearly the same acceptance it is faster
    rows = _rows(7, 1, lambda a: a / 1.5) + _rows(15, 1, lambda a: a / 2.2)
    got = kc.choose(rows, "0.33.0", 1, profile)
    assert got["best_k"] == 7
    assert got["per_k"][7]["tau"] == pytest.approx(kc.tau(rates, 7))
    assert got["per_k"][15]["speedup"] == pytest.approx(4.0 / 2.2)
    # a strong drafter: K = 15's extra positions outweigh its cost
    strong = {"name": "s", "per_position": kc.geometric(12.0)}
    assert kc.choose(rows, "0.33.0", 1, strong)["best_k"] == 15
    # one K alone, or a K whose curve may not be read, is no choice
    assert kc.choose(_rows(15, 1, lambda a: a / 2.2), "0.33.0", 1, profile)["best_k"] is None
    assert kc.choose(rows, "0.33.0", 1, profile, usable=lambda k: k != 7)["best_k"] is None


def test_the_report_compares_only_the_curves_whose_oracle_cost_holds():
    rows = _rows(7, 1, lambda a: a / 1.5) + _rows(15, 1, lambda a: a / 2.2)
    acc = json.loads((GPU_DIR / "results" / "acceptance.json").read_text())
    held = {("0.33.0", 7, 1, "reference"): {"holds": True}, ("0.33.0", 15, 1, "reference"): {"holds": True}}
    lines = "\n".join(report.k_lines(rows, acc, held))
    assert "| this project's trained drafter 4f7c6c17" in lines and "| 7 |" in lines
    over = {**held, ("0.33.0", 7, 1, "reference"): {"holds": False}}
    lines = "\n".join(report.k_lines(rows, acc, over))
    assert " 7: " not in lines and lines.rstrip().endswith("| - |")
    # over the bar with the plain oracle, held with the second: K 7 is read on the second's points
    second = [{**r, "variant": "dtail", "speedup": r["speedup"] * 1.5} for r in _rows(7, 1, lambda a: a / 1.5)]
    both = {**over, ("0.33.0", 7, 1, "drafter"): {"holds": True}}
    plain_read = kc.choose(rows, "0.33.0", 1, kc.trained_profile(acc))["per_k"][7]["speedup"]
    lines = "\n".join(report.k_lines(rows + second, acc, both))
    assert f" 7: " in lines and f"{1.5 * plain_read:.2f}x" in lines
