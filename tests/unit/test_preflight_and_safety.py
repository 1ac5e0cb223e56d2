"""Preflight reasons (hardware, vLLM, transformers, checkpoint) and safety."""

from __future__ import annotations

import pytest

from launcher import plan as plans
from launcher.checks import resolve
from launcher.plan import Request
from tests.unit.conftest import GB10, H100, RTX5090, make_ctx


def _blocking(plan, area):
    return [r.message for r in plan.reasons if r.blocking and r.area == area]


def test_wrong_arch_blocks(models):
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0"), make_ctx(H100))
    assert any("sm_90" in m for m in _blocking(plan, "hardware"))
    assert plan.profile_source.startswith("default (detected NVIDIA H100")


def test_too_little_memory_blocks(models):
    small = RTX5090.__class__(0, "NVIDIA GeForce RTX 5080", (12, 0), 15.5)
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0"), make_ctx(small))
    assert any("needs 30 GiB" in m for m in _blocking(plan, "hardware"))


def test_spark_fits_hardware(models):
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0"), make_ctx(GB10))
    assert _blocking(plan, "hardware") == []


def test_vllm_missing_blocks_native_but_not_docker(models):
    native = resolve(Request("gemma4-moe-dflash"), make_ctx(RTX5090))
    assert any("no vLLM found" in m for m in _blocking(native, "vllm"))
    docker = resolve(Request("gemma4-moe-dflash", runtime="docker"), make_ctx(RTX5090))
    assert _blocking(docker, "vllm") == []


def test_installed_vllm_sets_the_version(models):
    plan = resolve(Request("gemma4-moe-dflash"), make_ctx(RTX5090, vllm="0.21.0+cu132", transformers="5.13.1"))
    assert plan.vllm_version == "0.21.0" and plan.vllm_version_source == "installed"
    assert _blocking(plan, "vllm") == []


def test_unsupported_vllm_version_blocks(models):
    plan = resolve(Request("gemma4-moe-dflash"), make_ctx(RTX5090, vllm="0.19.1", transformers="5.13.1"))
    assert any("supports vLLM 0.21.0, 0.26.0, 0.27.1, 0.29.0, 0.30.0, 0.31.0, 0.32.0, 0.33.0, not 0.19.1; the nearest supported release is 0.21.0" in m
               for m in _blocking(plan, "vllm"))


@pytest.mark.parametrize("vllm", ["0.26.0", "0.27.1"])
def test_transformers_with_per_layer_head_dim_blocks_vllm_before_0_28(models, vllm):
    # vLLM #53836 (DGX Spark, 0.27.1): transformers 5.15+ raises on the whole-model head_dim.
    plan = resolve(Request("gemma4-moe-dflash"), make_ctx(RTX5090, vllm=vllm, transformers="5.15.0"))
    (message,) = [m for m in _blocking(plan, "vllm") if "AmbiguousGlobalPerLayerAttributeError" in m]
    assert "#53836" in message and f"vLLM {vllm}" in message
    older = resolve(Request("gemma4-moe-dflash"), make_ctx(RTX5090, vllm=vllm, transformers="5.14.1"))
    assert not [m for m in _blocking(older, "vllm") if "AmbiguousGlobalPerLayerAttributeError" in m]
    for fixed in ("0.29.0", "0.30.0", "0.31.0"):
        later = resolve(Request("gemma4-moe-dflash"), make_ctx(RTX5090, vllm=fixed, transformers="5.17.0"))
        assert not [m for m in _blocking(later, "vllm") if "AmbiguousGlobalPerLayerAttributeError" in m]


def test_transformers_too_new_for_0_21(models):
    plan = resolve(Request("gemma4-moe-dflash"), make_ctx(RTX5090, vllm="0.21.0", transformers="5.17.0"))
    assert any("global_head_dim" in m for m in _blocking(plan, "vllm"))
    ok = resolve(Request("gemma4-moe-dflash"), make_ctx(RTX5090, vllm="0.33.0", transformers="5.17.0"))
    assert not any("global_head_dim" in m for m in _blocking(ok, "vllm"))


def test_missing_model_dir_is_a_reason_not_an_abort(models):
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0"), make_ctx(RTX5090))
    assert any(str(models / "gemma-4-26B-A4B-it-NVFP4") in m for m in _blocking(plan, "checkpoint"))
    assert any("DFlash" in m for m in _blocking(plan, "drafter"))
    assert "vllm serve" in plans.format_plan(plan).replace("\\\n", "")


def test_public_bind_without_key_warns(models):
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0", host="0.0.0.0"), make_ctx(RTX5090))
    warn = [r for r in plan.reasons if r.area == "environment"]
    assert warn and not warn[0].blocking and "without an API key" in warn[0].message
    keyed = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0", host="0.0.0.0", api_key="sk-abc123"),
                    make_ctx(RTX5090))
    assert not [r for r in keyed.reasons if r.area == "environment"]


def test_default_bind_is_loopback(models):
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0"), make_ctx(RTX5090))
    assert plan.argv[plan.argv.index("--host") + 1] == "127.0.0.1"


def test_trust_remote_code_warning(models):
    """Only where the model brings Python code, or may (a Hub id): every plan said it before (issue 57, item 7)."""
    def warned(**kw) -> list[str]:
        plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0", **kw), make_ctx(RTX5090))
        return [w for w in plan.warnings if "trust-remote-code" in w]

    assert warned() == []  # the folder is not there yet: nothing to run, and the checkpoint check blocks
    folder = models / "with-code"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert warned(model=str(folder)) == []
    (folder / "modeling_gemma4x.py").write_text("")
    assert warned(model=str(folder)) == [
        f"--trust-remote-code (the recipe's): vLLM will run the Python code in {folder}: modeling_gemma4x.py"]
    assert "fetched from the Hub" in warned(model="google/gemma-4-26B-A4B-it")[0]


def test_a_warning_two_checks_find_is_printed_once(models, monkeypatch):
    from launcher import checks

    monkeypatch.setattr(checks, "image", lambda plan, rec, ctx: plan.warnings.append(plan.warnings[0]))
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0", profile="dgx-spark"), make_ctx(RTX5090))
    assert plan.warnings and len(plan.warnings) == len(set(plan.warnings))


@pytest.mark.parametrize(("installed", "nearest"), [("0.28.0", "0.29.0"), ("0.25.1", "0.26.0"), ("0.35.0", "0.33.0")])
def test_installed_release_between_supported_ones_names_the_nearest(models, installed, nearest):
    plan = resolve(Request("gemma4-moe-dflash"), make_ctx(RTX5090, vllm=installed, transformers="5.17.0"))
    reason = next(r for r in plan.reasons if r.area == "vllm" and r.blocking)
    assert reason.message.endswith(f"not {installed}; the nearest supported release is {nearest}")
    assert reason.hint == f"install vLLM {nearest} and its patches: launcher install --version {nearest}"


def test_unsupported_version_asked_for_on_docker_points_at_the_flag(models):
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.28.0", runtime="docker"), make_ctx(RTX5090))
    reason = next(r for r in plan.reasons if r.area == "vllm" and r.blocking)
    assert "the nearest supported release is 0.29.0" in reason.message  # 0.27.1 and 0.29.0 tie: the newer
    assert reason.hint == "use --vllm-version 0.29.0"
