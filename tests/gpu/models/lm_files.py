"""A real tokenizer and Gemma 4 processor files for the small trained target.

The GPU proof trains a small ``Gemma4ForConditionalGeneration`` on text, and
vLLM serves it with its Gemma 4 multimodal processor, so the checkpoint needs
what a released Gemma 4 checkpoint ships besides weights:

* ``tokenizer.json``: a byte-level BPE trained here (``tokenizers``) on the
  CPython standard library, with Gemma 4's special-token *strings*
  (``<|turn>``, ``<|image|>``, ...) at small fixed ids at the start of the
  vocabulary (the released ids, ~256k-258k, would need a real-sized
  embedding table);
* ``tokenizer_config.json`` with the extra special-token attributes that
  ``Gemma4Processor.__init__`` reads (``image_token``, ``boi_token``, ...);
* ``chat_template.jinja``: Gemma 4 turns (``<|turn>user`` ... ``<turn|>``);
* ``processor_config.json`` laid out like the released one: the image
  processor, video processor and audio feature extractor as nested blocks,
  which transformers 5.13 and 5.17 both read.

The corpus (``collect_corpus``) is the running interpreter's standard
library, split deterministically into train and held-out files.

Only the standard library and ``tokenizers`` are imported at module level, so
the file can be copied to a host without this repository.
"""

from __future__ import annotations

import hashlib
import json
import sys
import sysconfig
from pathlib import Path
from typing import Iterable

VOCAB_SIZE: int = 8192

# Token string -> id, at the start of the vocabulary. pad/eos/bos/unk keep the
# released Gemma ids 0..3 and <mask> follows at 4; the rest are the released
# Gemma 4 strings at our own small ids. "<mask>" doubles as the DFlash
# parallel-drafting mask token (tests/integration/series_0_21_0_probe.py gives
# a Gemma 4 drafter mask_token_id 4 as well).
SPECIAL_TOKENS: dict[str, int] = {
    "<pad>": 0,
    "<eos>": 1,
    "<bos>": 2,
    "<unk>": 3,
    "<mask>": 4,
    "<|turn>": 5,  # start of turn
    "<turn|>": 6,  # end of turn
    "<|image>": 7,  # boi
    "<image|>": 8,  # eoi
    "<|image|>": 9,  # image soft token
    "<|video|>": 10,  # video soft token
    "<|audio>": 11,  # boa
    "<audio|>": 12,  # eoa
    "<|audio|>": 13,  # audio soft token
    "<|channel>": 14,
    "<channel|>": 15,
    "<|think|>": 16,
    "<|tool>": 17,
    "<tool|>": 18,
    "<|tool_call>": 19,
    "<tool_call|>": 20,
    "<|tool_response>": 21,
    "<tool_response|>": 22,
    '<|"|>': 23,
}

# tokenizer_config.json attribute -> token string (the released Gemma 4 names).
_TOKEN_ATTRIBUTES: dict[str, str] = {
    "pad_token": "<pad>",
    "eos_token": "<eos>",
    "bos_token": "<bos>",
    "unk_token": "<unk>",
    "mask_token": "<mask>",
    "sot_token": "<|turn>",
    "eot_token": "<turn|>",
    "boi_token": "<|image>",
    "eoi_token": "<image|>",
    "image_token": "<|image|>",
    "boa_token": "<|audio>",
    "eoa_token": "<audio|>",
    "audio_token": "<|audio|>",
    "soc_token": "<|channel>",
    "eoc_token": "<channel|>",
    "think_token": "<|think|>",
    "std_token": "<|tool>",
    "etd_token": "<tool|>",
    "stc_token": "<|tool_call>",
    "etc_token": "<tool_call|>",
    "str_token": "<|tool_response>",
    "etr_token": "<tool_response|>",
    "escape_token": '<|"|>',
}

CONFIG_IDS: dict[str, int] = {
    "image_token_id": SPECIAL_TOKENS["<|image|>"],
    "boi_token_id": SPECIAL_TOKENS["<|image>"],
    "eoi_token_id": SPECIAL_TOKENS["<image|>"],
    "video_token_id": SPECIAL_TOKENS["<|video|>"],
    "audio_token_id": SPECIAL_TOKENS["<|audio|>"],
    "boa_token_id": SPECIAL_TOKENS["<|audio>"],
    "eoa_token_index": SPECIAL_TOKENS["<audio|>"],
    "pad_token_id": SPECIAL_TOKENS["<pad>"],
    "eos_token_id": SPECIAL_TOKENS["<eos>"],
    "bos_token_id": SPECIAL_TOKENS["<bos>"],
    "mask_token_id": SPECIAL_TOKENS["<mask>"],
}
# End of a model turn: generation should stop on it as well as on <eos>.
END_OF_TURN_ID: int = SPECIAL_TOKENS["<turn|>"]

# transformers' Gemma4ImageProcessor / Gemma4VideoProcessor accept only
# _SUPPORTED_SOFT_TOKENS = (70, 140, 280, 560, 1120).
MAX_SOFT_TOKENS: int = 70
# vLLM's gemma4_mm sizes image placeholders (and the profiling budget) from
# vision_config.default_output_length when no max_soft_tokens is passed in
# mm_processor_kwargs; transformers' Gemma4VisionConfig has no such field, so
# the model's vision_config must carry it, equal to MAX_SOFT_TOKENS.
VISION_CONFIG_EXTRA: dict[str, int] = {"default_output_length": MAX_SOFT_TOKENS}

MODEL_MAX_LENGTH: int = 4096

# Standard-library trees that are not ordinary library code.
_EXCLUDED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"}

CHAT_TEMPLATE = """{{- bos_token -}}
{%- macro render_content(content) -%}
    {%- if content is string -%}
        {{- content | trim -}}
    {%- else -%}
        {%- for item in content -%}
            {%- if item['type'] == 'text' -%}
                {{- item['text'] | trim -}}
            {%- elif item['type'] == 'image' -%}
                {{- '\\n\\n<|image|>\\n\\n' -}}
            {%- elif item['type'] == 'video' -%}
                {{- '\\n\\n<|video|>\\n\\n' -}}
            {%- elif item['type'] == 'audio' -%}
                {{- '<|audio|>' -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- if messages and messages[0]['role'] in ['system', 'developer'] -%}
    {{- '<|turn>system\\n' -}}
    {{- render_content(messages[0]['content']) -}}
    {{- '<turn|>\\n' -}}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
    {{- '<|turn>' + role + '\\n' -}}
    {{- render_content(message['content']) -}}
    {{- '<turn|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|turn>model\\n' -}}
{%- endif -%}
"""


# --------------------------------------------------------------------- corpus


def _stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _excluded(rel: Path) -> bool:
    parts = rel.parts
    if any(p in _EXCLUDED_DIRS for p in parts[:-1]):
        return True
    # ensurepip's bundled wheels (and anything else under _bundled) are data.
    if parts[0] == "ensurepip" and "_bundled" in parts:
        return True
    return False


def is_heldout(relpath: str, heldout_every: int = 10) -> bool:
    """Deterministic split: the first byte of sha256(relpath) mod heldout_every == 0."""
    return hashlib.sha256(relpath.encode("utf-8")).digest()[0] % heldout_every == 0


def collect_corpus(stdlib: Path | None = None, heldout_every: int = 10) -> dict:
    """The standard library's .py sources, split into train and held-out files.

    Excludes site-packages, test/ and tests/ trees, idlelib, lib2to3,
    ensurepip's bundled data, and files that are not valid UTF-8. Files are
    sorted by relative posix path; a file is held out when the first byte of
    sha256(relpath) mod ``heldout_every`` is 0.
    """
    root = Path(stdlib) if stdlib is not None else _stdlib_dir()
    if not root.is_dir():
        raise FileNotFoundError(f"standard library directory not found: {root}")
    found: list[tuple[str, str]] = []
    for path in root.rglob("*.py"):
        if not path.is_file():
            continue
        rel = path.relative_to(root)
        if _excluded(rel):
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            continue
        found.append((rel.as_posix(), text))
    found.sort(key=lambda item: item[0])
    corpus = _split(found, heldout_every)
    corpus.update({"source": "stdlib", "python": ".".join(str(v) for v in sys.version_info[:3]),
                   "stdlib": str(root)})
    return corpus


PINNED_CORPUS = Path(__file__).resolve().parents[1] / "corpus.json"
# Directories whose .py files are tests or generated data, not the package's own prose and code.
_WHEEL_EXCLUDED_DIRS = {"tests", "test", "testing", "migrations", "__pycache__", "benchmarks"}


def pinned_artifacts(manifest: Path = PINNED_CORPUS) -> list[dict]:
    """The corpus wheels by file name and sha256 (``corpus.json``: the same bytes on every host)."""
    return json.loads(manifest.read_text())["wheels"]


def collect_wheel_corpus(wheel_dir: Path, manifest: Path = PINNED_CORPUS, heldout_every: int = 10) -> dict:
    """The .py sources of pinned PyPI wheels, split into train and held-out files.

    Why wheels and not this interpreter's standard library: the standard library differs by
    Python patch release and distribution, so the same command gave another file set (and
    another target) on another host. A wheel named by version and sha256 is the same bytes
    everywhere. Members under test, benchmark and migration folders are left out; the split
    is ``is_heldout`` of the member path, as for the standard library.
    """
    found: list[tuple[str, str]] = []
    artifacts = []
    for art in pinned_artifacts(manifest):
        path = Path(wheel_dir) / art["file"]
        if not path.is_file():
            raise FileNotFoundError(f"corpus wheel {art['file']} not in {wheel_dir}: "
                                    "stage it (python tests/gpu/staging/stage.py --corpus)")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != art["sha256"]:
            raise ValueError(f"{path}: sha256 {digest}, corpus.json pins {art['sha256']}")
        artifacts.append({"file": art["file"], "sha256": digest})
        found += _wheel_sources(path)
    found.sort(key=lambda item: item[0])
    corpus = _split(found, heldout_every)
    corpus.update({"source": "wheels", "artifacts": artifacts})
    return corpus


def collect_wheel_sources(wheel: Path, heldout_every: int = 10) -> dict:
    """One wheel's .py sources (the rules of ``collect_wheel_corpus``), split the same way."""
    corpus = _split(sorted(_wheel_sources(Path(wheel))), heldout_every)
    corpus.update({"source": "wheel", "artifacts": [
        {"file": Path(wheel).name, "sha256": hashlib.sha256(Path(wheel).read_bytes()).hexdigest()}]})
    return corpus


def _wheel_sources(path: Path) -> list[tuple[str, str]]:
    """(member path, text) of a wheel's UTF-8 .py members outside tests, benchmarks, migrations
    and the metadata folder."""
    import zipfile

    found = []
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            parts = info.filename.split("/")
            if not info.filename.endswith(".py") or ".dist-info" in parts[0]:
                continue
            if any(d in _WHEEL_EXCLUDED_DIRS for d in parts[:-1]):
                continue
            try:
                found.append((info.filename, zf.read(info).decode("utf-8")))
            except UnicodeDecodeError:
                continue
    return found


def _split(found: list[tuple[str, str]], heldout_every: int) -> dict:
    """Train / held-out by ``is_heldout``, with one sha256 over every (path, text) in order."""
    train: list[tuple[str, str]] = []
    heldout: list[tuple[str, str]] = []
    digest = hashlib.sha256()
    for rel, text in found:
        (heldout if is_heldout(rel, heldout_every) else train).append((rel, text))
        for part in (rel, text):
            data = part.encode("utf-8")
            digest.update(len(data).to_bytes(8, "little"))
            digest.update(data)
    return {
        "train": train,
        "heldout": heldout,
        "sha256": digest.hexdigest(),
        "files": {"train": len(train), "heldout": len(heldout)},
        "bytes": {
            "train": sum(len(t.encode("utf-8")) for _, t in train),
            "heldout": sum(len(t.encode("utf-8")) for _, t in heldout),
        },
    }


# ------------------------------------------------------------------ tokenizer


def special_tokens_in_id_order() -> list[str]:
    ordered = sorted(SPECIAL_TOKENS.items(), key=lambda kv: kv[1])
    if [i for _, i in ordered] != list(range(len(ordered))):
        raise AssertionError("SPECIAL_TOKENS ids must be 0..N-1")
    return [t for t, _ in ordered]


def train_tokenizer(texts: Iterable[str], vocab_size: int = VOCAB_SIZE):
    """Byte-level BPE (``tokenizers``), special tokens at their SPECIAL_TOKENS ids.

    Deterministic for the same input. The result has exactly ``vocab_size``
    entries; a corpus too small for that many merges is an error.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = special_tokens_in_id_order()
    if vocab_size < len(specials) + 256 + 1:
        raise ValueError(f"vocab_size {vocab_size} leaves no room for the byte alphabet and merges")
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(iter(list(texts)), trainer=trainer)

    for token, want in SPECIAL_TOKENS.items():
        got = tok.token_to_id(token)
        if got != want:
            raise AssertionError(f"special token {token!r} trained to id {got}, want {want}")
    size = tok.get_vocab_size(with_added_tokens=True)
    if size != vocab_size:
        raise ValueError(f"trained vocabulary has {size} entries, want {vocab_size} (corpus too small?)")
    # No automatic <bos>: like the released instruction-tuned Gemma 4
    # tokenizer (add_bos_token false), the chat template writes bos_token, and
    # vLLM encodes chat prompts without special tokens. Raw training text must
    # be prefixed with <bos> (CONFIG_IDS["bos_token_id"]) by the caller.
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


# --------------------------------------------------------------------- files


def image_processor_dict(vision: dict) -> dict:
    return {
        "image_processor_type": "Gemma4ImageProcessor",
        "do_convert_rgb": True,
        "do_normalize": False,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.0, 0.0, 0.0],
        "image_std": [1.0, 1.0, 1.0],
        "image_seq_length": MAX_SOFT_TOKENS,
        "max_soft_tokens": MAX_SOFT_TOKENS,
        "patch_size": int(vision.get("patch_size", 16)),
        "pooling_kernel_size": int(vision.get("pooling_kernel_size", 3)),
        "resample": 3,
        "rescale_factor": 1.0 / 255.0,
    }


def video_processor_dict(vision: dict) -> dict:
    return {
        "video_processor_type": "Gemma4VideoProcessor",
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "do_sample_frames": True,
        "image_mean": [0.0, 0.0, 0.0],
        "image_std": [1.0, 1.0, 1.0],
        "max_soft_tokens": 70,  # vLLM's gemma4_mm runs frames at 70 whatever this says
        "num_frames": 32,
        "patch_size": int(vision.get("patch_size", 16)),
        "pooling_kernel_size": int(vision.get("pooling_kernel_size", 3)),
        "resample": 3,
        "rescale_factor": 1.0 / 255.0,
        "return_metadata": False,
    }


def feature_extractor_dict() -> dict:
    # Gemma4AudioFeatureExtractor's defaults (16 kHz, 128 mel bins, 20 ms
    # frames, 10 ms hop); Gemma4Processor has a feature_extractor slot, so a
    # processor load needs this block even for a model without an audio tower.
    return {
        "feature_extractor_type": "Gemma4AudioFeatureExtractor",
        "feature_size": 128,
        "sampling_rate": 16000,
        "padding_value": 0.0,
        "return_attention_mask": True,
        "frame_length_ms": 20.0,
        "hop_length_ms": 10.0,
        "min_frequency": 0.0,
        "max_frequency": 8000.0,
        "preemphasis": 0.0,
        "preemphasis_htk_flavor": True,
        "fft_overdrive": False,
        "dither": 0.0,
        "input_scale_factor": 1.0,
        "mel_floor": 0.001,
        "per_bin_mean": None,
        "per_bin_stddev": None,
    }


def tokenizer_config_dict() -> dict:
    cfg: dict = {
        "backend": "tokenizers",
        "tokenizer_class": "TokenizersBackend",
        "processor_class": "Gemma4Processor",
        "model_max_length": MODEL_MAX_LENGTH,
        "padding_side": "left",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "extra_special_tokens": ["<|video|>"],
    }
    cfg.update(_TOKEN_ATTRIBUTES)
    return dict(sorted(cfg.items()))


def _dump(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_lm_files(tokenizer, out_dir: Path, vision: dict) -> list[str]:
    """Write the tokenizer, chat template and Gemma 4 processor files into out_dir.

    ``tokenizer`` is a ``tokenizers.Tokenizer`` from ``train_tokenizer``;
    ``vision`` is the model's vision_config dict (patch_size and
    pooling_kernel_size are copied into the image and video processors).
    Returns the names of the files written.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for token, want in SPECIAL_TOKENS.items():
        if tokenizer.token_to_id(token) != want:
            raise ValueError(f"tokenizer maps {token!r} to {tokenizer.token_to_id(token)}, want {want}")
    written: list[str] = []

    tokenizer.save(str(out_dir / "tokenizer.json"))
    written.append("tokenizer.json")

    _dump(out_dir / "tokenizer_config.json", tokenizer_config_dict())
    written.append("tokenizer_config.json")

    special_map = {k: v for k, v in _TOKEN_ATTRIBUTES.items() if k in ("bos_token", "eos_token", "pad_token",
                                                                         "unk_token", "mask_token")}
    special_map["additional_special_tokens"] = [t for t in special_tokens_in_id_order()
                                                if t not in special_map.values()]
    _dump(out_dir / "special_tokens_map.json", special_map)
    written.append("special_tokens_map.json")

    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    written.append("chat_template.jinja")

    # The released layout: one processor_config.json holding every
    # sub-processor (transformers >= 5 reads the nested blocks).
    _dump(out_dir / "processor_config.json", {
        "processor_class": "Gemma4Processor",
        "image_seq_length": MAX_SOFT_TOKENS,
        "audio_seq_length": 750,
        "audio_ms_per_token": 40,
        "image_processor": image_processor_dict(vision),
        "video_processor": video_processor_dict(vision),
        "feature_extractor": feature_extractor_dict(),
    })
    written.append("processor_config.json")
    return written


def generation_config_ids() -> dict:
    """Token ids for generation_config.json: stop on <eos> or the end of a turn."""
    return {
        "bos_token_id": CONFIG_IDS["bos_token_id"],
        "pad_token_id": CONFIG_IDS["pad_token_id"],
        "eos_token_id": [CONFIG_IDS["eos_token_id"], END_OF_TURN_ID],
    }
