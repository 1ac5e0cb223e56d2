"""Runs the config-building code of a vLLM 0.33.0 tree (also 0.26.0-0.29.0) without torch, in its own process.

Usage: ``python series_0_33_0_probe.py CODE_ROOT``. ``CODE_ROOT`` holds the
(patched or pristine) files under test. Prints one JSON object with what each
scenario observed; the test decides what is right.

``import vllm`` needs torch and ``import vllm.config`` needs torch, CUDA
libraries and vLLM's other dependencies, none of which CI has, so nothing is
imported from vLLM. What runs is the real source of the functions the series
changes, cut out of the files with ``ast`` and executed against stand-ins for
what they call:

* ``ModelConfig``: the real ``is_mm_prefix_lm`` cached property (and, when
  the tree has it, ``without_mm_prefix_lm``) on a pydantic dataclass made the
  way vLLM's ``@config`` makes ``ModelConfig`` (extra fields forbidden), with
  the real ``ModelArchitectureConfig`` (its file loaded directly; its one
  vLLM import, ``vllm.logger``, is served by the standard ``logging``).
  Stand-in: the other 2,000 lines of ``ModelConfig`` (``__post_init__`` loads
  a Hugging Face config).
* ``VllmConfig`` and its sub-configs: plain dataclasses with the fields these
  functions read; ``vllm.config.replace`` is ``dataclasses.replace`` for them.
* The proposers: the real ``_create_draft_vllm_config`` of the base class and
  of the subclass, on a class built from exactly those two methods.
* ``load_dflash_model`` (V2): the real function; ``get_model`` records the
  config it is given instead of building a network, and the two modules it
  imports lazily (torch-bound) are stand-ins returning fixed answers.

It runs in a subprocess because those stand-ins register ``vllm...`` names in
``sys.modules``, which would mislead other tests that look for an installed
vLLM.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import enum
import importlib.util
import json
import logging
import sys
import textwrap
import types
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import ConfigDict
from pydantic.dataclasses import dataclass as pydantic_dataclass


def _source(path: Path) -> tuple[str, ast.Module]:
    text = path.read_text(encoding="utf-8")
    return text, ast.parse(text)


def _class(module: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == name)


def _methods(cls: ast.ClassDef, names: set[str]) -> list[ast.FunctionDef]:
    return [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in names]


def _function(module: ast.Module, name: str) -> ast.FunctionDef:
    return next(n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == name)


def _class_source(name: str, bases: str, methods: list[ast.FunctionDef], extra: str = "") -> str:
    body = "\n\n".join(textwrap.indent(ast.unparse(m), "    ") for m in methods)
    return f"class {name}({bases}):\n{extra}{body or '    pass'}\n"


def _identity(fn):
    return fn


# ---------------------------------------------------------------- stand-ins


@dataclasses.dataclass
class AttentionConfig:
    backend: Any = None
    use_non_causal: bool = False


@dataclasses.dataclass
class KernelConfig:
    moe_backend: Any = None


@dataclasses.dataclass
class CacheConfig:
    cache_dtype: str = "auto"


@dataclasses.dataclass
class VllmConfig:
    model_config: Any
    attention_config: AttentionConfig
    speculative_config: Any = None
    kernel_config: KernelConfig = dataclasses.field(default_factory=KernelConfig)
    cache_config: CacheConfig = dataclasses.field(default_factory=CacheConfig)
    load_config: Any = "load-config"


def _spec(attention_backend=None, draft_model_config=None):
    return types.SimpleNamespace(
        moe_backend=None,
        attention_backend=attention_backend,
        kv_cache_dtype=None,
        draft_model_config=draft_model_config
        or types.SimpleNamespace(hf_config=types.SimpleNamespace(), name="draft-model-config"),
    )


# ---------------------------------------------------------------- ModelConfig


def model_config_class(code_root: Path):
    """(ModelConfig stand-in carrying the tree's real methods, real ModelArchitectureConfig)."""
    vllm_logger = types.ModuleType("vllm.logger")
    vllm_logger.init_logger = logging.getLogger
    sys.modules.setdefault("vllm", types.ModuleType("vllm"))
    sys.modules[vllm_logger.__name__] = vllm_logger
    spec = importlib.util.spec_from_file_location(
        "_probe_model_arch", code_root / "vllm" / "config" / "model_arch.py"
    )
    arch_module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = arch_module  # pydantic resolves annotations through it
    spec.loader.exec_module(arch_module)

    _, module = _source(code_root / "vllm" / "config" / "model.py")
    methods = _methods(_class(module, "ModelConfig"), {"is_mm_prefix_lm", "without_mm_prefix_lm"})
    ns: dict[str, Any] = {"cached_property": cached_property, "copy": __import__("copy"),
                          "replace": dataclasses.replace}
    exec(_class_source("ModelConfig", "", methods, "    model: str = 'target'\n"), ns)
    model_config = pydantic_dataclass(config=ConfigDict(arbitrary_types_allowed=True, extra="forbid"))(
        ns["ModelConfig"]
    )
    return model_config, arch_module.ModelArchitectureConfig, [m.name for m in methods]


def gemma4_target(model_config_cls, arch_cls):
    arch = arch_cls(
        architectures=["Gemma4ForConditionalGeneration"], model_type="gemma4",
        text_model_type="gemma4_text", hidden_size=2816, total_num_hidden_layers=30,
        total_num_attention_heads=16, head_size=256, vocab_size=262144, total_num_kv_heads=8,
        num_experts=128, num_experts_per_token=8, quantization_config=None, is_deepseek_mla=False,
        is_mm_prefix_lm=True, rswa_window=None,
        derived_max_model_len_and_key=(131072.0, "max_position_embeddings"),
    )
    target = model_config_cls()
    target.model_arch_config = arch
    # GPUModelRunner.__init__ reads the flag first, which caches it.
    assert target.is_mm_prefix_lm is True
    return target, arch


def _model_config_facts(draft_model_config, target, arch) -> dict:
    return {
        "draft_is_mm_prefix_lm": draft_model_config.is_mm_prefix_lm,
        "draft_is_target_object": draft_model_config is target,
        "target_is_mm_prefix_lm": target.is_mm_prefix_lm,
        "target_arch_is_mm_prefix_lm": target.model_arch_config.is_mm_prefix_lm,
        "target_arch_object_kept": target.model_arch_config is arch,
    }


# ---------------------------------------------------------------- proposers (V1)


def proposer_class(code_root: Path, rel: str, name: str):
    """The subclass ``name`` built from its real ``_create_draft_vllm_config`` over the real base one."""
    _, base_module = _source(code_root / "vllm" / "v1" / "spec_decode" / "llm_base_proposer.py")
    base_methods = _methods(_class(base_module, "SpecDecodeBaseProposer"), {"_create_draft_vllm_config"})
    _, module = _source(code_root / rel)
    methods = _methods(_class(module, name), {"_create_draft_vllm_config"})
    assert base_methods and methods, (rel, name)
    ns: dict[str, Any] = {"replace": dataclasses.replace, "override": _identity, "VllmConfig": VllmConfig}
    exec(_class_source("SpecDecodeBaseProposer", "", base_methods), ns)
    exec(_class_source(name, "SpecDecodeBaseProposer", methods), ns)
    return ns[name]


def v1_dflash(code_root: Path, model_config_cls, arch_cls) -> dict:
    cls = proposer_class(code_root, "vllm/v1/spec_decode/dflash.py", "DFlashProposer")
    target, arch = gemma4_target(model_config_cls, arch_cls)
    proposer = object.__new__(cls)
    proposer.speculative_config = _spec(attention_backend="FLASH_ATTN")
    proposer.vllm_config = VllmConfig(target, AttentionConfig(backend="TRITON_ATTN"))
    proposer.dflash_causal = False
    draft = proposer._create_draft_vllm_config()
    facts = _model_config_facts(draft.model_config, target, arch)
    facts.update(
        draft_backend=draft.attention_config.backend,
        draft_use_non_causal=draft.attention_config.use_non_causal,
        target_backend=proposer.vllm_config.attention_config.backend,
        target_vllm_model_config_kept=proposer.vllm_config.model_config is target,
    )
    return facts


# The names the MTP rows use, as members of an enum like vLLM's (the patched code reads ``.name``).
AttentionBackendEnum = enum.Enum("AttentionBackendEnum", "TRITON_ATTN FLASH_ATTN FLEX_ATTENTION")
MTP_CASES = [
    ("FLASH_ATTN", "TRITON_ATTN"), ("FLEX_ATTENTION", "TRITON_ATTN"), ("TRITON_ATTN", "TRITON_ATTN"),
    (None, "TRITON_ATTN"), ("FLASH_ATTN", None), (None, None),
]


def _backend(name):
    return AttentionBackendEnum[name] if name is not None else None


def _mtp_namespace(code_root: Path) -> dict[str, Any]:
    """Names both runners' ``_create_draft_vllm_config`` use, with the V1 module's
    ``gemma4_mtp_attention_backend`` when the tree has it (the V2 speculator imports it)."""
    ns: dict[str, Any] = {
        "replace": dataclasses.replace, "override": _identity, "VllmConfig": VllmConfig,
        "AttentionBackendEnum": AttentionBackendEnum,
    }
    _, module = _source(code_root / "vllm" / "v1" / "spec_decode" / "gemma4.py")
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name == "gemma4_mtp_attention_backend":
            exec(ast.unparse(node), ns)
    return ns


def _mtp_outcome(make_draft_config) -> dict:
    """The draft layers' backend name, or the error raised instead."""
    try:
        draft = make_draft_config()
    except ValueError as exc:
        return {"error": str(exc)}
    backend = draft.attention_config.backend
    return {"backend": backend.name if backend is not None else None, "draft": draft}


def v1_gemma4_mtp(code_root: Path, spec_backend, target_backend) -> dict:
    _, base_module = _source(code_root / "vllm" / "v1" / "spec_decode" / "llm_base_proposer.py")
    base = _methods(_class(base_module, "SpecDecodeBaseProposer"), {"_create_draft_vllm_config"})
    _, module = _source(code_root / "vllm" / "v1" / "spec_decode" / "gemma4.py")
    methods = _methods(_class(module, "Gemma4Proposer"), {"_create_draft_vllm_config"})
    ns = _mtp_namespace(code_root)
    exec(_class_source("SpecDecodeBaseProposer", "", base), ns)
    exec(_class_source("Gemma4Proposer", "SpecDecodeBaseProposer", methods), ns)
    proposer = object.__new__(ns["Gemma4Proposer"])
    proposer.speculative_config = _spec(attention_backend=_backend(spec_backend))
    proposer.vllm_config = VllmConfig("target-model-config", AttentionConfig(backend=_backend(target_backend)))
    outcome = _mtp_outcome(proposer._create_draft_vllm_config)
    outcome.pop("draft", None)
    return outcome


# ---------------------------------------------------------------- V2 runner


def v2_gemma4_mtp(code_root: Path, spec_backend, target_backend) -> dict:
    rel = code_root / "vllm" / "v1" / "worker" / "gpu" / "spec_decode" / "gemma4" / "speculator.py"
    _, module = _source(rel)
    methods = _methods(_class(module, "Gemma4Speculator"), {"_create_draft_vllm_config"})
    ns = _mtp_namespace(code_root)
    exec(_class_source("Gemma4Speculator", "", methods), ns)
    speculator = object.__new__(ns["Gemma4Speculator"])
    speculator.speculative_config = _spec(attention_backend=_backend(spec_backend))
    speculator.vllm_config = VllmConfig("target-model-config", AttentionConfig(backend=_backend(target_backend)))
    outcome = _mtp_outcome(speculator._create_draft_vllm_config)
    if "draft" in outcome:
        draft = outcome.pop("draft")
        outcome["model_config_is_draft"] = draft.model_config is speculator.speculative_config.draft_model_config
    return outcome


def v2_dflash(code_root: Path, model_config_cls, arch_cls) -> dict:
    rel = code_root / "vllm" / "v1" / "worker" / "gpu" / "spec_decode" / "dflash" / "utils.py"
    _, module = _source(rel)
    fn = _function(module, "load_dflash_model")
    seen: dict[str, Any] = {}

    def get_model(*, vllm_config, model_config, **_):
        seen["vllm_config"], seen["model_config"] = vllm_config, model_config
        return types.SimpleNamespace(model="draft-inner", config=types.SimpleNamespace(), lm_head=None)

    # Lazily imported by load_dflash_model; the real modules need torch.
    backends = types.ModuleType("vllm.compilation.backends")
    backends.set_model_tag = lambda tag: contextlib.nullcontext()
    qwen3_dflash = types.ModuleType("vllm.model_executor.models.qwen3_dflash")
    qwen3_dflash.dflash_has_any_non_causal = lambda hf_config: True
    sys.modules[backends.__name__] = backends
    sys.modules[qwen3_dflash.__name__] = qwen3_dflash

    ns: dict[str, Any] = {
        "replace": dataclasses.replace, "VllmConfig": VllmConfig,
        "nn": types.SimpleNamespace(Module=object), "get_model": get_model,
        "get_draft_load_config": lambda cfg: cfg.load_config,
        "get_pp_safe_draft_load_config": _identity,
        "maybe_share_target_embed": lambda *a: None, "get_target_lm_head": lambda *a: None,
        "_should_share": lambda *a: False,
        # 0.26.0-0.29.0 share the embedding inline (torch-bound); a two-rank
        # pipeline group is the released code's own reason to skip it.
        "get_pp_group": lambda: types.SimpleNamespace(world_size=2),
    }
    exec(ast.unparse(fn), ns)

    target, arch = gemma4_target(model_config_cls, arch_cls)
    spec = _spec(attention_backend="FLASH_ATTN")
    vllm_config = VllmConfig(target, AttentionConfig(backend="TRITON_ATTN"), speculative_config=spec)
    ns["load_dflash_model"](types.SimpleNamespace(model="target-inner"), vllm_config)
    draft = seen["vllm_config"]
    facts = _model_config_facts(draft.model_config, target, arch)
    facts.update(
        draft_backend=draft.attention_config.backend,
        draft_use_non_causal=draft.attention_config.use_non_causal,
        get_model_got_drafter_model_config=seen["model_config"] is spec.draft_model_config,
        target_vllm_model_config_kept=vllm_config.model_config is target,
    )
    return facts


def main(code_root: str, mtp: bool = True) -> None:
    """``mtp=False`` (``--no-mtp``): trees without the Gemma4 MTP patch (0.26-0.29 series)."""
    code = Path(code_root)
    model_config_cls, arch_cls, methods = model_config_class(code)
    out: dict[str, Any] = {"model_config_methods": methods}
    if "without_mm_prefix_lm" in methods:
        target, arch = gemma4_target(model_config_cls, arch_cls)
        out["without_mm_prefix_lm"] = _model_config_facts(target.without_mm_prefix_lm(), target, arch)
        text_only = model_config_cls()
        text_only.model_arch_config = dataclasses.replace(arch, is_mm_prefix_lm=False)
        out["without_mm_prefix_lm_on_text_only_is_self"] = text_only.without_mm_prefix_lm() is text_only
    out["v1_dflash"] = v1_dflash(code, model_config_cls, arch_cls)
    out["v2_dflash"] = v2_dflash(code, model_config_cls, arch_cls)
    if mtp:
        out["v1_gemma4_mtp"] = [[s, t, v1_gemma4_mtp(code, s, t)] for s, t in MTP_CASES]
        out["v2_gemma4_mtp"] = [[s, t, v2_gemma4_mtp(code, s, t)] for s, t in MTP_CASES]
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], mtp="--no-mtp" not in sys.argv[2:])
