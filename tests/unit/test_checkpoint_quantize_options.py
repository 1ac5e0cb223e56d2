"""The light half of ``launcher quantize``: option validation, calibration data, exclusions.

None of this imports torch or nvidia-modelopt; the real quantization runs in
tests/integration/test_quantize.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.errors import LauncherError
from launcher.quantize import calibration
from launcher.quantize.config import QuantizeConfig
from launcher.quantize.exclusions import KEEP_UNQUANTIZED, build_quant_config, disabled_patterns

REPO = Path(__file__).resolve().parents[2]


def model_dir(tmp_path: Path, model_type: str = "gemma4") -> Path:
    root = tmp_path / "model"
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": model_type, "architectures": ["X"]}))
    return root


def cfg(tmp_path: Path, **kw) -> QuantizeConfig:
    if "model" not in kw:
        kw["model"] = model_dir(tmp_path)
    kw.setdefault("out", tmp_path / "out")
    return QuantizeConfig(**kw)


def test_valid_options_pass(tmp_path):
    cfg(tmp_path).validate()


def test_empty_out_dir_is_accepted(tmp_path):
    (tmp_path / "out").mkdir()
    cfg(tmp_path).validate()


def test_non_empty_out_refused_without_force(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(LauncherError) as exc:
        cfg(tmp_path).validate()
    assert "is not empty" in exc.value.message and "--force" in exc.value.hint
    cfg(tmp_path, model=tmp_path / "model", force=True).validate()
    assert (out / "keep.txt").read_text() == "x"


def test_out_equal_to_or_inside_model_refused(tmp_path):
    model = model_dir(tmp_path)
    with pytest.raises(LauncherError, match="must differ"):
        QuantizeConfig(model=model, out=model).validate()
    with pytest.raises(LauncherError, match="lies inside"):
        QuantizeConfig(model=model, out=model / "nvfp4").validate()


def test_missing_model_and_config(tmp_path):
    with pytest.raises(LauncherError, match="is not a directory"):
        QuantizeConfig(model=tmp_path / "none", out=tmp_path / "out").validate()
    (tmp_path / "empty").mkdir()
    with pytest.raises(LauncherError, match="has no config.json"):
        QuantizeConfig(model=tmp_path / "empty", out=tmp_path / "out").validate()


def test_out_parent_missing(tmp_path):
    with pytest.raises(LauncherError, match="does not exist"):
        cfg(tmp_path, out=tmp_path / "a" / "b").validate()


def test_awq_lite_refused_for_gemma4_before_loading(tmp_path):
    with pytest.raises(LauncherError) as exc:
        cfg(tmp_path, algorithm="nvfp4-awq-lite").validate()
    assert "QuantGemma4TextExperts" in exc.value.message and "--algorithm nvfp4" in exc.value.hint


def test_awq_lite_allowed_for_other_models_on_cuda_only(tmp_path):
    llama = model_dir(tmp_path, "llama")
    cfg(tmp_path, model=llama, algorithm="nvfp4-awq-lite", device="cuda").validate()
    with pytest.raises(LauncherError, match="needs a CUDA device"):
        cfg(tmp_path, model=llama, algorithm="nvfp4-awq-lite", device="cpu").validate()


@pytest.mark.parametrize(
    "kw, text",
    [
        ({"algorithm": "int8"}, "unknown --algorithm"),
        ({"device": "tpu"}, "unknown --device"),
        ({"calib_samples": 0}, "--calib-samples"),
        ({"calib_seq_len": 2}, "--calib-seq-len"),
        ({"calib_file": Path("/nonexistent/calib.txt")}, "--calib-file"),
    ],
)
def test_bad_options(tmp_path, kw, text):
    with pytest.raises(LauncherError, match=text):
        cfg(tmp_path, **kw).validate()


def test_calib_file_needs_a_tokenizer(tmp_path):
    calib = tmp_path / "calib.txt"
    calib.write_text("some text")
    with pytest.raises(LauncherError, match="needs the model's tokenizer"):
        cfg(tmp_path, calib_file=calib).validate()
    (tmp_path / "model" / "tokenizer.json").write_text("{}")
    cfg(tmp_path, model=tmp_path / "model", calib_file=calib).validate()


def test_random_batches_avoid_multimodal_token_ids():
    config = {"image_token_id": 5, "boi_token_id": 6, "eos_token_id": 1, "text_config": {"audio_token_id": 7}}
    reserved = calibration.reserved_token_ids(config)
    assert reserved == {5, 6, 7}
    batches = calibration.random_token_batches(10, reserved, samples=3, seq_len=50, seed=1)
    assert len(batches) == 3 and all(len(b) == 50 for b in batches)
    assert not reserved & {t for b in batches for t in b}
    assert batches == calibration.random_token_batches(10, reserved, samples=3, seq_len=50, seed=1)


def test_text_batches_cycle_a_short_stream():
    batches = calibration.text_token_batches(lambda t: [ord(c) for c in t], ["abc", "de"], samples=4, seq_len=3)
    assert batches == [[97, 98, 99], [100, 101, 97], [98, 99, 100], [101, 97, 98]]
    short = calibration.text_token_batches(lambda t: [1, 2], ["x"], samples=2, seq_len=8)
    assert short == [[1, 2], [1, 2]]
    with pytest.raises(ValueError):
        calibration.text_token_batches(lambda t: [], ["x"], samples=1, seq_len=8)


def test_calib_file_formats(tmp_path):
    txt = tmp_path / "c.txt"
    txt.write_text("first paragraph\nstill first\n\nsecond\n\n\n")
    assert calibration.read_calib_file(txt) == ["first paragraph\nstill first", "second"]
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text('{"text": "a"}\n\n{"text": "b"}\n')
    assert calibration.read_calib_file(jsonl) == ["a", "b"]
    jsonl.write_text('{"text": "a"}\n{"prompt": "b"}\n')
    with pytest.raises(ValueError, match=r"c.jsonl:2"):
        calibration.read_calib_file(jsonl)
    (tmp_path / "e.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="no calibration text"):
        calibration.read_calib_file(tmp_path / "e.txt")


def test_builtin_texts_are_varied():
    assert len(calibration.BUILTIN_TEXTS) >= 16
    assert len(set(calibration.BUILTIN_TEXTS)) == len(calibration.BUILTIN_TEXTS)


def test_exclusions_added_to_list_layout_without_mutating_base():
    base = {"quant_cfg": [{"quantizer_name": "*", "enable": False},
                          {"quantizer_name": "*weight_quantizer", "cfg": {"num_bits": 4}},
                          {"quantizer_name": "*lm_head*", "enable": False},
                          {"quantizer_name": "*", "parent_class": "nn.Embedding", "enable": False}],
            "algorithm": "max"}
    snapshot = json.dumps(base)
    built, added = build_quant_config(base)
    assert json.dumps(base) == snapshot
    assert "*lm_head*" not in added and "*router*" in added and "*audio_tower*" in added
    assert set(KEEP_UNQUANTIZED) <= disabled_patterns(built["quant_cfg"])
    # appended last, so they override earlier enables
    assert built["quant_cfg"][-1] == {"quantizer_name": KEEP_UNQUANTIZED[-1], "enable": False}


def test_exclusions_added_to_dict_layout():
    built, added = build_quant_config({"quant_cfg": {"*weight_quantizer": {"num_bits": 4}, "*router*": {"enable": False}}})
    assert "*router*" not in added
    assert set(KEEP_UNQUANTIZED) <= disabled_patterns(built["quant_cfg"])


def _gemma4_dir(root: Path, text: dict, tensors: dict | None = None) -> Path:
    from tests.unit.test_checkpoint import write_safetensors

    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"model_type": "gemma4", "text_config": text}))
    if tensors:
        write_safetensors(root / "model.safetensors", tensors)
    return root


TEXT = {"head_dim": 256, "num_attention_heads": 2, "layer_types": ["sliding_attention", "full_attention"]}


def test_global_head_dim_written_back_from_the_source_config(tmp_path):
    from launcher.quantize.pipeline import restore_global_head_dim

    src = _gemma4_dir(tmp_path / "src", {**TEXT, "global_head_dim": 384})
    out = _gemma4_dir(tmp_path / "out", {**TEXT, "per_layer_config": {"1": {"head_dim": 384}}})
    assert restore_global_head_dim(src, out) == 384
    written = json.loads((out / "config.json").read_text())["text_config"]
    assert written["global_head_dim"] == 384 and written["per_layer_config"] == {"1": {"head_dim": 384}}


def test_global_head_dim_derived_from_source_weights(tmp_path):
    from launcher.quantize.pipeline import restore_global_head_dim

    tensors = {"model.language_model.layers.1.self_attn.q_proj.weight": ("BF16", [2 * 320, 64])}
    src = _gemma4_dir(tmp_path / "src", dict(TEXT), tensors)
    out = _gemma4_dir(tmp_path / "out", dict(TEXT))
    assert restore_global_head_dim(src, out) == 320
    assert json.loads((out / "config.json").read_text())["text_config"]["global_head_dim"] == 320


def test_global_head_dim_left_alone_when_present(tmp_path):
    from launcher.quantize.pipeline import restore_global_head_dim

    src = _gemma4_dir(tmp_path / "src", {**TEXT, "global_head_dim": 512})
    out = _gemma4_dir(tmp_path / "out", {**TEXT, "global_head_dim": 512})
    before = (out / "config.json").read_bytes()
    assert restore_global_head_dim(src, out) is None
    assert (out / "config.json").read_bytes() == before


def test_out_containing_model_refused_before_anything_loads(tmp_path, monkeypatch):
    """Issue 28.2: --out M/parent with --model M/parent/model --force renamed the parent away and deleted it."""
    from launcher.quantize import pipeline

    parent = tmp_path / "models" / "parent"
    parent.mkdir(parents=True)
    model = model_dir(parent)
    sibling = parent / "sibling-model"
    sibling.mkdir()
    (sibling / "config.json").write_text("{}")

    def must_not_load():
        raise AssertionError("the heavy stack was imported before the overlap was refused")

    monkeypatch.setattr(pipeline, "import_stack", must_not_load)
    for out in (parent, tmp_path / "models", tmp_path):
        with pytest.raises(LauncherError, match="contains --model"):
            pipeline.run(QuantizeConfig(model=model, out=out, force=True), echo=lambda _msg: None)
    # A symlinked --out that resolves to the parent is the same overlap.
    (tmp_path / "link").symlink_to(parent)
    with pytest.raises(LauncherError, match="contains --model"):
        QuantizeConfig(model=model, out=tmp_path / "link", force=True).validate()
    assert (model / "config.json").is_file() and (sibling / "config.json").is_file()


@pytest.mark.parametrize("link", ["file", "folder"])
def test_force_refused_when_the_model_links_into_out(link, tmp_path):
    """Issue 55.11: publishing replaces --out, which held the model's real weights (a Hub snapshot's layout)."""
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    weights = out / "sub" / "model.safetensors"
    weights.write_bytes(b"bf16 weights")
    model = model_dir(tmp_path)
    if link == "file":
        (model / "model.safetensors").symlink_to(weights)
    else:
        (model / "shards").symlink_to(out / "sub", target_is_directory=True)
    with pytest.raises(LauncherError, match="links into --out") as exc:
        cfg(tmp_path, model=model, force=True).validate()
    assert ("model.safetensors" if link == "file" else "shards") in exc.value.message
    assert weights.read_bytes() == b"bf16 weights"


def test_force_allowed_when_the_model_links_elsewhere(tmp_path):
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    (blobs / "w").write_bytes(b"x")
    model = model_dir(tmp_path)
    (model / "model.safetensors").symlink_to(blobs / "w")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old.txt").write_text("old")
    cfg(tmp_path, model=model, force=True).validate()


def _dead_pid() -> int:
    """The pid of a real process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_leftovers_of_killed_runs_are_removed_or_put_back(tmp_path):
    """Issue 55.9: SIGKILL during export left a checkpoint-sized .<out>.partial-<pid> no later run removed.

    The run here stops at the source check (config only, no weights), after the clean-up.
    """
    model = model_dir(tmp_path)
    out = tmp_path / "out"
    dead, live = _dead_pid(), os.getpid()
    partial = tmp_path / f".out.partial-{dead}"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"x" * 4096)
    busy = tmp_path / f".out.partial-{live}"  # a run still going: not ours to remove
    busy.mkdir()
    old = tmp_path / f".out.old-{dead}"  # killed between publishing's two renames: the only copy
    old.mkdir()
    (old / "config.json").write_text("{}")
    res = subprocess.run([sys.executable, "-m", "launcher", "quantize", "--model", str(model), "--out", str(out)],
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and "would not load" in res.stderr, res.stdout + res.stderr
    assert not partial.exists() and busy.is_dir() and not old.exists()
    assert (out / "config.json").read_text() == "{}"
    assert f"removed .out.partial-{dead}, left by a killed quantize run" in res.stdout
    assert f"put back {out} from .out.old-{dead}" in res.stdout


def test_a_config_nested_deep_is_one_error_not_a_traceback(tmp_path):
    """Issue 55.8: RecursionError from any JSON read without its own check ends as one line (the CLI's net)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    res = subprocess.run([sys.executable, "-m", "launcher", "quantize", "--model", str(model),
                          "--out", str(tmp_path / "out")], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert "nested too deep" in res.stderr
