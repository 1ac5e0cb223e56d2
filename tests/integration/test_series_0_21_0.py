"""The vLLM 0.21.0 series, patch by patch, on the released 0.21.0 wheel and sdist.

Each patch goes through the project's engine (``launcher.patching.engine``)
on its own onto copies of both released trees, and every file it touches
must compile. The whole series in order (apply, re-apply, revert) is covered
for every series by ``test_patch_series_real.py``.

Behaviour, without a GPU: vLLM cannot be imported (its torch build and compiled
extensions are absent; the test environment has only a CPU torch of another version).
``series_0_21_0_probe.py`` runs the real source of what each patch changes
(cut out with ``ast``, against the stand-ins it lists) on the released tree
and on the patched one; the released run must show the bug FACTS.md
describes and the patched run must not, while configurations the patch is
not about come out exactly as before. The KV cache grouping runs for real:
the released ``kv_cache_interface.py`` classes and every function of
``kv_cache_utils.py``. What this does not prove: that a GPU run selects
FLASH_ATTN for the drafter, serves, or stays lossless; that is the GPU
tier's job. The text checks pin released facts the patches rely on, so an
upstream change that invalidates one fails here rather than on a GPU.
"""

from __future__ import annotations
import __future__

import ast
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from launcher.patching.series import load_series
from launcher.paths import patches_dir
from tests.integration.patch_trees import (
    LAYOUTS,
    check_applies_alone,
    pristine,
    series_applied_tree,
)

VERSION = "0.21.0"
SERIES_DIR = patches_dir() / "vllm" / VERSION
SERIES = load_series(SERIES_DIR)
PROBE = Path(__file__).with_name("series_0_21_0_probe.py")
# Read by the probe, changed by no patch.
PROBE_EXTRA = [
    "vllm/utils/math_utils.py",
    "vllm/utils/hashing.py",
    "vllm/config/model.py",
    "vllm/config/model_arch.py",
    "vllm/v1/attention/backend.py",
    "vllm/v1/attention/backends/triton_attn.py",
    "vllm/v1/attention/backends/flash_attn.py",
    "vllm/v1/attention/backends/flex_attention.py",
]
QWEN3_DFLASH = "vllm/model_executor/models/qwen3_dflash.py"

pytestmark = pytest.mark.network  # first run downloads the release from PyPI


def _ids(patches):
    return [p.id for p in patches]


# ------------------------------------------------------------------ the series


def test_series_names_every_patch_file_once_with_full_headers():
    on_disk = sorted(p.name for p in SERIES_DIR.glob("*.patch"))
    assert sorted(p.name for p in SERIES.patches) == on_disk
    assert len({p.id for p in SERIES.patches}) == len(SERIES.patches)
    for patch in SERIES.patches:
        for key in ("Subject", "Fixes", "Upstream-Status", "Bug"):
            assert patch.headers.get(key), f"{patch.name} lacks {key}"
        assert patch.description, f"{patch.name} has no why-paragraph"
        assert all(fp.path.startswith("vllm/") for fp in patch.files)


def test_every_id_is_listed_in_the_readme():
    readme = (patches_dir() / "vllm" / "README.md").read_text()
    for patch in SERIES.patches:
        assert f"`{patch.id}`" in readme, patch.id


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("patch", SERIES.patches, ids=_ids(SERIES.patches))
def test_each_patch_applies_alone_through_the_engine_and_compiles(patch, layout, tmp_path):
    check_applies_alone(VERSION, patch, layout, tmp_path)


# ------------------------------------------------------------------ probe runs


@pytest.fixture(scope="module")
def patched_tree(tmp_path_factory) -> Path:
    """The released wheel's files the probe reads, with the whole series applied."""
    return series_applied_tree(VERSION, tmp_path_factory.mktemp("patched"), PROBE_EXTRA)


def _probe(code_root: Path) -> dict:
    run = subprocess.run([sys.executable, str(PROBE), str(code_root)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.fixture(scope="module")
def released() -> dict:
    return _probe(pristine(VERSION, "site-packages"))


@pytest.fixture(scope="module")
def patched(patched_tree) -> dict:
    return _probe(patched_tree)


# ------------------------------------------- 0001 dflash-drafter-own-mm-prefix-config


def test_released_drafter_is_built_on_the_targets_mm_prefix_config(released):
    seen = released["dflash_drafter_config"]["multimodal_target"]
    # Every drafter Attention would read True: FLASH_ATTN without FA4 is refused.
    assert seen["draft_is_mm_prefix_lm"] is True
    assert seen["draft_model_config_is_target"] is True


def test_patched_drafter_gets_its_own_config_without_mm_prefix(released, patched):
    seen = patched["dflash_drafter_config"]["multimodal_target"]
    assert seen["draft_is_mm_prefix_lm"] is False
    assert seen["draft_model_config_is_target"] is False
    assert seen["draft_arch_other_fields_kept"] and seen["draft_shares_hf_identity"]
    # The target's config, read by the runner and the target's layers, is untouched.
    assert seen["target_is_mm_prefix_lm"] is True
    assert seen["target_arch_object_kept"] and seen["target_vllm_config_model_kept"]
    assert seen["target_backend"] == "TRITON_ATTN"
    # What the drafter already got from the base proposer is unchanged.
    before = released["dflash_drafter_config"]["multimodal_target"]
    for key in ("draft_backend", "draft_use_non_causal"):
        assert seen[key] == before[key], key


def test_text_only_target_is_not_copied(patched):
    seen = patched["dflash_drafter_config"]["text_only_target"]
    assert seen["draft_model_config_is_target"] is True and seen["draft_is_mm_prefix_lm"] is False


def test_released_mm_prefix_flag_is_a_plain_property_read_at_layer_init(released):
    # FACTS.md: 0.21.0 reads it live (0.25.0+ caches it), so a copied arch config is enough.
    assert released["dflash_drafter_config"]["is_mm_prefix_lm_decorator"] == "property"
    init = _method_source("vllm/model_executor/layers/attention/attention.py", "Attention", "__init__")
    assert "vllm_config = get_current_vllm_config()" in init
    assert "model_config = vllm_config.model_config" in init
    assert "model_config.is_mm_prefix_lm" in init and "use_mm_prefix=self.use_mm_prefix" in init
    assert "set_current_vllm_config(vllm_config" in _released("vllm/model_executor/model_loader/utils.py")


# ------------------------------------------- 0002 drafter-layers-one-kv-cache-group

SPLIT_BEFORE = ("toy_2_drafter_layers", "26b_6_drafter_layers")
UNCHANGED = ("26b_5_drafter_layers", "toy_drafter_like_full_layers", "target_only_toy",
             "target_only_26b", "uniform_with_drafter")
# Page of one Gemma-4-shaped layer in the probe: 2 (K, V) * 16 tokens * 4 heads * 256 * 2 bytes.
PAGE_BYTES = 2 * 16 * 4 * 256 * 2
POOL_BYTES = 1 << 30


@pytest.mark.parametrize("scenario", SPLIT_BEFORE)
def test_released_grouping_splits_a_drafter_larger_than_the_smallest_bucket(released, scenario):
    assert len(released["kv_grouping"][scenario]["draft_group_ids"]) == 2


@pytest.mark.parametrize("scenario", SPLIT_BEFORE)
def test_patched_grouping_keeps_the_drafter_in_one_group(patched, scenario):
    seen = patched["kv_grouping"][scenario]
    assert len(seen["draft_group_ids"]) == 1
    assert seen["draft_groups_hold_only_draft_layers"]
    # The target's layers are grouped exactly as without a drafter.
    target_only = "target_only_toy" if scenario.startswith("toy") else "target_only_26b"
    draft_gid = seen["draft_group_ids"][0]
    target_groups = [g for i, g in enumerate(seen["groups"]) if i != draft_gid]
    assert target_groups == patched["kv_grouping"][target_only]["groups"]


@pytest.mark.parametrize("scenario", UNCHANGED)
def test_patched_grouping_changes_nothing_else(released, patched, scenario):
    assert patched["kv_grouping"][scenario] == released["kv_grouping"][scenario]


@pytest.mark.parametrize("scenario", SPLIT_BEFORE)
def test_patched_tensors_give_every_layer_one_page_per_block(patched, scenario):
    seen = patched["kv_grouping"][scenario]
    group_of = {name: gid for gid, names in enumerate(seen["groups"]) for name in names}
    placed = [name for tensor in seen["tensors"] for name in tensor]
    assert sorted(placed) == sorted(group_of)  # every layer exactly once
    for tensor in seen["tensors"]:
        gids = [group_of[name] for name in tensor]
        assert len(gids) == len(set(gids))  # one layer per group per shared tensor
    # The pool is cut into as many tensors as the largest group (the drafter's here).
    largest = max(len(g) for g in seen["groups"])
    assert len(seen["tensors"]) == largest
    assert seen["num_blocks"] == POOL_BYTES // PAGE_BYTES // largest


def test_drafter_marker_is_set_by_the_proposer_and_carried_into_the_spec(patched_tree):
    """Text/AST: the marker's wiring (the probe covers what the planner does with it)."""
    with_series = {
        rel: (patched_tree / rel).read_text()
        for rel in (
            "vllm/v1/spec_decode/llm_base_proposer.py",
            "vllm/v1/worker/gpu_model_runner.py",
            "vllm/model_executor/layers/attention_layer_base.py",
            "vllm/v1/kv_cache_interface.py",
        )
    }
    load = _method_of(with_series["vllm/v1/spec_decode/llm_base_proposer.py"], "SpecDecodeBaseProposer", "load_model")
    assert "all_attn_layers[name].is_draft_layer = True" in load
    spec = _method_of(with_series["vllm/v1/worker/gpu_model_runner.py"], "GPUModelRunner", "get_kv_cache_spec")
    assert "if attn_module.is_draft_layer:" in spec and "replace(spec, is_draft=True)" in spec
    base = _class_of(with_series["vllm/model_executor/layers/attention_layer_base.py"], "AttentionLayerBase")
    assert "is_draft_layer: bool = False" in ast.unparse(base)
    kv_spec = _class_of(with_series["vllm/v1/kv_cache_interface.py"], "KVCacheSpec")
    assert "is_draft: bool = field(default=False, kw_only=True, compare=False)" in ast.unparse(kv_spec)


# ------------------------------------ 0003 reconcile-kv-layout-mixed-attention-backends


def test_released_runner_reconciles_layouts_only_for_mamba(released):
    assert released["kv_layouts"] == {"check_present": False}
    reshape = _method_source("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner", "_reshape_kv_cache_tensors")
    assert "if has_attn and has_mamba:" in reshape


def test_patched_runner_detects_mixed_block_dims_on_shared_tensors(patched):
    seen = patched["kv_layouts"]
    # FACTS.md: TRITON_ATTN puts the block dim first, FLASH_ATTN second.
    assert seen["block_dims"] == {"TRITON_ATTN": 0, "FLASH_ATTN": 1, "FLEX_ATTENTION": 1}
    assert seen["flash_drafter_sharing_triton_tensors"] is True
    assert seen["triton_drafter_sharing_triton_tensors"] is False
    assert seen["flash_drafter_own_tensors"] is False


def test_patched_runner_switches_layouts_when_they_mix(patched_tree):
    text = (patched_tree / "vllm/v1/worker/gpu_model_runner.py").read_text()
    reshape = _method_of(text, "GPUModelRunner", "_reshape_kv_cache_tensors")
    assert "self._shared_kv_cache_tensors_mix_block_dims(kv_cache_raw_tensors, kernel_block_sizes)" in reshape
    tail = reshape[reshape.index("if has_attn and"):]
    assert tail.index("_shared_kv_cache_tensors_mix_block_dims") < tail.index(
        "self._update_hybrid_attention_mamba_layout(kv_caches, kernel_block_sizes)"
    )


# ------------------------------------------------- 0004 dflash-target-layer-ids-offset


def test_dflash_target_layer_ids_are_shifted_eagle_ids_are_not(released, patched):
    assert released["aux_layers"]["dflash_config"] == [1, 7, 13, 19, 25]
    assert patched["aux_layers"]["dflash_config"] == [2, 8, 14, 20, 26]
    for key in ("eagle_ids", "both", "none"):
        assert patched["aux_layers"][key] == released["aux_layers"][key], key


def test_released_models_record_aux_state_i_plus_one_after_layer_i():
    # Why the shift is right for every DFlash target, not only Gemma 4.
    for rel in ("vllm/model_executor/models/gemma4.py", "vllm/model_executor/models/qwen2.py"):
        text = _released(rel)
        assert "_maybe_add_hidden_state([], 0, hidden_states, residual)" in text, rel
        assert "idx + 1, hidden_states, residual" in text, rel


# --------------------------------------------- 0005 gemma4-dflash-embed-scale-logit-softcap

HELPERS = ("_gemma4_target_text_config", "_dflash_final_logit_softcap")


@pytest.fixture(scope="module")
def dflash_helpers(patched_tree) -> dict:
    """The patch's module-level helpers, executed as written (they use no torch)."""
    module = ast.parse((patched_tree / QWEN3_DFLASH).read_text())
    ns: dict = {}
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name in HELPERS:
            # Annotations stay strings (PretrainedConfig, VllmConfig are not importable here).
            code = compile(ast.Module([node], []), QWEN3_DFLASH, "exec", flags=__future__.annotations.compiler_flag)
            exec(code, ns)
    assert all(name in ns for name in HELPERS)
    return ns


def _vllm_config(model_type: str, **text_fields):
    text = types.SimpleNamespace(model_type=f"{model_type}_text", **text_fields)
    return types.SimpleNamespace(model_config=types.SimpleNamespace(
        hf_config=types.SimpleNamespace(model_type=model_type), hf_text_config=text))


@pytest.mark.parametrize("model_type", ["gemma4", "gemma4_text"])
def test_gemma4_targets_get_the_soft_cap(dflash_helpers, model_type):
    cfg = _vllm_config(model_type, final_logit_softcapping=30.0, hidden_size=2816)
    assert dflash_helpers["_gemma4_target_text_config"](cfg) is cfg.model_config.hf_text_config
    draft = types.SimpleNamespace()
    assert dflash_helpers["_dflash_final_logit_softcap"](draft, cfg) == 30.0
    assert dflash_helpers["_dflash_final_logit_softcap"](types.SimpleNamespace(final_logit_softcapping=25.0), cfg) == 25.0
    null_cap = types.SimpleNamespace(final_logit_softcapping=None)
    assert dflash_helpers["_dflash_final_logit_softcap"](null_cap, cfg) == 30.0


@pytest.mark.parametrize("model_type", ["qwen3", "qwen3_5", "gemma3", "llama"])
def test_other_targets_keep_unscaled_uncapped_drafters(dflash_helpers, model_type):
    cfg = _vllm_config(model_type, final_logit_softcapping=30.0, hidden_size=4096)
    assert dflash_helpers["_gemma4_target_text_config"](cfg) is None
    draft = types.SimpleNamespace(final_logit_softcapping=25.0)
    assert dflash_helpers["_dflash_final_logit_softcap"](draft, cfg) is None


def test_drafter_model_applies_the_scale_and_the_soft_cap(patched_tree):
    """Text/AST: the helpers are wired where embeddings and logits are made (needs torch to run)."""
    text = (patched_tree / QWEN3_DFLASH).read_text()
    init = _method_of(text, "DFlashQwen3Model", "__init__")
    assert "_gemma4_target_text_config(vllm_config)" in init
    assert "torch.tensor(target_text_config.hidden_size ** 0.5)" in init
    assert "self.embed_normalizer = None" in init
    embed = _method_of(text, "DFlashQwen3Model", "embed_input_ids")
    assert "inputs_embeds * self.embed_normalizer" in embed
    head = _method_of(text, "DFlashQwen3ForCausalLM", "__init__")
    assert "soft_cap=_dflash_final_logit_softcap(self.config, vllm_config)" in head


def test_released_gemma4_scales_embeddings_and_soft_caps_logits():
    text = _released("vllm/model_executor/models/gemma4.py")
    assert "torch.tensor(config.hidden_size**0.5)" in text
    assert "return self.embed_tokens(input_ids) * self.normalizer" in text
    assert 'soft_cap=getattr(config, "final_logit_softcapping", None)' in text


# ------------------------------------------------------------------ helpers


def _released(rel: str) -> str:
    return (pristine(VERSION, "site-packages") / rel).read_text()


def _class_of(text: str, name: str) -> ast.ClassDef:
    return next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == name)


def _method_of(text: str, cls: str, name: str) -> str:
    node = next(n for n in _class_of(text, cls).body if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.unparse(node)


def _method_source(rel: str, cls: str, name: str) -> str:
    return _method_of(_released(rel), cls, name)

