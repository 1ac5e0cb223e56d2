"""The 0.26.0, 0.27.1, 0.29.0, 0.30.0, 0.31.0 and 0.32.0 series, patch by patch, on each released wheel and sdist.

The releases users run from other bases (SystemPanic's Windows wheels at
0.26.0 and 0.29.0, NGC 26.08 = 0.27.1, NGC 26.09 = 0.29.0, the vllm-gb10
Spark image at 0.30.0, NGC 26.10 = 0.31.0, and 0.32.0) carry the 0.33.0 series'
DFlash fixes, ported to each release's text, and the backport of 0.33.0's
Triton fully-masked-tile fix. As for 0.33.0:
each patch goes through the project's engine on its own onto copies of both
released trees and must compile; the whole series (apply, re-apply, revert,
CRLF, local edits) is covered for every series by
``test_patch_series_real.py``.

Behaviour without a GPU: ``series_0_33_0_probe.py`` runs the real
config-building functions each patch changes (the released code is close
enough to 0.33.0's that the same stand-ins serve), before and after the
patch. For the Gemma 4 DFlash scale and soft cap, the real patched
statements run against the real helpers, for the base classes and for a
subclass. What this does not prove: that a GPU run then picks FLASH_ATTN for
the drafter, serves, or accepts more tokens (the GPU tier's job). The text
checks at the end pin the facts of each release that NOTES.md states and
the series relies on.
"""

from __future__ import annotations

import ast
import json
import math
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from launcher.patching.series import load_series
from launcher.paths import patches_dir
from tests.integration.patch_trees import LAYOUTS, check_applies_alone, pristine, series_applied_tree

VERSIONS = ["0.26.0", "0.27.1", "0.29.0", "0.30.0", "0.31.0", "0.32.0"]
V2_BY_DEFAULT = ["0.29.0", "0.30.0", "0.31.0", "0.32.0"]
SERIES = {v: load_series(patches_dir() / "vllm" / v) for v in VERSIONS}
PATCHES = [(v, p) for v in VERSIONS for p in SERIES[v].patches]
PROBE = Path(__file__).with_name("series_0_33_0_probe.py")
PROBE_EXTRA = ["vllm/v1/spec_decode/llm_base_proposer.py", "vllm/config/model_arch.py"]
QWEN3_DFLASH = "vllm/model_executor/models/qwen3_dflash.py"

pytestmark = pytest.mark.network  # first run downloads the releases from PyPI


# ------------------------------------------------------------------ the series


# In the 0.33.0 series but not here (NOTES.md of each release says why): none.
NOT_PORTED: set[str] = set()
# Not in the 0.33.0 series because 0.33.0 has the fix; this release lacks it.
MASKED_TILE = "triton-unified-attention-fully-masked-tile"  # every one of these releases lacks it
BACKPORTED_HERE = {
    "0.26.0": [MASKED_TILE],
    "0.27.1": [MASKED_TILE], "0.29.0": [MASKED_TILE], "0.30.0": [MASKED_TILE], "0.31.0": [MASKED_TILE],
    "0.32.0": [MASKED_TILE],
}


@pytest.mark.parametrize("version", VERSIONS)
def test_same_fix_ids_as_the_0_33_0_series_with_full_headers(version):
    series = SERIES[version]
    reference = load_series(patches_dir() / "vllm" / "0.33.0")
    assert [p.id for p in series.patches] == [
        *(p.id for p in reference.patches if p.id not in NOT_PORTED), *BACKPORTED_HERE.get(version, [])]
    assert [p.id for p in series.build_patches] == ["cmake-keep-sm121"]
    assert sorted(p.name for p in series.patches) == sorted(p.name for p in series.path.glob("*.patch"))
    seen: dict[str, str] = {}
    for patch in series.patches:
        for key in ("Subject", "Fixes", "Upstream-Status", "Bug"):
            assert patch.headers.get(key), f"{patch.name} lacks {key}"
        assert patch.description
        for fp in patch.files:
            # A backport of a later release's fix may share a file, in other functions
            # (each patch still applies alone, test below, and in order, test_patch_series_real).
            if patch.id not in BACKPORTED_HERE.get(version, []):
                assert fp.path not in seen, f"{fp.path}: {seen.get(fp.path)} and {patch.id}"
            seen[fp.path] = patch.id


@pytest.mark.parametrize("version", VERSIONS)
def test_notes_name_every_patch_and_every_file_it_touches(version):
    notes = (SERIES[version].path / "NOTES.md").read_text()
    assert f"vLLM {version}" in notes
    for patch in SERIES[version].patches:
        assert f"`{patch.id}`" in notes
        for fp in patch.files:
            assert Path(fp.path).name in notes, (patch.id, fp.path)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("version", "patch"), PATCHES, ids=[f"{v}-{p.id}" for v, p in PATCHES])
def test_each_patch_applies_alone_through_the_engine_and_compiles(version, patch, layout, tmp_path):
    check_applies_alone(version, patch, layout, tmp_path)


# ------------------------------------------------------------------ behaviour


@pytest.fixture(scope="module", params=VERSIONS)
def release(request, tmp_path_factory):
    """(version, pristine wheel tree, the same files with the whole series applied)."""
    version = request.param
    patched = series_applied_tree(version, tmp_path_factory.mktemp(f"patched-{version}"), PROBE_EXTRA)
    return version, pristine(version, "site-packages"), patched


def _probe(code_root: Path) -> dict:
    # No MTP sections: these series leave the Gemma4 MTP patch out (NOT_PORTED).
    run = subprocess.run([sys.executable, str(PROBE), str(code_root), "--no-mtp"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.fixture(scope="module")
def probes(release) -> dict[str, dict]:
    _, released, patched = release
    return {"released": _probe(released), "patched": _probe(patched)}


@pytest.mark.parametrize("runner", ["v1_dflash", "v2_dflash"])
def test_released_drafter_inherits_the_mm_prefix_flag_patched_one_does_not(probes, runner):
    released, patched = probes["released"][runner], probes["patched"][runner]
    assert released["draft_is_mm_prefix_lm"] is True and released["draft_is_target_object"] is True
    assert patched["draft_is_mm_prefix_lm"] is False and patched["draft_is_target_object"] is False
    for key in ("target_is_mm_prefix_lm", "target_arch_is_mm_prefix_lm", "target_arch_object_kept"):
        assert patched[key] is True, key
    assert patched["target_vllm_model_config_kept"] is True
    for key in ("draft_backend", "draft_use_non_causal"):
        assert patched[key] == released[key], key


def test_released_v1_clear_edits_the_target_arch_config_but_not_the_cached_flag(probes):
    seen = probes["released"]["v1_dflash"]
    assert seen["target_arch_is_mm_prefix_lm"] is False and seen["target_is_mm_prefix_lm"] is True


# ------------------------------------------------ Gemma 4 DFlash, scoped to the base classes

HELPERS = ("_gemma4_target_text_config", "_dflash_embed_scale", "_dflash_final_logit_softcap")


def _class(module: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == name)


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)


@pytest.fixture(scope="module")
def dflash(release) -> tuple[ast.Module, dict]:
    """The patched module's AST and a namespace holding its three helpers, run as written."""
    module = ast.parse((release[2] / QWEN3_DFLASH).read_text())
    import torch

    ns: dict = {"VllmConfig": object, "Qwen3Config": object, "torch": torch}
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name in HELPERS:
            exec(ast.unparse(node), ns)
    return module, ns


def _vllm_config(model_type: str, **text_config):
    text = types.SimpleNamespace(model_type=model_type, **text_config)
    import torch

    return types.SimpleNamespace(model_config=types.SimpleNamespace(hf_text_config=text, dtype=torch.bfloat16))


def _draft(**fields):
    return types.SimpleNamespace(hidden_size=2816, **fields)


def _patched_statement(fn: ast.FunctionDef, marker: str) -> ast.stmt:
    return next(s for s in ast.walk(fn) if isinstance(s, ast.stmt) and marker in ast.unparse(s)
                and not isinstance(s, (ast.FunctionDef, ast.If)))


def _run_for_class(statement: str, class_name: str, subclass: bool, ns: dict, vllm_config, draft) -> dict:
    """Execute a patched statement of ``class_name.__init__`` with ``self`` an
    instance of that class or of a subclass (as DSpark/DFlash2 call it)."""
    scope = dict(ns)
    exec(f"class {class_name}:\n    pass\n", scope)
    cls = scope[class_name]
    if subclass:
        cls = type("SubclassReusingInit", (cls,), {})
    scope.update(self=object.__new__(cls), vllm_config=vllm_config,
                 LogitsProcessor=lambda *args, **kwargs: kwargs)
    scope["self"].config = draft
    exec(statement, scope)
    return scope


def test_embed_scale_for_the_base_model_only(dflash):
    import torch

    module, ns = dflash
    init = _method(_class(module, "DFlashQwen3Model"), "__init__")
    statement = ast.unparse(_patched_statement(init, "embed_scale = "))
    config = _vllm_config("gemma4_text", final_logit_softcapping=30.0)
    base = _run_for_class(statement, "DFlashQwen3Model", False, ns, config, _draft())
    # sqrt(2816) rounded to bfloat16, as Gemma 4 applies it.
    assert base["embed_scale"] == float(torch.tensor(math.sqrt(2816), dtype=torch.bfloat16))
    sub = _run_for_class(statement, "DFlashQwen3Model", True, ns, config, _draft())
    assert sub["embed_scale"] is None
    qwen = _run_for_class(statement, "DFlashQwen3Model", False, ns, _vllm_config("qwen3"), _draft())
    assert qwen["embed_scale"] is None


def test_soft_cap_for_the_base_causal_lm_only(dflash):
    module, ns = dflash
    init = _method(_class(module, "DFlashQwen3ForCausalLM"), "__init__")
    call = _patched_statement(init, "LogitsProcessor(")
    statement = "result = " + ast.unparse(call.value)  # self.logits_processor = LogitsProcessor(...)
    config = _vllm_config("gemma4_text", final_logit_softcapping=30.0)
    draft = _draft(draft_vocab_size=262144)
    scope = {"logit_scale": 1.0}
    base = _run_for_class(statement, "DFlashQwen3ForCausalLM", False, {**ns, **scope}, config, draft)
    assert base["result"]["soft_cap"] == 30.0
    sub = _run_for_class(statement, "DFlashQwen3ForCausalLM", True, {**ns, **scope}, config, draft)
    assert sub["result"]["soft_cap"] is None


def test_embed_scale_is_a_class_default_applied_after_the_mask_embedding(dflash):
    module, _ = dflash
    model = _class(module, "DFlashQwen3Model")
    defaults = {t.target.id: ast.unparse(t.value) for t in model.body if isinstance(t, ast.AnnAssign)}
    assert defaults["embed_scale"] == "None"
    embed = ast.unparse(_method(model, "embed_input_ids"))
    assert embed.index("torch.where") < embed.index("embeds * self.embed_scale")


def test_released_subclasses_run_the_base_init(release):
    """Why the scoping matters: in each release some other drafter family
    subclasses the DFlash base and runs its __init__."""
    version, released, _ = release
    reusing = []
    for path in (released / "vllm" / "model_executor" / "models").glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and any(ast.unparse(b) == "DFlashQwen3Model" for b in node.bases):
                inits = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
                if not inits or "super().__init__" in ast.unparse(inits[0]):
                    reusing.append(node.name)
    assert "Qwen3DSparkModel" in reusing, reusing
    if version == "0.29.0":
        assert "DFlash2Qwen3Model" in reusing


# ------------------------------------------------ released facts the series and NOTES.md rely on


def _released(version: str, rel: str) -> str:
    return (pristine(version, "site-packages") / rel).read_text()


def _function_text(text: str, name: str, cls: str | None = None) -> str:
    module = ast.parse(text)
    scope = _class(module, cls).body if cls else module.body
    return ast.unparse(next(n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name))


# (file, class or None, function, text it holds): the fixes NOTES.md reads as upstream.
UPSTREAM = {
    "bug 6, target_layer_ids + 1 (V2)": ("vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py", None,
                                         "get_eagle3_aux_layers_from_config",
                                         "i + 1 for i in dflash_config.get('target_layer_ids')"),
    "bug 6, target_layer_ids + 1 (V1)": ("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner",
                                         "_get_eagle3_aux_layers_from_config",
                                         "i + 1 for i in dflash_config.get('target_layer_ids')"),
    "bug 4, block tables sliced (V1 MTP)": ("vllm/v1/spec_decode/gemma4.py", "Gemma4Proposer",
                                            "build_per_group_and_layer_attn_metadata", "[:batch_size]"),
    "drafter over several KV groups (V2)": ("vllm/v1/worker/gpu/spec_decode/dflash/speculator.py", "DFlashSpeculator",
                                            "set_attn", "self.draft_kv_cache_group_ids = "),
    "bug 1, drafter gets the configured backend": ("vllm/v1/spec_decode/llm_base_proposer.py", "SpecDecodeBaseProposer",
                                                   "_create_draft_vllm_config",
                                                   "backend=spec_cfg.attention_backend"),
}


@pytest.mark.parametrize("fact", UPSTREAM)
@pytest.mark.parametrize("version", VERSIONS)
def test_released_fixes_that_need_no_patch(version, fact):
    rel, cls, function, text = UPSTREAM[fact]
    assert text in _function_text(_released(version, rel), function, cls)


@pytest.mark.parametrize("version", VERSIONS)
def test_released_runner_choice_puts_the_recipes_on_v2(version):
    text = _function_text(_released(version, "vllm/config/vllm.py"), "use_v2_model_runner", "VllmConfig")
    if version in V2_BY_DEFAULT:
        assert "_is_default_v2_model_runner_model" not in text and text.rstrip().endswith("return True")
    else:
        # Gemma 4 26B-A4B is MoE and not a default-V2 architecture: V2 comes from the mixed drafter.
        assert re.search(r"if self\._dflash_needs_multi_kv_group\(\):\s+return True", text)
        assert "Gemma4" not in _released(version, "vllm/config/vllm.py").split("DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES")[1][:400]


@pytest.mark.parametrize("version", ["0.26.0", "0.27.1"])
def test_released_attention_backends_share_one_kv_shape(version):
    shapes = set()
    for backend in ("triton_attn", "flash_attn", "flex_attention"):
        text = _released(version, f"vllm/v1/attention/backends/{backend}.py")
        fn = _function_text(text, "get_kv_cache_shape", next(
            n.name for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name.endswith("Backend")
            and "get_kv_cache_shape" in ast.unparse(n)))
        shapes.add(fn.rstrip().splitlines()[-1].strip())
    assert shapes == {"return (num_blocks, num_kv_heads, block_size, 2 * head_size)"}


@pytest.mark.parametrize("version", V2_BY_DEFAULT)
def test_released_resolves_one_kv_layout_like_0_33_0(version):
    assert "def resolve_kv_cache_layout(" in _released(version, "vllm/v1/attention/backends/utils.py")
    for backend in ("triton_attn", "flash_attn", "flex_attention"):
        assert "def get_kv_cache_shape" not in _released(version, f"vllm/v1/attention/backends/{backend}.py")


@pytest.mark.parametrize("version", VERSIONS)
def test_released_cmake_lists_drop_12_1_under_cuda_13(version):
    text = (pristine(version, "source") / "CMakeLists.txt").read_text()
    cuda13 = re.findall(r'VERSION_GREATER_EQUAL 13\.\d\)[^\n]*\n(?:\s*#[^\n]*\n)*\s*set\(CUDA_SUPPORTED_ARCHS "([^"]+)"\)',
                        text)
    assert cuda13 and all(archs.split(";")[-1] == "12.0" for archs in cuda13), cuda13
