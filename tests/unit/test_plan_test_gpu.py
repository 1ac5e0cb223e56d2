"""`serve --test-gpu`: a Hopper test GPU stands in for the profile's sm_12x card.

The plan on sm_90 with the switch must be the sm_120 plan except the knobs it
lists (Blackwell-only FP4 kernels, the memory fraction); without it sm_90 still
refuses; every other preflight reason (a missing patch above all) still blocks.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from launcher import plan as plans
from launcher import recipe as recipes
from launcher import testgpu
from launcher.checks import resolve
from launcher.hardware import GpuInfo
from launcher.plan import Request
from launcher.vllm_env import VllmEnv
from tests.unit.conftest import GB10, H100, RTX5090, make_ctx

A100 = GpuInfo(0, "NVIDIA A100-SXM4-80GB", (8, 0), 79.2)


def _blocking(plan, area=None):
    return [r.message for r in plan.reasons if r.blocking and (area is None or r.area == area)]


def _pair(recipe="gemma4-moe-dflash", **kw):
    card = resolve(Request(recipe, vllm_version="0.21.0", **kw), make_ctx(RTX5090))
    test = resolve(Request(recipe, vllm_version="0.21.0", test_gpu=True, **kw), make_ctx(H100))
    return card, test


def _argv_diff(a: list[str], b: list[str]) -> dict[str, tuple[str, str]]:
    assert len(a) == len(b), (a, b)
    out = {}
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            out[a[i - 1]] = (x, y)  # the flag before the differing value
    return out


def _env_diff(a: dict, b: dict) -> dict:
    return {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)}


def test_sm90_plan_equals_the_sm120_plan_except_the_listed_knobs(models):
    card, test = _pair()
    assert test.profile == card.profile == "rtx5090"
    assert _argv_diff(card.argv, test.argv) == {"--moe-backend": ("cutlass", "marlin"),
                                                "--gpu-memory-utilization": ("0.85", "0.334")}
    assert _env_diff(card.env, test.env) == {"VLLM_NVFP4_GEMM_BACKEND": ("flashinfer-cutlass", "marlin")}
    assert [p.id for p in card.patches] == [p.id for p in test.patches]
    # The knobs it changed are exactly the --set items it prints.
    assert test.test_gpu.set_args == ["--set intent.moe_fp4_backend=marlin", "--set intent.nvfp4_gemm_backend=marlin",
                                      "--set serve.gpu_memory_utilization=0.334"]
    text = plans.format_plan(test)
    assert "test GPU      NVIDIA H100 80GB HBM3 (sm_90) stands in for rtx5090 (sm_120): " \
           "--set intent.moe_fp4_backend=marlin" in text
    assert "flash_attn_version" in text  # how to force FA2, as sm_12x runs it
    # Apart from hardware, the two plans give the same reasons.
    others = lambda p: [(r.area, r.message, r.blocking) for r in p.reasons if r.area != "hardware"]  # noqa: E731
    assert others(card) == others(test)
    assert _blocking(test, "hardware") == []


def test_the_same_plan_as_explicit_sets(models):
    """--test-gpu is exactly the --set items it prints: the same plan either way."""
    _, test = _pair()
    by_hand = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0",
                              sets=[s.removeprefix("--set ") for s in test.test_gpu.set_args]), make_ctx(H100))
    assert by_hand.argv == test.argv and by_hand.env == test.env


def test_memory_fraction_is_the_cards_budget_on_the_test_gpu(models):
    _, test = _pair()
    # An RTX 5090's CUDA-reported total (31.36 GiB, less than its 32 GB) x the profile's 0.85:
    # vLLM takes the fraction of what CUDA reports.
    budget = 33_668_857_856 / 2**30 * 0.85
    assert float(test.test_gpu.to_dict()["sets"][2].split("=")[1]) == pytest.approx(budget / H100.memory_gib, abs=1e-3)
    assert float(test.test_gpu.to_dict()["sets"][2].split("=")[1]) * H100.memory_gib <= budget
    # The profile's context length is kept: the budget is what it was chosen for.
    assert test.argv[test.argv.index("--max-model-len") + 1] == "49152"


def test_users_set_wins_over_the_test_gpu(models):
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0", test_gpu=True,
                           sets=["intent.moe_fp4_backend=auto", "serve.gpu_memory_utilization=0.5"]), make_ctx(H100))
    assert "--moe-backend" not in plan.argv
    assert plan.argv[plan.argv.index("--gpu-memory-utilization") + 1] == "0.5"
    assert plan.test_gpu.set_args == ["--set intent.nvfp4_gemm_backend=marlin"]


def test_033_renders_the_swapped_gemm_as_linear_backend(models):
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.33.0", test_gpu=True), make_ctx(H100))
    assert plan.argv[plan.argv.index("--linear-backend") + 1] == "marlin"
    assert plan.argv[plan.argv.index("--moe-backend") + 1] == "marlin"
    assert "VLLM_NVFP4_GEMM_BACKEND" not in plan.env


def test_without_the_switch_sm90_still_refuses_and_names_it(models):
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0"), make_ctx(H100))
    (reason,) = [r for r in plan.reasons if r.blocking and r.area == "hardware"]
    assert "NVIDIA H100 80GB HBM3 is sm_90; recipe gemma4-moe-dflash is built for sm_120 (rtx5090)" in reason.message
    assert "--test-gpu" in reason.hint
    assert plan.test_gpu is None and "--moe-backend" in plan.argv
    assert plan.argv[plan.argv.index("--moe-backend") + 1] == "cutlass"


@pytest.mark.parametrize("gpu, why", [(A100, "cannot stand in"), (None, "no GPU was detected")])
def test_only_hopper_stands_in(models, gpu, why):
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0", test_gpu=True), make_ctx(gpu))
    assert plan.test_gpu is None
    assert any(why in w for w in plan.warnings)
    assert _blocking(plan, "hardware")  # still refused


def test_on_the_real_card_the_switch_changes_nothing(models):
    card = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0"), make_ctx(RTX5090))
    same = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0", test_gpu=True), make_ctx(RTX5090))
    assert same.argv == card.argv and same.test_gpu is None
    assert any("nothing to stand in" in w for w in same.warnings)


def test_a_profile_bigger_than_the_test_gpu_keeps_its_fraction(models):
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0", profile="dgx-spark", test_gpu=True),
                   make_ctx(H100))
    assert plan.argv[plan.argv.index("--gpu-memory-utilization") + 1] == "0.7"
    assert any("no more than dgx-spark's 119.68 GiB" in n for n in plan.test_gpu.notes)
    assert "stands in for dgx-spark (sm_121)" in plan.test_gpu.line()
    assert GB10.capability == (12, 1)


def test_a_recipe_without_fp4_knobs_swaps_only_memory(models):
    plan = resolve(Request("gemma4-e4b", test_gpu=True, vllm_version="0.21.0"), make_ctx(H100))
    assert [s.split("=")[0] for s in plan.test_gpu.to_dict()["sets"]] == ["serve.gpu_memory_utilization"]


def test_a_missing_patch_still_refuses_with_the_switch(models, monkeypatch):
    """The reason --force is not the answer: with --test-gpu, an unpatched vLLM still blocks."""
    from launcher.patching import engine

    required = recipes.load("gemma4-moe-dflash").patches_for("0.21.0")
    states = {pid: ("not applied" if i == 1 else "applied") for i, pid in enumerate(required)}
    monkeypatch.setattr(engine, "status", lambda target=None, **kw: SimpleNamespace(
        interrupted=False, patches=[SimpleNamespace(id=pid, state=s) for pid, s in states.items()]))
    ctx = make_ctx(H100, vllm="0.21.0", transformers="5.13.1")
    ctx.vllm = VllmEnv("/opt/py/bin/python", "--vllm-python", "0.21.0", "5.13.1", "/opt/site/vllm")
    plan = resolve(Request("gemma4-moe-dflash", test_gpu=True), ctx)
    assert plan.test_gpu is not None
    assert _blocking(plan, "patches") == [f"1 of {len(required)} required patches are not applied in the installed "
                                          f"vLLM: {required[1]} (not applied)"]
    assert _blocking(plan, "hardware") == [] and _blocking(plan, "vllm") == []


def test_dry_run_json_carries_the_stand_in(models):
    _, test = _pair()
    data = json.loads(json.dumps(plans.to_dict(test)))
    assert data["test_gpu"]["stands_in_for"] == "rtx5090 (sm_120)"
    assert data["test_gpu"]["sets"][0] == "intent.moe_fp4_backend=marlin"
    assert "sm_100+" in data["test_gpu"]["why"]["intent.moe_fp4_backend"]
    card, _ = _pair()
    assert plans.to_dict(card)["test_gpu"] is None


def test_blackwell_only_sets_match_the_recipe_schema():
    kinds = set(recipes.MoeBackend.__args__)
    assert testgpu.BLACKWELL_ONLY_MOE <= kinds and testgpu.HOPPER_FP4 in kinds
    assert testgpu.BLACKWELL_ONLY_GEMM <= set(recipes.GemmBackend.__args__)
