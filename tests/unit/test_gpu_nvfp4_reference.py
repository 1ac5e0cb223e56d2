"""tests/gpu/models/nvfp4_reference.py: the NVFP4 target in PyTorch, checked against ModelOpt's own NVFP4
tensors (the quantizer that exports the checkpoint, in the test venv) on the CPU.

What cannot run here: the offline walk on the trained target (a GPU host's job, `remote.sh
nvfp4-reference`). A tiny Gemma 4 target stands in for it, exported the way ModelOpt exports one.
"""

from __future__ import annotations

import pytest

from tests.unit.gpu_scripts import load as _load
from tests.unit.gpu_scripts import tiny_gemma4_target

torch = pytest.importorskip("torch", reason="the reference needs torch (the test venv has the CPU build)")
nvfp4_tensor = pytest.importorskip("modelopt.torch.quantization.qtensor.nvfp4_tensor",
                                   reason="ModelOpt is the quantizer under test's counterpart (launcher quantize's)")
nr = _load("nvfp4_reference")
td = _load("train_drafter")
tt = _load("train_target")

NVFP4 = nvfp4_tensor.NVFP4QTensor


def _export(weight: "torch.Tensor", act_amax: float, prefix: str) -> dict:
    """One projection as ModelOpt's NVFP4 export writes it."""
    q, scale, scale_2 = NVFP4.quantize(weight.float(), 16)
    return {f"{prefix}.weight": q._quantized_data, f"{prefix}.weight_scale": scale,
            f"{prefix}.weight_scale_2": scale_2, f"{prefix}.input_scale": torch.tensor(act_amax / (6 * 448))}


def _modelopt_dequantized(tensors: dict, prefix: str) -> "torch.Tensor":
    data = tensors[f"{prefix}.weight"]
    q = NVFP4((data.shape[0], data.shape[1] * 2), torch.float32, data)
    return q.dequantize(torch.float32, scale=tensors[f"{prefix}.weight_scale"],
                        double_scale=tensors[f"{prefix}.weight_scale_2"], block_sizes={-1: 16})


def test_e2m1_rounds_to_nearest_with_ties_to_the_even_mantissa():
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.75, 0.26, 2.9, -4.4])
    assert nr.round_e2m1(x).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -1.0, 0.5, 3.0, -4.0]


def test_weights_and_activations_match_modelopts_nvfp4():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(48, 64, generator=gen) * 0.05
    tensors = _export(w, 1.0, "p")
    mine = nr.dequantize_weight(tensors["p.weight"], tensors["p.weight_scale"], tensors["p.weight_scale_2"])
    assert torch.equal(mine, _modelopt_dequantized(tensors, "p"))
    assert not torch.equal(mine, w)  # the weight did go through FP4
    x = torch.randn(8, 64, generator=gen) * 3
    scale = x.abs().amax() / (6 * 448)
    q, s, s2 = NVFP4.quantize(x, 16, weights_scaling_factor_2=scale)
    theirs = q.dequantize(torch.float32, scale=s, double_scale=s2, block_sizes={-1: 16})
    assert torch.allclose(nr.quant_dequant(x, scale), theirs, rtol=0, atol=1e-6)
    # One scale per row: each row as if quantized alone with its own.
    rows = torch.tensor([scale, scale * 3] * 4)
    per_row = nr.quant_dequant(x, rows)
    assert torch.equal(per_row[1], nr.quant_dequant(x[1:2], rows[1])[0])
    assert not torch.equal(per_row[1], nr.quant_dequant(x[1:2], scale)[0])


def _tiny_target(tmp_path):
    """tiny_gemma4_target, saved and loaded as train_drafter loads the trained target (bf16)."""
    model, _ = tiny_gemma4_target(layers=2)
    model.save_pretrained(tmp_path)
    return td.load_target(tmp_path, "cpu")


def _export_model(model) -> dict:
    tensors: dict = {}
    for i, layer in enumerate(model.model.language_model.layers):
        base = f"model.language_model.layers.{i}"
        for name in nr.LINEARS:
            try:
                module = layer.get_submodule(name)
            except AttributeError:
                continue
            tensors |= _export(module.weight.detach(), 4.0, f"{base}.{name}")
        experts = layer.experts
        inner = experts.down_proj.shape[-1]
        for e in range(experts.num_experts):
            gate_up = experts.gate_up_proj[e].detach()
            for name, w, amax in (("gate_proj", gate_up[:inner], 4.0), ("up_proj", gate_up[inner:], 2.0 + e),
                                  ("down_proj", experts.down_proj[e].detach(), 1.0)):
                tensors |= _export(w, amax, f"{base}.experts.{e}.{name}")
    return tensors


def test_apply_computes_with_the_exported_weights_and_each_projections_own_input_scale(tmp_path):
    model = _tiny_target(tmp_path)
    tensors = _export_model(model)
    original = {n: p.detach().clone() for n, p in model.named_parameters()}
    done = nr.apply(model, tensors, activations=False)
    layers = model.model.language_model.layers
    assert done["linears"] == sum(1 for k in tensors if k.endswith(".weight") and ".experts." not in k)
    assert done["experts"] == 2 * 4
    q = "model.language_model.layers.0.self_attn.q_proj"
    assert torch.equal(layers[0].self_attn.q_proj.weight, _modelopt_dequantized(tensors, q).to(torch.bfloat16))
    assert not torch.equal(layers[0].self_attn.q_proj.weight, original[f"{q}.weight"])
    up = _modelopt_dequantized(tensors, "model.language_model.layers.1.experts.3.up_proj")
    assert torch.equal(layers[1].experts.gate_up_proj[3][16:], up.to(torch.bfloat16))

    # W4A4: the experts' inputs through NVFP4 at their own expert's scale, against a plain loop.
    w4a4 = _tiny_target(tmp_path)
    nr.apply(w4a4, tensors, activations=True)
    experts = w4a4.model.language_model.layers[1].experts
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 64, generator=gen).to(torch.bfloat16)
    index = torch.stack([torch.randperm(4, generator=gen)[:2] for _ in range(6)])
    weights = torch.softmax(torch.randn(6, 2, generator=gen), -1)
    with torch.no_grad():
        got = experts(x, index, weights)
        want = torch.zeros(6, 64)
        for t in range(6):
            for j in range(2):
                e = int(index[t, j])
                s = {p: tensors[f"model.language_model.layers.1.experts.{e}.{p}.input_scale"] for p in nr.EXPERT_PROJECTIONS}
                gate_w, up_w = experts.gate_up_proj[e].chunk(2)
                h = experts.act_fn(nr.quant_dequant(x[t:t + 1], s["gate_proj"]) @ gate_w.T) * \
                    (nr.quant_dequant(x[t:t + 1], s["up_proj"]) @ up_w.T)
                want[t] += (weights[t, j] * (nr.quant_dequant(h, s["down_proj"]) @ experts.down_proj[e].T))[0].float()
        assert torch.allclose(got.float(), want, atol=3e-2, rtol=3e-2)
        ids = torch.tensor([[2, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54]])
        a16, a4 = model(input_ids=ids).logits, w4a4(input_ids=ids).logits
        plain = _tiny_target(tmp_path)(input_ids=ids).logits
    # Each step moved the logits: the weights through FP4, then the activations too.
    assert not torch.equal(plain, a16) and not torch.equal(a16, a4)
