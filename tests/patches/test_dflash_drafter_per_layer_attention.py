"""Regression test for dflash-drafter-per-layer-attention (0.21.0/0018).

Runs the real released 0.21.0 code with that patch alone
(``tests/patches/vllm_source.py``: torch layers, kernels and vLLM's
dataclasses are stubs):

* ``_resolve_layer_attention`` and ``DFlashQwen3DecoderLayer.__init__`` of
  ``qwen3_dflash.py`` on the public Gemma 4 drafter's layer mix (4
  ``sliding_attention`` + 1 ``full_attention``, window 2048): each layer's
  (window, causal) is z-lab's rule (dflash 0.1.0, ``Qwen3DFlashAttention``:
  sliding layers causal and windowed, full layers non-causal), the window
  reaches the backend, and the real ``Attention.get_kv_cache_spec`` still
  gives every draft layer a full-attention spec (one KV cache group, as the
  V1 proposer requires);
* ``DFlashProposer.build_per_group_and_layer_attn_metadata`` of
  ``v1/spec_decode/dflash.py`` (with the real base class of
  ``llm_base_proposer.py``): the causal layers get metadata built with
  ``causal=True`` by their group's builder, the full layer keeps the
  non-causal metadata. The group builder and the CommonAttentionMetadata are
  stand-ins (they hold GPU tensors), recording what they are given.

Without the patch the released file has no ``_resolve_layer_attention`` and
builds every draft layer non-causal and unwindowed.
"""

from __future__ import annotations

import dataclasses
import types

import pytest

from tests.patches.vllm_source import load

PATCH_ID = "dflash-drafter-per-layer-attention"
VERSION = "0.21.0"
MODEL = "vllm/model_executor/models/qwen3_dflash.py"
WINDOW = 2048
PUBLIC_MIX = ["sliding_attention"] * 4 + ["full_attention"]

pytestmark = pytest.mark.network  # first run downloads the release from PyPI


def _drafter_config(layer_types, **dflash_config):
    return types.SimpleNamespace(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=4096, rms_norm_eps=1e-6, intermediate_size=128, hidden_act="silu",
        rope_parameters={"rope_theta": 1e6}, num_hidden_layers=len(layer_types or [0] * 5),
        layer_types=layer_types, sliding_window=WINDOW, dflash_config=dflash_config,
    )


class RecordingAttention:
    """Stands in for vLLM's Attention (a torch layer): records its arguments and
    keeps the window as the real constructor does (``self.sliding_window``)."""

    def __init__(self, *args, **kwargs):
        self.kwargs = kwargs
        self.layer_name = kwargs["prefix"]
        self.sliding_window = kwargs.get("per_layer_sliding_window")
        self.attn_type = "decoder"
        self.kv_cache_dtype = "auto"
        self.num_kv_heads = kwargs.get("num_kv_heads")
        self.head_size = self.head_size_v = args[1]
        self.kv_cache_torch_dtype = "bfloat16"


@pytest.fixture(scope="module")
def tree(vllm_tree):
    return vllm_tree(VERSION, PATCH_ID)


@pytest.fixture(scope="module")
def model_ns(tree):
    return load(tree, MODEL, overrides={
        "Attention": RecordingAttention, "get_tensor_model_parallel_world_size": lambda: 1,
    })


def _layers(model_ns, config):
    layer_cls = model_ns["DFlashQwen3DecoderLayer"]
    return [
        layer_cls(None, config=config, prefix=f"model.layers.{30 + i}", layer_idx=i)
        for i in range(config.num_hidden_layers)
    ]


def test_each_layer_resolves_to_z_labs_rule(model_ns):
    config = _drafter_config(PUBLIC_MIX)
    resolved = [model_ns["_resolve_layer_attention"](config, i) for i in range(5)]
    # z-lab: a sliding_attention layer is causal with sliding_window; a full layer is neither.
    assert resolved == [(WINDOW, True)] * 4 + [(None, False)]


def test_all_full_drafters_stay_non_causal_and_unwindowed(model_ns):
    for config in (_drafter_config(["full_attention"] * 3), _drafter_config(None)):
        resolved = {model_ns["_resolve_layer_attention"](config, i) for i in range(3)}
        assert resolved == {(None, False)}


def test_dflash_config_overrides(model_ns):
    # use_swa without layer_types: every layer windowed, non-causal (0.26.0's table).
    use_swa = _drafter_config(None, use_swa=True, swa_window_size=512)
    assert model_ns["_resolve_layer_attention"](use_swa, 0) == (512, False)
    forced = _drafter_config(PUBLIC_MIX, causal=False)
    assert model_ns["_resolve_layer_attention"](forced, 0) == (WINDOW, False)
    no_window = _drafter_config(PUBLIC_MIX)
    no_window.sliding_window = None
    with pytest.raises(ValueError, match="window size"):
        model_ns["_resolve_layer_attention"](no_window, 0)


def test_sliding_layers_pass_the_window_to_the_backend_but_keep_a_full_kv_spec(stock_tree, model_ns):
    layers = _layers(model_ns, _drafter_config(PUBLIC_MIX))
    assert [layer.self_attn.attn.kwargs.get("per_layer_sliding_window") for layer in layers] == [WINDOW] * 4 + [None]
    assert [layer.self_attn.causal for layer in layers] == [True] * 4 + [False]

    # The patch leaves attention.py as released.
    attention_ns = load(stock_tree(VERSION), "vllm/model_executor/layers/attention/attention.py", overrides={
        "FullAttentionSpec": lambda **kw: "full", "SlidingWindowSpec": lambda **kw: "sliding",
        "AttentionType": types.SimpleNamespace(DECODER="decoder"),
    })
    vllm_config = types.SimpleNamespace(cache_config=types.SimpleNamespace(block_size=16))
    specs = {attention_ns["Attention"].get_kv_cache_spec(layer.self_attn.attn, vllm_config) for layer in layers}
    assert specs == {"full"}


@dataclasses.dataclass
class CommonAttentionMetadata:
    """Stands in for vLLM's dataclass of GPU tensors: only the field this patch reads."""

    causal: bool = False


class RecordingBuilder:
    def __init__(self):
        self.built = []

    def build_for_drafting(self, common_attn_metadata, draft_index):
        metadata = types.SimpleNamespace(causal=common_attn_metadata.causal)
        self.built.append(metadata)
        return metadata


def _proposer(tree, stock, model_ns, config):
    # The patch leaves the base proposer as released.
    base = load(stock, "vllm/v1/spec_decode/llm_base_proposer.py")["SpecDecodeBaseProposer"]
    proposer_cls = load(tree, "vllm/v1/spec_decode/dflash.py", overrides={"SpecDecodeBaseProposer": base})[
        "DFlashProposer"
    ]
    layers = _layers(model_ns, config)
    drafter = types.SimpleNamespace(model=types.SimpleNamespace(layers=layers))
    names = model_ns["DFlashQwen3ForCausalLM"].get_draft_attn_causal_layer_names(drafter)
    builder = RecordingBuilder()
    proposer = object.__new__(proposer_cls)
    proposer._causal_layer_names = None
    proposer.model = types.SimpleNamespace(get_draft_attn_causal_layer_names=lambda: names)
    proposer.draft_attn_groups = [types.SimpleNamespace(
        layer_names=[layer.self_attn.attn.layer_name for layer in layers], get_metadata_builder=lambda: builder,
    )]
    return proposer, builder, layers


def test_causal_layers_get_causal_metadata_from_their_groups_builder(tree, stock_tree, model_ns):
    proposer, builder, layers = _proposer(tree, stock_tree(VERSION), model_ns, _drafter_config(PUBLIC_MIX))
    _, per_layer = proposer.build_per_group_and_layer_attn_metadata(CommonAttentionMetadata())
    causal = [per_layer[layer.self_attn.attn.layer_name].causal for layer in layers]
    assert causal == [True] * 4 + [False]
    assert [m.causal for m in builder.built] == [False, True]


def test_all_full_drafter_builds_one_non_causal_metadata(tree, stock_tree, model_ns):
    proposer, builder, layers = _proposer(tree, stock_tree(VERSION), model_ns, _drafter_config(["full_attention"] * 3))
    _, per_layer = proposer.build_per_group_and_layer_attn_metadata(CommonAttentionMetadata())
    assert {m.causal for m in per_layer.values()} == {False}
    assert len(builder.built) == 1
