"""Calibration inputs: a small built-in text set, a user file, or random token ids.

NVFP4 calibration only needs activation ranges (the input scales), so a few
dozen varied paragraphs tokenized with the model's own tokenizer are enough.
A checkpoint without tokenizer files (the tests' tiny models) gets random
token ids: the scales are then meaningless for real text, hence the warning.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Callable

# Written for this project: mixed prose, code, dialogue, numbers and a few
# languages, so activations see more than one kind of text.
BUILTIN_TEXTS: tuple[str, ...] = (
    "The river had frozen early that year, and the ferry stayed tied to the dock until March. "
    "People crossed on foot instead, testing the ice with long poles before every step.",
    "def merge(a, b):\n    out = []\n    while a and b:\n        out.append(a.pop(0) if a[0] <= b[0] else b.pop(0))\n"
    "    return out + a + b\n",
    "User: Can you explain why the sky looks blue?\nAssistant: Sunlight scatters off air molecules, and shorter "
    "wavelengths scatter much more strongly, so blue light reaches your eyes from every direction.",
    "Quarterly revenue rose 7.4% to $18.2 million while operating costs fell 2.1%; the board approved a "
    "dividend of $0.14 per share, payable on the 15th to holders of record on the 1st.",
    "To replace the filter, switch off the unit, open the front panel by pressing both tabs, slide the old "
    "cartridge out, and insert the new one with the arrow pointing towards the fan.",
    "Le marché ouvre à sept heures. On y trouve des fromages, du pain encore chaud et des fleurs coupées "
    "le matin même.",
    "Die Bahn hatte zwanzig Minuten Verspätung, also gingen wir zu Fuß durch die Altstadt zum Hotel.",
    "El experimento se repitió tres veces con las mismas condiciones y los resultados coincidieron.",
    "SELECT customer_id, COUNT(*) AS orders FROM orders WHERE created_at >= '2026-01-01' "
    "GROUP BY customer_id HAVING COUNT(*) > 3 ORDER BY orders DESC;",
    "A prime number has exactly two divisors. To test n, try every d from 2 up to the square root of n; "
    "if none divides n evenly, n is prime.",
    "She read the letter twice, folded it along the old creases and put it back in the drawer without a word.",
    "{\"name\": \"sensor-7\", \"readings\": [21.4, 21.9, 22.3], \"unit\": \"celsius\", \"ok\": true}",
    "In 1969 the first message was sent between two computers; the system crashed after the second letter.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen inside the chloroplasts.",
    "for i in range(10):\n    if i % 3 == 0:\n        print('fizz', i)\n    else:\n        continue\n",
    "The committee will meet on Thursday to review the proposal; please send comments by Wednesday noon.",
    "東京の朝はとても静かで、駅までの道には人がほとんどいなかった。",
    "Water boils at a lower temperature at high altitude because the air pressure above it is lower.",
    "#include <stdio.h>\nint main(void) {\n    for (int i = 0; i < 3; i++) printf(\"%d\\n\", i);\n    return 0;\n}\n",
    "Summary: the patch removes a race between the writer thread and the flush timer by taking the lock "
    "before checking the buffer length.",
)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")


def has_tokenizer(model_dir: Path) -> bool:
    return any((model_dir / name).is_file() for name in TOKENIZER_FILES)


def read_calib_file(path: Path) -> list[str]:
    """Samples from a .jsonl file ({"text": ...} per line) or a text file (blank-line separated)."""
    raw = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        texts = []
        for number, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not JSON: {exc}") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                raise ValueError(f"{path}:{number}: expected an object with a \"text\" string")
            texts.append(obj["text"])
    else:
        texts = [block.strip() for block in raw.split("\n\n")]
    texts = [t for t in texts if t]
    if not texts:
        raise ValueError(f"{path} holds no calibration text")
    return texts


def reserved_token_ids(config: dict[str, Any]) -> set[int]:
    """Image/audio/boi/eoi... ids: random calibration input must avoid them
    (a multimodal model expects pixel values wherever an image token sits)."""
    reserved: set[int] = set()
    for source in (config, config.get("text_config") or {}):
        for key, value in source.items():
            if key.endswith(("token_id", "token_index")) and isinstance(value, int) and key not in (
                "bos_token_id",
                "eos_token_id",
                "pad_token_id",
            ):
                reserved.add(value)
    return reserved


def random_token_batches(
    vocab_size: int, reserved: set[int], samples: int, seq_len: int, seed: int
) -> list[list[int]]:
    rng = random.Random(seed)
    batches = []
    for _ in range(samples):
        ids: list[int] = []
        while len(ids) < seq_len:
            tok = rng.randrange(vocab_size)
            if tok not in reserved:
                ids.append(tok)
        batches.append(ids)
    return batches


def text_token_batches(
    encode: Callable[[str], list[int]], texts: list[str], samples: int, seq_len: int
) -> list[list[int]]:
    """Tokenize, concatenate and cut into ``samples`` windows of ``seq_len`` ids.

    The token stream is read cyclically, so the requested number of forward
    passes always happens even from a short text set (windows are at most as
    long as the whole stream).
    """
    stream: list[int] = []
    for text in texts:
        stream.extend(encode(text))
    if not stream:
        raise ValueError("the tokenizer produced no tokens from the calibration text")
    n = len(stream)
    length = min(seq_len, n)
    return [[stream[(i * length + j) % n] for j in range(length)] for i in range(samples)]
