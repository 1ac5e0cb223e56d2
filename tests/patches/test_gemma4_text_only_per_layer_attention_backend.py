"""Patch gemma4-text-only-per-layer-attention-backend (0.21.0), stock vs patched.

The released vLLM 0.21.0 wheel (from PyPI through ``launcher.pypi``) and the
same files with the whole 0.21.0 series applied by the project's engine go
through ``gemma4_per_layer_probe.py``, which runs the real
``Gemma4Config.verify_and_update_config``, ``ModelConfig.is_mm_prefix_lm``,
``MultiModalConfig.get_limit_per_prompt`` and ``_large_head_attn_backend``
cut out of each tree (no torch here; the probe lists its stand-ins).

Released: every Gemma 4 with head dims 256/512 gets TRITON_ATTN on all
layers and keeps the multimodal prefix, text-only or not. Patched: where no
multimodal input can arrive, the backend stays unset (the sliding layers
select their own) and is_mm_prefix_lm is off, while the 512-dim layers are
given TRITON_ATTN; everything multimodal is as released. 0.33.0 needs no
patch: the text-only recipe sets vLLM's own ``backend_per_kind`` there
(tests/integration/test_series_0_33_0.py).
What a GPU run
adds (FLASH_ATTN really selected for the sliding layers, the decode speed-up,
lossless tokens) is tests/gpu/runs/bench_steps.py's ``per_layer_backend`` record.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.patching.series import load_series
from launcher.paths import patches_dir
from tests.integration.patch_trees import (
    check_applies_alone,
    pristine,
    run_probe,
    single_patch_tree,
)
from tests.patches.conftest import on_stock

VERSION = "0.21.0"
PATCH_ID = "gemma4-text-only-per-layer-attention-backend"
PROBE = Path(__file__).with_name("gemma4_per_layer_probe.py")
PROBE_EXTRA = ["vllm/utils/math_utils.py", "vllm/config/model.py", "vllm/config/model_arch.py",
               "vllm/transformers_utils/model_arch_config_convertor.py",
               "vllm/config/multimodal.py", "vllm/multimodal/registry.py",
               "vllm/model_executor/models/gemma4_mm.py",
               # get_flash_attn_version as the release runs it (gemma4_per_layer_probe.install_flash_attn_version)
               "vllm/v1/attention/backends/fa_utils.py", "vllm/vllm_flash_attn/flash_attn_interface.py",
               "vllm/config/vllm.py", "vllm/platforms/interface.py"]
TEXT_ONLY = ("all_limits_zero", "language_model_only", "no_multimodal_config", "audio_tower_all_zero")
MULTIMODAL = ("multimodal", "image_only_off", "audio_tower_audio_open", "all_zero_with_mm_embeds",
              "language_model_only_with_mm_embeds")
NOT_CUDA = "language_model_only_not_cuda"

pytestmark = pytest.mark.network  # first run downloads the release from PyPI


def _probe(code_root: Path, version: str = VERSION) -> dict:
    return run_probe(PROBE, code_root, version)


@pytest.fixture(scope="module")
def released() -> dict:
    return _probe(pristine(VERSION, "site-packages"))


@pytest.fixture(scope="module")
def patched(tmp_path_factory) -> dict:
    if on_stock():  # test_patch_tests.py: the same tests must fail on the released tree
        return _probe(pristine(VERSION, "site-packages"))
    # This patch alone on the released files (conftest.py's rule), not the whole series.
    tree = single_patch_tree(VERSION, _patch(), tmp_path_factory.mktemp("patched"), extra=PROBE_EXTRA)
    return _probe(tree)


def _patch(version: str = VERSION):
    series = load_series(patches_dir() / "vllm" / version)
    return next(p for p in series.patches if p.id == PATCH_ID)


@pytest.mark.parametrize("version", (VERSION,))
def test_patch_is_in_the_series_with_its_header(version):
    patch = _patch(version)
    assert patch.headers["Upstream-Status"].startswith("Pending")
    assert "#38891" in patch.headers["Upstream-Status"]
    assert "TRITON_ATTN" in patch.headers["Fixes"]
    assert {fp.path for fp in patch.files} == {"vllm/model_executor/models/config.py",
                                               "vllm/model_executor/models/gemma4.py"}


@pytest.mark.parametrize("version", (VERSION,))
@pytest.mark.parametrize("layout", ("site-packages", "source"))
def test_applies_alone_and_compiles(version, layout, tmp_path):
    check_applies_alone(version, _patch(version), layout, tmp_path)


@pytest.mark.parametrize("scenario", TEXT_ONLY + MULTIMODAL + (NOT_CUDA,))
def test_released_locks_every_layer_to_triton_and_keeps_mm_prefix(released, scenario):
    assert released["verify"][scenario]["backend"] == "TRITON_ATTN"
    assert released["verify"][scenario]["is_mm_prefix_lm"] is True


def test_released_gemma4_attention_takes_the_selector_choice(released):
    assert released["layers"] == {"attention_call_attn_backend": None, "helper_present": False}


@pytest.mark.parametrize("scenario", TEXT_ONLY)
def test_patched_text_only_lifts_the_lock_and_the_mm_prefix(patched, scenario):
    seen = patched["verify"][scenario]
    assert seen["backend"] is None
    assert seen["is_mm_prefix_lm"] is False
    assert seen["arch_other_fields_kept"] is True


@pytest.mark.parametrize("scenario", TEXT_ONLY)
def test_patched_text_only_mm_prefix_stays_off_for_the_language_models_own_config(patched, scenario):
    """Seen on an H200: the lock was lifted, yet the sliding layers chose
    TRITON_ATTN out of [TRITON_ATTN, FLEX_ATTENTION], because the language
    model is built under vllm_config.with_hf_config(), which derives
    is_mm_prefix_lm again from use_bidirectional_attention."""
    assert patched["verify"][scenario]["rederived_is_mm_prefix_lm"] is False


@pytest.mark.parametrize("scenario", MULTIMODAL)
def test_patched_multimodal_serving_is_as_released(released, patched, scenario):
    assert patched["verify"][scenario] == released["verify"][scenario]


def test_released_registry_takes_mm_embeds_over_language_model_only(released):
    """The rule the patch must follow, from the released registry itself: with
    --enable-mm-embeds image embeddings are accepted even under --language-model-only."""
    assert released["verify"]["language_model_only_with_mm_embeds"]["registry_supports_mm_inputs"] is True
    assert released["verify"]["language_model_only"]["registry_supports_mm_inputs"] is False


def _follows_the_registry(seen: dict) -> None:
    assert seen["is_mm_prefix_lm"] is seen["registry_supports_mm_inputs"]
    assert (seen["backend"] is None) is (not seen["registry_supports_mm_inputs"])


@pytest.mark.parametrize("scenario", TEXT_ONLY)
def test_patched_mm_prefix_is_off_where_the_registry_refuses_multimodal_inputs(patched, scenario):
    _follows_the_registry(patched["verify"][scenario])


@pytest.mark.parametrize("scenario", MULTIMODAL)
def test_patched_lock_and_mm_prefix_kept_where_the_registry_accepts_multimodal_inputs_as_released(
        patched, scenario):
    # A cleared mm-prefix while the registry still accepts (embedded) images would give
    # image tokens causal attention, silently: --language-model-only --enable-mm-embeds.
    _follows_the_registry(patched["verify"][scenario])


def test_patched_other_platforms_keep_the_lock_without_mm_prefix(patched):
    assert patched["verify"][NOT_CUDA]["backend"] == "TRITON_ATTN"
    assert patched["verify"][NOT_CUDA]["is_mm_prefix_lm"] is False


def test_patched_explicit_backend_is_kept_and_text_only_drops_mm_prefix(released, patched):
    # A user's backend wins as before; text-only, FLASH_ATTN is then no longer refused.
    assert patched["verify"]["multimodal_user_backend"] == released["verify"]["multimodal_user_backend"]
    assert patched["verify"]["text_only_user_backend"]["backend"] == "FLASH_ATTN"
    assert patched["verify"]["text_only_user_backend"]["is_mm_prefix_lm"] is False


def test_patched_uniform_head_dims_get_no_backend_either_way(released, patched):
    assert released["verify"]["uniform_head_dim_text_only"]["backend"] is None
    assert patched["verify"]["uniform_head_dim_text_only"]["backend"] is None


def test_patched_large_head_layers_get_triton_only_without_a_backend(patched):
    layers = patched["layers"]
    rows = {(backend, head): chosen for backend, head, chosen in layers["rows"]}
    assert rows[(None, 512)] == "TRITON_ATTN"  # full layers, lock lifted
    assert rows[(None, 256)] is None  # sliding layers select their own backend
    for backend in ("TRITON_ATTN", "FLASH_ATTN"):  # a set backend applies to every layer
        assert rows[(backend, 512)] is None and rows[(backend, 256)] is None


# ------------------------------------------------------- through the real selector (0.21.0)

SELECTOR_PROBE = Path(__file__).with_name("attention_selector_probe.py")
SELECTOR_EXTRA = PROBE_EXTRA + ["vllm/platforms/cuda.py",
                                "vllm/v1/attention/selector.py", "vllm/v1/attention/backend.py",
                                "vllm/v1/attention/backends/flash_attn.py", "vllm/v1/attention/backends/triton_attn.py",
                                "vllm/v1/attention/backends/flex_attention.py"]


@pytest.fixture(scope="module")
def selected_released() -> dict:
    return run_probe(SELECTOR_PROBE, pristine(VERSION, "site-packages"))


@pytest.fixture(scope="module")
def selected_patched(tmp_path_factory) -> dict:
    if on_stock():
        return run_probe(SELECTOR_PROBE, pristine(VERSION, "site-packages"))
    tree = single_patch_tree(VERSION, _patch(), tmp_path_factory.mktemp("selector"), extra=SELECTOR_EXTRA)
    return run_probe(SELECTOR_PROBE, tree)


def test_released_selector_refuses_flash_attn_for_the_mm_prefix_with_the_seed_error(selected_released):
    # The probe runs the real selector: it gives the seed report's message (#43858).
    assert "partial multimodal token full attention not supported" in selected_released["selector"]["FLASH_ATTN/256/mm"]
    assert selected_released["selector"]["None/256/text"] == "FLASH_ATTN"
    assert selected_released["selector"]["None/512/text"] == "TRITON_ATTN"


def test_released_text_only_gemma4_runs_every_layer_on_triton(selected_released):
    seen = selected_released["gemma4_text_only"]
    assert (seen["configured_backend"], seen["sliding"], seen["full"]) == ("TRITON_ATTN", "TRITON_ATTN", "TRITON_ATTN")


def test_patched_text_only_gemma4_sliding_layers_select_flash_attn_full_layers_triton(selected_patched):
    """From Gemma4Config through Gemma4Attention's attn_backend and the real selector
    (RTX 5090: FlashAttention 2, no FA4)."""
    seen = selected_patched["gemma4_text_only"]
    assert seen["configured_backend"] is None and seen["is_mm_prefix_lm"] is False
    assert seen["sliding"] == "FLASH_ATTN"
    assert seen["full"] == "TRITON_ATTN"


# ------------------------------------------- FA3 (Hopper): the lock stays (0.21.0)
#
# An H100 run of a trained Gemma-4-shaped target served text-only with the series, FA
# version not forced (FA3 for the sliding layers, TRITON_ATTN for the full ones) gave
# NaN logits in decode for every prompt shorter than the sliding window; with FA2
# forced, or TRITON_ATTN on every layer, it did not (patches/vllm/README.md). So under
# FA3, as the release's own get_flash_attn_version decides it, every layer keeps
# TRITON_ATTN. The probes run that function from the tree on a stand-in CUDA platform
# of the GPU's capability (no GPU here), with the kernels the wheel ships.


def test_released_flash_attn_version_is_3_on_hopper_unless_2_is_forced(released):
    """The release's own rule, run under the config being built: the precondition of the
    scenarios below (and why the RTX 5090 ones are FA2)."""
    assert released["verify"]["language_model_only_h100"]["flash_attn_version"] == 3
    assert released["verify"]["language_model_only_h100_fa2_forced"]["flash_attn_version"] == 2


def test_patched_text_only_under_fa3_keeps_the_triton_lock(patched):
    seen = patched["verify"]["language_model_only_h100"]
    assert seen["backend"] == "TRITON_ATTN"
    assert seen["is_mm_prefix_lm"] is False  # no image can arrive, as on other platforms


def test_patched_text_only_with_fa2_forced_on_hopper_lifts_the_lock(patched):
    # The Hopper GPU proofs force FA2; they must still exercise the per-layer backends.
    seen = patched["verify"]["language_model_only_h100_fa2_forced"]
    assert seen["backend"] is None and seen["is_mm_prefix_lm"] is False


def test_patched_text_only_gemma4_on_fa3_runs_every_layer_on_triton_as_released(selected_released,
                                                                                 selected_patched):
    """Through the real selector: H100 (capability 9.0), FA version not forced."""
    seen = selected_patched["gemma4_text_only_by_gpu"]["h100"]
    assert (seen["configured_backend"], seen["sliding"], seen["full"]) == ("TRITON_ATTN", "TRITON_ATTN", "TRITON_ATTN")
    released = selected_released["gemma4_text_only_by_gpu"]["h100"]
    assert (released["sliding"], released["full"]) == (seen["sliding"], seen["full"])


@pytest.mark.parametrize("gpu", ("rtx5090", "h100_fa2_forced"))
def test_patched_text_only_gemma4_on_fa2_sliding_layers_select_flash_attn(selected_patched, gpu):
    """Through the real selector: capability 12.0, or an H100 with flash_attn_version 2."""
    seen = selected_patched["gemma4_text_only_by_gpu"][gpu]
    assert seen["configured_backend"] is None
    assert (seen["sliding"], seen["full"]) == ("FLASH_ATTN", "TRITON_ATTN")
