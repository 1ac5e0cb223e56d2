"""CPU side of issue 27's full-size checkpoints: shapes, NVIDIA's layout, the streaming writer, the tokenizer.

What cannot run here is generating 19 GB on a GPU and serving it. What runs:
the full-size layout counted from transformers' own model (meta device) and
checked against the released checkpoint's published sizes; the generator at
tiny widths, its files read back by safetensors, the project's checkpoint
inspector and vLLM 0.21.0's Gemma 4 weight names; the tokenizer at the full
vocabulary (every id decodes) and at tiny size through transformers.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

GPU_DIR = Path(__file__).resolve().parents[1] / "gpu"
sys.path.insert(0, str(GPU_DIR))

import bench_shapes as bs  # noqa: E402
import fullsize_shapes as fs  # noqa: E402
import fullsize_tokenizer as ftok  # noqa: E402
import st_stream  # noqa: E402

from launcher.checkpoint import inspect_drafter, inspect_target, read_tensor_index  # noqa: E402

# nvidia/Gemma-4-26B-A4B-NVFP4 at the pinned revision: its two safetensors files
# (recipes/shared/models.yaml), headers included.
NVIDIA_FILES_BYTES = 10_001_865_236 + 8_786_620_352


@pytest.fixture(scope="module")
def full():
    from make_bench_checkpoints import drafter_layout, hf_state_shapes

    cfg = fs.target_config()
    names = hf_state_shapes(cfg)
    return {"config": cfg, "names": names, "layout": fs.nvidia_layout(names),
            "drafter": drafter_layout(fs.drafter_config())}


# ----------------------------------------------------------------- released shapes


def test_full_config_is_the_released_one():
    cfg = fs.target_config()
    text, vision = cfg["text_config"], cfg["vision_config"]
    assert text["num_hidden_layers"] == 30 and text["layer_types"].count("full_attention") == 5
    assert (text["hidden_size"], text["num_experts"], text["top_k_experts"], text["vocab_size"]) == \
        (2816, 128, 8, 262144)
    assert (vision["hidden_size"], vision["intermediate_size"], vision["num_hidden_layers"]) == (1152, 4304, 27)
    assert (vision["num_attention_heads"], vision["head_dim"], vision["default_output_length"]) == (16, 72, 280)
    assert cfg["eos_token_id"] == [1, 106] and cfg["vision_soft_tokens_per_image"] == 280


def test_quantization_config_is_nvidias():
    q = fs.target_config()["quantization_config"]
    assert (q["quant_method"], q["quant_algo"]) == ("modelopt", "NVFP4")
    assert q["kv_cache_scheme"] == {"dynamic": False, "num_bits": 8, "type": "float"}
    assert q["config_groups"]["group_0"]["weights"]["group_size"] == 16
    ignore = q["ignore"]
    assert ignore == sorted(ignore) and len(ignore) == 3 + 3 * 30
    assert {"lm_head", "model.embed_vision*", "model.vision_tower*"} <= set(ignore)
    assert "model.language_model.layers.29.self_attn*" in ignore and "model.language_model.layers.0.mlp*" in ignore
    assert not any("experts" in p for p in ignore)
    hq = fs.hf_quant_config()["quantization"]
    assert (hq["kv_cache_quant_algo"], hq["exclude_modules"]) == ("FP8", ignore)


def test_only_the_routed_experts_are_nvfp4(full):
    layout = full["layout"]
    quantized = {n.rsplit(".", 1)[0] for n, (dtype, _) in layout.items() if dtype == "U8"}
    assert quantized and all(".experts." in m for m in quantized)
    assert len(quantized) == 30 * 128 * 3
    assert layout["model.language_model.layers.0.experts.0.down_proj.weight"] == ("U8", [2816, 352])
    assert layout["model.language_model.layers.0.experts.127.gate_proj.weight_scale"] == ("F8_E4M3", [704, 176])
    assert layout["model.language_model.layers.5.self_attn.q_proj.weight"] == ("BF16", [8192, 2816])
    assert layout["model.language_model.layers.0.router.proj.weight"] == ("BF16", [128, 2816])
    assert "lm_head.weight" not in layout and not any("gate_up_proj" in n for n in layout)
    assert "model.language_model.layers.5.self_attn.v_proj.weight" not in layout  # K = V on full layers


def test_layout_bytes_match_the_released_files(full):
    """The NVIDIA export's two files hold 18,788,485,588 bytes, headers included (46k entries of
    ~150 bytes): the generated layout must be that less a header's worth."""
    data = sum(fs.nbytes(*v) for v in full["layout"].values())
    headers = NVIDIA_FILES_BYTES - data
    assert 0 < headers < 12_000_000, headers
    by_class = fs.bytes_by_class(full["layout"])
    hidden, vocab = 2816, 262144
    assert by_class["embedding"] == vocab * hidden * 2
    expert = 3 * 704 * hidden  # gate, up, down: elements of one expert
    assert by_class["experts"] == 30 * 128 * (expert // 2 + expert // 16 + 3 * 2 * 4)


def test_parameter_counts_are_the_published_ones(full):
    counts = fs.parameter_counts(full["names"], full["config"]["text_config"])
    assert round(counts["params_text"] / 1e9, 1) == 25.2  # "Total Parameters 25.2B"
    assert round(counts["params_active"] / 1e9, 1) == 3.8  # "Active Parameters 3.8B"
    assert 0.54e9 < counts["params_vision"] < 0.60e9  # "Vision Encoder Parameters ~550M"


def test_drafter_is_the_released_one(full):
    cfg = fs.drafter_config()
    assert cfg["dflash_config"]["target_layer_ids"] == [1, 6, 11, 17, 22, 27]
    assert len(full["drafter"]) == 58
    assert full["drafter"]["fc.weight"] == ("BF16", [2816, 6 * 2816])
    assert round(sum(fs.nbytes(*v) for v in full["drafter"].values()) / 2**30, 2) == 0.80
    with pytest.raises(ValueError, match="do not fit"):
        fs.drafter_config(12)


def test_shard_plan_keeps_order_and_size(full):
    plan = fs.shard_plan(full["layout"], 4 << 30)
    flat = [n for shard in plan for n in shard]
    assert sorted(flat) == sorted(full["layout"]) and len(flat) == len(set(flat))
    for shard in plan:
        size = sum(fs.nbytes(*full["layout"][n]) for n in shard)
        assert size <= 4 << 30 or len(shard) == 1
    layers = [fs.layer_of(n) for n in flat if fs.layer_of(n) is not None and fs.tensor_class(n) != "vision"]
    assert layers == sorted(layers)
    assert fs.tensor_class(flat[-1]) == "vision"


# ----------------------------------------------------------------- streaming writer


def test_stream_writer_round_trips_through_safetensors(tmp_path):
    import torch
    from safetensors import safe_open

    tensors = {"a": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), "b": torch.tensor(1.5),
               "c": torch.randint(0, 255, (5, 7), dtype=torch.uint8),
               "d": torch.full((3, 2), 2.0).to(torch.float8_e4m3fn)}
    dtypes = {torch.bfloat16: "BF16", torch.float32: "F32", torch.uint8: "U8", torch.float8_e4m3fn: "F8_E4M3"}
    specs = [(n, dtypes[t.dtype], list(t.shape)) for n, t in tensors.items()]
    with st_stream.Writer(tmp_path / "x.safetensors", specs, {"format": "pt"}) as w:
        for n, t in tensors.items():
            w.write(n, t.reshape(-1).view(torch.uint8).numpy())
    with safe_open(str(tmp_path / "x.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}
        for n, t in tensors.items():
            got = f.get_tensor(n)
            assert got.dtype == t.dtype and got.shape == t.shape, n
            assert torch.equal(got.reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), n
    assert st_stream.read_header(tmp_path / "x.safetensors")["c"]["shape"] == [5, 7]
    assert len(st_stream.header(specs)[0]) % 8 == 0


def test_stream_writer_refuses_wrong_order_size_and_short_files(tmp_path):
    specs = [("a", "U8", [4]), ("b", "F32", [2])]
    w = st_stream.Writer(tmp_path / "y.safetensors", specs)
    with pytest.raises(ValueError, match="next tensor is a"):
        w.write("b", bytes(8))
    with pytest.raises(ValueError, match="3 bytes"):
        w.write("a", bytes(3))
    w.write("a", bytes(4))
    with pytest.raises(ValueError, match="1 tensors unwritten"):
        w.close()
    assert not (tmp_path / "y.safetensors").exists()
    with pytest.raises(RuntimeError), st_stream.Writer(tmp_path / "z.safetensors", specs):
        raise RuntimeError("cut")
    assert not list(tmp_path.glob("z.safetensors*"))


# ----------------------------------------------------------------- tokenizer


def test_full_vocabulary_decodes_every_id(tmp_path):
    from tokenizers import Tokenizer

    cfg = fs.target_config()
    info = ftok.write(tmp_path, cfg)
    ids = info["special_ids"]
    assert (ids["<pad>"], ids["<eos>"], ids["<bos>"], ids["<mask>"], ids["<turn|>"]) == (0, 1, 2, 4, 106)
    for token, key in ftok.FROM_CONFIG.items():
        assert ids[token] == cfg[key]
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tok.get_vocab_size() == 262144
    for i in (0, 5, 105, 255999, 258884, 262143, 1000, 29999):
        assert tok.id_to_token(i) is not None
    text = tok.decode(list(range(262144)), skip_special_tokens=True)
    assert text.count(" t") == 262144 - len(ids) - 256
    sample = "Hello, wörld! 你好 \t\n"
    assert tok.decode(tok.encode(sample).ids) == sample
    gen = json.loads((tmp_path / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [1, 106]
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["model_max_length"] == 262144
    proc = json.loads((tmp_path / "processor_config.json").read_text())
    assert proc["image_processor"]["max_soft_tokens"] == proc["image_seq_length"] == 280


def test_vocabulary_places_bytes_and_refuses_a_too_small_one():
    entries = ftok.vocabulary(300, {"<pad>": 0, "<x>": 299})
    assert entries[0] == "<pad>" and entries[299] == "<x>"
    assert set(entries[1:257]) == set(ftok.bytes_to_unicode().values())
    assert entries[257] == "Ġt257"
    with pytest.raises(ValueError, match="no room"):
        ftok.vocabulary(200, {"<pad>": 0})
    with pytest.raises(ValueError, match="outside"):
        ftok.vocabulary(300, {"<pad>": 300})


# ----------------------------------------------------------------- generator at tiny widths


def _generate(out: Path) -> None:
    from make_fullsize_checkpoints import main

    assert main([str(out), "--tiny", "--device", "cpu"]) == 0


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fullsize")
    _generate(out)
    return out


def test_tiny_checkpoint_files_read_back(tiny):
    from safetensors import safe_open

    target = tiny / "gemma4-26b-a4b-nvfp4"
    index = json.loads((target / "model.safetensors.index.json").read_text())
    names = set()
    for fname in set(index["weight_map"].values()):
        with safe_open(str(target / fname), "pt") as f:
            names |= set(f.keys())
    assert names == set(index["weight_map"])
    cfg = json.loads((target / "config.json").read_text())
    expected = fs.nvidia_layout(__import__("make_bench_checkpoints").hf_state_shapes(cfg))
    assert {n: (m.dtype, list(m.shape)) for n, m in read_tensor_index(target).items()} == expected
    manifest = json.loads((tiny / "fullsize-shapes.json").read_text())
    assert manifest["target"]["bytes"] == sum(fs.nbytes(*v) for v in expected.values())
    assert sum(manifest["target"]["bytes_by_class"].values()) == manifest["target"]["bytes"]
    for f in ("tokenizer.json", "tokenizer_config.json", "processor_config.json", "chat_template.jinja",
              "hf_quant_config.json", "generation_config.json", "special_tokens_map.json"):
        assert (target / f).is_file(), f


def test_tiny_checkpoint_passes_the_launchers_inspection(tiny):
    info, reasons = inspect_target(tiny / "gemma4-26b-a4b-nvfp4", expected_format="modelopt-nvfp4",
                                   vllm_version="0.21.0")
    assert info.format == "modelopt-nvfp4"
    assert [r.message for r in reasons if r.blocking] == []
    assert [r.message for r in inspect_drafter(tiny / "dflash-26b-a4b", target=info) if r.blocking] == []


def test_tiny_nvfp4_expert_dequantizes_to_the_init_std(tiny):
    import torch
    from safetensors.torch import load_file

    target = tiny / "gemma4-26b-a4b-nvfp4"
    index = json.loads((target / "model.safetensors.index.json").read_text())
    name = "model.language_model.layers.3.experts.1.down_proj"
    t = load_file(str(target / index["weight_map"][name + ".weight"]))
    codes = torch.stack([t[name + ".weight"] & 0xF, t[name + ".weight"] >> 4], -1).flatten(-2)
    e2m1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])
    scale = t[name + ".weight_scale"].float().repeat_interleave(16, -1) * t[name + ".weight_scale_2"]
    assert 0.5 * bs.INIT_STD < (e2m1[codes.long()] * scale).std().item() < 2 * bs.INIT_STD


def test_generation_is_seeded(tiny, tmp_path):
    _generate(tmp_path)

    def digest(root: Path) -> str:
        h = hashlib.sha256()
        for p in sorted(root.rglob("*.safetensors")):
            h.update(p.read_bytes())
        return h.hexdigest()

    assert digest(tmp_path) == digest(tiny)


def test_generator_refuses_without_disk(tmp_path, monkeypatch, capsys):
    import shutil

    import make_fullsize_checkpoints as mf

    monkeypatch.setattr(shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(1, 1, 1024))
    assert mf.main([str(tmp_path), "--tiny", "--device", "cpu"]) == 2
    assert "not enough disk" in capsys.readouterr().err


@pytest.mark.network
def test_every_tiny_tensor_maps_onto_a_vllm_021_parameter(tiny):
    from launcher import pypi
    from tests.integration.vllm_gemma4_names import Gemma4Loader

    loader = Gemma4Loader.read(pypi.unpacked("vllm", "0.21.0", "site-packages") / "vllm")
    unmapped = []
    for name in read_tensor_index(tiny / "gemma4-26b-a4b-nvfp4"):
        model_name = loader.to_model_name(name)
        if model_name is None:
            assert name.startswith(("model.vision_tower.", "model.embed_vision.")), name
        elif not loader.resolve(loader.to_parameter(model_name)):
            unmapped.append(name)
    assert unmapped == []


@pytest.mark.network
def test_tiny_processor_loads_with_the_generated_tokenizer(tiny):
    """The tokenizer and processor files as vLLM's Gemma 4 processor reads them (the trained
    target's checker, tests/unit/test_gpu_lm_files.py), at the released 280 soft tokens."""
    from tests.unit.test_gpu_lm_files import _vision_deps, checker_argv

    target = tiny / "gemma4-26b-a4b-nvfp4"
    cfg = json.loads((target / "config.json").read_text())
    specials = ftok.special_ids(cfg)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(p) for p in _vision_deps()] + [env.get("PYTHONPATH", "")])
    env.setdefault("HF_HUB_OFFLINE", "1")
    proc = subprocess.run(checker_argv(target, specials),
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["processor_class"] == "Gemma4Processor"
    assert res["token_ids"] == specials
    assert res["len_tokenizer"] == cfg["text_config"]["vocab_size"]
    assert res["processor_attrs"]["image_token_id"] == cfg["image_token_id"]
    for img in res["images"]:
        assert img["wrapped"] and 0 < img["image_tokens"] <= 280, img


def test_tiny_widths_are_real_multiples():
    from make_fullsize_checkpoints import configs

    target, drafter = configs(tiny=True)
    text = target["text_config"]
    assert text["num_hidden_layers"] == 12 and text["vocab_size"] == 512
    assert math.gcd(text["hidden_size"], 16) == 16 and math.gcd(text["moe_intermediate_size"], 16) == 16
    assert max(drafter["dflash_config"]["target_layer_ids"]) + 1 < 12


def test_configs_parse_in_transformers_as_vllm_021_reads_them(tiny):
    from transformers import AutoConfig

    target = AutoConfig.from_pretrained(tiny / "gemma4-26b-a4b-nvfp4")
    text = target.get_text_config()
    assert (text.head_dim, text.global_head_dim, text.attention_k_eq_v) == (256, 512, True)
    assert text.use_bidirectional_attention == "vision" and text.layer_types.count("full_attention") == 2
    assert (target.vision_config.standardize, target.vision_config.use_clipped_linears) == (True, False)
    assert target.quantization_config["quant_algo"] == "NVFP4"
    drafter = AutoConfig.from_pretrained(tiny / "dflash-26b-a4b")
    assert drafter.model_type == "qwen3" and drafter.dflash_config["target_layer_ids"] == [1, 3, 5, 7, 9]
