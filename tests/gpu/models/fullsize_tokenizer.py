"""A generated tokenizer with one entry per id of the full-size vocabulary (262,144), written directly.

A random-weight target samples any id, and the server detokenizes every one
of them, so the tokenizer must hold all of them; the released tokenizer is
not at hand on the GPU host (no network) and is not needed for speed or
memory. Training one (as ``lm_files.py`` does for the small trained target)
would take minutes for a vocabulary this size; writing ``tokenizer.json``
takes a second:

* model: byte-level BPE with no merges. The 256 byte-level symbols are
  entries, so any text encodes (one token per byte) and every entry decodes
  to valid UTF-8;
* Gemma 4's special-token strings (``lm_files.SPECIAL_TOKENS``) at the
  released ids where the config names them (pad 0, eos 1, bos 2, unk 3,
  mask 4, end of turn 106 from ``eos_token_id`` [1, 106], start of turn 105
  beside it, and the image/audio/video ids of config.json); the others
  (channel, think, tool tokens) at small ids of our own, 5 upward;
* every other id: ``Ġt<id>`` (decodes to `` t<id>``).

Besides ``tokenizer.json``: ``tokenizer_config.json`` with the attributes
Gemma 4's processor reads, ``special_tokens_map.json``, the chat template,
``processor_config.json`` at the released 280 soft tokens per image, and
``generation_config.json``. Pure Python (json only).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)

import lm_files  # noqa: E402

START_OF_TURN_ID = 105
END_OF_TURN_ID = 106
# Fixed Gemma ids (pad/eos/bos/unk/mask keep lm_files' ids, which are the released ones).
FIXED = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4,
         "<|turn>": START_OF_TURN_ID, "<turn|>": END_OF_TURN_ID}
# Token string -> the config.json key that holds its released id.
FROM_CONFIG = {"<|image>": "boi_token_id", "<image|>": "eoi_token_id", "<|image|>": "image_token_id",
               "<|video|>": "video_token_id", "<|audio>": "boa_token_id", "<|audio|>": "audio_token_id",
               "<audio|>": "eoa_token_index"}


def bytes_to_unicode() -> dict[int, str]:
    """The byte-level alphabet: each byte as a printable character (printable Latin-1 bytes as
    themselves, the others shifted above 255), as byte-level BPE tokenizers map them."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out: dict[int, str] = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def special_ids(config: dict) -> dict[str, int]:
    """Every ``lm_files.SPECIAL_TOKENS`` string -> its id here (see the module docstring)."""
    ids = dict(FIXED)
    for token, key in FROM_CONFIG.items():
        value = config.get(key, config.get("eoa_token_id") if key == "eoa_token_index" else None)
        if not isinstance(value, int):
            raise ValueError(f"config.json has no {key} for {token}")
        ids[token] = value
    free = (i for i in range(5, 10**9) if i not in ids.values())
    for token in lm_files.special_tokens_in_id_order():
        if token not in ids:
            ids[token] = next(free)
    if len(set(ids.values())) != len(ids):
        raise ValueError(f"special ids collide: {ids}")
    return ids


def vocabulary(size: int, specials: dict[str, int]) -> list[str]:
    """Entry of every id: specials, then the 256 byte symbols at the lowest free ids, then fillers."""
    if max(specials.values()) >= size:
        raise ValueError(f"special id {max(specials.values())} is outside a vocabulary of {size}")
    entries: list[str | None] = [None] * size
    for token, i in specials.items():
        entries[i] = token
    free = [i for i in range(size) if entries[i] is None]
    if len(free) < 256:
        raise ValueError(f"a vocabulary of {size} leaves no room for the 256 byte symbols")
    symbols = bytes_to_unicode()
    for b, i in zip(range(256), free):
        entries[i] = symbols[b]
    for i in free[256:]:
        entries[i] = f"Ġt{i}"
    return entries  # type: ignore[return-value]


def tokenizer_json(size: int, specials: dict[str, int]) -> dict:
    entries = vocabulary(size, specials)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True}
                         for t, i in sorted(specials.items(), key=lambda kv: kv[1])],
        "normalizer": None,
        "pre_tokenizer": dict(byte_level),
        "post_processor": {**byte_level, "trim_offsets": False},
        "decoder": dict(byte_level),
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(entries)}, "merges": []},
    }


def _dump(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def write(out: Path, config: dict) -> dict:
    """Write the tokenizer and processor files for ``config`` (a Gemma 4 config.json) into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    text = config["text_config"]
    specials = special_ids(config)
    tok = tokenizer_json(text["vocab_size"], specials)
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")

    tok_cfg = lm_files.tokenizer_config_dict()
    tok_cfg["model_max_length"] = text["max_position_embeddings"]
    _dump(out / "tokenizer_config.json", tok_cfg)
    basic = ("bos_token", "eos_token", "pad_token", "unk_token", "mask_token")
    special_map = {k: tok_cfg[k] for k in basic}
    special_map["additional_special_tokens"] = [t for t, _ in sorted(specials.items(), key=lambda kv: kv[1])
                                                if t not in special_map.values()]
    _dump(out / "special_tokens_map.json", special_map)
    (out / "chat_template.jinja").write_text(lm_files.CHAT_TEMPLATE, encoding="utf-8")

    vision = config["vision_config"]
    soft = int(vision.get("default_output_length", lm_files.MAX_SOFT_TOKENS))
    image = {**lm_files.image_processor_dict(vision), "image_seq_length": soft, "max_soft_tokens": soft}
    _dump(out / "processor_config.json", {
        "processor_class": "Gemma4Processor", "image_seq_length": soft, "audio_seq_length": 750,
        "audio_ms_per_token": 40, "image_processor": image,
        "video_processor": lm_files.video_processor_dict(vision),
        "feature_extractor": lm_files.feature_extractor_dict(),
    })
    _dump(out / "generation_config.json", {"bos_token_id": specials["<bos>"], "pad_token_id": specials["<pad>"],
                                           "eos_token_id": [specials["<eos>"], specials["<turn|>"]]})
    return {"vocab_size": text["vocab_size"], "special_ids": specials}
