"""Regression test for gemma4-dflash-embed-scale-logit-softcap (0.21.0/0005, 0.33.0/0003).

Builds the real DFlash drafter classes of the tree (``DFlashQwen3Model``,
``DFlashQwen3ForCausalLM`` and, on 0.33.0, the drafters built on them:
DFlash2, DSpark, XPress, LiLiCorr) through their own ``__init__`` with
``tests/patches/vllm_source.py``: layers, kernels and loaders are stubs,
``LogitsProcessor`` records its arguments, dtypes and ``torch.tensor`` are
real (CPU torch). Then it calls the real ``embed_input_ids`` on an embedding
table of ones and reads the soft cap the real head passes to its
``LogitsProcessor``.

Gemma 4 scales token embeddings by sqrt(hidden_size) and soft-caps its final
logits at ``final_logit_softcapping`` (30.0 in the released checkpoints); a
DFlash drafter trained on the target's tables needs both, other targets' and
other drafters' classes must be left alone.
"""

from __future__ import annotations

import math
import types

import pytest
import torch

from tests.patches.vllm_source import TORCH, Stub, load

PATCH_ID = "gemma4-dflash-embed-scale-logit-softcap"
MODELS = "vllm/model_executor/models/"
HIDDEN = 2816  # gemma-4-26B-A4B, and its DFlash drafter
SOFT_CAP = 30.0
# sqrt(2816) = 53.066; bfloat16 keeps 8 significant bits: 53.0 (steps of 0.25 in [32, 64)).
SCALE_BF16 = 53.0

pytestmark = pytest.mark.network  # first run downloads the release from PyPI


class LogitsProcessor:
    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


def _classes(tree, version: str) -> dict:
    base = load(tree, MODELS + "qwen3_dflash.py")
    namespaces = [base]
    if version == "0.33.0":
        for name in ("qwen3_dflash2", "qwen3_dspark", "qwen3_xpress", "lilicorr"):
            namespaces.append(load(tree, f"{MODELS}{name}.py", {"qwen3_dflash": base}))
    classes = {}
    for ns in namespaces:
        ns["LogitsProcessor"] = LogitsProcessor
        ns["LiLiCorrHead"] = Stub("LiLiCorrHead")  # a torch network head
        # Decoder layers are torch networks: stubs, in either place the model looks them up.
        ns["DFlashQwen3DecoderLayer"] = Stub("DFlashQwen3DecoderLayer")
        for value in list(ns.values()):
            if isinstance(value, type) and "decoder_layer_cls" in vars(value):
                value.decoder_layer_cls = Stub("decoder_layer_cls")
        classes.update({k: v for k, v in ns.items() if isinstance(v, type)})
    return classes


def _vllm_config(target_model_type: str, **dflash_extra) -> types.SimpleNamespace:
    drafter = types.SimpleNamespace(
        vocab_size=262144, hidden_size=HIDDEN, num_hidden_layers=5, rms_norm_eps=1e-6, markov_rank=8,
        dflash_config={
            "target_layer_ids": [1, 7, 13, 19, 25], "mask_token_id": 4,
            "selector_rank": 8, "selector_top_k": 4, "block_size": 16, **dflash_extra,
        },
    )
    text = types.SimpleNamespace(
        model_type=f"{target_model_type}_text", hidden_size=HIDDEN, final_logit_softcapping=SOFT_CAP
    )
    model_config = types.SimpleNamespace(
        hf_config=types.SimpleNamespace(model_type=target_model_type), hf_text_config=text,
        dtype=TORCH.bfloat16, get_num_layers=lambda parallel_config: 30,
        get_total_num_hidden_layers=lambda: 30, get_vocab_size=lambda: 262144,
    )
    speculative = types.SimpleNamespace(
        draft_model_config=types.SimpleNamespace(hf_config=drafter), num_speculative_tokens=15
    )
    return types.SimpleNamespace(
        speculative_config=speculative, model_config=model_config, parallel_config=None,
        scheduler_config=types.SimpleNamespace(max_num_seqs=4),
    )


def _embed_scale(cls, vllm_config) -> float:
    model = cls(vllm_config=vllm_config, start_layer_id=30, prefix="model")
    model.embed_tokens = lambda input_ids: torch.ones(len(input_ids), 4)
    return float(model.embed_input_ids(torch.tensor([5, 7]))[0, 0])


def _soft_cap(cls, vllm_config):
    return cls(vllm_config=vllm_config, prefix="").logits_processor.kwargs.get("soft_cap")


@pytest.fixture(scope="module", params=["0.21.0", "0.26.0", "0.27.1", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0"])
def version(request):
    return request.param


@pytest.fixture(scope="module")
def classes(vllm_tree, version):
    return _classes(vllm_tree(version, PATCH_ID), version)


@pytest.fixture(scope="module")
def stock_classes(stock_tree, version):
    return _classes(stock_tree(version), version)


# 0.21.0 registers sqrt(hidden) as a float32 buffer (cast to the model dtype with
# the model); 0.33.0 rounds it to the model dtype at once, as Gemma 4 does.
def _expected_scale(version: str) -> float:
    if version == "0.21.0":
        return float(torch.tensor(math.sqrt(HIDDEN), dtype=torch.float32))
    return SCALE_BF16


def test_gemma4_target_drafter_embeddings_get_the_gemma_scale(classes, version):
    assert _embed_scale(classes["DFlashQwen3Model"], _vllm_config("gemma4")) == _expected_scale(version)


def test_a_stated_input_embedding_scale_multiplies_the_gemma_scale(classes, version):
    # z-lab's Gemma 4 reference (dflash 0.1.0, model_mlx.py): the target's
    # embed_scale times dflash_config.input_embedding_scale. 0.25 is exact in
    # binary, so the product is exact in either order of rounding.
    config = _vllm_config("gemma4", input_embedding_scale=0.25)
    assert _embed_scale(classes["DFlashQwen3Model"], config) == _expected_scale(version) * 0.25


def test_gemma4_target_drafter_logits_get_the_soft_cap(classes):
    assert _soft_cap(classes["DFlashQwen3ForCausalLM"], _vllm_config("gemma4")) == SOFT_CAP


def test_other_targets_drafters_unchanged(classes, stock_classes):
    config = _vllm_config("qwen3")
    assert _embed_scale(classes["DFlashQwen3Model"], config) == _embed_scale(
        stock_classes["DFlashQwen3Model"], config
    ) == 1.0
    assert _soft_cap(classes["DFlashQwen3ForCausalLM"], config) is None


@pytest.fixture(scope="module")
def classes_0_33_0(vllm_tree):
    return _classes(vllm_tree("0.33.0", PATCH_ID), "0.33.0")


@pytest.fixture(scope="module")
def stock_classes_0_33_0(stock_tree):
    return _classes(stock_tree("0.33.0"), "0.33.0")


@pytest.mark.parametrize("name", ["DFlash2Qwen3Model", "Qwen3DSparkModel", "Qwen3XPressModel", "LiLiCorr"])
def test_drafters_built_on_dflash_keep_their_own_embedding_scale_unchanged(
    classes_0_33_0, stock_classes_0_33_0, name
):
    # 0.33.0 only: 0.21.0 has no drafter classes built on DFlashQwen3Model.
    config = _vllm_config("gemma4")
    # DFlash2 defines input_embedding_scale (1.0 when its config has none), the others none.
    assert _embed_scale(classes_0_33_0[name], config) == _embed_scale(stock_classes_0_33_0[name], config) == 1.0


@pytest.mark.parametrize("name", ["DFlash2Qwen3ForCausalLM", "LiLiCorrForCausalLM"])
def test_drafters_built_on_dflash_keep_their_logits_uncapped_unchanged(classes_0_33_0, name):
    assert _soft_cap(classes_0_33_0[name], _vllm_config("gemma4")) is None
