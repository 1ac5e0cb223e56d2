"""The DFlash drafter judged by z-lab's own reference, ``dflash`` 0.1.0 (issue 50), on the CPU.

z-lab's torch ``DFlashDraftModel`` (``dflash.model``) is the oracle: the project's
reference (tests/gpu/models/dflash_reference.py) must compute what it computes, in every
semantics the reference models for a vLLM release with the series; each covered
release's own ``qwen3_dflash.py`` must give each drafter layer the attention z-lab's
gives it; and each drafter-side convention is pinned against z-lab's code. For Gemma 4
the embedding follows z-lab's Gemma 4 backend (``model_mlx.py``): the target's own
embedding scale times ``dflash_config.input_embedding_scale``.
"""

from __future__ import annotations

import math
import types
from pathlib import Path

import pytest

from tests.unit.gpu_scripts import load as _load
from tests.unit.gpu_scripts import tiny_gemma4_target

torch = pytest.importorskip("torch", reason="the drafter's pieces need torch (the test venv has the CPU build)")
# Installed by the Makefile's test setup (pip install --no-deps dflash==0.1.0): no skip when it is missing.
import dflash.model as zlab  # noqa: E402
from transformers import Qwen3Config  # noqa: E402

ref = _load("dflash_reference")

REPO = Path(__file__).resolve().parents[2]
MODELS = "vllm/model_executor/models/qwen3_dflash.py"
PER_LAYER_PATCH = "dflash-drafter-per-layer-attention"
STOCK_RELEASES = ("0.26.0", "0.27.1", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0")
BLOCK = 16  # z-lab's block size: the bonus token and K = 15 masks
TOLERANCE = 1e-4


def _config(window: int | None = 2048, layer_types=("sliding_attention",) * 4 + ("full_attention",), **extra):
    """The issue's reproduction drafter: hidden 64, 4 query / 2 KV heads of 16, 30 target layers."""
    cfg = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 128, "num_hidden_layers": len(layer_types), "layer_types": list(layer_types),
        "num_target_layers": 30, "vocab_size": 256, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
        "max_position_embeddings": 4096, "attention_bias": False, "hidden_act": "silu",
        "dflash_config": {"target_layer_ids": [1, 6, 11, 17, 22, 27], "mask_token_id": 4, "block_size": BLOCK},
    }
    if window is not None:
        # Without use_sliding_window transformers' Qwen3Config drops sliding_window, and z-lab's torch
        # model then runs its sliding layers unwindowed.
        cfg |= {"sliding_window": window, "use_sliding_window": True, "max_window_layers": len(layer_types)}
    return cfg | extra


def _qwen3(cfg: dict) -> Qwen3Config:
    return Qwen3Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})


def _zlab_drafter(cfg: dict, seed: int = 0):
    """z-lab's drafter with weights far from their init: norms away from one, so a swapped norm shows."""
    torch.manual_seed(seed)
    model = zlab.DFlashDraftModel(_qwen3(cfg)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2 if p.dim() > 1 else 1 + 0.1 * torch.randn_like(p))
    return model


def _project_drafter(cfg: dict, zmodel):
    drafter = ref.Drafter(ref.Geometry.from_config(cfg)).eval()
    drafter.load_state_dict(zmodel.state_dict())  # strict: the parameter names are the same
    return drafter


def _both(cfg: dict, t: int, seed: int = 0):
    """z-lab's and the reference's final hidden states [16, H] of one block after ``t`` context positions."""
    zmodel = _zlab_drafter(cfg, seed)
    drafter = _project_drafter(cfg, zmodel)
    gen = torch.Generator().manual_seed(seed + 1)
    feats = torch.randn(1, t, 6 * cfg["hidden_size"], generator=gen)
    block = torch.randn(1, BLOCK, cfg["hidden_size"], generator=gen)
    with torch.no_grad():
        want = zmodel(position_ids=torch.arange(t + BLOCK)[None], noise_embedding=block, target_hidden=feats)[0]

    def ours(attention):
        with torch.no_grad():
            return drafter(feats, torch.arange(t)[None], block[:, None], torch.tensor([[t]]), attention)[0, 0]

    return want, ours, drafter.g


# ------------------------------------------------------------ the reproduction

CASES = [(40, 2048), (300, 64)]  # the window binds only in the second


@pytest.mark.parametrize("t,window", CASES)
@pytest.mark.parametrize("semantics", ref.SEMANTICS)
def test_reference_matches_zlab_in_every_semantics_of_the_series(semantics, t, window):
    want, ours, g = _both(_config(window), t)
    got = ours(ref.layer_attention(g, semantics))
    assert want.abs().max() > 1  # outputs of magnitude ~3-5: the tolerance is relative to something
    assert (got - want).abs().max() < TOLERANCE, semantics


@pytest.mark.parametrize("t,window", CASES)
def test_released_0_21_0_without_the_patch_differs_from_zlab(t, window):
    """The gap dflash-drafter-per-layer-attention closes: every layer non-causal, no window."""
    want, ours, g = _both(_config(window), t)
    assert (ours(ref.layer_attention(g, ref.STOCK_0_21_0)) - want).abs().max() > 1


def test_every_modelled_semantics_is_tested():
    assert set(ref.MODELLED) == set(ref.SEMANTICS) | {ref.STOCK_0_21_0}


# ------------------------------------------------------------ conventions, pinned

def test_sliding_layers_are_causal_in_zlab_and_the_block_sees_itself_whole_otherwise():
    """With a window no context reaches past, only in-block causality separates the readings."""
    want, ours, g = _both(_config(4096), 40)
    sliding = ref.LayerAttention(4096, True)
    assert (ours([sliding] * 4 + [ref.LayerAttention(None, False)]) - want).abs().max() < TOLERANCE
    non_causal = [ref.LayerAttention(4096, False)] * 4 + [ref.LayerAttention(None, False)]
    assert (ours(non_causal) - want).abs().max() > 0.1
    all_causal = [sliding] * 5
    assert (ours(all_causal) - want).abs().max() > 0.1


def test_the_window_keeps_keys_less_than_window_positions_back():
    want, ours, g = _both(_config(64), 300)
    full = ref.LayerAttention(None, False)
    for window in (63, 65, None):
        assert (ours([ref.LayerAttention(window, True)] * 4 + [full]) - want).abs().max() > 1e-3, window
    assert (ours([ref.LayerAttention(64, True)] * 4 + [full]) - want).abs().max() < TOLERANCE


def test_context_features_are_the_stream_after_each_target_layer():
    """z-lab's extract_context_feature reads hidden_states[id + 1] (the stream leaving layer id);
    the reference is trained and walked on train_drafter.target_features, which must read the same."""
    td = _load("train_drafter")
    model, _cfg = tiny_gemma4_target(6)
    ids = [1, 3, 4]
    seq = list(range(20, 44))
    with torch.no_grad():
        hs = model(input_ids=torch.tensor([seq]), output_hidden_states=True, use_cache=False).hidden_states
    want = zlab.extract_context_feature(list(hs), ids).to(torch.bfloat16)
    got, _, _ = td.target_features(model, [seq], ids, 4096)
    assert torch.equal(got, want)
    # The stream entering those layers (vLLM's raw aux-state numbering) is different.
    assert not torch.equal(got, zlab.extract_context_feature(list(hs), [i - 1 for i in ids]).to(torch.bfloat16))


def _gemma4_text(model) -> tuple[torch.Tensor, dict]:
    table = model.model.language_model.embed_tokens.weight.detach()
    return table, model.config.text_config.to_dict()


@pytest.mark.parametrize("stated", [None, 0.5])
def test_drafts_match_zlab_gemma4_embedding_mask_token_and_soft_cap(stated):
    """The whole draft step against z-lab's: the block [bonus, mask x 15] embedded as its Gemma 4
    backend does (the target's scaled embedding times input_embedding_scale), z-lab's forward, and
    its compute_logits with the target's soft cap, on a Gemma 4 target's tied table."""
    model, _ = tiny_gemma4_target(6)
    table, text = _gemma4_text(model)
    text["final_logit_softcapping"] = 2.0  # small: the cap changes these logits
    extra = {"final_logit_softcapping": text["final_logit_softcapping"]}
    cfg = _config(64, vocab_size=table.shape[0], **extra)
    if stated is not None:
        cfg["dflash_config"]["input_embedding_scale"] = stated
    zmodel = _zlab_drafter(cfg)
    drafter = _project_drafter(cfg, zmodel)
    shared = ref.Shared.gemma4(table, text)
    t, bonus = 90, 37
    feats = torch.randn(1, t, 6 * 64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        block = torch.tensor([[bonus] + [zmodel.mask_token_id] * (zmodel.block_size - 1)])
        scale = 1.0 if stated is None else stated
        noise = model.get_input_embeddings()(block) * scale  # Gemma4's scaled embedding: sqrt(hidden) in
        hidden = zmodel(position_ids=torch.arange(t + BLOCK)[None], noise_embedding=noise, target_hidden=feats)
        want = zmodel.compute_logits(hidden[:, 1:], model.get_output_embeddings())[0]
        got = ref.draft_logits(drafter, shared, feats, torch.arange(t)[None], torch.tensor([[bonus]]),
                               torch.tensor([[t]]), "vllm-0.33.0", BLOCK - 1)[0, 0]
        uncapped = ref.draft_logits(drafter, ref.Shared(shared.table, shared.embed_scale, None), feats,
                                    torch.arange(t)[None], torch.tensor([[bonus]]), torch.tensor([[t]]),
                                    "vllm-0.33.0", BLOCK - 1)[0, 0]
    assert model.model.language_model.embed_tokens.embed_scale == pytest.approx(math.sqrt(64))
    assert got.shape == want.shape
    assert (got - want).abs().max() < TOLERANCE
    assert (uncapped - want).abs().max() > 0.1  # the cap binds on these logits


def test_the_block_is_the_bonus_then_the_configs_mask_token():
    cfg = _config()
    zmodel = zlab.DFlashDraftModel(_qwen3(cfg))
    g = ref.Geometry.from_config(cfg)
    assert (g.mask_token_id, zmodel.mask_token_id) == (4, cfg["dflash_config"]["mask_token_id"])
    block = ref.block_tokens(torch.tensor([9]), g.mask_token_id, ref.K_DEFAULT)
    assert block.tolist() == [[9] + [zmodel.mask_token_id] * (zmodel.block_size - 1)]


def test_the_reference_reads_input_embedding_scale_as_zlab_does():
    for stated, want in ((None, 1.0), (0.25, 0.25)):
        cfg = _config()
        if stated is not None:
            cfg["dflash_config"]["input_embedding_scale"] = stated
        model = zlab.DFlashDraftModel(_qwen3(cfg))
        assert ref.Geometry.from_config(cfg).input_embedding_scale == want
        assert float(zlab._draft_value(model.config, "input_embedding_scale", 1.0)) == want


# ------------------------------------------------------- each release's per-layer attention

def _harness_drafter_configs() -> dict[str, dict]:
    """The drafter configs the recipes and the harness use, as config.json dicts."""
    bs, mc, tt = _load("bench_shapes"), _load("make_checkpoints"), _load("train_target")
    released = bs.drafter_config(30)  # z-lab/gemma-4-26B-A4B-it-DFlash (4 sliding + 1 full, window 2048)
    return {
        "gemma-4-26B-A4B-it-DFlash": released,
        # The 31B's drafter is of the same make (mixed layer types, causal only on sliding layers:
        # vLLM's _resolve_layer_attention docstring); its own config is not in the project.
        "gemma-4-31B-it-DFlash (26B make, 60 target layers)": bs.drafter_config(60),
        "trained (train_target.DRAFTER)": tt.drafter_config(),
        "realshape": mc.drafter_config_dict(mc.REALSHAPE_DRAFTER),
        "all full (make_checkpoints.DRAFTERS)": mc.drafter_config_dict(mc.DRAFTERS[0]),
    }


def _zlab_layer_attention(cfg: dict) -> list[tuple[int | None, bool]]:
    config = _qwen3(cfg)
    with torch.device("meta"):  # only the attributes are read: no weights
        layers = [zlab.Qwen3DFlashAttention(config, i) for i in range(config.num_hidden_layers)]
    return [(a.sliding_window, a.is_causal) for a in layers]


def _release_tree(version: str, tmp_path_factory) -> Path:
    from tests.integration.patch_trees import pristine, single_patch_tree

    if version != "0.21.0":
        return pristine(version, "site-packages")
    from launcher.patching.series import series_for

    patch = next(p for p in series_for(version).patches if p.id == PER_LAYER_PATCH)
    return single_patch_tree(version, patch, tmp_path_factory.mktemp(f"{version}-{PER_LAYER_PATCH}"))


def _release_resolver(tree: Path):
    from tests.patches.vllm_source import load

    v2 = types.SimpleNamespace(use_v2_model_runner=True)  # mixed drafters need it (the recipes' runner)
    return load(tree, MODELS, overrides={"get_current_vllm_config": lambda: v2})["_resolve_layer_attention"]


@pytest.mark.network  # a cold cache downloads the release from PyPI
@pytest.mark.parametrize("version", ("0.21.0",) + STOCK_RELEASES)
def test_each_release_gives_each_drafter_layer_zlabs_attention(version, tmp_path_factory):
    resolve = _release_resolver(_release_tree(version, tmp_path_factory))
    for name, cfg in _harness_drafter_configs().items():
        config = _qwen3(cfg)
        got = [tuple(resolve(config, i)) for i in range(config.num_hidden_layers)]
        assert got == _zlab_layer_attention(cfg), (version, name)


def test_the_configs_compared_per_release_include_both_layer_kinds():
    """The per-release comparison is blind unless some config has windowed causal layers and some
    non-causal full ones."""
    seen = {pair for cfg in _harness_drafter_configs().values() for pair in _zlab_layer_attention(cfg)}
    assert (None, False) in seen and any(w is not None and causal for w, causal in seen)


def test_the_reference_gives_each_harness_drafter_layer_zlabs_attention():
    for name, cfg in _harness_drafter_configs().items():
        g = ref.Geometry.from_config(cfg)
        for sem in ref.SEMANTICS:
            got = [(a.window, a.causal) for a in ref.layer_attention(g, sem)]
            assert got == _zlab_layer_attention(cfg), (name, sem)


# ------------------------------------------------------- checkpoints z-lab loads unchanged

def _written_drafters(tmp_path: Path) -> dict[str, Path]:
    """One folder per way the harness writes a drafter: random (make_checkpoints.write_drafter, with
    the default config and with train_target's) and trained (train_drafter.save_drafter)."""
    mc, tt, td = _load("make_checkpoints"), _load("train_target"), _load("train_drafter")
    out = {}
    for shape in (mc.DRAFTERS[0], mc.REALSHAPE_DRAFTER):
        out[shape.name] = tmp_path / shape.name
        mc.write_drafter(shape, out[shape.name])
    out["random for the trained target"] = tmp_path / "random-trained"
    mc.write_drafter(tt.DRAFTER, out["random for the trained target"], tt.drafter_config())
    torch.manual_seed(0)
    trained = ref.Drafter(ref.Geometry.from_config(tt.drafter_config()))
    trained.init_weights(0.02)
    out["trained"] = tmp_path / "trained"
    td.save_drafter(trained, tt.drafter_config(), out["trained"])
    return out


def test_every_drafter_the_harness_writes_loads_in_zlabs_from_pretrained(tmp_path):
    import json

    from safetensors.torch import load_file

    for name, folder in _written_drafters(tmp_path).items():
        model, info = zlab.DFlashDraftModel.from_pretrained(folder, output_loading_info=True,
                                                            dtype=torch.bfloat16)
        assert {k: v for k, v in info.items() if v} == {}, name  # nothing missing, unexpected or resized
        saved = load_file(str(folder / "model.safetensors"))
        state = model.state_dict()
        assert all(torch.equal(state[k], t) for k, t in saved.items()), name
        cfg = json.loads((folder / "config.json").read_text())
        assert list(model.target_layer_ids) == cfg["dflash_config"]["target_layer_ids"], name
        assert model.mask_token_id == cfg["dflash_config"]["mask_token_id"], name
        g = ref.Geometry.from_config(cfg)
        assert _zlab_layer_attention(cfg) == [(a.window, a.causal) for a in ref.layer_attention(g, "vllm-0.33.0")]


def test_doctor_drafter_passes_what_the_harness_writes_and_names_each_missing_field(tmp_path):
    import json

    from typer.testing import CliRunner

    from launcher.checkpoint import REFERENCE_DRAFTER_FIELDS
    from launcher.cli import app

    def doctor(folder):
        res = CliRunner().invoke(app, ["doctor", "--json", "--drafter", str(folder)])
        return res.exit_code, json.loads(res.stdout)["drafter"]

    folder = _written_drafters(tmp_path)["trained"]
    code, report = doctor(folder)
    assert (code, report["reasons"], report["blocking"]) == (0, [], False)
    good = json.loads((folder / "config.json").read_text())
    for name in REFERENCE_DRAFTER_FIELDS + ("sliding_window", "use_sliding_window"):
        cfg = json.loads(json.dumps(good))
        where = cfg["dflash_config"] if name.startswith("dflash_config.") else cfg
        del where[name.split(".")[-1]]
        (folder / "config.json").write_text(json.dumps(cfg))
        code, report = doctor(folder)
        assert code == 1, name
        assert any(f"{name} is missing" in r for r in report["reasons"]), (name, report["reasons"])
        if name == "num_target_layers":  # the field z-lab's loader fails on
            with pytest.raises(AttributeError):
                zlab.DFlashDraftModel.from_pretrained(folder)
