"""The vLLM 0.33.0 series, patch by patch, on the released 0.33.0 wheel and sdist.

Each patch goes through the project's engine (``launcher.patching.engine``)
on its own, onto copies of both released trees (``mini_tree``: the files the
engine reads, byte for byte), and every file it touches must compile. The
whole series in order (apply, re-apply, revert) is covered for every series
by ``test_patch_series_real.py``.

Behaviour, without a GPU. vLLM cannot be imported (its torch build and
compiled extensions are absent); what these tests run is the real source of the functions each patch
changes, cut out with ``ast`` (``series_0_33_0_probe.py`` says which
stand-ins surround it and why), before and after the patch: the pristine run
must show the bug FACTS.md describes and the patched run must not. What that
proves: the drafter's config objects carry the right flags and backends, and
the target's are left alone. What it does not prove: that a GPU run then
selects FLASH_ATTN for the drafter, serves, or accepts more tokens; that is
the GPU tier's job. The text checks at the end pin the facts in the released
code the patches rely on, so an upstream change that invalidates one fails
here instead of silently on a GPU.
"""

from __future__ import annotations

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

VERSION = "0.33.0"
SERIES_DIR = patches_dir() / "vllm" / VERSION
SERIES = load_series(SERIES_DIR)
PROBE = Path(__file__).with_name("series_0_33_0_probe.py")
# Read by the probe but changed by no patch.
PROBE_EXTRA = ["vllm/v1/spec_decode/llm_base_proposer.py", "vllm/config/model_arch.py"]

pytestmark = pytest.mark.network  # first run downloads the release from PyPI


def _ids(patches):
    return [p.id for p in patches]


# ------------------------------------------------------------------ the series


def test_series_names_every_patch_file_once_with_full_headers():
    on_disk = sorted(p.name for p in SERIES_DIR.glob("*.patch"))
    assert sorted(p.name for p in SERIES.patches) == on_disk
    for patch in SERIES.patches:
        for key in ("Subject", "Fixes", "Upstream-Status", "Bug"):
            assert patch.headers.get(key), f"{patch.name} lacks {key}"
        assert patch.description, f"{patch.name} has no why-paragraph"
        assert all(fp.path.startswith("vllm/") for fp in patch.files)


def test_patches_touch_disjoint_files():
    # Each one applies to the release on its own (what `patch check` reports per patch).
    seen: dict[str, str] = {}
    for patch in SERIES.patches:
        for fp in patch.files:
            assert fp.path not in seen, f"{fp.path}: {seen.get(fp.path)} and {patch.id}"
            seen[fp.path] = patch.id


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("patch", SERIES.patches, ids=_ids(SERIES.patches))
def test_each_patch_applies_alone_through_the_engine_and_compiles(patch, layout, tmp_path):
    check_applies_alone(VERSION, patch, layout, tmp_path)


# ------------------------------------------------------------------ behaviour


@pytest.fixture(scope="module")
def patched_tree(tmp_path_factory) -> Path:
    """The released wheel's files the probe reads, with the whole series applied."""
    return series_applied_tree(VERSION, tmp_path_factory.mktemp("patched"), PROBE_EXTRA)


def _probe(code_root: Path) -> dict:
    run = subprocess.run(
        # No Gemma 4 MTP sections: the series has no MTP patch (patches/vllm/README.md).
        [sys.executable, str(PROBE), str(code_root), "--no-mtp"],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.fixture(scope="module")
def probes(patched_tree) -> dict[str, dict]:
    return {"released": _probe(pristine(VERSION, "site-packages")), "patched": _probe(patched_tree)}


TARGET_UNTOUCHED = {
    "target_is_mm_prefix_lm": True,
    "target_arch_is_mm_prefix_lm": True,
    "target_arch_object_kept": True,
}


@pytest.mark.parametrize("runner", ["v1_dflash", "v2_dflash"])
def test_released_drafter_config_keeps_the_target_mm_prefix_flag(probes, runner):
    seen = probes["released"][runner]
    # The drafter's layers would read True: FLASH_ATTN is refused without FA4.
    assert seen["draft_is_mm_prefix_lm"] is True
    assert seen["draft_is_target_object"] is True


def test_released_v1_clear_is_dead_and_edits_the_target_config(probes):
    seen = probes["released"]["v1_dflash"]
    # The in-place clear reached the target's arch config, not the cached flag.
    assert seen["target_arch_is_mm_prefix_lm"] is False
    assert seen["target_is_mm_prefix_lm"] is True


@pytest.mark.parametrize("runner", ["v1_dflash", "v2_dflash"])
def test_patched_drafter_gets_its_own_config_without_mm_prefix(probes, runner):
    seen = probes["patched"][runner]
    assert seen["draft_is_mm_prefix_lm"] is False
    assert seen["draft_is_target_object"] is False
    assert {k: seen[k] for k in TARGET_UNTOUCHED} == TARGET_UNTOUCHED
    assert seen["target_vllm_model_config_kept"] is True
    # What the drafter already got from its config is unchanged by the patch.
    for key in ("draft_backend", "draft_use_non_causal"):
        assert seen[key] == probes["released"][runner][key], key


def test_without_mm_prefix_lm_copies_only_when_needed(probes):
    seen = probes["patched"]
    assert seen["model_config_methods"] == ["is_mm_prefix_lm", "without_mm_prefix_lm"]
    assert seen["without_mm_prefix_lm"]["draft_is_mm_prefix_lm"] is False
    assert {k: seen["without_mm_prefix_lm"][k] for k in TARGET_UNTOUCHED} == TARGET_UNTOUCHED
    assert seen["without_mm_prefix_lm_on_text_only_is_self"] is True


def _backends(rows):
    return {(s, t): {k: v for k, v in r.items() if k != "model_config_is_draft"} for s, t, r in rows}


# ------------------------------------------------ Gemma 4 DFlash drafter details

QWEN3_DFLASH = "vllm/model_executor/models/qwen3_dflash.py"
HELPERS = ("_gemma4_target_text_config", "_dflash_embed_scale", "_dflash_final_logit_softcap")


@pytest.fixture(scope="module")
def dflash_module(patched_tree) -> tuple[str, ast.Module]:
    text = (patched_tree / QWEN3_DFLASH).read_text()
    return text, ast.parse(text)


@pytest.fixture(scope="module")
def helpers(dflash_module) -> dict:
    """The patch's three module-level helpers, executed as written (with CPU torch for the dtype rounding)."""
    _, module = dflash_module
    import torch

    ns: dict = {"VllmConfig": object, "Qwen3Config": object, "torch": torch}
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name in HELPERS:
            exec(ast.unparse(node), ns)
    assert all(name in ns for name in HELPERS)
    return ns


def _vllm_config(text_model_type: str, **text_config):
    import torch

    text = types.SimpleNamespace(model_type=text_model_type, **text_config)
    return types.SimpleNamespace(model_config=types.SimpleNamespace(hf_text_config=text, dtype=torch.bfloat16))


# sqrt(2816) = 53.07 in bfloat16 (8 significant bits), as Gemma 4 applies it.
GEMMA_SCALE_BF16 = 53.0


def _draft(**fields):
    return types.SimpleNamespace(hidden_size=2816, **fields)


@pytest.mark.parametrize("model_type", ["gemma4_text", "gemma4", "gemma4_unified"])
def test_gemma4_target_gets_sqrt_hidden_embed_scale_and_its_soft_cap(helpers, model_type):
    vllm_config = _vllm_config(model_type, final_logit_softcapping=30.0)
    assert helpers["_dflash_embed_scale"](_draft(), vllm_config) == GEMMA_SCALE_BF16
    assert helpers["_dflash_final_logit_softcap"](_draft(), vllm_config) == 30.0


def test_drafter_soft_cap_wins_over_the_target_one(helpers):
    vllm_config = _vllm_config("gemma4_text", final_logit_softcapping=30.0)
    assert helpers["_dflash_final_logit_softcap"](_draft(final_logit_softcapping=25.0), vllm_config) == 25.0


@pytest.mark.parametrize("model_type", ["qwen3", "qwen3_5_text", "llama", "gemma3_text"])
def test_other_targets_keep_unscaled_uncapped_drafters(helpers, model_type):
    vllm_config = _vllm_config(model_type, final_logit_softcapping=30.0)
    draft = _draft(final_logit_softcapping=25.0)
    assert helpers["_dflash_embed_scale"](draft, vllm_config) is None
    assert helpers["_dflash_final_logit_softcap"](draft, vllm_config) is None


def test_a_stated_input_embedding_scale_multiplies_the_gemma_scale(helpers):
    # z-lab's Gemma 4 rule (dflash 0.1.0, model_mlx.py): the target's embed_scale
    # times dflash_config.input_embedding_scale.
    vllm_config = _vllm_config("gemma4_text", final_logit_softcapping=30.0)
    draft = _draft(dflash_config={"input_embedding_scale": 0.5})
    assert helpers["_dflash_embed_scale"](draft, vllm_config) == GEMMA_SCALE_BF16 * 0.5


def _class(module: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == name)


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)


def test_drafter_model_applies_the_scale_and_the_soft_cap(dflash_module):
    """Text/AST only: the helpers are wired where the embeddings and logits are made."""
    _, module = dflash_module
    model = _class(module, "DFlashQwen3Model")
    defaults = {t.target.id: t.value for t in model.body if isinstance(t, ast.AnnAssign)}
    assert ast.unparse(defaults["embed_scale"]) == "None"
    init = ast.unparse(_method(model, "__init__"))
    # Scoped to the plain DFlash model: DFlash2, DSpark, XPress, LiLiCorr call this __init__.
    assert "_dflash_embed_scale(self.config, vllm_config) if type(self) is DFlashQwen3Model else None" in init
    embed = ast.unparse(_method(model, "embed_input_ids"))
    assert "embeds * self.embed_scale" in embed
    # Applied last, after the mask-embedding substitution, as Gemma 4 scales every token.
    assert embed.index("torch.where") < embed.index("embeds * self.embed_scale")

    head = ast.unparse(_method(_class(module, "DFlashQwen3ForCausalLM"), "__init__"))
    assert (
        "_dflash_final_logit_softcap(self.config, vllm_config) if type(self) is DFlashQwen3ForCausalLM else None"
        in head
    )
    assert "soft_cap=soft_cap" in head


def test_subclasses_that_skip_the_base_init_still_have_an_embed_scale():
    """DFlashLagunaModel builds its own __init__ and inherits embed_input_ids: the
    scale must be a class default, or Laguna drafters fail with AttributeError."""
    text = (pristine(VERSION, "site-packages") / "vllm/model_executor/models/laguna_dflash.py").read_text()
    laguna = _class(ast.parse(text), "DFlashLagunaModel")
    assert "embed_input_ids" not in {n.name for n in laguna.body if isinstance(n, ast.FunctionDef)}
    init = ast.unparse(_method(laguna, "__init__"))
    assert "nn.Module.__init__(self)" in init and "super().__init__" not in init


# ------------------------------------------------ released facts the patches rely on


def _released(rel: str) -> str:
    return (pristine(VERSION, "site-packages") / rel).read_text()


def test_released_attention_layers_read_mm_prefix_from_the_current_config():
    module = ast.parse(_released("vllm/model_executor/layers/attention/attention.py"))
    init = ast.unparse(_method(_class(module, "Attention"), "__init__"))
    assert "vllm_config = get_current_vllm_config()" in init
    assert "model_config = vllm_config.model_config" in init
    assert "model_config.is_mm_prefix_lm" in init and "use_mm_prefix=self.use_mm_prefix" in init
    backend = _released("vllm/v1/attention/backend.py")
    assert "'partial multimodal token full attention not supported'" in ast.unparse(ast.parse(backend))
    # get_model builds the drafter under the VllmConfig it is given.
    loader = _released("vllm/model_executor/model_loader/utils.py")
    assert "set_current_vllm_config(vllm_config" in loader


def test_released_mm_prefix_flag_is_cached_and_read_by_the_runner_first():
    model = _class(ast.parse(_released("vllm/config/model.py")), "ModelConfig")
    prop = _method(model, "is_mm_prefix_lm")
    assert [ast.unparse(d) for d in prop.decorator_list] == ["cached_property"]
    runner = _class(ast.parse(_released("vllm/v1/worker/gpu_model_runner.py")), "GPUModelRunner")
    assert "self.is_mm_prefix_lm = self.model_config.is_mm_prefix_lm" in ast.unparse(_method(runner, "__init__"))


def test_released_v2_dflash_loader_builds_on_the_target_model_config():
    fn = next(
        n for n in ast.parse(_released("vllm/v1/worker/gpu/spec_decode/dflash/utils.py")).body
        if isinstance(n, ast.FunctionDef) and n.name == "load_dflash_model"
    )
    text = ast.unparse(fn)
    assert "is_mm_prefix_lm" not in text and "model_config=" not in text.split("get_model(")[0]


# ------------------------------------ text-only: vLLM's own backend_per_kind, not a patch


@pytest.fixture(scope="module")
def select_backend():
    """``select_backend(backend, per_kind, sliding)``: the released 0.33.0
    ``get_attn_backend`` (vllm/v1/attention/selector.py), run as written with
    ``KVCacheSpecKind`` and ``get_attn_spec_kind`` real; the current
    VllmConfig and the cached backend lookup it ends in are stand-ins (they
    need vLLM's compiled build), the latter returning the backend it is asked for."""
    from enum import Enum

    from tests.patches.vllm_source import load

    tree = pristine(VERSION, "site-packages")
    kv_text = (tree / "vllm/v1/kv_cache_interface.py").read_text()
    kinds: dict = {"Enum": Enum}
    exec(ast.unparse(_class(ast.parse(kv_text), "KVCacheSpecKind")), kinds)
    kv_module = types.ModuleType("vllm.v1.kv_cache_interface")
    kv_module.KVCacheSpecKind = kinds["KVCacheSpecKind"]
    selector = load(tree, "vllm/v1/attention/selector.py", overrides={
        "AttentionType": types.SimpleNamespace(DECODER="decoder", ENCODER_ONLY="encoder_only",
                                               ENCODER_DECODER="encoder_decoder"),
    })
    selector["_cached_get_attn_backend"] = lambda backend, **kwargs: backend
    selector["is_known_kv_cache_dtype"] = lambda dtype: True

    def run(backend, per_kind, sliding):
        config = types.SimpleNamespace(
            cache_config=None, kv_transfer_config=None, speculative_config=None, model_config=None,
            attention_config=types.SimpleNamespace(backend=backend, backend_per_kind=per_kind, use_non_causal=False),
            parallel_config=types.SimpleNamespace(prefill_context_parallel_size=1, decode_context_parallel_size=1),
        )
        config_module = types.ModuleType("vllm.config")
        config_module.get_current_vllm_config = lambda: config
        saved = {name: sys.modules.get(name) for name in ("vllm.config", "vllm.v1.kv_cache_interface")}
        sys.modules.update({"vllm.config": config_module, "vllm.v1.kv_cache_interface": kv_module})
        try:
            return selector["get_attn_backend"](256 if sliding else 512, "bfloat16", "bfloat16",
                                                has_sliding_window=sliding)
        finally:
            for name, module in saved.items():
                if module is None:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = module

    return run


def test_text_only_recipe_per_kind_map_puts_sliding_layers_on_flash_attn_full_on_triton(select_backend):
    # Gemma4Config.verify_and_update_config's lock without FA4: backend TRITON_ATTN
    # (test_gemma4_text_only_per_layer_attention_backend.py pins the 0.21.0 side).
    from launcher import recipe, vllm_compat

    intent = recipe.load("gemma4-moe-dflash-text").intent
    args = vllm_compat.render_intent(intent, vllm_compat.parse_version(VERSION)).args
    (kind,) = [a.rsplit(".", 1)[1] for a in args if a.startswith("--attention-config.backend_per_kind.")]
    per_kind = {kind: args[args.index(f"--attention-config.backend_per_kind.{kind}") + 1]}
    assert select_backend("TRITON_ATTN", per_kind, sliding=True) == "FLASH_ATTN"
    assert select_backend("TRITON_ATTN", per_kind, sliding=False) == "TRITON_ATTN"


def test_without_the_map_every_layer_keeps_the_lock_as_released(select_backend):
    assert select_backend("TRITON_ATTN", {}, sliding=True) == "TRITON_ATTN"
    assert select_backend("TRITON_ATTN", {}, sliding=False) == "TRITON_ATTN"
