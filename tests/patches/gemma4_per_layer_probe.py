"""Runs Gemma 4's attention backend choice from a vLLM 0.21.0 tree, without torch.

Usage: ``python gemma4_per_layer_probe.py CODE_ROOT [0.21.0|0.33.0]``; prints
one JSON object with what each scenario observed (the test decides what is
right). 0.33.0's Gemma4Config reads the per-layer head sizes from
``model_arch_config[i]`` and ``ModelConfig.supports_multimodal_inputs``, which
are given directly (stand-ins), together with FA4 / CUDA / XPU per scenario.

What runs is the real source, cut out of the tree with ``ast`` (the helpers
of ``tests/integration/series_0_21_0_probe.py``):

* ``Gemma4Config.verify_and_update_config`` and, where the tree has it,
  ``_gemma4_serves_text_only`` (``vllm/model_executor/models/config.py``);
* ``ModelConfig.is_mm_prefix_lm`` over the real ``ModelArchitectureConfig``
  (``vllm/config/model.py``, ``vllm/config/model_arch.py``);
* ``MultiModalConfig.get_limit_per_prompt`` (``vllm/config/multimodal.py``)
  on a stand-in holding the parsed limits (objects with ``count``, as vLLM
  parses ``--limit-mm-per-prompt``);
* ``_large_head_attn_backend`` and the ``Attention(...)`` call of
  ``Gemma4Attention.__init__`` (``vllm/model_executor/models/gemma4.py``);
* for each scenario, the released decision the patch must match:
  ``MultiModalRegistry.supports_multimodal_inputs``
  (``vllm/multimodal/registry.py``) over the real
  ``Gemma4ProcessingInfo.get_supported_mm_limits``
  (``vllm/model_executor/models/gemma4_mm.py``); the processing info is
  built from that method alone (its constructor needs the HF processor).

* for 0.21.0, ``get_flash_attn_version`` (``vllm/v1/attention/backends/fa_utils.py``),
  which the patch asks whether FLASH_ATTN would run as FA3: see
  ``install_flash_attn_version`` (the real ``is_fa_version_supported`` and
  ``set_current_vllm_config``; the GPU per scenario, ``GPUS``: RTX 5090 unless
  the scenario is an H100's).

Stand-ins: the backend registry enum (members named as vLLM's, ``get_class``
returns a class named after the backend), ``current_platform`` (CUDA or not,
per scenario; for 0.21.0 a capability of the scenario's GPU, with the real
capability tests of ``Platform``), ``get_current_vllm_config``, the logger.
A subprocess, because the stand-ins register ``vllm`` names.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import enum
import functools
import json
import logging
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.integration.series_0_21_0_probe import (  # noqa: E402
    _class,
    _class_source,
    _exec,
    _function,
    _install_stand_ins,
    _method,
    _module,
    _target,
    model_config_classes,
)

CONFIG_PY = "vllm/model_executor/models/config.py"
REGISTRY_PY = "vllm/multimodal/registry.py"
GEMMA4_MM_PY = "vllm/model_executor/models/gemma4_mm.py"
GEMMA4_PY = "vllm/model_executor/models/gemma4.py"
MULTIMODAL_PY = "vllm/config/multimodal.py"


class AttentionBackendEnum(enum.Enum):
    FLASH_ATTN = "FLASH_ATTN"
    TRITON_ATTN = "TRITON_ATTN"
    FLEX_ATTENTION = "FLEX_ATTENTION"

    def get_class(self) -> type:
        return type(f"{self.value}Backend", (), {"name": self.value})


PLATFORM = {"cuda": True, "xpu": False, "fa4": False}
current_platform = types.SimpleNamespace(
    is_cuda=lambda: PLATFORM["cuda"], is_xpu=lambda: PLATFORM["xpu"],
    is_device_capability_family=lambda family: family == 90)


def _install_registry() -> None:
    mod = types.ModuleType("vllm.v1.attention.backends.registry")
    mod.AttentionBackendEnum = AttentionBackendEnum
    mod.MambaAttentionBackendEnum = enum.Enum("M", "MAMBA2")
    sys.modules[mod.__name__] = mod
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = current_platform
    sys.modules[platforms.__name__] = platforms
    fa_utils = types.ModuleType("vllm.v1.attention.backends.fa_utils")
    fa_utils.is_fa_version_supported = lambda version: version == 4 and PLATFORM["fa4"]
    sys.modules[fa_utils.__name__] = fa_utils


# The GPU the 0.21.0 scenarios run on: capability, and the flash_attn_version the
# attention config forces (None: vLLM's own default for the capability).
GPU = {"capability": (12, 0)}  # RTX 5090
GPUS = {"rtx5090": ((12, 0), None), "h100": ((9, 0), None), "h100_fa2_forced": ((9, 0), 2)}


def flash_attn_platform(code_root: Path):
    """A CUDA platform of ``GPU``'s capability, with the real capability tests of
    ``Platform`` (``vllm/platforms/interface.py``) and the real ``DeviceCapability``."""
    interface = _module(code_root / "vllm/platforms/interface.py")
    ns: dict = {"NamedTuple": __import__("typing").NamedTuple, "Any": __import__("typing").Any}
    _exec(ast.unparse(_class(interface, "DeviceCapability")), ns)
    platform = _class(interface, "Platform")
    methods = [_method(platform, n) for n in ("has_device_capability", "is_device_capability",
                                               "is_device_capability_family")]
    extra = ("    get_device_capability = classmethod(lambda cls, device_id=0: DeviceCapability(*GPU['capability']))\n"
             "    is_cuda = classmethod(lambda cls: PLATFORM['cuda'])\n"
             "    is_xpu = classmethod(lambda cls: PLATFORM['xpu'])\n"
             "    is_rocm = classmethod(lambda cls: False)\n")
    ns.update(GPU=GPU, PLATFORM=PLATFORM)
    _exec(_class_source("CudaStandIn", "", methods, extra), ns)
    return ns["CudaStandIn"], ns


def install_flash_attn_version(code_root: Path) -> None:
    """The real ``get_flash_attn_version`` (``vllm/v1/attention/backends/fa_utils.py``)
    as vLLM 0.21.0 runs it on ``GPU``: the real ``is_fa_version_supported`` and its
    helpers (``vllm/vllm_flash_attn/flash_attn_interface.py``), with the kernels the
    wheel ships (its RECORD: ``_vllm_fa2_C``, ``_vllm_fa3_C``, ``cute/interface.py``)
    taken as importable, and the real ``set_current_vllm_config`` /
    ``get_current_vllm_config_or_none`` (``vllm/config/vllm.py``), through which a
    forced ``attention_config.flash_attn_version`` is read. Stand-ins: the compilation
    counter and mode (only read with ``check_compile``), ``envs`` (no batch invariance),
    the logger."""
    platform, _ = flash_attn_platform(code_root)
    sys.modules["vllm.platforms"].current_platform = platform
    record = next(code_root.glob("vllm-*.dist-info")).joinpath("RECORD").read_text()
    interface = _module(code_root / "vllm/vllm_flash_attn/flash_attn_interface.py")
    fa = types.ModuleType("vllm.vllm_flash_attn.flash_attn_interface")
    fa.__dict__.update(
        FA2_AVAILABLE="vllm_flash_attn/_vllm_fa2_C" in record, FA2_UNAVAILABLE_REASON="not in the wheel",
        FA3_AVAILABLE="vllm_flash_attn/_vllm_fa3_C" in record, FA3_UNAVAILABLE_REASON="not in the wheel",
        FA4_AVAILABLE="vllm_flash_attn/cute/interface.py" in record, FA4_UNAVAILABLE_REASON="not in the wheel")
    for name in ("_is_fa2_supported", "_is_fa3_supported", "_is_fa4_supported", "is_fa_version_supported",
                 "fa_version_unsupported_reason"):
        _exec(ast.unparse(_function(interface, name)), fa.__dict__)
    sys.modules.setdefault("vllm.vllm_flash_attn", types.ModuleType("vllm.vllm_flash_attn"))
    sys.modules[fa.__name__] = fa

    config_py = _module(code_root / "vllm/config/vllm.py")
    config = sys.modules.setdefault("vllm.config", types.ModuleType("vllm.config"))
    sys.modules["vllm.compilation.counter"] = types.SimpleNamespace(
        compilation_counter=types.SimpleNamespace(num_models_seen=0))
    config.__dict__.update(_current_vllm_config=None, _current_prefix=None, logger=_OnceLogger("config"),
                           contextmanager=contextlib.contextmanager, lru_cache=functools.lru_cache,
                           CompilationMode=enum.Enum("CompilationMode", "NONE VLLM_COMPILE"))
    for name in ("set_current_vllm_config", "get_cached_compilation_config", "get_current_vllm_config",
                 "get_current_vllm_config_or_none"):
        _exec(ast.unparse(_function(config_py, name)), config.__dict__)

    fa_utils = sys.modules["vllm.v1.attention.backends.fa_utils"]
    fa_utils.__dict__.update(current_platform=platform, logger=_OnceLogger("fa_utils"),
                             envs=types.SimpleNamespace(VLLM_BATCH_INVARIANT=False))
    utils_py = _module(code_root / "vllm/v1/attention/backends/fa_utils.py")
    for name in ("get_flash_attn_version", "is_fa_version_supported"):
        _exec(ast.unparse(_function(utils_py, name)), fa_utils.__dict__)


def on_gpu(name: str, attention) -> None:
    """Put the scenario on GPU ``name`` (``GPUS``), forcing its FA version in ``attention``."""
    GPU["capability"], attention.flash_attn_version = GPUS[name]


def multimodal_config_class(code_root: Path) -> type:
    cls = _class(_module(code_root / MULTIMODAL_PY), "MultiModalConfig")
    ns: dict = {}
    _exec(_class_source("MultiModalConfig", "", [_method(cls, "get_limit_per_prompt")]), ns)
    return ns["MultiModalConfig"]


def gemma4_config_class(code_root: Path) -> type:
    module = _module(code_root / CONFIG_PY)
    ns: dict = {"logger": logging.getLogger("gemma4-config"), "replace": dataclasses.replace,
                "VerifyAndUpdateConfig": object}
    for name in ("_gemma4_serves_text_only", "_flash_attn_version"):  # the patch's helpers, where present
        helper = _function(module, name)
        if helper is not None:
            _exec(ast.unparse(helper), ns)
    cls = _class(module, "Gemma4Config")
    cls.bases = [ast.Name("VerifyAndUpdateConfig")]
    _exec(ast.unparse(cls), ns)
    return ns["Gemma4Config"]


def _mm_config(cls: type, limits: dict | None, language_model_only=False, embeds=False):
    obj = object.__new__(cls)
    obj.language_model_only = language_model_only
    obj.enable_mm_embeds = embeds
    obj.limit_per_prompt = {k: types.SimpleNamespace(count=v) for k, v in (limits or {}).items()}
    return obj


# name -> (multimodal config kwargs or None for no multimodal config,
#          audio tower present, head_dim, global_head_dim, explicit backend[, on CUDA])
SCENARIOS = {
    "language_model_only_not_cuda": ({"limits": {}, "language_model_only": True}, False, 256, 512, None, False),
    "multimodal": ({"limits": {}}, False, 256, 512, None),
    "image_only_off": ({"limits": {"image": 0}}, False, 256, 512, None),
    "all_limits_zero": ({"limits": {"image": 0, "video": 0}}, False, 256, 512, None),
    "language_model_only": ({"limits": {}, "language_model_only": True}, False, 256, 512, None),
    "no_multimodal_config": (None, False, 256, 512, None),
    "audio_tower_audio_open": ({"limits": {"image": 0, "video": 0}}, True, 256, 512, None),
    "audio_tower_all_zero": ({"limits": {"image": 0, "video": 0, "audio": 0}}, True, 256, 512, None),
    "all_zero_with_mm_embeds": ({"limits": {"image": 0, "video": 0}, "embeds": True}, False, 256, 512, None),
    "language_model_only_with_mm_embeds": ({"limits": {}, "language_model_only": True, "embeds": True},
                                           False, 256, 512, None),
    "text_only_user_backend": ({"limits": {}, "language_model_only": True}, False, 256, 512, "FLASH_ATTN"),
    "multimodal_user_backend": ({"limits": {}}, False, 256, 512, "FLASH_ATTN"),
    "uniform_head_dim_text_only": ({"limits": {}, "language_model_only": True}, False, 256, 256, None),
}
# Scenarios on another GPU than the RTX 5090 (``GPUS``): --language-model-only on an H100,
# where FLASH_ATTN is FA3 unless attention_config.flash_attn_version forces 2.
SCENARIO_GPUS = {"language_model_only_h100": "h100", "language_model_only_h100_fa2_forced": "h100_fa2_forced"}
for _name in SCENARIO_GPUS:
    SCENARIOS[_name] = SCENARIOS["language_model_only"]


def rederived_mm_prefix(code_root: Path, hf_text_config) -> bool:
    """The flag as ``vllm_config.with_hf_config()`` derives it again for the
    language model (init_vllm_registered_model): the released
    ``Gemma4ModelArchConfigConvertor.is_mm_prefix_lm``, run from its source."""
    path = code_root / "vllm" / "transformers_utils" / "model_arch_config_convertor.py"
    module = ast.parse(path.read_text())
    cls = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "Gemma4ModelArchConfigConvertor")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "is_mm_prefix_lm")
    ns: dict = {}
    exec(compile(ast.Module([fn], []), str(path), "exec"), ns)
    return bool(ns["is_mm_prefix_lm"](types.SimpleNamespace(hf_text_config=hf_text_config)))


class _OnceLogger(logging.Logger):
    def info_once(self, *args, **kwargs) -> None:
        pass

    warning_once = info_once


def registry_decision(code_root: Path):
    """``supports(model_config)``: the released MultiModalRegistry.supports_multimodal_inputs
    for a Gemma 4 model_config, with Gemma4ProcessingInfo's own supported modalities."""
    registry = _class(_module(code_root / REGISTRY_PY), "MultiModalRegistry")
    info = _class(_module(code_root / GEMMA4_MM_PY), "Gemma4ProcessingInfo")
    ns: dict = {"logger": _OnceLogger("registry")}
    _exec(_class_source("MultiModalRegistry", "", [_method(registry, "supports_multimodal_inputs")]), ns)
    _exec(_class_source("Gemma4ProcessingInfo", "", [_method(info, "get_supported_mm_limits")]), ns)

    def create_processing_info(model_config, tokenizer=None):
        processing = object.__new__(ns["Gemma4ProcessingInfo"])
        processing.get_hf_config = lambda: model_config.hf_config
        # BaseProcessingInfo.supported_mm_limits is get_supported_mm_limits() (cached).
        processing.supported_mm_limits = processing.get_supported_mm_limits()
        return processing

    registry_obj = object.__new__(ns["MultiModalRegistry"])
    registry_obj._create_processing_info = create_processing_info

    def supports(model_config) -> bool:
        view = types.SimpleNamespace(
            is_multimodal_model=model_config.multimodal_config is not None,
            get_multimodal_config=lambda: model_config.multimodal_config,
            hf_config=model_config.hf_config, model=model_config.model)
        return registry_obj.supports_multimodal_inputs(view)

    return supports


def verify_scenarios(code_root: Path) -> dict:
    model_config_cls, arch_cls, _ = model_config_classes(code_root)
    mm_cls = multimodal_config_class(code_root)
    gemma4 = gemma4_config_class(code_root)
    registry_supports = registry_decision(code_root)
    out = {}
    for name, (mm, audio, head_dim, global_head_dim, backend, *cuda) in SCENARIOS.items():
        PLATFORM["cuda"] = cuda[0] if cuda else True
        target, arch = _target(model_config_cls, arch_cls, mm_prefix=True)
        target.multimodal_config = None if mm is None else _mm_config(
            mm_cls, mm["limits"], mm.get("language_model_only", False), mm.get("embeds", False))
        target.hf_config = types.SimpleNamespace(audio_config={} if audio else None)
        target.hf_text_config = types.SimpleNamespace(head_dim=head_dim, global_head_dim=global_head_dim,
                                                      use_bidirectional_attention="vision")
        attention = types.SimpleNamespace(
            backend=None if backend is None else AttentionBackendEnum[backend])
        on_gpu(SCENARIO_GPUS.get(name, "rtx5090"), attention)
        vllm_config = types.SimpleNamespace(model_config=target, attention_config=attention)
        registry_multimodal = registry_supports(target)  # before verify changes anything
        gemma4.verify_and_update_config(vllm_config)
        out[name] = {
            "registry_supports_mm_inputs": registry_multimodal,
            "backend": None if attention.backend is None else attention.backend.name,
            "is_mm_prefix_lm": target.is_mm_prefix_lm,
            "rederived_is_mm_prefix_lm": rederived_mm_prefix(code_root, target.hf_text_config),
            "arch_other_fields_kept": dataclasses.replace(
                target.model_arch_config, is_mm_prefix_lm=True) == arch,
        }
        if name in SCENARIO_GPUS:  # the version FlashAttentionImpl gets there, built under this config
            with sys.modules["vllm.config"].set_current_vllm_config(vllm_config):
                out[name]["flash_attn_version"] = sys.modules[
                    "vllm.v1.attention.backends.fa_utils"].get_flash_attn_version(head_size=head_dim)
    return out


def _attention_call_backend(module: ast.Module) -> str | None:
    """The ``attn_backend=`` argument of the ``Attention(...)`` call in Gemma4Attention.__init__."""
    init = _method(_class(module, "Gemma4Attention"), "__init__")
    call = next(n for n in ast.walk(init) if isinstance(n, ast.Call)
                and isinstance(n.func, ast.Name) and n.func.id == "Attention")
    return {k.arg: ast.unparse(k.value) for k in call.keywords}.get("attn_backend")


def layer_backends(code_root: Path) -> dict:
    module = _module(code_root / GEMMA4_PY)
    out: dict = {"attention_call_attn_backend": _attention_call_backend(module)}
    helper = _function(module, "_large_head_attn_backend")
    if helper is None:
        out["helper_present"] = False
        return out
    current = types.SimpleNamespace(attention_config=types.SimpleNamespace(backend=None))
    ns: dict = {"get_current_vllm_config": lambda: current}
    _exec(ast.unparse(helper), ns)
    choose = ns["_large_head_attn_backend"]
    rows = []
    for backend in (None, AttentionBackendEnum.TRITON_ATTN, AttentionBackendEnum.FLASH_ATTN):
        current.attention_config.backend = backend
        for head_dim in (256, 512):
            chosen = choose(head_dim)
            rows.append([None if backend is None else backend.name, head_dim,
                         None if chosen is None else chosen.name])
    out.update(helper_present=True, rows=rows)
    return out


# ---------------------------------------------------------------- 0.33.0

# name -> (FA4, CUDA, XPU, multimodal inputs possible, explicit backend)
SCENARIOS_0_33_0 = {
    "text_only": (False, True, False, False, None),
    "multimodal": (False, True, False, True, None),
    "text_only_not_cuda": (False, False, False, False, None),
    "text_only_xpu": (False, False, True, False, None),
    "text_only_fa4": (True, True, False, False, None),
    "text_only_user_backend": (False, True, False, False, "FLASH_ATTN"),
}


class _ArchConfig:
    """model_arch_config indexed per layer, as 0.33.0's Gemma4Config reads it."""

    def __init__(self, head_sizes: list[int]):
        self.head_sizes = head_sizes
        self.total_num_hidden_layers = len(head_sizes)

    def __getitem__(self, i: int):
        return types.SimpleNamespace(head_size=self.head_sizes[i])


def verify_scenarios_0_33_0(code_root: Path) -> dict:
    gemma4 = gemma4_config_class(code_root)
    kinds = ["sliding_attention"] * 5 + ["full_attention"]
    out = {}
    for name, (fa4, cuda, xpu, multimodal, backend) in SCENARIOS_0_33_0.items():
        PLATFORM.update(cuda=cuda, xpu=xpu, fa4=fa4)
        model_config = types.SimpleNamespace(
            model_arch_config=_ArchConfig([512 if k == "full_attention" else 256 for k in kinds]),
            hf_text_config=types.SimpleNamespace(layer_types=kinds),
            supports_multimodal_inputs=multimodal)
        attention = types.SimpleNamespace(
            backend=None if backend is None else AttentionBackendEnum[backend], flash_attn_version=None)
        vllm_config = types.SimpleNamespace(model_config=model_config, attention_config=attention,
                                            cache_config=types.SimpleNamespace(cache_dtype="auto"))
        gemma4.verify_and_update_config(vllm_config)
        out[name] = {"backend": None if attention.backend is None else attention.backend.name,
                     "flash_attn_version": attention.flash_attn_version}
    return out


def layer_backends_0_33_0(code_root: Path) -> dict:
    module = _module(code_root / GEMMA4_PY)
    out: dict = {"attention_call_attn_backend": _attention_call_backend(module)}
    helper = _function(module, "_large_head_attn_backend")
    if helper is None:
        return out | {"helper_present": False}
    attention = types.SimpleNamespace(backend=None, backend_per_kind={})
    ns: dict = {"get_current_vllm_config": lambda: types.SimpleNamespace(attention_config=attention),
                "current_platform": current_platform}
    _exec(ast.unparse(helper), ns)
    rows = []
    for backend, per_kind, cuda, fa4 in ((None, {}, True, False), ("TRITON_ATTN", {}, True, False),
                                         (None, {"full_attention": "FLASH_ATTN"}, True, False),
                                         (None, {}, False, False), (None, {}, True, True)):
        attention.backend = None if backend is None else AttentionBackendEnum[backend]
        attention.backend_per_kind = per_kind
        PLATFORM.update(cuda=cuda, xpu=False, fa4=fa4)
        for head_dim in (256, 512):
            chosen = ns["_large_head_attn_backend"](head_dim)
            rows.append([backend, bool(per_kind), cuda, fa4, head_dim, None if chosen is None else chosen.name])
    return out | {"helper_present": True, "rows": rows}


def main(code_root: str, version: str = "0.21.0") -> None:
    code = Path(code_root)
    _install_stand_ins(code)
    _install_registry()
    if version == "0.33.0":
        print(json.dumps({"verify": verify_scenarios_0_33_0(code), "layers": layer_backends_0_33_0(code)}))
    else:
        install_flash_attn_version(code)
        print(json.dumps({"verify": verify_scenarios(code), "layers": layer_backends(code)}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
