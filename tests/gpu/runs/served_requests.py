"""What tests/gpu/runs/served.py sends to a server that `launcher serve` started (issue 26).

Pure Python: PNG images written with zlib alone, the chat requests of every
kind the issue asks for, and the prompt whose image straddles a prefill chunk
boundary. ``jinja2`` and ``tokenizers`` are imported only by the two functions
that render and tokenize a chat prompt the way vLLM does.

Kinds (``Req.kind``): ``text``, ``image`` (one image; the ``probe-*`` requests
are one prompt with each of three images), ``multi_image`` (two or three),
``image_at_chunk_boundary``, ``multi_turn_image`` (the first turn of
``image-first`` again, so the server's prefix cache holds its image), ``tool``
(``tools`` in the request) and ``stream``.
"""

from __future__ import annotations

import base64
import json
import math
import struct
import zlib
from dataclasses import asdict, dataclass, field

# Every request: greedy, this many new tokens, end-of-sequence ignored (the outputs
# of the reference and the DFlash server then have equal lengths).
MAX_TOKENS = 64
# Top logprobs asked for: vLLM lists the sampled token first and then the top k, so
# with 3 the best two are there even where the sampled token is not rank 1 (a tie).
TOP_LOGPROBS = 3
CONCURRENCY = (1, 8, 22)
KINDS = ("text", "image", "multi_image", "image_at_chunk_boundary", "multi_turn_image", "tool", "stream")


# --------------------------------------------------------------------- images


def _gradient(x: int, y: int) -> tuple[int, int, int]:
    # In bands of 16 pixels: a smooth gradient does not compress without PNG's row filters.
    return (x // 16 * 16) % 256, (y // 16 * 16) % 256, 128


def _checkerboard(x: int, y: int) -> tuple[int, int, int]:
    return (250, 220, 20) if (x // 40 + y // 40) % 2 else (10, 10, 10)


def _rings(x: int, y: int) -> tuple[int, int, int]:
    r = math.isqrt((x - 120) ** 2 + (y - 160) ** 2)
    return (30, 60, 230) if (r // 24) % 2 else (245, 245, 245)


@dataclass(frozen=True)
class Image:
    """One test image: a size and a pattern, visually unlike the others."""

    name: str
    width: int
    height: int
    pattern: str


IMAGES: dict[str, Image] = {
    "A": Image("A", 256, 256, "gradient"),
    "B": Image("B", 320, 240, "checkerboard"),
    "C": Image("C", 240, 320, "rings"),
}
_PATTERNS = {"gradient": _gradient, "checkerboard": _checkerboard, "rings": _rings}


def png(image: Image) -> bytes:
    """An 8-bit RGB PNG of ``image``: the same bytes on every call (zlib level 9, no metadata)."""
    pixel = _PATTERNS[image.pattern]
    raw = bytearray()
    for y in range(image.height):
        raw.append(0)  # filter type 0 (None) for each scanline
        for x in range(image.width):
            raw.extend(pixel(x, y))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", image.width, image.height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(bytes(raw), 9)) \
        + chunk(b"IEND", b"")


def data_url(name: str) -> str:
    return "data:image/png;base64," + base64.b64encode(png(IMAGES[name])).decode("ascii")


# ------------------------------------------------------------ image geometry


@dataclass(frozen=True)
class Vision:
    """What sizes an image's placeholder: the target's vision config and token ids."""

    patch_size: int = 16
    pooling_kernel_size: int = 3
    max_soft_tokens: int = 70
    boi_id: int = 7
    image_id: int = 9
    eoi_id: int = 8

    @classmethod
    def from_config(cls, config: dict) -> "Vision":
        vision = config.get("vision_config") or {}
        return cls(int(vision.get("patch_size", 16)), int(vision.get("pooling_kernel_size", 3)),
                   int(vision.get("default_output_length", 70)), int(config.get("boi_token_id", 7)),
                   int(config.get("image_token_id", 9)), int(config.get("eoi_token_id", 8)))


def soft_tokens(image: Image, vision: Vision) -> int:
    """Image tokens vLLM 0.21.0 puts in the prompt for ``image``
    (``Gemma4ProcessingInfo._compute_num_soft_tokens``, model_executor/models/gemma4_mm.py)."""
    unit = vision.patch_size * vision.pooling_kernel_size
    max_patches = vision.max_soft_tokens * vision.pooling_kernel_size ** 2
    patches = (image.height / vision.patch_size) * (image.width / vision.patch_size)
    scale = math.sqrt(max_patches / patches)
    target_h = max(unit, int(math.floor(image.height * scale / unit)) * unit)
    target_w = max(unit, int(math.floor(image.width * scale / unit)) * unit)
    num = (target_h // vision.patch_size) * (target_w // vision.patch_size)
    return min(num // vision.pooling_kernel_size ** 2, vision.max_soft_tokens)


def image_span(image: Image, vision: Vision) -> int:
    """The whole span the scheduler treats as one encoder input: boi, the image tokens, eoi."""
    return soft_tokens(image, vision) + 2


# ------------------------------------------------------------------ requests


@dataclass
class Req:
    """One chat request. ``messages`` hold text parts and image parts by name
    ({"type": "image", "image": "A"}); ``openai_messages`` turns them into data URLs."""

    id: str
    kind: str
    messages: list[dict]
    stream: bool = False
    tools: list[dict] | None = None
    # request ids whose outputs must differ from this one's (images_change_output)
    probe: str | None = None
    notes: dict = field(default_factory=dict)

    @property
    def images(self) -> list[str]:
        return [p["image"] for m in self.messages if isinstance(m["content"], list)
                for p in m["content"] if p["type"] == "image"]

    def to_dict(self) -> dict:
        return asdict(self)


def openai_messages(req: Req) -> list[dict]:
    """The request's messages as the OpenAI API takes them (images as base64 PNG data URLs)."""
    out = []
    for m in req.messages:
        content = m["content"]
        if isinstance(content, list):
            content = [{"type": "image_url", "image_url": {"url": data_url(p["image"])}} if p["type"] == "image"
                       else {"type": "text", "text": p["text"]} for p in content]
        out.append({"role": m["role"], "content": content})
    return out


def template_messages(messages: list[dict]) -> list[dict]:
    """What vLLM hands the chat template in the "openai" content format: an image part
    becomes {"type": "image"} (vllm/entrypoints/chat_utils.py)."""
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            content = [{"type": "image"} if p["type"] == "image" else {"type": "text", "text": p["text"]}
                       for p in content]
        out.append({"role": m["role"], "content": content})
    return out


TOOLS = [{"type": "function", "function": {
    "name": "run_python", "description": "Run a Python snippet and return what it prints.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "The snippet."}},
                   "required": ["code"]}}}]
ASSISTANT_TURN = "It is a picture next to some Python code."


def _text(t: str) -> dict:
    return {"type": "text", "text": t}


def _image(name: str) -> dict:
    return {"type": "image", "image": name}


def _user(*parts) -> dict:
    return {"role": "user", "content": list(parts)}


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, at a line end where there is one."""
    if len(text) <= limit:
        return text
    cut = text.rfind("\n", 0, limit)
    return text[:cut if cut > limit // 2 else limit]


def halves(text: str) -> tuple[str, str]:
    mid = text.find("\n", len(text) // 2)
    mid = mid if mid > 0 else len(text) // 2
    return text[:mid], text[mid:]


def build(texts: list[str], chunk_req: Req) -> list[Req]:
    """The 22 requests of every run, in the order of the one-at-a-time passes.

    ``texts``: held-out prompt texts (prompts.json), at least 18; ``chunk_req``: the
    chunk-boundary request (``chunk_boundary_request``). ``multi-turn`` comes after
    ``image-first``, whose first turn it repeats: one at a time, its prefix (image
    included) is then in the DFlash server's prefix cache.
    """
    if len(texts) < 18:
        raise ValueError(f"need 18 prompt texts, got {len(texts)}")
    short = [clip(t, 900) for t in texts]
    question = "What is in the picture, and what does the code do?"
    reqs = [Req(f"text-{i}", "text", [{"role": "user", "content": texts[i]}]) for i in range(6)]
    reqs += [
        Req("image-first", "image", [_user(_image("A"), _text(short[6]))]),
        Req("image-last", "image", [_user(_text(short[7]), _image("B"))]),
        Req("image-middle", "image", [_user(_text(halves(short[8])[0]), _image("C"), _text(halves(short[8])[1]))]),
    ]
    probe_text = short[9]
    for name in ("A", "B", "C"):
        reqs.append(Req(f"probe-{name}", "image", [_user(_text(probe_text), _image(name), _text(question))],
                        probe="images"))
    a, b = halves(short[10])
    reqs += [
        Req("multi-ab", "multi_image", [_user(_image("A"), _text(short[11]), _image("B"))]),
        Req("multi-ca", "multi_image", [_user(_text(short[12]), _image("C"), _image("A"))]),
        Req("multi-bac", "multi_image", [_user(_image("B"), _text(a), _image("A"), _text(b), _image("C"))]),
        chunk_req,
        Req("tool", "tool", [{"role": "user", "content": short[13] + "\n\nRun this with the tool."}], tools=TOOLS),
        Req("stream-text", "stream", [{"role": "user", "content": texts[14]}], stream=True),
        Req("stream-image", "stream", [_user(_text(short[15]), _image("B"))], stream=True),
        Req("text-6", "text", [{"role": "user", "content": texts[16]}]),
        Req("text-7", "text", [{"role": "user", "content": texts[17]}]),
        Req("multi-turn", "multi_turn_image", [
            reqs[6].messages[0], {"role": "assistant", "content": ASSISTANT_TURN},
            {"role": "user", "content": "Write the same code again, shorter."}]),
    ]
    return reqs


def counts(reqs: list[Req]) -> dict[str, int]:
    return {kind: sum(r.kind == kind for r in reqs) for kind in KINDS}


# ----------------------------------------------------------- chunk boundary


def render(template: str, messages: list[dict], bos_token: str = "<bos>") -> str:
    """The chat prompt as transformers renders ``template`` (a sandboxed jinja2 with
    trim_blocks and lstrip_blocks, ``transformers.utils.chat_template_utils``)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=template_messages(messages), bos_token=bos_token,
                                            add_generation_prompt=True)


def local_tokenizer(model_dir) -> "callable":
    """tokenize(messages) -> prompt ids before vLLM expands the image placeholders, as vLLM
    encodes a chat prompt (the model's template, then the tokenizer without special tokens)."""
    from pathlib import Path

    from tokenizers import Tokenizer

    folder = Path(model_dir)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    return lambda messages: tok.encode(render(template, messages), add_special_tokens=False).ids


def expanded_spans(ids: list[int], images: list[Image], vision: Vision) -> list[tuple[int, int]]:
    """[start, end) of each image's span (boi .. eoi) once vLLM replaced each image
    placeholder of the unexpanded ``ids`` by boi + soft tokens + eoi."""
    at = [i for i, t in enumerate(ids) if t == vision.image_id]
    if len(at) != len(images):
        raise ValueError(f"{len(at)} image placeholders for {len(images)} images")
    spans, shift = [], 0
    for pos, image in zip(at, images):
        start = pos + shift
        n = image_span(image, vision)
        spans.append((start, start + n))
        shift += n - 1
    return spans


def straddles(start: int, end: int, chunk: int) -> bool:
    """The first prefill chunk of a request alone (``chunk`` = max_num_batched_tokens tokens
    from position 0) would end inside the span [start, end)."""
    return start < chunk < end


def chunk_boundary_request(filler: str, tokenize, vision: Vision, chunk: int, image: str = "B") -> Req:
    """A prompt whose image span [start, end) contains the end of the first prefill chunk.

    With chunked multimodal input allowed the scheduler would cut that image in two;
    vLLM forces ``disable_chunked_mm_input`` for mm-prefix models such as Gemma 4, so
    the first chunk must stop before the image. The text before the image is a prefix
    of ``filler``, its length searched so that the image starts half a span before the
    boundary. ``notes`` keeps the arithmetic (checked again against the server)."""
    img = IMAGES[image]
    span = image_span(img, vision)
    goal = chunk - span // 2

    def make(n: int) -> Req:
        return Req("chunk-boundary", "image_at_chunk_boundary",
                   [_user(_text(filler[:n]), _image(image), _text("Which part of that is the picture?"))])

    def start(n: int) -> int:
        return expanded_spans(tokenize(make(n).messages), [img], vision)[0][0]

    low, high = 0, len(filler)
    if start(high) < goal:
        raise ValueError(f"filler too short: its image starts at {start(high)}, the goal is {goal}")
    while low < high:  # the shortest filler whose image starts at the goal or later
        mid = (low + high) // 2
        if start(mid) < goal:
            low = mid + 1
        else:
            high = mid
    req = make(low)
    ids = tokenize(req.messages)
    (s, e), = expanded_spans(ids, [img], vision)
    if not straddles(s, e, chunk):
        raise ValueError(f"no filler length puts the image across the chunk boundary {chunk}: span [{s}, {e})")
    req.notes = {"chunk": chunk, "image": image, "span": span, "image_start": s, "image_end": e,
                 "straddles": True, "prompt_tokens_expanded": len(ids) - 1 + span, "filler_chars": low}
    return req


def dumps(reqs: list[Req]) -> str:
    return json.dumps([r.to_dict() for r in reqs], indent=1)


def loads(text: str) -> list[Req]:
    return [Req(**d) for d in json.loads(text)]
