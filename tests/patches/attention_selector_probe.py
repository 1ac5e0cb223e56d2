"""The attention backend vLLM 0.21.0's own selector gives each Gemma 4 layer, from a tree's source.

Usage: ``python attention_selector_probe.py CODE_ROOT``; prints one JSON object
(the test decides what is right). What runs, cut out of the tree with ``ast``:

* ``Gemma4Config.verify_and_update_config`` (and the patch's helper) for a
  text-only Gemma 4 (``--language-model-only``), as
  ``gemma4_per_layer_probe.py`` runs it: it decides the attention config's
  backend and the model's mm-prefix flag;
* ``_large_head_attn_backend`` where the tree has it and the ``attn_backend=``
  expression of ``Gemma4Attention.__init__``'s ``Attention(...)`` call,
  evaluated for the layer (``self.head_dim``);
* what ``Attention.__init__`` does with it (``vllm/model_executor/layers/
  attention/attention.py``: the selector only when it is None), then
  ``get_attn_backend`` / ``_cached_get_attn_backend``
  (``vllm/v1/attention/selector.py``) and ``CudaPlatformBase.get_attn_backend_cls``
  / ``get_valid_backends`` / ``_get_backend_priorities``
  (``vllm/platforms/cuda.py``);
* the backends' class-level methods and attributes (``supports_*``,
  ``validate_configuration``, supported dtypes ...) of ``AttentionBackend``
  (``vllm/v1/attention/backend.py``), FLASH_ATTN, TRITON_ATTN and
  FLEX_ATTENTION, with the real ``AttentionType``, ``MultipleOf`` and
  ``DeviceCapability``.

The FlashAttention version is the release's own ``get_flash_attn_version``
and ``is_fa_version_supported``, run under the real ``set_current_vllm_config``
(``gemma4_per_layer_probe.install_flash_attn_version``), so a forced
``attention_config.flash_attn_version`` counts, as in model initialisation.

Stand-ins (no GPU, no vLLM import here): the GPU, an RTX 5090 (capability
12.0, so FlashAttention 2) unless ``gemma4_text_only_by_gpu`` names an H100
(capability 9.0: FA3, or FA2 where forced), the kernels the wheel ships
taken as importable, no sinks, FLASHINFER and TURBOQUANT not importable
(ImportError, as the selector handles it; FLASH_ATTN precedes FLASHINFER in
the priority list anyway), the vLLM config (bf16, KV cache dtype auto, no
block size set), the logger. A subprocess, because the stand-ins register
``vllm`` names.
"""

from __future__ import annotations

import ast
import enum
import json
import logging
import sys
import types
import typing
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.integration.series_0_21_0_probe import (  # noqa: E402
    _class,
    _exec,
    _function,
    _install_stand_ins,
    _method,
    _module,
    _target,
    model_config_classes,
)
from tests.patches.gemma4_per_layer_probe import (  # noqa: E402
    GPU,
    GPUS,
    _attention_call_backend,
    _install_registry,
    _mm_config,
    gemma4_config_class,
    install_flash_attn_version,
    multimodal_config_class,
    on_gpu,
)

BACKENDS = {
    "FLASH_ATTN": ("vllm/v1/attention/backends/flash_attn.py", "FlashAttentionBackend"),
    "TRITON_ATTN": ("vllm/v1/attention/backends/triton_attn.py", "TritonAttentionBackend"),
    "FLEX_ATTENTION": ("vllm/v1/attention/backends/flex_attention.py", "FlexAttentionBackend"),
}


class _Logger(logging.Logger):
    def info_once(self, *args, **kwargs) -> None:
        pass

    debug_once = warning_once = info_once


def _class_level(cls: ast.ClassDef, base: str) -> str:
    """The class with only what the selector reads: attributes and class/static methods."""
    keep = [n for n in cls.body
            if isinstance(n, (ast.Assign, ast.AnnAssign))
            or (isinstance(n, ast.FunctionDef)
                and any(ast.unparse(d) in ("classmethod", "staticmethod") for d in n.decorator_list))]
    node = ast.ClassDef(name=cls.name, bases=[ast.Name(base)] if base else [], keywords=[], body=keep or [ast.Pass()],
                        decorator_list=[], type_params=[])
    return ast.unparse(ast.fix_missing_locations(node))


def backend_classes(root: Path) -> dict[str, type]:
    fa_utils = sys.modules["vllm.v1.attention.backends.fa_utils"]  # install_flash_attn_version's
    backend_py = _module(root / "vllm/v1/attention/backend.py")
    interface = _module(root / "vllm/platforms/interface.py")
    ns: dict = {"torch": torch, "ClassVar": typing.ClassVar, "Any": typing.Any, "NamedTuple": typing.NamedTuple,
                "Enum": enum.Enum, "StrEnum": enum.StrEnum, "dataclass": __import__("dataclasses").dataclass,
                "abstractmethod": __import__("abc").abstractmethod,
                "get_flash_attn_version": fa_utils.get_flash_attn_version,
                "is_fa_version_supported": fa_utils.is_fa_version_supported,
                "is_flash_attn_varlen_func_available": lambda: True, "flash_attn_supports_sinks": lambda: False,
                "flash_attn_supports_fp8": lambda: False, "is_quantized_kv_cache": lambda d: str(d).startswith("fp8"),
                "current_platform": types.SimpleNamespace(is_xpu=lambda: False, is_cuda=lambda: True,
                                                          is_rocm=lambda: False),
                "get_current_vllm_config": lambda: types.SimpleNamespace(model_config=None, cache_config=None)}
    _exec(ast.unparse(_class(interface, "DeviceCapability")), ns)
    for name in ("AttentionType", "MultipleOf"):
        _exec(ast.unparse(_class(backend_py, name)), ns)
    _exec(_class_level(_class(backend_py, "AttentionBackend"), ""), ns)
    out = {}
    for label, (rel, name) in BACKENDS.items():
        _exec(_class_level(_class(_module(root / rel), name), "AttentionBackend"), ns)
        out[label] = ns[name]
    return out, ns


def selector(root: Path, classes: dict[str, type], base_ns: dict):
    """``choose(backend, head_size, use_mm_prefix)``: the class the real selector returns."""

    class AttentionBackendEnum(enum.Enum):
        FLASH_ATTN = "FLASH_ATTN"
        FLASHINFER = "FLASHINFER"
        TRITON_ATTN = "TRITON_ATTN"
        FLEX_ATTENTION = "FLEX_ATTENTION"
        TURBOQUANT = "TURBOQUANT"

        def get_class(self):
            if self.value not in classes:
                raise ImportError(self.value)
            return classes[self.value]

        def get_path(self):
            return self.value

    cuda = _module(root / "vllm/platforms/cuda.py")
    sel = _module(root / "vllm/v1/attention/selector.py")
    ns: dict = {**base_ns, "AttentionBackendEnum": AttentionBackendEnum, "logger": _Logger("selector"),
                "is_quantized_kv_cache": base_ns["is_quantized_kv_cache"], "cast": lambda t, v: v,
                "CacheDType": str, "get_args": lambda t: ("auto", "bfloat16", "float16", "fp8"),
                "resolve_obj_by_qualname": lambda name: classes[name], "cache": lambda fn: fn,
                "envs": types.SimpleNamespace(VLLM_BATCH_INVARIANT=False)}
    _exec(ast.unparse(_function(cuda, "_get_backend_priorities")), ns)
    platform = _class(cuda, "CudaPlatformBase")
    methods = [_method(platform, "get_valid_backends"), _method(platform, "get_attn_backend_cls")]
    for m in methods:
        m.decorator_list = [d for d in m.decorator_list if ast.unparse(d) != "classmethod"]
        m.decorator_list.insert(0, ast.Name("classmethod"))
    body = "\n".join("    " + line for m in methods for line in ast.unparse(m).splitlines())
    # On the platform stand-in of install_flash_attn_version: the real capability tests.
    ns["CudaStandIn"] = sys.modules["vllm.platforms"].current_platform
    _exec("class Platform(CudaStandIn):\n    device_name = 'cuda'\n" + body +
          # DeviceCapability of this namespace: the backends compare with it (isinstance).
          "\n    @classmethod\n    def get_device_capability(cls, device_id=0):\n"
          "        return DeviceCapability(*GPU['capability'])\n"
          "    is_cuda = classmethod(lambda cls: True)\n    is_xpu = classmethod(lambda cls: False)\n", ns)
    for name in ("AttentionSelectorConfig",):
        _exec(ast.unparse(_class(sel, name)), ns)
    ns["current_platform"] = ns["Platform"]
    vllm_platforms = types.ModuleType("vllm.platforms")
    vllm_platforms.current_platform = ns["Platform"]
    sys.modules["vllm.platforms"] = vllm_platforms
    ns["GPU"] = GPU
    config = types.SimpleNamespace(cache_config=None, attention_config=types.SimpleNamespace(
        backend=None, use_non_causal=False, flash_attn_version=None))
    # The real set_current_vllm_config / get_current_vllm_config (install_flash_attn_version):
    # the selector runs under the model's config, as in model initialisation.
    vllm_config_mod = sys.modules["vllm.config"]
    for fn in ("get_attn_backend", "_cached_get_attn_backend"):
        node = _function(sel, fn)
        node.decorator_list = []
        _exec(ast.unparse(node), ns)

    def choose(backend: str | None, head_size: int, use_mm_prefix: bool, flash_attn_version=None) -> str:
        config.attention_config.backend = None if backend is None else AttentionBackendEnum[backend]
        config.attention_config.flash_attn_version = flash_attn_version
        try:
            with vllm_config_mod.set_current_vllm_config(config):
                return ns["get_attn_backend"](head_size, torch.bfloat16, "auto",
                                              use_mm_prefix=use_mm_prefix).get_name()
        except ValueError as exc:
            return f"error: {exc}"

    return choose


def layer_backends(root: Path, choose, gpu: str = "rtx5090") -> dict:
    """Per Gemma 4 layer kind of a text-only (--language-model-only) target on ``gpu``
    (``GPUS``): the backend class the tree ends up with, from its Gemma4Config and
    Gemma4Attention through the selector."""
    model_config_cls, arch_cls, _ = model_config_classes(root)
    gemma4 = gemma4_config_class(root)
    target, _ = _target(model_config_cls, arch_cls, mm_prefix=True)
    target.multimodal_config = _mm_config(multimodal_config_class(root), {}, language_model_only=True)
    target.hf_config = types.SimpleNamespace(audio_config=None)
    target.hf_text_config = types.SimpleNamespace(head_dim=256, global_head_dim=512,
                                                  use_bidirectional_attention="vision")
    attention = types.SimpleNamespace(backend=None)
    on_gpu(gpu, attention)
    gemma4.verify_and_update_config(types.SimpleNamespace(model_config=target, attention_config=attention))
    configured = None if attention.backend is None else attention.backend.name
    gemma4_py = _module(root / "vllm/model_executor/models/gemma4.py")
    expression = _attention_call_backend(gemma4_py)
    helper = _function(gemma4_py, "_large_head_attn_backend")
    ns: dict = {"get_current_vllm_config": lambda: types.SimpleNamespace(
        attention_config=types.SimpleNamespace(backend=attention.backend))}
    if helper is not None:
        _exec(ast.unparse(helper), ns)
    out = {"configured_backend": configured, "is_mm_prefix_lm": target.is_mm_prefix_lm}
    for kind, head_dim in (("sliding", 256), ("full", 512)):
        given = None if expression is None else eval(expression, ns, {"self": types.SimpleNamespace(head_dim=head_dim)})
        # Attention.__init__: the selector only when no backend class is given.
        out[kind] = given.name if given is not None else choose(configured, head_dim, target.is_mm_prefix_lm,
                                                                 attention.flash_attn_version)
    on_gpu("rtx5090", attention)
    return out


def main(code_root: str) -> None:
    root = Path(code_root)
    _install_stand_ins(root)
    _install_registry()
    install_flash_attn_version(root)
    classes, ns = backend_classes(root)
    choose = selector(root, classes, ns)
    print(json.dumps({
        "selector": {f"{b}/{h}/{'mm' if m else 'text'}": choose(b, h, m)
                     for b in (None, "TRITON_ATTN", "FLASH_ATTN") for h in (256, 512) for m in (False, True)},
        "gemma4_text_only": layer_backends(root, choose),
        "gemma4_text_only_by_gpu": {gpu: layer_backends(root, choose, gpu) for gpu in GPUS},
    }))


if __name__ == "__main__":
    main(sys.argv[1])
