"""tests/gpu/models/lm_files.py: the stdlib corpus, the trained tokenizer and the Gemma 4
processor files, loaded for real by transformers 5.13 (the test venv) and 5.17.

The processor loads run in subprocesses: Gemma4Processor needs Pillow and
torchvision, which the test venv does not carry, and 5.17 needs a newer
``tokenizers`` than the venv's. Both are ``pip install --no-deps --target``-ed
once into the launcher's cache (``<cache>/pip-targets/``) and put on the
subprocess's PYTHONPATH.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.unit.gpu_scripts import pip_target as _pip_target, transformers_517 as _transformers_517

GPU_DIR = Path(__file__).resolve().parents[1] / "gpu"
sys.path.insert(0, str(GPU_DIR))

import lm_files as lm  # noqa: E402


# tests/gpu/models/make_checkpoints.py's vision tower.
VISION = {"model_type": "gemma4_vision", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
          "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 32, "patch_size": 16,
          "pooling_kernel_size": 3, "position_embedding_size": 1024}
SMALL_VOCAB = 1024

# A fixed subset of the running interpreter's stdlib (those present are copied).
STDLIB_SUBSET = [
    "abc.py", "argparse.py", "base64.py", "bisect.py", "calendar.py", "collections/__init__.py", "colorsys.py",
    "contextlib.py", "copy.py", "csv.py", "dataclasses.py", "difflib.py", "enum.py", "fnmatch.py", "fractions.py",
    "functools.py", "glob.py", "heapq.py", "json/__init__.py", "json/decoder.py", "json/encoder.py", "keyword.py",
    "numbers.py", "operator.py", "pprint.py", "queue.py", "random.py", "shlex.py", "statistics.py", "string.py",
    "textwrap.py", "tokenize.py", "types.py", "uuid.py", "warnings.py", "weakref.py",
]
# Files collect_corpus must leave out, written beside the copied subset.
EXCLUDED = {
    "test/test_abc.py": "x = 1\n",
    "unittest/test/test_case.py": "x = 1\n",
    "tkinter/tests/test_misc.py": "x = 1\n",
    "site-packages/pkg/mod.py": "x = 1\n",
    "idlelib/editor.py": "x = 1\n",
    "lib2to3/main.py": "x = 1\n",
    "ensurepip/_bundled/pip.py": "x = 1\n",
}
NOT_UTF8 = "latin1_module.py"


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def stdlib_subset(tmp_path_factory) -> Path:
    real = Path(lm._stdlib_dir())
    root = tmp_path_factory.mktemp("stdlib")
    copied = 0
    for rel in STDLIB_SUBSET:
        if (real / rel).is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(real / rel, root / rel)
            copied += 1
    assert copied >= 25, f"only {copied} of the subset exist under {real}"
    for rel, text in EXCLUDED.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / NOT_UTF8).write_bytes(b"s = '\xe9t\xe9'\n")
    (root / "ensurepip").joinpath("__init__.py").write_text("x = 2\n")  # kept: only _bundled is data
    return root


@pytest.fixture(scope="module")
def corpus(stdlib_subset) -> dict:
    return lm.collect_corpus(stdlib_subset)


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return lm.train_tokenizer([text for _, text in corpus["train"]], vocab_size=SMALL_VOCAB)


@pytest.fixture(scope="module")
def lm_dir(tokenizer, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lm")
    written = lm.write_lm_files(tokenizer, out, VISION)
    assert sorted(written) == sorted(p.name for p in out.iterdir())
    return out


# ------------------------------------------------------------------ corpus


def test_corpus_excludes_non_library_trees_and_non_utf8(corpus, stdlib_subset):
    names = [rel for rel, _ in corpus["train"] + corpus["heldout"]]
    assert not set(EXCLUDED) & set(names)
    assert NOT_UTF8 not in names
    assert "ensurepip/__init__.py" in names
    expected = sorted(rel for rel in STDLIB_SUBSET if (stdlib_subset / rel).is_file()) + ["ensurepip/__init__.py"]
    assert sorted(names) == sorted(expected)
    assert corpus["stdlib"] == str(stdlib_subset)
    assert corpus["python"] == "%d.%d.%d" % sys.version_info[:3]
    for part in ("train", "heldout"):
        rels = [rel for rel, _ in corpus[part]]
        assert rels == sorted(rels)
        assert corpus["files"][part] == len(rels)
        assert corpus["bytes"][part] == sum(len(t.encode()) for _, t in corpus[part])


def test_corpus_split_is_deterministic_and_disjoint(corpus, stdlib_subset):
    again = lm.collect_corpus(stdlib_subset)
    assert again == corpus
    train = {rel for rel, _ in corpus["train"]}
    heldout = {rel for rel, _ in corpus["heldout"]}
    assert train and heldout and not train & heldout
    for rel in train | heldout:
        first_byte = hashlib.sha256(rel.encode()).digest()[0]
        assert (rel in heldout) == (first_byte % 10 == 0)
    # heldout_every changes the split, not the content hash
    other = lm.collect_corpus(stdlib_subset, heldout_every=2)
    assert other["sha256"] == corpus["sha256"]
    assert {rel for rel, _ in other["heldout"]} != heldout
    assert len(other["heldout"]) > len(heldout)


def test_corpus_of_the_real_stdlib():
    c = lm.collect_corpus()
    assert c["files"]["train"] > 300 and c["files"]["heldout"] > 20
    for rel, _ in c["train"] + c["heldout"]:
        parts = rel.split("/")
        assert not {"test", "tests", "idlelib", "lib2to3", "site-packages"} & set(parts[:-1]), rel
        assert not rel.startswith("ensurepip/_bundled/"), rel
    assert 0.05 < c["files"]["heldout"] / (c["files"]["train"] + c["files"]["heldout"]) < 0.2


# --------------------------------------------------------------- tokenizer


def test_constants_agree():
    assert lm.VOCAB_SIZE == 8192
    ids = sorted(lm.SPECIAL_TOKENS.values())
    assert ids == list(range(len(ids)))
    assert (lm.SPECIAL_TOKENS["<pad>"], lm.SPECIAL_TOKENS["<eos>"], lm.SPECIAL_TOKENS["<bos>"],
            lm.SPECIAL_TOKENS["<unk>"]) == (0, 1, 2, 3)
    for key in ("image_token_id", "boi_token_id", "eoi_token_id", "video_token_id", "audio_token_id",
                "boa_token_id", "eoa_token_index", "pad_token_id", "eos_token_id", "bos_token_id", "mask_token_id"):
        assert lm.CONFIG_IDS[key] in ids, key
    assert len(set(lm.CONFIG_IDS.values())) == len(lm.CONFIG_IDS)
    assert lm.VISION_CONFIG_EXTRA == {"default_output_length": lm.MAX_SOFT_TOKENS}


def test_tokenizer_size_and_special_ids(tokenizer):
    assert tokenizer.get_vocab_size(with_added_tokens=True) == SMALL_VOCAB
    for token, want in lm.SPECIAL_TOKENS.items():
        assert tokenizer.token_to_id(token) == want
        assert tokenizer.encode(token).ids == [want], token
        ids = tokenizer.encode(f"x = 1{token}y = 2").ids
        assert ids.count(want) == 1, token


def test_training_is_deterministic(corpus, tokenizer, tmp_path):
    again = lm.train_tokenizer([text for _, text in corpus["train"]], vocab_size=SMALL_VOCAB)
    assert again.to_str() == tokenizer.to_str()
    # and in another process (the trainer's hash maps are seeded per process)
    (tmp_path / "texts.json").write_text(json.dumps([text for _, text in corpus["train"]]))
    script = ("import json, sys; sys.path.insert(0, sys.argv[1]); import gpu_paths, lm_files; "
              "texts = json.load(open(sys.argv[2])); "
              "print(lm_files.train_tokenizer(texts, int(sys.argv[3])).to_str())")
    proc = subprocess.run([sys.executable, "-c", script, str(GPU_DIR), str(tmp_path / "texts.json"), str(SMALL_VOCAB)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == tokenizer.to_str()


def test_round_trip_on_library_text(corpus, tokenizer):
    for rel, text in (corpus["heldout"] or corpus["train"])[:3] + corpus["train"][:2]:
        ids = tokenizer.encode(text).ids
        assert tokenizer.decode(ids, skip_special_tokens=False) == text, rel
        assert len(ids) < len(text.encode()) / 1.5, rel  # it does compress
    odd = "caf\u00e9 \u2603 \U0001F600\ttabs\r\n  <|turn> <|image|>\x00"
    assert tokenizer.decode(tokenizer.encode(odd).ids, skip_special_tokens=False) == odd


def test_small_corpus_cannot_fill_the_vocab():
    with pytest.raises(ValueError, match="trained vocabulary has"):
        lm.train_tokenizer(["a b c"], vocab_size=2048)


# ------------------------------------------------------------------- files


def test_written_files(lm_dir):
    names = {p.name for p in lm_dir.iterdir()}
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "processor_config.json"} <= names
    cfg = json.loads((lm_dir / "tokenizer_config.json").read_text())
    for attr in ("image_token", "boi_token", "eoi_token", "audio_token", "boa_token", "eoa_token", "bos_token",
                 "eos_token", "pad_token", "unk_token", "mask_token", "sot_token", "eot_token"):
        assert cfg[attr] in lm.SPECIAL_TOKENS, attr
    assert cfg["model_max_length"] == lm.MODEL_MAX_LENGTH
    proc = json.loads((lm_dir / "processor_config.json").read_text())
    assert proc["processor_class"] == "Gemma4Processor"
    image = proc["image_processor"]
    assert (image["patch_size"], image["pooling_kernel_size"]) == (VISION["patch_size"], VISION["pooling_kernel_size"])
    assert image["max_soft_tokens"] == lm.MAX_SOFT_TOKENS == proc["image_seq_length"]


def test_write_refuses_a_tokenizer_without_the_special_ids(tmp_path):
    from tokenizers import Tokenizer, models

    with pytest.raises(ValueError, match="<pad>"):
        lm.write_lm_files(Tokenizer(models.BPE()), tmp_path, VISION)


# ------------------------------------------- transformers loads (subprocess)

def _vision_deps() -> list[Path]:
    """Pillow and torchvision for the venv's torch, where the venv lacks them."""
    missing = []
    if importlib.util.find_spec("PIL") is None:
        missing.append("pillow>=10.0.1,<=15.0")
    if importlib.util.find_spec("torchvision") is None:
        import torch

        major, minor = (int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
        assert major == 2, torch.__version__
        missing.append(f"torchvision==0.{minor + 15}.*")  # torch 2.13 <-> torchvision 0.28
    return [_pip_target("gemma4-vision-deps", missing)] if missing else []


# Runs in a subprocess: loads the files with whatever transformers is first on
# sys.path and reports what the processor did, as JSON on the last line.
def checker_argv(lm_dir, specials: dict) -> list[str]:
    """The command line that runs CHECKER on ``lm_dir`` (it imports torchvision_cpu from this folder)."""
    return [sys.executable, "-c", CHECKER, str(lm_dir), json.dumps(specials), str(Path(__file__).parent)]


CHECKER = textwrap.dedent(r'''
    import json, sys, types

    lm_dir, specials = sys.argv[1], json.loads(sys.argv[2])

    sys.path.insert(0, sys.argv[3])
    from torchvision_cpu import torchvision_without_ops

    res = {"torchvision_ops_stubbed": torchvision_without_ops()}
    import numpy as np
    import tokenizers
    import transformers
    from PIL import Image
    from transformers import AutoProcessor, AutoTokenizer
    from transformers.models.gemma4 import image_processing_gemma4

    res["transformers"] = transformers.__version__
    res["transformers_file"] = transformers.__file__
    res["tokenizers"] = tokenizers.__version__
    res["supported_soft_tokens"] = list(image_processing_gemma4._SUPPORTED_SOFT_TOKENS)

    tok = AutoTokenizer.from_pretrained(lm_dir)
    res["tokenizer_class"] = type(tok).__name__
    res["len_tokenizer"] = len(tok)
    res["token_ids"] = {t: tok.convert_tokens_to_ids(t) for t in specials}
    res["single_token"] = {t: tok.encode(t, add_special_tokens=False) for t in specials}
    sample = "def f(x):\n    return x + 1  # caf\u00e9\n"
    ids = tok.encode(sample)
    res["sample_round_trip"] = tok.decode(ids) == sample
    res["sample_first_id"] = ids[0]
    res["tok_attrs"] = {a: getattr(tok, a, None) for a in (
        "bos_token", "eos_token", "pad_token", "unk_token", "mask_token", "image_token", "boi_token",
        "eoi_token", "audio_token", "boa_token", "eoa_token", "model_max_length", "padding_side")}
    text_only = [{"role": "system", "content": "Be brief."},
                 {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                 {"role": "user", "content": "Again"}]
    res["tokenizer_chat"] = tok.apply_chat_template(text_only, add_generation_prompt=True, tokenize=False)

    proc = AutoProcessor.from_pretrained(lm_dir)
    res["processor_class"] = type(proc).__name__
    res["image_processor_class"] = type(proc.image_processor).__name__
    res["video_processor_class"] = type(proc.video_processor).__name__
    res["feature_extractor_class"] = type(proc.feature_extractor).__name__
    ip = proc.image_processor
    res["image_processor"] = {"max_soft_tokens": ip.max_soft_tokens, "patch_size": ip.patch_size,
                              "pooling_kernel_size": ip.pooling_kernel_size, "size": ip.size}
    # what vLLM's gemma4_mm reads off the processor
    res["processor_attrs"] = {a: getattr(proc, a) for a in (
        "image_token", "image_token_id", "boi_token", "eoi_token", "video_token", "video_token_id",
        "audio_token", "audio_token_id", "boa_token", "eoa_token", "image_seq_length", "audio_seq_length",
        "audio_ms_per_token")}
    res["feature_extractor"] = {"sampling_rate": proc.feature_extractor.sampling_rate,
                                "fft_length": proc.feature_extractor.fft_length}
    # vLLM's way (transformers_utils/processor.py): the class's from_pretrained, with its own tokenizer
    from transformers import Gemma4Processor
    direct = Gemma4Processor.from_pretrained(lm_dir, tokenizer=tok)
    res["direct"] = {"image_token_id": direct.image_token_id, "video_token_id": direct.video_token_id,
                     "audio_token_id": direct.audio_token_id, "len_tokenizer": len(tok),
                     "max_soft_tokens": direct.image_processor.max_soft_tokens}
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}]
    chat = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    res["chat"] = chat
    res["images"] = []
    for h, w in [(200, 300), (64, 64), (480, 640), (100, 1000), (1024, 96)]:
        img = Image.fromarray((np.arange(h * w * 3) % 251).astype("uint8").reshape(h, w, 3))
        out = proc(text=chat, images=img, return_tensors="pt")
        input_ids = out["input_ids"][0].tolist()
        # vLLM encodes chat prompts without special tokens (the template writes <bos>)
        plain = proc.tokenizer(chat, add_special_tokens=False)["input_ids"]
        alone = ip(img, return_tensors="pt")
        first = input_ids.index(proc.image_token_id)
        count = input_ids.count(proc.image_token_id)
        res["images"].append({
            "size": [h, w],
            "image_tokens": count,
            "num_soft_tokens": int(alone["num_soft_tokens_per_image"][0]),
            "num_image_tokens": proc._get_num_multimodal_tokens(image_sizes=[[h, w]])["num_image_tokens"][0],
            "wrapped": input_ids[first - 1] == specials["<|image>"]
                       and input_ids[first + count] == specials["<image|>"]
                       and input_ids[first:first + count] == [proc.image_token_id] * count,
            "pixel_values": list(out["pixel_values"].shape),
            "position_ids": list(out["image_position_ids"].shape),
            "unexpanded_image_tokens": plain.count(proc.image_token_id),
            "first_ids": input_ids[:3],
        })
    print(json.dumps(res))
''')


def _check(lm_dir: Path, extra_paths: list[Path]) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(p) for p in extra_paths] + ([env["PYTHONPATH"]]
                                                                         if env.get("PYTHONPATH") else []))
    env.setdefault("HF_HUB_OFFLINE", "1")
    env["TOKENIZERS_PARALLELISM"] = "false"
    proc = subprocess.run(checker_argv(lm_dir, lm.SPECIAL_TOKENS),
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def loaded(lm_dir):
    results = {}

    def get(version: str) -> dict:
        if version not in results:
            paths = ([_transformers_517()] if version == "5.17.0" else []) + _vision_deps()
            results[version] = _check(lm_dir, paths)
        return results[version]

    return get


def _assert_loaded(res: dict) -> None:
    assert res["processor_class"] == "Gemma4Processor"
    assert res["image_processor_class"] == "Gemma4ImageProcessor"
    assert res["video_processor_class"] == "Gemma4VideoProcessor"
    assert res["feature_extractor_class"] == "Gemma4AudioFeatureExtractor"
    # MAX_SOFT_TOKENS is the smallest value the image processor accepts
    assert lm.MAX_SOFT_TOKENS == min(res["supported_soft_tokens"])
    assert res["image_processor"]["max_soft_tokens"] == lm.MAX_SOFT_TOKENS
    assert (res["image_processor"]["patch_size"], res["image_processor"]["pooling_kernel_size"]) == (16, 3)

    assert res["len_tokenizer"] == SMALL_VOCAB
    assert res["token_ids"] == lm.SPECIAL_TOKENS
    assert res["single_token"] == {t: [i] for t, i in lm.SPECIAL_TOKENS.items()}
    assert res["sample_round_trip"]
    assert res["sample_first_id"] != lm.CONFIG_IDS["bos_token_id"]  # bos comes from the chat template
    attrs = res["tok_attrs"]
    assert (attrs["bos_token"], attrs["eos_token"], attrs["pad_token"], attrs["unk_token"]) == \
        ("<bos>", "<eos>", "<pad>", "<unk>")
    assert (attrs["image_token"], attrs["boi_token"], attrs["eoi_token"]) == ("<|image|>", "<|image>", "<image|>")
    assert (attrs["audio_token"], attrs["boa_token"], attrs["eoa_token"]) == ("<|audio|>", "<|audio>", "<audio|>")
    assert attrs["model_max_length"] == lm.MODEL_MAX_LENGTH
    assert res["tokenizer_chat"] == ("<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n"
                                     "<|turn>model\nHello.<turn|>\n<|turn>user\nAgain<turn|>\n<|turn>model\n")

    p = res["processor_attrs"]
    ids = lm.CONFIG_IDS
    assert (p["image_token_id"], p["video_token_id"], p["audio_token_id"]) == \
        (ids["image_token_id"], ids["video_token_id"], ids["audio_token_id"])
    assert (p["image_token"], p["video_token"], p["boi_token"], p["eoi_token"]) == \
        ("<|image|>", "<|video|>", "<|image>", "<image|>")
    assert p["image_seq_length"] == lm.MAX_SOFT_TOKENS
    assert res["feature_extractor"] == {"sampling_rate": 16000, "fft_length": 512}
    assert res["direct"] == {"image_token_id": ids["image_token_id"], "video_token_id": ids["video_token_id"],
                             "audio_token_id": ids["audio_token_id"], "len_tokenizer": SMALL_VOCAB,
                             "max_soft_tokens": lm.MAX_SOFT_TOKENS}

    assert res["chat"] == "<bos><|turn>user\n\n\n<|image|>\n\nWhat is this?<turn|>\n<|turn>model\n"
    for img in res["images"]:
        assert img["image_tokens"] == img["num_soft_tokens"] == img["num_image_tokens"], img
        assert 0 < img["image_tokens"] <= lm.MAX_SOFT_TOKENS, img
        assert img["wrapped"], img
        assert img["unexpanded_image_tokens"] == 1, img
        assert img["pixel_values"] == [1, lm.MAX_SOFT_TOKENS * 9, 16 * 16 * 3], img
        assert img["position_ids"] == [1, lm.MAX_SOFT_TOKENS * 9, 2], img


@pytest.mark.network
def test_loads_under_the_installed_transformers(loaded):
    import transformers

    res = loaded("installed")
    assert res["transformers"] == transformers.__version__
    _assert_loaded(res)


@pytest.mark.network
def test_loads_under_transformers_5_17(loaded):
    res = loaded("5.17.0")
    assert res["transformers"] == "5.17.0", res["transformers_file"]
    assert res["tokenizers"].startswith("0.23."), res["tokenizers"]
    _assert_loaded(res)


def _vllm_num_soft_tokens(version: str):
    """vLLM's own Gemma4ProcessingInfo._compute_num_soft_tokens, taken from the release's
    gemma4_mm.py and run against a stand-in config (no vLLM import)."""
    from launcher import pypi

    path = pypi.unpacked("vllm", version, "site-packages") / "vllm/model_executor/models/gemma4_mm.py"
    module = ast.parse(path.read_text())
    info = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "Gemma4ProcessingInfo")
    fn = next(n for n in info.body if isinstance(n, ast.FunctionDef) and n.name == "_compute_num_soft_tokens")
    namespace = {"math": math}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), namespace)
    vision = SimpleNamespace(**VISION, **lm.VISION_CONFIG_EXTRA)
    this = SimpleNamespace(get_hf_config=lambda: SimpleNamespace(vision_config=vision))
    return lambda w, h: namespace["_compute_num_soft_tokens"](this, image_width=w, image_height=h)


@pytest.mark.network
@pytest.mark.parametrize("vllm_version", ["0.21.0", "0.33.0"])
def test_vllm_placeholder_count_matches_the_processor(loaded, vllm_version):
    """vLLM expands each <|image|> to boi + N x image + eoi with N from the vision config's
    default_output_length; the HF processor's expansion must agree or vLLM rejects the prompt."""
    count = _vllm_num_soft_tokens(vllm_version)
    for img in loaded("installed")["images"]:
        h, w = img["size"]
        assert count(w, h) == img["image_tokens"], img
