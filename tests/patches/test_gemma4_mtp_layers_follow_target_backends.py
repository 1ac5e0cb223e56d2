"""Regression test for gemma4-mtp-layers-follow-target-backends (0.21.0/0011).

Runs the tree's real ``Gemma4MTPAttention.__init__``
(``vllm/model_executor/models/gemma4_mtp.py``) and the real
``Gemma4Proposer.load_model`` / ``_setup_gemma4_kv_sharing`` (and the
patch's helpers; ``vllm/v1/spec_decode/gemma4.py``), both loaded from source
by ``tests/patches/vllm_source.py`` with the real ``extract_layer_index``.
Stand-ins, since vLLM and its CUDA torch cannot be imported here: the
``Attention`` layer (records the ``attn_backend`` it is built with, which is
what decides the backend: ``Attention.__init__`` calls the selector only when
it is None), the base proposer's ``load_model`` (builds the draft layers as
``get_model`` would: one ``Gemma4MTPAttention`` per draft layer type), the
target's layers (a backend class each) and the configs.

The target is a gemma-4-26B-A4B served text only under
gemma4-text-only-per-layer-attention-backend: sliding layers FLASH_ATTN, full
layers TRITON_ATTN. A draft layer reads its target layer's KV cache view as
that layer's backend laid it out (released 0.21.0
``gpu_model_runner.py`` ``initialize_kv_cache_tensors``:
``kv_caches[layer_name] = kv_caches[target_layer_name]``), so it must be
built on that backend.
"""

from __future__ import annotations

import ast
import enum
import sys
import types
from pathlib import Path

import pytest

from tests.integration.series_0_21_0_probe import _exec, _function, _module
from tests.patches.vllm_source import load

PATCH_ID = "gemma4-mtp-layers-follow-target-backends"
VERSION = "0.21.0"
MTP_PY = "vllm/model_executor/models/gemma4_mtp.py"
PROPOSER_PY = "vllm/v1/spec_decode/gemma4.py"
TARGET_TYPES = (["sliding_attention"] * 5 + ["full_attention"]) * 5  # 26B-A4B: 30 layers
DRAFT_TYPES = ["sliding_attention"] * 3 + ["full_attention"]
TARGET_PREFIX = "language_model.model.layers"

pytestmark = pytest.mark.network  # first run downloads the release from PyPI


def _backend(name: str) -> type:
    return type(f"{name}Backend", (), {"get_name": staticmethod(lambda: name)})


FLASH_ATTN, TRITON_ATTN = _backend("FLASH_ATTN"), _backend("TRITON_ATTN")
AttentionBackendEnum = enum.Enum("AttentionBackendEnum", "FLASH_ATTN TRITON_ATTN FLEX_ATTENTION")


class Attention:
    """Records how the layer is built; kv_sharing_target_layer_name is set later by the proposer."""

    def __init__(self, *args, attn_backend=None, prefix="", **kwargs):
        self.attn_backend, self.prefix = attn_backend, prefix
        self.kv_sharing_target_layer_name = None


class TargetLayer:
    def __init__(self, backend: type):
        self.backend = backend

    def get_attn_backend(self) -> type:
        return self.backend


def _extract_layer_index(tree: Path):
    ns: dict = {}
    _exec(ast.unparse(_function(_module(tree / "vllm/model_executor/models/utils.py"), "extract_layer_index")), ns)
    return ns["extract_layer_index"]


def _draft_config() -> types.SimpleNamespace:
    config = types.SimpleNamespace(
        layer_types=DRAFT_TYPES, attention_bias=False, rms_norm_eps=1e-6, sliding_window=1024,
        rope_parameters={"sliding_attention": {"rope_theta": 1e4}, "full_attention": {"rope_theta": 1e6}})
    config.get_text_config = lambda: config
    return config


def _mtp_namespace(tree: Path) -> dict:
    return load(tree, MTP_PY, overrides={
        "Attention": Attention, "extract_layer_index": _extract_layer_index(tree),
        "get_tensor_model_parallel_world_size": lambda: 1})


def _draft_layer(mtp: dict, index: int):
    head_dim = 512 if DRAFT_TYPES[index] == "full_attention" else 256
    return mtp["Gemma4MTPAttention"](
        config=_draft_config(), hidden_size=256, num_heads=4, num_kv_heads=1, head_dim=head_dim,
        max_position_embeddings=131072, prefix=f"model.layers.{index}.self_attn")


def _proposer(tree: Path, mtp: dict, monkeypatch, target_backend: dict, explicit: str | None):
    for name in ("vllm", "vllm.model_executor", "vllm.model_executor.models"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    module = types.ModuleType("vllm.model_executor.models.gemma4_mtp")
    module.__dict__.update(mtp)
    monkeypatch.setitem(sys.modules, module.__name__, module)

    class BaseProposer:
        def load_model(self, target_model):
            # get_model(vllm_config=draft config): the draft model's layers are built here.
            layers = [types.SimpleNamespace(self_attn=_draft_layer(mtp, i)) for i in range(len(DRAFT_TYPES))]
            self.model = types.SimpleNamespace(model=types.SimpleNamespace(layers=layers))

    target_layers = {f"{TARGET_PREFIX}.{i}.self_attn.attn": TargetLayer(target_backend[kind])
                     for i, kind in enumerate(TARGET_TYPES)}
    ns = load(tree, PROPOSER_PY, overrides={
        "SpecDecodeBaseProposer": BaseProposer, "override": lambda fn: fn,
        "get_layers_from_vllm_config": lambda vllm_config, layer_type, names=None: dict(target_layers)})
    proposer = object.__new__(ns["Gemma4Proposer"])
    target_text = types.SimpleNamespace(layer_types=TARGET_TYPES, num_kv_shared_layers=0)
    proposer.vllm_config = types.SimpleNamespace(model_config=types.SimpleNamespace(
        hf_config=types.SimpleNamespace(get_text_config=lambda: target_text)))
    proposer.speculative_config = types.SimpleNamespace(
        attention_backend=None if explicit is None else AttentionBackendEnum[explicit],
        draft_model_config=types.SimpleNamespace(hf_config=_draft_config()))
    return proposer, target_layers


PER_LAYER = {"sliding_attention": FLASH_ATTN, "full_attention": TRITON_ATTN}  # text-only, 0008
LOCKED = {"sliding_attention": TRITON_ATTN, "full_attention": TRITON_ATTN}  # the multimodal lock


def _loaded(tree, monkeypatch, target_backend, explicit=None) -> list[tuple[str, type | None, type]]:
    """Per draft layer: the target layer it reads, the backend it was built with, the target's."""
    mtp = _mtp_namespace(tree)
    proposer, target_layers = _proposer(tree, mtp, monkeypatch, target_backend, explicit)
    proposer.load_model(target_model=None)
    out = []
    for layer in proposer.model.model.layers:
        attn = layer.self_attn.attn
        target = attn.kv_sharing_target_layer_name
        out.append((target, attn.attn_backend, target_layers[target].backend))
    return out


def test_each_draft_layer_runs_the_backend_of_the_target_layer_it_reads(vllm_tree, monkeypatch):
    rows = _loaded(vllm_tree(VERSION, PATCH_ID), monkeypatch, PER_LAYER)
    assert [built for _, built, _ in rows] == [FLASH_ATTN] * 3 + [TRITON_ATTN]
    assert all(built is target for _, built, target in rows)


def test_released_draft_layers_leave_the_backend_to_the_selector(stock_tree, monkeypatch):
    # None: Attention.__init__ selects under the draft config, whatever the target layer runs.
    rows = _loaded(stock_tree(VERSION), monkeypatch, PER_LAYER)
    assert [built for _, built, _ in rows] == [None] * 4


def test_draft_layers_read_the_same_target_layers_as_before(vllm_tree, stock_tree, monkeypatch):
    patched = [target for target, _, _ in _loaded(vllm_tree(VERSION, PATCH_ID), monkeypatch, PER_LAYER)]
    released = [target for target, _, _ in _loaded(stock_tree(VERSION), monkeypatch, PER_LAYER)]
    assert patched == released == [f"{TARGET_PREFIX}.28.self_attn.attn"] * 3 + [f"{TARGET_PREFIX}.29.self_attn.attn"]


def test_explicit_backend_that_misses_a_target_layer_is_refused(vllm_tree, monkeypatch):
    with pytest.raises(ValueError) as error:
        _loaded(vllm_tree(VERSION, PATCH_ID), monkeypatch, PER_LAYER, explicit="FLASH_ATTN")
    message = str(error.value)
    assert "speculative_config.attention_backend=FLASH_ATTN cannot be used for a Gemma4 MTP drafter" in message
    assert "whose layers run FLASH_ATTN and TRITON_ATTN" in message
    assert "Leave attention_backend unset" in message


def test_under_the_lock_every_draft_layer_runs_triton(vllm_tree, monkeypatch):
    rows = _loaded(vllm_tree(VERSION, PATCH_ID), monkeypatch, LOCKED, explicit="TRITON_ATTN")
    assert [built for _, built, _ in rows] == [TRITON_ATTN] * 4


def test_outside_the_proposer_the_layer_selects_its_backend_as_before(vllm_tree):
    mtp = _mtp_namespace(vllm_tree(VERSION, PATCH_ID))
    assert _draft_layer(mtp, 0).attn.attn_backend is None
